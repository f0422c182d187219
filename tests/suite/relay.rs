//! The byte relay under load: a large transfer both ways at once, and idle connections
//! that hold no relay buffer. Real sockets on 127.0.0.1, tlsterm as a child process.

use crate::common::*;
use boring::ssl::SslVersion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes that differ from one position to the next, so a lost, doubled or reordered
/// stretch shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

/// Many MiB each way at the same time, both ends writing before either reads the other:
/// every byte arrives in order, and each side's EOF follows the other's last byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfer_both_ways_at_once() {
    const LEN: usize = 24 << 20;
    let backend = RawBackend::bind().await;
    let (_dir, _server, port) = start_listener(&backend.address.to_string(), "");

    let client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    let (mut client_read, mut client_write) = tokio::io::split(client);
    // The first bytes open the backend connection.
    client_write.write_all(b"go").await.unwrap();
    let upstream = backend.accept().await;
    let (mut upstream_read, mut upstream_write) = upstream.into_split();
    let mut go = [0u8; 2];
    upstream_read.read_exact(&mut go).await.unwrap();

    let up = pattern(LEN, 0x5a);
    let down = pattern(LEN, 0xa5);
    let (sent_up, sent_down) = (up.clone(), down.clone());
    let client_sends = tokio::spawn(async move {
        // Odd-sized writes: TLS records and relay reads do not line up with them.
        for piece in sent_up.chunks(100_003) {
            client_write.write_all(piece).await.unwrap();
        }
        client_write.shutdown().await.unwrap();
        client_write
    });
    let backend_sends = tokio::spawn(async move {
        for piece in sent_down.chunks(70_001) {
            upstream_write.write_all(piece).await.unwrap();
        }
        upstream_write.shutdown().await.unwrap();
        upstream_write
    });
    let backend_reads = tokio::spawn(async move {
        let mut got = Vec::with_capacity(LEN);
        upstream_read.read_to_end(&mut got).await.unwrap();
        got
    });
    let mut at_client = Vec::with_capacity(LEN);
    let _ = client_read.read_to_end(&mut at_client).await;
    let at_backend = backend_reads.await.unwrap();
    client_sends.await.unwrap();
    backend_sends.await.unwrap();
    assert_eq!(at_backend.len(), LEN, "bytes that reached the backend");
    assert!(
        at_backend == up,
        "the backend got other bytes than were sent"
    );
    assert_eq!(at_client.len(), LEN, "bytes that reached the client");
    assert!(
        at_client == down,
        "the client got other bytes than were sent"
    );
}

/// Connections that have relayed a request and its response and then wait hold no relay
/// buffer: the buffers in the process are the workers' few spares, however many
/// connections are open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_hold_no_relay_buffer() {
    const CONNECTIONS: usize = 300;
    // The configured size, so that the buffers counted are the relay's.
    let (_dir, server, port) = start_listener("builtin", "buffer_size = 32768");
    let admin = admin_address(&server.config).unwrap();

    let mut open = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
            .await
            .unwrap();
        // A response larger than a buffer: relayed in several reads and writes.
        let body = http_get(&mut client, "/bytes/100000").await.unwrap();
        assert_eq!(body.len(), 100_000);
        open.push(client);
    }
    // Each connection has had a buffer each way; now at most the spares are left, which
    // a worker keeps a handful of (8; the test allows for 2 workers' worth).
    let buffers = metric(admin, "tlsterm_relay_buffers", "");
    assert!(
        (1.0..=16.0).contains(&buffers),
        "{buffers} relay buffers allocated with {CONNECTIONS} idle connections"
    );
    // The idle connections still relay.
    for client in open.iter_mut().step_by(37) {
        let body = http_get(client, "/bytes/5").await.unwrap();
        assert_eq!(body.len(), 5);
    }
}

/// A TLS 1.3 KeyUpdate after the handshake (the server has freed its handshake settings
/// by then): the client asks for one and gets one back, and bytes flow on both ways with
/// the new keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_update_after_the_handshake() {
    let backend = RawBackend::bind().await;
    let (_dir, _server, port) = start_listener(&backend.address.to_string(), "");

    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    client.write_all(b"before").await.unwrap();
    let mut upstream = backend.accept().await;
    let mut got = [0u8; 6];
    upstream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"before");

    // SAFETY: the connection is valid and established; the call queues a KeyUpdate
    // message, sent with the next write.
    let queued = unsafe {
        boring_sys::SSL_key_update(
            foreign_types::ForeignTypeRef::as_ptr(client.ssl()),
            boring_sys::SSL_KEY_UPDATE_REQUESTED,
        )
    };
    assert_eq!(queued, 1, "KeyUpdate queued");
    client.write_all(b"after").await.unwrap();
    let mut got = [0u8; 5];
    upstream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"after");
    // The server answers the request with a KeyUpdate of its own before these bytes.
    upstream.write_all(b"reply").await.unwrap();
    let mut got = [0u8; 5];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"reply");
}

/// A backend on a unix-domain socket (`unix:/path`): the PROXY header and the bytes reach
/// it, its reply and its EOF reach the client, and the client's EOF reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_backend_with_a_proxy_header_and_half_closes() {
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("backend.sock");
    let backend = tokio::net::UnixListener::bind(&path).unwrap();
    let (_dir, _server, port) = start_listener(
        &format!("unix:{}", path.display()),
        "proxy_protocol = \"v1\"",
    );

    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    let client_port = client.get_ref().local_addr().unwrap().port();
    client.write_all(b"hello").await.unwrap();
    let (mut upstream, _) = tokio::time::timeout(DEADLINE, backend.accept())
        .await
        .expect("tlsterm connects to the unix socket")
        .unwrap();
    let header = format!("PROXY TCP4 127.0.0.1 127.0.0.1 {client_port} {port}\r\n");
    let mut received = vec![0u8; header.len() + 5];
    upstream.read_exact(&mut received).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&received), format!("{header}hello"));

    upstream.write_all(b"world").await.unwrap();
    upstream.shutdown().await.unwrap();
    let mut reply = Vec::new();
    client.read_to_end(&mut reply).await.unwrap(); // ends only if the EOF was passed on
    assert_eq!(reply, b"world");
    client.write_all(b"late").await.unwrap();
    client.shutdown().await.unwrap();
    let mut late = Vec::new();
    upstream.read_to_end(&mut late).await.unwrap();
    assert_eq!(late, b"late");
}

/// A unix socket nobody listens on costs its client a clean close, as a refusing TCP
/// backend does; once a backend listens there, the next client reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_backend_that_appears_later() {
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("later.sock");
    let (_dir, _server, port) = start_listener(&format!("unix:{}", path.display()), "");

    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    let mut rest = Vec::new();
    // tlsterm closes the connection when no backend answers (after the handshake).
    let _ = client.read_to_end(&mut rest).await;
    assert!(rest.is_empty());

    let backend = tokio::net::UnixListener::bind(&path).unwrap();
    let mut client = tls_connect(port, "localhost", SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    client.write_all(b"now").await.unwrap();
    let (mut upstream, _) = tokio::time::timeout(DEADLINE, backend.accept())
        .await
        .expect("tlsterm connects to the unix socket")
        .unwrap();
    let mut got = [0u8; 3];
    upstream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"now");
}
