//! The CRLs of a `client_crl` file, read (and refused with a line number) when the
//! configuration is validated; the client-certificate store (`tls::crl`) installs them.

use std::path::Path;

use anyhow::Context as _;
use boring::error::ErrorStack;

use crate::sys::Crl;

/// The CRLs of one `client_crl` file.
#[derive(Debug)]
pub struct Crls {
    pub list: Vec<Crl>,
    /// SHA-256 of the file: a changed file must change the session ID context, so that
    /// sessions whose certificates may now be revoked are not resumed.
    pub digest: [u8; 32],
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
    let crls = Crl::parse_pem(data, blocks)?;
    if crls.len() < blocks {
        return Err(ErrorStack::get())
            .with_context(|| format!("CRL number {} is not valid PEM", crls.len() + 1));
    }
    Ok(crls)
}

fn parse_der(data: &[u8]) -> anyhow::Result<Crl> {
    let (crl, read) = Crl::parse_der(data)?;
    anyhow::ensure!(read == data.len(), "trailing data after the DER CRL");
    Ok(crl)
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
