//! Server names: what the SNI chooses (certificate, ALPN, minimum version, backends,
//! client-certificate policy), unknown names refused, a name's backends checked against
//! the listener's, and thousands of names replaced by a reload.

use std::path::{Path, PathBuf};

use crate::common::client_pki::*;
use crate::common::config::ConfigBuilder;
use crate::common::*;

#[test]
fn unknown_sni_can_be_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (c, k) = make_cert(dir.path(), "known", "known.test", KeyType::EcdsaP256);
    let config = ConfigBuilder::new()
        .listener(|l| {
            l.port(port)
                .backend("builtin")
                .set("unknown_sni", "refuse")
                .cert(&c, &k)
        })
        .write(dir.path());
    let server = Server::start(&config);
    let out = s_client(port, &["-servername", "known.test", "-ign_eof"], GET_CLOSE);
    assert!(out.contains("Hello from tlsterm"), "{out}");
    let out = s_client(port, &["-servername", "other.test", "-ign_eof"], GET_CLOSE);
    assert!(
        !out.contains("Hello from tlsterm") && out.contains("alert"),
        "{out}"
    );
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(
        admin,
        "tlsterm_handshake_failures_total{reason=\"unknown_sni\"} 1",
    );
}

/// `[[listener.server_name]]`: backend pool, ALPN list, minimum version and client
/// certificate policy follow the SNI name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_name_settings_follow_sni() {
    let dir = tempfile::tempdir().unwrap();
    make_client_pki(dir.path());
    let api_backend = RawBackend::bind().await;
    let port = free_port();
    let config = ConfigBuilder::new()
        .listener(|l| {
            l.port(port)
                .backend("builtin")
                .set("alpn", ["http/1.1"])
                .server_name(&["api.test", "*.api.test"], |n| {
                    n.backend(api_backend.address)
                        .set("alpn", ["h2", "http/1.1"])
                        .set("min_version", "1.3")
                        .client_auth("required", &dir.path().join("ca.pem"))
                })
        })
        .write(dir.path());
    let _server = Server::start(&config);
    let p = |name: &str| dir.path().join(name).display().to_string();

    // Any other name: the listener's settings.
    let out = s_client(
        port,
        &[
            "-servername",
            "www.test",
            "-tls1_2",
            "-alpn",
            "h2,http/1.1",
            "-ign_eof",
        ],
        GET_CLOSE,
    );
    assert!(
        out.contains("ALPN protocol: http/1.1") && out.contains("Hello from tlsterm"),
        "{out}"
    );

    // api.test: TLS 1.3 only, a client certificate required, h2 preferred, its own backend.
    let out = s_client(
        port,
        &[
            "-servername",
            "api.test",
            "-tls1_2",
            "-cert",
            &p("alice.pem"),
            "-key",
            &p("alice.key"),
        ],
        "",
    );
    assert!(
        out.contains("Cipher is (NONE)") && out.contains("protocol version"),
        "TLS 1.2 refused for api.test: {out}"
    );
    let out = s_client(
        port,
        &["-servername", "x.api.test", "-tls1_3", "-ign_eof"],
        GET_CLOSE,
    );
    assert!(
        !out.contains("Hello"),
        "no client certificate, no service: {out}"
    );
    let out = to_api_backend_as_alice(
        port,
        &api_backend,
        dir.path(),
        &[
            "-servername",
            "x.api.test",
            "-tls1_3",
            "-alpn",
            "http/1.1,h2",
        ],
    )
    .await;
    assert!(out.contains("ALPN protocol: h2"), "{out}");
}

/// A name that requires client certificates cannot get around the check that its backend
/// is not also its listener's by spelling that backend otherwise: the check compares the
/// addresses the backends resolve to. Refused by `serve --check`, at start and at reload,
/// naming the lines of both lists; the served configuration stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_spelling_of_the_listener_backend_is_refused_at_start_and_at_reload() {
    let dir = tempfile::tempdir().unwrap();
    make_client_pki(dir.path());
    let app = RawBackend::bind().await;
    let admin = RawBackend::bind().await;
    let app_port = app.address.port();
    let port = free_port();
    let base = ConfigBuilder::new();
    let config_with = |name_backend: &str| {
        base.clone().listener(|l| {
            l.port(port)
                .backend(app.address)
                .server_name(&["admin.test"], |n| {
                    n.client_auth("required", Path::new("ca.pem"))
                        .backend(name_backend)
                })
        })
    };
    let lines = |text: &str| -> (usize, usize) {
        let mut at = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.starts_with("backends"))
            .map(|(i, _)| i + 1);
        (at.next().unwrap(), at.next().unwrap())
    };
    let spellings = [
        format!("localhost:{app_port}"),
        format!("127.1:{app_port}"),
        format!("127.0.0.1:0{app_port}"),
        format!("[::ffff:127.0.0.1]:{app_port}"),
    ];
    for spelling in &spellings {
        let config = config_with(spelling).write(dir.path());
        let (listener_line, name_line) = lines(&std::fs::read_to_string(&config).unwrap());
        let stderr = check_refuses(&config);
        assert!(
            stderr.contains(&format!(
                "tlsterm.toml:{name_line}: key `backends`: `{spelling}`"
            )) && stderr.contains(&format!("of the listener (line {listener_line})")),
            "{spelling}: {stderr}"
        );
        let start = std::process::Command::new(TLSTERM)
            .args(["serve", "-c"])
            .arg(&config)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&start.stderr);
        assert!(
            !start.status.success() && stderr.contains(&format!("tlsterm.toml:{name_line}")),
            "{spelling} at start: {stderr}"
        );
    }

    let config = config_with(&admin.address.to_string()).write(dir.path());
    let server = Server::start(&config);
    let good = std::fs::read_to_string(&config).unwrap();
    for spelling in &spellings {
        let bad = good.replace(&admin.address.to_string(), spelling);
        std::fs::write(&config, &bad).unwrap();
        let (listener_line, name_line) = lines(&bad);
        let verdict = tokio::task::block_in_place(|| server.reload());
        assert!(
            verdict.contains("reload refused")
                && verdict.contains(&format!("tlsterm.toml:{name_line}: key `backends`"))
                && verdict.contains(&format!("(line {listener_line})")),
            "{spelling}: {verdict}"
        );
    }
    // Refused where the listener's backends are resolved and compared.
    wait_for_metric(
        base.admin_address(),
        &format!(
            "tlsterm_reloads_total{{outcome=\"listeners\"}} {}",
            spellings.len()
        ),
    );
    // Still the name's own backend, and still only with a certificate.
    let out = s_client(port, &["-servername", "admin.test", "-ign_eof"], GET_CLOSE);
    assert!(out.contains("alert"), "without a certificate: {out}");
    to_api_backend_as_alice(port, &admin, dir.path(), &["-servername", "admin.test"]).await;
}

/// Writes a self-signed ECDSA certificate for `name` (all share one key: generating keys is
/// not what is tested) and returns its path.
fn cert_file(dir: &Path, key: &boring::pkey::PKey<boring::pkey::Private>, name: &str) -> PathBuf {
    use boring::x509::{extension::SubjectAlternativeName, X509NameBuilder};
    let mut subject = X509NameBuilder::new().unwrap();
    subject
        .append_entry_by_nid(boring::nid::Nid::COMMONNAME, name)
        .unwrap();
    let subject = subject.build();
    let mut builder = boring::x509::X509::builder().unwrap();
    builder.set_version(2).unwrap();
    let mut serial = boring::bn::BigNum::new().unwrap();
    serial
        .rand(64, boring::bn::MsbOption::MAYBE_ZERO, false)
        .unwrap();
    builder
        .set_serial_number(&serial.to_asn1_integer().unwrap())
        .unwrap();
    builder.set_subject_name(&subject).unwrap();
    builder.set_issuer_name(&subject).unwrap();
    builder.set_pubkey(key).unwrap();
    let (start, end) = (
        boring::asn1::Asn1Time::days_from_now(0).unwrap(),
        boring::asn1::Asn1Time::days_from_now(2).unwrap(),
    );
    builder.set_not_before(&start).unwrap();
    builder.set_not_after(&end).unwrap();
    let san = SubjectAlternativeName::new()
        .dns(name)
        .build(&builder.x509v3_context(None, None))
        .unwrap();
    builder.append_extension(&san).unwrap();
    builder
        .sign(key, boring::hash::MessageDigest::sha256())
        .unwrap();
    let cert = dir.join(format!("{name}.pem"));
    std::fs::write(&cert, builder.build().to_pem().unwrap()).unwrap();
    cert
}

fn peer_name(stream: &TlsClient) -> String {
    let cert = stream.ssl().peer_certificate().unwrap();
    let cn = cert
        .subject_name()
        .entries_by_nid(boring::nid::Nid::COMMONNAME)
        .next()
        .unwrap();
    cn.data().as_utf8().unwrap().to_string()
}

/// Thousands of certificates: added, replaced and removed by a reload while established
/// connections keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_of_a_large_certificate_set_keeps_connections() {
    use boring::ssl::SslVersion;
    let dir = tempfile::tempdir().unwrap();
    let group = boring::ec::EcGroup::from_curve_name(boring::nid::Nid::X9_62_PRIME256V1).unwrap();
    let key =
        boring::pkey::PKey::from_ec_key(boring::ec::EcKey::generate(&group).unwrap()).unwrap();
    std::fs::write(
        dir.path().join("key.pem"),
        key.private_key_to_pem_pkcs8().unwrap(),
    )
    .unwrap();
    let port = free_port();
    let base = ConfigBuilder::new();
    let serving = |range: std::ops::Range<usize>| {
        base.clone().listener(|mut l| {
            l = l.port(port).backend("builtin");
            for i in range {
                let cert = cert_file(dir.path(), &key, &format!("site{i}.test"));
                l = l.certificate(|c| c.set("cert", &cert).set("key", "key.pem"));
            }
            l
        })
    };
    let config = serving(0..2000).write(dir.path());
    let server = Server::start(&config);

    let mut established = Vec::new();
    for name in [
        "site1.test",
        "site999.test",
        "site1500.test",
        "site1999.test",
    ] {
        let stream = tls_connect(port, name, SslVersion::TLS1_3, &[])
            .await
            .unwrap();
        assert_eq!(peer_name(&stream), name);
        established.push(stream);
    }

    // Drop site0..999, keep 1000..1999 (rewritten: new serials), add 2000..2999.
    let admin = base.admin_address();
    serving(1000..3000).write(dir.path());
    assert!(server.reload().contains("reloaded"));

    for stream in &mut established {
        assert_eq!(
            http_get(stream, "/bytes/100").await.unwrap().len(),
            100,
            "established connection survives"
        );
    }
    let added = tls_connect(port, "site2500.test", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    assert_eq!(peer_name(&added), "site2500.test");
    let removed = tls_connect(port, "site10.test", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    assert_eq!(
        peer_name(&removed),
        "site1000.test",
        "a removed name gets the default (first) certificate"
    );
    assert_eq!(admin_get(admin, "/healthz").0, 200);
}
