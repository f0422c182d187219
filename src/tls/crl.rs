//! Client-certificate trust: the `client_ca` store and its revocation lists (`client_crl`).
//!
//! The `boring` crate has no CRL type, so parsing and adding CRLs to a store go through
//! `boring_sys`. Revocation is checked by BoringSSL's verifier once the store has the CRLs
//! and the CRL_CHECK flag: a revoked certificate fails the handshake like an untrusted one.

use std::path::Path;
use std::ptr::{self, NonNull};

use anyhow::Context as _;
use boring::error::ErrorStack;
use boring::x509::store::{X509Store, X509StoreBuilder, X509StoreBuilderRef};
use boring::x509::verify::X509VerifyFlags;
use boring::x509::X509;
use foreign_types::ForeignTypeRef;

use crate::config::{CrlCheck, CrlFile};

/// What client certificates are verified against.
#[derive(Clone)]
pub struct ClientStore {
    pub store: X509Store,
    /// SHA-256 of the CA file, the CRL file and the check mode: it goes into the session ID
    /// context, so that sessions verified against other trust are not resumed (resumption
    /// skips verification).
    pub digest: [u8; 32],
}

impl ClientStore {
    pub fn load(ca: &Path, crl: Option<&CrlFile>, check: CrlCheck) -> anyhow::Result<ClientStore> {
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
            crls.install(&mut store, check, crl.path.get_ref())?;
            digest.update(&crls.digest);
            digest.update(&[check as u8]);
        }
        Ok(ClientStore {
            store: store.build(),
            digest: digest.finish(),
        })
    }
}

/// One parsed CRL; we hold one reference and free it on drop.
#[derive(Debug)]
struct Crl(NonNull<boring_sys::X509_CRL>);

// SAFETY: BoringSSL computes a CRL's cached extension data while decoding it, and its
// one later change (sorting the revoked entries on first lookup) takes BoringSSL's own
// lock (g_crl_sort_lock in x_crl.cc, checked in boring-sys 5.4); its reference count is
// atomic. So reading it and adding it to stores is safe from
// any thread, which is how verifications on every worker share the CRLs of a store.
unsafe impl Send for Crl {}
// SAFETY: as for Send: shared access only reads.
unsafe impl Sync for Crl {}

impl Drop for Crl {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful parse and this is its only owner; a
        // store that was given the CRL holds its own reference.
        unsafe { boring_sys::X509_CRL_free(self.0.as_ptr()) }
    }
}

/// The CRLs of one `client_crl` file.
#[derive(Debug)]
pub struct Crls {
    list: Vec<Crl>,
    /// SHA-256 of the file: a changed file must change the session ID context, so that
    /// sessions whose certificates may now be revoked are not resumed.
    digest: [u8; 32],
}

impl Crls {
    /// Reads PEM (one or more CRLs) or DER (one CRL).
    pub fn load(path: &Path) -> anyhow::Result<Crls> {
        let data =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Ok(Crls {
            list: parse(&data)?,
            digest: boring::sha::sha256(&data),
        })
    }

    /// Adds the CRLs to `store` and turns revocation checking on; warns about CRLs whose
    /// validity period excludes now when no current CRL of the same issuer is beside them,
    /// since BoringSSL then refuses every client certificate that issuer signed.
    fn install(
        &self,
        store: &mut X509StoreBuilderRef,
        check: CrlCheck,
        path: &Path,
    ) -> anyhow::Result<()> {
        let validity: Vec<Validity> = self.list.iter().map(Crl::validity).collect();
        for (index, crl) in self.list.iter().enumerate() {
            let replaced = || {
                self.list.iter().zip(&validity).any(|(other, validity)| {
                    *validity == Validity::Current && other.same_issuer(crl)
                })
            };
            match validity[index] {
                Validity::Current => {}
                _ if replaced() => {}
                Validity::Expired => {
                    tracing::warn!(file = %path.display(), crl = index + 1, "client_crl: CRL has expired (nextUpdate is past) and no current CRL of its issuer is in the file: every client certificate that issuer signed is refused until a fresh CRL is loaded (SIGHUP)")
                }
                Validity::NotYetValid => {
                    tracing::warn!(file = %path.display(), crl = index + 1, "client_crl: CRL is not yet valid (lastUpdate is in the future) and no current CRL of its issuer is in the file: every client certificate that issuer signed is refused")
                }
            }
            // SAFETY: both pointers are valid; the store takes its own reference to the CRL.
            let added = unsafe { boring_sys::X509_STORE_add_crl(store.as_ptr(), crl.0.as_ptr()) };
            if added != 1 {
                return Err(ErrorStack::get()).context("cannot add the CRL to the store");
            }
        }
        store.set_flags(match check {
            CrlCheck::Leaf => X509VerifyFlags::CRL_CHECK,
            CrlCheck::Chain => X509VerifyFlags::CRL_CHECK | X509VerifyFlags::CRL_CHECK_ALL,
        });
        Ok(())
    }
}

const PEM_BEGIN: &[u8] = b"-----BEGIN X509 CRL-----";

fn parse(data: &[u8]) -> anyhow::Result<Vec<Crl>> {
    let blocks = data
        .windows(PEM_BEGIN.len())
        .filter(|w| *w == PEM_BEGIN)
        .count();
    if blocks == 0 {
        return parse_der(data).map(|crl| vec![crl]);
    }
    let len = data.len().try_into().context("CRL file too large")?;
    // SAFETY: the BIO reads `data`, which outlives it (it is freed below).
    let bio = unsafe { boring_sys::BIO_new_mem_buf(data.as_ptr().cast(), len) };
    anyhow::ensure!(!bio.is_null(), "out of memory");
    let mut crls = Vec::with_capacity(blocks);
    for _ in 0..blocks {
        // SAFETY: `bio` is valid; no password callback (a CRL is not encrypted).
        let crl = unsafe {
            boring_sys::PEM_read_bio_X509_CRL(bio, ptr::null_mut(), None, ptr::null_mut())
        };
        match NonNull::new(crl) {
            Some(crl) => crls.push(Crl(crl)),
            None => break,
        }
    }
    // SAFETY: `bio` came from BIO_new_mem_buf and is not used afterwards.
    unsafe { boring_sys::BIO_free(bio) };
    if crls.len() < blocks {
        return Err(ErrorStack::get())
            .with_context(|| format!("CRL number {} is not valid PEM", crls.len() + 1));
    }
    Ok(crls)
}

fn parse_der(data: &[u8]) -> anyhow::Result<Crl> {
    let len = data.len().try_into().context("CRL file too large")?;
    let mut cursor = data.as_ptr();
    // SAFETY: d2i reads at most `len` bytes from `cursor` and advances it past what it read.
    let crl = unsafe { boring_sys::d2i_X509_CRL(ptr::null_mut(), &mut cursor, len) };
    let crl = NonNull::new(crl)
        .map(Crl)
        .ok_or_else(ErrorStack::get)
        .context("neither a PEM (BEGIN X509 CRL) nor a DER CRL")?;
    anyhow::ensure!(
        cursor == data.as_ptr_range().end,
        "trailing data after the DER CRL"
    );
    Ok(crl)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Validity {
    Current,
    /// nextUpdate is past.
    Expired,
    /// lastUpdate is in the future.
    NotYetValid,
}

impl Crl {
    fn validity(&self) -> Validity {
        let crl = self.0.as_ptr();
        // -1: past, 1: future, 0: unreadable.
        let compare = |time: *const boring_sys::ASN1_TIME| {
            // SAFETY: a non-null time from the CRL lives as long as the CRL; this only reads it.
            (!time.is_null()).then(|| unsafe { boring_sys::X509_cmp_current_time(time) })
        };
        // SAFETY: `crl` is valid; the getters return pointers into it, or null.
        let (last, next) = unsafe {
            (
                boring_sys::X509_CRL_get0_lastUpdate(crl),
                boring_sys::X509_CRL_get0_nextUpdate(crl),
            )
        };
        match (compare(last), compare(next)) {
            (_, Some(-1)) => Validity::Expired,
            (Some(1), _) => Validity::NotYetValid,
            _ => Validity::Current,
        }
    }

    fn same_issuer(&self, other: &Crl) -> bool {
        // SAFETY: both CRLs are valid; their issuer names live as long as they do and are
        // only read.
        unsafe {
            boring_sys::X509_NAME_cmp(
                boring_sys::X509_CRL_get_issuer(self.0.as_ptr()),
                boring_sys::X509_CRL_get_issuer(other.0.as_ptr()),
            ) == 0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_refused() {
        assert!(parse(b"not a CRL").is_err());
        let bad_pem = [PEM_BEGIN, b"\nAAAA\n-----END X509 CRL-----\n"].concat();
        let err = parse(&bad_pem).err().unwrap();
        assert!(format!("{err:#}").contains("CRL number 1"), "{err:#}");
    }
}
