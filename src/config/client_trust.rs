//! Client certificates (mTLS): whether they are asked for, which CAs they must chain
//! to, and the CRLs they are checked against.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::crls;
use super::source::{resolve_file, ConfigError, SourceMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    None,
    Optional,
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CrlCheck {
    Leaf,
    Chain,
}

/// A `client_crl` file: its path, and its CRLs as read when the configuration was
/// validated (so a reload reads and parses a large CRL file once).
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "Spanned<PathBuf>")]
pub struct CrlFile {
    pub path: Spanned<PathBuf>,
    crls: Option<Arc<crls::Crls>>,
}

impl From<Spanned<PathBuf>> for CrlFile {
    fn from(path: Spanned<PathBuf>) -> CrlFile {
        CrlFile { path, crls: None }
    }
}

impl CrlFile {
    /// The CRLs read when the configuration was validated.
    pub fn crls(&self) -> anyhow::Result<&crls::Crls> {
        self.crls.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "client_crl {} was not read (configuration not validated)",
                self.path.get_ref().display()
            )
        })
    }
}

/// Resolves a `client_crl` and reads its CRLs now, so that a missing CA or a broken CRL
/// is an error naming its line rather than a failure at the first handshake.
pub(super) fn check_crl(
    map: &SourceMap<'_>,
    crl: &mut Option<CrlFile>,
    has_ca: bool,
) -> Result<(), ConfigError> {
    let Some(crl) = crl else { return Ok(()) };
    if !has_ca {
        return Err(map.error(&crl.path, "key `client_crl` needs `client_ca`"));
    }
    resolve_file(map, &mut crl.path, "client_crl")?;
    let crls = crls::Crls::load(crl.path.get_ref())
        .map_err(|e| map.error(&crl.path, format!("key `client_crl`: {e:#}")))?;
    crl.crls = Some(Arc::new(crls));
    Ok(())
}
