//! `[[listener.server_name]]`: settings for particular SNI names, overriding the listener's.

use std::path::PathBuf;

use serde::Deserialize;
use toml::Spanned;

use super::acme::AcmeNames;
use super::client_trust::check_crl;
use super::client_trust::{ClientAuth, CrlCheck, CrlFile};
use super::listener::check_backends;
use super::listener::CertificateConfig;
use super::source::{resolve_file, ConfigError, SourceMap};
use super::tls_names::TlsVersion;

/// `[[listener.server_name]]`: what differs for connections whose SNI matches `names`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerNameConfig {
    /// Exact names or "*.suffix" wildcards.
    pub names: Spanned<Vec<String>>,
    pub backends: Option<Spanned<Vec<String>>>,
    pub alpn: Option<Vec<String>>,
    /// The lowest version for these names (spanned: an error names its line).
    pub min_version: Option<Spanned<TlsVersion>>,
    pub client_auth: Option<ClientAuth>,
    pub client_ca: Option<Spanned<PathBuf>>,
    pub client_crl: Option<CrlFile>,
    pub client_crl_check: Option<CrlCheck>,
    /// `[[listener.server_name.certificate]]`: certificates kept with the rest of this
    /// name's settings. Their `names` default to this block's names (not their SAN). At
    /// load they join the listener's certificates.
    #[serde(default, rename = "certificate")]
    pub certificates: Vec<CertificateConfig>,
    /// Obtain a certificate for these names (default: the block's `names`) from `[acme]`.
    pub acme: Option<AcmeNames>,
}

/// A DNS name as SNI matching compares it: lower case, and a fully qualified name
/// ("example.com.") the same as without its trailing dot.
pub fn normal_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Whether `label` is one label of a DNS name: 1 to 63 bytes of letters, digits, `-` and
/// the bytes of `also` (`_` where SNI values allow it), no `-` at either end.
pub fn is_dns_label(label: &str, also: &[u8]) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && !label.starts_with('-')
        && !label.ends_with('-')
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || also.contains(&b))
}

/// What a server name's checks need from its listener.
#[derive(Clone, Copy)]
pub(super) struct ListenerFacts {
    /// Whether the listener has a `client_ca`.
    pub has_ca: bool,
    pub auth: ClientAuth,
    pub max_version: TlsVersion,
}

/// A client-certificate policy as connections get it: `client_auth`, and when certificates
/// are asked for, the CA file, the CRL file and how CRLs are checked.
pub(super) type ClientPolicy = (
    ClientAuth,
    Option<PathBuf>,
    Option<PathBuf>,
    Option<CrlCheck>,
);

/// `policy` with the parts that do not apply left out (no certificate asked: nothing else
/// matters).
pub(super) fn normal_policy(policy: ClientPolicy) -> ClientPolicy {
    match policy.0 {
        ClientAuth::None => (ClientAuth::None, None, None, None),
        _ => policy,
    }
}

impl ServerNameConfig {
    /// The policy its connections get: its own settings, else the listener's.
    pub(super) fn client_policy(&self, listener: &ClientPolicy) -> ClientPolicy {
        normal_policy((
            self.client_auth.unwrap_or(listener.0),
            self.client_ca
                .as_ref()
                .map(|ca| ca.get_ref().clone())
                .or_else(|| listener.1.clone()),
            self.client_crl
                .as_ref()
                .map(|crl| crl.path.get_ref().clone())
                .or_else(|| listener.2.clone()),
            self.client_crl_check.or(listener.3),
        ))
    }

    /// Whether it sets any client-certificate setting of its own.
    pub fn has_own_client_policy(&self) -> bool {
        self.client_auth.is_some()
            || self.client_ca.is_some()
            || self.client_crl.is_some()
            || self.client_crl_check.is_some()
    }

    /// Whether its connections are checked for client certificates otherwise than the
    /// listener's (`listener_auth`): another `client_auth`, or its own CA or CRL settings
    /// while certificates are asked for.
    pub(super) fn client_policy_differs(&self, listener_auth: ClientAuth) -> bool {
        let auth = self.client_auth.unwrap_or(listener_auth);
        let own_trust = self.client_ca.is_some()
            || self.client_crl.is_some()
            || self.client_crl_check.is_some();
        auth != listener_auth || (auth != ClientAuth::None && own_trust)
    }

    /// Checks this block against its listener's settings and resolves its files.
    pub(super) fn validate(
        &mut self,
        map: &SourceMap<'_>,
        listener: &ListenerFacts,
    ) -> Result<(), ConfigError> {
        let ListenerFacts {
            has_ca: listener_ca,
            auth: listener_auth,
            max_version: listener_max,
        } = *listener;
        if self.names.get_ref().is_empty() {
            return Err(map.error(&self.names, "key `names`: must not be empty"));
        }
        // The listener's `max_version` caps every handshake: a higher minimum here would
        // leave no version to agree on, and every client of these names would fail.
        if let Some(min) = &self.min_version {
            if *min.get_ref() > listener_max {
                return Err(map.error(
                    min,
                    "key `min_version`: above the listener's `max_version`, so no handshake for these names could succeed",
                ));
            }
        }
        if let Some(backends) = &self.backends {
            check_backends(map, backends)?;
        }
        if let Some(ca) = &mut self.client_ca {
            resolve_file(map, ca, "client_ca")?;
        }
        let has_ca = listener_ca || self.client_ca.is_some();
        check_crl(map, &mut self.client_crl, has_ca)?;
        let needs_ca = matches!(
            self.client_auth,
            Some(ClientAuth::Optional | ClientAuth::Required)
        );
        if needs_ca && self.client_ca.is_none() && !listener_ca {
            return Err(map.error(
                &self.names,
                "key `client_auth` needs `client_ca` (here or on the listener)",
            ));
        }
        if self.backends.is_none() && self.client_policy_differs(listener_auth) {
            return Err(map.error(
                &self.names,
                "key `backends` is needed here: this name's client-certificate policy differs from the listener's, and a backend both used would be reached under the weaker of the two (by a client sending the other name, or none)",
            ));
        }
        Ok(())
    }
}
