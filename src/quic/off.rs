//! HTTP/3 in a build without the `http3` feature: the entry points the server calls, which
//! serve nothing. The configuration already refuses `quic = true` in such a build (with
//! its file, line and key); these refuse it again should a listener ask all the same.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{watch, Semaphore};

use crate::config::{ListenerConfig, SessionConfig};
use crate::proxy::pool::BackendPool;
use crate::session::Sessions;
use crate::tls::CertifiedKey;

const NO_HTTP3: &str = "this build has no HTTP/3 (feature `http3`): remove `quic = true`";

/// Never built in this build.
pub struct QuicService {
    _never: std::convert::Infallible,
}

impl QuicService {
    /// Refuses: this build cannot serve QUIC.
    pub fn build(
        _listener: &ListenerConfig,
        _certs: Vec<CertifiedKey>,
        _sessions: &Sessions,
        _session_config: &SessionConfig,
        _pools: Vec<Arc<BackendPool>>,
        _log_requests: bool,
    ) -> anyhow::Result<QuicService> {
        anyhow::bail!(NO_HTTP3)
    }
}

/// Refuses: this build opens no UDP sockets.
pub fn bind_per_worker(
    _address: SocketAddr,
    _workers: usize,
) -> anyhow::Result<Vec<std::net::UdpSocket>> {
    anyhow::bail!(NO_HTTP3)
}

/// What the worker would give its endpoint of a listener.
pub struct Endpoint<S> {
    pub worker: usize,
    pub socket: std::net::UdpSocket,
    pub current: S,
    pub limit: Arc<Semaphore>,
    pub process_limit: Arc<Semaphore>,
    pub stop: watch::Receiver<bool>,
}

/// Returns at once: there is never a socket to serve in this build.
pub async fn serve<S>(_endpoint: Endpoint<S>)
where
    S: Fn() -> Option<Arc<QuicService>>,
{
}

/// No QUIC series in this build.
pub mod metrics {
    /// Nothing to register.
    pub fn register() {}
}
