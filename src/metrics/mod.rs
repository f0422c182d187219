//! The process-wide metric registry (all workers aggregated) and its exposition in the
//! Prometheus text format, served by the admin listener (`admin.rs`) and rendered by
//! `tlsterm stats`.
//!
//! This module knows no series of its own: each module registers its series here from its
//! own `metrics.rs` (`offload`: the engine; `proxy`: backends and relayed bytes; `tls`:
//! what handshakes negotiated and how long their phases took; `session`; `acme`; `server`:
//! connections, listeners, workers) and records them through functions named after what
//! happened. The helpers below keep those registrations to one line each.
//!
//! Histograms of time use the same doubling buckets, 1 us to about 8 s: the resolution
//! of a bpftrace latency histogram, so `tlsterm stats` can draw them the same way.

pub mod admin;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;

use prometheus::{
    exponential_buckets, CounterVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Every series of the process, named `tlsterm_*`.
static REGISTRY: LazyLock<Registry> =
    LazyLock::new(|| Registry::new_custom(Some("tlsterm".into()), None).expect("registry"));

pub fn registry() -> &'static Registry {
    &REGISTRY
}

/// Doubling buckets from 1 us to about 8 s.
pub fn latency_buckets() -> Vec<f64> {
    exponential_buckets(1e-6, 2.0, 24).expect("valid buckets")
}

fn register<M: prometheus::core::Collector + Clone + 'static>(metric: M) -> M {
    REGISTRY
        .register(Box::new(metric.clone()))
        .expect("each series is registered once");
    metric
}

pub fn counter(name: &str, help: &str) -> IntCounter {
    register(IntCounter::new(name, help).expect("valid metric"))
}

pub fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
}

/// A counter of seconds (CPU time).
pub fn seconds_counter_vec(name: &str, help: &str, labels: &[&str]) -> CounterVec {
    register(CounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
}

pub fn gauge(name: &str, help: &str) -> IntGauge {
    register(IntGauge::new(name, help).expect("valid metric"))
}

pub fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"))
}

pub fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(Histogram::with_opts(opts).expect("valid metric"))
}

pub fn histogram_vec(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(HistogramVec::new(opts, labels).expect("valid metric"))
}

/// Recording switch: off when the admin listener is disabled (nobody could read the
/// metrics). Set once at start, so gauges stay consistent.
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether hot-path series are recorded (see [`set_enabled`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

thread_local! {
    /// The index of the worker running on this thread; none on other threads.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Marks this thread as worker `index`, so that per-worker series (`worker_*`, which show
/// how the kernel spreads connections over the cores) can find their label.
pub fn set_worker(index: usize) {
    WORKER.with(|worker| worker.set(Some(index)));
}

/// The worker running on this thread, if it is one.
pub fn worker() -> Option<usize> {
    WORKER.with(Cell::get)
}

/// The exposition in the Prometheus text format.
pub fn render() -> String {
    TextEncoder::new()
        .encode_to_string(&REGISTRY.gather())
        .unwrap_or_default()
}
