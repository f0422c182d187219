//! The proxy's series: backend connections, the plaintext bytes relayed, and the HTTP
//! requests forwarded (`mode = "http"`).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};

use crate::metrics::{self, latency_buckets};

struct ProxyMetrics {
    connect_failures: IntCounter,
    connect_time: Histogram,
    bytes: IntCounterVec,
    relay_buffers: IntGauge,
    http_requests: IntCounterVec,
    http_parked: IntCounter,
    http_early_requests: IntCounterVec,
    http_too_early_retries: IntCounterVec,
    backend_waits: IntCounter,
    pooled_connections: IntGauge,
}

static METRICS: LazyLock<ProxyMetrics> = LazyLock::new(|| ProxyMetrics {
    connect_failures: metrics::counter(
        "backend_connect_failures_total",
        "Backend connection attempts that failed",
    ),
    connect_time: metrics::histogram(
        "backend_connect_seconds",
        "Time to connect to a backend",
        latency_buckets(),
    ),
    bytes: metrics::counter_vec("bytes_total", "Plaintext bytes relayed", &["direction"]),
    relay_buffers: metrics::gauge(
        "relay_buffers",
        "Relay buffers allocated: held by connections with data in flight, or spare in a worker",
    ),
    http_requests: metrics::counter_vec(
        "http_requests_total",
        HTTP_REQUESTS_HELP,
        &["version", "answer"],
    ),
    http_parked: metrics::counter("http_parked_total", HTTP_PARKED_HELP),
    http_early_requests: metrics::counter_vec(
        "http_early_data_requests_total",
        HTTP_EARLY_REQUESTS_HELP,
        &["version"],
    ),
    http_too_early_retries: metrics::counter_vec(
        "http_too_early_retries_total",
        HTTP_TOO_EARLY_RETRIES_HELP,
        &["version"],
    ),
    backend_waits: metrics::counter("backend_connection_waits_total", BACKEND_WAITS_HELP),
    pooled_connections: metrics::gauge("backend_pooled_connections", POOLED_CONNECTIONS_HELP),
});

const HTTP_REQUESTS_HELP: &str = "Requests of mode = \"http\" listeners, by the client's HTTP \
    version (1.1 or 2) and by who answered: the backend, or tlsterm with 502 (no backend \
    answered), 504 (too late), 405 (CONNECT) or 400 (an HTTP/2 request without a host)";

const HTTP_EARLY_REQUESTS_HELP: &str = "Requests of mode = \"http\" listeners forwarded \
    before the client's handshake was confirmed (sent in 0-RTT data, so possibly replayed; \
    the backend gets them with Early-Data: 1), by the client's HTTP version";

const HTTP_TOO_EARLY_RETRIES_HELP: &str = "Requests that tlsterm forwarded in early data, \
    that the backend answered 425 Too Early, and that tlsterm sent again once the client's \
    handshake was confirmed (mode = \"http\" and HTTP/3), by the client's HTTP version";

const BACKEND_WAITS_HELP: &str = "Requests (mode = \"http\", HTTP/3) that waited for a \
    backend connection: every one a worker may open to the backends (backend_max_connections) \
    was busy";

const POOLED_CONNECTIONS_HELP: &str = "Connections open from the workers' pools to backends \
    (mode = \"http\", HTTP/3), busy or idle";

const HTTP_PARKED_HELP: &str = "Times a mode = \"http\" connection, quiet between requests, \
    gave up its HTTP buffers until the client sent more";

/// Registers the series, so that they are exported from the start.
pub fn register() {
    LazyLock::force(&METRICS);
}

pub(super) fn record_backend_connect(elapsed: Duration, ok: bool) {
    if !metrics::enabled() {
        return;
    }
    if ok {
        METRICS.connect_time.observe(elapsed.as_secs_f64());
    } else {
        METRICS.connect_failures.inc();
    }
}

/// What a closed connection relayed each way.
pub fn record_relayed(to_backend: u64, to_client: u64) {
    if !metrics::enabled() {
        return;
    }
    let bytes = &METRICS.bytes;
    bytes.with_label_values(&["to_backend"]).inc_by(to_backend);
    bytes.with_label_values(&["to_client"]).inc_by(to_client);
}

/// A request that came as HTTP `version` ("1.1" or "2") forwarded (`"backend"`: the
/// backend's response went back) or answered by tlsterm (`"502"`, `"504"`, `"405"`,
/// `"400"`).
pub fn record_http_request(version: &str, answer: &str) {
    if !metrics::enabled() {
        return;
    }
    METRICS
        .http_requests
        .with_label_values(&[version, answer])
        .inc();
}

/// A `mode = "http"` request forwarded before its connection's handshake was confirmed.
pub fn record_http_early_request(version: &str) {
    if !metrics::enabled() {
        return;
    }
    METRICS
        .http_early_requests
        .with_label_values(&[version])
        .inc();
}

/// A request answered 425 Too Early sent to the backend again after the handshake.
pub fn record_too_early_retry(version: &str) {
    if !metrics::enabled() {
        return;
    }
    METRICS
        .http_too_early_retries
        .with_label_values(&[version])
        .inc();
}

/// A pooled backend connection opened (`+1`) or closed (`-1`).
pub(super) fn record_pooled_connection(change: i64) {
    if !metrics::enabled() {
        return;
    }
    METRICS.pooled_connections.add(change);
}

/// A request found every connection it may use busy and waits for one.
pub(super) fn record_backend_wait() {
    if !metrics::enabled() {
        return;
    }
    METRICS.backend_waits.inc();
}

/// A `mode = "http"` connection parked: quiet between requests, it gave up hyper's buffers.
pub fn record_http_parked() {
    if !metrics::enabled() {
        return;
    }
    METRICS.http_parked.inc();
}

// The relay buffer count is kept whether or not hot-path series are recorded: it changes
// only when a buffer is allocated or freed, and must stay balanced.

pub(super) fn relay_buffer_allocated() {
    METRICS.relay_buffers.inc();
}

pub(super) fn relay_buffer_freed() {
    METRICS.relay_buffers.dec();
}
