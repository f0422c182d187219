//! The BoringSSL side of resumption: installing the hooks on a base context, storing and
//! looking up TLS 1.2 sessions by ID, and the ticket key callback.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use boring::ssl::{SslContextBuilder, SslOptions, SslSessionCacheMode, SslSessionRef, SslVersion};
use zeroize::Zeroizing;

use super::cache::SessionDer;
use super::handle::{Sessions, SessionsState};
use super::metrics::{update_cache_gauges, METRICS};
use super::redis::RedisReply;
use super::shared_store::SharedSessionStore;
use super::tickets::{unix_now, Lookup, TicketKeys};
use crate::config::SessionConfig;
use crate::sys::{PendingSession, TicketKeyAnswer, TicketKeyHook, TicketKeyRequest, TicketSecrets};

/// The ticket keys the ticket callback uses. BoringSSL looks the callback up on the session
/// context, but boring's closure-based `set_ticket_key_callback` finds its closure on the
/// *current* context, which the select-certificate callback has switched to a per-certificate
/// one by then; so the callback is a plain function and the keys are process-wide, as
/// `Sessions` is (the most recent `Sessions::new` wins).
pub(super) static TICKET_KEYS: ArcSwapOption<TicketKeys> = ArcSwapOption::const_empty();

impl Sessions {
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
            // BoringSSL reads the count from the session context, this base, even after the
            // select-certificate callback has switched to a per-certificate context.
            crate::sys::set_tls13_ticket_count(base, config.num_tickets.get());
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
}

/// What is left of the session `der`'s lifetime (its own timeout from when it was made) at
/// `now_unix`, at most `lifetime`: a session fetched from the fleet stays in this process's
/// cache, master secret and all, no longer than it could still resume, not a whole lifetime
/// from the fetch. Zero for one that does not parse.
pub(super) fn remaining_lifetime(der: &[u8], lifetime: Duration, now_unix: u64) -> Duration {
    let Ok(session) = boring::ssl::SslSession::from_der(der) else {
        return Duration::ZERO;
    };
    let ends = session.time().saturating_add(u64::from(session.timeout()));
    Duration::from_secs(ends.saturating_sub(now_unix)).min(lifetime)
}

impl SessionsState {
    /// The new-session callback: TLS 1.2 sessions with an ID go to the local cache and Redis.
    pub(super) fn store(&self, session: &SslSessionRef) {
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
            let count = |outcome: RedisReply<()>| {
                METRICS
                    .redis
                    .with_label_values(&["set", outcome.label()])
                    .inc();
            };
            redis.put(&id, der.clone(), ttl, Box::new(count));
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.insert(id, der, ttl, Instant::now());
        update_cache_gauges(&cache);
    }

    /// The get-session callback: the local cache answers at once; otherwise Redis, within
    /// `redis_timeout`; otherwise a full handshake.
    pub(super) fn lookup(self: &Arc<Self>, id: &[u8]) -> Option<PendingSession> {
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
            let der = shared_answer(pending.await)?;
            let lifetime = Duration::from_secs(inner.lifetime.load(Ordering::Relaxed));
            let ttl = remaining_lifetime(&der, lifetime, unix_now().as_secs());
            let der = SessionDer::new(Zeroizing::new(der));
            if !ttl.is_zero() {
                let mut cache = inner.cache.lock().unwrap_or_else(|e| e.into_inner());
                cache.insert(id, der.clone(), ttl, Instant::now());
                update_cache_gauges(&cache);
            }
            Some(der)
        }))
    }
}

/// The session a shared-store lookup found, if any; counts the answer. A failed lookup
/// (timeout, error) is a miss: the handshake goes on as a full one.
pub(super) fn shared_answer(outcome: RedisReply<Option<Vec<u8>>>) -> Option<Vec<u8>> {
    let m = &*METRICS;
    match outcome {
        RedisReply::Done(Some(der)) => {
            m.redis.with_label_values(&["get", "hit"]).inc();
            m.cache_lookups.with_label_values(&["redis"]).inc();
            Some(der)
        }
        RedisReply::Done(None) => {
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
}

/// The ticket keys of the process, as BoringSSL asks for them on every worker.
///
/// Seal: the encrypting key of the ring. Open: the current key, an older one (resume and
/// issue a fresh ticket), or none (unknown or expired key: full handshake).
pub(super) struct TicketKeyRing;

pub(super) fn secrets(key: &super::ticket_key::TicketKey) -> TicketSecrets<'_> {
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
mod tests;
