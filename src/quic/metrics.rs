//! HTTP/3's series: QUIC connections, handshakes, request streams, the packets the
//! endpoint dropped and why, Retries and refused tokens, stateless resets, clients that
//! moved to another address, the answers made for backends that failed, and how many
//! datagrams each UDP send carried.

use std::sync::LazyLock;

use prometheus::{IntCounter, IntCounterVec, IntGauge};

use super::token::Refused;
use crate::metrics;

struct QuicMetrics {
    connections: IntCounter,
    open: IntGauge,
    handshakes: IntCounterVec,
    handshake_failures: IntCounter,
    streams: IntCounter,
    dropped: IntCounterVec,
    backend_errors: IntCounterVec,
    retries: IntCounter,
    tokens_refused: IntCounterVec,
    handshaking: IntGauge,
    resets: IntCounter,
    migrations: IntCounter,
    early_requests: IntCounter,
    datagrams_sent: IntCounter,
    udp_sends: IntCounter,
    datagrams_received: IntCounter,
    udp_receives: IntCounter,
}

static METRICS: LazyLock<QuicMetrics> = LazyLock::new(|| {
    QuicMetrics {
    connections: metrics::counter(
        "quic_connections_total",
        "QUIC connections accepted (a client's first Initial packet)",
    ),
    open: metrics::gauge("quic_connections", "QUIC connections open now"),
    handshakes: metrics::counter_vec(
        "quic_handshakes_total",
        "QUIC handshakes completed: full, resumed (a ticket), early_data (resumed with 0-RTT accepted)",
        &["kind"],
    ),
    handshake_failures: metrics::counter(
        "quic_handshake_failures_total",
        "QUIC connections closed before their handshake completed",
    ),
    streams: metrics::counter("quic_streams_total", "HTTP/3 requests received"),
    dropped: metrics::counter_vec(
        "quic_packets_dropped_total",
        "UDP datagrams the QUIC endpoint dropped before any connection read them, by reason",
        &["reason"],
    ),
    backend_errors: metrics::counter_vec(
        "quic_backend_errors_total",
        "HTTP/3 requests answered by tlsterm because the backend failed: 502 (unreachable, broken answer) or 504 (no answer in quic_backend_timeout)",
        &["status"],
    ),
    retries: metrics::counter(
        "quic_retries_total",
        "Stateless Retry packets sent: new QUIC connections asked to prove their address first",
    ),
    tokens_refused: metrics::counter_vec(
        "quic_tokens_refused_total",
        "Initial packets dropped for their address-validation token: invalid (forged, altered, for another address) or expired",
        &["reason"],
    ),
    handshaking: metrics::gauge(
        "quic_handshakes_in_progress",
        "QUIC connections whose first packet came and whose handshake has not completed, all workers together (quic_retry = \"auto\" compares each worker's own count with quic_retry_threshold)",
    ),
    resets: metrics::counter(
        "quic_stateless_resets_total",
        "Stateless resets sent: answers to short-header packets for a connection ID this process issued to a connection it no longer has",
    ),
    early_requests: metrics::counter(
        "quic_early_data_requests_total",
        "HTTP/3 requests received in 0-RTT data (sent to the backend with Early-Data: 1; one with a body only once the handshake is confirmed)",
    ),
    datagrams_sent: metrics::counter(
        "quic_datagrams_sent_total",
        "UDP datagrams sent by QUIC connections",
    ),
    udp_sends: metrics::counter(
        "quic_udp_sends_total",
        "System calls that sent QUIC connections' datagrams: fewer than the datagrams where the kernel segments them (GSO)",
    ),
    datagrams_received: metrics::counter(
        "quic_datagrams_received_total",
        "UDP datagrams the QUIC endpoint received",
    ),
    udp_receives: metrics::counter(
        "quic_udp_receives_total",
        "System calls that received the QUIC endpoint's datagrams: fewer than the datagrams when several wait (one call reads up to 16 senders' messages) or the kernel coalesced them (GRO)",
    ),
    migrations: metrics::counter(
        "quic_migrations_total",
        "QUIC connections whose client moved to another address (a new port after NAT rebinding, another network), once the new path was validated",
    ),
}
});

/// Registers the series, so that they are exported from the start.
pub fn register() {
    LazyLock::force(&METRICS);
    // Both reasons at zero from the start: an alert on an increase sees the first one.
    for reason in [Refused::Invalid, Refused::Expired] {
        METRICS
            .tokens_refused
            .with_label_values(&[refused_label(reason)]);
    }
}

/// Why the endpoint dropped a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dropped {
    /// Not a QUIC packet header.
    BadHeader,
    /// A short-header or non-Initial packet for no connection of this worker.
    UnknownConnection,
    /// A new connection beyond `quic_max_connections`.
    MaxConnections,
    /// A new connection while the listener drains or no longer serves QUIC.
    NotAccepting,
    /// The connection's task is behind by a whole queue of datagrams.
    QueueFull,
    /// quiche refused to make a connection of the Initial (TLS setup).
    AcceptFailed,
    /// An Initial packet in a datagram under 1200 bytes (RFC 9000, 14.1).
    ShortInitial,
}

impl Dropped {
    fn label(self) -> &'static str {
        match self {
            Dropped::BadHeader => "bad_header",
            Dropped::UnknownConnection => "unknown_connection",
            Dropped::MaxConnections => "max_connections",
            Dropped::NotAccepting => "not_accepting",
            Dropped::QueueFull => "queue_full",
            Dropped::AcceptFailed => "accept_failed",
            Dropped::ShortInitial => "short_initial",
        }
    }
}

// Connection counts are kept whether or not hot-path series are recorded: the gauge must
// stay balanced.

pub(super) fn connection_opened() {
    METRICS.connections.inc();
    METRICS.open.inc();
}

pub(super) fn connection_closed(established: bool) {
    METRICS.open.dec();
    if !established {
        METRICS.handshake_failures.inc();
    }
}

/// A connection's handshake started (`true`) or ended, completed or not (`false`).
pub(super) fn handshaking(started: bool) {
    match started {
        true => METRICS.handshaking.inc(),
        false => METRICS.handshaking.dec(),
    }
}

/// A completed handshake: `early_data` when it was resumed with 0-RTT accepted.
pub(super) fn record_handshake(resumed: bool, early_data: bool) {
    if metrics::enabled() {
        let kind = match (resumed, early_data) {
            (true, true) => "early_data",
            (true, false) => "resumed",
            (false, _) => "full",
        };
        METRICS.handshakes.with_label_values(&[kind]).inc();
    }
}

pub(super) fn record_stream() {
    if metrics::enabled() {
        METRICS.streams.inc();
    }
}

pub(super) fn record_dropped(why: Dropped) {
    if metrics::enabled() {
        METRICS.dropped.with_label_values(&[why.label()]).inc();
    }
}

pub(super) fn record_backend_error(status: u16) {
    if metrics::enabled() {
        METRICS
            .backend_errors
            .with_label_values(&[&status.to_string()])
            .inc();
    }
}

pub(super) fn record_retry() {
    if metrics::enabled() {
        METRICS.retries.inc();
    }
}

pub(super) fn record_stateless_reset() {
    if metrics::enabled() {
        METRICS.resets.inc();
    }
}

pub(super) fn record_early_request() {
    if metrics::enabled() {
        METRICS.early_requests.inc();
    }
}

pub(super) fn record_migration() {
    if metrics::enabled() {
        METRICS.migrations.inc();
    }
}

/// One UDP send of `datagrams` datagrams.
pub(super) fn record_send(datagrams: usize) {
    if metrics::enabled() {
        METRICS.udp_sends.inc();
        METRICS.datagrams_sent.inc_by(datagrams as u64);
    }
}

pub(super) fn record_receive(datagrams: usize) {
    if metrics::enabled() {
        METRICS.udp_receives.inc();
        METRICS.datagrams_received.inc_by(datagrams as u64);
    }
}

fn refused_label(why: Refused) -> &'static str {
    match why {
        Refused::Invalid => "invalid",
        Refused::Expired => "expired",
    }
}

pub(super) fn record_token_refused(why: Refused) {
    if metrics::enabled() {
        METRICS
            .tokens_refused
            .with_label_values(&[refused_label(why)])
            .inc();
    }
}
