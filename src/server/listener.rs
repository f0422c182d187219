//! A configured listener and its sockets: one SO_REUSEPORT socket per worker, so the
//! kernel spreads connections over the workers.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use super::state::ListenerState;
use super::worker;
use crate::config::ListenerConfig;

/// One configured listener: its state, replaced on reload, and whether it was removed
/// from the configuration (its accept loops then end).
pub struct Listener {
    pub address: SocketAddr,
    /// Its per-worker connection limit, fixed when it opened.
    pub max_connections: usize,
    pub state: ArcSwap<ListenerState>,
    pub closed: watch::Sender<bool>,
}

impl Listener {
    pub(super) fn new(state: Arc<ListenerState>) -> Arc<Listener> {
        Arc::new(Listener {
            address: state.config.address(),
            max_connections: state.config.max_connections,
            state: ArcSwap::new(state),
            closed: watch::Sender::new(false),
        })
    }
}

/// A listening socket with SO_REUSEPORT, so every worker can have its own.
pub(super) fn bind_reuseport(address: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    crate::sys::listening_socket(address, true).with_context(|| format!("cannot bind {address}"))
}

/// A worker's sockets of a listener: TCP, and UDP when it answers HTTP/3.
pub(super) struct WorkerSockets {
    tcp: std::net::TcpListener,
    quic: Option<std::net::UdpSocket>,
}

/// One listening socket (and one QUIC socket) for each worker.
pub(super) fn bind_per_worker(
    config: &ListenerConfig,
    workers: usize,
) -> anyhow::Result<Vec<WorkerSockets>> {
    let mut quic = match config.quic_address() {
        Some(address) => crate::quic::bind_per_worker(address, workers)?
            .into_iter()
            .map(Some)
            .collect(),
        None => Vec::new(),
    };
    quic.resize_with(workers, || None);
    (0..workers)
        .zip(quic)
        .map(|(_, quic)| {
            Ok(WorkerSockets {
                tcp: bind_reuseport(config.address())?,
                quic,
            })
        })
        .collect()
}

/// Hands each worker its socket of `listener`; each starts accepting on it.
pub(super) fn open(
    listener: &Arc<Listener>,
    sockets: Vec<WorkerSockets>,
    workers: &[UnboundedSender<worker::Command>],
) {
    for (worker, sockets) in workers.iter().zip(sockets) {
        // A worker that has ended (only while stopping) needs no socket.
        let _ = worker.send(worker::Command::Open {
            listener: listener.clone(),
            socket: sockets.tcp,
            quic: sockets.quic,
        });
    }
}
