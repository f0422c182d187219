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

use crate::config::CrlCheck;

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
    pub fn load(ca: &Path, crl: Option<&Path>, check: CrlCheck) -> anyhow::Result<ClientStore> {
        let pem = std::fs::read(ca).with_context(|| format!("cannot read {}", ca.display()))?;
        let cas = X509::stack_from_pem(&pem).context("cannot parse client_ca PEM")?;
        anyhow::ensure!(!cas.is_empty(), "client_ca holds no certificate");
        let mut store = X509StoreBuilder::new()?;
        for ca in &cas {
            store.add_cert(ca)?;
        }
        let mut digest = boring::sha::Sha256::new();
        digest.update(&pem);
        if let Some(path) = crl {
            let crls = Crls::load(path)?;
            crls.install(&mut store, check, path)?;
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
struct Crl(NonNull<boring_sys::X509_CRL>);

impl Drop for Crl {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful parse and this is its only owner; a
        // store that was given the CRL holds its own reference.
        unsafe { boring_sys::X509_CRL_free(self.0.as_ptr()) }
    }
}

/// The CRLs of one `client_crl` file.
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
    /// validity period excludes now, since BoringSSL then refuses every client certificate.
    fn install(
        &self,
        store: &mut X509StoreBuilderRef,
        check: CrlCheck,
        path: &Path,
    ) -> anyhow::Result<()> {
        for (index, crl) in self.list.iter().enumerate() {
            warn_if_out_of_date(crl, index + 1, path);
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

fn warn_if_out_of_date(crl: &Crl, number: usize, path: &Path) {
    let crl = crl.0.as_ptr();
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
    let (last, next) = (compare(last), compare(next));
    if next == Some(-1) {
        tracing::warn!(file = %path.display(), crl = number, "client_crl: CRL has expired (nextUpdate is past): every client certificate it covers is refused until a fresh CRL is loaded (SIGHUP)");
    }
    if last == Some(1) {
        tracing::warn!(file = %path.display(), crl = number, "client_crl: CRL is not yet valid (lastUpdate is in the future): every client certificate it covers is refused");
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
