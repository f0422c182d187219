//! The server's key share computed by tlsterm and handed to BoringSSL as a handshake hint,
//! seen end to end: real clients (Go, rustls through `tlsterm bench`, openssl) complete
//! their handshakes, and `/metrics` shows which path computed each share: the X25519 part
//! in multi-buffer batches where the CPU has AVX-512 IFMA, aws-lc otherwise and for
//! P-256 and P-384. A BoringSSL that stopped applying the hints would show `not_applied` here.

use std::process::Command;

use crate::common::config::{ConfigBuilder, Section};
use crate::common::*;

const SHARES: &str = "tlsterm_key_shares_total";

/// A server on the built-in backend whose `[engine]` section `engine` writes.
fn start(engine: impl FnOnce(Section) -> Section) -> (tempfile::TempDir, Server, u16) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = ConfigBuilder::new()
        .section("engine", engine)
        .listener(|l| l.port(port).backend("builtin"))
        .write(dir.path());
    let server = Server::start(&config);
    (dir, server, port)
}

/// The path that computes X25519 (alone or in the hybrid) by default on this CPU.
fn x25519_path() -> &'static str {
    if std::arch::is_x86_feature_detected!("avx512ifma") {
        "batch"
    } else {
        println!("X25519 shares by aws-lc: this CPU lacks AVX-512 IFMA (no batch kernel)");
        "aws-lc-rs"
    }
}

fn shares(admin: std::net::SocketAddr, group: &str, path: &str) -> f64 {
    metric(admin, SHARES, &format!("group=\"{group}\",path=\"{path}\""))
}

/// Waits until `/metrics` shows `count` shares of `group` computed by `path` (the server
/// counts a handshake after the client has seen it complete).
fn wait_shares(admin: std::net::SocketAddr, group: &str, path: &str, count: u32) {
    wait_for_metric(
        admin,
        &format!("{SHARES}{{group=\"{group}\",path=\"{path}\"}} {count}\n"),
    );
}

/// Go clients of each group against a server whose `[engine]` section is `engine`;
/// `x25519`: the path expected for X25519 and the hybrid.
fn go_clients_of_every_group(engine: impl FnOnce(Section) -> Section, x25519: &str) {
    let (_dir, server, port) = start(engine);
    let admin = admin_address(&server.config).unwrap();
    for (args, group, go_name, path) in [
        (&[][..], "X25519MLKEM768", "X25519MLKEM768", x25519),
        (&["-groups", "x25519"][..], "X25519", "X25519", x25519),
        (&["-groups", "p-256"][..], "P-256", "CurveP256", "aws-lc-rs"),
        (&["-groups", "p-384"][..], "P-384", "CurveP384", "aws-lc-rs"),
    ] {
        let got = go_connect(port, args);
        assert_eq!(got["group"], go_name, "{got}");
        assert_eq!(got["status"], 200, "{got}");
        wait_shares(admin, group, path, 1);
    }
    assert_eq!(metric(admin, SHARES, "path=\"not_applied\""), 0.0);
    assert_eq!(metric(admin, SHARES, "path=\"inline\""), 0.0);
}

#[test]
fn go_clients_get_shares_computed_by_tlsterm_for_every_group() {
    // A lone handshake's share is a batch of one: the engine only when asked to take it.
    let engine = |e: Section| e.set("x25519_small_batch_threshold", 1);
    go_clients_of_every_group(engine, x25519_path());
    // By default a batch of one is aws-lc's.
    go_clients_of_every_group(|e| e, "aws-lc-rs");
}

/// The ML-KEM-768 halves of X25519MLKEM768 shares encapsulated in the engine's batches
/// (a batch of one when asked to): Go's client decapsulates each ciphertext, so a
/// completed handshake is the proof that it is right, and `/metrics` counts them as the
/// batch's.
#[test]
fn mlkem_halves_in_the_engine_decapsulate_in_go_clients() {
    if x25519_path() != "batch" {
        println!("mlkem_halves_in_the_engine_decapsulate_in_go_clients skipped: no batch path");
        return;
    }
    let (_dir, server, port) = start(|e| {
        e.set("x25519_small_batch_threshold", 1)
            .set("mlkem_small_batch_threshold", 1)
    });
    let admin = admin_address(&server.config).unwrap();
    for _ in 0..3 {
        let got = go_connect(port, &[]);
        assert_eq!(got["group"], "X25519MLKEM768", "{got}");
        assert_eq!(got["status"], 200, "{got}");
    }
    wait_shares(admin, "X25519MLKEM768", "batch", 3);
    let encapsulations = "tlsterm_engine_mlkem_encapsulations_total";
    assert_eq!(metric(admin, encapsulations, "path=\"batch\""), 3.0);
    assert_eq!(metric(admin, encapsulations, "path=\"aws-lc-rs\""), 0.0);
}

#[test]
fn key_shares_aws_lc_rs_on_every_cpu() {
    go_clients_of_every_group(|e| e.set("key_shares", "aws-lc-rs"), "aws-lc-rs");
}

#[test]
fn rustls_full_and_resumed_handshakes_take_the_hint() {
    let (_dir, server, port) = start(|e| e.set("x25519_small_batch_threshold", 1));
    let admin = admin_address(&server.config).unwrap();
    for mode in ["full", "resume"] {
        let out = run(Command::new(TLSTERM)
            .args(["bench", &format!("https://127.0.0.1:{port}/")])
            .args(["--insecure", "--json", "--quiet", "-c", "1", "-n", "5"])
            .args(["--mode", mode]));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["errors_total"], 0, "{report}");
    }
    // Resumed TLS 1.3 handshakes (PSK with ECDHE) need a key share too. (rustls, as
    // `tlsterm bench` sets it up, offers X25519 first.)
    wait_shares(admin, "X25519", x25519_path(), 10);
    assert_eq!(metric(admin, SHARES, "path=\"not_applied\""), 0.0);
}

#[test]
fn openssl_hello_retry_and_tls12_are_computed_by_boringssl() {
    let (_dir, server, port) = start(|e| e);
    let admin = admin_address(&server.config).unwrap();
    // A share for X448 only, which tlsterm lacks: X25519 is chosen, with a
    // HelloRetryRequest, and the second ClientHello's share is BoringSSL's to answer.
    let out = s_client(
        port,
        &["-tls1_3", "-ign_eof", "-groups", "X448:X25519"],
        GET_CLOSE,
    );
    assert!(out.contains("Hello from tlsterm"), "{out}");
    wait_shares(admin, "X25519", "inline", 1);
    // TLS 1.2: no hint (its ECDHE exchange is not the TLS 1.3 key share).
    let out = s_client(
        port,
        &["-tls1_2", "-ign_eof", "-groups", "X25519"],
        GET_CLOSE,
    );
    assert!(out.contains("Hello from tlsterm"), "{out}");
    wait_shares(admin, "X25519", "inline", 2);
    // A first share of the chosen group: the hint.
    let out = s_client(
        port,
        &["-tls1_3", "-ign_eof", "-groups", "P-256:X25519"],
        GET_CLOSE,
    );
    assert!(out.contains("Hello from tlsterm"), "{out}");
    wait_shares(admin, "P-256", "aws-lc-rs", 1);
    // P-384: aws-lc's too (BoringSSL's is about 4x slower).
    let out = s_client(
        port,
        &["-tls1_3", "-ign_eof", "-groups", "P-384"],
        GET_CLOSE,
    );
    assert!(out.contains("Hello from tlsterm"), "{out}");
    wait_shares(admin, "P-384", "aws-lc-rs", 1);
    assert_eq!(metric(admin, SHARES, "path=\"not_applied\""), 0.0);
}

#[test]
fn key_shares_inline_leaves_them_to_boringssl() {
    let (_dir, server, port) = start(|e| e.set("key_shares", "inline"));
    let admin = admin_address(&server.config).unwrap();
    let got = go_connect(port, &[]);
    assert_eq!(got["group"], "X25519MLKEM768", "{got}");
    wait_shares(admin, "X25519MLKEM768", "inline", 1);
    assert_eq!(shares(admin, "X25519MLKEM768", "aws-lc-rs"), 0.0);
}

#[test]
fn a_bad_key_shares_value_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = ConfigBuilder::new()
        .section("engine", |e| e.set("key_shares", "gpu"))
        .listener(|l| l.port(1).backend("builtin"))
        .write(dir.path());
    let text = std::fs::read_to_string(&config).unwrap();
    let line = 1 + text
        .lines()
        .position(|l| l.starts_with("key_shares"))
        .unwrap();
    let err = check_refuses(&config);
    assert!(
        err.contains(&format!(":{line}:")) && err.contains("`batch`"),
        "{err}"
    );
}

/// A handshake that the certificate selection refuses (an unknown name, `unknown_sni =
/// "refuse"`) fails before its key share is computed: no share joins the engine's queue.
/// Shares are counted as they are computed only on the batch path (AVX-512 IFMA).
#[test]
fn a_refused_handshake_computes_no_key_share() {
    if x25519_path() != "batch" {
        println!("a_refused_handshake_computes_no_key_share skipped: no batch path to count");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (cert, key) = make_cert(dir.path(), "known", "known.test", KeyType::EcdsaP256);
    let config = ConfigBuilder::new()
        .section("engine", |e| e.set("x25519_small_batch_threshold", 1))
        .listener(|l| {
            l.port(port)
                .backend("builtin")
                .set("unknown_sni", "refuse")
                .cert(&cert, &key)
        })
        .write(dir.path());
    let server = Server::start(&config);
    let admin = admin_address(&server.config).unwrap();
    let flushes = "tlsterm_engine_key_share_flushes_total";
    let client = |name: &str| {
        let args = [
            "-servername",
            name,
            "-tls1_3",
            "-groups",
            "X25519",
            "-ign_eof",
        ];
        s_client(port, &args, GET_CLOSE)
    };
    let out = client("other.test");
    assert!(!out.contains("Hello from tlsterm"), "{out}");
    wait_for_metric(
        admin,
        "tlsterm_handshake_failures_total{reason=\"unknown_sni\"} 1",
    );
    assert_eq!(
        metric(admin, flushes, ""),
        0.0,
        "a refused handshake's share"
    );
    // The same client with a known name: its share is computed, and counted.
    let out = client("known.test");
    assert!(out.contains("Hello from tlsterm"), "{out}");
    wait_shares(admin, "X25519", "batch", 1);
    assert_eq!(metric(admin, flushes, ""), 1.0);
}
