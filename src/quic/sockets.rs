//! A listener's QUIC sockets: one UDP socket per worker on the same address
//! (SO_REUSEPORT), and the group's program that hands each datagram to the worker its
//! destination connection ID names (`cid`), so that a connection's packets reach its
//! worker from whatever address the client sends them.

use std::net::SocketAddr;

use anyhow::Context as _;

use super::cid::WORKER_OFFSET;

/// One UDP socket per worker, in worker order (the order the steering program counts).
pub fn bind_per_worker(
    address: SocketAddr,
    workers: usize,
) -> anyhow::Result<Vec<std::net::UdpSocket>> {
    let sockets = (0..workers)
        .map(|_| crate::sys::quic_socket(address))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("cannot bind {address} (UDP, QUIC)"))?;
    if let Some(first) = sockets.first() {
        crate::sys::steer_by_connection_id(first, WORKER_OFFSET as u32, workers as u32)
            .with_context(|| format!("{address} (UDP): cannot attach the reuseport program"))?;
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::Duration;

    use super::*;
    use crate::quic::cid;

    /// A short-header packet (what a connection sends once established) to `dcid`.
    fn short_header(dcid: &[u8]) -> Vec<u8> {
        let mut packet = vec![0x40];
        packet.extend_from_slice(dcid);
        packet.extend_from_slice(&[0u8; 32]);
        packet
    }

    /// Which of `sockets` received the datagram just sent.
    fn receiver(sockets: &[UdpSocket]) -> usize {
        let mut buf = [0u8; 2048];
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            for (index, socket) in sockets.iter().enumerate() {
                if socket.recv_from(&mut buf).is_ok() {
                    return index;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no socket received the datagram"
            );
            std::thread::yield_now();
        }
    }

    /// Datagrams from many source ports (as from a client whose NAT rebinds) all reach
    /// the worker their connection ID names; a client's first packet with a random ID
    /// lands on one worker, the same each time it is sent.
    #[test]
    fn datagrams_reach_the_worker_their_connection_id_names() {
        let sockets = bind_per_worker("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        let address = sockets[0].local_addr().unwrap();
        drop(sockets);
        let sockets = bind_per_worker(address, 3).unwrap();
        for worker in [2, 0, 1, 2] {
            let packet = short_header(&cid::generate(worker));
            for _ in 0..8 {
                let client = UdpSocket::bind("127.0.0.1:0").unwrap();
                client.send_to(&packet, address).unwrap();
                assert_eq!(receiver(&sockets), worker);
            }
        }
        // A long header (an Initial) whose client-chosen DCID names worker 1 modulo 3.
        let mut initial = vec![0xc0, 0, 0, 0, 1, 8, 0, 4];
        initial.extend_from_slice(&[7u8; 6]);
        initial.extend_from_slice(&[0u8; 1200]);
        for _ in 0..4 {
            let client = UdpSocket::bind("127.0.0.1:0").unwrap();
            client.send_to(&initial, address).unwrap();
            assert_eq!(receiver(&sockets), 1);
        }
    }
}
