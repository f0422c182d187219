//! HTTP/3 through `serve` (`quic = true`): quic-go's HTTP/3 client (tests/h3client) against
//! a tlsterm process whose backend is a real HTTP/1.1 server in this test that echoes what
//! it received: requests and bodies both ways, the forwarding headers, backend failures,
//! signatures made by the engine, many connections over two workers, client certificates
//! as headers, stateless Retry and its tokens, Version Negotiation and the
//! anti-amplification limit (with raw UDP sockets), a client moving to another port, and
//! the stateless reset of a connection tlsterm no longer has (with quiche's client).

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::echo::*;
use crate::common::*;

/// The HTTP/3 test client (tests/h3client), built once per test process.
fn h3_client() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| go_build("h3client")).clone()
}

/// Runs the HTTP/3 client against 127.0.0.1:`port` (UDP); returns its answers.
fn h3(port: u16, args: &[&str]) -> Vec<serde_json::Value> {
    let out = run(Command::new(h3_client())
        .arg("-addr")
        .arg(format!("127.0.0.1:{port}"))
        .args(args));
    serde_json::from_slice(&out.stdout).expect("the HTTP/3 client prints JSON")
}

/// tlsterm with one listener answering HTTP/3 on its port, forwarding to `backend`.
fn start_quic(backend: &str, header: &str, extra: &str) -> (tempfile::TempDir, Server, u16) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listener =
        format!("address = \"127.0.0.1:{port}\"\nbackends = [\"{backend}\"]\nquic = true\n{extra}");
    let config = write_config(dir.path(), header, &[listener]);
    let server = Server::start(&config);
    (dir, server, port)
}

/// A new certificate for `cn` in `dir`, as a listener's `[[listener.certificate]]` table.
fn certificate_table(dir: &Path, stem: &str, cn: &str, key: KeyType) -> String {
    let (cert, key) = make_cert(dir, stem, cn, key);
    format!(
        "[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    )
}

fn text<'a>(answer: &'a serde_json::Value, key: &str) -> &'a str {
    answer[key].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_and_post_reach_the_backend_as_http1_with_forwarding_headers() {
    let backend = echo_backend().await;
    let log_requests = "[log]\nrequests = true";
    let (_dir, server, port) = start_quic(&backend.to_string(), log_requests, "");
    let client = tokio::task::spawn_blocking(move || {
        let get = h3(
            port,
            &[
                "-path",
                "/hello?x=1",
                "-header",
                "X-Forwarded-For: 6.6.6.6",
                "-header",
                "Forwarded: for=6.6.6.6",
                "-header",
                "X-Custom: kept",
            ],
        );
        let post = h3(
            port,
            &[
                "-method",
                "POST",
                "-path",
                "/upload",
                "-body-bytes",
                "3000000",
            ],
        );
        (get, post)
    });
    let (get, post) = client.await.unwrap();

    let get = &get[0];
    assert_eq!(get["status"], 200, "{get}");
    assert_eq!(text(get, "proto"), "HTTP/3.0");
    let seen = &get["headers"];
    assert_eq!(text(seen, "x-seen-method"), "GET");
    assert_eq!(text(seen, "x-seen-path"), "/hello?x=1");
    assert_eq!(text(seen, "x-seen-host"), "localhost");
    // tlsterm's own, once; the client's copies are gone.
    assert_eq!(text(seen, "x-seen-x-forwarded-for"), "127.0.0.1");
    assert_eq!(text(seen, "x-seen-x-forwarded-proto"), "https");
    assert_eq!(text(seen, "x-seen-forwarded"), "");
    assert_eq!(text(seen, "x-seen-x-custom"), "kept");
    assert_eq!(get["body_len"], 0);

    let post = &post[0];
    assert_eq!(post["status"], 200, "{post}");
    assert_eq!(text(&post["headers"], "x-seen-method"), "POST");
    assert_eq!(text(&post["headers"], "x-seen-body-len"), "3000000");
    assert_eq!(post["body_len"], 3_000_000, "the body comes back whole");
    assert_eq!(text(post, "body_sha256"), hex_sha256(&pattern(3_000_000)));

    // The 3 MB answer left in segmented sends (UDP GSO, which Linux has on loopback as on
    // network cards): fewer system calls than datagrams, and it still came back whole.
    let admin = admin_address(&server.config).unwrap();
    let datagrams = metric(admin, "tlsterm_quic_datagrams_sent_total", "");
    let sends = metric(admin, "tlsterm_quic_udp_sends_total", "");
    eprintln!("{datagrams} datagrams in {sends} sends");
    assert!(datagrams > 2_000.0, "{datagrams} datagrams for 3 MB");
    assert!(
        sends * 2.0 < datagrams,
        "{sends} sends for {datagrams} datagrams"
    );
    // The 3 MB body came in as datagrams counted one by one, however the kernel handed
    // them over (several messages per receive, coalesced ones cut apart).
    let received = metric(admin, "tlsterm_quic_datagrams_received_total", "");
    let receives = metric(admin, "tlsterm_quic_udp_receives_total", "");
    eprintln!("{received} datagrams in {receives} receives");
    assert!(received > 2_000.0, "{received} datagrams received for 3 MB");
    assert!(
        receives > 0.0 && receives <= received,
        "{receives} receives for {received} datagrams"
    );
    // `[log] requests`: a line each, the path without its query.
    let get = server.log.wait_for("path=/hello ", 0);
    assert!(get.contains("version=3 method=GET host=localhost"), "{get}");
    assert!(get.contains("status=200 answered_by=backend"), "{get}");
    let post = server.log.wait_for("path=/upload ", 0);
    assert!(
        post.contains("method=POST") && post.contains("status=200"),
        "{post}"
    );
    // Written once the answer ended, with the body bytes that went to the client.
    assert!(post.contains("bytes=3000000 complete=true"), "{post}");
    assert!(
        !server.log.text().contains("/hello?x=1"),
        "{}",
        server.log.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_is_answered_502() {
    let (_refusing, backend) = refusing_address();
    let (_dir, server, port) = start_quic(&backend, "", "");
    let answers = tokio::task::spawn_blocking(move || h3(port, &["-requests", "2"]))
        .await
        .unwrap();
    for answer in &answers {
        assert_eq!(answer["status"], 502, "{answer}");
    }
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_backend_errors_total{status=\"502\"} 2");
}

/// The QUIC handshake's signature goes through the worker's engine queue (the
/// asynchronous private-key method, resumed by the connection's task when the batch is
/// done), not through BoringSSL inline, and its key share is tlsterm's (the hint, as over
/// TCP): the engine's counters say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_handshake_signatures_and_key_shares_are_made_by_tlsterm() {
    let backend = echo_backend().await;
    let dir = tempfile::tempdir().unwrap();
    let certificate = certificate_table(dir.path(), "rsa", "localhost", KeyType::Rsa2048);
    let engine = "[engine]\nmode = \"batch\"\nsmall_batch_threshold = 1\npoll_delay = \"2ms\"\n";
    let (_dir, server, port) = start_quic(&backend.to_string(), engine, &certificate);
    let answers = tokio::task::spawn_blocking(move || h3(port, &["-connections", "3"]))
        .await
        .unwrap();
    assert_eq!(answers.len(), 3);
    for answer in &answers {
        assert_eq!(answer["status"], 200, "{answer}");
    }
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_handshakes_total{kind=\"full\"} 3");
    let batch = metric(admin, "tlsterm_engine_operations_total", "path=\"batch\"");
    let inline = metric(admin, "tlsterm_engine_operations_total", "path=\"inline\"");
    assert_eq!(
        (batch, inline),
        (3.0, 0.0),
        "one engine signature per handshake"
    );
    // A lone share is aws-lc's, shares that meet in the queue a batch: tlsterm's either way.
    let shares = |path: &str| {
        let labels = format!("path=\"{path}\"");
        metric(admin, "tlsterm_key_shares_total", &labels)
    };
    assert_eq!(
        (
            shares("batch") + shares("aws-lc-rs"),
            shares("inline"),
            shares("not_applied")
        ),
        (3.0, 0.0, 0.0),
        "one key share of tlsterm's per handshake"
    );
}

/// Two workers, each with its own UDP socket of the port: every connection's packets
/// reach the worker that made it (the reuseport program reads the worker from the
/// connection ID), so all of many connections at once complete all their requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_over_two_workers_all_complete() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "", "");
    let answers = tokio::task::spawn_blocking(move || {
        h3(
            port,
            &["-connections", "40", "-requests", "3", "-path", "/many"],
        )
    })
    .await
    .unwrap();
    assert_eq!(answers.len(), 120);
    for answer in &answers {
        assert_eq!(answer["status"], 200, "{answer}");
        assert_eq!(text(&answer["headers"], "x-seen-path"), "/many");
    }
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_streams_total 120");
    assert_eq!(metric(admin, "tlsterm_quic_connections_total", ""), 40.0);
    wait_for_metric(admin, "tlsterm_quic_connections 0");
}

/// A reload's new certificate serves new QUIC connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_serves_new_connections_the_new_certificate() {
    let backend = echo_backend().await;
    let dir = tempfile::tempdir().unwrap();
    let certificate = certificate_table(dir.path(), "site", "alpha.test", KeyType::EcdsaP256);
    let (_dir, server, port) = start_quic(&backend.to_string(), "", &certificate);
    let before = tokio::task::spawn_blocking(move || h3(port, &[]))
        .await
        .unwrap();
    assert_eq!(text(&before[0], "peer_cn"), "alpha.test", "{}", before[0]);

    make_cert(dir.path(), "site", "beta.test", KeyType::EcdsaP256);
    let verdict = server.reload();
    assert!(verdict.contains("reloaded"), "{verdict}");
    let after = tokio::task::spawn_blocking(move || h3(port, &[]))
        .await
        .unwrap();
    assert_eq!(after[0]["status"], 200, "{}", after[0]);
    assert_eq!(text(&after[0], "peer_cn"), "beta.test");
}

/// A second connection resumes the first one's session (a ticket), counted as resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_resumes_with_a_ticket() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "", "");
    let answers = tokio::task::spawn_blocking(move || h3(port, &["-connections", "2", "-resume"]))
        .await
        .unwrap();
    assert_eq!(answers[0]["resumed"], false, "{}", answers[0]);
    assert_eq!(answers[1]["resumed"], true, "{}", answers[1]);
    assert_eq!(answers[1]["status"], 200);
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_handshakes_total{kind=\"resumed\"} 1");
}

/// A client that moves to another local port between requests (NAT rebinding, a new
/// network) keeps its connection: it probes the new path with one of the spare connection
/// IDs tlsterm issued (quic-go needs one to move), and its next request is answered there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_moves_to_another_port_keeps_its_connection() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "", "");
    let answers = tokio::task::spawn_blocking(move || h3(port, &["-requests", "3", "-migrate"]))
        .await
        .unwrap();
    assert_eq!(answers.len(), 3, "{answers:?}");
    for answer in &answers {
        assert_eq!(answer["status"], 200, "{answer}");
    }
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_migrations_total 2");
    wait_for_metric(admin, "tlsterm_quic_connections_total 1");
}

/// A client still sending on a connection tlsterm no longer has (here: ended by tlsterm's
/// idle timeout while the client ran no timers) gets a stateless reset carrying the token
/// the connection's ID came with, and stops at once instead of retransmitting until its
/// own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_a_connection_gone_here_gets_a_stateless_reset() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "", "quic_idle_timeout = \"1s\"\n");
    let admin = admin_address(&server.config).unwrap();
    tokio::task::spawn_blocking(move || {
        let server: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // Its last handshake flight sent too: the server then has the connection open.
        let (socket, mut conn) = quiche_connected(server);
        let info = from_server(&socket, server);
        wait_for_metric(admin, "tlsterm_quic_handshakes_total{kind=\"full\"} 1");
        wait_for_metric(admin, "tlsterm_quic_connections 0");
        conn.send_ack_eliciting().unwrap();
        quiche_flush(&mut conn, &socket);
        // What the server sent before it forgot the connection (retransmissions the client
        // never acknowledged) comes first; the reset closes the client's connection.
        while !conn.is_closed() {
            let mut datagram = receive(&socket);
            let _ = conn.recv(&mut datagram, info);
        }
        assert!(
            conn.peer_error().is_none(),
            "closed by a reset, not by the server's close: {:?}",
            conn.peer_error()
        );
        assert!(!conn.is_timed_out());
    })
    .await
    .unwrap();
    wait_for_metric(admin, "tlsterm_quic_stateless_resets_total 1");
}

/// With `early_data = true`, quic-go resuming a session gets its 0-RTT data accepted and
/// the handshake counts as `early_data`. Without it, the same client's GET waits for the
/// handshake and reaches the backend as any other, without `Early-Data`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_client_sends_its_request_in_early_data_when_the_listener_allows_it() {
    let backend = echo_backend().await;
    for (extra, early) in [("early_data = true\n", true), ("", false)] {
        let (_dir, server, port) = start_quic(&backend.to_string(), "", extra);
        let args = ["-connections", "2", "-resume", "-method", "GET_0RTT"];
        let answers = tokio::task::spawn_blocking(move || h3(port, &args))
            .await
            .unwrap();
        let seen =
            |answer: &serde_json::Value| text(&answer["headers"], "x-seen-early-data").to_string();
        assert_eq!(answers[0]["status"], 200, "{}", answers[0]);
        assert_eq!(answers[0]["used_0rtt"], false);
        assert_eq!(seen(&answers[0]), "", "{}", answers[0]);
        assert_eq!(answers[1]["status"], 200, "{}", answers[1]);
        assert_eq!(answers[1]["resumed"], true, "{}", answers[1]);
        assert_eq!(answers[1]["used_0rtt"], early, "{}", answers[1]);
        // quic-go writes the request in 0-RTT data when the handshake is still under way
        // then; on a starved CPU it may come after it, as an ordinary request (quiche's
        // client in the tests below sends it in 0-RTT data for sure).
        let early_data_header = seen(&answers[1]);
        match early {
            true => assert!(["1", ""].contains(&early_data_header.as_str())),
            false => assert_eq!(early_data_header, "", "{}", answers[1]),
        }
        let admin = admin_address(&server.config).unwrap();
        if early {
            wait_for_metric(
                admin,
                "tlsterm_quic_handshakes_total{kind=\"early_data\"} 1",
            );
        } else {
            wait_for_metric(admin, "tlsterm_quic_handshakes_total{kind=\"resumed\"} 1");
        }
    }
}

/// A request sent in 0-RTT data right behind its ClientHello reaches the backend before
/// the client says anything more. Sent in the same system call (UDP segmentation, as
/// clients that have it do), it is read while the ClientHello is still being answered:
/// its key share waits in the worker's engine queue, since other handshakes are in
/// progress (stalled ones here), so the 0-RTT keys do not exist yet. It must be read as
/// soon as they do, not when the client's next datagram (its acknowledgements, or its
/// Finished) happens to come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_0rtt_data_goes_to_the_backend_before_the_client_answers() {
    let (backend, seen) = echo_backend_watched().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "", "early_data = true\n");
    let admin = admin_address(&server.config).unwrap();
    let server_address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let path = format!("/early-{}", hex_sha256(&random_id()));
    let request_path = path.clone();
    // Kept until the end: the client reads nothing and sends nothing more.
    let _client = tokio::task::spawn_blocking(move || {
        let session = quiche_session(server_address);
        let stalled = stall_a_handshake_on_each_worker(port);
        wait_for_metric(admin, "tlsterm_quic_handshakes_in_progress 2");
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut conn = quiche_client(&socket, server_address, Some(&session));
        send_segmented(&socket, &early_get(&mut conn, &request_path));
        (stalled, socket, conn)
    })
    .await
    .unwrap();
    wait_until("the GET from 0-RTT data at the backend", || {
        seen.received(&path) == ["1"]
    });
    wait_for_metric(admin, "tlsterm_quic_early_data_requests_total 1");
}

/// 0-RTT data recorded on the path and sent again is refused: the replayed ClientHello
/// gets no early data (the anti-replay memory has seen it), so its request never reaches
/// the backend a second time. The recording is the client's whole first flight (its
/// ClientHello and the 0-RTT request), taken before it has heard from the server: a
/// client that has heard from it sends the rest to the connection ID the server gave,
/// which no longer routes anywhere once the connection is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_early_data_is_refused() {
    let (backend, seen) = echo_backend_watched().await;
    // A short idle timeout: the connection is soon gone, whether or not the client's
    // close came through.
    let extra = "early_data = true\nquic_idle_timeout = \"1s\"\n";
    let (_dir, server, port) = start_quic(&backend.to_string(), "", extra);
    let admin = admin_address(&server.config).unwrap();
    let server_address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let path = format!("/replayed-{}", hex_sha256(&random_id()));
    let request_path = path.clone();
    let seen_by_client = seen.clone();
    let first_flight = tokio::task::spawn_blocking(move || {
        let session = quiche_session(server_address);
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut conn = quiche_client(&socket, server_address, Some(&session));
        let flight = early_get(&mut conn, &request_path);
        for (datagram, to) in &flight {
            socket.send_to(datagram, to).unwrap();
        }
        // The client's Finished waits: the request is in 0-RTT data however fast it comes.
        wait_until("the GET from 0-RTT data at the backend", || {
            seen_by_client.received(&request_path) == ["1"]
        });
        quiche_handshake(&mut conn, &socket, server_address);
        quiche_flush(&mut conn, &socket);
        flight
    })
    .await
    .unwrap();
    wait_for_metric(admin, "tlsterm_quic_early_data_requests_total 1");
    // Once the connection is gone, its first flight comes again from elsewhere.
    wait_for_metric(admin, "tlsterm_quic_connections 0");
    let attacker = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for (datagram, to) in &first_flight {
        attacker.send_to(datagram, to).unwrap();
    }
    wait_for_metric(admin, "tlsterm_early_data_total{result=\"replayed\"} 1");
    wait_for_metric(admin, "tlsterm_quic_early_data_requests_total 1");
    assert_eq!(
        seen.received(&path).len(),
        1,
        "the replay reached the backend"
    );
}

/// Sends `datagrams` (to one address; all but the last of one size) in one system call,
/// segmented by the kernel (UDP GSO), so that the server reads them in one go.
fn send_segmented(socket: &std::net::UdpSocket, datagrams: &[(Vec<u8>, SocketAddr)]) {
    let state = quinn_udp::UdpSocketState::new(socket.into()).unwrap();
    assert!(state.max_gso_segments() >= datagrams.len(), "UDP GSO");
    let size = datagrams[0].0.len();
    let (last, rest) = datagrams.split_last().unwrap();
    assert!(rest.iter().all(|(d, _)| d.len() == size) && last.0.len() <= size);
    let contents: Vec<u8> = datagrams.iter().flat_map(|(d, _)| d.clone()).collect();
    let transmit = quinn_udp::Transmit {
        destination: last.1,
        ecn: None,
        contents: &contents,
        segment_size: Some(size),
        src_ip: None,
    };
    state.try_send(socket.into(), &transmit).unwrap();
}

/// quiche's client resuming a session with `server`: its ClientHello sent (it makes the
/// 0-RTT keys), and HTTP/3 opened in 0-RTT data, the handshake left to the caller.
fn resumed_in_0rtt(
    server: SocketAddr,
) -> (
    std::net::UdpSocket,
    quiche::Connection,
    quiche::h3::Connection,
) {
    let session = quiche_session(server);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut conn = quiche_client(&socket, server, Some(&session));
    quiche_flush(&mut conn, &socket);
    let h3 = quiche::h3::Connection::with_transport(&mut conn, &quiche::h3::Config::new().unwrap())
        .expect("HTTP/3 in 0-RTT data");
    (socket, conn, h3)
}

/// A resumed client's first flight, unsent: its ClientHello (which makes the 0-RTT keys),
/// then a GET for `path` in 0-RTT data.
fn early_get(conn: &mut quiche::Connection, path: &str) -> Vec<(Vec<u8>, SocketAddr)> {
    let mut flight = quiche_datagrams(conn);
    let mut h3 = quiche::h3::Connection::with_transport(conn, &quiche::h3::Config::new().unwrap())
        .expect("HTTP/3 in 0-RTT data");
    h3.send_request(conn, &request_fields("GET", path), true)
        .unwrap();
    assert!(conn.is_in_early_data());
    flight.extend(quiche_datagrams(conn));
    flight
}

/// The fields of a request for `path` on localhost.
fn request_fields(method: &str, path: &str) -> Vec<quiche::h3::Header> {
    [
        (":method", method),
        (":scheme", "https"),
        (":authority", "localhost"),
        (":path", path),
    ]
    .iter()
    .map(|(name, value)| quiche::h3::Header::new(name.as_bytes(), value.as_bytes()))
    .collect()
}

/// In 0-RTT data, a request without a body goes to the backend at once and one with a
/// body waits until the handshake is confirmed: quiche's client resumes a session, sends
/// a POST with a body and a GET in its 0-RTT data, completes its side of the handshake
/// but holds back its Finished. The backend gets the GET, not the POST; once the Finished
/// goes, the POST reaches it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_early_data_a_request_with_a_body_waits_for_the_handshake() {
    let (backend, seen) = echo_backend_watched().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "", "early_data = true\n");
    tokio::task::spawn_blocking(move || {
        let server: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (socket, mut conn, mut h3) = resumed_in_0rtt(server);
        let id = hex_sha256(&random_id());
        let (post_path, get_path) = (format!("/upload-{id}"), format!("/page-{id}"));
        let post = h3
            .send_request(&mut conn, &request_fields("POST", &post_path), false)
            .unwrap();
        h3.send_body(
            &mut conn,
            post,
            b"an upload that must not be replayed",
            true,
        )
        .unwrap();
        h3.send_request(&mut conn, &request_fields("GET", &get_path), true)
            .unwrap();
        assert!(conn.is_in_early_data());
        quiche_flush(&mut conn, &socket);
        // Its Finished stays unsent.
        quiche_handshake(&mut conn, &socket, server);
        let received = |path: &str| !seen.received(path).is_empty();
        wait_until("the GET from 0-RTT data at the backend", || {
            received(&get_path)
        });
        assert!(
            !received(&post_path),
            "the POST reached the backend before the handshake was confirmed"
        );
        // The Finished goes: the handshake is confirmed, and the POST goes on.
        quiche_flush(&mut conn, &socket);
        wait_until("the POST at the backend", || received(&post_path));
    })
    .await
    .unwrap();
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_early_data_requests_total 2");
}

/// A GET in 0-RTT data that the backend refuses as too early (425) is sent again once the
/// handshake is confirmed, without `Early-Data`, and the client gets the backend's 200:
/// quiche's client resumes, sends the GET in 0-RTT data and holds back its Finished; the
/// backend sees the GET once, marked; once the Finished goes it sees it again, unmarked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_as_too_early_is_sent_again_after_the_handshake() {
    let (backend, seen) = echo_backend_watched().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "", "early_data = true\n");
    let status = tokio::task::spawn_blocking(move || {
        let server: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (socket, mut conn, mut h3) = resumed_in_0rtt(server);
        let path = format!("/too-early-{}", hex_sha256(&random_id()));
        let stream = h3
            .send_request(&mut conn, &request_fields("GET", &path), true)
            .unwrap();
        quiche_flush(&mut conn, &socket);
        // Its Finished stays unsent: the backend's 425 waits for it.
        quiche_handshake(&mut conn, &socket, server);
        wait_until("the GET from 0-RTT data at the backend", || {
            seen.received(&path) == ["1"]
        });
        quiche_flush(&mut conn, &socket);
        wait_until("the GET again, after the handshake", || {
            seen.received(&path) == ["1", ""]
        });
        let info = from_server(&socket, server);
        loop {
            conn.recv(&mut receive(&socket), info).unwrap();
            while let Ok((id, event)) = h3.poll(&mut conn) {
                if let (true, quiche::h3::Event::Headers { list, .. }) = (id == stream, event) {
                    use quiche::h3::NameValue;
                    let status = list.iter().find(|field| field.name() == b":status");
                    return String::from_utf8_lossy(status.unwrap().value()).into_owned();
                }
            }
            quiche_flush(&mut conn, &socket);
        }
    })
    .await
    .unwrap();
    assert_eq!(status, "200");
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(
        admin,
        "tlsterm_http_too_early_retries_total{version=\"3\"} 1",
    );
}

/// A request the backend answers at once costs one datagram from tlsterm, not two: the
/// acknowledgement of the client's request waits briefly and leaves with the response.
/// quiche's client sends 20 GETs one after another on one connection and counts the
/// datagrams each brings back until its response is complete; with the acknowledgement
/// sent on its own each takes two. Half of them may miss the wait on a busy machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quickly_answered_request_costs_one_datagram() {
    let backend = echo_backend().await;
    let (_dir, _server, port) = start_quic(&backend.to_string(), "", "");
    let datagrams = tokio::task::spawn_blocking(move || {
        let server: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let (socket, mut conn) = quiche_connected(server);
        let info = from_server(&socket, server);
        let mut h3 =
            quiche::h3::Connection::with_transport(&mut conn, &quiche::h3::Config::new().unwrap())
                .unwrap();
        // Datagrams received until the response to a GET has ended.
        let mut get = |path: &str| {
            let id = h3
                .send_request(&mut conn, &request_fields("GET", path), true)
                .unwrap();
            quiche_flush(&mut conn, &socket);
            let mut received = 0;
            loop {
                conn.recv(&mut receive(&socket), info).unwrap();
                received += 1;
                let mut finished = false;
                loop {
                    match h3.poll(&mut conn) {
                        Ok((stream, quiche::h3::Event::Data)) => {
                            while h3.recv_body(&mut conn, stream, &mut [0; 4096]).is_ok() {}
                        }
                        Ok((stream, quiche::h3::Event::Finished)) => finished |= stream == id,
                        Ok(_) => {}
                        Err(quiche::h3::Error::Done) => break,
                        Err(err) => panic!("HTTP/3: {err}"),
                    }
                }
                // Its acknowledgements, which ask for no answer.
                quiche_flush(&mut conn, &socket);
                if finished {
                    return received;
                }
            }
        };
        // The first ones also bring the server's HTTP/3 settings and spare connection IDs.
        get("/warm-up");
        get("/warm-up");
        (0..20)
            .map(|i| get(&format!("/counted-{i}")))
            .sum::<usize>()
    })
    .await
    .unwrap();
    assert!(datagrams <= 30, "{datagrams} datagrams for 20 responses");
}

/// While a handshake waits for the worker's engine (here its signature), its connection
/// sends nothing: the ServerHello leaves with the rest of the first flight once the
/// signature is done, not alone in a datagram padded to 1,200 bytes before it (nor, while
/// a key share is computed, an acknowledgement alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_hello_waits_for_the_signature_and_leaves_with_the_flight() {
    // The key share computed in the ClientHello's callback, the signature queued for the
    // engine's RSA kernel (on every CPU class), however few wait.
    first_datagrams_carry_the_flight("key_shares = \"aws-lc-rs\"\nsmall_batch_threshold = 1").await;
}

/// The same where the key share waits for the engine too, then the signature: the
/// handshake takes the key share without sending, and the whole flight leaves once signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flight_waits_for_key_share_and_signature_and_leaves_in_one_datagram() {
    if !std::arch::is_x86_feature_detected!("avx512ifma") {
        println!("skipped: key shares wait for the engine only where AVX-512 IFMA batches them");
        return;
    }
    first_datagrams_carry_the_flight(
        "key_shares = \"batch\"\nsmall_batch_threshold = 1\nx25519_small_batch_threshold = 1",
    )
    .await;
}

/// Sixteen clients start handshakes at once with an RSA server whose `[engine]` section is
/// `engine`, so that the engine's operations wait for each other in the worker's queue (one
/// alone would be computed at once); the first datagram each client gets must carry a
/// Handshake packet after the Initial one, and every signature must be the engine's.
async fn first_datagrams_carry_the_flight(engine: &str) {
    const CLIENTS: usize = 16;
    let backend = echo_backend().await;
    let certs = tempfile::tempdir().unwrap();
    let rsa = certificate_table(certs.path(), "rsa", "localhost", KeyType::Rsa2048);
    let (_dir, server, port) =
        start_quic(&backend.to_string(), &format!("[engine]\n{engine}\n"), &rsa);
    let admin = admin_address(&server.config).unwrap();
    let firsts = tokio::task::spawn_blocking(move || {
        let server: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut clients: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                let conn = quiche_client(&socket, server, None);
                (socket, conn)
            })
            .collect();
        // Every client's Initial first, then the answers.
        for (socket, conn) in &mut clients {
            quiche_flush(conn, socket);
        }
        clients
            .iter()
            .map(|(socket, _)| receive(socket))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for first in &firsts {
        assert_eq!(
            long_header_packets(first),
            [quiche::Type::Initial, quiche::Type::Handshake],
            "a first datagram of {} bytes",
            first.len()
        );
    }
    let signed = metric(
        admin,
        "tlsterm_engine_operations_total",
        "algorithm=\"rsa2048\",path=\"batch\"",
    );
    assert_eq!(signed, CLIENTS as f64, "every signature was the engine's");
}

/// The types of the long-header packets coalesced at the start of a datagram (RFC 9000,
/// 17.2), up to a short-header packet or the padding after them.
fn long_header_packets(datagram: &[u8]) -> Vec<quiche::Type> {
    let mut types = Vec::new();
    let mut rest = datagram;
    while let Some(&first) = rest.first().filter(|first| **first & 0x80 != 0) {
        let ty = match (first >> 4) & 0x3 {
            0 => quiche::Type::Initial,
            1 => quiche::Type::ZeroRTT,
            2 => quiche::Type::Handshake,
            _ => quiche::Type::Retry,
        };
        let mut at = 5;
        for _ in 0..2 {
            at += 1 + rest[at] as usize; // a connection ID and its length
        }
        if ty == quiche::Type::Initial {
            let (token_len, len) = varint(&rest[at..]);
            at += len + token_len as usize;
        }
        let (payload_len, len) = varint(&rest[at..]);
        rest = &rest[at + len + payload_len as usize..];
        types.push(ty);
    }
    types
}

/// A QUIC variable-length integer (RFC 9000, 16) at the start of `bytes`, and its length.
fn varint(bytes: &[u8]) -> (u64, usize) {
    let len = 1usize << (bytes[0] >> 6);
    let value = bytes[1..len]
        .iter()
        .fold(u64::from(bytes[0] & 0x3f), |value, byte| {
            (value << 8) | u64::from(*byte)
        });
    (value, len)
}

/// SIGTERM: a request in flight is answered (the connection gets GOAWAY and ends after
/// it), a new connection is not taken, and the process exits once drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_requests_in_flight_and_takes_no_new_connection() {
    let (backend, seen) = echo_backend_watched().await;
    let (_dir, mut server, port) = start_quic(&backend.to_string(), "", "");
    let admin = admin_address(&server.config).unwrap();
    let in_flight = tokio::task::spawn_blocking(move || h3(port, &["-path", "/wait"]));
    wait_until("the backend holds the request", || seen.waiting() == 1);
    server.signal("TERM");
    server.log.wait_for("stopping", 0);
    let refused = tokio::task::spawn_blocking(move || h3(port, &["-timeout", "2s"]))
        .await
        .unwrap();
    assert!(refused[0]["error"].is_string(), "{}", refused[0]);
    assert!(
        metric(
            admin,
            "tlsterm_quic_packets_dropped_total",
            "reason=\"not_accepting\""
        ) >= 1.0
    );

    seen.release_waiting();
    let answered = in_flight.await.unwrap();
    assert_eq!(answered[0]["status"], 200, "{}", answered[0]);
    let status = eventually("tlsterm exits once drained", || {
        server.child.try_wait().unwrap()
    });
    assert!(status.success(), "{status}");
}

/// The process-wide `max_connections` counts TCP and QUIC connections together: while a
/// TCP connection holds the only place, a QUIC client's first packets are dropped (counted
/// as `max_connections`) and it gets no connection; once the TCP connection is gone, the
/// same client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_wide_connection_limit_counts_quic_connections_with_tcp() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "max_connections = 1", "");
    let admin = admin_address(&server.config).unwrap();
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_for_metric(admin, "tlsterm_connections_active 1");
    let refused = tokio::task::spawn_blocking(move || h3(port, &["-timeout", "1s"]))
        .await
        .unwrap();
    assert!(refused[0]["error"].is_string(), "{}", refused[0]);
    let dropped = metric(
        admin,
        "tlsterm_quic_packets_dropped_total",
        "reason=\"max_connections\"",
    );
    assert!(dropped >= 1.0, "{dropped}");
    drop(tcp);
    wait_for_metric(admin, "tlsterm_connections_active 0");
    let served = tokio::task::spawn_blocking(move || h3(port, &[]))
        .await
        .unwrap();
    assert_eq!(served[0]["status"], 200, "{}", served[0]);
}

/// A backend that sends no response head within `quic_backend_timeout`: 504, and the
/// connection's other requests are not held up by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_an_answer_is_answered_504() {
    let backend = echo_backend().await;
    let extra = "quic_backend_timeout = \"300ms\"\n";
    let (_dir, server, port) = start_quic(&backend.to_string(), "", extra);
    let answers = tokio::task::spawn_blocking(move || h3(port, &["-path", "/never"]))
        .await
        .unwrap();
    assert_eq!(answers[0]["status"], 504, "{}", answers[0]);
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_backend_errors_total{status=\"504\"} 1");
}

/// A backend that dies in the middle of its response body: the client's stream is reset
/// with H3_INTERNAL_ERROR (it sees an error, not a short body taken for whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_dying_mid_response_resets_the_stream() {
    let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = backend.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = backend.accept().await {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let promised = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n";
            let _ = stream.write_all(promised).await;
            let _ = stream.write_all(&[b'x'; 1000]).await;
            // Dropped here: the connection closes 99,000 bytes short.
        }
    });
    let log_requests = "[log]\nrequests = true";
    let (_dir, server, port) = start_quic(&address.to_string(), log_requests, "");
    let answers = tokio::task::spawn_blocking(move || h3(port, &[]))
        .await
        .unwrap();
    // Its log line says the answer was cut short.
    let line = server.log.wait_for("tlsterm::request", 0);
    assert!(
        line.contains("status=200") && line.contains("complete=false"),
        "{line}"
    );
    // The reset may overtake the response head (quiche drops what it has not sent yet):
    // either way the client sees an error, never a complete answer.
    let answer = &answers[0];
    assert!(
        text(answer, "error").contains("H3_INTERNAL_ERROR"),
        "{answer}"
    );
    assert!(answer["body_len"].as_u64().unwrap() < 100_000, "{answer}");
}

/// 100 requests at once on one connection, each its own stream, all answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_streams_on_one_connection() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_quic(&backend.to_string(), "", "");
    let answers = tokio::task::spawn_blocking(move || {
        h3(
            port,
            &[
                "-requests",
                "100",
                "-concurrent",
                "-method",
                "POST",
                "-body-bytes",
                "20000",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(answers.len(), 100);
    let expected = hex_sha256(&pattern(20_000));
    for answer in &answers {
        assert_eq!(answer["status"], 200, "{answer}");
        assert_eq!(text(answer, "body_sha256"), expected);
    }
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_streams_total 100");
    assert_eq!(metric(admin, "tlsterm_quic_connections_total", ""), 1.0);
}

/// A verified client certificate reaches the backend as `X-Client-Cert-*` headers, on a
/// resumed connection too; the client's own copies never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_reaches_the_backend_as_headers() {
    let backend = echo_backend().await;
    let pki = tempfile::tempdir().unwrap();
    common::client_pki::make_client_pki(pki.path());
    let p = |name: &str| pki.path().join(name).display().to_string();
    let extra = common::client_pki::requiring_client_certificates(pki.path());
    let (_dir, _server, port) = start_quic(&backend.to_string(), "", &extra);
    let (cert, key) = (p("alice.pem"), p("alice.key"));
    let answers = tokio::task::spawn_blocking(move || {
        h3(
            port,
            &[
                "-cert",
                cert.as_str(),
                "-key",
                key.as_str(),
                "-connections",
                "2",
                "-resume",
                "-header",
                "X-Client-Cert-Subject: CN=forged",
                "-header",
                "X-Client-Cert-Sha256: 00",
            ],
        )
    })
    .await
    .unwrap();
    let alice = common::client_pki::alice_as_seen_by_the_backend(pki.path());
    assert_eq!(answers[1]["resumed"], true, "{}", answers[1]);
    for answer in &answers {
        assert_eq!(answer["status"], 200, "{answer}");
        for (name, value) in &alice {
            assert_eq!(text(&answer["headers"], name), value, "{name}");
        }
    }
}

/// Without a client certificate, or with `quic_client_cert_headers = false`, no
/// `X-Client-Cert-*` field reaches the backend, not even the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_headers_can_be_turned_off_and_are_never_the_clients() {
    let backend = echo_backend().await;
    let pki = tempfile::tempdir().unwrap();
    common::client_pki::make_client_pki(pki.path());
    let p = |name: &str| pki.path().join(name).display().to_string();
    let extra = format!(
        "client_auth = \"optional\"\nclient_ca = {:?}\nquic_client_cert_headers = false\n",
        p("ca.pem")
    );
    let (_dir, _server, port) = start_quic(&backend.to_string(), "", &extra);
    let (cert, key) = (p("alice.pem"), p("alice.key"));
    let answers = tokio::task::spawn_blocking(move || {
        let forged = ["-header", "X-Client-Cert-Subject: CN=forged"];
        let presented = ["-cert", cert.as_str(), "-key", key.as_str()];
        let with_cert = h3(port, &[&presented[..], &forged[..]].concat());
        let without = h3(port, &forged);
        [with_cert, without].concat()
    })
    .await
    .unwrap();
    for answer in &answers {
        assert_eq!(answer["status"], 200, "{answer}");
        assert_eq!(text(&answer["headers"], "x-seen-x-client-cert-subject"), "");
        assert_eq!(text(&answer["headers"], "x-seen-x-client-cert-sha256"), "");
    }
}

/// `quic_retry = "always"`: quic-go's connection is answered with a Retry, comes back
/// with the token, and completes its handshake and request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retry_always_a_client_proves_its_address_first() {
    let backend = echo_backend().await;
    let extra = "quic_retry = \"always\"\n";
    let (_dir, server, port) = start_quic(&backend.to_string(), "", extra);
    let answers = tokio::task::spawn_blocking(move || h3(port, &[]))
        .await
        .unwrap();
    assert_eq!(answers[0]["status"], 200, "{}", answers[0]);
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_quic_handshakes_total{kind=\"full\"} 1");
    // quic-go's ClientHello (with a post-quantum key share) spans two Initial datagrams:
    // each gets a Retry, as nothing is kept between them; the client takes the first.
    let retries = metric(admin, "tlsterm_quic_retries_total", "");
    assert!((1.0..=2.0).contains(&retries), "{retries}");
    assert_eq!(metric(admin, "tlsterm_quic_tokens_refused_total", ""), 0.0);
    assert_eq!(metric(admin, "tlsterm_quic_connections_total", ""), 1.0);
}

/// `quic_retry = "auto"`: no Retry while the worker's handshakes in progress are below
/// `quic_retry_threshold`, a Retry once they reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retry_auto_a_client_gets_a_retry_once_handshakes_pile_up() {
    let backend = echo_backend().await;
    let extra = "quic_retry = \"auto\"\nquic_retry_threshold = 1\n";
    let (_dir, server, port) = start_quic(&backend.to_string(), "", extra);
    let admin = admin_address(&server.config).unwrap();
    let first = tokio::task::spawn_blocking(move || h3(port, &[]))
        .await
        .unwrap();
    assert_eq!(first[0]["status"], 200, "{}", first[0]);
    assert_eq!(metric(admin, "tlsterm_quic_retries_total", ""), 0.0);

    // The threshold is per worker.
    let _stalled = stall_a_handshake_on_each_worker(port);
    wait_for_metric(admin, "tlsterm_quic_handshakes_in_progress 2");

    let second = tokio::task::spawn_blocking(move || h3(port, &[]))
        .await
        .unwrap();
    assert_eq!(second[0]["status"], 200, "{}", second[0]);
    // One Retry per Initial datagram of quic-go's ClientHello (see above).
    let retries = metric(admin, "tlsterm_quic_retries_total", "");
    assert!((1.0..=2.0).contains(&retries), "{retries}");
}

/// A handshake the client never finishes is given up at `handshake_timeout`, long before
/// the idle timeout would end it: the connection closes and counts as a failed handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_handshake_is_given_up_at_the_handshake_timeout() {
    let backend = echo_backend().await;
    let extra = "handshake_timeout = \"2s\"\nquic_idle_timeout = \"300s\"\n";
    let (_dir, server, port) = start_quic(&backend.to_string(), "", extra);
    let admin = admin_address(&server.config).unwrap();
    let started = std::time::Instant::now();
    let _stalled = stall_a_handshake_on_each_worker(port);
    wait_for_metric(admin, "tlsterm_quic_handshake_failures_total 2");
    assert!(started.elapsed() >= std::time::Duration::from_secs(2));
    wait_for_metric(admin, "tlsterm_quic_connections 0");
    wait_for_metric(admin, "tlsterm_quic_handshakes_in_progress 0");
}

/// On each of the two workers, a client that starts a handshake and never finishes it
/// (its first Initial's connection ID names the worker); they stay in progress while the
/// returned socket lives.
fn stall_a_handshake_on_each_worker(port: u16) -> std::net::UdpSocket {
    let server_address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let stalled = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for worker in [0, 1] {
        let initial = loop {
            let initial = quiche_client_initial(&stalled, server_address);
            let header = quiche::Header::from_slice(&mut initial.clone(), 16).unwrap();
            if u16::from_be_bytes([header.dcid[0], header.dcid[1]]) % 2 == worker {
                break initial;
            }
        };
        stalled.send_to(&initial, server_address).unwrap();
    }
    stalled
}

/// A connection of quiche's client from `socket` to `server`, nothing sent yet, resuming
/// `session` (with 0-RTT where the server allows it) if given; it offers X25519 alone, so
/// its ClientHello fits one datagram (a post-quantum key share would spread it over two).
fn quiche_client(
    socket: &std::net::UdpSocket,
    server: SocketAddr,
    session: Option<&[u8]>,
) -> quiche::Connection {
    let mut config = quiche::Config::new(quiche::PROTOCOL_VERSION).unwrap();
    config.enable_early_data();
    config.set_application_protos(&[b"h3"]).unwrap();
    config.verify_peer(false);
    config.set_curves_list("X25519").unwrap();
    // Room for the server's HTTP/3 control and QPACK streams, and for responses on the
    // client's own request streams.
    config.set_initial_max_data(1 << 20);
    config.set_initial_max_streams_uni(3);
    config.set_initial_max_stream_data_uni(1 << 16);
    config.set_initial_max_stream_data_bidi_local(1 << 16);
    let scid = random_id();
    let scid = quiche::ConnectionId::from_ref(&scid);
    let local = socket.local_addr().unwrap();
    let mut conn = quiche::connect(Some("localhost"), &scid, local, server, &mut config).unwrap();
    if let Some(session) = session {
        conn.set_session(session).unwrap();
    }
    conn
}

/// Sends all that `conn` has to send.
fn quiche_flush(conn: &mut quiche::Connection, socket: &std::net::UdpSocket) {
    for (datagram, to) in quiche_datagrams(conn) {
        socket.send_to(&datagram, to).unwrap();
    }
}

/// The datagrams `conn` has to send now and where to, unsent.
fn quiche_datagrams(conn: &mut quiche::Connection) -> Vec<(Vec<u8>, SocketAddr)> {
    let mut datagrams = Vec::new();
    let mut out = vec![0u8; 1500];
    loop {
        match conn.send(&mut out) {
            Ok((len, info)) => datagrams.push((out[..len].to_vec(), info.to)),
            Err(quiche::Error::Done) => return datagrams,
            Err(err) => panic!("quiche: {err}"),
        }
    }
}

/// The client's side of the handshake, sending only until it is complete (the
/// acknowledgements also lift the server's anti-amplification limit): what it has to send
/// then (its Finished) stays unsent.
fn quiche_handshake(
    conn: &mut quiche::Connection,
    socket: &std::net::UdpSocket,
    server: SocketAddr,
) {
    let info = from_server(socket, server);
    while !conn.is_established() {
        conn.recv(&mut receive(socket), info).unwrap();
        if !conn.is_established() {
            quiche_flush(conn, socket);
        }
    }
}

/// Where a datagram `socket` received came from and arrived, for quiche's client.
fn from_server(socket: &std::net::UdpSocket, server: SocketAddr) -> quiche::RecvInfo {
    quiche::RecvInfo {
        from: server,
        to: socket.local_addr().unwrap(),
    }
}

/// A session ticket from a first, complete connection to `server`.
fn quiche_session(server: SocketAddr) -> Vec<u8> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut conn = quiche_client(&socket, server, None);
    quiche_exchange_until(&mut conn, &socket, server, |conn| {
        conn.is_established() && conn.session().is_some()
    });
    conn.session().unwrap().to_vec()
}

/// A new connection of quiche's client to `server`, its handshake complete (its last flight
/// sent), and the socket it uses.
fn quiche_connected(server: SocketAddr) -> (std::net::UdpSocket, quiche::Connection) {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut conn = quiche_client(&socket, server, None);
    quiche_exchange_until(
        &mut conn,
        &socket,
        server,
        quiche::Connection::is_established,
    );
    (socket, conn)
}

/// Sends what `conn` has to send and reads the server's answers, in turn, until `done`
/// says so after a send.
fn quiche_exchange_until(
    conn: &mut quiche::Connection,
    socket: &std::net::UdpSocket,
    server: SocketAddr,
    done: impl Fn(&quiche::Connection) -> bool,
) {
    let info = from_server(socket, server);
    loop {
        quiche_flush(conn, socket);
        if done(conn) {
            return;
        }
        conn.recv(&mut receive(socket), info).unwrap();
    }
}

/// A client's first Initial datagram (1200 bytes), from quiche's client state machine
/// for a connection from `socket` to `server`.
fn quiche_client_initial(socket: &std::net::UdpSocket, server: SocketAddr) -> Vec<u8> {
    let mut conn = quiche_client(socket, server, None);
    let mut out = vec![0u8; 1500];
    let (len, _) = conn.send(&mut out).unwrap();
    out.truncate(len);
    let more = conn.send(&mut vec![0u8; 1500]);
    assert_eq!(more.err(), Some(quiche::Error::Done), "one datagram");
    out
}

/// A long-header Initial datagram of `version` with `token`, padded to 1200 bytes with a
/// payload that is not encrypted (what the endpoint reads before quiche decrypts).
fn raw_initial(version: u32, dcid: &[u8], scid: &[u8], token: &[u8]) -> Vec<u8> {
    const SIZE: usize = 1200;
    let mut packet = vec![0xc3];
    packet.extend_from_slice(&version.to_be_bytes());
    packet.push(dcid.len() as u8);
    packet.extend_from_slice(dcid);
    packet.push(scid.len() as u8);
    packet.extend_from_slice(scid);
    assert!(token.len() < 64, "a one-byte length");
    packet.push(token.len() as u8);
    packet.extend_from_slice(token);
    let rest = SIZE - packet.len() - 2;
    packet.extend_from_slice(&(0x4000 | rest as u16).to_be_bytes());
    packet.resize(SIZE, 0x5a);
    packet
}

fn random_id() -> Vec<u8> {
    let mut id = vec![0u8; 16];
    boring::rand::rand_bytes(&mut id).unwrap();
    id
}

/// Receives one datagram on `socket`, within the test's deadline.
fn receive(socket: &std::net::UdpSocket) -> Vec<u8> {
    socket.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut buf = vec![0u8; 65_535];
    let (len, _) = socket.recv_from(&mut buf).expect("an answer");
    buf.truncate(len);
    buf
}

/// A token is refused when it was made up, altered, or taken to another address: the
/// Initial is dropped (no Retry, no connection) and counted; the genuine token from its
/// own address makes a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_stolen_token_is_refused() {
    let backend = echo_backend().await;
    let extra = "quic_retry = \"always\"\n";
    let (_dir, server, port) = start_quic(&backend.to_string(), "", extra);
    let admin = admin_address(&server.config).unwrap();
    let server_address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let thief = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let v1 = quiche::PROTOCOL_VERSION;

    let (original, client_id) = (random_id(), random_id());
    client
        .send_to(&raw_initial(v1, &original, &client_id, &[]), server_address)
        .unwrap();
    let mut answer = receive(&client);
    let retry = quiche::Header::from_slice(&mut answer, 0).unwrap();
    assert_eq!(retry.ty, quiche::Type::Retry);
    assert_eq!(retry.dcid.as_ref(), &client_id[..]);
    let token = retry.token.clone().unwrap();
    let retry_id = retry.scid.to_vec();
    wait_for_metric(admin, "tlsterm_quic_retries_total 1");

    let stolen = raw_initial(v1, &retry_id, &client_id, &token);
    thief.send_to(&stolen, server_address).unwrap();
    let mut altered_token = token.clone();
    *altered_token.last_mut().unwrap() ^= 1;
    let altered = raw_initial(v1, &retry_id, &client_id, &altered_token);
    client.send_to(&altered, server_address).unwrap();
    let other_id = raw_initial(v1, &random_id(), &client_id, &token);
    client.send_to(&other_id, server_address).unwrap();
    let made_up = raw_initial(v1, &random_id(), &client_id, &[7u8; 40]);
    client.send_to(&made_up, server_address).unwrap();
    wait_for_metric(
        admin,
        "tlsterm_quic_tokens_refused_total{reason=\"invalid\"} 4",
    );
    assert_eq!(metric(admin, "tlsterm_quic_retries_total", ""), 1.0);
    assert_eq!(metric(admin, "tlsterm_quic_connections_total", ""), 0.0);

    // The genuine token, from its own address, with the Retry's ID: a connection (whose
    // handshake goes nowhere: this Initial carries no real ClientHello).
    let genuine = raw_initial(v1, &retry_id, &client_id, &token);
    client.send_to(&genuine, server_address).unwrap();
    wait_for_metric(admin, "tlsterm_quic_connections_total 1");
    assert_eq!(metric(admin, "tlsterm_quic_retries_total", ""), 1.0);
}

/// A long-header packet of a version tlsterm does not speak is answered with Version
/// Negotiation listing QUIC version 1, to the client's IDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_version_gets_version_negotiation() {
    let backend = echo_backend().await;
    let (_dir, _server, port) = start_quic(&backend.to_string(), "", "");
    let server_address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let (dcid, scid) = (random_id(), random_id());
    for version in [0x1a2a_3a4a_u32, 0xff00_001d] {
        let packet = raw_initial(version, &dcid, &scid, &[]);
        client.send_to(&packet, server_address).unwrap();
        let mut answer = receive(&client);
        let negotiation = quiche::Header::from_slice(&mut answer, 0).unwrap();
        assert_eq!(negotiation.ty, quiche::Type::VersionNegotiation);
        assert_eq!(negotiation.dcid.as_ref(), &scid[..]);
        assert_eq!(negotiation.scid.as_ref(), &dcid[..]);
        assert_eq!(negotiation.versions, Some(vec![quiche::PROTOCOL_VERSION]));
    }
}

/// A client that sends its first Initial and nothing more (as a forged source address
/// would) receives at most three times what it sent, although the server's first flight
/// (a certificate of over 4 KB) is larger, and it is sent again on timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unvalidated_address_gets_at_most_three_times_what_it_sent() {
    let backend = echo_backend().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = large_certificate(dir.path());
    let table = format!("[[listener.certificate]]\ncert = {cert:?}\nkey = {key:?}\n");
    let (_dir, server, port) = start_quic(&backend.to_string(), "", &table);
    let server_address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let initial = quiche_client_initial(&client, server_address);
    client.send_to(&initial, server_address).unwrap();

    let mut received = receive(&client).len();
    // Everything else that comes until the server has been quiet past its first
    // retransmission timeout (quiche's first is about a second).
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(3)))
        .unwrap();
    let mut buf = vec![0u8; 65_535];
    while let Ok((len, _)) = client.recv_from(&mut buf) {
        received += len;
        assert!(received <= 3 * initial.len(), "{received} bytes");
    }
    assert!(
        received > initial.len(),
        "the server did answer: {received} bytes"
    );
    let admin = admin_address(&server.config).unwrap();
    assert_eq!(metric(admin, "tlsterm_quic_handshakes_total", ""), 0.0);
}

/// An ECDSA certificate for localhost with enough names to make it over 4 KB.
fn large_certificate(dir: &Path) -> (String, String) {
    let p = |name: &str| dir.join(name).display().to_string();
    let names: Vec<String> = (0..300)
        .map(|i| format!("DNS:name-{i:03}.example.test"))
        .collect();
    run(Command::new("openssl").args([
        "req",
        "-x509",
        "-nodes",
        "-days",
        "2",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-subj",
        "/CN=localhost",
        "-addext",
        &format!("subjectAltName=DNS:localhost,{}", names.join(",")),
        "-keyout",
        &p("large.key"),
        "-out",
        &p("large.pem"),
    ]));
    let pem = std::fs::read(p("large.pem")).unwrap();
    let der = boring::x509::X509::from_pem(&pem)
        .unwrap()
        .to_der()
        .unwrap();
    assert!(der.len() > 4000, "{} bytes", der.len());
    (p("large.pem"), p("large.key"))
}
