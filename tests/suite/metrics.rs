//! The admin listener: exact counts after known traffic, a parseable exposition, and
//! bad requests answered with 4xx without harm.

use crate::common::config::ConfigBuilder;
use crate::common::*;
use boring::ssl::{SslConnector, SslMethod, SslSession, SslVerifyMode, SslVersion};
use prometheus_parse::{Scrape, Value};
use tokio::net::TcpStream;

/// A TLS 1.2 connection, resuming `session` if given; returns the stream and its session.
async fn connect_tls12(port: u16, session: Option<&SslSession>) -> (TlsClient, SslSession) {
    let mut builder = SslConnector::builder(SslMethod::tls()).unwrap();
    builder.set_verify(SslVerifyMode::NONE);
    builder
        .set_max_proto_version(Some(SslVersion::TLS1_2))
        .unwrap();
    let mut config = builder.build().configure().unwrap();
    if let Some(session) = session {
        // SAFETY: the session comes from a connection to this same server and context type.
        unsafe { config.set_session(session).unwrap() };
    }
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let tls = tokio_boring::connect(config, "localhost", tcp)
        .await
        .unwrap();
    let session = tls.ssl().session().unwrap().to_owned();
    (tls, session)
}

fn scrape(admin: std::net::SocketAddr) -> Scrape {
    let (status, body) = admin_get(admin, "/metrics");
    assert_eq!(status, 200);
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("valid Prometheus text format")
}

fn value(scrape: &Scrape, metric: &str, label: Option<(&str, &str)>) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            Value::Histogram(ref buckets) => buckets.last().map_or(0.0, |b| b.count),
            Value::Summary(_) => 0.0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exactly_the_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // One worker: connections are handled in the order they arrive, so by the time the
    // last response is read every earlier handshake has been recorded.
    let config = ConfigBuilder::new()
        .set("workers", 1)
        .listener(|l| l.port(port).backend("builtin"))
        .write(dir.path());
    let server = Server::start(&config);
    let admin = admin_address(&config).unwrap();

    const FAILED: usize = 2;
    const FULL: usize = 5;
    const RESUMED: usize = 3;
    for _ in 0..FAILED {
        let out = s_client(port, &["-tls1_2", "-cipher", "AES128-SHA"], "");
        assert!(!out.contains("Cipher is AES128-SHA"), "{out}");
    }
    let mut session = None;
    for _ in 0..FULL {
        let (mut tls, s) = connect_tls12(port, None).await;
        assert!(!tls.ssl().session_reused());
        http_get(&mut tls, "/").await.unwrap();
        session = Some(s);
    }
    for _ in 0..RESUMED {
        let (mut tls, _) = connect_tls12(port, session.as_ref()).await;
        assert!(tls.ssl().session_reused(), "the server resumed the session");
        http_get(&mut tls, "/").await.unwrap();
    }

    let scrape = scrape(admin);
    assert_eq!(
        value(&scrape, "tlsterm_handshakes_total", Some(("kind", "full"))),
        FULL as f64
    );
    assert_eq!(
        value(
            &scrape,
            "tlsterm_handshakes_total",
            Some(("kind", "resumed"))
        ),
        RESUMED as f64
    );
    assert_eq!(
        value(
            &scrape,
            "tlsterm_handshake_failures_total",
            Some(("reason", "no_shared_cipher"))
        ),
        FAILED as f64
    );
    assert_eq!(
        value(&scrape, "tlsterm_handshake_failures_total", None),
        FAILED as f64
    );
    assert_eq!(
        value(&scrape, "tlsterm_connections_accepted_total", None),
        (FAILED + FULL + RESUMED) as f64
    );
    assert_eq!(
        value(
            &scrape,
            "tlsterm_tls_versions_total",
            Some(("version", "TLSv1.2"))
        ),
        (FULL + RESUMED) as f64
    );
    // Every full handshake signed once (self-signed default: RSA or ECDSA, batch or inline).
    assert_eq!(
        value(&scrape, "tlsterm_engine_operations_total", None),
        FULL as f64
    );
    assert_eq!(
        value(
            &scrape,
            "tlsterm_handshake_seconds",
            Some(("phase", "total"))
        ),
        (FULL + RESUMED) as f64
    );
    assert_eq!(
        value(
            &scrape,
            "tlsterm_handshake_seconds",
            Some(("phase", "engine_wait"))
        ),
        FULL as f64
    );
    drop(server);
}

/// Each failed handshake is counted under the cause BoringSSL's reason code names: plain
/// HTTP on the TLS port, a client that offers only TLS 1.1, and a client that refuses the
/// certificate with an alert.
#[test]
fn handshake_failures_are_counted_by_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = ConfigBuilder::new()
        .listener(|l| l.port(port).backend("builtin"))
        .write(dir.path());
    let server = Server::start(&config);
    let admin = admin_address(&config).unwrap();

    let (status, _) = raw_http(([127, 0, 0, 1], port).into(), GET_CLOSE);
    assert_ne!(status, 200, "plain HTTP is not answered as HTTP");
    wait_for_metric(
        admin,
        "tlsterm_handshake_failures_total{reason=\"not_tls\"} 1",
    );

    let out = s_client(port, &["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"], "");
    assert!(out.contains("alert protocol version"), "{out}");
    wait_for_metric(
        admin,
        "tlsterm_handshake_failures_total{reason=\"protocol_version\"} 1",
    );

    // The server's self-signed certificate is in no system trust store: the client aborts
    // with an alert once it has read it. Over TLS 1.2: OpenSSL's TLS 1.3 alert at that point
    // reaches BoringSSL as a record it cannot decrypt, which is counted as `other`.
    let out = s_client(
        port,
        &[
            "-tls1_2",
            "-verify_return_error",
            "-CAfile",
            "/etc/ssl/certs/ca-certificates.crt",
        ],
        "",
    );
    assert!(out.contains("verify error"), "{out}");
    wait_for_metric(
        admin,
        "tlsterm_handshake_failures_total{reason=\"client_alert\"} 1",
    );
    let scrape = scrape(admin);
    assert_eq!(
        value(&scrape, "tlsterm_handshake_failures_total", None),
        3.0,
        "no failure counted twice or under another cause"
    );
    drop(server);
}

/// Per-worker series: one per worker, adding up to the process totals; CPU time sampled;
/// `tlsterm stats` shows a row per worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_worker_series_add_up_to_the_totals() {
    let (_dir, server, port) = start_listener("builtin", "");
    let admin = admin_address(&server.config).unwrap();
    const CONNECTIONS: usize = 12;
    for _ in 0..CONNECTIONS {
        let (mut tls, _) = connect_tls12(port, None).await;
        http_get(&mut tls, "/").await.unwrap();
    }

    let scrape = scrape(admin);
    for worker in ["0", "1"] {
        for metric in [
            "tlsterm_worker_connections_active",
            "tlsterm_worker_handshakes_total",
        ] {
            assert!(
                scrape
                    .samples
                    .iter()
                    .any(|s| s.metric == metric && s.labels.get("worker") == Some(worker)),
                "{metric} of worker {worker}"
            );
        }
    }
    for (per_worker, total) in [
        (
            "tlsterm_worker_connections_accepted_total",
            "tlsterm_connections_accepted_total",
        ),
        (
            "tlsterm_worker_handshakes_total",
            "tlsterm_handshakes_total",
        ),
        (
            "tlsterm_worker_engine_operations_total",
            "tlsterm_engine_operations_total",
        ),
    ] {
        assert_eq!(
            value(&scrape, per_worker, None),
            value(&scrape, total, None),
            "{per_worker}"
        );
    }
    assert_eq!(
        value(&scrape, "tlsterm_worker_handshakes_total", None),
        CONNECTIONS as f64
    );

    // CPU time is sampled every second: it shows up without any more traffic.
    let cpu = async {
        loop {
            if metric(admin, "tlsterm_worker_cpu_seconds_total", "") > 0.0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(DEADLINE, cpu)
        .await
        .expect("worker CPU time is sampled");

    let stats =
        run(std::process::Command::new(TLSTERM).args(["stats", "--admin", &admin.to_string()]));
    let text = String::from_utf8_lossy(&stats.stdout);
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("worker"))
        .skip(1)
        .take(2)
        .collect();
    assert!(
        rows[0].starts_with("0 ") && rows[1].starts_with("1 "),
        "{text}"
    );
}

/// Per-listener series: each listening address counts its own connections, handshakes
/// and failed handshakes, and `tlsterm stats` shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_listener_series_count_each_address() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (free_port(), free_port());
    // One worker, and the failed handshake first: the client may see the alert an instant
    // before tlsterm counts the failure, but the worker counts it before it accepts the
    // next connection.
    let config = ConfigBuilder::new()
        .set("workers", 1)
        .listener(|l| l.port(a).backend("builtin"))
        .listener(|l| l.port(b).backend("builtin"))
        .write(dir.path());
    let server = Server::start(&config);
    let admin = admin_address(&server.config).unwrap();
    let out = s_client(b, &["-tls1_2", "-cipher", "AES128-SHA"], "");
    assert!(!out.contains("Cipher is AES128-SHA"), "{out}");
    for (port, count) in [(a, 3), (b, 2)] {
        for _ in 0..count {
            let (mut tls, _) = connect_tls12(port, None).await;
            http_get(&mut tls, "/").await.unwrap();
        }
    }

    let scrape = scrape(admin);
    let at = |port: u16| Some(("listener", format!("127.0.0.1:{port}")));
    let value_at = |metric: &str, port: u16| {
        let label = at(port);
        let label = label.as_ref().map(|(k, v)| (*k, v.as_str()));
        value(&scrape, metric, label)
    };
    assert_eq!(value_at("tlsterm_listener_handshakes_total", a), 3.0);
    assert_eq!(value_at("tlsterm_listener_handshakes_total", b), 2.0);
    assert_eq!(
        value_at("tlsterm_listener_handshake_failures_total", a),
        0.0
    );
    assert_eq!(
        value_at("tlsterm_listener_handshake_failures_total", b),
        1.0
    );
    assert_eq!(
        value_at("tlsterm_listener_connections_accepted_total", b),
        3.0
    );

    let stats =
        run(std::process::Command::new(TLSTERM).args(["stats", "--admin", &admin.to_string()]));
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("handshakes") && l.contains(&format!("127.0.0.1:{a}"))),
        "{text}"
    );
}

#[test]
fn admin_rejects_bad_requests_with_4xx_and_keeps_serving() {
    let (_dir, server, port) = start_listener("builtin", "");
    let admin = admin_address(&server.config).unwrap();

    assert_eq!(admin_get(admin, "/healthz"), (200, "ok\n".to_string()));
    assert_eq!(admin_get(admin, "/nope").0, 404);
    assert_eq!(
        raw_http(
            admin,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .0,
        405
    );
    let malformed = raw_http(admin, "THIS IS NOT HTTP\r\n\r\n").0;
    assert!(
        (400..500).contains(&malformed),
        "malformed request got {malformed}"
    );
    let huge_header = format!(
        "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(200_000)
    );
    let status = raw_http(admin, &huge_header).0;
    assert!(
        status == 0 || (400..500).contains(&status),
        "oversized request got {status}"
    );
    // Still serving, and TLS traffic is unaffected.
    assert_eq!(admin_get(admin, "/healthz").0, 200);
    let out = s_client(port, &["-servername", "localhost", "-ign_eof"], GET_CLOSE);
    assert!(out.contains("Hello from tlsterm"), "{out}");
}

#[test]
fn stats_renders_histograms_from_a_running_server() {
    let (_dir, server, port) = start_listener("builtin", "");
    let admin = admin_address(&server.config).unwrap();
    let out = s_client(port, &["-servername", "localhost", "-ign_eof"], GET_CLOSE);
    assert!(out.contains("Hello from tlsterm"));
    let stats =
        run(std::process::Command::new(TLSTERM).args(["stats", "--admin", &admin.to_string()]));
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(
        text.contains("handshake total (accept to done): count 1"),
        "{text}"
    );
    assert!(
        text.contains("handshake waiting on the private-key engine: count 1"),
        "{text}"
    );
    assert!(text.contains("|@"), "{text}");
}
