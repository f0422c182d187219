//! Session resumption: ticket keys shared by all workers (from a file or rotated in
//! memory), a bounded session-ID cache, and a Redis-backed distributed cache.
//! (This is the hook the TLS setup calls.)
//!
//! All of it lives in one [`Sessions`] per process, created before the workers start and
//! kept across reloads, so that a SIGHUP (which builds new TLS contexts) does not turn the
//! next connections into full handshakes.
//!
//! * Tickets (TLS 1.2 and 1.3): BoringSSL asks [`TicketKeyRing`] to pick the key that
//!   encrypts a new ticket and to find the one that decrypts a presented ticket. Keys are in a
//!   ring published through an `ArcSwap` (see `tickets`): no lock on the handshake path.
//! * Session IDs (TLS 1.2, when the client does not use tickets): the base context's external
//!   cache callbacks store serialized sessions in an in-process LRU cache (`cache`) and, when
//!   configured, in Redis (`redis`). Lookups go through BoringSSL's asynchronous get-session
//!   callback: the handshake is suspended while Redis answers, the worker is not.

mod cache;
mod redis;
pub mod replay;
pub mod tickets;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use boring::ssl::{SslContextBuilder, SslOptions, SslSessionCacheMode, SslSessionRef, SslVersion};
use prometheus::{
    register_int_counter_vec_with_registry, register_int_gauge_with_registry, IntCounterVec,
    IntGauge,
};

use cache::{LruCache, SessionDer};
use redis::{Outcome, RedisStore};
use replay::{ReplayGuard, Verdict};
use tickets::{unix_now, KeySource, Lookup, TicketKeys};
use zeroize::Zeroizing;

use crate::config::SessionConfig;
use crate::sys::{PendingSession, TicketKeyAnswer, TicketKeyHook, TicketKeyRequest, TicketSecrets};

// What `[session]` asks of the ticket keys, the session cache and Redis.

fn key_source(config: &SessionConfig) -> KeySource {
    let (rotation, grace) = (config.ticket_rotation, config.ticket_grace);
    match &config.ticket_key_file {
        Some(path) => KeySource::File(path.clone()),
        None if config.redis_ticket_keys => KeySource::Redis { rotation, grace },
        None => KeySource::Memory { rotation, grace },
    }
}

/// The Redis store `redis_url` names, if any (it connects on first use).
fn redis_store(config: &SessionConfig) -> anyhow::Result<Option<Arc<RedisStore>>> {
    let Some(url) = &config.redis_url else {
        return Ok(None);
    };
    let store = RedisStore::new(
        url,
        config.redis_ca_file.as_deref(),
        &config.redis_prefix,
        config.redis_timeout,
    )?;
    Ok(Some(Arc::new(store)))
}

fn cache_bounds(config: &SessionConfig) -> (usize, usize) {
    match config.cache {
        true => (config.cache_max_entries, config.cache_max_bytes),
        false => (0, 0),
    }
}

struct SessionMetrics {
    tickets: IntCounterVec,
    cache_lookups: IntCounterVec,
    cache_entries: IntGauge,
    cache_bytes: IntGauge,
    cache_evictions: IntGauge,
    redis: IntCounterVec,
    fallbacks: IntCounterVec,
}

static METRICS: LazyLock<SessionMetrics> = LazyLock::new(|| {
    let r = &crate::metrics::METRICS.registry;
    SessionMetrics {
        tickets: register_int_counter_vec_with_registry!(
            "session_tickets_total",
            "Session ticket key callbacks: issued, decrypted with the current key, with an older key (ticket renewed), or unknown/expired key (full handshake)",
            &["result"],
            r
        )
        .expect("metric registers"),
        cache_lookups: register_int_counter_vec_with_registry!(
            "session_cache_lookups_total",
            "Session-ID lookups (TLS 1.2) by where they were answered: local, redis, or miss",
            &["result"],
            r
        )
        .expect("metric registers"),
        cache_entries: register_int_gauge_with_registry!(
            "session_cache_entries",
            "Sessions in the in-process session-ID cache",
            r
        )
        .expect("metric registers"),
        cache_bytes: register_int_gauge_with_registry!(
            "session_cache_bytes",
            "Bytes accounted to the in-process session-ID cache",
            r
        )
        .expect("metric registers"),
        cache_evictions: register_int_gauge_with_registry!(
            "session_cache_evictions",
            "Sessions pushed out of the in-process cache by its bounds since start",
            r
        )
        .expect("metric registers"),
        redis: register_int_counter_vec_with_registry!(
            "session_redis_operations_total",
            "Redis operations by command (get, set: the session-ID cache; claim: 0-RTT anti-replay; ticket_keys: shared ticket keys) and outcome",
            &["op", "result"],
            r
        )
        .expect("metric registers"),
        fallbacks: register_int_counter_vec_with_registry!(
            "session_redis_fallbacks_total",
            "Session-ID resumptions that became full handshakes because Redis was slow, down or overloaded",
            &["reason"],
            r
        )
        .expect("metric registers"),
    }
});

/// The ticket keys the ticket callback uses. BoringSSL looks the callback up on the session
/// context, but boring's closure-based `set_ticket_key_callback` finds its closure on the
/// *current* context, which the select-certificate callback has switched to a per-certificate
/// one by then; so the callback is a plain function and the keys are process-wide, as
/// `Sessions` is (the most recent `Sessions::new` wins).
static TICKET_KEYS: ArcSwapOption<TicketKeys> = ArcSwapOption::const_empty();

struct Inner {
    config: Mutex<SessionConfig>,
    tickets: Arc<TicketKeys>,
    cache: Mutex<LruCache>,
    redis: ArcSwapOption<RedisStore>,
    /// Seconds; read by the store callback.
    lifetime: AtomicU64,
    replay: Arc<ReplayGuard>,
    /// The task keeping the ticket keys shared through Redis (`redis_ticket_keys`).
    key_sync: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Inner {
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
    inner: Arc<Inner>,
}

impl Sessions {
    pub fn new(config: &SessionConfig) -> anyhow::Result<Sessions> {
        config.validate()?;
        let tickets = Arc::new(TicketKeys::new(key_source(config), Instant::now())?);
        let (entries, bytes) = cache_bounds(config);
        let redis = redis_store(config)?;
        TICKET_KEYS.store(Some(tickets.clone()));
        LazyLock::force(&METRICS);
        let sessions = Sessions {
            inner: Arc::new(Inner {
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
    fn restart_key_sync(&self, config: &SessionConfig) {
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
        if !redis.uses_tls() {
            tracing::warn!("redis_ticket_keys over plain redis://: the fleet's session ticket keys cross the network in clear, and whoever reads them can decrypt every ticket (and the sessions' secrets); use rediss://");
        }
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
                    Outcome::Done(keys) => keys,
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
        let redis = match redis_changed {
            true => Some(redis_store(config)?),
            false => None,
        };
        inner
            .tickets
            .reconfigure(key_source(config), Instant::now())?;
        if let Some(redis) = redis {
            inner.redis.store(redis);
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

    /// Installs tickets and caches on a listener's base context (BoringSSL's session context).
    /// `config` is the `[session]` section being applied: on reload the new contexts are
    /// built before [`Sessions::reload`] commits it, so a failed reload changes nothing.
    pub fn install(
        &self,
        base: &mut SslContextBuilder,
        config: &SessionConfig,
    ) -> anyhow::Result<()> {
        let lifetime = config.lifetime.as_secs() as u32;
        crate::sys::set_session_lifetime(base, lifetime);
        if config.tickets {
            let ok = crate::sys::set_ticket_key_hook::<TicketKeyRing>(base);
            anyhow::ensure!(ok, "cannot install the session ticket callback");
        } else {
            base.set_options(SslOptions::NO_TICKET);
        }
        if config.cache || config.redis_url.is_some() {
            base.set_session_cache_mode(
                SslSessionCacheMode::SERVER | SslSessionCacheMode::NO_INTERNAL,
            );
            let store = self.inner.clone();
            base.set_new_session_callback(move |_ssl, session| store.store(&session));
            let lookup = self.inner.clone();
            crate::sys::set_session_lookup(base, move |id| lookup.lookup(id));
        } else {
            base.set_session_cache_mode(SslSessionCacheMode::OFF);
        }
        Ok(())
    }

    /// The anti-replay check of a ClientHello offering 0-RTT, by its `pre_shared_key`
    /// extension: against this process's memory, then, with `redis_url` set, against every
    /// process sharing the Redis (ticket keys shared by a fleet let a copy go to any of
    /// them). The memory is shared by every listener and kept across reloads.
    ///
    /// Every ClientHello offering early data is claimed in Redis whatever the verdict: one
    /// refused here (memory or client share full) or whose claim did not get an answer in
    /// time is claimed in the background, so that no process accepts a copy of it later.
    pub fn check_early_data(&self, pre_shared_key: &[u8], client: IpAddr) -> EarlyDataCheck {
        let digest = replay::digest(pre_shared_key);
        let now = Instant::now();
        let local = self.inner.replay.check(&digest, client, now);
        let key = || format!("0rtt:{}", tickets::hex(&digest));
        let redis = match (local, self.inner.redis.load_full()) {
            (Verdict::Fresh, Some(redis)) => redis,
            (Verdict::Fresh, None)
                if !self.inner.replay.remembers_a_full_window(now)
                    && self.tickets_may_predate_process() =>
            {
                return EarlyDataCheck::Now(Verdict::JustStarted)
            }
            // Seen here before (and claimed then), or no Redis to tell.
            (Verdict::Replayed, _) | (_, None) => return EarlyDataCheck::Now(local),
            // Refused here: claimed all the same.
            (_, Some(redis)) => {
                claim_in_background(&redis, key());
                return EarlyDataCheck::Now(local);
            }
        };
        let key = key();
        match redis.claim(key.clone(), replay::WINDOW) {
            Ok(pending) => EarlyDataCheck::Redis {
                pending,
                redis,
                key,
            },
            Err(_) => {
                claim_in_background(&redis, key);
                EarlyDataCheck::Now(Verdict::Unchecked)
            }
        }
    }

    /// Tickets sealed with keys from a file may have been issued by an earlier process.
    fn tickets_may_predate_process(&self) -> bool {
        let config = self.inner.config.lock().unwrap_or_else(|e| e.into_inner());
        config.ticket_key_file.is_some()
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

/// The anti-replay verdict on a 0-RTT ClientHello: known now, or once Redis answers
/// (within `redis_timeout`; no answer refuses the early data).
pub enum EarlyDataCheck {
    Now(Verdict),
    Redis {
        pending: redis::PendingClaim,
        /// Where `key` is claimed again if this claim gets no answer.
        redis: Arc<RedisStore>,
        key: String,
    },
}

impl EarlyDataCheck {
    pub async fn verdict(self) -> Verdict {
        match self {
            EarlyDataCheck::Now(verdict) => verdict,
            EarlyDataCheck::Redis {
                pending,
                redis,
                key,
            } => {
                let outcome = pending.await.unwrap_or(Outcome::Error);
                METRICS
                    .redis
                    .with_label_values(&["claim", outcome.label()])
                    .inc();
                match outcome {
                    Outcome::Done(true) => Verdict::Fresh,
                    Outcome::Done(false) => Verdict::Replayed,
                    _ => {
                        claim_in_background(&redis, key);
                        Verdict::Unchecked
                    }
                }
            }
        }
    }
}

/// Claims a refused ClientHello's `key` in Redis in the background (see
/// [`RedisStore::claim_in_background`]), counting each attempt.
fn claim_in_background(redis: &RedisStore, key: String) {
    redis.claim_in_background(key, replay::WINDOW, |outcome| {
        METRICS
            .redis
            .with_label_values(&["claim", outcome.label()])
            .inc();
    });
}

fn update_cache_gauges(cache: &LruCache) {
    let m = &*METRICS;
    m.cache_entries.set(cache.len() as i64);
    m.cache_bytes.set(cache.bytes() as i64);
    m.cache_evictions.set(cache.evictions() as i64);
}

impl Inner {
    /// The new-session callback: TLS 1.2 sessions with an ID go to the local cache and Redis.
    fn store(&self, session: &SslSessionRef) {
        if session.protocol_version() == SslVersion::TLS1_3 || session.id().is_empty() {
            return;
        }
        let Ok(der) = session.to_der() else {
            return;
        };
        let der = SessionDer::new(Zeroizing::new(der));
        let id = session.id().to_vec();
        let ttl = Duration::from_secs(
            u64::from(session.timeout()).min(self.lifetime.load(Ordering::Relaxed)),
        );
        if let Some(redis) = self.redis.load_full() {
            redis.put(&id, der.clone(), ttl, |outcome| {
                METRICS
                    .redis
                    .with_label_values(&["set", outcome.label()])
                    .inc();
            });
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.insert(id, der, ttl, Instant::now());
        update_cache_gauges(&cache);
    }

    /// The get-session callback: the local cache answers at once; otherwise Redis, within
    /// `redis_timeout`; otherwise a full handshake.
    fn lookup(self: &Arc<Self>, id: &[u8]) -> Option<PendingSession> {
        let m = &*METRICS;
        let local = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id, Instant::now());
        if let Some(der) = local {
            m.cache_lookups.with_label_values(&["local"]).inc();
            return Some(Box::pin(async move { Some(der) }));
        }
        let Some(redis) = self.redis.load_full() else {
            m.cache_lookups.with_label_values(&["miss"]).inc();
            return None;
        };
        let pending = match redis.get(id) {
            Ok(pending) => pending,
            Err(outcome) => {
                m.redis.with_label_values(&["get", outcome.label()]).inc();
                m.fallbacks.with_label_values(&[outcome.label()]).inc();
                m.cache_lookups.with_label_values(&["miss"]).inc();
                return None;
            }
        };
        let inner = self.clone();
        let id = id.to_vec();
        Some(Box::pin(async move {
            let m = &*METRICS;
            let outcome = pending.await.unwrap_or(Outcome::Error);
            match outcome {
                Outcome::Done(Some(der)) => {
                    m.redis.with_label_values(&["get", "hit"]).inc();
                    m.cache_lookups.with_label_values(&["redis"]).inc();
                    let der = SessionDer::new(Zeroizing::new(der));
                    let ttl = Duration::from_secs(inner.lifetime.load(Ordering::Relaxed));
                    let mut cache = inner.cache.lock().unwrap_or_else(|e| e.into_inner());
                    cache.insert(id, der.clone(), ttl, Instant::now());
                    update_cache_gauges(&cache);
                    drop(cache);
                    Some(der)
                }
                Outcome::Done(None) => {
                    m.redis.with_label_values(&["get", "miss"]).inc();
                    m.cache_lookups.with_label_values(&["miss"]).inc();
                    None
                }
                failed => {
                    m.redis.with_label_values(&["get", failed.label()]).inc();
                    m.fallbacks.with_label_values(&[failed.label()]).inc();
                    m.cache_lookups.with_label_values(&["miss"]).inc();
                    None
                }
            }
        }))
    }
}

/// The ticket keys of the process, as BoringSSL asks for them on every worker.
///
/// Seal: the encrypting key of the ring. Open: the current key, an older one (resume and
/// issue a fresh ticket), or none (unknown or expired key: full handshake).
struct TicketKeyRing;

fn secrets(key: &tickets::TicketKey) -> TicketSecrets<'_> {
    TicketSecrets {
        aes: &key.aes,
        hmac: &key.hmac,
    }
}

impl TicketKeyHook for TicketKeyRing {
    fn answer(request: TicketKeyRequest) -> TicketKeyAnswer {
        let Some(keys) = TICKET_KEYS.load_full() else {
            // No keys at all: send no ticket / ignore the ticket.
            return TicketKeyAnswer::NONE;
        };
        let now = Instant::now();
        let m = &*METRICS;
        match request {
            TicketKeyRequest::Seal(seal) => {
                let ring = keys.ring_for_encrypt(now);
                let key = &ring.encrypting().key;
                let answer = seal.with_key(&key.name, &secrets(key));
                m.tickets.with_label_values(&["issued"]).inc();
                answer
            }
            TicketKeyRequest::Open(open) => {
                let ring = keys.ring();
                let (key, renew, label) = match ring.lookup(open.key_name(), now) {
                    Lookup::Current(key) => (key, false, "current_key"),
                    Lookup::Old(key) => (key, true, "old_key"),
                    Lookup::Unknown => {
                        m.tickets.with_label_values(&["unknown_key"]).inc();
                        return TicketKeyAnswer::NONE;
                    }
                };
                let answer = open.with_key(&secrets(key), renew);
                m.tickets.with_label_values(&[label]).inc();
                answer
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boring::ssl::{SslAcceptor, SslConnector, SslMethod, SslSession, SslVerifyMode};

    #[test]
    fn config_defaults_and_durations() {
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
    fn make_sessions(count: usize) -> Vec<SslSession> {
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
                let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
                let acceptor = acceptor.clone();
                let server = std::thread::spawn(move || {
                    let stream = acceptor.accept(a).unwrap();
                    drop(stream);
                });
                let client = connector.connect("t", b).unwrap();
                let session = client.ssl().session().unwrap().to_owned();
                server.join().unwrap();
                session
            })
            .collect()
    }

    #[test]
    fn cache_bound_holds_under_many_sessions() {
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
}
