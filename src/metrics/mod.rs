//! Process-wide metrics (all workers aggregated), exposed in the Prometheus text format.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    exponential_buckets, register_histogram_with_registry, register_int_counter_vec_with_registry,
    register_int_counter_with_registry, Histogram, IntCounter, IntCounterVec, Registry,
};

use crate::offload::KeyKind;

/// Why a batch of private-key operations ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushCause {
    Full,
    AllWaiting,
    Idle,
    Timer,
    /// Too few operations to be worth a multi-buffer pass: computed one by one.
    Small,
}

impl FlushCause {
    pub fn label(self) -> &'static str {
        match self {
            FlushCause::Full => "full",
            FlushCause::AllWaiting => "all_waiting",
            FlushCause::Idle => "idle",
            FlushCause::Timer => "timer",
            FlushCause::Small => "small",
        }
    }
}

pub struct Metrics {
    pub registry: Registry,
    engine_ops: IntCounterVec,
    engine_errors: IntCounter,
    flushes: IntCounterVec,
    queue_wait: Histogram,
    batch_time: Histogram,
    batch_lanes: Histogram,
}

fn latency_buckets() -> Vec<f64> {
    // 1 us .. about 8 s, doubling: the resolution of bpftrace's hist().
    exponential_buckets(1e-6, 2.0, 24).expect("valid buckets")
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let registry = Registry::new_custom(Some("tlsterm".into()), None).expect("registry");
    let r = &registry;
    Metrics {
        engine_ops: register_int_counter_vec_with_registry!(
            "engine_operations_total",
            "Private-key operations by algorithm and path (inline or batch)",
            &["algorithm", "path"],
            r
        )
        .expect("metric"),
        engine_errors: register_int_counter_with_registry!(
            "engine_errors_total",
            "Engine operations that failed (fault check or refusal) and were redone inline",
            r
        )
        .expect("metric"),
        flushes: register_int_counter_vec_with_registry!(
            "engine_flushes_total",
            "Batches run, by the cause that triggered them",
            &["cause"],
            r
        )
        .expect("metric"),
        queue_wait: register_histogram_with_registry!(
            "engine_queue_wait_seconds",
            "Time an operation waited in its worker's queue",
            latency_buckets(),
            r
        )
        .expect("metric"),
        batch_time: register_histogram_with_registry!(
            "engine_batch_seconds",
            "Compute time of one multi-buffer batch",
            latency_buckets(),
            r
        )
        .expect("metric"),
        batch_lanes: register_histogram_with_registry!(
            "engine_batch_operations",
            "Operations per multi-buffer batch",
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
            r
        )
        .expect("metric"),
        registry,
    }
});

pub fn record_inline_op(kind: KeyKind, _elapsed: Duration) {
    METRICS
        .engine_ops
        .with_label_values(&[kind.label(), "inline"])
        .inc();
}

pub fn record_queue_wait(wait: Duration) {
    METRICS.queue_wait.observe(wait.as_secs_f64());
}

pub fn record_flush(cause: FlushCause, _ops: usize) {
    METRICS.flushes.with_label_values(&[cause.label()]).inc();
}

pub fn record_batch(kind: KeyKind, ops: usize, elapsed: Duration) {
    METRICS
        .engine_ops
        .with_label_values(&[kind.label(), "batch"])
        .inc_by(ops as u64);
    METRICS.batch_lanes.observe(ops as f64);
    METRICS.batch_time.observe(elapsed.as_secs_f64());
}

pub fn record_engine_error() {
    METRICS.engine_errors.inc();
}
