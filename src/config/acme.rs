//! `[acme]` and the per-listener `acme` tables: certificates tlsterm obtains and renews
//! itself from an ACME certificate authority (RFC 8555).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, SourceMap};

/// `[acme]`: the certificate authority and where the account and certificates are kept.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The CA's directory URL (Let's Encrypt: https://acme-v02.api.letsencrypt.org/directory).
    pub directory: Spanned<String>,
    /// Contact URLs for the account, e.g. "mailto:ops@example.com".
    #[serde(default)]
    pub contact: Vec<String>,
    /// Directory for the account credentials and the certificates with their keys (files
    /// 0600). Certificates found here are served after a restart without a new order.
    pub storage: Spanned<PathBuf>,
    /// PEM certificate that the CA's own HTTPS is verified against (a test CA such as
    /// Pebble's); default: the system's web PKI roots.
    pub ca_file: Option<Spanned<PathBuf>>,
    /// How the CA checks that we hold the name: "tls-alpn-01" (answered on the listener
    /// that serves the name) or "http-01" (answered on `http_address`).
    #[serde(default)]
    pub challenge: ChallengeKind,
    /// A plain-HTTP listener: answers `/.well-known/acme-challenge/` and redirects every
    /// other request to https. Needed for "http-01"; allowed with "tls-alpn-01" (redirects).
    pub http_address: Option<Spanned<SocketAddr>>,
    /// External account binding, for CAs that require one (key id and the file holding
    /// the base64url HMAC key the CA gave).
    pub external_account: Option<ExternalAccount>,
    /// No longer here: the fleet key is `[session] fleet_key_file`, which seals everything
    /// the fleet shares through Redis. Kept so that a configuration naming it is told so.
    pub fleet_key_file: Option<Spanned<PathBuf>>,
    /// The first wait after a failed order; it doubles per failure up to `retry_max`.
    #[serde(default = "default_retry_min", with = "humantime_serde")]
    pub retry_min: Duration,
    #[serde(default = "default_retry_max", with = "humantime_serde")]
    pub retry_max: Duration,
    /// How long one order may take (challenges validated, certificate issued).
    #[serde(default = "default_order_timeout", with = "humantime_serde")]
    pub order_timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum ChallengeKind {
    #[default]
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
    #[serde(rename = "http-01")]
    Http01,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalAccount {
    pub key_id: String,
    pub hmac_key_file: Spanned<PathBuf>,
}

/// `acme` in a `[[listener]]` or `[[listener.server_name]]`: one certificate covering
/// `names`, obtained for each key type (served side by side like file certificates).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeNames {
    /// Exact DNS names (no wildcards: TLS-ALPN-01 and HTTP-01 cannot prove them). In a
    /// `[[listener.server_name]]` the default is the block's `names`.
    pub names: Option<Spanned<Vec<String>>>,
    #[serde(default = "default_key_types")]
    pub key_types: Spanned<Vec<AcmeKeyType>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum AcmeKeyType {
    #[serde(rename = "ecdsa-p256")]
    EcdsaP256,
    #[serde(rename = "rsa-2048")]
    Rsa2048,
}

impl AcmeKeyType {
    pub fn label(self) -> &'static str {
        match self {
            AcmeKeyType::EcdsaP256 => "ecdsa-p256",
            AcmeKeyType::Rsa2048 => "rsa-2048",
        }
    }
}

/// One certificate to obtain: its names (the first is its label) and its key type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AcmeCertificate {
    pub names: Vec<String>,
    pub key_type: AcmeKeyType,
}

impl AcmeCertificate {
    /// A stable file-system and Redis-key friendly identifier.
    pub fn id(&self) -> String {
        format!("{}_{}", self.names[0], self.key_type.label())
    }
}

fn default_key_types() -> Spanned<Vec<AcmeKeyType>> {
    Spanned::new(0..0, vec![AcmeKeyType::EcdsaP256])
}
fn default_retry_min() -> Duration {
    Duration::from_secs(60)
}
fn default_retry_max() -> Duration {
    Duration::from_secs(6 * 3600)
}
fn default_order_timeout() -> Duration {
    Duration::from_secs(120)
}

/// A DNS name a CA can validate by TLS-ALPN-01 or HTTP-01.
fn valid_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').count() >= 2
        // An all-digit last label is an IP address, which these challenges cannot prove.
        && name.rsplit('.').next().is_some_and(|tld| tld.bytes().any(|b| b.is_ascii_alphabetic()))
        && name
            .split('.')
            .all(|label| super::server_name::is_dns_label(label, b""))
}

impl AcmeNames {
    /// Checks the table and expands it into one certificate per key type.
    pub(super) fn resolve(
        &self,
        map: &SourceMap<'_>,
        block_names: Option<&Spanned<Vec<String>>>,
        has_acme: bool,
    ) -> Result<Vec<AcmeCertificate>, ConfigError> {
        let names = self.names.as_ref().or(block_names).ok_or_else(|| {
            map.plain("key `acme.names`: missing (which names to obtain a certificate for)")
        })?;
        if !has_acme {
            return Err(map.error(
                names,
                "key `acme`: needs an [acme] section (the certificate authority)",
            ));
        }
        if names.get_ref().is_empty() {
            return Err(map.error(names, "key `acme.names`: must not be empty"));
        }
        let mut lower: Vec<String> = Vec::new();
        for name in names.get_ref() {
            let name = super::normal_name(name);
            if !valid_dns_name(&name) {
                return Err(map.error(names, format!("key `acme.names`: `{name}` is not a DNS name an ACME CA can validate here (no wildcards, no IP addresses)")));
            }
            if !lower.contains(&name) {
                lower.push(name);
            }
        }
        let types = self.key_types.get_ref();
        if types.is_empty() {
            return Err(map.error(&self.key_types, "key `acme.key_types`: must not be empty"));
        }
        let mut out: Vec<AcmeCertificate> = Vec::new();
        for &key_type in types {
            let cert = AcmeCertificate {
                names: lower.clone(),
                key_type,
            };
            if out.contains(&cert) {
                return Err(map.error(
                    &self.key_types,
                    format!(
                        "key `acme.key_types`: `{}` is listed twice",
                        key_type.label()
                    ),
                ));
            }
            out.push(cert);
        }
        Ok(out)
    }
}

impl AcmeConfig {
    /// Resolves its files against the configuration's directory and checks them.
    pub(super) fn validate(&mut self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        let url = self.directory.get_ref();
        // Orders and the certificates issued travel between tlsterm and the CA: over TLS
        // only, so that nobody on the way can answer in the CA's place. Compared without
        // case, as URL schemes are.
        let https = url
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
        if !https || url.len() == 8 {
            return Err(map.error(
                &self.directory,
                "key `acme.directory`: must be an https:// URL",
            ));
        }
        *self.storage.get_mut() = map.resolve(self.storage.get_ref());
        if let Some(file) = &self.fleet_key_file {
            return Err(map.error(file, "key `acme.fleet_key_file`: moved to `[session] fleet_key_file`, which seals everything the fleet shares through Redis (sessions and ticket keys too): move the line there, and make the file mode 0600"));
        }
        for file in self
            .ca_file
            .as_mut()
            .into_iter()
            .chain(self.external_account.as_mut().map(|e| &mut e.hmac_key_file))
        {
            let resolved = map.resolve(file.get_ref());
            if !resolved.is_file() {
                return Err(map.error(
                    file,
                    format!("key `acme`: no such file {}", resolved.display()),
                ));
            }
            *file.get_mut() = resolved;
        }
        if self.challenge == ChallengeKind::Http01 && self.http_address.is_none() {
            return Err(map.plain("key `acme.challenge`: \"http-01\" needs `acme.http_address`"));
        }
        if self.retry_min.is_zero() || self.retry_max < self.retry_min {
            return Err(
                map.plain("key `acme.retry_min`: must be above zero and at most `acme.retry_max`")
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::valid_dns_name;

    #[test]
    fn dns_names_a_ca_can_validate() {
        assert!(valid_dns_name("www.example.com"));
        assert!(valid_dns_name("a-b.test"));
        assert!(!valid_dns_name("localhost"));
        assert!(!valid_dns_name("*.example.com"));
        assert!(!valid_dns_name("127.0.0.1"));
        assert!(!valid_dns_name("-a.example"));
        assert!(!valid_dns_name("a..example"));
    }
}
