//! A listener's backends: round robin, skipping for a while a backend that refused.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// Instants as u64 microseconds since process start, so they fit in an atomic.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn now_micros() -> u64 {
    EPOCH.elapsed().as_micros() as u64
}

struct Backend {
    address: SocketAddr,
    /// Skipped until this time (`now_micros` scale); 0 = healthy.
    down_until: AtomicU64,
}

pub struct BackendPool {
    backends: Vec<Backend>,
    next: AtomicUsize,
    connect_timeout: Duration,
    retry_after: Duration,
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
        addresses: Vec<SocketAddr>,
        connect_timeout: Duration,
        retry_after: Duration,
    ) -> Self {
        BackendPool {
            backends: addresses
                .into_iter()
                .map(|address| Backend {
                    address,
                    down_until: AtomicU64::new(0),
                })
                .collect(),
            next: AtomicUsize::new(0),
            connect_timeout,
            retry_after,
        }
    }

    /// Connects to the next healthy backend, trying the others in turn if it fails.
    /// When every backend is marked down they are all tried anyway: the marks are a
    /// hint, and refusing without trying would turn a short outage into a longer one.
    pub async fn connect(&self) -> Result<(TcpStream, SocketAddr), ConnectError> {
        let count = self.backends.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = now_micros();
        let order = (0..count).map(|i| &self.backends[(start + i) % count]);
        let healthy: Vec<&Backend> = order
            .clone()
            .filter(|b| b.down_until.load(Ordering::Relaxed) <= now)
            .collect();
        let candidates = if healthy.is_empty() {
            order.collect()
        } else {
            healthy
        };
        let mut last = String::new();
        for backend in &candidates {
            let attempt = Instant::now();
            let result =
                tokio::time::timeout(self.connect_timeout, TcpStream::connect(backend.address))
                    .await;
            super::metrics::record_backend_connect(attempt.elapsed(), matches!(result, Ok(Ok(_))));
            match result {
                Ok(Ok(stream)) => {
                    backend.down_until.store(0, Ordering::Relaxed);
                    let _ = stream.set_nodelay(true);
                    return Ok((stream, backend.address));
                }
                Ok(Err(err)) => last = format!("{}: {err}", backend.address),
                Err(_) => last = format!("{}: connect timed out", backend.address),
            }
            let until = now_micros() + self.retry_after.as_micros() as u64;
            backend.down_until.store(until, Ordering::Relaxed);
            tracing::warn!(backend = %backend.address, error = %last, "backend unavailable, skipping it for {:?}", self.retry_after);
        }
        Err(ConnectError {
            tried: candidates.len(),
            last,
        })
    }
}
