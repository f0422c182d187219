//! Certificates as loaded from PEM files or generated: the chain, its signing key, the
//! names it serves (checked against its SAN).

use std::sync::Arc;

use anyhow::Context as _;
use boring::nid::Nid;
use boring::pkey::PKey;
use boring::x509::X509;

use super::{ocsp_fetch, selfsigned};
use crate::offload::SigningKey;

/// A certificate chain with its key, as loaded from PEM files or generated.
#[derive(Clone)]
pub struct CertifiedKey {
    pub chain: Vec<X509>,
    pub key: Arc<SigningKey>,
    /// Lower-case SNI names, possibly "*.suffix".
    pub names: Vec<String>,
    pub default: bool,
    /// A DER OCSP response to staple, if configured.
    pub ocsp: Option<Vec<u8>>,
    /// Set with `ocsp_fetch`: the response fetched in the background, stapled per
    /// connection (`ocsp`, if any, is only its starting value).
    pub ocsp_fetch: Option<Arc<ocsp_fetch::Slot>>,
}

impl CertifiedKey {
    pub fn from_pem(
        cert_pem: &[u8],
        key_pem: &[u8],
        names: &[String],
        default: bool,
    ) -> anyhow::Result<CertifiedKey> {
        let chain = X509::stack_from_pem(cert_pem).context("cannot parse certificate PEM")?;
        let leaf = chain.first().context("no certificate in the PEM file")?;
        let pkey = PKey::private_key_from_pem(key_pem).context("cannot parse private key PEM")?;
        anyhow::ensure!(
            leaf.public_key()?.public_eq(&pkey),
            "the private key does not match the certificate"
        );
        let names = if names.is_empty() {
            certificate_names(leaf)
        } else {
            let covered = certificate_names(leaf);
            let names: Vec<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
            // Served anyway (the operator may know better), but clients will reject it.
            for name in names.iter().filter(|n| !name_covered(n, &covered)) {
                tracing::warn!(name = %name, certificate = ?covered, "configured name is not in the certificate: clients that check it will refuse the connection");
            }
            names
        };
        Ok(CertifiedKey {
            key: Arc::new(SigningKey::new(pkey)?),
            chain,
            names,
            default,
            ocsp: None,
            ocsp_fetch: None,
        })
    }

    /// The embedded default: an RSA-2048 and an ECDSA P-256 certificate for localhost.
    pub fn self_signed_pair() -> anyhow::Result<Vec<CertifiedKey>> {
        use selfsigned::SelfSignedKey::{EcdsaP256, Rsa2048};
        [Rsa2048, EcdsaP256]
            .into_iter()
            .map(|kind| {
                let (cert, pkey) = selfsigned::generate(kind)?;
                Ok(CertifiedKey {
                    names: certificate_names(&cert),
                    chain: vec![cert],
                    key: Arc::new(SigningKey::new(pkey)?),
                    default: true,
                    ocsp: None,
                    ocsp_fetch: None,
                })
            })
            .collect()
    }
}

/// Whether a certificate for `covered` names (possibly "*.suffix") is valid for `name`.
pub(super) fn name_covered(name: &str, covered: &[String]) -> bool {
    covered.iter().any(|c| {
        c == name
            || c.strip_prefix("*.").is_some_and(|suffix| {
                name.split_once('.')
                    .is_some_and(|(label, parent)| parent == suffix && label != "*")
            })
    })
}

/// DNS names of the certificate's SAN, or its common name when it has none.
pub(super) fn certificate_names(cert: &X509) -> Vec<String> {
    let mut names: Vec<String> = cert
        .subject_alt_names()
        .map(|sans| {
            sans.iter()
                .filter_map(|name| name.dnsname().map(|n| n.to_ascii_lowercase()))
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        if let Some(cn) = cert.subject_name().entries_by_nid(Nid::COMMONNAME).next() {
            if let Ok(cn) = cn.data().as_utf8() {
                names.push(cn.to_string().to_ascii_lowercase());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn configured_names_are_checked_against_the_certificate() {
        let covered = ["a.test".to_string(), "*.w.test".to_string()];
        assert!(name_covered("a.test", &covered));
        assert!(name_covered("x.w.test", &covered));
        assert!(name_covered("*.w.test", &covered));
        assert!(!name_covered("w.test", &covered));
        assert!(!name_covered("y.x.w.test", &covered));
        assert!(!name_covered("b.test", &covered));
    }
}
