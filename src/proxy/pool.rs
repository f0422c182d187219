//! A listener's backends: round robin, skipping for a while a backend that refused.
//! A backend is a TCP address, or a unix-domain socket on this host (`unix:/path`), which
//! spares both sides TCP's work for each connection.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// Where a backend listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BackendAddress {
    Tcp(SocketAddr),
    /// A unix-domain stream socket: `unix:/path` in `backends`.
    Unix(PathBuf),
}

impl BackendAddress {
    /// The prefix of a unix-domain socket's path in `backends`.
    pub const UNIX_PREFIX: &'static str = "unix:";

    async fn connect(&self) -> io::Result<BackendStream> {
        match self {
            BackendAddress::Tcp(address) => {
                let stream = TcpStream::connect(address).await?;
                let _ = stream.set_nodelay(true);
                Ok(BackendStream::Tcp(stream))
            }
            BackendAddress::Unix(path) => Ok(BackendStream::Unix(UnixStream::connect(path).await?)),
        }
    }
}

impl From<SocketAddr> for BackendAddress {
    fn from(address: SocketAddr) -> Self {
        BackendAddress::Tcp(address)
    }
}

impl PartialEq<SocketAddr> for BackendAddress {
    fn eq(&self, other: &SocketAddr) -> bool {
        matches!(self, BackendAddress::Tcp(address) if address == other)
    }
}

impl std::fmt::Display for BackendAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendAddress::Tcp(address) => address.fmt(f),
            BackendAddress::Unix(path) => write!(f, "{}{}", Self::UNIX_PREFIX, path.display()),
        }
    }
}

/// A connection to a backend.
#[derive(Debug)]
pub enum BackendStream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl AsyncRead for BackendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            BackendStream::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BackendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BackendStream::Tcp(stream) => Pin::new(stream).poll_write(cx, data),
            BackendStream::Unix(stream) => Pin::new(stream).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BackendStream::Tcp(stream) => Pin::new(stream).poll_write_vectored(cx, data),
            BackendStream::Unix(stream) => Pin::new(stream).poll_write_vectored(cx, data),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            BackendStream::Tcp(stream) => stream.is_write_vectored(),
            BackendStream::Unix(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            BackendStream::Unix(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    /// Sends EOF (a half-close): the other direction goes on.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            BackendStream::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }
}

/// Instants as u64 microseconds since process start, so they fit in an atomic.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn now_micros() -> u64 {
    EPOCH.elapsed().as_micros() as u64
}

struct Backend {
    address: BackendAddress,
    /// Skipped until this time (`now_micros` scale); 0 = healthy.
    down_until: AtomicU64,
}

pub struct BackendPool {
    backends: Vec<Backend>,
    next: AtomicUsize,
    connect_timeout: Duration,
    retry_after: Duration,
    /// How long a worker keeps a pooled (keep-alive) connection to these backends unused.
    keepalive: Duration,
    /// The most pooled connections a worker has open to these backends at once.
    max_connections: Option<usize>,
}

#[derive(Debug)]
pub struct ConnectError {
    pub tried: usize,
    pub last: String,
}

impl std::error::Error for ConnectError {}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no backend reachable ({} tried, last: {})",
            self.tried, self.last
        )
    }
}

impl BackendPool {
    pub fn new(
        addresses: Vec<impl Into<BackendAddress>>,
        connect_timeout: Duration,
        retry_after: Duration,
    ) -> Self {
        BackendPool {
            backends: addresses
                .into_iter()
                .map(|address| Backend {
                    address: address.into(),
                    down_until: AtomicU64::new(0),
                })
                .collect(),
            next: AtomicUsize::new(0),
            connect_timeout,
            retry_after,
            keepalive: crate::config::DEFAULT_BACKEND_KEEPALIVE,
            max_connections: None,
        }
    }

    /// Keeps pooled connections unused for `keepalive` (instead of
    /// [`DEFAULT_BACKEND_KEEPALIVE`](crate::config::DEFAULT_BACKEND_KEEPALIVE)).
    pub fn with_keepalive(self, keepalive: Duration) -> Self {
        BackendPool { keepalive, ..self }
    }

    /// How long a worker keeps a pooled connection to these backends unused.
    pub fn keepalive(&self) -> Duration {
        self.keepalive
    }

    /// Caps the pooled connections a worker opens to these backends (busy or idle);
    /// `None`: no cap.
    pub fn with_max_connections(self, max_connections: Option<usize>) -> Self {
        BackendPool {
            max_connections,
            ..self
        }
    }

    /// The most pooled connections a worker may have open to these backends at once.
    pub fn max_connections(&self) -> Option<usize> {
        self.max_connections
    }

    /// Connects to the next healthy backend, trying the others in turn if it fails, and
    /// then those marked down: the marks are a hint (a backend may have come back before
    /// its mark ends), and refusing without trying would turn a short outage into a
    /// longer one.
    pub async fn connect(&self) -> Result<(BackendStream, &BackendAddress), ConnectError> {
        let count = self.backends.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = now_micros();
        // Those marked down at `now` wait until the others have been tried; `marked` stays
        // unallocated while none is, which is every connection of a healthy pool.
        let mut marked = Vec::new();
        let mut last = String::new();
        let mut tried = 0;
        let (mut next, mut next_marked) = (0, 0);
        loop {
            let backend = if next < count {
                let backend = &self.backends[(start + next) % count];
                next += 1;
                if backend.down_until.load(Ordering::Relaxed) > now {
                    marked.push(backend);
                    continue;
                }
                backend
            } else if let Some(&backend) = marked.get(next_marked) {
                next_marked += 1;
                backend
            } else {
                break;
            };
            tried += 1;
            let attempt = Instant::now();
            let result =
                tokio::time::timeout(self.connect_timeout, backend.address.connect()).await;
            super::metrics::record_backend_connect(attempt.elapsed(), matches!(result, Ok(Ok(_))));
            match result {
                Ok(Ok(stream)) => {
                    backend.down_until.store(0, Ordering::Relaxed);
                    return Ok((stream, &backend.address));
                }
                Ok(Err(err)) => last = format!("{}: {err}", backend.address),
                Err(_) => last = format!("{}: connect timed out", backend.address),
            }
            let until = now_micros() + self.retry_after.as_micros() as u64;
            backend.down_until.store(until, Ordering::Relaxed);
            tracing::warn!(backend = %backend.address, error = %last, "backend unavailable, skipping it for {:?}", self.retry_after);
        }
        Err(ConnectError { tried, last })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend marked down may be back before its mark ends: when the healthy ones fail,
    /// the pool tries it rather than refusing the client.
    #[tokio::test]
    async fn a_marked_backend_is_tried_when_the_healthy_ones_fail() {
        // `a` is bound but not listening (it refuses) until the test makes it listen.
        let a = tokio::net::TcpSocket::new_v4().unwrap();
        a.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (a_address, b_address) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let pool = BackendPool::new(
            vec![a_address, b_address],
            Duration::from_secs(30),
            Duration::from_secs(600),
        );
        // `a` refuses and is marked down for ten minutes; `b` answers.
        let (_stream, reached) = pool.connect().await.expect("b answers");
        assert_eq!(*reached, b_address);
        // Now `a` is back and `b` is gone.
        let a = a.listen(16).unwrap();
        drop(b);
        for _ in 0..2 {
            let (_stream, reached) = pool.connect().await.expect("a is back");
            assert_eq!(*reached, a_address);
            a.accept().await.unwrap();
        }
    }
}
