//! Per-name settings (`[[listener.server_name]]`): applied to a connection once its SNI
//! is known.

use std::path::Path;

use anyhow::Context as _;
use boring::error::ErrorStack;
use boring::ssl::{NameType, SslRef, SslVerifyMode, SslVersion};
use boring::stack::Stack;
use boring::x509::X509Name;

use super::context::ssl_version;
use super::crl::ClientTrust;
use super::names::NameTable;
use crate::config::{ClientAuth, ListenerConfig, ServerNameConfig};

/// TLS settings that depend on the SNI name (`[[listener.server_name]]`); profile 0 is
/// the listener's own. They are applied to each connection once its SNI is known.
pub(super) struct Profile {
    pub(super) alpn: Vec<Vec<u8>>,
    pub(super) min_version: Option<SslVersion>,
    /// Client-certificate policy overriding the listener's (set on the connection).
    pub(super) verify: Option<(SslVerifyMode, Option<ClientTrust>)>,
    /// The CA names sent in its CertificateRequest when they differ from the contexts'
    /// (the listener's): clients pick their certificate by these names, so a name trusting
    /// other CAs must name those. Set on the connection, after the context switch.
    pub(super) ca_names: Option<CaNames>,
    /// The session ID context of its connections: a digest of the names and the effective
    /// client-certificate policy (mode, CA and CRL files). BoringSSL resumes a session only
    /// under the context it was made in, and resumption skips client-certificate checks, so
    /// a session must not carry over to a name or a reload with a different policy.
    pub(super) sid_ctx: [u8; 32],
}

/// See `Profile::sid_ctx`.
pub(super) fn session_context(
    names: &[String],
    mode: SslVerifyMode,
    store: Option<&ClientTrust>,
) -> [u8; 32] {
    let mut digest = boring::sha::Sha256::new();
    digest.update(b"tlsterm session context 1\0");
    for name in names {
        digest.update(name.to_ascii_lowercase().as_bytes());
        digest.update(b"\0");
    }
    digest.update(&mode.bits().to_be_bytes());
    digest.update(store.map_or(&[0u8; 32], |store| &store.digest));
    digest.finish()
}

/// Subject names of a `client_ca` file, kept as DER: BoringSSL takes ownership of the list
/// it is given, so each connection gets a fresh copy.
pub(super) struct CaNames(Vec<Vec<u8>>);

impl CaNames {
    fn load(ca: &Path) -> anyhow::Result<CaNames> {
        let names = X509Name::load_client_ca_file(ca)
            .with_context(|| format!("cannot read CA names from {}", ca.display()))?;
        let der = names
            .iter()
            .map(|name| name.to_der())
            .collect::<Result<_, _>>()?;
        Ok(CaNames(der))
    }

    /// Advertises these names on `ssl` instead of its context's.
    pub(super) fn apply(&self, ssl: &mut SslRef) -> Result<(), ErrorStack> {
        let mut list = Stack::new()?;
        for der in &self.0 {
            list.push(X509Name::from_der(der)?)?;
        }
        ssl.set_client_ca_list(list);
        Ok(())
    }
}

pub struct Profiles {
    pub(super) names: NameTable<usize>,
    pub(super) list: Vec<Profile>,
    /// The listener's client-certificate store, loaded once for all its contexts.
    pub(super) client_store: Option<ClientTrust>,
}

impl Profiles {
    pub(super) fn build(listener: &ListenerConfig) -> anyhow::Result<Profiles> {
        let client_store = match (&listener.client_ca, listener.client_auth) {
            (Some(ca), ClientAuth::Optional | ClientAuth::Required) => Some(ClientTrust::load(
                ca.get_ref(),
                listener.client_crl.as_ref(),
                listener.client_crl_check,
            )?),
            _ => None,
        };
        let listener_mode = verify_mode(listener.client_auth);
        let mut profiles = Profiles {
            names: NameTable::new(),
            list: vec![Profile {
                alpn: alpn_wire(&listener.alpn),
                min_version: None,
                verify: None,
                ca_names: None,
                sid_ctx: session_context(&[], listener_mode, client_store.as_ref()),
            }],
            client_store,
        };
        for (index, server_name) in listener.server_names.iter().enumerate() {
            let profile = name_profile(
                listener,
                server_name,
                listener_mode,
                profiles.client_store.as_ref(),
            )?;
            profiles.list.push(profile);
            for name in server_name.names.get_ref() {
                *profiles.names.entry(name) = index + 1;
            }
        }
        Ok(profiles)
    }

    /// The profile of a connection with this SNI (0: the listener's).
    pub fn index(&self, sni: Option<&str>) -> usize {
        sni.and_then(|sni| self.names.lookup(sni))
            .copied()
            .unwrap_or(0)
    }

    pub(super) fn for_ssl(&self, ssl: &SslRef) -> &Profile {
        &self.list[self.index(ssl.servername(NameType::HOST_NAME))]
    }
}

/// The profile of one `[[listener.server_name]]`: its own settings where it has them,
/// else the listener's (`listener_mode`, `listener_store`).
fn name_profile(
    listener: &ListenerConfig,
    server_name: &ServerNameConfig,
    listener_mode: SslVerifyMode,
    listener_store: Option<&ClientTrust>,
) -> anyhow::Result<Profile> {
    // A name with its own CA or CRL settings but no client_auth follows the listener's.
    let own_trust = server_name.client_ca.is_some()
        || server_name.client_crl.is_some()
        || server_name.client_crl_check.is_some();
    let auth = server_name
        .client_auth
        .or(own_trust.then_some(listener.client_auth));
    let mut ca_names = None;
    let verify = match auth {
        None => None,
        Some(ClientAuth::None) => Some((SslVerifyMode::NONE, None)),
        Some(auth) => {
            let ca = server_name
                .client_ca
                .as_ref()
                .or(listener.client_ca.as_ref());
            let ca = ca.context("client_auth needs client_ca")?;
            // The contexts name the listener's CAs only when the listener asks for
            // certificates itself (see `configure`).
            if server_name.client_ca.is_some() || listener_store.is_none() {
                ca_names = Some(CaNames::load(ca.get_ref())?);
            }
            let crl = server_name
                .client_crl
                .as_ref()
                .or(listener.client_crl.as_ref());
            let check = server_name
                .client_crl_check
                .unwrap_or(listener.client_crl_check);
            Some((
                verify_mode(auth),
                Some(ClientTrust::load(ca.get_ref(), crl, check)?),
            ))
        }
    };
    let sid_ctx = match &verify {
        Some((mode, store)) => session_context(server_name.names.get_ref(), *mode, store.as_ref()),
        None => session_context(server_name.names.get_ref(), listener_mode, listener_store),
    };
    Ok(Profile {
        alpn: alpn_wire(server_name.alpn.as_deref().unwrap_or(&listener.alpn)),
        min_version: server_name
            .min_version
            .as_ref()
            .map(|version| ssl_version(*version.get_ref())),
        verify,
        ca_names,
        sid_ctx,
    })
}

/// ALPN protocol names as bytes, in preference order.
fn alpn_wire(alpn: &[String]) -> Vec<Vec<u8>> {
    alpn.iter().map(|p| p.as_bytes().to_vec()).collect()
}

/// Client certificates: verified against the CA bundle; "required" fails the handshake
/// without one.
pub(super) fn verify_mode(auth: ClientAuth) -> SslVerifyMode {
    match auth {
        ClientAuth::None => SslVerifyMode::NONE,
        ClientAuth::Optional => SslVerifyMode::PEER,
        ClientAuth::Required => SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT,
    }
}

/// The first server-preferred protocol the client offers, as a slice of the client's list.
pub(super) fn select_alpn<'a>(preferences: &[Vec<u8>], client: &'a [u8]) -> Option<&'a [u8]> {
    preferences.iter().find_map(|wanted| {
        let mut rest = client;
        while let Some((&len, tail)) = rest.split_first() {
            let (proto, next) = tail.split_at_checked(len as usize)?;
            if proto == wanted.as_slice() {
                return Some(proto);
            }
            rest = next;
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn alpn_follows_server_preference() {
        let prefs = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let client = b"\x08http/1.1\x02h2";
        assert_eq!(select_alpn(&prefs, client), Some(&b"h2"[..]));
        assert_eq!(select_alpn(&prefs, b"\x03foo"), None);
        // A truncated list is not read past its end.
        assert_eq!(select_alpn(&prefs, b"\x09http/1.1"), None);
    }
}
