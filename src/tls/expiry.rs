//! `tlsterm_certificate_expiry_seconds{name}`: when the certificate served for each name
//! expires (the earliest, where a name has an RSA and an ECDSA certificate), for file and
//! ACME certificates alike, so an alert can fire before clients see an expired one.

use std::sync::LazyLock;

use prometheus::{register_int_gauge_vec_with_registry, IntGaugeVec};

use super::CertifiedKey;

static EXPIRY: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec_with_registry!(
        "certificate_expiry_seconds",
        "Unix time at which the certificate served for the name expires (the earliest of its certificates)",
        &["name"],
        crate::metrics::registry()
    )
    .expect("metric")
});

/// Seconds since the Unix epoch of the leaf's notAfter.
pub fn not_after_unix(cert: &CertifiedKey) -> Option<i64> {
    let leaf = cert.chain.first()?;
    let epoch = boring::asn1::Asn1Time::from_unix(0).ok()?;
    let diff = epoch.diff(leaf.not_after()).ok()?;
    Some(i64::from(diff.days) * 86_400 + i64::from(diff.secs))
}

/// Replaces the whole gauge with the names of `certs` (a removed name disappears).
pub fn publish<'a>(certs: impl IntoIterator<Item = &'a CertifiedKey>) {
    let mut earliest: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for cert in certs {
        let Some(expires) = not_after_unix(cert) else {
            continue;
        };
        for name in &cert.names {
            let entry = earliest.entry(name.as_str()).or_insert(expires);
            *entry = (*entry).min(expires);
        }
    }
    EXPIRY.reset();
    for (name, expires) in earliest {
        EXPIRY.with_label_values(&[name]).set(expires);
    }
}
