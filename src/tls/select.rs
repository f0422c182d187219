//! Choosing a certificate for a ClientHello: its SNI name, then ECDSA when the client can
//! verify it, RSA otherwise; the OCSP staple that goes with it.

use std::sync::Arc;

use boring::nid::Nid;
use boring::ssl::{ClientHello, ExtensionType, NameType, SslContext};
use boring::x509::X509;

use super::names::{is_host_name, NameTable};
use super::{ocsp, ocsp_fetch};
use crate::config::UnknownSni;
use crate::offload::KeyKind;

/// One certificate's context, ready to be switched to.
pub(super) struct CertContext {
    pub(super) ctx: SslContext,
    pub(super) kind: KeyKind,
    /// The TLS 1.2 ECDHE-ECDSA suites its context enables (`ecdsa_suites`), read once when
    /// it is built rather than at every ClientHello.
    pub(super) ecdsa_suites: Vec<u16>,
    pub(super) fetched_ocsp: Option<Arc<ocsp_fetch::Slot>>,
    pub(super) file_ocsp: Option<FileStaple>,
}

/// An OCSP response from a file that passed its checks at load: stapled per connection
/// until its nextUpdate (then no more, until a reload brings a fresh file).
pub(super) struct FileStaple {
    pub(super) der: Vec<u8>,
    pub(super) expires: Option<std::time::SystemTime>,
}

/// Maps SNI names to certificate contexts.
pub(super) struct CertSelector {
    pub(super) certs: Vec<CertContext>,
    pub(super) names: NameTable<Vec<usize>>,
    pub(super) default: Vec<usize>,
    pub(super) tls13_enabled: bool,
    pub(super) unknown_sni: UnknownSni,
    /// Refuse an SNI that is not a host name (`is_host_name`): set where a server name
    /// has a client-certificate policy of its own.
    pub(super) host_names_only: bool,
}

impl CertSelector {
    /// The certificates for `sni`; `None` when the name is unknown and refused.
    pub(super) fn candidates(&self, sni: Option<&str>) -> Option<&[usize]> {
        let Some(sni) = sni else {
            return Some(&self.default);
        };
        if self.host_names_only && !is_host_name(sni) {
            return None;
        }
        match (self.names.lookup(sni), self.unknown_sni) {
            (Some(found), _) => Some(found),
            (None, UnknownSni::Default) => Some(&self.default),
            (None, UnknownSni::Refuse) => None,
        }
    }

    /// Picks ECDSA among the candidates when the client can verify it, else RSA.
    pub(super) fn select(&self, hello: &ClientHello<'_>) -> Option<&CertContext> {
        let candidates = self.candidates(hello.servername(NameType::HOST_NAME))?;
        let ecdsa = candidates.iter().map(|&i| &self.certs[i]).find(|cert| {
            matches!(cert.kind, KeyKind::Ecdsa { curve } if client_accepts_ecdsa(hello, curve, self.tls13_enabled, &cert.ecdsa_suites))
        });
        let rsa = candidates
            .iter()
            .map(|&i| &self.certs[i])
            .find(|cert| matches!(cert.kind, KeyKind::Rsa { .. }));
        Some(ecdsa.or(rsa).unwrap_or(&self.certs[candidates[0]]))
    }
}

/// Reads a list of big-endian u16 values behind a length prefix of `prefix` bytes.
pub(super) fn u16_list(data: &[u8], prefix: usize) -> impl Iterator<Item = u16> + '_ {
    data.get(prefix..)
        .unwrap_or_default()
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
}

/// The TLS 1.2 cipher suites `ctx` enables that an ECDSA certificate can serve.
pub(super) fn ecdsa_suites(ctx: &SslContext) -> Vec<u16> {
    ctx.ciphers()
        .into_iter()
        .flatten()
        .filter(|cipher| {
            cipher
                .standard_name()
                .is_some_and(|name| name.contains("_ECDSA_"))
        })
        .map(|cipher| cipher.protocol_id())
        .collect()
}

/// Whether the client can verify an ECDSA signature made with a key on `curve`, and a
/// handshake with it can be made with a certificate whose context enables `ecdsa_suites`
/// for TLS 1.2.
pub(super) fn client_accepts_ecdsa(
    hello: &ClientHello<'_>,
    curve: Nid,
    tls13_enabled: bool,
    ecdsa_suites: &[u16],
) -> bool {
    const TLS13: u16 = 0x0304;
    // TLS 1.3 binds curve and hash: ecdsa_secp256r1_sha256 / ecdsa_secp384r1_sha384.
    let scheme = if curve == Nid::SECP384R1 {
        0x0503
    } else {
        0x0403
    };
    let Some(sigalgs) = hello.get_extension(ExtensionType::SIGNATURE_ALGORITHMS) else {
        return false;
    };
    if !u16_list(sigalgs, 2).any(|s| s == scheme) {
        return false;
    }
    let offers_tls13 = hello
        .get_extension(ExtensionType::SUPPORTED_VERSIONS)
        .is_some_and(|versions| u16_list(versions, 1).any(|v| v == TLS13));
    if offers_tls13 && tls13_enabled {
        return true;
    }
    // In TLS 1.2 the cipher suite names the certificate type (ECDHE-ECDSA-*): one the client
    // offers and this listener enables. And the key's curve must be among the client's
    // supported groups, or BoringSSL will not sign with it (an RSA certificate would do).
    let offers_ecdsa_suite = u16_list(hello.ciphers(), 0).any(|c| ecdsa_suites.contains(&c));
    let group = if curve == Nid::SECP384R1 {
        0x0018
    } else {
        0x0017
    };
    let offers_group = hello
        .get_extension(ExtensionType::SUPPORTED_GROUPS)
        .is_some_and(|groups| u16_list(groups, 2).any(|g| g == group));
    offers_ecdsa_suite && offers_group
}

/// The file response to staple, if it checks out (logged and counted either way). The
/// issuer, when the chain has it next to the leaf, checks the response's signature.
pub(super) fn file_staple(response: &[u8], chain: &[X509], names: &[String]) -> Option<FileStaple> {
    let leaf = &chain[0];
    let issuer = chain
        .get(1)
        .filter(|issuer| issuer.issued(leaf).is_ok())
        .map(|issuer| &**issuer);
    match ocsp::validity(response, leaf, issuer, std::time::SystemTime::now()) {
        Ok(validity) => {
            super::metrics::record_ocsp("stapled");
            Some(FileStaple {
                der: response.to_vec(),
                expires: validity.next_update,
            })
        }
        Err(problem) => {
            tracing::warn!(certificate = ?names, problem = problem.label(), "OCSP response not stapled");
            super::metrics::record_ocsp(problem.label());
            None
        }
    }
}
