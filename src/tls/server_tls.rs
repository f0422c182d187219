//! Everything TLS of one listener: the base context that creates connections and the
//! certificate-selection callback that finishes them.

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use boring::ex_data::Index;
use boring::ssl::{
    AsyncSelectCertError, BoxSelectCertFinish, Ssl, SslContext, SslContextBuilder, SslContextRef,
    SslEchKeys, SslMethod,
};

use super::certificate::CertifiedKey;
use super::connection_setup::ConnectionSetup;
use super::context::configure;
use super::early_data::{early_data_check, early_data_refused};
use super::keymethod::OffloadKeyMethod;
use super::names::NameTable;
use super::profile::Profiles;
use super::select::{ecdsa_suites, file_staple, CertContext, CertSelector};
use super::tls13::Tls13Order;
use super::{acme_challenge, compress, ech, key_share_hint};
use crate::config::{CertCompression, ListenerConfig, SessionConfig, TlsVersion};
use crate::session::Sessions;

/// The client's address on each connection (set by [`ServerTls::new_ssl`]).
pub(super) static CLIENT_ADDRESS: LazyLock<Index<Ssl, IpAddr>> =
    LazyLock::new(|| Ssl::new_ex_index().expect("an SSL ex_data index"));

/// Everything TLS of one listener; shared by all workers, replaced whole on reload.
pub struct ServerTls {
    pub(super) base: SslContext,
    pub(super) profiles: Arc<Profiles>,
}

impl ServerTls {
    pub fn build(
        listener: &ListenerConfig,
        certs: Vec<CertifiedKey>,
        sessions: &Sessions,
        session_config: &SessionConfig,
    ) -> anyhow::Result<ServerTls> {
        anyhow::ensure!(!certs.is_empty(), "no certificate configured");
        let profiles = Arc::new(Profiles::build(listener)?);
        let ech_keys = load_ech_keys(listener)?;
        let selector = certificate_contexts(listener, certs, &profiles, ech_keys.as_ref())?;

        let mut base = SslContextBuilder::new(SslMethod::tls())?;
        configure(&mut base, listener, &profiles)?;
        sessions.install(&mut base, session_config)?;
        if let Some(keys) = &ech_keys {
            // ClientHellos are decrypted on the base context, before certificate selection.
            base.set_ech_keys(keys)?;
        }
        let setup = ConnectionSetup {
            selector,
            profiles: profiles.clone(),
            chacha_first: Tls13Order::parse(listener.tls13_ciphers.get_ref())?.chacha_first(),
            has_ech_keys: ech_keys.is_some(),
        };
        install_select_callback(&mut base, listener, sessions, setup);
        Ok(ServerTls {
            base: base.build(),
            profiles,
        })
    }

    /// Which `[[listener.server_name]]` a connection with this SNI follows (0: none).
    pub fn profile_index(&self, sni: Option<&str>) -> usize {
        self.profiles.index(sni)
    }

    /// The context connections are made from, for QUIC (quiche makes them itself).
    pub fn base_context(&self) -> &SslContextRef {
        &self.base
    }

    /// Tells a connection that another library made from [`Self::base_context`] (quiche)
    /// which client it serves, as [`Self::new_ssl`] does: the 0-RTT anti-replay memory
    /// counts each client's share.
    pub fn set_client(ssl: &mut boring::ssl::SslRef, client: IpAddr) {
        ssl.set_ex_data(*CLIENT_ADDRESS, client);
    }

    /// A connection object for a client at `client`.
    pub fn new_ssl(&self, client: IpAddr) -> anyhow::Result<Ssl> {
        let mut ssl = Ssl::new(&self.base)?;
        ssl.set_ex_data(*CLIENT_ADDRESS, client);
        Ok(ssl)
    }
}

/// The listener's ECH keys (`ech_keys`), if any.
fn load_ech_keys(listener: &ListenerConfig) -> anyhow::Result<Option<SslEchKeys>> {
    let Some(files) = &listener.ech_keys else {
        return Ok(None);
    };
    let keys: Vec<ech::EchKey> = files
        .get_ref()
        .iter()
        .map(|file| ech::EchKey::load(file))
        .collect::<anyhow::Result<_>>()?;
    Ok(Some(ech::server_keys(&keys)?))
}

/// One context per certificate, with the listener's settings, its chain, its OCSP staple
/// and the offloaded private-key method, and the names that choose each.
fn certificate_contexts(
    listener: &ListenerConfig,
    certs: Vec<CertifiedKey>,
    profiles: &Arc<Profiles>,
    ech_keys: Option<&SslEchKeys>,
) -> anyhow::Result<CertSelector> {
    let mut selector = CertSelector {
        certs: Vec::new(),
        names: NameTable::new(),
        default: Vec::new(),
        tls13_enabled: listener.max_version >= TlsVersion::Tls13,
        unknown_sni: listener.unknown_sni,
        host_names_only: listener
            .server_names
            .iter()
            .any(|n| n.has_own_client_policy()),
    };
    let compression: Vec<CertCompression> = listener
        .cert_compression
        .get_ref()
        .iter()
        .filter_map(|name| CertCompression::parse(name))
        .collect();
    let first_names = certs[0].names.clone();
    let any_default = certs.iter().any(|c| c.default);
    for (index, cert) in certs.into_iter().enumerate() {
        let mut builder = SslContextBuilder::new(SslMethod::tls())?;
        configure(&mut builder, listener, profiles)?;
        let (leaf, intermediates) = cert.chain.split_first().expect("chain is not empty");
        builder.set_certificate(leaf)?;
        for intermediate in intermediates {
            builder.add_extra_chain_cert(intermediate.clone())?;
        }
        let file_ocsp = match (&cert.ocsp, &cert.ocsp_fetch) {
            (Some(response), None) => file_staple(response, &cert.chain, &cert.names),
            _ => None,
        };
        // On the certificate's context: each keeps its own compressed chain.
        compress::install(&mut builder, &compression)?;
        if let Some(keys) = ech_keys {
            // Each context: the retry configs come from the one a connection ends on.
            builder.set_ech_keys(keys)?;
        }
        builder.set_async_private_key_method(OffloadKeyMethod {
            key: cert.key.clone(),
        });
        let ctx = builder.build();
        selector.certs.push(CertContext {
            ecdsa_suites: ecdsa_suites(&ctx),
            ctx,
            kind: cert.key.kind(),
            fetched_ocsp: cert.ocsp_fetch.clone(),
            file_ocsp,
        });
        for name in &cert.names {
            selector.names.entry(name).push(index);
        }
        // Without an explicit default, the first certificate's names (all its key types) are it.
        if cert.default || (!any_default && cert.names == first_names) {
            selector.default.push(index);
        }
    }
    Ok(selector)
}

/// BoringSSL's asynchronous certificate-selection callback on the base context: refuses
/// at once a ClientHello the certificate selection will refuse, else waits for what the
/// ClientHello needs answered first (an ACME answer from the fleet, the key share computed
/// by the offload engine, the 0-RTT anti-replay verdict, which may ask Redis), then lets
/// `setup` finish the connection.
fn install_select_callback(
    base: &mut SslContextBuilder,
    listener: &ListenerConfig,
    sessions: &Sessions,
    setup: ConnectionSetup,
) {
    let replay_check = (*listener.early_data.get_ref()).then(|| sessions.clone());
    let listener_groups: Vec<u16> = listener
        .groups
        .get_ref()
        .iter()
        .filter_map(|g| crate::config::group_id(g))
        .collect();
    let setup = Arc::new(setup);
    base.set_async_select_certificate_callback(move |hello| {
        // Before any work for the handshake: none is queued for one that will fail.
        if setup.refuses(hello) {
            return Err(AsyncSelectCertError);
        }
        let check = replay_check
            .as_ref()
            .and_then(|sessions| early_data_check(hello, sessions));
        let fleet_answer = acme_challenge::fleet_answer(hello);
        let key_share = key_share_hint::request(hello, &listener_groups)
            .and_then(|request| crate::offload::key_share(request.group, &request.peer));
        let setup = setup.clone();
        Ok(Box::pin(async move {
            if let Some(fetching) = fleet_answer {
                fetching.await;
            }
            let key_share = match key_share {
                Some(pending) => pending.await,
                None => None,
            };
            let refused = match check {
                Some(check) => early_data_refused(check.verdict().await),
                None => false,
            };
            let finish: BoxSelectCertFinish = Box::new(move |mut hello| {
                setup
                    .finish(&mut hello, refused, key_share)
                    .map_err(|_| AsyncSelectCertError)
            });
            Ok(finish)
        }))
    });
}
