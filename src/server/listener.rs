//! A configured listener and its sockets: one SO_REUSEPORT socket per worker, so the
//! kernel spreads connections over the workers, or one socket all workers wait on
//! (`accept = "shared"`).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use super::state::ListenerState;
use super::worker;
use crate::config::{AcceptMode, ListenerConfig};

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

impl WorkerSockets {
    /// The TCP address the socket is bound to (the port the kernel gave to port 0).
    pub(super) fn address(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// Each worker's sockets of a listener: its own TCP socket or a handle on the one they
/// share (`mode`), and its own QUIC socket when the listener answers HTTP/3.
pub(super) fn bind_per_worker(
    config: &ListenerConfig,
    workers: usize,
    mode: AcceptMode,
) -> anyhow::Result<Vec<WorkerSockets>> {
    let mut quic = match config.quic_address() {
        Some(address) => crate::quic::bind_per_worker(address, workers)?
            .into_iter()
            .map(Some)
            .collect(),
        None => Vec::new(),
    };
    quic.resize_with(workers, || None);
    let tcp = bind_tcp(config.address(), workers, mode)?;
    Ok(tcp
        .into_iter()
        .zip(quic)
        .map(|(tcp, quic)| WorkerSockets { tcp, quic })
        .collect())
}

/// One TCP listening socket for each worker: its own, or a handle on the one they share.
fn bind_tcp(
    address: SocketAddr,
    workers: usize,
    mode: AcceptMode,
) -> anyhow::Result<Vec<std::net::TcpListener>> {
    match mode {
        AcceptMode::PerWorker => {
            // The others take the first one's port: on port 0 the kernel picks one for all.
            let first = bind_reuseport(address)?;
            let address = first.local_addr().context("a bound socket's address")?;
            let mut sockets = vec![first];
            for _ in 1..workers {
                sockets.push(bind_reuseport(address)?);
            }
            Ok(sockets)
        }
        AcceptMode::Shared => {
            let socket = bind_reuseport(address)?;
            let mut sockets = (1..workers)
                .map(|_| {
                    socket
                        .try_clone()
                        .context("cannot share a listening socket")
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            sockets.push(socket);
            Ok(sockets)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared mode hands every worker the same socket: a connection waiting on it can
    /// be taken through any worker's handle.
    #[test]
    fn shared_sockets_are_one_socket() {
        let sockets = bind_tcp("127.0.0.1:0".parse().unwrap(), 3, AcceptMode::Shared).unwrap();
        assert_eq!(sockets.len(), 3);
        let address = sockets[0].local_addr().unwrap();
        assert!(sockets.iter().all(|s| s.local_addr().unwrap() == address));
        let _client = std::net::TcpStream::connect(address).unwrap();
        // Blocking mode belongs to the socket, not to a handle: all handles block now.
        sockets[0].set_nonblocking(false).unwrap();
        let (_accepted, peer) = sockets[2].accept().unwrap();
        assert_eq!(peer.ip(), address.ip());
    }

    /// On port 0 the per-worker sockets share the one port the kernel gave the first.
    #[test]
    fn port_zero_gives_every_worker_one_port() {
        let sockets = bind_tcp("127.0.0.1:0".parse().unwrap(), 3, AcceptMode::PerWorker).unwrap();
        let address = sockets[0].local_addr().unwrap();
        assert_ne!(address.port(), 0);
        assert!(sockets.iter().all(|s| s.local_addr().unwrap() == address));
    }

    /// The per-worker mode binds one socket per worker, all on the same port.
    #[test]
    fn per_worker_sockets_share_the_port() {
        let first = bind_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = first.local_addr().unwrap();
        let sockets = bind_tcp(address, 2, AcceptMode::PerWorker).unwrap();
        assert!(sockets.iter().all(|s| s.local_addr().unwrap() == address));
    }
}
