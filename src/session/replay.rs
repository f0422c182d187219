//! Anti-replay for TLS 1.3 early data (RFC 8446 section 8.2, "ClientHello recording").
//!
//! Early data travels before the client has proved it is live, so an attacker who
//! recorded a ClientHello carrying 0-RTT data can send it again and the early data would
//! reach the backend a second time. Each ClientHello that offers early data is
//! remembered by a digest of its first PSK identity and binder (see [`digest`]): the binder
//! is an HMAC over the whole ClientHello (random included) under the resumption secret, so
//! a replay carries the same bytes and a forgery fails BoringSSL's binder check anyway.
//! A ClientHello seen before gets a full 1-RTT handshake instead of 0-RTT.
//!
//! The memory only has to cover the time in which BoringSSL would still accept the
//! ticket's age: it refuses 0-RTT when the age the client claims and the age the server
//! computes differ by more than 60 s, so a copy older than the original's skew plus 60 s
//! is refused there. Digests are kept in two generations of [`WINDOW`] each, so every
//! digest is remembered for at least `WINDOW`.
//!
//! The set is bounded: when it is full, early data is refused for everyone until the
//! generation turns (a flood cannot make tlsterm forget a ClientHello). Digests are
//! recorded before BoringSSL checks the binder, so forged ClientHellos count too; each
//! client network (an IPv4 address, an IPv6 /56) may therefore fill only a share of a
//! generation (`early_data_replay_client_share`, 1% by default), and each wider network
//! (an IPv4 /24, an IPv6 /48: one holder's 256 networks) [`WIDER_NETWORK_SHARES`] shares,
//! so one source alone cannot turn 0-RTT off for everyone.
//!
//! A ClientHello refused because the set or a share is full is remembered too, or a copy
//! sent later from elsewhere would pass: it sets one bit, picked by its digest, in a
//! fixed bitmap per generation ([`MARK_BITS`] bits), and a ClientHello whose bit is set is
//! taken for a replay. A flood sets more bits and so refuses more fresh ClientHellos
//! (they resume with 1-RTT), but the memory stays bounded and forgets nothing.
//!
//! A new process remembers nothing. When its tickets may have been issued before it
//! started (a shared `ticket_key_file`) and no Redis remembers for it, a ClientHello seen
//! by the process it replaced could be replayed to it; so such a process refuses 0-RTT
//! until its memory covers a whole [`WINDOW`] (see [`ReplayGuard::remembers_a_full_window`]).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
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
    /// This client network has used its share of the memory for now.
    ClientQuota,
    /// The shared memory (Redis) did not answer in time: refused to stay safe.
    Unchecked,
    /// Fresh here, but this process started less than [`WINDOW`] ago and its tickets may
    /// predate it: the process before it may have seen the ClientHello.
    JustStarted,
    /// Fresh here and in Redis, but Redis lost its claims less than [`WINDOW`] ago: another
    /// process may have accepted the ClientHello before.
    StateLost,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Fresh => "fresh",
            Verdict::Replayed => "replayed",
            Verdict::Full => "replay_cache_full",
            Verdict::ClientQuota => "replay_client_quota",
            Verdict::Unchecked => "replay_check_failed",
            Verdict::JustStarted => "replay_window_after_start",
            Verdict::StateLost => "replay_state_lost",
        }
    }
}

pub type Digest = [u8; 16];

/// What identifies a ClientHello: a digest of the first PSK identity and its binder in the
/// `pre_shared_key` extension. BoringSSL resumes tickets (tlsterm's only PSKs) from the
/// first identity alone, and its binder authenticates the whole ClientHello before the
/// binder list; the other binders do not, so they are left out (an attacker could change
/// them to make a copy look new). An extension that does not parse is digested whole:
/// BoringSSL refuses it anyway.
pub fn digest(pre_shared_key: &[u8]) -> Digest {
    let hash = match first_identity_and_binder(pre_shared_key) {
        Some((identity, binder)) => {
            // The identity keeps its length prefix, so the concatenation is unambiguous.
            let mut hasher = boring::sha::Sha256::new();
            hasher.update(identity);
            hasher.update(binder);
            hasher.finish()
        }
        None => boring::sha::sha256(pre_shared_key),
    };
    hash[..16].try_into().expect("16 of 32 bytes")
}

/// RFC 8446 section 4.2.11: identities<7..2^16-1> (identity<1..2^16-1>, u32 age), then
/// binders<33..2^16-1> (binder<32..255>). Returns the first identity (with its length
/// prefix and age) and the first binder.
fn first_identity_and_binder(ext: &[u8]) -> Option<(&[u8], &[u8])> {
    fn take<'a>(data: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
        let (head, tail) = data.split_at_checked(len)?;
        *data = tail;
        Some(head)
    }
    fn u16_prefixed<'a>(data: &mut &'a [u8]) -> Option<&'a [u8]> {
        let len = take(data, 2)?;
        take(data, usize::from(u16::from_be_bytes([len[0], len[1]])))
    }
    let mut rest = ext;
    let mut identities = u16_prefixed(&mut rest)?;
    let mut binders = u16_prefixed(&mut rest)?;
    let identity_len = {
        let mut peek = identities;
        u16_prefixed(&mut peek)?.len()
    };
    let identity = take(&mut identities, 2 + identity_len + 4)?;
    let binder_len = usize::from(*take(&mut binders, 1)?.first()?);
    let binder = take(&mut binders, binder_len)?;
    Some((identity, binder))
}

/// Bits of the bitmap that remembers refused ClientHellos, per generation (128 KiB).
pub const MARK_BITS: usize = 1 << 20;

/// ClientHellos refused without a place in the set: one bit each, chosen by the digest
/// (which is uniform), so a bit may stand for several. Allocated on first use.
#[derive(Default)]
struct Marks {
    words: Vec<u64>,
}

impl Marks {
    fn bit(digest: &Digest) -> (usize, u64) {
        let at = u64::from_le_bytes(digest[..8].try_into().expect("8 of 16 bytes")) as usize;
        let at = at % MARK_BITS;
        (at / 64, 1 << (at % 64))
    }

    fn set(&mut self, digest: &Digest) {
        if self.words.is_empty() {
            self.words = vec![0; MARK_BITS / 64];
        }
        let (word, bit) = Marks::bit(digest);
        self.words[word] |= bit;
    }

    fn contains(&self, digest: &Digest) -> bool {
        let (word, bit) = Marks::bit(digest);
        self.words.get(word).is_some_and(|w| w & bit != 0)
    }
}

struct Generations {
    current: HashSet<Digest>,
    previous: HashSet<Digest>,
    /// Refused ClientHellos of each generation.
    current_marks: Marks,
    previous_marks: Marks,
    /// Digests added to `current`, by client network and by wider network.
    per_client: HashMap<Network, usize>,
    started: Instant,
}

/// How many client shares one wider network (IPv4 /24, IPv6 /48) may fill together.
pub const WIDER_NETWORK_SHARES: usize = 8;

fn per_client(capacity: usize, share: f64) -> usize {
    ((capacity as f64 * share) as usize).max(1)
}

/// A network, as its prefix length (in IPv6 form) and its address bits.
type Network = (u8, u128);

/// A client's network: the IPv4 address or the /56 of an IPv6 address (one site); and the
/// wider network around it: the IPv4 /24, the IPv6 /48.
fn client_networks(client: IpAddr) -> [Network; 2] {
    let (bits, own, wider) = match client {
        IpAddr::V4(v4) => (v4.to_ipv6_mapped().to_bits(), 128, 120),
        IpAddr::V6(v6) => (v6.to_bits(), 56, 48),
    };
    let prefix = |len: u8| {
        (
            len,
            bits & !(u128::MAX.checked_shr(u32::from(len)).unwrap_or(0)),
        )
    };
    [prefix(own), prefix(wider)]
}

/// The process-wide memory of early-data ClientHellos, shared by all workers and kept
/// across reloads (a reload must not open a replay window).
pub struct ReplayGuard {
    generations: Mutex<Generations>,
    /// Digests across both generations.
    capacity: AtomicUsize,
    /// Digests one client network may add to a generation.
    per_client: AtomicUsize,
    /// When this memory began: it knows nothing of ClientHellos seen before.
    created: Instant,
}

impl ReplayGuard {
    /// A memory of `capacity` digests, of which one client network may add `client_share`
    /// (a fraction) to each generation.
    pub fn new(capacity: usize, client_share: f64, now: Instant) -> ReplayGuard {
        ReplayGuard {
            generations: Mutex::new(Generations {
                current: HashSet::new(),
                previous: HashSet::new(),
                current_marks: Marks::default(),
                previous_marks: Marks::default(),
                per_client: HashMap::new(),
                started: now,
            }),
            capacity: AtomicUsize::new(capacity),
            per_client: AtomicUsize::new(per_client(capacity, client_share)),
            created: now,
        }
    }

    /// Whether every ClientHello BoringSSL could still accept 0-RTT from was seen by this
    /// memory, i.e. it has existed for a whole [`WINDOW`].
    pub fn remembers_a_full_window(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.created) >= WINDOW
    }

    pub fn set_capacity(&self, capacity: usize, client_share: f64) {
        self.capacity.store(capacity, Ordering::Relaxed);
        self.per_client
            .store(per_client(capacity, client_share), Ordering::Relaxed);
    }

    /// Records the [`digest`] of a ClientHello that offers early data, from `client`,
    /// whatever the verdict: a refused one is remembered as well.
    pub fn check(&self, digest: &Digest, client: IpAddr, now: Instant) -> Verdict {
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        let g = &mut *g;
        let age = now.saturating_duration_since(g.started);
        if age >= WINDOW {
            let forget_all = age >= 2 * WINDOW;
            g.previous = match forget_all {
                true => HashSet::new(),
                false => std::mem::take(&mut g.current),
            };
            g.previous_marks = match forget_all {
                true => Marks::default(),
                false => std::mem::take(&mut g.current_marks),
            };
            g.current.clear();
            g.current_marks = Marks::default();
            g.per_client.clear();
            g.started = now;
        }
        let known = g.current.contains(digest)
            || g.previous.contains(digest)
            || g.current_marks.contains(digest)
            || g.previous_marks.contains(digest);
        if known {
            return Verdict::Replayed;
        }
        let verdict = self.admit(g, client);
        if verdict == Verdict::Fresh {
            g.current.insert(*digest);
        } else {
            g.current_marks.set(digest);
        }
        verdict
    }

    /// Whether a new digest from `client` has room in the set (counted if so).
    fn admit(&self, g: &mut Generations, client: IpAddr) -> Verdict {
        let capacity = self.capacity.load(Ordering::Relaxed);
        if g.current.len() + g.previous.len() >= capacity {
            return Verdict::Full;
        }
        let share = self.per_client.load(Ordering::Relaxed);
        let [own, wider] = client_networks(client);
        let limits = [
            (own, share),
            (wider, share.saturating_mul(WIDER_NETWORK_SHARES)),
        ];
        if limits
            .iter()
            .any(|(network, limit)| g.per_client.get(network).is_some_and(|used| used >= limit))
        {
            return Verdict::ClientQuota;
        }
        for (network, _) in limits {
            *g.per_client.entry(network).or_default() += 1;
        }
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
mod tests;
