//! The in-process session-ID cache (TLS 1.2): serialized sessions by ID, bounded in entries
//! and bytes, least recently used out first. One per process, shared by all workers and kept
//! across reloads.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

pub use crate::sys::SessionDer;

/// Bytes counted per entry besides the ID and the serialized session (map and list nodes).
const ENTRY_OVERHEAD: usize = 96;

struct Entry {
    der: SessionDer,
    expires: Instant,
    tick: u64,
}

pub struct LruCache {
    map: HashMap<Vec<u8>, Entry>,
    /// Recency order: tick of last use -> key. The smallest tick is the least recently used.
    order: BTreeMap<u64, Vec<u8>>,
    tick: u64,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
    evictions: u64,
}

fn cost(key: &[u8], der: &[u8]) -> usize {
    key.len() + der.len() + ENTRY_OVERHEAD
}

impl LruCache {
    pub fn new(max_entries: usize, max_bytes: usize) -> LruCache {
        LruCache {
            map: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            bytes: 0,
            max_entries,
            max_bytes,
            evictions: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries pushed out by the bounds so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    pub fn set_bounds(&mut self, max_entries: usize, max_bytes: usize) {
        self.max_entries = max_entries;
        self.max_bytes = max_bytes;
        self.shrink();
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Inserts (or replaces) an entry, then evicts least recently used ones over the bounds.
    /// An entry larger than the whole byte budget is not stored.
    pub fn insert(&mut self, key: Vec<u8>, der: SessionDer, ttl: Duration, now: Instant) {
        self.remove(&key);
        let size = cost(&key, &der);
        if self.max_entries == 0 || size > self.max_bytes {
            return;
        }
        let tick = self.next_tick();
        self.bytes += size;
        self.order.insert(tick, key.clone());
        self.map.insert(
            key,
            Entry {
                der,
                expires: now + ttl,
                tick,
            },
        );
        self.shrink();
    }

    /// The session for `key` if present and not expired; marks it most recently used.
    pub fn get(&mut self, key: &[u8], now: Instant) -> Option<SessionDer> {
        let expired = self.map.get(key)?.expires <= now;
        if expired {
            self.remove(key);
            return None;
        }
        let tick = self.next_tick();
        let entry = self.map.get_mut(key).expect("present");
        let old = std::mem::replace(&mut entry.tick, tick);
        let der = entry.der.clone();
        let owned = self.order.remove(&old).expect("in order");
        self.order.insert(tick, owned);
        Some(der)
    }

    pub fn remove(&mut self, key: &[u8]) -> bool {
        match self.map.remove(key) {
            Some(entry) => {
                self.order.remove(&entry.tick);
                self.bytes -= cost(key, &entry.der);
                true
            }
            None => false,
        }
    }

    fn shrink(&mut self) {
        while self.map.len() > self.max_entries || self.bytes > self.max_bytes {
            let Some((_, key)) = self.order.pop_first() else {
                break;
            };
            let entry = self.map.remove(&key).expect("in map");
            self.bytes -= cost(&key, &entry.der);
            self.evictions += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use zeroize::Zeroizing;

    fn der(n: usize) -> SessionDer {
        Arc::new(Zeroizing::new(vec![0u8; n]))
    }

    const TTL: Duration = Duration::from_secs(60);

    #[test]
    fn entry_bound_evicts_least_recently_used() {
        let now = Instant::now();
        let mut cache = LruCache::new(3, usize::MAX);
        for k in [b"a", b"b", b"c"] {
            cache.insert(k.to_vec(), der(10), TTL, now);
        }
        // Using `a` makes `b` the least recently used.
        assert!(cache.get(b"a", now).is_some());
        cache.insert(b"d".to_vec(), der(10), TTL, now);
        assert_eq!(cache.len(), 3);
        assert!(cache.get(b"b", now).is_none());
        assert!(cache.get(b"a", now).is_some());
        assert!(cache.get(b"c", now).is_some());
        assert!(cache.get(b"d", now).is_some());
        assert_eq!(cache.evictions(), 1);
    }

    #[test]
    fn byte_bound_holds() {
        let now = Instant::now();
        let per = cost(b"xxxx", &der(100));
        let mut cache = LruCache::new(1000, per * 5);
        for i in 0u32..50 {
            cache.insert(i.to_be_bytes().to_vec(), der(100), TTL, now);
            assert!(cache.bytes() <= per * 5);
        }
        assert_eq!(cache.len(), 5);
        // Too big for the whole budget: not stored, nothing evicted for it.
        cache.insert(b"big!".to_vec(), der(per * 6), TTL, now);
        assert_eq!(cache.len(), 5);
        assert!(cache.get(b"big!", now).is_none());
        cache.set_bounds(2, usize::MAX);
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&49u32.to_be_bytes(), now).is_some());
    }

    #[test]
    fn expired_entries_are_not_returned() {
        let now = Instant::now();
        let mut cache = LruCache::new(10, usize::MAX);
        cache.insert(b"a".to_vec(), der(1), Duration::from_secs(1), now);
        assert!(cache.get(b"a", now).is_some());
        assert!(cache.get(b"a", now + Duration::from_secs(2)).is_none());
        assert!(cache.is_empty());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn sessions_are_wiped_when_let_go() {
        fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>(_: &T) {}
        let now = Instant::now();
        let mut cache = LruCache::new(10, usize::MAX);
        cache.insert(b"a".to_vec(), der(10), TTL, now);
        wiped_on_drop(&*cache.get(b"a", now).unwrap());
    }

    #[test]
    fn replacing_keeps_accounting_exact() {
        let now = Instant::now();
        let mut cache = LruCache::new(10, usize::MAX);
        cache.insert(b"a".to_vec(), der(10), TTL, now);
        cache.insert(b"a".to_vec(), der(20), TTL, now);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.bytes(), cost(b"a", &der(20)));
    }
}
