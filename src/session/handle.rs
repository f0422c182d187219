//! The public handle, [`Sessions`]: created once per process, kept across reloads, and
//! what `[session]` asks of the ticket keys, the session cache and Redis.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use arc_swap::ArcSwapOption;
use boring::ssl::SslSessionRef;

use super::cache::LruCache;
use super::hooks::TICKET_KEYS;
use super::metrics::{update_cache_gauges, METRICS};
use super::redis::{RedisReply, RedisStore};
use super::replay::ReplayGuard;
use super::tickets::{unix_now, KeySource, TicketKeys};
use crate::config::SessionConfig;
use crate::seal::FleetKey;

// What `[session]` asks of the ticket keys, the session cache and Redis.

pub(super) fn key_source(config: &SessionConfig) -> KeySource {
    let (rotation, grace) = (config.ticket_rotation, config.ticket_grace);
    match &config.ticket_key_file {
        Some(path) => KeySource::File(path.clone()),
        None if config.redis_ticket_keys => KeySource::Redis { rotation, grace },
        None => KeySource::Memory { rotation, grace },
    }
}

/// The fleet key `fleet_key_file` holds, read again (a reload applies a rotated file).
pub(super) fn fleet_key(config: &SessionConfig) -> anyhow::Result<Option<Arc<FleetKey>>> {
    let Some(file) = &config.fleet_key_file else {
        anyhow::ensure!(
            config.redis_url.is_none(),
            "[session] redis_url needs fleet_key_file: what is shared through Redis is sealed with it"
        );
        return Ok(None);
    };
    let key = FleetKey::load(file.get_ref()).context("[session] fleet_key_file")?;
    Ok(Some(Arc::new(key)))
}

/// The Redis store `redis_url` names, if any (it connects on first use), sealing with `key`.
pub(super) fn redis_store(
    config: &SessionConfig,
    key: Option<Arc<FleetKey>>,
) -> anyhow::Result<Option<Arc<RedisStore>>> {
    let (Some(url), Some(key)) = (&config.redis_url, key) else {
        return Ok(None);
    };
    let store = RedisStore::new(
        url,
        config.redis_ca_file.as_deref(),
        &config.redis_prefix,
        config.redis_timeout,
        key,
    )?;
    Ok(Some(Arc::new(store)))
}

pub(super) fn cache_bounds(config: &SessionConfig) -> (usize, usize) {
    match config.cache {
        true => (config.cache_max_entries, config.cache_max_bytes),
        false => (0, 0),
    }
}

/// The state behind every clone of [`Sessions`], shared with the BoringSSL hooks.
pub(super) struct SessionsState {
    pub(super) config: Mutex<SessionConfig>,
    pub(super) tickets: Arc<TicketKeys>,
    pub(super) cache: Mutex<LruCache>,
    pub(super) redis: ArcSwapOption<RedisStore>,
    /// Seconds; read by the store callback.
    pub(super) lifetime: AtomicU64,
    pub(super) replay: Arc<ReplayGuard>,
    /// The task keeping the ticket keys shared through Redis (`redis_ticket_keys`).
    pub(super) key_sync: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for SessionsState {
    fn drop(&mut self) {
        if let Some(sync) = self.key_sync.get_mut().unwrap_or_else(|e| e.into_inner()) {
            sync.abort();
        }
    }
}

/// Process-wide resumption state; survives reloads so that clients keep resuming.
/// Cloning is cheap: all clones share the same state.
#[derive(Clone)]
pub struct Sessions {
    pub(super) inner: Arc<SessionsState>,
}

impl Sessions {
    pub fn new(config: &SessionConfig) -> anyhow::Result<Sessions> {
        config.validate()?;
        let tickets = Arc::new(TicketKeys::new(key_source(config), Instant::now())?);
        let (entries, bytes) = cache_bounds(config);
        let redis = redis_store(config, fleet_key(config)?)?;
        TICKET_KEYS.store(Some(tickets.clone()));
        LazyLock::force(&METRICS);
        let sessions = Sessions {
            inner: Arc::new(SessionsState {
                config: Mutex::new(config.clone()),
                tickets,
                cache: Mutex::new(LruCache::new(entries, bytes)),
                redis: ArcSwapOption::new(redis),
                lifetime: AtomicU64::new(config.lifetime.as_secs()),
                replay: Arc::new(ReplayGuard::new(
                    config.early_data_replay_entries,
                    config.early_data_replay_client_share,
                    Instant::now(),
                )),
                key_sync: Mutex::new(None),
            }),
        };
        Ok(sessions)
    }

    /// Starts the background work of a serving process: with `redis_ticket_keys`, the task
    /// that keeps the fleet's ticket keys (it writes to Redis, so `serve --check` does not
    /// start it).
    pub fn start_background(&self) {
        let config = self
            .inner
            .config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.restart_key_sync(&config);
    }

    /// Stops the Redis ticket-key task, and starts a new one if `config` shares keys
    /// through Redis (so a reload applies a new Redis, prefix, rotation or grace).
    pub(super) fn restart_key_sync(&self, config: &SessionConfig) {
        let mut sync = self
            .inner
            .key_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(old) = sync.take() {
            old.abort();
        }
        let (Some(redis), true) = (self.inner.redis.load_full(), config.redis_ticket_keys) else {
            return;
        };
        let tickets = self.inner.tickets.clone();
        let (rotation, grace) = (config.ticket_rotation, config.ticket_grace);
        // Epoch and key name of the shared keys last installed.
        let mut installed: Vec<(u64, [u8; 16])> = Vec::new();
        let mut failing = false;
        *sync = Some(redis.sync_ticket_keys(
            rotation,
            grace,
            move |outcome| {
                METRICS
                    .redis
                    .with_label_values(&["ticket_keys", outcome.label()])
                    .inc();
                let keys = match outcome {
                    RedisReply::Done(keys) => keys,
                    _ => {
                        if !std::mem::replace(&mut failing, true) {
                            tracing::warn!(result = outcome.label(), "cannot read the shared session ticket keys from Redis; the keys in use stay (retrying)");
                        }
                        return;
                    }
                };
                failing = false;
                let mut seen: Vec<(u64, [u8; 16])> =
                    keys.iter().map(|k| (k.epoch, k.key.name)).collect();
                seen.sort_unstable();
                let (now, wall_clock) = (Instant::now(), unix_now());
                match tickets.install_shared(keys, (rotation, grace), now, wall_clock) {
                    Ok(()) if installed != seen => {
                        let replaced = seen.iter().filter(|(epoch, name)| {
                            installed.iter().any(|(e, n)| e == epoch && n != name)
                        });
                        for (epoch, _) in replaced {
                            // Redis lost a key (flush, failover without persistence) and a
                            // process made another: tickets under the lost one no longer
                            // resume anywhere but where it is still known.
                            tracing::warn!(epoch, "the shared ticket key of this epoch changed in Redis");
                        }
                        let epochs: Vec<u64> = seen.iter().map(|(epoch, _)| *epoch).collect();
                        tracing::info!(epochs = ?epochs, "ticket keys in use: shared through Redis");
                        installed = seen;
                    }
                    Ok(()) => {}
                    Err(err) => tracing::warn!(error = %err, "shared session ticket keys not installed"),
                }
            },
        ));
    }

    /// Applies a reloaded `[session]` section: re-reads the ticket key file (an error refuses
    /// the reload and keeps the current keys), applies new cache bounds, and reconnects to
    /// Redis if its address changed. Sessions and in-memory keys are kept.
    pub fn reload(&self, config: &SessionConfig) -> anyhow::Result<()> {
        config.validate()?;
        let inner = &self.inner;
        let (redis_changed, key_sync_changed) = {
            let current = inner.config.lock().unwrap_or_else(|e| e.into_inner());
            let redis = |c: &SessionConfig| {
                let SessionConfig {
                    redis_url,
                    redis_ca_file,
                    redis_prefix,
                    redis_timeout,
                    ..
                } = c;
                (
                    redis_url.clone(),
                    redis_ca_file.clone(),
                    redis_prefix.clone(),
                    *redis_timeout,
                )
            };
            let sync = |c: &SessionConfig| (c.redis_ticket_keys, c.ticket_rotation, c.ticket_grace);
            // A CA file may have changed in place: reconnect with it on every reload.
            let redis_changed = redis(&current) != redis(config) || config.redis_ca_file.is_some();
            (
                redis_changed,
                redis_changed || sync(&current) != sync(config),
            )
        };
        let key = fleet_key(config)?;
        let redis = match redis_changed {
            true => Some(redis_store(config, key.clone())?),
            false => None,
        };
        inner
            .tickets
            .reconfigure(key_source(config), Instant::now())?;
        match (redis, inner.redis.load_full(), key) {
            (Some(redis), _, _) => inner.redis.store(redis),
            // Same Redis: a rotated key file applies to it, the ticket key task included.
            (None, Some(current), Some(key)) => current.set_key(key),
            _ => {}
        }
        let (entries, bytes) = cache_bounds(config);
        {
            let mut cache = inner.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.set_bounds(entries, bytes);
            update_cache_gauges(&cache);
        }
        inner
            .lifetime
            .store(config.lifetime.as_secs(), Ordering::Relaxed);
        inner.replay.set_capacity(
            config.early_data_replay_entries,
            config.early_data_replay_client_share,
        );
        *inner.config.lock().unwrap_or_else(|e| e.into_inner()) = config.clone();
        TICKET_KEYS.store(Some(inner.tickets.clone()));
        if key_sync_changed {
            self.restart_key_sync(config);
        }
        Ok(())
    }

    /// Sessions in the in-process session-ID cache.
    pub fn cache_len(&self) -> usize {
        self.inner
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Bytes accounted to the in-process session-ID cache.
    pub fn cache_bytes(&self) -> usize {
        self.inner
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bytes()
    }

    /// Stores a session as the new-session callback does (for tests and tools).
    pub fn store_session(&self, session: &SslSessionRef) {
        self.inner.store(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use boring::ssl::{
        SslAcceptor, SslConnector, SslMethod, SslOptions, SslSession, SslVerifyMode, SslVersion,
    };

    #[test]
    pub(super) fn config_defaults_and_durations() {
        let config: SessionConfig = toml::from_str(
            "ticket_rotation = \"1s\"\nticket_grace = \"2s\"\nredis_timeout = \"5ms\"\ncache_max_entries = 100\n",
        )
        .unwrap();
        assert!(config.tickets && config.cache);
        assert_eq!(config.ticket_rotation, Duration::from_secs(1));
        assert_eq!(config.ticket_grace, Duration::from_secs(2));
        assert_eq!(config.redis_timeout, Duration::from_millis(5));
        assert_eq!(config.cache_max_entries, 100);
        assert_eq!(config.lifetime, SessionConfig::default().lifetime);
        assert!(toml::from_str::<SessionConfig>("ticket_rotaton = \"1s\"").is_err());
        let bad = SessionConfig {
            ticket_rotation: Duration::ZERO,
            ..SessionConfig::default()
        };
        assert!(Sessions::new(&bad).is_err());
    }

    /// Real TLS 1.2 sessions from in-memory handshakes.
    pub(super) fn make_sessions(count: usize) -> Vec<SslSession> {
        use std::process::Command;
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("c.pem");
        let key = dir.path().join("k.pem");
        let ok = Command::new("openssl")
            .args(["req", "-x509", "-nodes", "-days", "1", "-newkey", "ec"])
            .args(["-pkeyopt", "ec_paramgen_curve:P-256", "-subj", "/CN=t"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok);
        let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
        acceptor.set_certificate_chain_file(&cert).unwrap();
        acceptor
            .set_private_key_file(&key, boring::ssl::SslFiletype::PEM)
            .unwrap();
        acceptor.set_options(SslOptions::NO_TICKET);
        acceptor.set_session_id_context(b"tlsterm").unwrap();
        let acceptor = acceptor.build();
        let mut connector = SslConnector::builder(SslMethod::tls()).unwrap();
        connector.set_verify(SslVerifyMode::NONE);
        connector
            .set_max_proto_version(Some(SslVersion::TLS1_2))
            .unwrap();
        let connector = connector.build();
        (0..count)
            .map(|_| {
                let acceptor = acceptor.clone();
                let ((), session) = crate::testing::over_socket_pair(
                    move |server_socket| drop(acceptor.accept(server_socket).unwrap()),
                    |client_socket| {
                        let client = connector.connect("t", client_socket).unwrap();
                        client.ssl().session().unwrap().to_owned()
                    },
                );
                session
            })
            .collect()
    }

    #[test]
    pub(super) fn cache_bound_holds_under_many_sessions() {
        let config = SessionConfig {
            cache_max_entries: 100,
            ..SessionConfig::default()
        };
        let sessions = Sessions::new(&config).unwrap();
        let made = make_sessions(500);
        for session in &made {
            assert!(!session.id().is_empty());
            sessions.store_session(session);
            assert!(sessions.cache_len() <= 100);
        }
        assert_eq!(sessions.cache_len(), 100);
        // The most recent ones are the ones kept, and they come back intact.
        let last = made.last().unwrap();
        let der = sessions
            .inner
            .cache
            .lock()
            .unwrap()
            .get(last.id(), Instant::now())
            .unwrap();
        assert_eq!(SslSession::from_der(&der).unwrap().id(), last.id());
        let first = &made[0];
        assert!(sessions
            .inner
            .cache
            .lock()
            .unwrap()
            .get(first.id(), Instant::now())
            .is_none());

        // The byte bound holds too.
        let per = sessions.cache_bytes() / 100;
        sessions
            .reload(&SessionConfig {
                cache_max_bytes: per * 10,
                ..config
            })
            .unwrap();
        assert!(sessions.cache_bytes() <= per * 10);
        assert!(sessions.cache_len() <= 10 && sessions.cache_len() > 0);
    }

    #[test]
    fn a_session_from_the_fleet_is_cached_for_what_is_left_of_its_lifetime() {
        use super::super::hooks::remaining_lifetime;
        let session = &make_sessions(1)[0];
        let der = session.to_der().unwrap();
        let (made, timeout) = (session.time(), u64::from(session.timeout()));
        assert!(timeout > 10);
        let lifetime = Duration::from_secs(timeout * 2);
        let left = |now| remaining_lifetime(&der, lifetime, now);
        assert_eq!(left(made), Duration::from_secs(timeout));
        assert_eq!(left(made + timeout - 10), Duration::from_secs(10));
        assert_eq!(left(made + timeout + 1), Duration::ZERO);
        let short = Duration::from_secs(5);
        assert_eq!(remaining_lifetime(&der, short, made), short);
        assert_eq!(
            remaining_lifetime(b"not a session", lifetime, made),
            Duration::ZERO
        );
    }
}
