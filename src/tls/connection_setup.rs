//! What the certificate-selection callback does to a connection once its ClientHello is
//! read and the 0-RTT anti-replay verdict is known: the certificate's context, its OCSP
//! staple, the 0-RTT refusal and the per-name settings (session context, minimum version,
//! client-certificate verification and the CA names sent).
//!
//! Each step is a method of its own, applied in the order BoringSSL needs: switching the
//! context resets what the context carries (the staple, early data), and BoringSSL fixes
//! the version range and the client-certificate request only after this callback.

use std::sync::Arc;

use boring::ssl::{ClientHello, ExtensionType, NameType, SelectCertError, SslRef};

use super::ech::{ech_outcome, ECH_OFFERED};
use super::profile::Profiles;
use super::select::{CertContext, CertSelector};
use super::tls13::{client_prefers_chacha, Tls13Order};
use super::{acme_challenge, key_share_hint, ocsp};
use crate::offload::key_share::ServerShare;
use crate::offload::KeySharePath;

/// What a ClientHello asks for that the setup follows, read once from the hello.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct HelloFacts {
    /// Lists ChaCha20-Poly1305 first among its TLS 1.3 suites.
    pub(super) prefers_chacha: bool,
    /// Sends the `status_request` extension: it wants an OCSP staple.
    pub(super) wants_ocsp: bool,
    /// Sends the `encrypted_client_hello` extension.
    pub(super) offers_ech: bool,
}

impl HelloFacts {
    pub(super) fn read(hello: &ClientHello<'_>) -> HelloFacts {
        HelloFacts {
            prefers_chacha: client_prefers_chacha(hello),
            wants_ocsp: hello.get_extension(ExtensionType::STATUS_REQUEST).is_some(),
            offers_ech: hello
                .get_extension(ExtensionType::ENCRYPTED_CLIENT_HELLO)
                .is_some(),
        }
    }
}

/// The listener's certificate choice and per-name settings, applied to each connection by
/// the certificate-selection callback (see [`ConnectionSetup::finish`]).
pub(super) struct ConnectionSetup {
    pub(super) selector: CertSelector,
    pub(super) profiles: Arc<Profiles>,
    /// The TLS 1.3 suite order for a client that prefers ChaCha20 (`tls13_ciphers` with a
    /// client's-choice entry); `None`: the listener's order for every client.
    pub(super) chacha_first: Option<Tls13Order>,
    /// Whether the listener has ECH keys (then each connection's ECH outcome is counted).
    pub(super) has_ech_keys: bool,
}

impl ConnectionSetup {
    /// Whether the certificate selection will refuse this ClientHello: an unknown name
    /// where the listener refuses them, or a name that is not a host name where names
    /// have client policies of their own. The callback asks first, so that a refused
    /// handshake fails before any work is started for it (its key share, the 0-RTT
    /// check). A TLS-ALPN-01 ClientHello is judged by its answer, in `finish`.
    pub(super) fn refuses(&self, hello: &ClientHello<'_>) -> bool {
        !acme_challenge::offered(hello)
            && self
                .selector
                .candidates(hello.servername(NameType::HOST_NAME))
                .is_none()
    }

    /// Finishes the ClientHello: the key share computed ahead (if any), then either the
    /// ACME challenge certificate or the chosen certificate with every setting of its name.
    /// An error fails the handshake.
    pub(super) fn finish(
        &self,
        hello: &mut ClientHello<'_>,
        early_data_refused: bool,
        key_share: Option<(ServerShare, KeySharePath)>,
    ) -> Result<(), SelectCertError> {
        if let Some((share, path)) = key_share {
            // Before anything that may fail: the hint only replaces BoringSSL's own
            // computation of the same share.
            key_share_hint::apply(hello.ssl_mut(), &share, path);
        }
        if acme_challenge::offered(hello) {
            // An ACME CA validating a name: the challenge certificate or nothing.
            let answer = acme_challenge::context_for(hello.servername(NameType::HOST_NAME))
                .ok_or(SelectCertError::ERROR)?;
            return hello
                .ssl_mut()
                .set_ssl_context(&answer)
                .map_err(|_| SelectCertError::ERROR);
        }
        let chosen = self.selector.select(hello).ok_or(SelectCertError::ERROR)?;
        let facts = HelloFacts::read(hello);
        let ssl = hello.ssl_mut();
        self.note_ech(ssl, facts);
        self.order_tls13_suites(ssl, facts)?;
        switch_to_certificate(ssl, chosen, facts.wants_ocsp, early_data_refused)?;
        self.apply_name_settings(ssl)
    }

    /// Marks a connection that offered ECH and counts the outcome: here, as a client whose
    /// ECH was refused may abort after the handshake.
    pub(super) fn note_ech(&self, ssl: &mut SslRef, facts: HelloFacts) {
        if facts.offers_ech {
            ssl.set_ex_data(*ECH_OFFERED, true);
        }
        if self.has_ech_keys {
            super::metrics::record_ech(ech_outcome(ssl));
        }
    }

    /// Puts ChaCha20 first for a client that prefers it, where the listener lets the
    /// client choose.
    pub(super) fn order_tls13_suites(
        &self,
        ssl: &mut SslRef,
        facts: HelloFacts,
    ) -> Result<(), SelectCertError> {
        match (facts.prefers_chacha, &self.chacha_first) {
            (true, Some(order)) if !order.apply_to_connection(ssl) => Err(SelectCertError::ERROR),
            _ => Ok(()),
        }
    }

    /// The settings of the connection's `[[listener.server_name]]` (by its SNI): session
    /// context, minimum version, client-certificate verification and the CA names sent.
    /// BoringSSL fixes the version range and the client-certificate request after the
    /// certificate-selection callback, so per-name settings still apply here.
    pub(super) fn apply_name_settings(&self, ssl: &mut SslRef) -> Result<(), SelectCertError> {
        let profile = self.profiles.for_ssl(ssl);
        if !crate::sys::set_connection_session_id_context(ssl, &profile.sid_ctx) {
            return Err(SelectCertError::ERROR);
        }
        if let Some(min) = profile.min_version {
            ssl.set_min_proto_version(Some(min))
                .map_err(|_| SelectCertError::ERROR)?;
        }
        if let Some((mode, store)) = &profile.verify {
            ssl.set_verify(*mode);
            if let Some(client) = store {
                ssl.set_verify_cert_store(client.store.clone())
                    .map_err(|_| SelectCertError::ERROR)?;
            }
        }
        // The store above decides what is accepted; the names tell the client which
        // certificate to send, so they follow the same CAs.
        if let Some(names) = &profile.ca_names {
            names.apply(ssl).map_err(|_| SelectCertError::ERROR)?;
        }
        Ok(())
    }
}

/// Switches the connection to the chosen certificate's context, then staples its OCSP
/// response (when the client asked) and refuses 0-RTT (when the anti-replay check did):
/// both after the switch, which resets them from the new context.
pub(super) fn switch_to_certificate(
    ssl: &mut SslRef,
    chosen: &CertContext,
    wants_ocsp: bool,
    early_data_refused: bool,
) -> Result<(), SelectCertError> {
    ssl.set_ssl_context(&chosen.ctx)
        .map_err(|_| SelectCertError::ERROR)?;
    if wants_ocsp {
        staple_ocsp(ssl, chosen);
    }
    if early_data_refused {
        crate::sys::disable_early_data(ssl);
    }
    Ok(())
}

/// Staples the certificate's OCSP response: the fetched one, else the file's until it
/// expires; nothing when it has neither.
pub(super) fn staple_ocsp(ssl: &mut SslRef, chosen: &CertContext) {
    if let Some(slot) = &chosen.fetched_ocsp {
        slot.staple(ssl);
    } else if let Some(file) = &chosen.file_ocsp {
        ocsp::staple_until(ssl, &file.der, file.expires);
    }
}

#[cfg(test)]
mod tests;
