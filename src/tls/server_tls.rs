//! Everything TLS of one listener: the base context that creates connections and the
//! certificate-selection callback that finishes them.

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use boring::ex_data::Index;
use boring::ssl::{
    AsyncSelectCertError, BoxSelectCertFinish, ClientHello, ExtensionType, NameType,
    SelectCertError, Ssl, SslContext, SslContextBuilder, SslContextRef, SslMethod,
};

use super::certificate::CertifiedKey;
use super::context::configure;
use super::early_data::{early_data_check, early_data_refused};
use super::ech::{ech_outcome, ECH_OFFERED};
use super::keymethod::OffloadKeyMethod;
use super::names::NameTable;
use super::profile::Profiles;
use super::select::{ecdsa_suites, file_staple, CertContext, CertSelector};
use super::tls13::{client_prefers_chacha, Tls13Order};
use super::{acme_challenge, compress, ech, failure, key_share_hint, ocsp};
use crate::config::{CertCompression, ListenerConfig, SessionConfig, TlsVersion};
use crate::offload::key_share::ServerShare;
use crate::offload::KeySharePath;
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
        let ech_keys = match &listener.ech_keys {
            Some(files) => {
                let keys: Vec<ech::EchKey> = files
                    .get_ref()
                    .iter()
                    .map(|file| ech::EchKey::load(file))
                    .collect::<anyhow::Result<_>>()?;
                Some(ech::server_keys(&keys)?)
            }
            None => None,
        };
        let first_names = certs[0].names.clone();
        let any_default = certs.iter().any(|c| c.default);
        for (index, cert) in certs.into_iter().enumerate() {
            let mut builder = SslContextBuilder::new(SslMethod::tls())?;
            configure(&mut builder, listener, &profiles)?;
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
            if let Some(keys) = &ech_keys {
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

        let mut base = SslContextBuilder::new(SslMethod::tls())?;
        configure(&mut base, listener, &profiles)?;
        sessions.install(&mut base, session_config)?;
        if let Some(keys) = &ech_keys {
            // ClientHellos are decrypted on the base context, before certificate selection.
            base.set_ech_keys(keys)?;
        }
        let replay_check = (*listener.early_data.get_ref()).then(|| sessions.clone());
        let selector = Arc::new(selector);
        let per_name = profiles.clone();
        let chacha_first = Tls13Order::parse(listener.tls13_ciphers.get_ref())?.chacha_first();
        let has_ech_keys = ech_keys.is_some();
        let listener_groups: Vec<u16> = listener
            .groups
            .get_ref()
            .iter()
            .filter_map(|g| crate::config::group_id(g))
            .collect();
        // Runs once the anti-replay verdict is known (at once unless Redis is asked).
        let select = move |hello: &mut ClientHello<'_>,
                           early_data_refused: bool,
                           key_share: Option<(ServerShare, KeySharePath)>| {
            if let Some((share, path)) = key_share {
                // Before anything that may fail: the hint only replaces BoringSSL's own
                // computation of the same share.
                key_share_hint::apply(hello.ssl_mut(), &share, path);
            }
            if acme_challenge::offered(hello) {
                // An ACME CA validating a name: the challenge certificate or nothing.
                let answer = acme_challenge::context_for(hello.servername(NameType::HOST_NAME))
                    .ok_or(SelectCertError::ERROR)?;
                return hello
                    .ssl_mut()
                    .set_ssl_context(&answer)
                    .map_err(|_| SelectCertError::ERROR);
            }
            let chosen = selector.select(hello).ok_or(SelectCertError::ERROR)?;
            let prefers_chacha = client_prefers_chacha(hello);
            let wants_ocsp = hello.get_extension(ExtensionType::STATUS_REQUEST).is_some();
            let offers_ech = hello
                .get_extension(ExtensionType::ENCRYPTED_CLIENT_HELLO)
                .is_some();
            let ssl = hello.ssl_mut();
            if offers_ech {
                ssl.set_ex_data(*ECH_OFFERED, true);
            }
            if has_ech_keys {
                // Here, as a client whose ECH was refused may abort after the handshake.
                super::metrics::record_ech(ech_outcome(ssl));
            }
            if let (true, Some(order)) = (prefers_chacha, &chacha_first) {
                if !order.apply_to_connection(ssl) {
                    return Err(SelectCertError::ERROR);
                }
            }
            ssl.set_ssl_context(&chosen.ctx)
                .map_err(|_| SelectCertError::ERROR)?;
            // After the switch, which gives the connection the context's certificate settings.
            if wants_ocsp {
                if let Some(slot) = &chosen.fetched_ocsp {
                    slot.staple(ssl);
                } else if let Some(file) = &chosen.file_ocsp {
                    ocsp::staple_until(ssl, &file.der, file.expires);
                }
            }
            if early_data_refused {
                // After the context switch, which resets the flag from the new context.
                crate::sys::disable_early_data(ssl);
            }
            // BoringSSL fixes the version range and the client-certificate request after
            // this callback, so per-name settings still apply here.
            let profile = per_name.for_ssl(ssl);
            let sid_set = crate::sys::set_connection_session_id_context(ssl, &profile.sid_ctx);
            if !sid_set {
                return Err(SelectCertError::ERROR);
            }
            if let Some(min) = profile.min_version {
                ssl.set_min_proto_version(Some(min))
                    .map_err(|_| SelectCertError::ERROR)?;
            }
            if let Some((mode, store)) = &profile.verify {
                ssl.set_verify(*mode);
                if let Some(client) = store {
                    ssl.set_verify_cert_store(client.store.clone())
                        .map_err(|_| SelectCertError::ERROR)?;
                }
            }
            // The store above decides what is accepted; the names tell the client which
            // certificate to send, so they follow the same CAs.
            if let Some(names) = &profile.ca_names {
                names.apply(ssl).map_err(|_| SelectCertError::ERROR)?;
            }
            Ok(())
        };
        let select = Arc::new(select);
        base.set_async_select_certificate_callback(move |hello| {
            let check = replay_check
                .as_ref()
                .and_then(|sessions| early_data_check(hello, sessions));
            let fleet_answer = acme_challenge::fleet_answer(hello);
            let key_share = key_share_hint::request(hello, &listener_groups)
                .and_then(|request| crate::offload::key_share(request.group, &request.peer));
            let select = select.clone();
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
                    select(&mut hello, refused, key_share).map_err(|_| AsyncSelectCertError)
                });
                Ok(finish)
            }))
        });
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

    /// A connection object for a client at `client`.
    pub fn new_ssl(&self, client: IpAddr) -> anyhow::Result<Ssl> {
        let mut ssl = Ssl::new(&self.base)?;
        ssl.set_ex_data(*CLIENT_ADDRESS, client);
        failure::prepare(&mut ssl);
        Ok(ssl)
    }
}
