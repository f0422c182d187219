//! The server run inside the test process, as `tlsterm serve` runs it (`server::bind`, then
//! `server::serve` on a thread of its own) but told to reload and stop through its events
//! rather than by signals, on listeners the kernel gives a port (port 0). Real TLS clients
//! over 127.0.0.1. The signal path (SIGHUP, SIGTERM) stays covered end to end by
//! `tests/suite/serve.rs` and `tests/suite/abuse.rs`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::common::config::ConfigBuilder;
use crate::common::*;
use boring::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
use tlsterm::server::{self, ConfigSource, Event, ReloadRefusal, Reloads};
use tokio::sync::{mpsc, watch};

/// A server running in this process, on a thread of its own with a current-thread runtime
/// (as `tlsterm serve` runs on its main thread).
struct InProcess {
    addresses: Vec<SocketAddr>,
    events: mpsc::Sender<Event>,
    reloads: watch::Receiver<Reloads>,
    thread: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl InProcess {
    /// Binds and serves `config`; panics if it does not start.
    fn start(config: &Path) -> InProcess {
        InProcess::serve(bind(config).expect("server starts"))
    }

    /// Serves what `bind` prepared.
    fn serve(bound: server::Bound) -> InProcess {
        let addresses = bound.listener_addresses();
        let reloads = bound.reloads();
        let (events, received) = mpsc::channel(1);
        let thread = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(server::serve(bound, received))
        });
        InProcess {
            addresses,
            events,
            reloads,
            thread,
        }
    }

    /// The first listener's port.
    fn port(&self) -> u16 {
        self.addresses[0].port()
    }

    async fn send(&self, event: Event) {
        self.events
            .send(event)
            .await
            .expect("the server reads its events");
    }

    /// Asks for a reload and waits for its outcome.
    async fn reload(&mut self) -> Result<(), ReloadRefusal> {
        let done = self.reloads.borrow_and_update().done;
        self.send(Event::Reload).await;
        let reloads = tokio::time::timeout(DEADLINE, self.reloads.wait_for(|r| r.done > done))
            .await
            .expect("the reload ends")
            .expect("the server publishes its reloads");
        assert_eq!(reloads.done, done + 1);
        reloads.last.expect("a reload's outcome")
    }

    /// Waits until `serve` has returned (within `DEADLINE`); returns what it returned.
    fn stopped(self) -> anyhow::Result<()> {
        let thread = self.thread;
        tokio::task::block_in_place(|| wait_until("serve returns", || thread.is_finished()));
        thread.join().expect("serve does not panic")
    }
}

fn bind(config: &Path) -> anyhow::Result<server::Bound> {
    let source = ConfigSource::File(config.to_path_buf());
    tokio::task::block_in_place(|| server::bind(source))
}

/// A configuration without the admin listener (the tests of this file share a process)
/// and one listener in front of the built-in backend, on `port`, serving `cert`.
fn config(dir: &Path, port: u16, cert: &(PathBuf, PathBuf)) -> PathBuf {
    ConfigBuilder::new()
        .section("admin", |admin| admin.set("enabled", false))
        .listener(|l| l.port(port).backend("builtin").cert(&cert.0, &cert.1))
        .write(dir)
}

async fn served_certificate(port: u16) -> Vec<u8> {
    let client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .expect("a TLS connection");
    client.ssl().peer_certificate().unwrap().to_der().unwrap()
}

/// A connection that has completed one request.
async fn established(port: u16) -> TlsClient {
    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .expect("a TLS connection");
    http_get(&mut client, "/").await.expect("a response");
    client
}

/// A reload event swaps the certificates for new connections; an established connection
/// goes on with the state it started with. The listener on port 0 keeps the port the
/// kernel gave it when the reloaded configuration names that port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_event_serves_the_new_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let first = make_cert(dir.path(), "first", "localhost", KeyType::EcdsaP256);
    let mut server = InProcess::start(&config(dir.path(), 0, &first));
    let port = server.port();
    assert_ne!(port, 0);
    let before = served_certificate(port).await;
    let mut client = established(port).await;

    let second = make_cert(dir.path(), "second", "localhost", KeyType::EcdsaP256);
    config(dir.path(), port, &second);
    assert_eq!(server.reload().await, Ok(()));
    assert_ne!(served_certificate(port).await, before);
    http_get(&mut client, "/")
        .await
        .expect("served after the reload");

    drop(client);
    server.send(Event::Stop).await;
    server.stopped().expect("serve ends well");
}

/// Reloads that fail at each step (the file, a certificate, a new listener's port) are
/// refused with that step's reason, and the running state keeps serving, established
/// connections and new ones alike; a good configuration then applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_reloads_keep_the_running_state() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "site", "localhost", KeyType::EcdsaP256);
    let mut server = InProcess::start(&config(dir.path(), 0, &cert));
    let port = server.port();
    let served = served_certificate(port).await;
    let mut client = established(port).await;

    let path = config(dir.path(), port, &cert);
    std::fs::write(&path, "workers = \"many\"\n").unwrap();
    assert_eq!(server.reload().await, Err(ReloadRefusal::Config));
    assert_eq!(served_certificate(port).await, served);

    let garbage = (dir.path().join("garbage.pem"), cert.1.clone());
    std::fs::write(&garbage.0, "-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
    config(dir.path(), port, &garbage);
    assert_eq!(server.reload().await, Err(ReloadRefusal::Listeners));
    assert_eq!(served_certificate(port).await, served);

    // A second listener on a port held by a socket without SO_REUSEPORT cannot be bound.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    ConfigBuilder::new()
        .section("admin", |admin| admin.set("enabled", false))
        .listener(|l| l.port(port).backend("builtin").cert(&cert.0, &cert.1))
        .listener(|l| l.port(taken_port).backend("builtin"))
        .write(dir.path());
    assert_eq!(server.reload().await, Err(ReloadRefusal::Bind));
    assert_eq!(served_certificate(port).await, served);
    http_get(&mut client, "/")
        .await
        .expect("served through refused reloads");

    let renewed = make_cert(dir.path(), "renewed", "localhost", KeyType::EcdsaP256);
    config(dir.path(), port, &renewed);
    assert_eq!(server.reload().await, Ok(()));
    assert_ne!(served_certificate(port).await, served);

    drop(client);
    server.send(Event::Stop).await;
    server.stopped().expect("serve ends well");
}

/// A stop event closes the listener to new connections, lets an open one go on, and
/// `serve` returns once it has closed: well before a drain deadline longer than the
/// test's own, so that a drain that waited for its deadline fails the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_event_drains_open_connections() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "site", "localhost", KeyType::EcdsaP256);
    let config = ConfigBuilder::new()
        .set("drain_timeout", "300s")
        .section("admin", |admin| admin.set("enabled", false))
        .listener(|l| l.port(0).backend("builtin").cert(&cert.0, &cert.1))
        .write(dir.path());
    let server = InProcess::start(&config);
    let port = server.port();
    let mut client = established(port).await;

    server.send(Event::Stop).await;
    tokio::task::block_in_place(|| {
        wait_until("the listener refuses new connections", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        })
    });
    let body = http_get(&mut client, "/bytes/100000").await;
    assert_eq!(body.expect("served while draining").len(), 100_000);
    // The open connection holds the drain (its deadline is minutes away).
    assert!(!server.thread.is_finished());

    drop(client);
    server.stopped().expect("serve ends well once drained");
}

/// Every sender of the events gone is a stop: a caller that drops its handle does not
/// leave a server behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_events_sender_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "site", "localhost", KeyType::EcdsaP256);
    let mut server = InProcess::start(&config(dir.path(), 0, &cert));
    let port = server.port();
    established(port).await;

    let (closed, _) = mpsc::channel(1);
    drop(std::mem::replace(&mut server.events, closed));
    server.stopped().expect("serve ends well");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// `bind` does what can fail at start: a listener's port held by another socket is an
/// error naming the address, returned before anything serves. A connection made between
/// `bind` and `serve` waits in the listener's queue and is served once `serve` runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_reports_a_taken_port_and_queues_connections_until_serve() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "site", "localhost", KeyType::EcdsaP256);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let refused = bind(&config(dir.path(), taken_port, &cert))
        .err()
        .expect("a taken port refuses the start");
    let message = format!("{refused:#}");
    assert!(
        message.contains(&format!("127.0.0.1:{taken_port}")),
        "{message}"
    );
    drop(taken);

    let bound = bind(&config(dir.path(), 0, &cert)).expect("server starts");
    let port = bound.listener_addresses()[0].port();
    let queued = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the listener is bound");
    let server = InProcess::serve(bound);
    queued.set_nonblocking(true).unwrap();
    let mut connector = SslConnector::builder(SslMethod::tls()).unwrap();
    connector.set_verify(SslVerifyMode::NONE);
    let tls = connector.build().configure().unwrap();
    let tcp = tokio::net::TcpStream::from_std(queued).unwrap();
    let mut client = tokio::time::timeout(DEADLINE, tokio_boring::connect(tls, "localhost", tcp))
        .await
        .expect("the queued connection is served")
        .expect("a handshake");
    http_get(&mut client, "/").await.expect("a response");

    drop(client);
    server.send(Event::Stop).await;
    server.stopped().expect("serve ends well");
}
