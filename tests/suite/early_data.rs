//! TLS 1.3 0-RTT with `openssl s_client -early_data`: accepted when the listener allows
//! it and marked to the backend (PROXY v2 TLV 0xE3), refused when the ClientHello is
//! replayed byte for byte, and refused once a reload turns it off.

use std::net::SocketAddr;
use std::path::Path;

use crate::common::config::{ConfigBuilder, Listener, Section};
use crate::common::*;
use tlsterm::proxy::proxy_protocol::{self, PP2_TYPE_TLSTERM_EARLY_DATA};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const EARLY_REQUEST: &str = "GET /early HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
const EARLY_DATA: &str = "tlsterm_early_data_total";

/// One backend connection: whether its PROXY header carried the early-data TLV, and the
/// first request line (or, if the connection ended before a whole request, what came).
#[derive(Debug)]
struct Seen {
    early_tlv: bool,
    request: String,
}

/// A backend on a free port; `serve` handles each connection and reports through the
/// channel.
async fn backend<T, F, Fut>(serve: F) -> (SocketAddr, mpsc::UnboundedReceiver<T>)
where
    T: Send + 'static,
    F: Fn(TcpStream, mpsc::UnboundedSender<T>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let backend = RawBackend::bind().await;
    let address = backend.address;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = backend.listener.accept().await {
            tokio::spawn(serve(stream, tx.clone()));
        }
    });
    (address, rx)
}

/// A backend that decodes the PROXY v2 header and the first request of each connection,
/// reports them, answers and closes. A connection that tlsterm ends before a whole request
/// is reported with what came.
async fn recording_backend() -> (SocketAddr, mpsc::UnboundedReceiver<Seen>) {
    backend(|mut stream, tx| async move {
        let mut received = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.unwrap_or(0);
            received.extend_from_slice(&chunk[..n]);
            let Ok((header, used)) = proxy_protocol::decode(&received) else {
                if n == 0 {
                    return;
                }
                continue;
            };
            let body = &received[used..];
            let complete = body.windows(4).any(|w| w == b"\r\n\r\n");
            if complete || n == 0 {
                let request = String::from_utf8_lossy(body);
                let _ = tx.send(Seen {
                    early_tlv: header.tlv(PP2_TYPE_TLSTERM_EARLY_DATA) == Some(&[1][..]),
                    request: request.lines().next().unwrap_or("").to_string(),
                });
                let reply = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
                let _ = stream.write_all(reply.as_bytes()).await;
                return;
            }
        }
    })
    .await
}

async fn next_request(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(DEADLINE, seen.recv())
        .await
        .expect("the backend gets a request")
        .unwrap()
}

/// What a relay passes on from the client.
#[derive(Clone, Copy, PartialEq)]
enum Relay {
    Everything,
    /// Only the client's first flight (see [`first_flight`]): the server never gets the
    /// Finished that would confirm its early data.
    FirstFlight,
    /// Everything, in pieces of this many bytes, each its own TCP segment.
    Pieces(usize),
}

/// A TCP relay for one connection to `target` that records what the client sent.
async fn recording_proxy(target: u16, relay: Relay) -> (u16, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut client, _) = listener.accept().await.unwrap();
        let mut server = TcpStream::connect(("127.0.0.1", target)).await.unwrap();
        let mut recorded = Vec::new();
        if let Relay::Pieces(piece) = relay {
            // The client's first flight (ClientHello and early data) in pieces; the rest
            // as it comes.
            let mut first = vec![0u8; 16 * 1024];
            let n = client.read(&mut first).await.unwrap();
            recorded.extend_from_slice(&first[..n]);
            write_in_pieces(&mut server, &recorded, piece).await;
        }
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        let back = tokio::spawn(async move {
            let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
        });
        let mut forwarded = recorded.len();
        let mut chunk = [0u8; 4096];
        loop {
            let n = client_read.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            recorded.extend_from_slice(&chunk[..n]);
            let forward = match relay {
                Relay::Everything | Relay::Pieces(_) => recorded.len(),
                Relay::FirstFlight => first_flight(&recorded).len(),
            };
            if server_write
                .write_all(&recorded[forwarded..forward])
                .await
                .is_err()
            {
                break;
            }
            forwarded = forward;
        }
        let _ = server_write.shutdown().await;
        let _ = back.await;
        recorded
    });
    (port, task)
}

/// `openssl s_client -tls1_3 -ign_eof` with `args`: it sends `input` after the handshake
/// and runs until the server closes, which it must.
async fn client(port: u16, args: &[&str], input: &'static str) -> String {
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.extend(["-tls1_3", "-ign_eof"].map(String::from));
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        s_client(port, &args, input)
    })
    .await
    .unwrap();
    // Ended by tlsterm closing (after the backend's answer), not by s_client's timeout.
    assert!(out.lines().any(|l| l == "closed"), "{out}");
    out
}

/// A listener on `port` relaying to `backend` with PROXY v2 (which marks early data).
fn listener(l: Listener, port: u16, backend: SocketAddr) -> Listener {
    l.port(port).backend(backend).proxy_v2()
}

/// A server with a fixed admin port (so a rewritten config can be reloaded), and the
/// files s_client uses: the session and the early request.
struct Setup {
    dir: tempfile::TempDir,
    /// The configuration without its listener: a rewrite for a reload keeps its admin port.
    base: ConfigBuilder,
    port: u16,
    backend: SocketAddr,
    server: Server,
    admin: SocketAddr,
}

impl Setup {
    /// With `session` as the `[session]` section and the listener's `early_data` keys.
    fn start(
        backend: SocketAddr,
        session: &Section,
        early_data: impl FnOnce(Listener) -> Listener,
    ) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let base = ConfigBuilder::new().session_as(session);
        let admin = base.admin_address();
        let port = free_port();
        let config = base
            .clone()
            .listener(|l| early_data(listener(l, port, backend)))
            .write(dir.path());
        std::fs::write(dir.path().join("request.txt"), EARLY_REQUEST).unwrap();
        let server = Server::start(&config);
        Setup {
            dir,
            base,
            port,
            backend,
            server,
            admin,
        }
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Resumes with `session`, sending the early request as 0-RTT through a relay that
    /// records what the client sent; returns those bytes.
    async fn early_request_recorded(&self, session: &str) -> Vec<u8> {
        let (relay_port, recorded) = recording_proxy(self.port, Relay::Everything).await;
        let request = self.file("request.txt");
        let early = ["-sess_in", session, "-early_data", &request];
        let out = client(relay_port, &early, "").await;
        assert!(out.contains("Reused, TLSv1.3"), "{out}");
        assert!(out.contains("Early data was accepted"), "{out}");
        recorded.await.unwrap()
    }

    /// Sends recorded client bytes as they are, as an attacker would, and waits until
    /// tlsterm closes the connection.
    async fn replay(&self, recorded: &[u8]) {
        self.replay_then(recorded, true).await
    }

    /// As `replay`; `close` ends the attacker's sending side after the bytes, else it
    /// stays open (and only tlsterm can end the connection).
    async fn replay_then(&self, recorded: &[u8], close: bool) {
        let mut replay = TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        replay.write_all(recorded).await.unwrap();
        if close {
            replay.shutdown().await.unwrap();
        }
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(DEADLINE, replay.read_to_end(&mut answer))
            .await
            .expect("tlsterm closes the replayed connection");
    }

    /// A full handshake whose ticket is saved for the next connections.
    async fn save_session(&self, seen: &mut mpsc::UnboundedReceiver<Seen>) -> String {
        let session = self.file("session.pem");
        let out = client(self.port, &["-sess_out", &session], GET_CLOSE).await;
        assert!(out.contains("New, TLSv1.3"), "{out}");
        let first = next_request(seen).await;
        assert!(!first.early_tlv, "{first:?}");
        assert!(Path::new(&session).exists(), "{out}");
        session
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_is_accepted_marked_and_never_replayed() {
    let (backend, mut seen) = recording_backend().await;
    let setup = Setup::start(backend, &Section::default(), accept_0rtt);
    let session = setup.save_session(&mut seen).await;
    let request = setup.file("request.txt");

    // Resumed with the request as early data, through a relay that records the client.
    let recorded = setup.early_request_recorded(&session).await;
    let got = next_request(&mut seen).await;
    assert_eq!(got.request, "GET /early HTTP/1.1");
    assert!(
        got.early_tlv,
        "the backend is told the request came as early data"
    );
    assert_eq!(metric(setup.admin, EARLY_DATA, "result=\"accepted\""), 1.0);

    // An attacker replays the recorded bytes: ClientHello, early data and the rest. The
    // ClientHello is recognised and gets no 0-RTT, so the request is not decrypted again.
    setup.replay(&recorded).await;
    assert_eq!(metric(setup.admin, EARLY_DATA, "result=\"replayed\""), 1.0);
    assert_eq!(metric(setup.admin, EARLY_DATA, "result=\"accepted\""), 1.0);
    assert!(seen.try_recv().is_err(), "nothing reached the backend");

    // The same ticket in a new ClientHello (a fresh random, so a fresh binder) is fine.
    let early = ["-sess_in", &session, "-early_data", &request];
    let out = client(setup.port, &early, "").await;
    assert!(out.contains("Early data was accepted"), "{out}");
    let got = next_request(&mut seen).await;
    assert!(
        got.early_tlv && got.request == "GET /early HTTP/1.1",
        "{got:?}"
    );
    assert_eq!(metric(setup.admin, EARLY_DATA, "result=\"accepted\""), 2.0);

    // `tlsterm stats` shows the counts too.
    let stats = run(std::process::Command::new(TLSTERM).args([
        "stats",
        "--admin",
        &setup.admin.to_string(),
    ]));
    let text = String::from_utf8_lossy(&stats.stdout);
    let line = |result: &str| {
        text.lines()
            .any(|l| l.starts_with("0-rtt") && l.contains(result))
    };
    assert!(
        line("result=\"accepted\"") && line("result=\"replayed\""),
        "{text}"
    );
}

/// A ClientHello that arrives in small TCP segments (large post-quantum key shares make
/// that common) is read whole by the anti-replay check: its early data is accepted once,
/// and the same bytes replayed in pieces are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hello_in_pieces_is_checked_for_replay() {
    let (backend, mut seen) = recording_backend().await;
    let setup = Setup::start(backend, &Section::default(), accept_0rtt);
    let session = setup.save_session(&mut seen).await;
    let (relay_port, recorded) = recording_proxy(setup.port, Relay::Pieces(40)).await;
    let request = setup.file("request.txt");
    let early = ["-sess_in", &session, "-early_data", &request];
    let out = client(relay_port, &early, "").await;
    assert!(out.contains("Early data was accepted"), "{out}");
    let got = next_request(&mut seen).await;
    assert!(
        got.early_tlv && got.request == "GET /early HTTP/1.1",
        "{got:?}"
    );
    let recorded = recorded.await.unwrap();
    assert!(recorded.len() > 200, "{} bytes", recorded.len());

    let mut replay = TcpStream::connect(("127.0.0.1", setup.port)).await.unwrap();
    write_in_pieces(&mut replay, &recorded, 40).await;
    replay.shutdown().await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, replay.read_to_end(&mut answer))
        .await
        .expect("tlsterm closes the replayed connection");
    assert_eq!(metric(setup.admin, EARLY_DATA, "result=\"replayed\""), 1.0);
    assert_eq!(metric(setup.admin, EARLY_DATA, "result=\"accepted\""), 1.0);
    assert!(seen.try_recv().is_err(), "nothing reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_is_refused_once_disabled() {
    let (backend, mut seen) = recording_backend().await;
    let setup = Setup::start(backend, &Section::default(), accept_0rtt);
    let session = setup.save_session(&mut seen).await;
    let request = setup.file("request.txt");

    let refusing = setup
        .base
        .clone()
        .listener(|l| listener(l, setup.port, setup.backend).set("early_data", false));
    refusing.write(setup.dir.path());
    assert!(setup.server.reload().contains("reloaded"));

    // The ticket still resumes (keys survive reloads), but its early data is refused and
    // only the request sent after the handshake reaches the backend, unmarked.
    let early = ["-sess_in", &session, "-early_data", &request];
    let out = client(setup.port, &early, GET_CLOSE).await;
    assert!(out.contains("Reused, TLSv1.3"), "{out}");
    assert!(out.contains("Early data was rejected"), "{out}");
    let got = next_request(&mut seen).await;
    assert_eq!(got.request, "GET / HTTP/1.1");
    assert!(!got.early_tlv);
    assert_eq!(metric(setup.admin, EARLY_DATA, ""), 0.0);

    // Tickets issued now do not offer early data at all.
    let out = client(setup.port, &["-sess_out", &session], GET_CLOSE).await;
    next_request(&mut seen).await;
    assert!(!out.contains("Max Early Data: 14336"), "{out}");
}

/// Two processes sharing ticket keys (so each resumes the other's tickets) and a Redis: a
/// ClientHello with early data recorded on one is refused 0-RTT when replayed to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_to_another_process_is_refused_through_redis() {
    let (_redis, _keys, session) = fleet_with_redis();
    let (backend, mut seen) = recording_backend().await;
    let a = Setup::start(backend, &session, accept_0rtt);
    let b = Setup::start(backend, &session, accept_0rtt);

    let ticket = a.save_session(&mut seen).await;
    let recorded = a.early_request_recorded(&ticket).await;
    assert!(next_request(&mut seen).await.early_tlv);

    b.replay(&recorded).await;
    assert_eq!(metric(b.admin, EARLY_DATA, "result=\"replayed\""), 1.0);
    assert_eq!(metric(b.admin, EARLY_DATA, "result=\"accepted\""), 0.0);
    let claims = "tlsterm_session_redis_operations_total";
    assert_eq!(metric(b.admin, claims, "op=\"claim\",result=\"ok\""), 1.0);
}

/// A Redis that loses its claims (FLUSHALL here; a restart without persistence alike)
/// within a replay window does not let another process accept again a ClientHello
/// accepted before: 0-RTT is refused across the fleet for one window after, and said so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_redis_lost_its_claims_is_refused() {
    let (redis, _keys, session) = fleet_with_redis();
    let (backend, mut seen) = recording_backend().await;
    let a = Setup::start(backend, &session, accept_0rtt);
    let b = Setup::start(backend, &session, accept_0rtt);

    let ticket = a.save_session(&mut seen).await;
    let recorded = a.early_request_recorded(&ticket).await;
    assert!(next_request(&mut seen).await.early_tlv);
    let mut connection = redis.connection().unwrap();
    redis::cmd("FLUSHALL").query::<()>(&mut connection).unwrap();

    b.replay(&recorded).await;
    let lost = "result=\"replay_state_lost\"";
    assert_eq!(metric(b.admin, EARLY_DATA, lost), 1.0);
    assert_eq!(metric(b.admin, EARLY_DATA, "result=\"accepted\""), 0.0);
    assert!(b.server.log.contains("Redis kept no 0-RTT claims"));
    // Another process too, for as long as the window lasts.
    let since: i64 = redis::cmd("GET")
        .arg(CLAIMS_SINCE)
        .query(&mut connection)
        .unwrap();
    assert!(since > 0);
    let request = a.file("request.txt");
    let early = ["-sess_in", &ticket, "-early_data", &request];
    let out = client(a.port, &early, GET_CLOSE).await;
    assert!(out.contains("Early data was rejected"), "{out}");
    assert_eq!(metric(a.admin, EARLY_DATA, lost), 1.0);
}

/// A ClientHello refused 0-RTT by one process (its client network had used its share of
/// the memory) is still claimed in Redis: a copy replayed to another process is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hello_refused_for_its_share_is_claimed_for_the_fleet() {
    let (_redis, _keys, session) = fleet_with_redis();
    let (backend, mut seen) = recording_backend().await;
    let small_memory = session.clone().set("early_data_replay_entries", 200);
    let a = Setup::start(backend, &small_memory, accept_0rtt);
    let b = Setup::start(backend, &session, accept_0rtt);
    let ticket = a.save_session(&mut seen).await;
    let request = a.file("request.txt");
    let early = ["-sess_in", &ticket, "-early_data", &request];
    for _ in 0..2 {
        let out = client(a.port, &early, "").await;
        assert!(out.contains("Early data was accepted"), "{out}");
        assert!(next_request(&mut seen).await.early_tlv);
    }
    // The third from this client: refused for its share (1-RTT), recorded by an attacker.
    let (relay_port, recorded) = recording_proxy(a.port, Relay::Everything).await;
    let out = client(relay_port, &early, GET_CLOSE).await;
    assert!(out.contains("Early data was rejected"), "{out}");
    assert!(!next_request(&mut seen).await.early_tlv);
    let recorded = recorded.await.unwrap();
    assert_eq!(
        metric(a.admin, EARLY_DATA, "result=\"replay_client_quota\""),
        1.0
    );
    // Its claim is made in the background: wait for Redis to have answered it.
    let claims = "tlsterm_session_redis_operations_total";
    let deadline = std::time::Instant::now() + DEADLINE;
    while metric(a.admin, claims, "op=\"claim\",result=\"ok\"") < 3.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the refused ClientHello is claimed"
        );
        tokio::task::yield_now().await;
    }

    b.replay(&recorded).await;
    assert_eq!(metric(b.admin, EARLY_DATA, "result=\"replayed\""), 1.0);
    assert_eq!(metric(b.admin, EARLY_DATA, "result=\"accepted\""), 0.0);
}

/// Where a Redis says since when it keeps 0-RTT claims (milliseconds of its clock).
const CLAIMS_SINCE: &str = "tlsterm:session:0rtt_claims_since";

/// What a fleet of processes shares: a Redis, a ticket key file, and the `[session]`
/// lines that point at both. Redis runs, and the key file exists, while the first two live.
/// Its Redis has kept 0-RTT claims for long (as one in service would), so the fleet's
/// first window does not refuse 0-RTT.
fn fleet_with_redis() -> (Redis, tempfile::TempDir, Section) {
    let redis = Redis::start();
    let mut connection = redis.connection().unwrap();
    redis::cmd("SET")
        .arg(CLAIMS_SINCE)
        .arg(0)
        .query::<()>(&mut connection)
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let fleet_key = fleet_key_file(keys.path(), "fleet.key");
    let session = shared_ticket_keys(keys.path())
        .set("redis_url", redis.url())
        .set("fleet_key_file", &fleet_key);
    (redis, keys, session)
}

/// A ticket key file in `dir`, as every process of a fleet would share it, and the
/// `[session]` key that points at it.
fn shared_ticket_keys(dir: &std::path::Path) -> Section {
    let key_file = dir.join("ticket.keys");
    std::fs::write(&key_file, key_line(1)).unwrap();
    Section::default().set("ticket_key_file", &key_file)
}

/// `early_data = true` on the listener.
fn accept_0rtt(l: Listener) -> Listener {
    l.set("early_data", true)
}

/// The client's first flight in recorded bytes: its TLS records up to the first
/// application-data record (the ClientHello, a compatibility ChangeCipherSpec, and the
/// early data of a short request), without the Finished that would confirm it.
fn first_flight(recorded: &[u8]) -> &[u8] {
    let mut at = 0;
    while let Some(header) = recorded.get(at..at + 5) {
        at += 5 + usize::from(u16::from_be_bytes([header[3], header[4]]));
        if header[0] == 23 {
            break;
        }
    }
    &recorded[..at.min(recorded.len())]
}

/// `max_early_data` bounds what reaches the backend before the handshake completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_past_max_early_data_waits_for_the_handshake() {
    let limited = |l: Listener| {
        accept_0rtt(l)
            .set("max_early_data", 16)
            .set("handshake_timeout", "1s")
    };
    let (backend, mut seen) = recording_backend().await;
    let setup = Setup::start(backend, &Section::default(), limited);
    let ticket = setup.save_session(&mut seen).await;

    // A real client: the first 16 bytes pass early, the rest once the handshake completes.
    setup.early_request_recorded(&ticket).await;
    let got = next_request(&mut seen).await;
    assert!(
        got.early_tlv && got.request == "GET /early HTTP/1.1",
        "{got:?}"
    );

    // A client whose Finished never arrives (the relay keeps it, and keeps the connection
    // open), as with a copy replayed where the anti-replay memory cannot see it: the
    // backend gets 16 bytes, and the handshake timeout ends the connection.
    let (relay_port, _) = recording_proxy(setup.port, Relay::FirstFlight).await;
    let request = setup.file("request.txt");
    let early = ["-sess_in", ticket.as_str(), "-early_data", &request];
    let early: Vec<String> = early.iter().map(|s| s.to_string()).collect();
    let client = tokio::task::spawn_blocking(move || {
        let early: Vec<&str> = early.iter().map(String::as_str).collect();
        s_client(relay_port, &early, "")
    });
    let got = next_request(&mut seen).await;
    assert!(got.early_tlv, "{got:?}");
    assert_eq!(got.request, &EARLY_REQUEST[..16]);
    let out = client.await.unwrap();
    assert!(out.contains("Early data was accepted"), "{out}");
    assert_eq!(metric(setup.admin, EARLY_DATA, "result=\"accepted\""), 2.0);
}

/// A process whose tickets may predate it (a shared key file) and that has no Redis cannot
/// know what the process before it saw: it refuses 0-RTT for a whole window after start,
/// and the client resumes with 1-RTT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_ticket_keys_without_redis_refuse_early_data_after_start() {
    let keys = tempfile::tempdir().unwrap();
    let session = shared_ticket_keys(keys.path());
    let (backend, mut seen) = recording_backend().await;
    let setup = Setup::start(backend, &session, accept_0rtt);
    let ticket = setup.save_session(&mut seen).await;

    let request = setup.file("request.txt");
    let early = ["-sess_in", &ticket, "-early_data", &request];
    let out = client(setup.port, &early, GET_CLOSE).await;
    assert!(out.contains("Reused, TLSv1.3"), "{out}");
    assert!(out.contains("Early data was rejected"), "{out}");
    let got = next_request(&mut seen).await;
    assert!(!got.early_tlv && got.request == "GET / HTTP/1.1", "{got:?}");
    let refused = "result=\"replay_window_after_start\"";
    assert_eq!(metric(setup.admin, EARLY_DATA, refused), 1.0);
    assert_eq!(metric(setup.admin, EARLY_DATA, "result=\"accepted\""), 0.0);
}

/// One client network fills at most 1/100 of the anti-replay memory per generation, so a
/// flood of (possibly forged) ClientHellos from one source cannot turn 0-RTT off for all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_fills_at_most_its_share_of_the_replay_memory() {
    let (backend, mut seen) = recording_backend().await;
    let setup = Setup::start(
        backend,
        &Section::default().set("early_data_replay_entries", 200),
        accept_0rtt,
    );
    let session = setup.save_session(&mut seen).await;
    let request = setup.file("request.txt");
    let early = ["-sess_in", &session, "-early_data", &request];
    for _ in 0..2 {
        let out = client(setup.port, &early, "").await;
        assert!(out.contains("Early data was accepted"), "{out}");
        assert!(next_request(&mut seen).await.early_tlv);
    }
    let out = client(setup.port, &early, GET_CLOSE).await;
    assert!(out.contains("Early data was rejected"), "{out}");
    let got = next_request(&mut seen).await;
    assert!(!got.early_tlv && got.request == "GET / HTTP/1.1", "{got:?}");
    let quota = "result=\"replay_client_quota\"";
    assert_eq!(metric(setup.admin, EARLY_DATA, quota), 1.0);
}

/// `tlsterm bench --mode resume --early-data` (rustls) sends its resumed requests as 0-RTT;
/// none of them is taken for a replay.
#[test]
fn bench_client_resumes_with_early_data() {
    let (_dir, server, port) = start_listener("builtin", "early_data = true");
    let out = run(std::process::Command::new(TLSTERM).args([
        "bench",
        &format!("https://127.0.0.1:{port}/"),
        "--insecure",
        "--json",
        "--quiet",
        "--mode",
        "resume",
        "--early-data",
        "--tls-version",
        "1.3",
        "-c",
        "4",
        "-n",
        "40",
    ]));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors_total"], 0, "{report}");
    // Sessions of 4 connections: the first of each is a full handshake, and every
    // resumed one carried its request as early data.
    let resumed = report["resumed"].as_u64().unwrap();
    assert!(resumed >= 20, "{report}");
    assert_eq!(report["early_data_accepted"], resumed, "{report}");
    let admin = admin_address(&server.config).unwrap();
    assert_eq!(
        metric(admin, EARLY_DATA, "result=\"accepted\""),
        resumed as f64
    );
    assert_eq!(metric(admin, EARLY_DATA, "result=\"replayed\""), 0.0);
}
