//! `tlsterm bench --http3`, the HTTP/3 load generator (quiche), against `tlsterm serve`
//! with a QUIC listener on the built-in backend: full and resumed handshakes as the client
//! counts them and as the server's own metrics do, bulk responses of the size asked for,
//! and the TLS options that mean nothing over QUIC refused.

use std::net::SocketAddr;
use std::process::Command;

use crate::common::*;

const HANDSHAKES: &str = "tlsterm_quic_handshakes_total";

/// tlsterm answering HTTP/3 on a free port from the built-in backend; its admin address.
fn start() -> (tempfile::TempDir, Server, u16, SocketAddr) {
    let (dir, server, port) = start_listener("builtin", "quic = true");
    let admin = admin_address(&server.config).unwrap();
    (dir, server, port, admin)
}

/// `tlsterm bench --http3` on `path` of 127.0.0.1:`port` with `args`; its JSON report,
/// which must count no error.
fn bench_h3(port: u16, path: &str, args: &[&str]) -> serde_json::Value {
    let out = run(Command::new(TLSTERM)
        .args(["bench", &format!("https://127.0.0.1:{port}{path}")])
        .args(["--http3", "--insecure", "--json", "--quiet"])
        .args(args));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors_total"], 0, "{report}");
    assert_eq!(report["http3"], true, "{report}");
    report
}

fn count(report: &serde_json::Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key}: {report}"))
}

/// Waits until the server has counted `n` handshakes of `kind` (it counts a handshake when
/// it completes, which may be after the client has seen it complete).
fn wait_for_handshakes(admin: SocketAddr, kind: &str, n: u64) {
    let line = format!("{HANDSHAKES}{{kind=\"{kind}\"}} {n}");
    wait_for_metric(admin, &line);
}

#[test]
fn full_mode_makes_a_new_connection_per_request_without_resuming() {
    let (_dir, _server, port, admin) = start();
    let report = bench_h3(port, "/", &["--mode", "full", "-c", "4", "-n", "20"]);
    assert_eq!(count(&report, "handshakes"), 20, "{report}");
    assert_eq!(count(&report, "resumed"), 0, "{report}");
    assert_eq!(count(&report, "requests"), 20, "{report}");
    assert_eq!(report["status"]["200"], 20, "{report}");
    assert_eq!(
        report["negotiated"]["QUICv1 TLSv1_3 h3 X25519"], 20,
        "{report}"
    );
    wait_for_handshakes(admin, "full", 20);
    assert_eq!(metric(admin, HANDSHAKES, "kind=\"resumed\""), 0.0);
    assert_eq!(metric(admin, "tlsterm_quic_streams_total", ""), 20.0);
}

#[test]
fn resume_mode_resumes_with_the_tickets_of_earlier_connections() {
    let (_dir, _server, port, admin) = start();
    let report = bench_h3(
        port,
        "/",
        &[
            "--mode",
            "resume",
            "--per-session",
            "4",
            "-c",
            "2",
            "-n",
            "24",
        ],
    );
    let (handshakes, resumed) = (count(&report, "handshakes"), count(&report, "resumed"));
    assert_eq!(handshakes, 24, "{report}");
    // Each chain of 4 connections starts with a full handshake. How the 24 connections
    // fall to the two concurrent slots is up to the scheduler: 6 chains, or 7 when neither
    // slot made a multiple of 4.
    assert!((17..=18).contains(&resumed), "{report}");
    assert_eq!(count(&report, "requests"), 24, "{report}");
    wait_for_handshakes(admin, "resumed", resumed);
    wait_for_handshakes(admin, "full", handshakes - resumed);
}

#[test]
fn bulk_mode_keeps_connections_and_counts_the_bytes_of_large_responses() {
    let (_dir, _server, port, admin) = start();
    let report = bench_h3(
        port,
        "/bytes/1048576",
        &["--mode", "bulk", "-c", "2", "-n", "8"],
    );
    assert_eq!(count(&report, "requests"), 8, "{report}");
    assert_eq!(count(&report, "body_bytes"), 8 << 20, "{report}");
    assert_eq!(count(&report, "handshakes"), 2, "{report}");
    assert!(report["mb_per_s"].as_f64().unwrap() > 0.0, "{report}");
    wait_for_handshakes(admin, "full", 2);
    // The client closed its connections at the end: the server holds none open.
    wait_for_metric(admin, "tlsterm_quic_connections 0");
}

/// With `--cacert`, the server's certificate is verified: for the name it carries the
/// handshakes complete; for another name every one fails with the client's TLS alert.
#[test]
fn the_server_certificate_is_verified_against_the_name_asked_for() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = make_cert(certs.path(), "site", "localhost", KeyType::EcdsaP256);
    let table = format!(
        "quic = true\n[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    let (_dir, _server, port) = start_listener("builtin", &table);
    let bench = |sni: &str| {
        let out = run(Command::new(TLSTERM)
            .args(["bench", &format!("https://127.0.0.1:{port}/"), "--http3"])
            .args([
                "--json", "--quiet", "-c", "1", "-n", "2", "--sni", sni, "--cacert",
            ])
            .arg(&cert));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let good = bench("localhost");
    assert_eq!(good["errors_total"], 0, "{good}");
    assert_eq!(good["handshakes"], 2, "{good}");
    let bad = bench("other.test");
    assert_eq!(bad["handshakes"], 0, "{bad}");
    assert_eq!(bad["errors_total"], 2, "{bad}");
    let kinds = bad["errors"].as_object().unwrap();
    assert!(
        kinds.keys().all(|k| k.starts_with("handshake: TLS alert")),
        "{bad}"
    );
}

#[test]
fn options_that_mean_nothing_over_quic_are_refused() {
    for extra in [
        &["--mode", "resume", "--early-data"][..],
        &["--tls-version", "1.2"],
        &["--cipher", "TLS_AES_128_GCM_SHA256"],
        &["--alpn", "h2"],
    ] {
        let out = Command::new(TLSTERM)
            .args(["bench", "https://127.0.0.1:9/", "--http3", "--insecure"])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(
            stderr.contains("--http3 does not take"),
            "{extra:?}: {stderr}"
        );
    }
}

/// QUIC handshakes wait for the worker's engine together, as TCP handshakes do: with 16
/// handshakes running at once, signatures are computed in batches of more than one (a
/// QUIC handshake that the queue did not count as running made it sign each alone).
#[test]
fn concurrent_quic_handshakes_share_engine_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = make_cert(dir.path(), "rsa", "localhost", KeyType::Rsa2048);
    let port = free_port();
    let listener = format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\nquic = true\n\
         [[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"",
        cert.display(),
        key.display()
    );
    // Every batch goes to the kernel, however small: what is counted is how many
    // signatures each batch held.
    let engine = "[engine]\nsmall_batch_threshold = 1\npoll_delay = \"2ms\"";
    let config = write_config(dir.path(), engine, &[listener]);
    let _server = Server::start(&config);
    let admin = admin_address(&config).unwrap();
    let report = bench_h3(port, "/", &["--mode", "full", "-c", "16", "-n", "96"]);
    assert_eq!(count(&report, "handshakes"), 96, "{report}");
    wait_for_handshakes(admin, "full", 96);
    let batched = metric(
        admin,
        "tlsterm_engine_operations_total",
        "algorithm=\"rsa2048\",path=\"batch\"",
    );
    let batches = metric(admin, "tlsterm_engine_batch_operations_count", "");
    assert_eq!(batched, 96.0, "every signature went through the engine");
    assert!(
        batches < batched,
        "{batched} signatures in {batches} batches: none held more than one"
    );
}

/// Idle mode over HTTP/3 opens QUIC connections, each with its request answered, holds
/// them, and reads the server's process (found by the TCP port its QUIC listener shares).
#[test]
fn idle_mode_holds_quic_connections_open() {
    let (_dir, server, port, admin) = start();
    let out = run(Command::new(TLSTERM)
        .args(["bench", &format!("https://127.0.0.1:{port}/")])
        .args(["--http3", "--insecure", "--json", "--mode", "idle"])
        .args(["-c", "20", "--threads", "2", "-d", "0s"]));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (count(&report, "open"), count(&report, "errors")),
        (20, 0),
        "{report}"
    );
    assert_eq!(count(&report, "server_pid"), u64::from(server.child.id()));
    // Half were opened and measured first.
    assert!(
        report["half_idle"]["rss_kib"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(
        report["rss_kib_per_added_connection"].is_number(),
        "{report}"
    );
    // The client left without closing them: the server still holds all twenty, each
    // after a full handshake, until its idle timeout.
    wait_for_handshakes(admin, "full", 20);
    wait_for_metric(admin, "tlsterm_quic_connections 20");
}
