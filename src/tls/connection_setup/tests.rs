//! Each step of the connection setup on real BoringSSL connections; the staple and the
//! 0-RTT refusal through a real handshake over a socket pair, since BoringSSL shows them
//! only on the wire.

use std::time::{Duration, SystemTime};

use boring::nid::Nid;
use boring::ssl::{
    Ssl, SslContext, SslContextBuilder, SslMethod, SslVerifyMode, SslVersion, StatusType,
};

use super::*;
use crate::config::UnknownSni;
use crate::offload::KeyKind;
use crate::testing::over_socket_pair;
use crate::tls::crl::ClientTrust;
use crate::tls::names::NameTable;
use crate::tls::profile::{session_context, Profile};
use crate::tls::select::FileStaple;
use crate::tls::selfsigned::{generate, SelfSignedKey};

const STAPLE: &[u8] = b"an OCSP response, opaque to the client";

/// A context with a real certificate and key, accepting 0-RTT like a listener with
/// `early_data = true`.
fn certificate_context(file_ocsp: Option<FileStaple>) -> CertContext {
    let (cert, key) = generate(SelfSignedKey::EcdsaP256).unwrap();
    let mut builder = SslContextBuilder::new(SslMethod::tls()).unwrap();
    builder.set_certificate(&cert).unwrap();
    builder.set_private_key(&key).unwrap();
    crate::sys::enable_early_data(&mut builder);
    CertContext {
        ctx: builder.build(),
        kind: KeyKind::Ecdsa {
            curve: Nid::X9_62_PRIME256V1,
        },
        ecdsa_suites: Vec::new(),
        fetched_ocsp: None,
        file_ocsp,
    }
}

fn base_context() -> SslContext {
    SslContextBuilder::new(SslMethod::tls()).unwrap().build()
}

fn profile(
    min_version: Option<SslVersion>,
    verify: Option<(SslVerifyMode, Option<ClientTrust>)>,
) -> Profile {
    Profile {
        alpn: Vec::new(),
        min_version,
        verify,
        ca_names: None,
        sid_ctx: session_context(&[], SslVerifyMode::NONE, None),
    }
}

/// The listener's profile and one for `strict.test`.
fn setup_with(strict: Profile) -> ConnectionSetup {
    let mut names = NameTable::new();
    *names.entry("strict.test") = 1;
    ConnectionSetup {
        selector: CertSelector {
            certs: Vec::new(),
            names: NameTable::new(),
            default: Vec::new(),
            tls13_enabled: true,
            unknown_sni: UnknownSni::Default,
            host_names_only: false,
        },
        profiles: Arc::new(Profiles {
            names,
            list: vec![profile(None, None), strict],
            client_store: None,
        }),
        chacha_first: None,
        has_ech_keys: false,
    }
}

/// A server connection whose client sent `sni` (as BoringSSL reports it to the callback).
fn connection(sni: Option<&str>) -> Ssl {
    let mut ssl = Ssl::new(&base_context()).unwrap();
    if let Some(sni) = sni {
        ssl.set_hostname(sni).unwrap();
    }
    ssl
}

/// A client trust store holding one self-signed CA, written to a file as `client_ca` is.
fn client_trust() -> ClientTrust {
    let (ca, _) = generate(SelfSignedKey::EcdsaP256).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), ca.to_pem().unwrap()).unwrap();
    ClientTrust::load(file.path(), None, crate::config::CrlCheck::Leaf).unwrap()
}

#[test]
fn a_name_with_its_own_minimum_version_raises_it_on_its_connections_only() {
    let setup = setup_with(profile(Some(SslVersion::TLS1_3), None));
    let mut strict = connection(Some("strict.test"));
    setup.apply_name_settings(&mut strict).unwrap();
    assert_eq!(strict.min_proto_version(), Some(SslVersion::TLS1_3));

    let mut other = connection(Some("other.test"));
    let before = other.min_proto_version();
    setup.apply_name_settings(&mut other).unwrap();
    assert_eq!(
        other.min_proto_version(),
        before,
        "the listener's range stays"
    );
}

#[test]
fn a_name_requiring_client_certificates_asks_for_them_on_its_connections_only() {
    let required = SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT;
    let setup = setup_with(profile(None, Some((required, Some(client_trust())))));
    let mut strict = connection(Some("STRICT.test."));
    setup.apply_name_settings(&mut strict).unwrap();
    assert_eq!(strict.verify_mode(), required);

    let mut other = connection(None);
    setup.apply_name_settings(&mut other).unwrap();
    assert_eq!(other.verify_mode(), SslVerifyMode::NONE);
}

#[test]
fn a_name_turning_client_certificates_off_overrides_the_context() {
    let setup = setup_with(profile(None, Some((SslVerifyMode::NONE, None))));
    let mut ssl = connection(Some("strict.test"));
    ssl.set_verify(SslVerifyMode::PEER);
    setup.apply_name_settings(&mut ssl).unwrap();
    assert_eq!(ssl.verify_mode(), SslVerifyMode::NONE);
}

/// Runs a TLS 1.3 handshake of `server` with a client that asks for an OCSP staple;
/// returns the staple the client got and BoringSSL's 0-RTT verdict on the server.
fn handshake(server: Ssl) -> (Option<Vec<u8>>, boring_sys::ssl_early_data_reason_t) {
    over_socket_pair(
        |client_socket| {
            let mut ctx = SslContextBuilder::new(SslMethod::tls()).unwrap();
            ctx.set_verify(SslVerifyMode::NONE);
            let mut ssl = Ssl::new(&ctx.build()).unwrap();
            ssl.set_status_type(StatusType::OCSP).unwrap();
            let stream = ssl.connect(client_socket).expect("client handshake");
            stream.ssl().ocsp_status().map(<[u8]>::to_vec)
        },
        |server_socket| {
            let stream = server.accept(server_socket).expect("server handshake");
            crate::sys::early_data_reason(stream.ssl()).0
        },
    )
}

#[test]
fn the_switch_staples_the_certificate_s_response_when_the_client_asks() {
    let chosen = certificate_context(Some(FileStaple {
        der: STAPLE.to_vec(),
        expires: None,
    }));
    let mut ssl = connection(None);
    switch_to_certificate(&mut ssl, &chosen, true, false).unwrap();
    let (staple, _) = handshake(ssl);
    assert_eq!(staple.as_deref(), Some(STAPLE));

    let mut ssl = connection(None);
    switch_to_certificate(&mut ssl, &chosen, false, false).unwrap();
    assert_eq!(handshake(ssl).0, None, "not asked for");
}

#[test]
fn an_expired_file_response_is_not_stapled() {
    let chosen = certificate_context(Some(FileStaple {
        der: STAPLE.to_vec(),
        expires: Some(SystemTime::now() - Duration::from_secs(1)),
    }));
    let mut ssl = connection(None);
    switch_to_certificate(&mut ssl, &chosen, true, false).unwrap();
    assert_eq!(handshake(ssl).0, None);
}

#[test]
fn a_refused_replay_check_turns_0rtt_off_after_the_switch() {
    // The chosen context accepts 0-RTT; the refusal must survive the switch to it.
    let chosen = certificate_context(None);
    let mut ssl = connection(None);
    switch_to_certificate(&mut ssl, &chosen, false, true).unwrap();
    let (_, reason) = handshake(ssl);
    assert_eq!(
        reason,
        boring_sys::ssl_early_data_reason_t::ssl_early_data_disabled
    );

    let mut ssl = connection(None);
    switch_to_certificate(&mut ssl, &chosen, false, false).unwrap();
    let (_, reason) = handshake(ssl);
    assert_eq!(
        reason,
        boring_sys::ssl_early_data_reason_t::ssl_early_data_no_session_offered,
        "allowed, and only not offered"
    );
}

#[test]
fn a_certificate_without_a_response_staples_nothing() {
    let chosen = certificate_context(None);
    let mut ssl = connection(None);
    switch_to_certificate(&mut ssl, &chosen, true, false).unwrap();
    assert_eq!(handshake(ssl).0, None);
}

#[test]
fn tls13_suites_are_reordered_only_for_a_client_preferring_chacha_where_allowed() {
    let mut setup = setup_with(profile(None, None));
    let mut ssl = connection(None);
    let chacha = HelloFacts {
        prefers_chacha: true,
        ..HelloFacts::default()
    };
    // Without a client's-choice entry there is nothing to reorder, whatever the client.
    setup.order_tls13_suites(&mut ssl, chacha).unwrap();
    let entries = ["TLS_AES_128_GCM_SHA256|TLS_CHACHA20_POLY1305_SHA256".to_string()];
    setup.chacha_first = Tls13Order::parse(&entries).unwrap().chacha_first();
    assert!(setup.chacha_first.is_some());
    setup.order_tls13_suites(&mut ssl, chacha).unwrap();
    setup
        .order_tls13_suites(&mut ssl, HelloFacts::default())
        .unwrap();
}

#[test]
fn a_connection_offering_ech_is_marked() {
    let setup = setup_with(profile(None, None));
    let mut ssl = connection(None);
    setup.note_ech(&mut ssl, HelloFacts::default());
    assert!(ssl.ex_data(*ECH_OFFERED).is_none());
    let offers = HelloFacts {
        offers_ech: true,
        ..HelloFacts::default()
    };
    setup.note_ech(&mut ssl, offers);
    assert_eq!(ssl.ex_data(*ECH_OFFERED), Some(&true));
}
