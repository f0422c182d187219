//! Hostile clients, faulty backends, bad reloads, signals under traffic and running out of
//! file descriptors: a `tlsterm serve` child process on 127.0.0.1 must keep serving
//! everyone else. Synchronisation is by log lines, socket and process state; the only
//! timed waits are for deadlines the test configured (and one bounded CPU-measurement
//! window).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use boring::ssl::SslVersion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A listener on `port` in front of the built-in backend, plus `extra` TOML lines.
fn builtin_listener(port: u16, extra: &str) -> String {
    format!("address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n{extra}")
}

/// A listener on `port` in front of `backend`, plus `extra` TOML lines.
fn backend_listener(port: u16, backend: SocketAddr, extra: &str) -> String {
    format!("address = \"127.0.0.1:{port}\"\nbackends = [\"{backend}\"]\n{extra}")
}

/// One full TLS connection and one request through the built-in backend.
async fn one_request(port: u16) -> anyhow::Result<()> {
    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[]).await?;
    let body = http_get(&mut client, "/").await?;
    anyhow::ensure!(!body.is_empty(), "empty body");
    Ok(())
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after "(comm)": state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as u64
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Connections waiting in the accept queues (all workers' SO_REUSEPORT sockets) of `port`.
fn accept_backlog(port: u16) -> usize {
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .expect("ss runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1)?.parse::<usize>().ok())
        .sum()
}

/// Reads until EOF or error; returns what was read, whether it ended with an error, and
/// when it ended. Panics if the stream stays open past `DEADLINE`.
async fn read_until_closed<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
) -> (Vec<u8>, bool, Instant) {
    let mut got = Vec::new();
    let result = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut got))
        .await
        .expect("connection closed by the server");
    (got, result.is_err(), Instant::now())
}

/// The first bytes of a TLS 1.2-style ClientHello record: a record header announcing 512
/// bytes and the start of the handshake message. The server must wait for the rest.
const CLIENT_HELLO_PREFIX: &[u8] = &[
    0x16, 0x03, 0x01, 0x02, 0x00, // handshake record, 512 bytes
    0x01, 0x00, 0x01, 0xfc, // ClientHello, 508 bytes
    0x03, 0x03, // client_version TLS 1.2
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
    27, 28, 29, 30, 31, 32, // random
];

/// A client that sends `CLIENT_HELLO_PREFIX` one byte a second; returns how long the
/// server kept it open (from connect to EOF/reset).
fn slow_client(port: u16) -> std::thread::JoinHandle<Duration> {
    std::thread::spawn(move || {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let start = Instant::now();
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_drip = stop.clone();
        let drip = std::thread::spawn(move || {
            for byte in CLIENT_HELLO_PREFIX {
                if stop_drip.load(Ordering::Relaxed) || writer.write_all(&[*byte]).is_err() {
                    return;
                }
                // The client's behaviour under test: one byte a second.
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        let mut reader = &stream;
        let mut buf = [0u8; 256];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => continue, // an alert, then EOF
            }
        }
        let open_for = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        let _ = stream.shutdown(std::net::Shutdown::Both);
        drip.join().unwrap();
        open_for
    })
}

// ---------------------------------------------------------------------------------------
// Hostile clients
// ---------------------------------------------------------------------------------------

/// Clients dripping a ClientHello one byte a second are cut at the handshake deadline,
/// cost the server almost no CPU meanwhile, and other clients are served all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_at_the_handshake_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        "[log]\nconnections = true",
        &[builtin_listener(port, "handshake_timeout = \"2s\"")],
    );
    let server = Server::start(&config);
    let pid = server.child.id();
    let cpu_before = cpu_ticks(pid);

    let slow: Vec<_> = (0..20).map(|_| slow_client(port)).collect();
    // Meanwhile, everyone else is served (each within the slow clients' deadline).
    for _ in 0..5 {
        let start = Instant::now();
        one_request(port).await.unwrap();
        assert!(start.elapsed() < Duration::from_secs(2));
    }
    for handle in slow {
        let open_for = tokio::task::block_in_place(|| handle.join().unwrap());
        assert!(
            open_for >= Duration::from_millis(1900) && open_for < Duration::from_secs(6),
            "slow client cut after {open_for:?}, handshake_timeout is 2s"
        );
    }
    let cpu = cpu_ticks(pid) - cpu_before;
    // 20 slow clients over 2 s plus 5 real handshakes: well under half a second of CPU.
    assert!(
        cpu * 1000 / clock_ticks_per_second() < 500,
        "server used {cpu} ticks"
    );
    server.log.wait_for("close=handshake_timeout", 0);
    one_request(port).await.unwrap();
}

/// Garbage instead of a ClientHello closes that connection at once (no waiting for the
/// handshake deadline); an established connection and new ones go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_closes_only_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        "[log]\nconnections = true",
        &[builtin_listener(port, "handshake_timeout = \"20s\"")],
    );
    let server = Server::start(&config);

    let mut established = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    http_get(&mut established, "/").await.unwrap();

    let garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
        vec![0xff; 4096],
        // A handshake record whose body is not a ClientHello.
        [&[0x16, 0x03, 0x01, 0x00, 0x10][..], &[0xee; 16]].concat(),
        // SSLv2-style hello.
        vec![
            0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10,
        ],
        // An alert before anything else.
        vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28],
    ];
    for bytes in &garbage {
        let start = Instant::now();
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        // The server may close before reading everything: a reset here is fine.
        let _ = stream.write_all(bytes).await;
        let (_, _, closed) = read_until_closed(&mut stream).await;
        assert!(
            closed - start < Duration::from_secs(5),
            "garbage {:?}… kept open {:?}",
            &bytes[..bytes.len().min(8)],
            closed - start
        );
    }
    server.log.wait_for("close=handshake_failed", 0);
    http_get(&mut established, "/").await.unwrap();
    one_request(port).await.unwrap();
}

/// At `max_connections` per worker the workers stop accepting: extra clients wait in the
/// kernel's backlog (not refused) and are served once the others close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_pauses_accepting_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // write_config runs 2 workers: at most 2 connections at once.
    let config = write_config(
        dir.path(),
        "",
        &[builtin_listener(port, "max_connections = 1")],
    );
    let server = Server::start(&config);

    const CLIENTS: usize = 6;
    let served = Arc::new(AtomicUsize::new(0));
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let served = served.clone();
        let mut release = release_rx.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[]).await?;
            http_get(&mut client, "/").await?;
            served.fetch_add(1, Ordering::SeqCst);
            let _ = release.wait_for(|go| *go).await;
            anyhow::Ok(())
        }));
    }
    // Every client is either served (and holding its connection) or waiting in the
    // listen backlog, unaccepted.
    tokio::task::block_in_place(|| {
        wait_until("clients served or in the backlog", || {
            let s = served.load(Ordering::SeqCst);
            s >= 1 && s + accept_backlog(port) == CLIENTS
        })
    });
    let held = served.load(Ordering::SeqCst);
    assert!(held <= 2, "{held} connections held, limit is 2");
    assert!(
        !server.log.contains("accept failed"),
        "{}",
        server.log.text()
    );
    release_tx.send(true).unwrap();
    for task in tasks {
        tokio::time::timeout(DEADLINE, task)
            .await
            .expect("waiting client served after release")
            .unwrap()
            .expect("no client refused");
    }
    assert_eq!(served.load(Ordering::SeqCst), CLIENTS);
}

// ---------------------------------------------------------------------------------------
// Faulty backends
// ---------------------------------------------------------------------------------------

/// A backend that resets every connection: that client's connection ends (no hang), an
/// established connection through another listener is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_reset_fails_only_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    let backend = RawBackend::bind().await;
    let (faulty_port, good_port) = (free_port(), free_port());
    let config = write_config(
        dir.path(),
        "",
        &[
            backend_listener(faulty_port, backend.address, ""),
            builtin_listener(good_port, ""),
        ],
    );
    let _server = Server::start(&config);
    let mut good = tls_connect(good_port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    http_get(&mut good, "/").await.unwrap();

    let resetter = tokio::spawn(async move {
        loop {
            let (stream, _) = backend.listener.accept().await.unwrap();
            // Read what arrives, then close with a reset (SO_LINGER 0).
            let mut stream = stream;
            let mut buf = [0u8; 64];
            let _ = stream.read(&mut buf).await;
            socket2::SockRef::from(&stream)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
            drop(stream);
        }
    });
    for _ in 0..3 {
        let mut client = tls_connect(faulty_port, "localhost", SslVersion::TLS1_3, &[])
            .await
            .unwrap();
        let _ = client.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
        let (got, _, _) = read_until_closed(&mut client).await;
        assert!(got.is_empty(), "{got:?}");
        http_get(&mut good, "/").await.unwrap();
    }
    resetter.abort();
    one_request(good_port).await.unwrap();
}

/// A backend whose connect never completes (full accept queue): the client is closed
/// after connect_timeout, others are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_backend_is_cut_at_connect_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (hung, _fillers) = hanging_backend();
    let (faulty_port, good_port) = (free_port(), free_port());
    let config = write_config(
        dir.path(),
        "[log]\nconnections = true",
        &[
            backend_listener(faulty_port, hung, "connect_timeout = \"1s\""),
            builtin_listener(good_port, ""),
        ],
    );
    let server = Server::start(&config);

    let hanging = tokio::spawn(async move {
        let mut client = tls_connect(faulty_port, "localhost", SslVersion::TLS1_3, &[])
            .await
            .unwrap();
        let start = Instant::now();
        let _ = client.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
        let (got, _, closed) = read_until_closed(&mut client).await;
        (got, closed - start)
    });
    for _ in 0..3 {
        one_request(good_port).await.unwrap();
    }
    let (got, open_for) = hanging.await.unwrap();
    assert!(got.is_empty());
    assert!(
        open_for >= Duration::from_millis(900) && open_for < Duration::from_secs(5),
        "closed after {open_for:?} with connect_timeout 1s"
    );
    server.log.wait_for("close=backend_unavailable", 0);
    one_request(good_port).await.unwrap();
}

/// A listening socket whose accept queue is full and never drained: connects to it hang
/// (SYNs are dropped). Returns its address and the connections that fill the queue.
fn hanging_backend() -> (SocketAddr, Vec<std::net::TcpStream>) {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    socket.listen(0).unwrap();
    let address: SocketAddr = socket.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&address, Duration::from_millis(300)) {
            Ok(stream) => fillers.push(stream),
            Err(_) => break, // the queue is full: this connect hung
        }
        assert!(fillers.len() < 64, "accept queue never filled");
    }
    // The listening socket must stay open: leak it for the test's life.
    std::mem::forget(socket);
    (address, fillers)
}

/// `tlsterm backend` killed in the middle of a large response: that client's stream ends
/// short, the other listener is untouched, and later clients of the dead backend get a
/// clean close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_disappearing_mid_stream_ends_only_that_stream() {
    let dir = tempfile::tempdir().unwrap();
    let backend_address = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut backend = spawn_backend(backend_address);
    let (faulty_port, good_port) = (free_port(), free_port());
    let config = write_config(
        dir.path(),
        "",
        &[
            backend_listener(faulty_port, backend_address, ""),
            builtin_listener(good_port, ""),
        ],
    );
    let _server = Server::start(&config);
    let mut good = tls_connect(good_port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();

    const TOTAL: usize = 1 << 30;
    let mut client = tls_connect(faulty_port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    client
        .write_all(format!("GET /bytes/{TOTAL} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 65536];
    while got < 1 << 20 {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got += n;
    }
    backend.kill().unwrap();
    backend.wait().unwrap();
    let (rest, _, _) = read_until_closed(&mut client).await;
    assert!(got + rest.len() < TOTAL, "the stream ended short");

    http_get(&mut good, "/").await.unwrap();
    let mut late = tls_connect(faulty_port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    let _ = late.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
    let (got, failed, _) = read_until_closed(&mut late).await;
    assert!(got.is_empty() && !failed, "clean close expected");
    one_request(good_port).await.unwrap();
}

/// `tlsterm backend --listen address`, once it accepts connections.
fn spawn_backend(address: SocketAddr) -> Child {
    let child = Command::new(TLSTERM)
        .args(["backend", "--listen", &address.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("tlsterm backend listening", || {
        std::net::TcpStream::connect(address).is_ok()
    });
    child
}

/// Each client connection opens exactly one backend connection, and a hanging backend
/// costs one connect_timeout, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_backend_connection_per_client() {
    let dir = tempfile::tempdir().unwrap();
    let backend = RawBackend::bind().await;
    let port = free_port();
    let config = write_config(
        dir.path(),
        "",
        &[backend_listener(port, backend.address, "")],
    );
    let _server = Server::start(&config);
    for round in 0..3 {
        let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
            .await
            .unwrap();
        client.write_all(b"ping").await.unwrap();
        // Connections reach the accept queue in the order tlsterm opened them.
        let mut accepted = 0;
        loop {
            let mut upstream = backend.accept().await;
            accepted += 1;
            let mut buf = [0u8; 4];
            if upstream.read_exact(&mut buf).await.is_ok() {
                assert_eq!(&buf, b"ping");
                break;
            }
        }
        assert_eq!(
            accepted, 1,
            "round {round}: backend connections for one client"
        );
    }

    let (hung, _fillers) = hanging_backend();
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "",
        &[backend_listener(port, hung, "connect_timeout = \"1s\"")],
    );
    let _server = Server::start(&config);
    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    let start = Instant::now();
    let _ = client.write_all(b"x").await;
    let (_, _, closed) = read_until_closed(&mut client).await;
    assert!(
        closed - start < Duration::from_millis(1800),
        "closed after {:?} with connect_timeout 1s",
        closed - start
    );
}

// ---------------------------------------------------------------------------------------
// Reload and signals
// ---------------------------------------------------------------------------------------

fn cert_listener(port: u16, cert: &Path, key: &Path) -> String {
    format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n\n[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    )
}

async fn served_certificate(port: u16) -> Vec<u8> {
    let client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    client.ssl().peer_certificate().unwrap().to_der().unwrap()
}

/// A certificate file replaced by garbage, then SIGHUP: the reload is refused and logged,
/// the old certificate keeps serving (established and new connections); fixing the file
/// and SIGHUP again takes the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_certificate_reload_keeps_the_old_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (cert, key) = make_cert(dir.path(), "site", "localhost", KeyType::Rsa2048);
    let config = write_config(dir.path(), "", &[cert_listener(port, &cert, &key)]);
    let server = Server::start(&config);
    let original = served_certificate(port).await;
    let mut established = tls_connect(port, "localhost", SslVersion::TLS1_2, &[])
        .await
        .unwrap();
    http_get(&mut established, "/").await.unwrap();

    std::fs::write(&cert, b"-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
    let verdict = tokio::task::block_in_place(|| server.reload());
    assert!(verdict.contains("reload refused"), "{verdict}");
    assert!(
        verdict.contains("site.pem"),
        "the error names the file: {verdict}"
    );
    assert_eq!(served_certificate(port).await, original);
    http_get(&mut established, "/").await.unwrap();

    std::fs::write(&cert, b"").unwrap();
    let verdict = tokio::task::block_in_place(|| server.reload());
    assert!(verdict.contains("reload refused"), "{verdict}");
    assert_eq!(served_certificate(port).await, original);

    // A valid new certificate is taken by the next reload.
    let (new_cert, new_key) = make_cert(dir.path(), "site2", "localhost", KeyType::Rsa2048);
    std::fs::rename(&new_cert, &cert).unwrap();
    std::fs::rename(&new_key, &key).unwrap();
    let verdict = tokio::task::block_in_place(|| server.reload());
    assert!(verdict.contains("reloaded"), "{verdict}");
    assert_ne!(served_certificate(port).await, original);
    http_get(&mut established, "/").await.unwrap();
}

/// Repeated SIGHUP under traffic loses no request; SIGTERM stops accepting but the
/// established connections finish their requests, then the process exits by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_and_sigterm_during_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        "drain_timeout = \"25s\"",
        &[builtin_listener(port, "")],
    );
    let mut server = Server::start(&config);

    let requests = Arc::new(AtomicUsize::new(0));
    let handshakes = Arc::new(AtomicUsize::new(0));
    let stop_handshakes = Arc::new(AtomicBool::new(false));
    let (term_tx, term_rx) = tokio::sync::watch::channel(false);

    // Keep-alive clients: request after request until told SIGTERM was sent, then one
    // more request on the same connection.
    let mut keepalive = Vec::new();
    for _ in 0..4 {
        let requests = requests.clone();
        let mut term = term_rx.clone();
        keepalive.push(tokio::spawn(async move {
            let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[]).await?;
            loop {
                http_get(&mut client, "/").await?;
                requests.fetch_add(1, Ordering::SeqCst);
                if *term.borrow_and_update() {
                    break;
                }
            }
            // SIGTERM has been sent and the server logged it: this connection still works.
            http_get(&mut client, "/bytes/100000").await?;
            anyhow::Ok(())
        }));
    }
    // Clients making new connections (full handshakes) during the reloads.
    let mut fresh = Vec::new();
    for _ in 0..2 {
        let handshakes = handshakes.clone();
        let stop = stop_handshakes.clone();
        fresh.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                one_request(port).await?;
                handshakes.fetch_add(1, Ordering::SeqCst);
            }
            anyhow::Ok(())
        }));
    }
    for round in 0..5 {
        let (r, h) = (
            requests.load(Ordering::SeqCst),
            handshakes.load(Ordering::SeqCst),
        );
        tokio::task::block_in_place(|| {
            wait_until("traffic between reloads", || {
                requests.load(Ordering::SeqCst) > r + 20
                    && handshakes.load(Ordering::SeqCst) > h + 2
            })
        });
        let verdict = tokio::task::block_in_place(|| server.reload());
        assert!(verdict.contains("reloaded"), "round {round}: {verdict}");
    }
    stop_handshakes.store(true, Ordering::SeqCst);
    for task in fresh {
        task.await.unwrap().expect("handshakes during reloads");
    }

    let before_term = server.log.len();
    server.signal("TERM");
    server.log.wait_for("stopping", before_term);
    // New connections are no longer accepted.
    tokio::task::block_in_place(|| {
        wait_until("listener closed", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        })
    });
    term_tx.send(true).unwrap();
    for task in keepalive {
        task.await
            .unwrap()
            .expect("established connection served after SIGTERM");
    }
    // The clients are gone (tasks dropped their streams): the drain ends well before
    // its 25 s deadline and the process exits with success.
    let start = Instant::now();
    let status = tokio::task::block_in_place(|| {
        let mut status = None;
        wait_until("tlsterm exit", || {
            status = server.child.try_wait().unwrap();
            status.is_some()
        });
        status.unwrap()
    });
    assert!(status.success(), "{status:?}\n{}", server.log.text());
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(!server.log.contains("drain deadline reached"));
}

// ---------------------------------------------------------------------------------------
// Out of file descriptors
// ---------------------------------------------------------------------------------------

/// With a 64-descriptor limit and more connections than that, accept fails with EMFILE:
/// the workers back off without spinning, and serve again once the connections close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emfile_backs_off_without_spinning_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        "",
        &[builtin_listener(port, "handshake_timeout = \"60s\"")],
    );
    let server = Server::start(&config);
    let pid = server.child.id();
    run(Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg("--nofile=64:64"));
    one_request(port).await.unwrap();
    let base_fds = open_fds(pid);
    assert!(base_fds < 50, "{base_fds} descriptors open at start");

    // More connections than descriptors: silent clients, stuck in the handshake.
    let hogs: Vec<std::net::TcpStream> = (0..100)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let warned = server.log.wait_for("accept failed, backing off", 0);
    assert!(warned.contains("Too many open files"), "{warned}");
    tokio::task::block_in_place(|| wait_until("descriptor limit reached", || open_fds(pid) >= 63));

    // Measure CPU over a window while the listener stays readable and accept fails.
    let ticks_before = cpu_ticks(pid);
    let window = Duration::from_secs(2);
    tokio::time::sleep(window).await;
    let used = cpu_ticks(pid) - ticks_before;
    let used_ms = used * 1000 / clock_ticks_per_second();
    assert!(
        used_ms < 200,
        "{used_ms} ms of CPU in {window:?} while out of descriptors: accept is spinning"
    );
    assert!(server.child.id() == pid);

    drop(hogs);
    // The accepted connections see EOF and close; the backlog drains.
    tokio::task::block_in_place(|| {
        wait_until("descriptors released", || {
            open_fds(pid) <= base_fds + 2 && accept_backlog(port) == 0
        })
    });
    for _ in 0..5 {
        one_request(port).await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Admin listener
// ---------------------------------------------------------------------------------------

/// A thousand idle connections to the admin port (here on all addresses, which is warned
/// about): it keeps 64 of them at most, the oldest closed for the newest, so they hold few
/// of the process's descriptors, a scrape gets through at once, and a SIGHUP reload (on
/// another thread) is not held up.
#[test]
fn idle_admin_connections_are_bounded_and_hold_nothing_up() {
    let dir = tempfile::tempdir().unwrap();
    let admin_port = free_port();
    let header = format!("[admin]\naddress = \"0.0.0.0:{admin_port}\"\n");
    let config = write_config(dir.path(), &header, &[builtin_listener(free_port(), "")]);
    let server = Server::start(&config);
    server.log.wait_for("admin listener is not on loopback", 0);
    let pid = server.child.id();
    let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
    assert_eq!(admin_get(admin, "/healthz").0, 200);
    let base_fds = open_fds(pid);

    let idle: Vec<std::net::TcpStream> = (0..1000)
        .map(|_| std::net::TcpStream::connect(admin).unwrap())
        .collect();
    wait_until("the idle connections accepted", || {
        accept_backlog(admin_port) == 0
    });
    wait_until("at most 64 admin connections kept", || {
        open_fds(pid) <= base_fds + 64
    });
    let started = Instant::now();
    assert_eq!(admin_get(admin, "/healthz"), (200, "ok\n".to_string()));
    assert!(server.reload().contains("reloaded"));
    assert_eq!(admin_get(admin, "/metrics").0, 200);
    // Well within the 10 s an idle client is given to send its request.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
}
