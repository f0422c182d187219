//! `tlsterm serve` end to end: real clients (openssl s_client, curl, BoringSSL in-process)
//! against a tlsterm process on 127.0.0.1.

use std::process::Command;

use crate::common::*;
use boring::ssl::SslVersion;
use tlsterm::proxy::proxy_protocol::{self, PP2_TYPE_ALPN, PP2_TYPE_AUTHORITY};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cert_block(cert: &std::path::Path, key: &std::path::Path, extra: &str) -> String {
    format!(
        "[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n{extra}\n",
        cert.display().to_string(),
        key.display().to_string()
    )
}

/// One listener on `port` with an RSA and an ECDSA certificate for localhost.
fn dual_cert_listener(dir: &std::path::Path, port: u16, extra: &str) -> String {
    let (rc, rk) = make_cert(dir, "rsa", "localhost", KeyType::Rsa2048);
    let (ec, ek) = make_cert(dir, "ecdsa", "localhost", KeyType::EcdsaP256);
    format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n{extra}\n{}{}",
        cert_block(&rc, &rk, ""),
        cert_block(&ec, &ek, "")
    )
}

#[test]
fn openssl_and_curl_handshake_tls12_and_tls13_with_rsa_and_ecdsa() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(dir.path(), "", &[dual_cert_listener(dir.path(), port, "")]);
    let _server = Server::start(&config);

    // (client options, expected protocol, expected signature type)
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["-tls1_3", "-sigalgs", "RSA-PSS+SHA256"],
            "TLSv1.3",
            "RSA-PSS",
        ),
        (&["-tls1_3", "-sigalgs", "ECDSA+SHA256"], "TLSv1.3", "ECDSA"),
        (
            &["-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"],
            "TLSv1.2",
            "RSA-PSS",
        ),
        (
            &[
                "-tls1_2",
                "-cipher",
                "ECDHE-RSA-AES256-GCM-SHA384",
                "-sigalgs",
                "RSA+SHA256",
            ],
            "TLSv1.2",
            "RSA",
        ),
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"],
            "TLSv1.2",
            "ECDSA",
        ),
        // A TLS 1.2 client without P-256 among its groups cannot use the ECDSA key: the RSA
        // certificate serves it.
        (&["-tls1_2", "-groups", "X25519"], "TLSv1.2", "RSA-PSS"),
    ];
    for (args, protocol, signature) in cases {
        let mut all = vec!["-servername", "localhost", "-ign_eof"];
        all.extend_from_slice(args);
        let out = s_client(port, &all, GET_CLOSE);
        assert!(
            out.contains(&format!("Protocol  : {protocol}"))
                || out.contains(&format!("New, {protocol}")),
            "{args:?}: {out}"
        );
        assert!(
            out.contains(&format!("Peer signature type: {signature}\n")),
            "{args:?}: {out}"
        );
        assert!(
            out.contains("Hello from tlsterm"),
            "{args:?}: no response: {out}"
        );
    }

    for version in ["--tlsv1.2", "--tlsv1.3"] {
        let out = run(Command::new("curl")
            .args(["-sk", "--max-time", "20", version])
            .arg(format!("https://localhost:{port}/bytes/100000"))
            .args(["--resolve", &format!("localhost:{port}:127.0.0.1")]));
        assert_eq!(out.stdout.len(), 100_000, "curl {version}");
    }
}

/// A listener whose TLS 1.2 cipher suites are all ECDHE-RSA: a TLS 1.2 client that also
/// offers ECDHE-ECDSA suites gets the RSA certificate, the only one a suite allows.
#[test]
fn tls12_uses_rsa_when_the_listener_enables_no_ecdsa_suite() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ciphers = "ciphers = \"ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384\"";
    let config = write_config(
        dir.path(),
        "",
        &[dual_cert_listener(dir.path(), port, ciphers)],
    );
    let _server = Server::start(&config);
    let out = s_client(
        port,
        &["-servername", "localhost", "-tls1_2", "-ign_eof"],
        GET_CLOSE,
    );
    assert!(out.contains("Peer signature type: RSA"), "{out}");
    assert!(out.contains("Hello from tlsterm"), "{out}");
}

/// ECDSA P-384 and RSA-4096 side by side: P-384 for clients that offer ecdsa_secp384r1_sha384.
#[test]
fn p384_and_rsa4096_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (rc, rk) = make_cert(dir.path(), "rsa4096", "localhost", KeyType::Rsa4096);
    let (ec, ek) = make_cert(dir.path(), "p384", "localhost", KeyType::EcdsaP384);
    let listener = format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n{}{}",
        cert_block(&rc, &rk, ""),
        cert_block(&ec, &ek, "")
    );
    let config = write_config(dir.path(), "", &[listener]);
    let _server = Server::start(&config);
    let out = s_client(
        port,
        &["-tls1_3", "-sigalgs", "ECDSA+SHA384", "-ign_eof"],
        GET_CLOSE,
    );
    assert!(
        out.contains("Peer signature type: ECDSA") && out.contains("Hello from tlsterm"),
        "{out}"
    );
    assert!(out.contains("384 bit"), "{out}");
    // A client that cannot verify P-384 signatures gets the RSA-4096 certificate.
    let out = s_client(
        port,
        &[
            "-tls1_3",
            "-sigalgs",
            "ECDSA+SHA256:RSA-PSS+SHA256",
            "-ign_eof",
        ],
        GET_CLOSE,
    );
    assert!(
        out.contains("Peer signature type: RSA-PSS") && out.contains("4096 bit"),
        "{out}"
    );
    assert!(out.contains("Hello from tlsterm"), "{out}");
}

#[test]
fn sni_selects_certificate_exact_wildcard_and_default() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (ac, ak) = make_cert(dir.path(), "a", "a.test", KeyType::Rsa2048);
    let (wc, wk) = make_cert(dir.path(), "w", "*.w.test", KeyType::EcdsaP256);
    let (dc, dk) = make_cert(dir.path(), "d", "default.test", KeyType::EcdsaP256);
    // A certificate listed under a server name serves that block's names.
    let (pc, pk) = make_cert(dir.path(), "p", "p.test", KeyType::EcdsaP256);
    let listener = format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n{}{}{}\
         [[listener.server_name]]\nnames = [\"p.test\"]\n{}",
        cert_block(&ac, &ak, ""),
        cert_block(&wc, &wk, ""),
        cert_block(&dc, &dk, "default = true"),
        cert_block(&pc, &pk, "")
            .replace("listener.certificate", "listener.server_name.certificate")
    );
    let config = write_config(dir.path(), "", &[listener]);
    let _server = Server::start(&config);

    for (sni, expected) in [
        ("a.test", "CN=a.test"),
        ("A.TEST", "CN=a.test"),
        ("x.w.test", "CN=*.w.test"),
        ("deeper.x.w.test", "CN=default.test"),
        ("unknown.test", "CN=default.test"),
        ("p.test", "CN=p.test"),
    ] {
        let out = s_client(port, &["-servername", sni], "");
        let subject = out
            .lines()
            .find(|l| l.starts_with("subject="))
            .unwrap_or_default()
            .replace(' ', "");
        assert!(subject.contains(expected), "SNI {sni}: {subject}\n{out}");
    }
    let out = s_client(port, &["-noservername"], "");
    assert!(
        out.replace(' ', "").contains("subject=CN=default.test"),
        "{out}"
    );
}

/// TLS 1.3 suites: AES-128-GCM by server preference, ChaCha20 for clients that list it
/// first, AES-256-GCM when it is all the client has; and a configured order is followed.
#[test]
fn tls13_cipher_choice() {
    let (_dir, _server, port) = start_listener("builtin", "");
    for (client, expected) in [
        (
            "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256",
            "TLS_AES_128_GCM_SHA256",
        ),
        (
            "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256",
            "TLS_CHACHA20_POLY1305_SHA256",
        ),
        ("TLS_AES_256_GCM_SHA384", "TLS_AES_256_GCM_SHA384"),
    ] {
        let out = s_client(port, &["-tls1_3", "-ciphersuites", client], "");
        assert!(
            out.contains(&format!("Cipher is {expected}")),
            "{client}: {out}"
        );
    }
    let (_dir, _server, port) = start_listener(
        "builtin",
        "tls13_ciphers = [\"TLS_AES_256_GCM_SHA384|TLS_AES_128_GCM_SHA256\"]",
    );
    let out = s_client(
        port,
        &[
            "-tls1_3",
            "-ciphersuites",
            "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384",
        ],
        "",
    );
    assert!(
        out.contains("Cipher is TLS_AES_128_GCM_SHA256"),
        "client's choice within a group: {out}"
    );
    let out = s_client(
        port,
        &["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"],
        "",
    );
    assert!(
        out.contains("Cipher is (NONE)"),
        "ChaCha20 not configured: {out}"
    );
}

#[test]
fn alpn_is_negotiated_in_server_preference() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        "",
        &[dual_cert_listener(
            dir.path(),
            port,
            "alpn = [\"h2\", \"http/1.1\"]",
        )],
    );
    let _server = Server::start(&config);
    let out = s_client(port, &["-alpn", "http/1.1,h2"], "");
    assert!(out.contains("ALPN protocol: h2"), "{out}");
    let out = s_client(port, &["-alpn", "http/1.1"], "");
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    let out = s_client(port, &["-alpn", "spdy/3"], "");
    assert!(out.contains("No ALPN negotiated"), "{out}");
}

/// PROXY headers as the backend receives them, decoded by an independent reading of the spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_v1_and_v2_headers() {
    for version in ["v1", "v2"] {
        let dir = tempfile::tempdir().unwrap();
        let backend = RawBackend::bind().await;
        let port = free_port();
        let listener = format!(
            "address = \"127.0.0.1:{port}\"\nbackends = [\"{}\"]\nproxy_protocol = \"{version}\"\nalpn = [\"h2\", \"http/1.1\"]",
            backend.address
        );
        let config = write_config(dir.path(), "", &[listener]);
        let _server = Server::start(&config);

        let mut client = tls_connect(port, "proxy.test", SslVersion::TLS1_3, &["h2"])
            .await
            .unwrap();
        let client_address = client.get_ref().local_addr().unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut upstream = backend.accept().await;
        let mut received = Vec::new();
        // Read until the header and the 4 payload bytes are all there.
        let header = loop {
            let mut chunk = [0u8; 512];
            let n = upstream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "backend connection closed early");
            received.extend_from_slice(&chunk[..n]);
            if let Ok((header, used)) = proxy_protocol::decode(&received) {
                if received.len() >= used + 4 {
                    assert_eq!(&received[used..used + 4], b"ping");
                    break header;
                }
            }
        };
        assert_eq!(header.source, Some(client_address), "{version}");
        assert_eq!(header.destination.map(|d| d.port()), Some(port));
        if version == "v1" {
            let expected = format!(
                "PROXY TCP4 127.0.0.1 127.0.0.1 {} {port}\r\n",
                client_address.port()
            );
            assert!(received.starts_with(expected.as_bytes()));
        } else {
            assert_eq!(&received[..12], b"\r\n\r\n\0\r\nQUIT\n");
            assert_eq!(received[12], 0x21, "version 2, PROXY command");
            assert_eq!(received[13], 0x11, "TCP over IPv4");
            assert_eq!(header.tlv(PP2_TYPE_ALPN), Some(&b"h2"[..]));
            assert_eq!(header.tlv(PP2_TYPE_AUTHORITY), Some(&b"proxy.test"[..]));
            let ssl = header.ssl().expect("SSL TLV");
            assert_eq!(ssl.client & 0x01, 0x01, "PP2_CLIENT_SSL");
            assert_eq!(
                ssl.get(proxy_protocol::PP2_SUBTYPE_SSL_VERSION),
                Some(&b"TLSv1.3"[..])
            );
            let cipher = ssl.get(proxy_protocol::PP2_SUBTYPE_SSL_CIPHER).unwrap();
            assert!(String::from_utf8_lossy(cipher).starts_with("TLS_"));
        }
    }
}

/// The built-in backend behind a listener with `proxy_protocol` strips the header: every
/// path gets the answer it gets without one, on each request of a keep-alive connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_backend_answers_the_same_behind_a_proxy_header() {
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port(), free_port()];
    let listeners: Vec<String> = ports
        .iter()
        .zip(["", "proxy_protocol = \"v1\"", "proxy_protocol = \"v2\""])
        .map(|(port, proxy)| {
            format!("address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n{proxy}")
        })
        .collect();
    let config = write_config(dir.path(), "", &listeners);
    let _server = Server::start(&config);

    let paths = ["/", "/bytes/10", "/bytes/100000", "/other"];
    let mut answers = Vec::new();
    for (port, proxy) in ports.iter().zip(["none", "v1", "v2"]) {
        let mut client = tls_connect(*port, "localhost", SslVersion::TLS1_3, &[])
            .await
            .unwrap();
        let mut bodies = Vec::new();
        for path in paths {
            let body = http_get(&mut client, path)
                .await
                .unwrap_or_else(|err| panic!("PROXY {proxy}, {path}: {err}"));
            bodies.push(body);
        }
        answers.push((proxy, bodies));
    }
    let (_, plain) = &answers[0];
    assert_eq!(plain[1], vec![b'x'; 10]);
    assert!(String::from_utf8_lossy(&plain[0]).contains("Hello from tlsterm"));
    for (proxy, bodies) in &answers[1..] {
        for ((path, body), expected) in paths.iter().zip(bodies).zip(plain) {
            assert!(
                body == expected,
                "PROXY {proxy}, {path}: a different answer"
            );
        }
    }
}

/// A backend named `localhost:PORT` is reached whichever of the name's addresses it listens
/// on. Where `localhost` resolves to `::1` and `127.0.0.1` (the usual /etc/hosts), the
/// backend listens only on the address resolved last, which a pool of the first address
/// alone refused on every connection; where it resolves to one address (as on a host
/// whose /etc/hosts lists only `127.0.0.1 localhost`), this only shows that a name works,
/// and the unit test in `src/server/state.rs` covers a name with several addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_name_reaches_an_address_other_than_its_first() {
    use std::net::ToSocketAddrs;
    let resolved: Vec<std::net::SocketAddr> = ("localhost", 0).to_socket_addrs().unwrap().collect();
    let last = resolved.last().expect("localhost resolves").ip();
    let backend = tokio::net::TcpListener::bind((last, 0)).await.unwrap();
    let backend_port = backend.local_addr().unwrap().port();
    eprintln!("localhost resolves to {resolved:?}; the backend listens on {last} only");
    let (_dir, _server, port) = start_listener(&format!("localhost:{backend_port}"), "");

    // Several connections: each is relayed, not only the one after a refusal.
    for round in 0..3u8 {
        let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
            .await
            .unwrap();
        client.write_all(&[round]).await.unwrap();
        let mut closed = [0u8; 1];
        let mut upstream = tokio::select! {
            accepted = backend.accept() => accepted.unwrap().0,
            // tlsterm closes the client's connection when no backend address answers.
            _ = client.read(&mut closed) => panic!("connection {round}: no backend reached"),
        };
        let mut byte = [0u8; 1];
        upstream.read_exact(&mut byte).await.unwrap();
        assert_eq!(byte[0], round);
    }
}

/// EOF from one side is passed on as a half-close; the other direction keeps flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_is_propagated_both_ways() {
    let backend = RawBackend::bind().await;
    let (_dir, _server, port) = start_listener(&backend.address.to_string(), "");

    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    client.write_all(b"request").await.unwrap();
    client.shutdown().await.unwrap(); // close_notify + FIN: the client is done sending
    let mut upstream = backend.accept().await;
    let mut got = Vec::new();
    upstream.read_to_end(&mut got).await.unwrap(); // ends only if the half-close arrived
    assert_eq!(got, b"request");
    // The other direction still works after the client's half-close.
    upstream
        .write_all(b"response after half-close")
        .await
        .unwrap();
    upstream.shutdown().await.unwrap();
    let mut reply = Vec::new();
    let _ = client.read_to_end(&mut reply).await;
    assert_eq!(reply, b"response after half-close");
}

/// The backend finishing first: its EOF reaches the client, which can still send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_half_close_reaches_client_and_client_can_still_send() {
    let backend = RawBackend::bind().await;
    let (_dir, _server, port) = start_listener(&backend.address.to_string(), "");

    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    client.write_all(b"hello").await.unwrap();
    let mut upstream = backend.accept().await;
    let mut hello = [0u8; 5];
    upstream.read_exact(&mut hello).await.unwrap();
    upstream.write_all(b"bye").await.unwrap();
    upstream.shutdown().await.unwrap(); // backend done sending
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap(); // ends only if the EOF was passed on
    assert_eq!(got, b"bye");
    client.write_all(b"late data").await.unwrap();
    client.shutdown().await.unwrap();
    let mut late = Vec::new();
    upstream.read_to_end(&mut late).await.unwrap();
    assert_eq!(late, b"late data");
}

/// A dead backend costs its client a clean close; other connections go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_backend_closes_only_that_client() {
    let dir = tempfile::tempdir().unwrap();
    let (dead_port, live_port) = (free_port(), free_port());
    let nothing_listens = free_port();
    let config = write_config(
        dir.path(),
        "",
        &[
            format!("address = \"127.0.0.1:{dead_port}\"\nbackends = [\"127.0.0.1:{nothing_listens}\"]"),
            format!("address = \"127.0.0.1:{live_port}\"\nbackends = [\"127.0.0.1:{nothing_listens}\", \"builtin\"]"),
        ],
    );
    let server = Server::start(&config);

    let mut established = tls_connect(live_port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    assert!(http_get(&mut established, "/")
        .await
        .unwrap()
        .starts_with(b"<!doctype"));

    let mut doomed = tls_connect(dead_port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    let _ = doomed.write_all(GET_CLOSE.as_bytes()).await;
    let mut rest = Vec::new();
    let result = tokio::time::timeout(DEADLINE, doomed.read_to_end(&mut rest))
        .await
        .expect("closed, not hung");
    assert!(
        result.is_ok(),
        "a clean close_notify, not a reset: {result:?}"
    );
    assert!(rest.is_empty());
    server.log.wait_for("no backend", 0);

    // The established connection is unaffected, and the live listener skips the dead backend.
    assert_eq!(
        http_get(&mut established, "/bytes/5000")
            .await
            .unwrap()
            .len(),
        5000
    );
    for _ in 0..4 {
        let mut fresh = tls_connect(live_port, "localhost", SslVersion::TLS1_2, &[])
            .await
            .unwrap();
        assert_eq!(http_get(&mut fresh, "/bytes/10").await.unwrap().len(), 10);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_client_is_cut_at_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listener = format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\nhandshake_timeout = \"1s\""
    );
    let config = write_config(dir.path(), "[log]\nconnections = true", &[listener]);
    let server = Server::start(&config);
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(DEADLINE, silent.read(&mut buf))
        .await
        .expect("server closed the silent client");
    assert_eq!(n.unwrap_or(0), 0);
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(900),
        "closed before the timeout"
    );
    server.log.wait_for("close=handshake_timeout", 0);
}

/// SIGHUP under traffic: established connections keep working through reloads, new ones
/// see the new certificate, and a broken configuration is refused while the old one serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (c1, k1) = make_cert(dir.path(), "one", "one.test", KeyType::Rsa2048);
    let (c2, k2) = make_cert(dir.path(), "two", "two.test", KeyType::Rsa2048);
    let live = dir.path().join("live");
    std::fs::copy(&c1, live.with_extension("pem")).unwrap();
    std::fs::copy(&k1, live.with_extension("key")).unwrap();
    let listener = format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n{}",
        cert_block(&live.with_extension("pem"), &live.with_extension("key"), "")
    );
    let config = write_config(dir.path(), "", &[listener]);
    let server = Server::start(&config);

    let mut connections = Vec::new();
    for _ in 0..8 {
        connections.push(
            tls_connect(port, "one.test", SslVersion::TLS1_3, &[])
                .await
                .unwrap(),
        );
    }
    // Traffic runs on every connection while the reloads happen.
    let traffic = tokio::spawn(async move {
        for round in 0..30 {
            for connection in connections.iter_mut() {
                let body = http_get(connection, &format!("/bytes/{}", 1000 + round))
                    .await
                    .expect("request on an established connection");
                assert_eq!(body.len(), 1000 + round);
            }
        }
        connections
    });

    std::fs::copy(&c2, live.with_extension("pem")).unwrap();
    std::fs::copy(&k2, live.with_extension("key")).unwrap();
    assert!(server.reload().contains("reloaded"));
    let out = s_client(port, &["-servername", "x"], "");
    assert!(
        out.replace(' ', "").contains("subject=CN=two.test"),
        "new certificate served: {out}"
    );

    std::fs::write(live.with_extension("pem"), "garbage").unwrap();
    assert!(server.reload().contains("reload refused"));
    let out = s_client(port, &["-servername", "x"], "");
    assert!(
        out.replace(' ', "").contains("subject=CN=two.test"),
        "old configuration still serves: {out}"
    );

    let mut connections = traffic.await.expect("no established connection failed");
    for connection in connections.iter_mut() {
        assert!(http_get(connection, "/").await.unwrap().len() > 10);
    }
}

/// SIGHUP opens a listener added to the configuration and closes a removed one: the
/// removed one accepts no more connections while a connection made through it goes on. A
/// new listener whose port is taken refuses the reload as a whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_opens_and_closes_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let header = format!("[admin]\naddress = \"127.0.0.1:{}\"\n", free_port());
    let listener = |port: u16| format!("address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]");
    let (a, b) = (free_port(), free_port());
    let config = write_config(dir.path(), &header, &[listener(a)]);
    let server = Server::start(&config);
    let mut through_a = tls_connect(a, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", b))
        .await
        .is_err());

    // B added, A removed.
    write_config(dir.path(), &header, &[listener(b)]);
    assert!(server.reload().contains("reloaded"));
    server
        .log
        .wait_for(&format!("listener opened address=127.0.0.1:{b}"), 0);
    let mut through_b = tls_connect(b, "localhost", SslVersion::TLS1_3, &[])
        .await
        .expect("the new listener accepts");
    assert_eq!(
        http_get(&mut through_b, "/bytes/100").await.unwrap().len(),
        100
    );
    // Each worker closes its socket of A as it notices; then A refuses connections.
    let refused = async {
        let mut poll = tokio::time::interval(std::time::Duration::from_millis(10));
        loop {
            poll.tick().await;
            if tokio::net::TcpStream::connect(("127.0.0.1", a))
                .await
                .is_err()
            {
                break;
            }
        }
    };
    tokio::time::timeout(DEADLINE, refused)
        .await
        .expect("the removed listener stops accepting");
    assert_eq!(
        http_get(&mut through_a, "/bytes/1000").await.unwrap().len(),
        1000,
        "a connection through the removed listener goes on"
    );

    // A new listener on a port that is taken: refused, and nothing changes.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    write_config(dir.path(), &header, &[listener(b), listener(taken_port)]);
    let verdict = server.reload();
    assert!(verdict.contains("reload refused"), "{verdict}");
    assert!(
        verdict.contains(&format!("cannot bind 127.0.0.1:{taken_port}")),
        "{verdict}"
    );
    let mut again = tls_connect(b, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    assert_eq!(http_get(&mut again, "/bytes/10").await.unwrap().len(), 10);
    assert_eq!(
        http_get(&mut through_b, "/bytes/10").await.unwrap().len(),
        10
    );

    // A process-wide key is not applied by a reload, and the log says so.
    let header = format!("max_connections = 5\n{header}");
    write_config(dir.path(), &header, &[listener(b)]);
    assert!(server.reload().contains("reloaded"));
    let warning = server.log.wait_for("take effect at the next restart", 0);
    assert!(warning.contains("max_connections"), "{warning}");
}

/// The leaf's notAfter in `pem`, in seconds since the Unix epoch.
fn not_after_unix(pem: &[u8]) -> f64 {
    let cert = boring::x509::X509::from_pem(pem).unwrap();
    let epoch = boring::asn1::Asn1Time::from_unix(0).unwrap();
    let diff = epoch.diff(cert.not_after()).unwrap();
    f64::from(diff.days) * 86_400.0 + f64::from(diff.secs)
}

/// The certificate-expiry gauge describes the certificates being served: a reload that
/// read renewed certificate files but was then refused (a new listener's port is taken)
/// leaves it at the old certificate's expiry, so an alert on it does not go quiet while
/// the old certificate still serves. The reload that succeeds publishes the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_reload_keeps_the_served_certificate_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let header = format!("[admin]\naddress = \"127.0.0.1:{}\"\n", free_port());
    let admin: std::net::SocketAddr = header.split('"').nth(1).unwrap().parse().unwrap();
    let port = free_port();
    // The old certificate expires in 2 days, the renewed one in 30.
    let (old_cert, old_key) = make_cert(dir.path(), "old", "renew.test", KeyType::EcdsaP256);
    let renewed = |ext: &str| dir.path().join(format!("renewed.{ext}"));
    run(Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "30", "-newkey", "ec"])
        .args(["-pkeyopt", "ec_paramgen_curve:P-256", "-keyout"])
        .arg(renewed("key"))
        .arg("-out")
        .arg(renewed("pem"))
        .args([
            "-subj",
            "/CN=renew.test",
            "-addext",
            "subjectAltName=DNS:renew.test",
        ]));
    let live = |ext: &str| dir.path().join(format!("live.{ext}"));
    std::fs::copy(&old_cert, live("pem")).unwrap();
    std::fs::copy(&old_key, live("key")).unwrap();
    let old_pem = std::fs::read(&old_cert).unwrap();
    let new_pem = std::fs::read(renewed("pem")).unwrap();
    let (old_expiry, new_expiry) = (not_after_unix(&old_pem), not_after_unix(&new_pem));
    assert!(new_expiry > old_expiry + 86_400.0);

    let listener = |port: u16| {
        format!(
            "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n{}",
            cert_block(&live("pem"), &live("key"), "")
        )
    };
    let config = write_config(dir.path(), &header, &[listener(port)]);
    let server = Server::start(&config);
    let expiry = || {
        metric(
            admin,
            "tlsterm_certificate_expiry_seconds",
            "name=\"renew.test\"",
        )
    };
    assert_eq!(expiry(), old_expiry);
    let served = || async {
        let client = tls_connect(port, "renew.test", SslVersion::TLS1_3, &[])
            .await
            .unwrap();
        client.ssl().peer_certificate().unwrap().to_der().unwrap()
    };
    let old_der = boring::x509::X509::from_pem(&old_pem)
        .unwrap()
        .to_der()
        .unwrap();
    let new_der = boring::x509::X509::from_pem(&new_pem)
        .unwrap()
        .to_der()
        .unwrap();
    assert_eq!(served().await, old_der);

    // Renewed files, and a new listener on a port that is taken: refused after the
    // renewed certificate was read.
    std::fs::copy(renewed("pem"), live("pem")).unwrap();
    std::fs::copy(renewed("key"), live("key")).unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    write_config(dir.path(), &header, &[listener(port), listener(taken_port)]);
    let verdict = server.reload();
    assert!(verdict.contains("reload refused"), "{verdict}");
    assert!(
        verdict.contains(&format!("cannot bind 127.0.0.1:{taken_port}")),
        "{verdict}"
    );
    assert_eq!(served().await, old_der, "the old certificate still serves");
    assert_eq!(
        expiry(),
        old_expiry,
        "the gauge shows the served certificate"
    );

    // Without the taken port the reload goes through, and the gauge follows.
    write_config(dir.path(), &header, &[listener(port)]);
    assert!(server.reload().contains("reloaded"));
    assert_eq!(served().await, new_der);
    assert_eq!(expiry(), new_expiry);
}

/// Connections the kernel had completed on a listener that a reload removes (waiting in its
/// accept queue) are served, not reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_listener_serves_its_accept_queue() {
    let dir = tempfile::tempdir().unwrap();
    let header = format!("[admin]\naddress = \"127.0.0.1:{}\"\n", free_port());
    let listener = |port: u16| {
        format!("address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\nmax_connections = 1")
    };
    // One worker whose listener takes one connection at a time.
    let write = |port: u16| {
        let config = write_config(dir.path(), &header, &[listener(port)]);
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(text.contains("workers = 2"));
        std::fs::write(&config, text.replace("workers = 2", "workers = 1")).unwrap();
        config
    };
    let (a, b) = (free_port(), free_port());
    let server = Server::start(&write(a));
    let mut first = tls_connect(a, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    assert!(!http_get(&mut first, "/").await.unwrap().is_empty());
    // Connected as far as their clients can tell, but waiting in the accept queue.
    let mut queued = Vec::new();
    for _ in 0..20 {
        queued.push(
            tokio::net::TcpStream::connect(("127.0.0.1", a))
                .await
                .unwrap(),
        );
    }

    write(b);
    assert!(server.reload().contains("reloaded"));
    server
        .log
        .wait_for("serving the connections waiting in its accept queue", 0);
    drop(first);
    let mut connector = boring::ssl::SslConnector::builder(boring::ssl::SslMethod::tls()).unwrap();
    connector.set_verify(boring::ssl::SslVerifyMode::NONE);
    let connector = connector.build();
    // One at a time (the listener's limit), each served once the one before it closes.
    let clients = queued.into_iter().map(|tcp| {
        let config = connector.configure().unwrap();
        tokio::spawn(async move {
            let mut tls = tokio_boring::connect(config, "localhost", tcp).await?;
            http_get(&mut tls, "/bytes/10").await
        })
    });
    for client in clients.collect::<Vec<_>>() {
        let served = tokio::time::timeout(DEADLINE, client)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(served.expect("a queued connection is served").len(), 10);
    }
    // Then the socket is closed.
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", a))
        .await
        .is_err());
}

/// The commented reference configuration stays a valid configuration.
#[test]
fn example_config_is_valid() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/tlsterm.example.toml");
    let out = run(Command::new(TLSTERM).args(["serve", "--check", "-c", example]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration OK"));
}

#[test]
fn bad_config_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "workers = 1\n[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nhandshake_timeout = \"ten seconds\"\n").unwrap();
    let stderr = check_refuses(&path);
    assert!(stderr.contains("bad.toml:5"), "{stderr}");

    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n",
    )
    .unwrap();
    let out = Command::new(TLSTERM)
        .args(["serve", "--check", "-c"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The process-wide `max_connections`: at the limit nobody is accepted (the client waits
/// in the backlog, its handshake does not start) until a connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_connection_limit_pauses_accepting() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listener = format!("address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]");
    let config = write_config(dir.path(), "max_connections = 2", &[listener]);
    let _server = Server::start(&config);
    let mut first = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    let mut second = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    assert!(!http_get(&mut first, "/").await.unwrap().is_empty());
    assert!(!http_get(&mut second, "/").await.unwrap().is_empty());
    let third = tokio::spawn(async move {
        let mut third = tls_connect(port, "localhost", SslVersion::TLS1_3, &[]).await?;
        http_get(&mut third, "/bytes/3").await
    });
    // Not served while two connections are open...
    let waited = tokio::time::timeout(std::time::Duration::from_millis(500), async {
        while !third.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(
        waited.is_err(),
        "the third connection was served over the limit"
    );
    // ...and served as soon as one closes.
    drop(first);
    let body = tokio::time::timeout(DEADLINE, third)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(body.len(), 3);
}

/// SIGTERM stops accepting but lets an open connection finish its exchange; `/healthz`
/// says the process is stopping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listener = format!("address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]");
    let config = write_config(dir.path(), "drain_timeout = \"20s\"", &[listener]);
    let mut server = Server::start(&config);
    let mut open = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    assert!(!http_get(&mut open, "/").await.unwrap().is_empty());
    server.signal("TERM");
    server.log.wait_for("stopping", 0);
    // The admin listener answers through the drain, and says the process is stopping.
    let admin = admin_address(&config).unwrap();
    assert_eq!(
        admin_get(admin, "/healthz"),
        (503, "stopping\n".to_string())
    );
    // Still served while draining...
    assert_eq!(http_get(&mut open, "/bytes/777").await.unwrap().len(), 777);
    // ...and no new connections are accepted.
    assert!(tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .is_err());
    drop(open);
    let status = tokio::task::spawn_blocking(move || server.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}

/// Both ways of spreading connections over the workers serve every connection and count
/// it once: `"shared"` (the default: the workers take connections from one socket) and
/// `"per-worker"` (a SO_REUSEPORT socket each, the kernel choosing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_accept_modes_serve_every_connection() {
    for mode in ["shared", "per-worker"] {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let listener = format!("address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]");
        let config = write_config(dir.path(), &format!("accept = \"{mode}\""), &[listener]);
        let _server = Server::start(&config);
        let admin = admin_address(&config).unwrap();
        for _ in 0..20 {
            let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
                .await
                .unwrap();
            assert!(
                !http_get(&mut client, "/").await.unwrap().is_empty(),
                "{mode}"
            );
        }
        wait_for_metric(admin, "tlsterm_connections_accepted_total 20");
    }
}
