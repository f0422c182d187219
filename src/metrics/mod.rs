//! Process-wide metrics (all workers aggregated), plus a few per worker (`worker_*`, to
//! see how the kernel spreads connections over the cores and how busy each one is) and
//! per listener (`listener_*`, one series per listening address),
//! exposed in the Prometheus text format by the admin listener (`admin.rs`) and rendered
//! by `tlsterm stats`.
//!
//! The histograms split a handshake the way a bpftrace latency trace does: total time, time
//! spent inside BoringSSL (the handshake future's polls), and time waiting on the
//! private-key engine. Label sets are small and fixed; the label lookups of hot counters
//! are resolved once.

pub mod admin;

use std::cell::{Cell, OnceCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{
    exponential_buckets, register_counter_vec_with_registry, register_histogram_vec_with_registry,
    register_histogram_with_registry, register_int_counter_vec_with_registry,
    register_int_counter_with_registry, register_int_gauge_vec_with_registry,
    register_int_gauge_with_registry, Counter, CounterVec, Histogram, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    pub connections_accepted: IntCounter,
    pub connections_active: IntGauge,
    connections_closed: IntCounterVec,
    handshakes: IntCounterVec,
    handshake_failures: IntCounterVec,
    tls_versions: IntCounterVec,
    tls_ciphers: IntCounterVec,
    tls_groups: IntCounterVec,
    tls_alpn: IntCounterVec,
    bytes: IntCounterVec,
    backend_connect_failures: IntCounter,
    ocsp: IntCounterVec,
    ocsp_fetches: IntCounterVec,
    early_data: IntCounterVec,
    certificates_compressed: IntCounterVec,
    ech: IntCounterVec,
    backend_connect_time: Histogram,
    handshake_time: HistogramVec,
    engine_ops: IntCounterVec,
    engine_info: IntGaugeVec,
    engine_errors: IntCounter,
    flushes: IntCounterVec,
    queue_wait: Histogram,
    batch_time: Histogram,
    batch_lanes: Histogram,
    worker_accepted: IntCounterVec,
    worker_active: IntGaugeVec,
    worker_handshakes: IntCounterVec,
    worker_engine_ops: IntCounterVec,
    worker_cpu: CounterVec,
    listener_accepted: IntCounterVec,
    listener_active: IntGaugeVec,
    listener_handshakes: IntCounterVec,
    listener_failures: IntCounterVec,
}

fn latency_buckets() -> Vec<f64> {
    // 1 us .. about 8 s, doubling: the resolution of bpftrace's hist().
    exponential_buckets(1e-6, 2.0, 24).expect("valid buckets")
}

macro_rules! counter_vec {
    ($r:expr, $name:expr, $help:expr, $labels:expr) => {
        register_int_counter_vec_with_registry!($name, $help, $labels, $r).expect("metric")
    };
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let registry = Registry::new_custom(Some("tlsterm".into()), None).expect("registry");
    let r = &registry;
    Metrics {
        connections_accepted: register_int_counter_with_registry!("connections_accepted_total", "Connections accepted", r).expect("metric"),
        connections_active: register_int_gauge_with_registry!("connections_active", "Connections open now", r).expect("metric"),
        connections_closed: counter_vec!(r, "connections_closed_total", "Connections closed, by reason", &["reason"]),
        handshakes: counter_vec!(r, "handshakes_total", "Completed handshakes: full or resumed", &["kind"]),
        handshake_failures: counter_vec!(r, "handshake_failures_total", "Failed handshakes, by reason", &["reason"]),
        tls_versions: counter_vec!(r, "tls_versions_total", "Completed handshakes by TLS version", &["version"]),
        tls_ciphers: counter_vec!(r, "tls_ciphers_total", "Completed handshakes by cipher suite", &["cipher"]),
        tls_groups: counter_vec!(r, "tls_groups_total", "Completed handshakes by key-exchange group (X25519MLKEM768: post-quantum hybrid)", &["group"]),
        tls_alpn: counter_vec!(r, "tls_alpn_total", "Completed handshakes by negotiated ALPN protocol", &["protocol"]),
        bytes: counter_vec!(r, "bytes_total", "Plaintext bytes relayed", &["direction"]),
        backend_connect_failures: register_int_counter_with_registry!("backend_connect_failures_total", "Backend connection attempts that failed", r).expect("metric"),
        backend_connect_time: register_histogram_with_registry!("backend_connect_seconds", "Time to connect to a backend", latency_buckets(), r).expect("metric"),
        ocsp: counter_vec!(
            r,
            "ocsp_responses_total",
            "OCSP responses loaded: stapled, or why not",
            &["result"]
        ),
        ocsp_fetches: counter_vec!(
            r,
            "ocsp_fetches_total",
            "Requests to OCSP responders (ocsp_fetch): ok (an answer came) or failed",
            &["result"]
        ),
        early_data: counter_vec!(
            r,
            "early_data_total",
            "TLS 1.3 ClientHellos offering 0-RTT: accepted, or why refused",
            &["result"]
        ),
        certificates_compressed: counter_vec!(
            r,
            "certificates_compressed_total",
            "Certificate messages sent compressed (RFC 8879), by algorithm",
            &["algorithm"]
        ),
        ech: counter_vec!(
            r,
            "ech_total",
            "ClientHellos on listeners with ech_keys: Encrypted Client Hello accepted, rejected (retry configs sent) or not_offered",
            &["result"]
        ),
        handshake_time: register_histogram_vec_with_registry!(
            "handshake_seconds",
            "Handshake time, split: total (accept to done), tls (inside BoringSSL), engine_wait (signature requested to signature ready)",
            &["phase"],
            latency_buckets(),
            r
        )
        .expect("metric"),
        engine_ops: counter_vec!(r, "engine_operations_total", "Private-key operations by algorithm and path (inline or batch)", &["algorithm", "path"]),
        engine_info: register_int_gauge_vec_with_registry!(
            "engine_info",
            "1 for how RSA signatures are made now: the multi-buffer kernel that signs (none when inline) and whether signatures are batched or inline",
            &["kernel", "signing"],
            r
        )
        .expect("metric"),
        engine_errors: register_int_counter_with_registry!("engine_errors_total", "Engine operations that failed (fault check or refusal) and were redone inline", r).expect("metric"),
        flushes: counter_vec!(r, "engine_flushes_total", "Batches run, by the cause that triggered them", &["cause"]),
        queue_wait: register_histogram_with_registry!("engine_queue_wait_seconds", "Time an operation waited in its worker's queue", latency_buckets(), r).expect("metric"),
        batch_time: register_histogram_with_registry!("engine_batch_seconds", "Compute time of one multi-buffer batch", latency_buckets(), r).expect("metric"),
        batch_lanes: register_histogram_with_registry!(
            "engine_batch_operations",
            "Operations per multi-buffer batch",
            (1..=16).map(f64::from).collect(),
            r
        )
        .expect("metric"),
        worker_accepted: counter_vec!(r, "worker_connections_accepted_total", "Connections accepted, by worker", &["worker"]),
        worker_active: register_int_gauge_vec_with_registry!("worker_connections_active", "Connections open now, by worker", &["worker"], r).expect("metric"),
        worker_handshakes: counter_vec!(r, "worker_handshakes_total", "Completed handshakes, by worker", &["worker"]),
        worker_engine_ops: counter_vec!(r, "worker_engine_operations_total", "Private-key operations (batch and inline), by worker", &["worker"]),
        worker_cpu: register_counter_vec_with_registry!("worker_cpu_seconds_total", "CPU time of each worker thread (sampled every second)", &["worker"], r).expect("metric"),
        listener_accepted: counter_vec!(r, "listener_connections_accepted_total", "Connections accepted, by listening address", &["listener"]),
        listener_active: register_int_gauge_vec_with_registry!("listener_connections_active", "Connections open now, by listening address", &["listener"], r).expect("metric"),
        listener_handshakes: counter_vec!(r, "listener_handshakes_total", "Completed handshakes, by listening address", &["listener"]),
        listener_failures: counter_vec!(r, "listener_handshake_failures_total", "Failed handshakes, by listening address", &["listener"]),
        registry,
    }
});

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
    engine_ops: IntCounter,
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
    let m = &*METRICS;
    let label = [index.to_string()];
    WORKER.with(|worker| {
        let _ = worker.set(WorkerMetrics {
            accepted: m.worker_accepted.with_label_values(&label),
            active: m.worker_active.with_label_values(&label),
            handshakes: m.worker_handshakes.with_label_values(&label),
            engine_ops: m.worker_engine_ops.with_label_values(&label),
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
    if !enabled() {
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

/// Recording switch: off when the admin listener is disabled (nobody could read the
/// metrics). Set once at start, so gauges stay consistent.
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The exposition in the Prometheus text format.
pub fn render() -> String {
    TextEncoder::new()
        .encode_to_string(&METRICS.registry.gather())
        .unwrap_or_default()
}

/// `kind`: the key's kind (`rsa2048`, `ecdsap256`, ...).
pub fn record_inline_op(kind: &str, _elapsed: Duration) {
    if !enabled() {
        return;
    }
    METRICS
        .engine_ops
        .with_label_values(&[kind, "inline"])
        .inc();
    on_worker(|w| w.engine_ops.inc());
}

pub fn record_queue_wait(wait: Duration) {
    if !enabled() {
        return;
    }
    METRICS.queue_wait.observe(wait.as_secs_f64());
}

/// `cause`: why the batch ran (`full`, `all_waiting`, `idle`, `timer`, `small`).
pub fn record_flush(cause: &str, _ops: usize) {
    if !enabled() {
        return;
    }
    METRICS.flushes.with_label_values(&[cause]).inc();
}

pub fn record_batch(kind: &str, ops: usize, elapsed: Duration) {
    if !enabled() {
        return;
    }
    METRICS
        .engine_ops
        .with_label_values(&[kind, "batch"])
        .inc_by(ops as u64);
    on_worker(|w| w.engine_ops.inc_by(ops as u64));
    METRICS.batch_lanes.observe(ops as f64);
    METRICS.batch_time.observe(elapsed.as_secs_f64());
}

/// Publishes which kernel signs and whether signatures are batched (at start and reload).
pub fn set_engine_info(kernel: &str, signing: &str) {
    METRICS.engine_info.reset();
    METRICS
        .engine_info
        .with_label_values(&[kernel, signing])
        .set(1);
}

pub fn record_engine_error() {
    if !enabled() {
        return;
    }
    METRICS.engine_errors.inc();
}

pub fn record_engine_wait(wait: Duration) {
    if !enabled() {
        return;
    }
    METRICS
        .handshake_time
        .with_label_values(&["engine_wait"])
        .observe(wait.as_secs_f64());
}

/// What a completed handshake negotiated.
pub struct HandshakeRecord<'a> {
    pub resumed: bool,
    pub version: &'a str,
    pub cipher: &'a str,
    pub group: Option<&'a str>,
    pub alpn: Option<&'a [u8]>,
    pub total: Duration,
    pub in_tls: Duration,
}

pub fn record_handshake(h: &HandshakeRecord<'_>, listener: &ListenerMetrics) {
    if !enabled() {
        return;
    }
    listener.handshakes.inc();
    let m = &*METRICS;
    m.handshakes
        .with_label_values(&[if h.resumed { "resumed" } else { "full" }])
        .inc();
    on_worker(|w| w.handshakes.inc());
    m.tls_versions.with_label_values(&[h.version]).inc();
    m.tls_ciphers.with_label_values(&[h.cipher]).inc();
    if let Some(group) = h.group {
        m.tls_groups.with_label_values(&[group]).inc();
    }
    let alpn = h.alpn.map(String::from_utf8_lossy);
    m.tls_alpn
        .with_label_values(&[alpn.as_deref().unwrap_or("none")])
        .inc();
    m.handshake_time
        .with_label_values(&["total"])
        .observe(h.total.as_secs_f64());
    m.handshake_time
        .with_label_values(&["tls"])
        .observe(h.in_tls.as_secs_f64());
}

/// `reason`: the label of the failure's class (`timeout`, `not_tls`, ...).
pub fn record_handshake_failure(reason: &str, listener: &ListenerMetrics) {
    if !enabled() {
        return;
    }
    listener.failures.inc();
    METRICS
        .handshake_failures
        .with_label_values(&[reason])
        .inc();
}

pub fn record_close(reason: &str, to_backend: u64, to_client: u64) {
    if !enabled() {
        return;
    }
    let m = &*METRICS;
    m.connections_closed.with_label_values(&[reason]).inc();
    m.bytes
        .with_label_values(&["to_backend"])
        .inc_by(to_backend);
    m.bytes.with_label_values(&["to_client"]).inc_by(to_client);
}

pub fn record_ocsp(result: &str) {
    METRICS.ocsp.with_label_values(&[result]).inc();
}

pub fn record_ocsp_fetch(result: &str) {
    METRICS.ocsp_fetches.with_label_values(&[result]).inc();
}

pub fn record_early_data(result: &str) {
    METRICS.early_data.with_label_values(&[result]).inc();
}

pub fn record_ech(result: &str) {
    METRICS.ech.with_label_values(&[result]).inc();
}

pub fn record_certificate_compressed(algorithm: &str) {
    METRICS
        .certificates_compressed
        .with_label_values(&[algorithm])
        .inc();
}

pub fn record_accept(listener: &ListenerMetrics) {
    if !enabled() {
        return;
    }
    listener.accepted.inc();
    listener.active.inc();
    METRICS.connections_accepted.inc();
    METRICS.connections_active.inc();
    on_worker(|w| {
        w.accepted.inc();
        w.active.inc();
    });
}

pub fn record_connection_end(listener: &ListenerMetrics) {
    if !enabled() {
        return;
    }
    listener.active.dec();
    METRICS.connections_active.dec();
    on_worker(|w| w.active.dec());
}

pub fn record_backend_connect(elapsed: Duration, ok: bool) {
    if !enabled() {
        return;
    }
    if ok {
        METRICS.backend_connect_time.observe(elapsed.as_secs_f64());
    } else {
        METRICS.backend_connect_failures.inc();
    }
}
