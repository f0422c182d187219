//! The engine's series: operations by path, batches and why they ran, queue waits, and
//! which kernel signs.

use std::cell::OnceCell;
use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGaugeVec};

use crate::metrics::{self, latency_buckets};

struct EngineMetrics {
    ops: IntCounterVec,
    info: IntGaugeVec,
    errors: IntCounter,
    flushes: IntCounterVec,
    queue_wait: Histogram,
    batch_time: Histogram,
    batch_lanes: Histogram,
    worker_ops: IntCounterVec,
    key_shares: IntCounterVec,
    share_flushes: IntCounterVec,
    share_lanes: Histogram,
    encapsulations: IntCounterVec,
}

static METRICS: LazyLock<EngineMetrics> = LazyLock::new(|| {
    EngineMetrics {
    ops: metrics::counter_vec(
        "engine_operations_total",
        "Private-key operations by algorithm and by what made the signature: batch (the multi-buffer engine), aws-lc-rs (aws-lc, one at a time: ECDSA P-384, and RSA signatures outside a batch where the IFMA kernel batches RSA) or inline (BoringSSL, including an operation the engine failed)",
        &["algorithm", "path"],
    ),
    info: metrics::gauge_vec(
        "engine_info",
        "1 for how signatures are made now: the multi-buffer kernel that signs RSA (none when inline) and whether signatures are batched or inline (ECDSA P-256 is batched where the CPU has AVX-512 IFMA and [engine] ecdsa lets it: its path shows in engine_operations_total)",
        &["kernel", "signing"],
    ),
    errors: metrics::counter(
        "engine_errors_total",
        "Engine operations that failed (fault check or refusal) and were redone inline",
    ),
    flushes: metrics::counter_vec(
        "engine_flushes_total",
        "Batches run, by the cause that triggered them",
        &["cause"],
    ),
    queue_wait: metrics::histogram(
        "engine_queue_wait_seconds",
        "Time an operation waited in its worker's queue",
        latency_buckets(),
    ),
    batch_time: metrics::histogram(
        "engine_batch_seconds",
        "Compute time of one multi-buffer batch",
        latency_buckets(),
    ),
    batch_lanes: metrics::histogram(
        "engine_batch_operations",
        "Operations per multi-buffer batch",
        (1..=16).map(f64::from).collect(),
    ),
    worker_ops: metrics::counter_vec(
        "worker_engine_operations_total",
        "Private-key operations (batch and inline), by worker",
        &["worker"],
    ),
    key_shares: metrics::counter_vec(
        "key_shares_total",
        "Server key shares of completed handshakes, by group and by what computed them: batch (the multi-buffer engine), aws-lc-rs, inline (BoringSSL); not_applied counts a share tlsterm computed that BoringSSL did not use",
        &["group", "path"],
    ),
    share_flushes: metrics::counter_vec(
        "engine_key_share_flushes_total",
        "Batches of X25519 key shares run, by the cause that triggered them (small: computed one by one by aws-lc)",
        &["cause"],
    ),
    share_lanes: metrics::histogram(
        "engine_key_share_batch_operations",
        "X25519 key shares per batch",
        (1..=8).map(f64::from).collect(),
    ),
    encapsulations: metrics::counter_vec(
        "engine_mlkem_encapsulations_total",
        "ML-KEM-768 encapsulations of X25519MLKEM768 key shares computed in a worker's queue, by what computed them: batch (the multi-buffer engine) or aws-lc-rs (one at a time, in a batch with fewer than mlkem_small_batch_threshold of them)",
        &["path"],
    ),
}
});

thread_local! {
    /// This worker's operation counter, resolved on first use (none off workers).
    static WORKER_OPS: OnceCell<Option<IntCounter>> = const { OnceCell::new() };
}

fn count_on_worker(ops: u64) {
    WORKER_OPS.with(|cell| {
        let counter = cell.get_or_init(|| {
            metrics::worker()
                .map(|index| METRICS.worker_ops.with_label_values(&[&index.to_string()]))
        });
        if let Some(counter) = counter {
            counter.inc_by(ops);
        }
    });
}

/// Registers the series, so that they are exported from the start.
pub fn register() {
    LazyLock::force(&METRICS);
}

/// One operation computed. `kind`: the key's kind (`rsa2048`, `ecdsap256`, ...); `path`:
/// `inline` (BoringSSL) or `batch` (the multi-buffer engine, its public-key check passed).
pub(super) fn record_op(kind: &str, path: &str) {
    if !metrics::enabled() {
        return;
    }
    METRICS.ops.with_label_values(&[kind, path]).inc();
    count_on_worker(1);
}

/// One key share of a completed handshake (see `tls::key_share_hint::record`).
pub fn record_key_share(group: &str, path: &str) {
    if !metrics::enabled() {
        return;
    }
    METRICS.key_shares.with_label_values(&[group, path]).inc();
}

/// A batch of `shares` X25519 key shares ran, for `cause`.
pub(super) fn record_share_flush(cause: &str, shares: usize) {
    if !metrics::enabled() {
        return;
    }
    METRICS.share_flushes.with_label_values(&[cause]).inc();
    METRICS.share_lanes.observe(shares as f64);
}

/// `count` ML-KEM-768 encapsulations computed by `path` (`batch` or `aws-lc-rs`).
pub(super) fn record_encapsulations(path: &str, count: usize) {
    if !metrics::enabled() {
        return;
    }
    METRICS
        .encapsulations
        .with_label_values(&[path])
        .inc_by(count as u64);
}

pub(super) fn record_queue_wait(wait: Duration) {
    if !metrics::enabled() {
        return;
    }
    METRICS.queue_wait.observe(wait.as_secs_f64());
}

/// `cause`: why the batch ran (`full`, `all_waiting`, `idle`, `timer`, `small`).
pub(super) fn record_flush(cause: &str) {
    if !metrics::enabled() {
        return;
    }
    METRICS.flushes.with_label_values(&[cause]).inc();
}

/// A multi-buffer batch of `ops` operations ran for `elapsed`. Its operations are counted
/// one by one by `record_op`, each under its own key kind and under the path its result
/// took (an operation the engine failed is signed again inline).
pub(super) fn record_batch(ops: usize, elapsed: Duration) {
    if !metrics::enabled() {
        return;
    }
    METRICS.batch_lanes.observe(ops as f64);
    METRICS.batch_time.observe(elapsed.as_secs_f64());
}

pub(super) fn record_engine_error() {
    if !metrics::enabled() {
        return;
    }
    METRICS.errors.inc();
}

/// Publishes which kernel signs and whether signatures are batched (at start and reload).
pub(super) fn set_engine_info(kernel: &str, signing: &str) {
    METRICS.info.reset();
    METRICS.info.with_label_values(&[kernel, signing]).set(1);
}
