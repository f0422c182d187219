//! The built-in HTTP/1.1 responder: the embedded default's backend, and a plain backend
//! for benchmarks (`tlsterm backend --listen ADDR`).
//!
//! `GET /` answers a small page; `GET /bytes/N` answers N bytes. Keep-alive unless the
//! request says `Connection: close` (or is HTTP/1.0 without keep-alive).
//!
//! A listener with `proxy_protocol` opens each backend connection with a PROXY header: the
//! responder strips one (either version) from the start of a connection, so that it
//! answers the same with or without, and closes a connection whose header is malformed.

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};

use super::proxy_protocol::{self, DecodeError};

const MAX_HEADER: usize = 16 * 1024;
const MAX_BODY_BYTES: u64 = 1 << 34;
const PAGE: &[u8] =
    b"<!doctype html>\n<title>tlsterm</title>\n<p>Hello from tlsterm's built-in backend.</p>\n";

/// Serves forever on `listener`.
pub async fn serve(listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    if let Err(err) = handle(stream).await {
                        tracing::debug!(error = %err, "backend connection ended with an error");
                    }
                });
            }
            Err(err) => {
                tracing::warn!(error = %err, "backend accept failed");
                // Usually EMFILE: give connections time to close instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves forever on `address` with `threads` threads (see [`spawn_threaded`]); returns
/// only if setting up fails.
pub fn serve_threaded(address: SocketAddr, threads: usize) -> anyhow::Result<()> {
    let (address, handles) = spawn_threaded(address, threads)?;
    tracing::info!(%address, threads, "backend listening");
    for handle in handles {
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("a backend thread panicked"))??;
    }
    Ok(())
}

/// Starts `threads` threads serving `address`, each with its own SO_REUSEPORT socket and
/// single-threaded runtime, so that the kernel spreads new connections over them: a
/// benchmark's backend accepts a connection per handshake, more than one thread accepting
/// on one socket keeps up with at many workers. One thread's socket is a plain one (no
/// SO_REUSEPORT: no other socket may join it). Returns the address (the port the kernel
/// gave to port 0) and the threads.
pub fn spawn_threaded(
    address: SocketAddr,
    threads: usize,
) -> std::io::Result<(
    SocketAddr,
    Vec<std::thread::JoinHandle<std::io::Result<()>>>,
)> {
    let reuse_port = threads > 1;
    let first = crate::sys::listening_socket(address, reuse_port)?;
    let address = first.local_addr()?;
    let mut sockets = vec![first];
    for _ in 1..threads {
        sockets.push(crate::sys::listening_socket(address, reuse_port)?);
    }
    let handles = sockets
        .into_iter()
        .enumerate()
        .map(|(index, socket)| {
            std::thread::Builder::new()
                .name(format!("backend-{index}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    runtime.block_on(async move {
                        serve(TcpListener::from_std(socket)?).await;
                        Ok(())
                    })
                })
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok((address, handles))
}

/// Serves forever on a unix-domain socket (a backend for `unix:/path` in `backends`).
pub async fn serve_unix(listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(async move {
                    if let Err(err) = handle(stream).await {
                        tracing::debug!(error = %err, "backend connection ended with an error");
                    }
                });
            }
            Err(err) => {
                tracing::warn!(error = %err, "backend accept failed");
                // Usually EMFILE: give connections time to close instead of spinning.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Starts the responder on its own thread on 127.0.0.1 (ephemeral port); returns its address.
pub fn spawn_builtin() -> anyhow::Result<SocketAddr> {
    let (address, _thread) = spawn_threaded(SocketAddr::from(([127, 0, 0, 1], 0)), 1)?;
    Ok(address)
}

struct Request {
    path: String,
    keep_alive: bool,
    body_length: u64,
}

fn parse_request(head: &[u8]) -> Option<Request> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut parts = lines.next()?.split(' ');
    let (_method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    let mut keep_alive = version == "HTTP/1.1";
    let mut body_length = 0;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                keep_alive = false;
            } else if value.eq_ignore_ascii_case("keep-alive") {
                keep_alive = true;
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            body_length = value.parse().ok()?;
        }
    }
    Some(Request {
        path: path.to_string(),
        keep_alive,
        body_length,
    })
}

/// Reads a PROXY header, if the connection starts with one, and drops it from `buffer`;
/// false when the connection ended first. A malformed header is an error.
async fn skip_proxy_header(
    stream: &mut (impl AsyncRead + Unpin),
    buffer: &mut Vec<u8>,
) -> std::io::Result<bool> {
    // Until the first bytes tell a header from an HTTP request, more are needed.
    while proxy_protocol::may_be_header(buffer) {
        match proxy_protocol::decode(buffer) {
            Ok((_, used)) => {
                buffer.drain(..used);
                break;
            }
            Err(DecodeError::Incomplete) => {
                let mut chunk = [0u8; 4096];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Ok(false);
                }
                buffer.extend_from_slice(&chunk[..n]);
            }
            Err(DecodeError::Invalid(reason)) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("malformed PROXY header: {reason}"),
                ));
            }
        }
    }
    Ok(true)
}

/// One connection to the built-in backend. Over 80 lines on purpose: the whole HTTP/1.1
/// keep-alive loop (read a head, answer the route, repeat) of a test and demo backend.
async fn handle(mut stream: impl AsyncRead + AsyncWrite + Unpin) -> std::io::Result<()> {
    let mut buffer = Vec::with_capacity(4096);
    let filler = vec![b'x'; 64 * 1024];
    if !skip_proxy_header(&mut stream, &mut buffer).await? {
        return Ok(());
    }
    loop {
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            if buffer.len() > MAX_HEADER {
                stream
                    .write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await?;
                return Ok(());
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        };
        let Some(request) = parse_request(&buffer[..head_end]) else {
            stream
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await?;
            return Ok(());
        };
        buffer.drain(..head_end + 4);
        // Discard a request body, if any.
        let mut remaining = request.body_length;
        let buffered = remaining.min(buffer.len() as u64) as usize;
        buffer.drain(..buffered);
        remaining -= buffered as u64;
        while remaining > 0 {
            let mut chunk = [0u8; 4096];
            let n = stream
                .read(&mut chunk[..remaining.min(4096) as usize])
                .await?;
            if n == 0 {
                return Ok(());
            }
            remaining -= n as u64;
        }

        let body_len = match request.path.strip_prefix("/bytes/") {
            Some(n) => match n.parse::<u64>() {
                Ok(n) if n <= MAX_BODY_BYTES => Some(n),
                _ => None,
            },
            None => Some(PAGE.len() as u64),
        };
        let Some(body_len) = body_len else {
            stream
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await?;
            return Ok(());
        };
        let connection = if request.keep_alive {
            "keep-alive"
        } else {
            "close"
        };
        let content_type = if request.path.starts_with("/bytes/") {
            "application/octet-stream"
        } else {
            "text/html"
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\nServer: tlsterm-backend\r\nContent-Type: {content_type}\r\nContent-Length: {body_len}\r\nConnection: {connection}\r\n\r\n"
        );
        if request.path.starts_with("/bytes/") {
            stream.write_all(head.as_bytes()).await?;
            let mut left = body_len;
            while left > 0 {
                let n = left.min(filler.len() as u64) as usize;
                stream.write_all(&filler[..n]).await?;
                left -= n as u64;
            }
        } else {
            let mut response = head.into_bytes();
            response.extend_from_slice(PAGE);
            stream.write_all(&response).await?;
        }
        if !request.keep_alive {
            stream.shutdown().await?;
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    #[test]
    fn parses_keep_alive_and_close() {
        let r = parse_request(b"GET /bytes/10 HTTP/1.1\r\nHost: x\r\nConnection: close").unwrap();
        assert_eq!(r.path, "/bytes/10");
        assert!(!r.keep_alive);
        let r = parse_request(b"GET / HTTP/1.1\r\nHost: x").unwrap();
        assert!(r.keep_alive);
        let r = parse_request(b"GET / HTTP/1.0").unwrap();
        assert!(!r.keep_alive);
        assert!(parse_request(b"\xff\xfe").is_none());
    }

    /// Sends `bytes` in pieces of `piece` bytes, then reads until the responder closes.
    async fn exchange(address: SocketAddr, bytes: &[u8], piece: usize) -> Vec<u8> {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.set_nodelay(true).unwrap();
        for chunk in bytes.chunks(piece) {
            stream.write_all(chunk).await.unwrap();
        }
        let mut response = Vec::new();
        // Closing with request bytes unread may reset the connection: what came before
        // the reset is the answer.
        let _ = stream.read_to_end(&mut response).await;
        response
    }

    /// Every thread's socket is served: the kernel hashes each new connection to one of
    /// them, so a socket nobody accepts on would leave some of these unanswered.
    #[tokio::test]
    async fn threads_answer_connections_spread_over_their_sockets() {
        let (address, _threads) = spawn_threaded("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let request = b"GET /bytes/2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        for _ in 0..30 {
            let answer = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                exchange(address, request, request.len()),
            )
            .await
            .expect("a connection was not answered");
            assert!(answer.ends_with(b"\r\n\r\nxx"), "{answer:?}");
        }
    }

    #[tokio::test]
    async fn strips_a_proxy_header_and_closes_on_a_malformed_one() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(listener));
        let request = b"GET /bytes/3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        let plain = exchange(address, request, request.len()).await;
        assert!(plain.starts_with(b"HTTP/1.1 200 OK\r\n"), "{plain:?}");
        assert!(plain.ends_with(b"\r\n\r\nxxx"), "{plain:?}");

        let client = "192.0.2.1:40000".parse().unwrap();
        let local = "127.0.0.1:443".parse().unwrap();
        let v1 = proxy_protocol::encode_v1(client, local);
        let v2 = proxy_protocol::encode_v2(client, local, &Default::default());
        for header in [v1, v2] {
            let mut bytes = header.clone();
            bytes.extend_from_slice(request);
            // Whole, and a byte at a time: the header may arrive in pieces.
            for piece in [bytes.len(), 1] {
                let answer = exchange(address, &bytes, piece).await;
                assert_eq!(answer, plain, "{header:?} in pieces of {piece}");
            }
        }
        // Malformed headers: that connection closes unanswered.
        let mut unknown_command = proxy_protocol::encode_v2(client, local, &Default::default());
        unknown_command[12] = 0x2f;
        for header in [&b"PROXY TCP4 not-an-address\r\n"[..], &unknown_command] {
            let mut broken = header.to_vec();
            broken.extend_from_slice(request);
            assert_eq!(exchange(address, &broken, broken.len()).await, b"");
        }
        // The responder still answers others.
        assert_eq!(exchange(address, request, request.len()).await, plain);
    }
}
