//! The load generator against an in-process rustls server on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use rustls::crypto::aws_lc_rs;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tlsterm_bench::BenchArgs,
}

fn args(list: &[&str]) -> tlsterm_bench::BenchArgs {
    let mut v = vec!["bench", "--insecure", "--quiet"];
    v.extend_from_slice(list);
    Cli::parse_from(v).args
}

#[derive(Clone, Copy)]
enum Behaviour {
    /// Answer HTTP/1.1 requests: `/` gets 5 bytes, `/bytes/N` gets N bytes.
    Http,
    /// Complete the handshake, then close without answering.
    CloseAfterHandshake,
    /// Answer the first connection's request with an unparseable response, then
    /// serve like `Http`.
    MalformedFirst,
}

/// Start a TLS server on an ephemeral port in a background thread.
fn server(behaviour: Behaviour) -> SocketAddr {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let chain = vec![CertificateDer::from(cert.cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
    let config = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = TcpListener::from_std(listener).unwrap();
            for accepted in 0u64.. {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::task::spawn_local(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    match behaviour {
                        Behaviour::Http => {
                            let _ = serve_http(&mut tls).await;
                        }
                        Behaviour::MalformedFirst if accepted == 0 => {
                            let _ = answer_malformed(&mut tls).await;
                        }
                        Behaviour::MalformedFirst => {
                            let _ = serve_http(&mut tls).await;
                        }
                        Behaviour::CloseAfterHandshake => {}
                    }
                    let _ = tls.shutdown().await;
                });
            }
        });
    });
    addr
}

/// Read one request and answer it with a response whose Content-Length is not a number.
async fn answer_malformed<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\nhello")
        .await
}

async fn serve_http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut tmp).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&tmp[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end);
        let path = head.split(' ').nth(1).unwrap_or("/");
        let len: usize = path
            .strip_prefix("/bytes/")
            .and_then(|n| n.parse().ok())
            .unwrap_or(5);
        let close = head.to_ascii_lowercase().contains("connection: close");
        let mut resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n").into_bytes();
        resp.resize(resp.len() + len, b'x');
        s.write_all(&resp).await?;
        if close {
            return Ok(());
        }
    }
}

#[test]
fn full_mode_resumes_nothing() {
    let addr = server(Behaviour::Http);
    let url = format!("https://{addr}/");
    for version in ["1.2", "1.3"] {
        let r = tlsterm_bench::run_load(&args(&[
            &url,
            "-c",
            "4",
            "-n",
            "40",
            "--tls-version",
            version,
        ]))
        .unwrap();
        assert_eq!(r.errors_total, 0, "{:?}", r.errors);
        assert_eq!(r.handshakes, 40);
        assert_eq!(r.requests, 40);
        assert_eq!(
            r.resumed, 0,
            "full mode must offer no session (TLS {version})"
        );
        assert_eq!(r.body_bytes, 200);
        assert_eq!(r.handshake_latency.count, 40);
    }
}

#[test]
fn resume_mode_resumes_all_but_the_first_of_each_session() {
    let addr = server(Behaviour::Http);
    let url = format!("https://{addr}/");
    for version in ["1.2", "1.3"] {
        // One connection slot, so the 16 requests form exactly 4 sessions of 4.
        let r = tlsterm_bench::run_load(&args(&[
            &url,
            "--mode",
            "resume",
            "-c",
            "1",
            "-n",
            "16",
            "--per-session",
            "4",
            "--tls-version",
            version,
        ]))
        .unwrap();
        assert_eq!(r.errors_total, 0, "{:?}", r.errors);
        assert_eq!(r.handshakes, 16);
        assert_eq!(
            r.resumed, 12,
            "3 of every 4 connections resume (TLS {version})"
        );
    }
}

#[test]
fn bulk_mode_keeps_connections_alive() {
    let addr = server(Behaviour::Http);
    let url = format!("https://{addr}/bytes/1048576");
    let r =
        tlsterm_bench::run_load(&args(&[&url, "--mode", "bulk", "-c", "2", "-n", "20"])).unwrap();
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    assert_eq!(r.requests, 20);
    assert_eq!(r.handshakes, 2);
    assert_eq!(r.body_bytes, 20 << 20);
    assert!(r.mb_per_s > 0.0);
}

#[test]
fn open_loop_runs_at_the_given_rate() {
    let addr = server(Behaviour::Http);
    let url = format!("https://{addr}/");
    let r =
        tlsterm_bench::run_load(&args(&[&url, "--rate", "200", "-n", "50", "-c", "8"])).unwrap();
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    assert_eq!(r.requests, 50);
    // 50 units at 200/s are scheduled over 245 ms: the run cannot be much shorter.
    assert!(r.elapsed_s >= 0.24, "{}", r.elapsed_s);
    assert_eq!(r.rate, Some(200.0));
    assert_eq!(r.start_lag.count, 50);
}

#[test]
fn errors_are_counted_when_the_server_closes() {
    let addr = server(Behaviour::CloseAfterHandshake);
    let url = format!("https://{addr}/");
    let r = tlsterm_bench::run_load(&args(&[&url, "-c", "2", "-n", "10"])).unwrap();
    assert_eq!(r.requests, 0);
    assert_eq!(r.errors_total, 10, "{:?}", r.errors);
    assert!(
        r.errors.keys().all(|k| k.starts_with("eof")),
        "{:?}",
        r.errors
    );
}

#[test]
fn connection_refused_is_an_error_kind() {
    // Bind then drop to get a port nobody listens on.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("https://{addr}/");
    let r = tlsterm_bench::run_load(&args(&[&url, "-c", "1", "-n", "3"])).unwrap();
    assert_eq!(
        r.errors.get("connect: connection refused"),
        Some(&3),
        "{:?}",
        r.errors
    );
}

#[test]
fn threads_share_the_request_budget() {
    let addr = server(Behaviour::Http);
    let url = format!("https://{addr}/");
    let r =
        tlsterm_bench::run_load(&args(&[&url, "--threads", "2", "-c", "4", "-n", "40"])).unwrap();
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    assert_eq!(r.requests, 40);
    assert_eq!(r.threads, 2);
    // Both the text and the JSON forms of the report render.
    assert!(r.text().contains("handshakes: 40"));
    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert_eq!(json["handshakes"], 40);
    assert!(json["handshake_latency"]["p99_us"].as_u64().unwrap() > 0);
}

#[test]
fn bulk_open_loop_reuses_connections() {
    let addr = server(Behaviour::Http);
    let url = format!("https://{addr}/bytes/65536");
    let r = tlsterm_bench::run_load(&args(&[
        &url, "--mode", "bulk", "--rate", "500", "-n", "40", "-c", "2",
    ]))
    .unwrap();
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    assert_eq!(r.requests, 40);
    assert!(
        r.handshakes <= 2,
        "{} handshakes for 2 keep-alive slots",
        r.handshakes
    );
    assert_eq!(r.body_bytes, 40 * 65536);
}

#[test]
fn a_malformed_response_fails_only_its_own_request() {
    for mode in ["full", "resume", "bulk"] {
        let addr = server(Behaviour::MalformedFirst);
        let url = format!("https://{addr}/");
        // One slot: every request after the first reuses the reader that saw the bad one.
        let r =
            tlsterm_bench::run_load(&args(&[&url, "--mode", mode, "-c", "1", "-n", "5"])).unwrap();
        assert_eq!(
            r.errors.get("http: bad Content-Length"),
            Some(&1),
            "{mode}: {:?}",
            r.errors
        );
        assert_eq!(r.errors_total, 1, "{mode}: {:?}", r.errors);
        assert_eq!(r.requests, 4, "{mode}");
    }
}

/// Run `run_load` on a thread and give up after a while: a refusal must come at once,
/// not after a run that would never end.
fn run_load_briefly(list: &[&str]) -> anyhow::Result<tlsterm_bench::stats::Report> {
    let a = args(list);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(tlsterm_bench::run_load(&a));
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("run_load did not return")
}

#[test]
fn unschedulable_rates_are_refused() {
    // Nothing listens here: a refusal never gets as far as connecting.
    let url = "https://127.0.0.1:9/";
    for rate in ["1e10", "2e9", "1e-30"] {
        let e = run_load_briefly(&[url, "--rate", rate, "-d", "1s", "-c", "1"]).unwrap_err();
        assert!(e.to_string().contains("--rate"), "{rate}: {e}");
    }
    // The limit is per thread: two threads may schedule twice as much.
    let e = run_load_briefly(&[
        url,
        "--rate",
        "3e9",
        "--threads",
        "2",
        "-c",
        "2",
        "-d",
        "1s",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("at most 2000000000"), "{e}");
}

#[test]
fn more_threads_than_connections_are_refused() {
    let e = run_load_briefly(&[
        "https://127.0.0.1:9/",
        "--threads",
        "8",
        "-c",
        "2",
        "-n",
        "1",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("--threads"), "{e}");
}

#[test]
fn durations_past_the_clock_are_refused() {
    // Too long for a Duration: refused while parsing the command line.
    assert!(Cli::try_parse_from(["bench", "--duration", "1e20"]).is_err());
    assert!(Cli::try_parse_from(["bench", "--timeout", "1e20"]).is_err());
    // A Duration, but past the last time the clock can represent.
    let e =
        run_load_briefly(&["https://127.0.0.1:9/", "--duration", "1e19", "-c", "1"]).unwrap_err();
    assert!(e.to_string().contains("--duration"), "{e}");
}

#[test]
fn empty_records_are_refused() {
    let e = tlsterm_bench::run(&args(&["--mode", "record", "--record-size", "0"])).unwrap_err();
    assert!(e.to_string().contains("--record-size"), "{e}");
}

/// Idle mode opens the connections, each with its request answered, and finds the
/// server's process by its listening port (here, this test's own process).
#[test]
fn idle_mode_holds_connections_and_reads_the_servers_process() {
    let addr = server(Behaviour::Http);
    let url = format!("https://{addr}/");
    let report = tlsterm_bench::idle::run_idle(&args(&[
        &url,
        "--mode",
        "idle",
        "-c",
        "20",
        "--threads",
        "2",
        "-d",
        "0s",
    ]))
    .unwrap();
    assert_eq!(report.server_pid, std::process::id());
    assert_eq!(
        (report.open, report.errors),
        (20, 0),
        "{:?}",
        report.first_error
    );
    assert!(report.before.rss_kib > 0 && report.idle.rss_kib > 0);

    // A server that closes after its handshake leaves nothing open: errors, not a report
    // of idle connections.
    let closing = server(Behaviour::CloseAfterHandshake);
    let url = format!("https://{closing}/");
    let pid = std::process::id().to_string();
    let report = tlsterm_bench::idle::run_idle(&args(&[
        &url,
        "--mode",
        "idle",
        "-c",
        "3",
        "-d",
        "0s",
        "--server-pid",
        &pid,
    ]))
    .unwrap();
    assert_eq!((report.open, report.errors), (0, 3));
}
