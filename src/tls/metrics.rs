//! What completed handshakes negotiated (version, suite, group, ALPN, early data), how long
//! their phases took, and the TLS features along the way (OCSP, ECH, certificate
//! compression).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{HistogramVec, IntCounterVec};

use super::Negotiated;
use crate::metrics::{self, latency_buckets};

struct TlsMetrics {
    versions: IntCounterVec,
    ciphers: IntCounterVec,
    groups: IntCounterVec,
    alpn: IntCounterVec,
    handshake_time: HistogramVec,
    ocsp: IntCounterVec,
    ocsp_fetches: IntCounterVec,
    early_data: IntCounterVec,
    certificates_compressed: IntCounterVec,
    ech: IntCounterVec,
}

static METRICS: LazyLock<TlsMetrics> = LazyLock::new(|| {
    TlsMetrics {
    versions: metrics::counter_vec(
        "tls_versions_total",
        "Completed handshakes by TLS version",
        &["version"],
    ),
    ciphers: metrics::counter_vec(
        "tls_ciphers_total",
        "Completed handshakes by cipher suite",
        &["cipher"],
    ),
    groups: metrics::counter_vec(
        "tls_groups_total",
        "Completed handshakes by key-exchange group (X25519MLKEM768: post-quantum hybrid)",
        &["group"],
    ),
    alpn: metrics::counter_vec(
        "tls_alpn_total",
        "Completed handshakes by negotiated ALPN protocol",
        &["protocol"],
    ),
    handshake_time: metrics::histogram_vec(
        "handshake_seconds",
        "Handshake time, split: total (accept to done), tls (inside BoringSSL), engine_wait (signature requested to signature ready)",
        &["phase"],
        latency_buckets(),
    ),
    ocsp: metrics::counter_vec(
        "ocsp_responses_total",
        "OCSP responses loaded: stapled, or why not",
        &["result"],
    ),
    ocsp_fetches: metrics::counter_vec(
        "ocsp_fetches_total",
        "Requests to OCSP responders (ocsp_fetch): ok (an answer came) or failed",
        &["result"],
    ),
    early_data: metrics::counter_vec(
        "early_data_total",
        "TLS 1.3 ClientHellos offering 0-RTT: accepted, or why refused",
        &["result"],
    ),
    certificates_compressed: metrics::counter_vec(
        "certificates_compressed_total",
        "Certificate messages sent compressed (RFC 8879), by algorithm",
        &["algorithm"],
    ),
    ech: metrics::counter_vec(
        "ech_total",
        "ClientHellos on listeners with ech_keys: Encrypted Client Hello accepted, rejected (retry configs sent) or not_offered",
        &["result"],
    ),
}
});

/// Registers the series, so that they are exported from the start.
pub fn register() {
    LazyLock::force(&METRICS);
}

/// A completed handshake: what it negotiated, its time from accept (`total`) and the part
/// of it spent inside BoringSSL (`in_tls`).
pub fn record_negotiated(negotiated: &Negotiated, total: Duration, in_tls: Duration) {
    // Counted whether or not recording is enabled, as every 0-RTT outcome is.
    if let Some(outcome) = negotiated.early_data_outcome {
        record_early_data(outcome);
    }
    if !metrics::enabled() {
        return;
    }
    let m = &*METRICS;
    m.versions.with_label_values(&[negotiated.version]).inc();
    m.ciphers.with_label_values(&[&negotiated.cipher]).inc();
    if let Some(group) = negotiated.group {
        m.groups.with_label_values(&[group]).inc();
    }
    let alpn = negotiated.alpn.as_deref().map(String::from_utf8_lossy);
    m.alpn
        .with_label_values(&[alpn.as_deref().unwrap_or("none")])
        .inc();
    let phases = &m.handshake_time;
    phases
        .with_label_values(&["total"])
        .observe(total.as_secs_f64());
    phases
        .with_label_values(&["tls"])
        .observe(in_tls.as_secs_f64());
}

/// Time from a signature's request to its result (queue and batch included).
pub(super) fn record_engine_wait(wait: Duration) {
    if !metrics::enabled() {
        return;
    }
    METRICS
        .handshake_time
        .with_label_values(&["engine_wait"])
        .observe(wait.as_secs_f64());
}

pub(super) fn record_ocsp(result: &str) {
    METRICS.ocsp.with_label_values(&[result]).inc();
}

pub(super) fn record_ocsp_fetch(result: &str) {
    METRICS.ocsp_fetches.with_label_values(&[result]).inc();
}

pub(super) fn record_early_data(result: &str) {
    METRICS.early_data.with_label_values(&[result]).inc();
}

pub(super) fn record_ech(result: &str) {
    METRICS.ech.with_label_values(&[result]).inc();
}

pub(super) fn record_certificate_compressed(algorithm: &str) {
    METRICS
        .certificates_compressed
        .with_label_values(&[algorithm])
        .inc();
}
