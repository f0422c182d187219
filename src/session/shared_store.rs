//! The contract between the session code and the store a fleet shares (Redis in
//! production, see `redis`): TLS 1.2 sessions by ID, and 0-RTT claims.
//!
//! Every operation answers within the store's timeout or not at all; what it came to is a
//! [`RedisReply`], and callers treat anything but `Done` as "the store could not tell":
//! a lookup misses, a claim refuses the early data and is retried in the background.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::cache::SessionDer;
pub use super::redis::{Claim, RedisReply};

/// A lookup in flight: the serialized session, if the store has one that opens.
pub type PendingGet = Pin<Box<dyn Future<Output = RedisReply<Option<Vec<u8>>>> + Send>>;
/// A claim in flight.
pub type PendingClaim = Pin<Box<dyn Future<Output = RedisReply<Claim>> + Send>>;

/// A store of sessions and 0-RTT claims shared by every process of a fleet.
///
/// Operations do not block the caller: lookups and claims return a future to await inside
/// the handshake; stores run in the background and report to `done`. `Err` (or a reply
/// of `Overload`) means the operation was not even started.
pub trait SharedSessionStore: Send + Sync {
    /// Looks the session with this ID up.
    fn get(&self, id: &[u8]) -> Result<PendingGet, RedisReply<()>>;

    /// Stores a session for `ttl`; `done` gets the outcome.
    fn put(
        &self,
        id: &[u8],
        der: SessionDer,
        ttl: Duration,
        done: Box<dyn FnOnce(RedisReply<()>) + Send>,
    );

    /// Claims `key` for `ttl` (the replay window).
    ///
    /// The contract 0-RTT anti-replay rests on: among every caller claiming the same key
    /// while its claim lives, across every process sharing the store, the claim succeeds
    /// ([`Claim::First`]) for exactly one; the others get [`Claim::Taken`]. A store that
    /// may have forgotten claims made within `ttl` answers [`Claim::StateLost`] to all.
    fn claim(&self, key: String, ttl: Duration) -> Result<PendingClaim, RedisReply<()>>;

    /// Claims `key` in the background until the store has answered or `ttl` has passed,
    /// so that a ClientHello refused without its claim made is still claimed; `done` gets
    /// each attempt's outcome.
    fn claim_in_background(
        &self,
        key: String,
        ttl: Duration,
        done: Box<dyn FnMut(RedisReply<()>) + Send>,
    );
}

#[cfg(test)]
pub(super) mod fake;
