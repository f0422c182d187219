//! The listener's protocol settings on a BoringSSL context: versions, suites, groups,
//! early data, ALPN, client certificates.

use std::sync::Arc;

use anyhow::Context as _;
use boring::ssl::{AlpnError, SslContextBuilder, SslVersion};
use boring::x509::X509Name;

use super::failure;
use super::profile::{select_alpn, verify_mode, Profiles};
use super::tls13::Tls13Order;
use crate::config::{ListenerConfig, TlsVersion};

pub(super) fn ssl_version(version: TlsVersion) -> SslVersion {
    match version {
        TlsVersion::Tls12 => SslVersion::TLS1_2,
        TlsVersion::Tls13 => SslVersion::TLS1_3,
    }
}

/// Applies the listener's protocol settings; every context of a listener gets them, because
/// switching context on SNI also switches callbacks such as ALPN selection.
pub(super) fn configure(
    builder: &mut SslContextBuilder,
    listener: &ListenerConfig,
    profiles: &Arc<Profiles>,
) -> anyhow::Result<()> {
    builder.set_min_proto_version(Some(ssl_version(listener.min_version)))?;
    builder.set_max_proto_version(Some(ssl_version(listener.max_version)))?;
    builder
        .set_strict_cipher_list(listener.ciphers.get_ref())
        .with_context(|| format!("invalid cipher list `{}`", listener.ciphers.get_ref()))?;
    let groups: Vec<&str> = listener
        .groups
        .get_ref()
        .iter()
        .filter_map(|g| crate::config::group_name(g))
        .collect();
    builder.set_curves_list(&groups.join(":"))?;
    Tls13Order::parse(listener.tls13_ciphers.get_ref())?.apply_to_context(builder)?;
    builder.set_session_id_context(b"tlsterm")?;
    failure::record_failures(builder);
    if *listener.early_data.get_ref() {
        crate::sys::enable_early_data(builder);
    }
    if profiles.list.iter().any(|p| !p.alpn.is_empty()) {
        let profiles = profiles.clone();
        builder.set_alpn_select_callback(move |ssl, client| {
            select_alpn(&profiles.for_ssl(ssl).alpn, client).ok_or(AlpnError::NOACK)
        });
    }
    if let (Some(ca), Some(client)) = (&listener.client_ca, &profiles.client_store) {
        builder.set_verify_cert_store(client.store.clone())?;
        // The CA names sent in CertificateRequest, so clients pick the right certificate.
        builder.set_client_ca_list(X509Name::load_client_ca_file(ca.get_ref())?);
        builder.set_verify(verify_mode(listener.client_auth));
    }
    Ok(())
}
