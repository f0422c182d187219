//! Anti-replay for TLS 1.3 early data (RFC 8446 section 8.2, "ClientHello recording").
//!
//! Early data travels before the client has proved it is live, so an attacker who
//! recorded a ClientHello carrying 0-RTT data can send it again and the early data would
//! reach the backend a second time. Each ClientHello that offers early data is
//! remembered by a digest of its `pre_shared_key` extension: the PSK binder in it is an
//! HMAC over the whole ClientHello (random included) under the resumption secret, so a
//! replay carries the same bytes and a forgery fails BoringSSL's binder check anyway.
//! A ClientHello seen before gets a full 1-RTT handshake instead of 0-RTT.
//!
//! The memory only has to cover the time in which BoringSSL would still accept the
//! ticket's age: it refuses 0-RTT when the age the client claims and the age the server
//! computes differ by more than 60 s, so a copy older than the original's skew plus 60 s
//! is refused there. Digests are kept in two generations of [`WINDOW`] each, so every
//! digest is remembered for at least `WINDOW`.
//!
//! The set is bounded: when it is full, early data is refused for everyone until the
//! generation turns (a flood cannot make tlsterm forget a ClientHello).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// BoringSSL's limit on ticket-age skew (kMaxTicketAgeSkewSeconds in tls13_server.cc).
const MAX_TICKET_AGE_SKEW: Duration = Duration::from_secs(60);

/// How long a digest is at least remembered: twice the skew BoringSSL tolerates (the
/// original may itself be skewed either way), plus a margin for its one-second clock.
pub const WINDOW: Duration = Duration::from_secs(2 * MAX_TICKET_AGE_SKEW.as_secs() + 10);

/// What became of a ClientHello offering early data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// First time seen: early data may be accepted.
    Fresh,
    /// Seen within the window: a replay (or a client retrying the identical bytes).
    Replayed,
    /// The memory is full: refused to stay safe.
    Full,
    /// The shared memory (Redis) did not answer in time: refused to stay safe.
    Unchecked,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Fresh => "fresh",
            Verdict::Replayed => "replayed",
            Verdict::Full => "replay_cache_full",
            Verdict::Unchecked => "replay_check_failed",
        }
    }
}

pub type Digest = [u8; 16];

/// What identifies a ClientHello: a digest of its `pre_shared_key` extension.
pub fn digest(pre_shared_key: &[u8]) -> Digest {
    boring::sha::sha256(pre_shared_key)[..16]
        .try_into()
        .expect("16 of 32 bytes")
}

struct Generations {
    current: HashSet<Digest>,
    previous: HashSet<Digest>,
    started: Instant,
}

/// The process-wide memory of early-data ClientHellos, shared by all workers and kept
/// across reloads (a reload must not open a replay window).
pub struct ReplayGuard {
    generations: Mutex<Generations>,
    /// Digests across both generations.
    capacity: AtomicUsize,
}

impl ReplayGuard {
    pub fn new(capacity: usize, now: Instant) -> ReplayGuard {
        ReplayGuard {
            generations: Mutex::new(Generations {
                current: HashSet::new(),
                previous: HashSet::new(),
                started: now,
            }),
            capacity: AtomicUsize::new(capacity),
        }
    }

    pub fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity, Ordering::Relaxed);
    }

    /// Records the [`digest`] of a ClientHello that offers early data.
    pub fn check(&self, digest: &Digest, now: Instant) -> Verdict {
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        let age = now.saturating_duration_since(g.started);
        if age >= WINDOW {
            g.previous = if age >= 2 * WINDOW {
                HashSet::new()
            } else {
                std::mem::take(&mut g.current)
            };
            g.current.clear();
            g.started = now;
        }
        if g.current.contains(digest) || g.previous.contains(digest) {
            return Verdict::Replayed;
        }
        if g.current.len() + g.previous.len() >= self.capacity.load(Ordering::Relaxed) {
            return Verdict::Full;
        }
        g.current.insert(*digest);
        Verdict::Fresh
    }

    /// Digests remembered now.
    pub fn len(&self) -> usize {
        let g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        g.current.len() + g.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_hello_is_fresh_once_within_the_window() {
        let start = Instant::now();
        let guard = ReplayGuard::new(100, start);
        assert_eq!(guard.check(&digest(b"binder-a"), start), Verdict::Fresh);
        assert_eq!(guard.check(&digest(b"binder-b"), start), Verdict::Fresh);
        assert_eq!(guard.check(&digest(b"binder-a"), start), Verdict::Replayed);
        // Still remembered one window later (now in the previous generation)...
        let later = start + WINDOW;
        assert_eq!(guard.check(&digest(b"binder-a"), later), Verdict::Replayed);
        // ...and forgotten after two, when BoringSSL's age check refuses such a copy.
        let much_later = later + WINDOW;
        assert_eq!(
            guard.check(&digest(b"binder-a"), much_later),
            Verdict::Fresh
        );
        assert_eq!(guard.len(), 1);
    }

    #[test]
    fn a_full_memory_refuses_instead_of_forgetting() {
        let start = Instant::now();
        let guard = ReplayGuard::new(2, start);
        assert_eq!(guard.check(&digest(b"1"), start), Verdict::Fresh);
        assert_eq!(guard.check(&digest(b"2"), start), Verdict::Fresh);
        assert_eq!(guard.check(&digest(b"3"), start), Verdict::Full);
        assert_eq!(guard.check(&digest(b"1"), start), Verdict::Replayed);
        // A turned generation keeps the old digests: still full.
        assert_eq!(guard.check(&digest(b"3"), start + WINDOW), Verdict::Full);
        guard.set_capacity(3);
        assert_eq!(guard.check(&digest(b"3"), start + WINDOW), Verdict::Fresh);
        assert_eq!(
            guard.check(&digest(b"2"), start + WINDOW),
            Verdict::Replayed
        );
    }

    #[test]
    fn after_a_long_pause_everything_is_forgotten() {
        let start = Instant::now();
        let guard = ReplayGuard::new(10, start);
        guard.check(&digest(b"old"), start);
        guard.check(&digest(b"new"), start + WINDOW + Duration::from_secs(1));
        assert_eq!(guard.len(), 2);
        guard.check(&digest(b"x"), start + 4 * WINDOW);
        assert_eq!(guard.len(), 1);
    }
}
