//! A listener's QUIC sockets: one UDP socket per worker on the same address
//! (SO_REUSEPORT).

use std::net::SocketAddr;

use anyhow::Context as _;

/// One UDP socket per worker, in worker order.
pub fn bind_per_worker(
    address: SocketAddr,
    workers: usize,
) -> anyhow::Result<Vec<std::net::UdpSocket>> {
    (0..workers)
        .map(|_| crate::sys::quic_socket(address))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("cannot bind {address} (UDP, QUIC)"))
}
