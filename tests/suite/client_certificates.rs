//! Client certificates (mTLS): required, optional and per-name policies, the verified
//! identity passed to the backend in PROXY v2 TLVs, revocation lists, the CA names
//! advertised, and sessions that do not cross policies.

use std::path::Path;
use std::process::Command;

use crate::common::client_pki::*;
use crate::common::config::ConfigBuilder;
use crate::common::*;
use tlsterm::proxy::proxy_protocol::{
    self, PP2_SUBTYPE_SSL_CN, PP2_TYPE_AUTHORITY, PP2_TYPE_TLSTERM_CLIENT_POLICY,
    PP2_TYPE_TLSTERM_CLIENT_SAN, PP2_TYPE_TLSTERM_CLIENT_SHA256, PP2_TYPE_TLSTERM_CLIENT_SUBJECT,
};
use tokio::io::AsyncReadExt;

/// A client PKI, a raw backend, and a tlsterm sending PROXY v2 to it with `client_auth`.
async fn mtls_server(client_auth: &str) -> (tempfile::TempDir, RawBackend, Server, u16) {
    let dir = tempfile::tempdir().unwrap();
    make_client_pki(dir.path());
    let backend = RawBackend::bind().await;
    let port = free_port();
    let config = ConfigBuilder::new().listener(|l| {
        l.port(port)
            .backend(backend.address)
            .proxy_v2()
            .client_auth(client_auth, &dir.path().join("ca.pem"))
    });
    let server = Server::start(&config.write(dir.path()));
    (dir, backend, server, port)
}

/// Reads the PROXY header the backend receives for one s_client connection.
async fn header_for(
    backend: &RawBackend,
    port: u16,
    args: Vec<String>,
) -> (proxy_protocol::ProxyHeader, String) {
    let s_client = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        s_client(port, &args, "x")
    });
    let mut upstream = backend.accept().await;
    let (header, _) = read_header(&mut upstream).await;
    drop(upstream);
    (header, s_client.await.unwrap())
}

/// Reads the PROXY header of a backend connection; returns it and the bytes after it.
async fn read_header(
    upstream: &mut tokio::net::TcpStream,
) -> (proxy_protocol::ProxyHeader, Vec<u8>) {
    let mut received = Vec::new();
    loop {
        let mut chunk = [0u8; 2048];
        let n = tokio::time::timeout(DEADLINE, upstream.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "backend connection closed before the header");
        received.extend_from_slice(&chunk[..n]);
        if let Ok((header, used)) = proxy_protocol::decode(&received) {
            return (header, received[used..].to_vec());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_client_certificate_is_enforced_and_identity_reaches_the_backend() {
    let (dir, backend, _server, port) = mtls_server("required").await;
    let p = |name: &str| dir.path().join(name).display().to_string();

    let args = vec![
        "-cert".into(),
        p("alice.pem"),
        "-key".into(),
        p("alice.key"),
        "-ign_eof".into(),
    ];
    let (header, out) = header_for(&backend, port, args).await;
    assert!(
        out.contains("Verify return code") || out.contains("CONNECTED"),
        "{out}"
    );
    let ssl = header.ssl().expect("SSL TLV");
    assert_eq!(
        ssl.client & 0x07,
        0x07,
        "PP2_CLIENT_SSL | PP2_CLIENT_CERT_CONN | PP2_CLIENT_CERT_SESS (a full handshake)"
    );
    assert_eq!(ssl.verify, 0, "verified");
    assert_eq!(ssl.get(PP2_SUBTYPE_SSL_CN), Some(&b"alice"[..]));
    assert_eq!(
        header.tlv(PP2_TYPE_TLSTERM_CLIENT_SUBJECT),
        Some(&b"O=Example,CN=alice"[..])
    );
    let san: Vec<&[u8]> = header.all_tlvs(PP2_TYPE_TLSTERM_CLIENT_SAN).collect();
    assert_eq!(
        san,
        [&b"email:alice@example.test"[..], b"DNS:alice.example.test"]
    );
    let fingerprint = run(Command::new("openssl").args([
        "x509",
        "-noout",
        "-fingerprint",
        "-sha256",
        "-in",
        &p("alice.pem"),
    ]));
    let expected = String::from_utf8_lossy(&fingerprint.stdout)
        .split('=')
        .nth(1)
        .unwrap()
        .trim()
        .replace(':', "")
        .to_lowercase();
    assert_eq!(
        header.tlv(PP2_TYPE_TLSTERM_CLIENT_SHA256),
        Some(expected.as_bytes())
    );

    // No certificate, or one from an untrusted CA: refused, and the backend never hears of it.
    let cases: [Vec<String>; 2] = [
        vec![],
        vec![
            "-cert".to_string(),
            p("mallory.pem"),
            "-key".to_string(),
            p("mallory.key"),
        ],
    ];
    for args in cases {
        let mut all = vec!["-tls1_3", "-ign_eof"];
        all.extend(args.iter().map(String::as_str));
        let out = s_client(port, &all, GET_CLOSE);
        assert!(
            out.contains("alert") || out.contains("error"),
            "handshake refused: {out}"
        );
        assert!(!out.contains("Hello"), "{out}");
    }
    assert!(
        tokio::time::timeout(
            std::time::Duration::from_millis(200),
            backend.listener.accept()
        )
        .await
        .is_err(),
        "no backend connection for refused clients"
    );
}

/// What a certificate holder puts in its names reaches the backend as data, never as
/// more names or attributes: a URI with ",DNS:" in it stays one URI, a CN with ",O=" stays
/// one CN (RFC 4514 escaping).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_tlvs_cannot_be_forged_with_commas() {
    let (dir, backend, _server, port) = mtls_server("required").await;
    make_leaf(
        dir.path(),
        "eve",
        "/CN=eve,O=Admin/O=Example",
        "subjectAltName=@names\n[names]\nURI.1=https://x,DNS:admin.internal\nDNS.1=eve.test",
    );
    let p = |name: &str| dir.path().join(name).display().to_string();
    let args = vec![
        "-cert".into(),
        p("eve.pem"),
        "-key".into(),
        p("eve.key"),
        "-ign_eof".into(),
    ];
    let (header, out) = header_for(&backend, port, args).await;
    let san: Vec<&[u8]> = header.all_tlvs(PP2_TYPE_TLSTERM_CLIENT_SAN).collect();
    assert_eq!(
        san,
        [&b"URI:https://x,DNS:admin.internal"[..], b"DNS:eve.test"],
        "{out}"
    );
    assert_eq!(
        header.tlv(PP2_TYPE_TLSTERM_CLIENT_SUBJECT),
        Some(&br"O=Example,CN=eve\,O=Admin"[..])
    );
    assert_eq!(
        header.tlv(proxy_protocol::PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_client_certificate() {
    let (_dir, backend, _server, port) = mtls_server("optional").await;
    let (header, _) = header_for(&backend, port, vec!["-ign_eof".into()]).await;
    let ssl = header.ssl().unwrap();
    assert_eq!(ssl.client & 0x02, 0, "no client certificate");
    assert_ne!(ssl.verify, 0);
    assert!(header.tlv(PP2_TYPE_TLSTERM_CLIENT_SUBJECT).is_none());
}

/// A name that asks for client certificates cannot be reached without one: a name without
/// backends of its own (whose backend a client sending another name, or none, would reach
/// under the listener's policy) is a configuration error naming its line, and the name
/// written fully qualified ("api.test.") is the same name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_requiring_client_certificates_is_not_reached_without_one() {
    let dir = tempfile::tempdir().unwrap();
    make_client_pki(dir.path());
    let api_backend = RawBackend::bind().await;
    let port = free_port();
    let config_with = |own_backend: Option<std::net::SocketAddr>| {
        ConfigBuilder::new().listener(|l| {
            l.port(port)
                .backend("builtin")
                .server_name(&["api.test"], |n| {
                    let n = n.client_auth("required", Path::new("ca.pem"));
                    match own_backend {
                        Some(backend) => n.backend(backend),
                        None => n,
                    }
                })
        })
    };
    let config = config_with(None).write(dir.path());
    let text = std::fs::read_to_string(&config).unwrap();
    let line = 1 + text.lines().position(|l| l.starts_with("names")).unwrap();
    let stderr = check_refuses(&config);
    assert!(
        stderr.contains(&format!("tlsterm.toml:{line}: key `backends`")),
        "{stderr}"
    );

    let own = config_with(Some(api_backend.address)).write(dir.path());
    let _server = Server::start(&own);
    for sni in ["api.test.", "API.Test."] {
        let out = s_client(port, &["-servername", sni, "-ign_eof"], GET_CLOSE);
        assert!(
            !out.contains("Hello") && out.contains("alert"),
            "{sni} without a certificate: {out}"
        );
    }
    to_api_backend_as_alice(
        port,
        &api_backend,
        dir.path(),
        &["-servername", "api.test."],
    )
    .await;
}

/// With PROXY v2 a backend may serve the listener's client-certificate policy and a
/// name's stricter one, and then tells them apart by what the header says. An SNI that is
/// not a host name (`admin.test..`, a trailing space), which would get the listener's
/// policy while the backend reads the protected name in it, is refused; the AUTHORITY TLV
/// carries the name as it selected the policy (lower case, no trailing dot); and the
/// client-policy TLV (0xE5) names the policy that verified the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_is_told_the_name_and_the_policy_that_verified_the_client() {
    let dir = tempfile::tempdir().unwrap();
    make_client_pki(dir.path());
    let backend = RawBackend::bind().await;
    let port = free_port();
    let config = ConfigBuilder::new().listener(|l| {
        l.port(port)
            .backend(backend.address)
            .proxy_v2()
            .server_name(&["Admin.test", "admin2.test"], |n| {
                n.client_auth("required", Path::new("ca.pem"))
                    .backend(backend.address)
            })
    });
    let _server = Server::start(&config.write(dir.path()));
    let p = |name: &str| dir.path().join(name).display().to_string();
    let alice = |sni: &str| -> Vec<String> {
        [
            "-servername",
            sni,
            "-cert",
            &p("alice.pem"),
            "-key",
            &p("alice.key"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    for sni in ["admin.test..", "ADMIN.test..", "admin.test ", "admin..test"] {
        let args = alice(sni);
        let out = tokio::task::block_in_place(|| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            s_client(port, &args, GET_CLOSE)
        });
        assert!(out.contains("alert"), "{sni:?} is refused: {out}");
    }
    // The first connection the backend sees is this one: none of the above reached it.
    let (header, out) = header_for(&backend, port, alice("ADMIN.Test.")).await;
    assert!(
        out.contains("Verify return code: ") || out.contains("CONNECTED"),
        "{out}"
    );
    assert_eq!(header.tlv(PP2_TYPE_AUTHORITY), Some(&b"admin.test"[..]));
    assert_eq!(
        header.tlv(PP2_TYPE_TLSTERM_CLIENT_POLICY),
        Some(&b"admin.test"[..])
    );
    assert!(header.tlv(PP2_TYPE_TLSTERM_CLIENT_SHA256).is_some());
    // Another name, and none: the listener's policy, named by an empty value.
    let (header, _) = header_for(
        &backend,
        port,
        vec!["-servername".into(), "other.test".into()],
    )
    .await;
    assert_eq!(header.tlv(PP2_TYPE_AUTHORITY), Some(&b"other.test"[..]));
    assert_eq!(header.tlv(PP2_TYPE_TLSTERM_CLIENT_POLICY), Some(&b""[..]));
    let (header, _) = header_for(&backend, port, vec!["-noservername".into()]).await;
    assert_eq!(header.tlv(PP2_TYPE_AUTHORITY), None);
    assert_eq!(header.tlv(PP2_TYPE_TLSTERM_CLIENT_POLICY), Some(&b""[..]));
}

/// A session made under one client-certificate policy is not resumed under another: not on
/// a name that requires a certificate, and not after a reload changes the CA.
#[test]
fn sessions_do_not_cross_client_certificate_policies() {
    let dir = tempfile::tempdir().unwrap();
    make_client_pki(dir.path());
    let port = free_port();
    let base = ConfigBuilder::new();
    let trusting = |ca: &Path| {
        base.clone().listener(|l| {
            l.port(port)
                .backend("builtin")
                .proxy_v2()
                .server_name(&["secure.test"], |n| {
                    n.client_auth("required", ca).backend("builtin")
                })
        })
    };
    let config = trusting(&dir.path().join("ca.pem")).write(dir.path());
    let server = Server::start(&config);
    let p = |name: &str| dir.path().join(name).display().to_string();
    let session = p("open.session");
    let resume = |sni: &str, extra: &[&str]| {
        let mut args = vec![
            "-servername",
            sni,
            "-tls1_3",
            "-sess_in",
            &session,
            "-ign_eof",
        ];
        args.extend_from_slice(extra);
        s_client(port, &args, GET_CLOSE)
    };

    // A session from a name without client certificates...
    let out = s_client(
        port,
        &[
            "-servername",
            "open.test",
            "-tls1_3",
            "-sess_out",
            &session,
            "-ign_eof",
        ],
        GET_CLOSE,
    );
    assert!(out.contains("Hello from tlsterm"), "{out}");
    assert!(resume("open.test", &[]).contains("Reused, TLSv1.3"));
    // ...does not open secure.test, which asks for a certificate: a full handshake, refused.
    let out = resume("secure.test", &[]);
    assert!(!out.contains("Reused") && !out.contains("Hello"), "{out}");

    // A session made on secure.test with alice's certificate...
    let alice = ["-cert", &p("alice.pem"), "-key", &p("alice.key")];
    let mut args = vec![
        "-servername",
        "secure.test",
        "-tls1_3",
        "-sess_out",
        &session,
    ];
    args.extend_from_slice(&alice);
    args.push("-ign_eof");
    assert!(s_client(port, &args, GET_CLOSE).contains("Hello from tlsterm"));
    assert!(resume("secure.test", &[]).contains("Reused, TLSv1.3"));
    // ...is not resumed once a reload trusts another CA.
    trusting(&dir.path().join("untrusted/ca.pem")).write(dir.path());
    assert!(server.reload().contains("reloaded"));
    let out = resume("secure.test", &[]);
    assert!(!out.contains("Reused") && !out.contains("Hello"), "{out}");
}

/// The CA names s_client printed under "Acceptable client certificate CA names".
fn acceptable_ca_names(out: &str) -> Vec<&str> {
    out.lines()
        .skip_while(|line| !line.starts_with("Acceptable client certificate CA names"))
        .skip(1)
        .take_while(|line| line.starts_with("CN") || line.starts_with("O "))
        .collect()
}

/// A name with its own `client_ca` advertises its own CAs in the CertificateRequest, not the
/// listener's: clients that pick their certificate by the advertised names (browsers, Go)
/// would otherwise send none, or the wrong one. Other names keep the listener's CAs.
#[test]
fn a_name_advertises_its_own_client_cas() {
    let dir = tempfile::tempdir().unwrap();
    make_client_pki(dir.path());
    let port = free_port();
    let p = |name: &str| dir.path().join(name).display().to_string();
    let config = ConfigBuilder::new().listener(|l| {
        l.port(port)
            .backend("builtin")
            .proxy_v2()
            .client_auth("required", &dir.path().join("ca.pem"))
            .server_name(&["partner.test"], |n| {
                n.client_auth("required", &dir.path().join("untrusted/ca.pem"))
                    .backend("builtin")
            })
    });
    let _server = Server::start(&config.write(dir.path()));
    let connect = |sni: &str, stem: &str| {
        let (cert, key) = (p(&format!("{stem}.pem")), p(&format!("{stem}.key")));
        let args = [
            "-servername",
            sni,
            "-tls1_3",
            "-cert",
            &cert,
            "-key",
            &key,
            "-ign_eof",
        ];
        s_client(port, &args, GET_CLOSE)
    };

    // partner.test trusts the "Untrusted CA" (mallory's issuer) and names only it.
    let out = connect("partner.test", "mallory");
    assert!(out.contains("Hello from tlsterm"), "{out}");
    assert_eq!(
        acceptable_ca_names(&out),
        ["CN = Untrusted CA"],
        "partner.test: {out}"
    );
    // Any other name: the listener's CA.
    let out = connect("www.test", "alice");
    assert!(out.contains("Hello from tlsterm"), "{out}");
    assert_eq!(
        acceptable_ca_names(&out),
        ["CN = Test Client CA"],
        "www.test: {out}"
    );
}

/// An `openssl ca` database for the CA in `dir`, so that tests can revoke its certificates.
fn crl_authority(dir: &Path) {
    let p = |name: &str| dir.join(name).display().to_string();
    std::fs::write(dir.join("index.txt"), "").unwrap();
    std::fs::write(
        dir.join("ca.cnf"),
        format!(
            "[ca]\ndefault_ca = test\n[test]\ndatabase = {}\ncertificate = {}\nprivate_key = {}\ndefault_md = sha256\n",
            p("index.txt"),
            p("ca.pem"),
            p("ca.key")
        ),
    )
    .unwrap();
}

/// Revokes `<stem>.pem` (when given) and writes the CA's CRL to `out` with `validity` options.
fn publish_crl(dir: &Path, revoke: Option<&str>, out: &str, validity: &[&str]) {
    let p = |name: &str| dir.join(name).display().to_string();
    if let Some(stem) = revoke {
        run(Command::new("openssl").args([
            "ca",
            "-config",
            &p("ca.cnf"),
            "-revoke",
            &p(&format!("{stem}.pem")),
        ]));
    }
    run(Command::new("openssl")
        .args(["ca", "-config", &p("ca.cnf"), "-gencrl", "-out", &p(out)])
        .args(validity));
}

/// An in-process client presenting `<stem>.pem`; keeps the last session it was given.
struct CertClient {
    connector: boring::ssl::SslConnector,
    session: std::sync::Arc<std::sync::Mutex<Option<boring::ssl::SslSession>>>,
}

impl CertClient {
    fn new(dir: &Path, stem: &str) -> CertClient {
        use boring::ssl::{SslFiletype, SslSessionCacheMode, SslVerifyMode};
        let mut builder =
            boring::ssl::SslConnector::builder(boring::ssl::SslMethod::tls()).unwrap();
        builder.set_verify(SslVerifyMode::NONE);
        let file = |ext: &str| dir.join(format!("{stem}.{ext}"));
        builder
            .set_certificate_file(file("pem"), SslFiletype::PEM)
            .unwrap();
        builder
            .set_private_key_file(file("key"), SslFiletype::PEM)
            .unwrap();
        builder.set_session_cache_mode(SslSessionCacheMode::CLIENT);
        let session: std::sync::Arc<std::sync::Mutex<_>> = std::sync::Arc::default();
        let slot = std::sync::Arc::clone(&session);
        builder.set_new_session_callback(move |_, new| *slot.lock().unwrap() = Some(new));
        CertClient {
            connector: builder.build(),
            session,
        }
    }

    async fn connect(
        &self,
        port: u16,
        offer: Option<&boring::ssl::SslSession>,
    ) -> anyhow::Result<TlsClient> {
        let mut config = self.connector.configure()?;
        if let Some(session) = offer {
            // SAFETY: the session comes from this client's connector.
            unsafe { config.set_session(session)? };
        }
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let stream =
            tokio::time::timeout(DEADLINE, tokio_boring::connect(config, "localhost", tcp));
        Ok(stream.await??)
    }

    /// Whether the server refuses this client: in TLS 1.3 the client's certificate is
    /// judged after the client's handshake ends, so the refusal comes with the first read.
    async fn refused(&self, port: u16, offer: Option<&boring::ssl::SslSession>) -> bool {
        use tokio::io::AsyncWriteExt;
        let Ok(mut stream) = self.connect(port, offer).await else {
            return true;
        };
        assert!(!stream.ssl().session_reused(), "a session was resumed");
        let _ = stream.write_all(b"x").await;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(DEADLINE, stream.read(&mut byte)).await;
        !matches!(read.expect("refusal or data"), Ok(1))
    }
}

/// The client certificate's CN in a backend's PROXY header.
fn client_cn(header: &proxy_protocol::ProxyHeader) -> String {
    let ssl = header.ssl().expect("SSL TLV");
    String::from_utf8_lossy(ssl.get(PP2_SUBTYPE_SSL_CN).unwrap_or_default()).to_string()
}

/// `client_crl`: revoked client certificates are refused (required and optional auth), the
/// others pass; a reload with a new CRL refuses newly revoked clients, even ones offering a
/// session from before, and keeps established connections; an expired CRL refuses everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_checked_against_the_crl() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_client_pki(d);
    make_leaf(d, "bob", "/CN=bob", "subjectAltName=DNS:bob.test");
    make_leaf(d, "carol", "/CN=carol", "subjectAltName=DNS:carol.test");
    crl_authority(d);
    publish_crl(d, Some("alice"), "revoked.pem", &["-crldays", "1"]);
    let backend = RawBackend::bind().await;
    let port = free_port();
    let config = ConfigBuilder::new().listener(|l| {
        l.port(port)
            .backend(backend.address)
            .proxy_v2()
            .client_auth("required", Path::new("ca.pem"))
            .set("client_crl", "revoked.pem")
            .server_name(&["optional.test"], |n| {
                n.set("client_auth", "optional").backend(backend.address)
            })
            .server_name(&["chain.test"], |n| {
                n.set("client_crl_check", "chain").backend(backend.address)
            })
    });
    let server = Server::start(&config.write(d));
    let admin = admin_address(&server.config).unwrap();
    let p = |name: &str| d.join(name).display().to_string();
    let cert_args = |stem: &str| -> Vec<String> {
        let args = ["-cert", &p(&format!("{stem}.pem")), "-key"];
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.extend([p(&format!("{stem}.key")), "-ign_eof".into()]);
        args
    };
    let refused_by_s_client = |stem: &str, sni: &str| {
        let mut args = cert_args(stem);
        args.extend(["-servername".into(), sni.into(), "-tls1_3".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = s_client(port, &args, GET_CLOSE);
        out.contains("alert") && out.contains("certificate revoked")
    };

    assert!(
        refused_by_s_client("alice", "localhost"),
        "revoked, required"
    );
    assert!(
        refused_by_s_client("alice", "optional.test"),
        "revoked, optional"
    );
    // Bob is the first client the backend hears of: Alice never reached it.
    let (header, _) = header_for(&backend, port, cert_args("bob")).await;
    assert_eq!(client_cn(&header), "bob");
    wait_for_metric(
        admin,
        "tlsterm_handshake_failures_total{reason=\"client_cert_revoked\"} 2",
    );

    // An established connection of Bob's, with a session he could resume.
    let bob = CertClient::new(d, "bob");
    let mut established = bob.connect(port, None).await.unwrap();
    let mut upstream = backend.accept().await;
    established.write_all(b"ping").await.unwrap();
    let (header, mut rest) = read_header(&mut upstream).await;
    assert_eq!(client_cn(&header), "bob");
    let mut tail = vec![0u8; 4 - rest.len()];
    upstream.read_exact(&mut tail).await.unwrap();
    rest.extend(tail);
    assert_eq!(rest, b"ping");
    upstream.write_all(b"pong").await.unwrap();
    let mut pong = [0u8; 4];
    established.read_exact(&mut pong).await.unwrap();
    let session = bob
        .session
        .lock()
        .unwrap()
        .take()
        .expect("a session ticket");

    // Bob revoked too: new handshakes refused, resumption included; Bob's open connection lives.
    publish_crl(d, Some("bob"), "revoked.pem", &["-crldays", "1"]);
    assert!(server.reload().contains("reloaded"));
    assert!(refused_by_s_client("bob", "localhost"));
    // The same CRL in DER is read as well (the file name does not matter).
    run(Command::new("openssl").args([
        "crl",
        "-in",
        &p("revoked.pem"),
        "-outform",
        "DER",
        "-out",
        &p("revoked.der"),
    ]));
    std::fs::rename(d.join("revoked.der"), d.join("revoked.pem")).unwrap();
    assert!(server.reload().contains("reloaded"));
    assert!(refused_by_s_client("bob", "localhost"), "revoked, DER CRL");
    assert!(
        bob.refused(port, Some(&session)).await,
        "resumed after revocation"
    );
    established.write_all(b"still").await.unwrap();
    let mut still = [0u8; 5];
    upstream.read_exact(&mut still).await.unwrap();
    assert_eq!(&still, b"still");
    // Checking the whole chain passes too: the root is covered by the CRL it issued.
    let mut args = cert_args("carol");
    args.extend(["-servername".into(), "chain.test".into()]);
    let (header, _) = header_for(&backend, port, args).await;
    assert_eq!(
        client_cn(&header),
        "carol",
        "the first backend connection since Bob's"
    );

    // A CRL past its nextUpdate: a warning at reload, and every client of the CA refused.
    let expired = [
        "-crl_lastupdate",
        "20200101000000Z",
        "-crl_nextupdate",
        "20200102000000Z",
    ];
    publish_crl(d, None, "revoked.pem", &expired);
    let before = server.log.len();
    assert!(server.reload().contains("reloaded"));
    server.log.wait_for("CRL has expired", before);
    assert!(CertClient::new(d, "carol").refused(port, None).await);
    wait_for_metric(
        admin,
        "tlsterm_handshake_failures_total{reason=\"client_crl_expired\"} 1",
    );

    // A fresh CRL of the same CA beside the expired one: BoringSSL uses the fresh one, and
    // the expired one is not warned about.
    std::fs::rename(d.join("revoked.pem"), d.join("expired.pem")).unwrap();
    publish_crl(d, None, "fresh.pem", &["-crldays", "1"]);
    let both = [d.join("expired.pem"), d.join("fresh.pem")]
        .map(|file| std::fs::read_to_string(file).unwrap())
        .concat();
    std::fs::write(d.join("revoked.pem"), both).unwrap();
    let before = server.log.len();
    assert!(server.reload().contains("reloaded"));
    assert!(
        !server
            .log
            .text()
            .lines()
            .skip(before)
            .any(|l| l.contains("CRL has expired")),
        "{}",
        server.log.text()
    );
    let (header, _) = header_for(&backend, port, cert_args("carol")).await;
    assert_eq!(client_cn(&header), "carol");
}

/// A `client_crl` that is not a CRL is a configuration error naming the key and its line.
#[test]
fn unparsable_crl_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    make_ca(dir.path(), "Test Client CA");
    std::fs::write(dir.path().join("revoked.pem"), "garbage\n").unwrap();
    let config = ConfigBuilder::new()
        .listener(|l| {
            l.port(free_port())
                .backend("builtin")
                .client_auth("required", Path::new("ca.pem"))
                .set("client_crl", "revoked.pem")
        })
        .write(dir.path());
    let text = std::fs::read_to_string(&config).unwrap();
    let line = 1 + text
        .lines()
        .position(|l| l.starts_with("client_crl"))
        .unwrap();
    let stderr = check_refuses(&config);
    assert!(
        stderr.contains(&format!("tlsterm.toml:{line}: key `client_crl`")),
        "{stderr}"
    );
}

/// `client_crl_check = "chain"` also wants a CRL for the intermediate CA (from the root);
/// "leaf" is content with the intermediate's own CRL.
#[test]
fn chain_check_needs_a_crl_for_every_ca() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    make_ca(root, "Test Root");
    make_leaf(
        root,
        "inter",
        "/CN=Test Intermediate",
        "basicConstraints=critical,CA:true",
    );
    let inter = root.join("inter");
    std::fs::create_dir(&inter).unwrap();
    std::fs::copy(root.join("inter.pem"), inter.join("ca.pem")).unwrap();
    std::fs::copy(root.join("inter.key"), inter.join("ca.key")).unwrap();
    make_leaf(&inter, "dave", "/CN=dave", "subjectAltName=DNS:dave.test");
    crl_authority(&inter);
    publish_crl(&inter, None, "crl.pem", &["-crldays", "1"]);
    let port = free_port();
    let config = ConfigBuilder::new().listener(|l| {
        l.port(port)
            .backend("builtin")
            .proxy_v2()
            .client_auth("required", Path::new("ca.pem"))
            .set("client_crl", "inter/crl.pem")
            .server_name(&["chain.test"], |n| {
                n.set("client_crl_check", "chain").backend("builtin")
            })
    });
    let _server = Server::start(&config.write(root));
    let p = |name: &str| inter.join(name).display().to_string();
    let connect = |sni: &str| {
        let (cert, key, chain) = (p("dave.pem"), p("dave.key"), p("ca.pem"));
        let args = [
            "-servername",
            sni,
            "-cert",
            &cert,
            "-key",
            &key,
            "-cert_chain",
            &chain,
        ];
        s_client(port, &[&args[..], &["-ign_eof"]].concat(), GET_CLOSE)
    };
    let out = connect("localhost");
    assert!(out.contains("Hello from tlsterm"), "leaf check: {out}");
    let out = connect("chain.test");
    assert!(
        !out.contains("Hello from tlsterm") && out.contains("alert"),
        "chain check: {out}"
    );
}
