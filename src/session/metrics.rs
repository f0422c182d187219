//! The session metrics, registered in the process registry.

use std::sync::LazyLock;

use prometheus::{
    register_int_counter_vec_with_registry, register_int_gauge_with_registry, IntCounterVec,
    IntGauge,
};

use super::cache::LruCache;

pub(super) struct SessionMetrics {
    pub(super) tickets: IntCounterVec,
    pub(super) cache_lookups: IntCounterVec,
    pub(super) cache_entries: IntGauge,
    pub(super) cache_bytes: IntGauge,
    pub(super) cache_evictions: IntGauge,
    pub(super) redis: IntCounterVec,
    pub(super) fallbacks: IntCounterVec,
}

pub(super) static METRICS: LazyLock<SessionMetrics> = LazyLock::new(|| {
    let r = crate::metrics::registry();
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

pub(super) fn update_cache_gauges(cache: &LruCache) {
    let m = &*METRICS;
    m.cache_entries.set(cache.len() as i64);
    m.cache_bytes.set(cache.bytes() as i64);
    m.cache_evictions.set(cache.evictions() as i64);
}
