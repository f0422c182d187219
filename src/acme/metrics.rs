//! ACME's series: orders by result, certificates installed by source, and each
//! certificate's next renewal time.

use std::sync::LazyLock;
use std::time::SystemTime;

use prometheus::{
    register_int_counter_vec_with_registry, register_int_gauge_vec_with_registry, IntCounterVec,
    IntGaugeVec,
};

use crate::config::AcmeCertificate;

struct Series {
    orders: IntCounterVec,
    installed: IntCounterVec,
    next_renewal: IntGaugeVec,
    http_refused: IntCounterVec,
}

static SERIES: LazyLock<Series> = LazyLock::new(|| {
    let r = crate::metrics::registry();
    Series {
        orders: register_int_counter_vec_with_registry!(
            "acme_orders_total",
            "ACME orders, by result: issued, failed",
            &["result"],
            r
        )
        .expect("metric"),
        installed: register_int_counter_vec_with_registry!(
            "acme_certificates_installed_total",
            "ACME certificates put into service, by where they came from: storage (at start), order, fleet (ordered by another process, through Redis)",
            &["source"],
            r
        )
        .expect("metric"),
        next_renewal: register_int_gauge_vec_with_registry!(
            "acme_next_renewal_seconds",
            "Unix time at which the certificate is next renewed",
            &["name", "key_type"],
            r
        )
        .expect("metric"),
        http_refused: register_int_counter_vec_with_registry!(
            "acme_http_connections_refused_total",
            "Connections to the plain-HTTP listener (acme.http_address) closed at once, by reason: per_address (the client's address had as many open as it may)",
            &["reason"],
            r
        )
        .expect("metric"),
    }
});

pub fn order(result: &str) {
    SERIES.orders.with_label_values(&[result]).inc();
}

pub fn http_refused(reason: &str) {
    SERIES.http_refused.with_label_values(&[reason]).inc();
}

pub fn installed(source: &str) {
    SERIES.installed.with_label_values(&[source]).inc();
}

pub fn next_renewal(cert: &AcmeCertificate, at: SystemTime) {
    let unix = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    SERIES
        .next_renewal
        .with_label_values(&[cert.names[0].as_str(), cert.key_type.label()])
        .set(unix);
}

/// A certificate no longer managed has no next renewal.
pub fn forget(cert: &AcmeCertificate) {
    let _ = SERIES
        .next_renewal
        .remove_label_values(&[cert.names[0].as_str(), cert.key_type.label()]);
}
