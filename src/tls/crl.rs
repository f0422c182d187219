//! Client-certificate trust: the `client_ca` store and its revocation lists (`client_crl`).
//!
//! The `boring` crate has no CRL type, so parsing and adding CRLs to a store go through
//! the wrappers in `sys`. Revocation is checked by BoringSSL's verifier once the store has the CRLs
//! and the CRL_CHECK flag: a revoked certificate fails the handshake like an untrusted one.

use std::path::Path;

use anyhow::Context as _;
use boring::x509::store::{X509Store, X509StoreBuilder, X509StoreBuilderRef};
use boring::x509::verify::X509VerifyFlags;
use boring::x509::X509;

use crate::config::crls::Crls;
use crate::config::{CrlCheck, CrlFile};
use crate::sys::{Crl, CrlValidity};

/// What client certificates are verified against.
#[derive(Clone)]
pub struct ClientTrust {
    pub store: X509Store,
    /// SHA-256 of the CA file, the CRL file and the check mode: it goes into the session ID
    /// context, so that sessions verified against other trust are not resumed (resumption
    /// skips verification).
    pub digest: [u8; 32],
}

impl ClientTrust {
    pub fn load(ca: &Path, crl: Option<&CrlFile>, check: CrlCheck) -> anyhow::Result<ClientTrust> {
        let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
        let cas = X509::stack_from_pem(&pem).context("cannot parse client_ca PEM")?;
        anyhow::ensure!(!cas.is_empty(), "client_ca holds no certificate");
        let mut store = X509StoreBuilder::new()?;
        for ca in &cas {
            store.add_cert(ca)?;
        }
        let mut digest = boring::sha::Sha256::new();
        digest.update(&pem);
        if let Some(crl) = crl {
            let crls = crl.crls()?;
            ClientTrust::install(crls, &mut store, check, crl.path.get_ref())?;
            digest.update(&crls.digest);
            digest.update(&[check as u8]);
        }
        Ok(ClientTrust {
            store: store.build(),
            digest: digest.finish(),
        })
    }
}

/// Revocation checking, with the CRLs read with the configuration.
impl ClientTrust {
    /// Adds the CRLs to `store` and turns revocation checking on; warns about CRLs whose
    /// validity period excludes now when no current CRL of the same issuer is beside them,
    /// since BoringSSL then refuses every client certificate that issuer signed.
    fn install(
        crls: &Crls,
        store: &mut X509StoreBuilderRef,
        check: CrlCheck,
        path: &Path,
    ) -> anyhow::Result<()> {
        let validity: Vec<CrlValidity> = crls.list.iter().map(Crl::validity).collect();
        for (index, crl) in crls.list.iter().enumerate() {
            let replaced = || {
                crls.list.iter().zip(&validity).any(|(other, validity)| {
                    *validity == CrlValidity::Current && other.same_issuer(crl)
                })
            };
            match validity[index] {
                CrlValidity::Current => {}
                _ if replaced() => {}
                CrlValidity::Expired => {
                    tracing::warn!(file = %path.display(), crl = index + 1, "client_crl: CRL has expired (nextUpdate is past) and no current CRL of its issuer is in the file: every client certificate that issuer signed is refused until a fresh CRL is loaded (SIGHUP)")
                }
                CrlValidity::NotYetValid => {
                    tracing::warn!(file = %path.display(), crl = index + 1, "client_crl: CRL is not yet valid (lastUpdate is in the future) and no current CRL of its issuer is in the file: every client certificate that issuer signed is refused")
                }
            }
            crl.add_to(store)
                .context("cannot add the CRL to the store")?;
        }
        store.set_flags(match check {
            CrlCheck::Leaf => X509VerifyFlags::CRL_CHECK,
            CrlCheck::Chain => X509VerifyFlags::CRL_CHECK | X509VerifyFlags::CRL_CHECK_ALL,
        });
        Ok(())
    }
}
