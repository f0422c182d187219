//! 0-RTT: the anti-replay check of a ClientHello that offers early data.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use super::handle::Sessions;
use super::metrics::METRICS;
use super::replay::Verdict;
use super::shared_store::{Claim, PendingClaim, RedisReply, SharedSessionStore};
use super::{replay, ticket_key};

impl Sessions {
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
        let key = || format!("0rtt:{}", ticket_key::hex(&digest));
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
                claim_in_background(&*redis, key());
                return EarlyDataCheck::Now(local);
            }
        };
        claim_shared(redis, key())
    }

    /// Tickets sealed with keys from a file may have been issued by an earlier process.
    pub(super) fn tickets_may_predate_process(&self) -> bool {
        let config = self.inner.config.lock().unwrap_or_else(|e| e.into_inner());
        config.ticket_key_file.is_some()
    }
}

/// Claims the key of a ClientHello fresh in this process's memory in the shared store;
/// one that cannot even be sent is refused and claimed in the background.
fn claim_shared(store: Arc<dyn SharedSessionStore>, key: String) -> EarlyDataCheck {
    match store.claim(key.clone(), replay::WINDOW) {
        Ok(pending) => EarlyDataCheck::Shared {
            pending,
            store,
            key,
        },
        Err(_) => {
            claim_in_background(&*store, key);
            EarlyDataCheck::Now(Verdict::Unchecked)
        }
    }
}

/// The anti-replay verdict on a 0-RTT ClientHello: known now, or once the shared store
/// answers (within `redis_timeout`; no answer refuses the early data).
pub enum EarlyDataCheck {
    Now(Verdict),
    Shared {
        pending: PendingClaim,
        /// Where `key` is claimed again if this claim gets no answer.
        store: Arc<dyn SharedSessionStore>,
        key: String,
    },
}

impl EarlyDataCheck {
    pub async fn verdict(self) -> Verdict {
        match self {
            EarlyDataCheck::Now(verdict) => verdict,
            EarlyDataCheck::Shared {
                pending,
                store,
                key,
            } => {
                let outcome = pending.await;
                METRICS
                    .redis
                    .with_label_values(&["claim", outcome.label()])
                    .inc();
                match outcome {
                    RedisReply::Done(Claim::First) => Verdict::Fresh,
                    RedisReply::Done(Claim::Taken) => Verdict::Replayed,
                    RedisReply::Done(Claim::StateLost) => Verdict::StateLost,
                    _ => {
                        claim_in_background(&*store, key);
                        Verdict::Unchecked
                    }
                }
            }
        }
    }
}

/// Claims a refused ClientHello's `key` in the shared store in the background (see
/// [`SharedSessionStore::claim_in_background`]), counting each attempt.
pub(super) fn claim_in_background(store: &dyn SharedSessionStore, key: String) {
    let count = |outcome: RedisReply<()>| {
        METRICS
            .redis
            .with_label_values(&["claim", outcome.label()])
            .inc();
    };
    store.claim_in_background(key, replay::WINDOW, Box::new(count));
}

#[cfg(test)]
mod tests;
