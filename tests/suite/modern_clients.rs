//! What current clients expect: the post-quantum hybrid X25519MLKEM768 negotiated by
//! default (Go's crypto/tls client, `tlsterm bench`), classical clients still served, a
//! ClientHello split over many TCP segments read whole, and certificates sent compressed
//! (RFC 8879) to clients that ask, plain to the others.

use std::process::Command;

use crate::common::config::{ConfigBuilder, Listener};
use crate::common::*;

const GROUPS: &str = "tlsterm_tls_groups_total";
const COMPRESSED: &str = "tlsterm_certificates_compressed_total";

/// A server on the built-in backend with the connection log on and `extra` listener keys.
fn start(extra: impl FnOnce(Listener) -> Listener) -> (tempfile::TempDir, Server, u16) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = ConfigBuilder::new()
        .section("log", |log| log.set("connections", true))
        .listener(|l| extra(l.port(port).backend("builtin")))
        .write(dir.path());
    let server = Server::start(&config);
    (dir, server, port)
}

/// `tlsterm bench` in full mode, `n` connections, with `args`; its JSON report.
fn bench(port: u16, n: u32, args: &[&str]) -> serde_json::Value {
    let out = run(Command::new(TLSTERM)
        .args(["bench", &format!("https://127.0.0.1:{port}/")])
        .args([
            "--insecure",
            "--json",
            "--quiet",
            "-c",
            "1",
            "-n",
            &n.to_string(),
        ])
        .args(args));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors_total"], 0, "{report}");
    report
}

#[test]
fn go_negotiates_x25519mlkem768_by_default_and_it_shows() {
    let (_dir, server, port) = start(|l| l);
    let admin = admin_address(&server.config).unwrap();
    let got = go_connect(port, &[]);
    assert_eq!(got["version"], "TLS 1.3", "{got}");
    assert_eq!(got["group"], "X25519MLKEM768", "{got}");
    assert_eq!(got["status"], 200, "{got}");
    assert_eq!(metric(admin, GROUPS, "group=\"X25519MLKEM768\""), 1.0);
    let line = server.log.wait_for("connection closed", 0);
    assert!(line.contains("group=X25519MLKEM768"), "{line}");
    let stats = run(Command::new(TLSTERM).args(["stats", "--admin", &admin.to_string()]));
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("key exchange") && l.contains("X25519MLKEM768")),
        "{text}"
    );
}

#[test]
fn classical_clients_still_connect() {
    let (_dir, server, port) = start(|l| l);
    let admin = admin_address(&server.config).unwrap();
    let got = go_connect(port, &["-groups", "x25519"]);
    assert_eq!(got["group"], "X25519", "{got}");
    assert_eq!(got["status"], 200, "{got}");
    // A client without X25519 at all.
    let got = go_connect(port, &["-groups", "p-256"]);
    assert_eq!(got["group"], "CurveP256", "{got}");
    assert_eq!(metric(admin, GROUPS, "group=\"X25519\""), 1.0);
    assert_eq!(metric(admin, GROUPS, "group=\"P-256\""), 1.0);
    // A listener configured without the hybrid group does not negotiate it.
    let (_dir, _server, port) = start(|l| l.set("groups", ["X25519", "P-256"]));
    let got = go_connect(port, &[]);
    assert_eq!(got["group"], "X25519", "{got}");
}

#[test]
fn bench_measures_either_group() {
    let (_dir, _server, port) = start(|l| l);
    for (group, name) in [("x25519mlkem768", "X25519MLKEM768"), ("x25519", "X25519")] {
        let report = bench(port, 3, &["--group", group]);
        let negotiated = report["negotiated"].as_object().unwrap();
        assert!(
            negotiated.len() == 1 && negotiated.keys().all(|k| k.ends_with(&format!(" {name}"))),
            "{report}"
        );
    }
}

/// Certificates for a.test (RSA) and b.test (ECDSA), a.test the default.
fn two_names(dir: &std::path::Path) -> impl FnOnce(Listener) -> Listener {
    let (a_cert, a_key) = make_cert(dir, "a", "a.test", KeyType::Rsa2048);
    let (b_cert, b_key) = make_cert(dir, "b", "b.test", KeyType::EcdsaP256);
    move |l| {
        l.certificate(|c| c.files(&a_cert, &a_key).set("default", true))
            .cert(&b_cert, &b_key)
    }
}

#[test]
fn a_client_hello_in_small_segments_selects_the_certificate_by_sni() {
    let certs = tempfile::tempdir().unwrap();
    let (_dir, _server, port) = start(two_names(certs.path()));
    // The ClientHello with its ~1.2 KB hybrid key share arrives in 50-byte pieces.
    for (sni, name) in [
        ("b.test", "b.test"),
        ("a.test", "a.test"),
        ("c.test", "a.test"),
    ] {
        let got = go_connect(port, &["-sni", sni, "-split", "50"]);
        assert_eq!(got["group"], "X25519MLKEM768", "{got}");
        assert_eq!(got["certificate_names"][0], name, "{sni}: {got}");
        assert_eq!(got["status"], 200, "{got}");
    }
}

#[test]
fn certificates_go_compressed_to_clients_that_ask() {
    let certs = tempfile::tempdir().unwrap();
    let (_dir, server, port) = start(two_names(certs.path()));
    let admin = admin_address(&server.config).unwrap();
    // rustls offering brotli and zlib gets brotli, the server's first choice...
    let report = bench(port, 3, &["--sni", "a.test"]);
    assert_eq!(report["certificates_compressed"]["brotli"], 3, "{report}");
    assert_eq!(metric(admin, COMPRESSED, "algorithm=\"brotli\""), 3.0);
    // ...and zlib when it offers only that.
    let report = bench(port, 2, &["--sni", "b.test", "--cert-compression", "zlib"]);
    assert_eq!(report["certificates_compressed"]["zlib"], 2, "{report}");
    assert_eq!(metric(admin, COMPRESSED, "algorithm=\"zlib\""), 2.0);
    // Clients that do not offer compression get the plain chain: rustls without it, Go
    // (which has none), and TLS 1.2 (RFC 8879 is TLS 1.3 only).
    let report = bench(port, 2, &["--sni", "a.test", "--cert-compression", "none"]);
    assert_eq!(report["certificates_compressed"], serde_json::json!({}));
    let got = go_connect(port, &["-sni", "b.test"]);
    assert_eq!(got["certificate_names"][0], "b.test", "{got}");
    let report = bench(port, 2, &["--sni", "a.test", "--tls-version", "1.2"]);
    assert_eq!(report["certificates_compressed"]["brotli"], 0, "{report}");
    assert_eq!(metric(admin, COMPRESSED, ""), 5.0);
}

#[test]
fn certificate_compression_can_be_turned_off_or_reordered() {
    let (_dir, server, port) = start(|l| l.set("cert_compression", Vec::<&str>::new()));
    let report = bench(port, 2, &[]);
    assert_eq!(report["certificates_compressed"]["brotli"], 0, "{report}");
    assert_eq!(report["certificates_compressed"]["zlib"], 0, "{report}");
    let admin = admin_address(&server.config).unwrap();
    assert_eq!(metric(admin, COMPRESSED, ""), 0.0);
    let (_dir, _server, port) = start(|l| l.set("cert_compression", ["zlib", "brotli"]));
    let report = bench(port, 2, &[]);
    assert_eq!(report["certificates_compressed"]["zlib"], 2, "{report}");
}
