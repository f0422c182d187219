//! The server's series: connections (process-wide, per listening address, per worker),
//! completed and failed handshakes, why connections closed, and each worker's CPU time.

use std::cell::{Cell, OnceCell};
use std::sync::LazyLock;

use prometheus::{Counter, CounterVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use crate::metrics;

struct ServerMetrics {
    accepted: IntCounter,
    active: IntGauge,
    closed: IntCounterVec,
    handshakes: IntCounterVec,
    failures: IntCounterVec,
    worker_accepted: IntCounterVec,
    worker_active: IntGaugeVec,
    worker_handshakes: IntCounterVec,
    worker_cpu: CounterVec,
    listener_accepted: IntCounterVec,
    listener_active: IntGaugeVec,
    listener_handshakes: IntCounterVec,
    listener_failures: IntCounterVec,
    reloads: IntCounterVec,
}

static METRICS: LazyLock<ServerMetrics> = LazyLock::new(|| ServerMetrics {
    accepted: metrics::counter("connections_accepted_total", "Connections accepted"),
    active: metrics::gauge("connections_active", "Connections open now"),
    closed: metrics::counter_vec(
        "connections_closed_total",
        "Connections closed, by reason",
        &["reason"],
    ),
    handshakes: metrics::counter_vec(
        "handshakes_total",
        "Completed handshakes: full or resumed",
        &["kind"],
    ),
    failures: metrics::counter_vec(
        "handshake_failures_total",
        "Failed handshakes, by reason",
        &["reason"],
    ),
    worker_accepted: metrics::counter_vec(
        "worker_connections_accepted_total",
        "Connections accepted, by worker",
        &["worker"],
    ),
    worker_active: metrics::gauge_vec(
        "worker_connections_active",
        "Connections open now, by worker",
        &["worker"],
    ),
    worker_handshakes: metrics::counter_vec(
        "worker_handshakes_total",
        "Completed handshakes, by worker",
        &["worker"],
    ),
    worker_cpu: metrics::seconds_counter_vec(
        "worker_cpu_seconds_total",
        "CPU time of each worker thread (sampled every second)",
        &["worker"],
    ),
    listener_accepted: metrics::counter_vec(
        "listener_connections_accepted_total",
        "Connections accepted, by listening address",
        &["listener"],
    ),
    listener_active: metrics::gauge_vec(
        "listener_connections_active",
        "Connections open now, by listening address",
        &["listener"],
    ),
    listener_handshakes: metrics::counter_vec(
        "listener_handshakes_total",
        "Completed handshakes, by listening address",
        &["listener"],
    ),
    listener_failures: metrics::counter_vec(
        "listener_handshake_failures_total",
        "Failed handshakes, by listening address",
        &["listener"],
    ),
    reloads: metrics::counter_vec(
        "reloads_total",
        "Reloads: applied, or refused with the step that failed",
        &["outcome"],
    ),
});

/// Registers the series of every module the server runs, so that `/metrics` lists them
/// from the start rather than from their first event.
pub fn register_all() {
    LazyLock::force(&METRICS);
    crate::offload::metrics::register();
    crate::proxy::metrics::register();
    crate::quic::metrics::register();
    crate::tls::metrics::register();
}

/// One listener's series, resolved when its state is built (at start and on reload).
pub struct ListenerMetrics {
    accepted: IntCounter,
    active: IntGauge,
    handshakes: IntCounter,
    failures: IntCounter,
}

impl ListenerMetrics {
    pub fn new(address: std::net::SocketAddr) -> ListenerMetrics {
        let m = &*METRICS;
        let label = [address.to_string()];
        ListenerMetrics {
            accepted: m.listener_accepted.with_label_values(&label),
            active: m.listener_active.with_label_values(&label),
            handshakes: m.listener_handshakes.with_label_values(&label),
            failures: m.listener_failures.with_label_values(&label),
        }
    }
}

/// One worker's series, resolved once when the worker starts.
struct WorkerMetrics {
    accepted: IntCounter,
    active: IntGauge,
    handshakes: IntCounter,
    cpu: Counter,
    /// Thread CPU seconds already added to `cpu`.
    cpu_counted: Cell<f64>,
}

thread_local! {
    /// Set on worker threads only.
    static WORKER: OnceCell<WorkerMetrics> = const { OnceCell::new() };
}

/// Called by worker `index` on its own thread before it serves.
pub fn register_worker(index: usize) {
    metrics::set_worker(index);
    let m = &*METRICS;
    let label = [index.to_string()];
    WORKER.with(|worker| {
        let _ = worker.set(WorkerMetrics {
            accepted: m.worker_accepted.with_label_values(&label),
            active: m.worker_active.with_label_values(&label),
            handshakes: m.worker_handshakes.with_label_values(&label),
            cpu: m.worker_cpu.with_label_values(&label),
            cpu_counted: Cell::new(0.0),
        });
    });
}

fn on_worker(record: impl FnOnce(&WorkerMetrics)) {
    WORKER.with(|worker| {
        if let Some(worker) = worker.get() {
            record(worker);
        }
    });
}

/// Adds the CPU time this worker thread used since the last call.
pub fn sample_worker_cpu() {
    if !metrics::enabled() {
        return;
    }
    let Some(seconds) = crate::sys::thread_cpu_seconds() else {
        return;
    };
    on_worker(|w| {
        w.cpu.inc_by((seconds - w.cpu_counted.get()).max(0.0));
        w.cpu_counted.set(seconds);
    });
}

pub fn record_accept(listener: &ListenerMetrics) {
    if !metrics::enabled() {
        return;
    }
    listener.accepted.inc();
    listener.active.inc();
    METRICS.accepted.inc();
    METRICS.active.inc();
    on_worker(|w| {
        w.accepted.inc();
        w.active.inc();
    });
}

pub fn record_connection_end(listener: &ListenerMetrics) {
    if !metrics::enabled() {
        return;
    }
    listener.active.dec();
    METRICS.active.dec();
    on_worker(|w| w.active.dec());
}

pub fn record_handshake(resumed: bool, listener: &ListenerMetrics) {
    if !metrics::enabled() {
        return;
    }
    listener.handshakes.inc();
    let kind = if resumed { "resumed" } else { "full" };
    METRICS.handshakes.with_label_values(&[kind]).inc();
    on_worker(|w| w.handshakes.inc());
}

/// `reason`: the label of the failure's class (`timeout`, `not_tls`, ...).
pub fn record_handshake_failure(reason: &str, listener: &ListenerMetrics) {
    if !metrics::enabled() {
        return;
    }
    listener.failures.inc();
    METRICS.failures.with_label_values(&[reason]).inc();
}

/// A reload applied (`"applied"`) or refused (a `ReloadRefusal` label).
pub fn record_reload(outcome: &str) {
    METRICS.reloads.with_label_values(&[outcome]).inc();
}

pub fn record_close(reason: &str) {
    if !metrics::enabled() {
        return;
    }
    METRICS.closed.with_label_values(&[reason]).inc();
}
