//! A worker's UDP socket as QUIC uses it, through quinn-udp: several packets to one
//! address leave in one system call (UDP generic segmentation offload: one buffer that the
//! kernel cuts into datagrams of one size), and datagrams the kernel coalesced on the way
//! in (generic receive offload) are cut apart again. Where the kernel has neither,
//! quinn-udp says so (one segment per send, one datagram per receive) and the same calls
//! send and receive single datagrams.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;

use tokio::io::Interest;
use tokio::net::UdpSocket;

use super::metrics;
use super::tls::MAX_DATAGRAM;

/// The most datagrams one send carries: the kernel takes at most 64 KiB per send, which
/// holds 48 of QUIC's datagrams (`tls::MAX_DATAGRAM`).
const MAX_SEGMENTS: usize = 48;
/// The largest datagram size the receive buffer is cut for.
const MAX_RECEIVED_DATAGRAM: usize = 1500;
/// The most messages one receive reads (each one datagram, or several coalesced).
const RECEIVE_BATCH: usize = 16;
/// Send buffers kept for the next connection that sends: as many as connections sending
/// at once, which on one worker's thread is one unless a send waits for the socket.
const SPARE_BUFFERS: usize = 4;

pub(super) struct QuicSocket {
    io: UdpSocket,
    state: quinn_udp::UdpSocketState,
    /// Send buffers between sends: a connection borrows one only while it sends, so an
    /// idle connection holds none.
    spare: RefCell<Vec<Vec<u8>>>,
}

impl QuicSocket {
    /// Takes a bound, non-blocking socket (quinn-udp turns on receive offload where the
    /// kernel has it).
    pub(super) fn new(socket: std::net::UdpSocket) -> io::Result<Self> {
        let state = quinn_udp::UdpSocketState::new((&socket).into())?;
        Ok(QuicSocket {
            io: UdpSocket::from_std(socket)?,
            state,
            spare: RefCell::default(),
        })
    }

    pub(super) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }

    /// How many datagrams one [`send`](Self::send) may carry: 1 where the kernel cannot
    /// segment (or stopped, after a send it refused).
    pub(super) fn max_segments(&self) -> usize {
        self.state.max_gso_segments().clamp(1, MAX_SEGMENTS)
    }

    /// A buffer size that holds what one receive may bring.
    fn receive_buffer_len(&self) -> usize {
        (self.state.gro_segments() * MAX_RECEIVED_DATAGRAM).max(u16::MAX as usize)
    }

    /// Sends one datagram.
    pub(super) async fn send_to(&self, datagram: &[u8], to: SocketAddr) -> io::Result<()> {
        self.send(datagram, datagram.len(), to).await
    }

    /// Sends `contents` to `to` as datagrams of `segment` bytes (the last may be shorter):
    /// at most [`max_segments`](Self::max_segments) of them.
    pub(super) async fn send(
        &self,
        contents: &[u8],
        segment: usize,
        to: SocketAddr,
    ) -> io::Result<()> {
        let transmit = quinn_udp::Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size: (contents.len() > segment).then_some(segment),
            src_ip: None,
        };
        self.io
            .async_io(Interest::WRITABLE, || {
                self.state.try_send((&self.io).into(), &transmit)
            })
            .await
    }

    /// Waits for datagrams and reads into `into` as many messages as have come, up to
    /// [`RECEIVE_BATCH`], in one system call.
    pub(super) async fn recv(&self, into: &mut Inbound) -> io::Result<()> {
        let Inbound {
            buffer,
            message_len,
            meta,
            count,
        } = into;
        // A failed receive leaves no messages behind from the one before.
        *count = 0;
        *count = self
            .io
            .async_io(Interest::READABLE, || {
                let mut messages = buffer.chunks_mut(*message_len);
                let mut slices: [io::IoSliceMut; RECEIVE_BATCH] = std::array::from_fn(|_| {
                    io::IoSliceMut::new(messages.next().expect("room for every message"))
                });
                self.state.recv((&self.io).into(), &mut slices, meta)
            })
            .await?;
        let datagrams = meta[..*count]
            .iter()
            .map(|message| message.len.div_ceil(stride(message)))
            .sum();
        metrics::record_receive(datagrams);
        Ok(())
    }
}

/// Where one receive lands: up to [`RECEIVE_BATCH`] messages, each from one sender and
/// holding one datagram or several the kernel coalesced (one sender, one size but the
/// last). Reading several messages per system call matters under load, when datagrams
/// from many clients wait and a receive per datagram would cost a system call each. One
/// per worker socket: 16 messages of up to 64 coalesced datagrams is 1.5 MiB of address
/// space, of which the kernel writes only what arrives.
pub(super) struct Inbound {
    buffer: Vec<u8>,
    message_len: usize,
    meta: [quinn_udp::RecvMeta; RECEIVE_BATCH],
    count: usize,
}

impl Inbound {
    pub(super) fn new(socket: &QuicSocket) -> Self {
        let message_len = socket.receive_buffer_len();
        Inbound {
            buffer: vec![0u8; message_len * RECEIVE_BATCH],
            message_len,
            meta: [quinn_udp::RecvMeta::default(); RECEIVE_BATCH],
            count: 0,
        }
    }

    /// What the last receive read, message by message: who sent it, and its datagrams
    /// (coalesced ones cut apart).
    pub(super) fn received(
        &mut self,
    ) -> impl Iterator<Item = (SocketAddr, std::slice::ChunksMut<'_, u8>)> {
        self.buffer
            .chunks_mut(self.message_len)
            .zip(&self.meta[..self.count])
            .map(|(message, meta)| (meta.addr, message[..meta.len].chunks_mut(stride(meta))))
    }
}

/// The size of each datagram of a message but the last (quinn-udp gives the whole length
/// for a message of one datagram: 0 for an empty one, which cannot cut a buffer).
fn stride(meta: &quinn_udp::RecvMeta) -> usize {
    meta.stride.max(1)
}

/// Datagrams written one at a time into a send buffer borrowed from the socket, and sent
/// in as few sends as segmentation allows: consecutive datagrams to one address and of one
/// size go together, a shorter one closes the group. [`finish`](Self::finish) sends what
/// is left.
pub(super) struct Outbox<'a> {
    socket: &'a QuicSocket,
    buffer: Vec<u8>,
    /// Bytes of the datagrams not sent yet, at the start of `buffer`.
    filled: usize,
    /// How many they are, each `segment` bytes (the last may be shorter), all to `to`.
    count: usize,
    segment: usize,
    to: Option<SocketAddr>,
    /// System calls made so far.
    sends: usize,
}

impl<'a> Outbox<'a> {
    pub(super) fn new(socket: &'a QuicSocket) -> Self {
        let buffer = socket
            .spare
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| vec![0u8; MAX_SEGMENTS * MAX_DATAGRAM]);
        Outbox {
            socket,
            buffer,
            filled: 0,
            count: 0,
            segment: 0,
            to: None,
            sends: 0,
        }
    }

    /// Where the next datagram is written (room for `MAX_DATAGRAM` bytes).
    pub(super) fn room(&mut self) -> &mut [u8] {
        &mut self.buffer[self.filled..self.filled + MAX_DATAGRAM]
    }

    /// Takes the `len` bytes just written into [`room`](Self::room) as a datagram to `to`;
    /// sends the datagrams before it when it cannot join them, and the group when it is
    /// full or this one closes it.
    pub(super) async fn push(&mut self, len: usize, to: SocketAddr) {
        if self.count > 0 && (self.to != Some(to) || len > self.segment) {
            let pending = self.filled;
            self.send_pending().await;
            self.buffer.copy_within(pending..pending + len, 0);
        }
        if self.count == 0 {
            self.segment = len;
            self.to = Some(to);
        }
        self.filled += len;
        self.count += 1;
        if len < self.segment || self.count >= self.socket.max_segments() {
            self.send_pending().await;
        }
    }

    /// Sends what is still pending; returns how many sends (system calls) it took to
    /// send everything pushed.
    pub(super) async fn finish(mut self) -> usize {
        self.send_pending().await;
        self.sends
    }

    async fn send_pending(&mut self) {
        if let (Some(to), true) = (self.to, self.count > 0) {
            let contents = &self.buffer[..self.filled];
            self.sends += 1;
            match self.socket.send(contents, self.segment, to).await {
                Ok(()) => metrics::record_send(self.count),
                Err(err) => {
                    tracing::debug!(error = %err, %to, datagrams = self.count, "UDP send failed")
                }
            }
        }
        self.filled = 0;
        self.count = 0;
    }
}

impl Drop for Outbox<'_> {
    fn drop(&mut self) {
        let mut spare = self.socket.spare.borrow_mut();
        if spare.len() < SPARE_BUFFERS {
            spare.push(std::mem::take(&mut self.buffer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind() -> QuicSocket {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_nonblocking(true).unwrap();
        QuicSocket::new(socket).unwrap()
    }

    /// The next `count` datagrams `socket` receives, cut apart where the kernel
    /// coalesced them.
    async fn receive(socket: &QuicSocket, count: usize) -> Vec<Vec<u8>> {
        let mut datagrams = Vec::new();
        let mut inbound = Inbound::new(socket);
        while datagrams.len() < count {
            socket.recv(&mut inbound).await.unwrap();
            for (_, message) in inbound.received() {
                datagrams.extend(message.map(|datagram| datagram.to_vec()));
            }
        }
        datagrams
    }

    /// Datagrams from more senders than one receive reads, all waiting at once, come out
    /// each with its own sender and contents, in the order they were sent.
    #[tokio::test]
    async fn datagrams_waiting_from_several_senders_keep_their_sender() {
        let receiver = bind();
        let to = receiver.local_addr().unwrap();
        let senders: Vec<QuicSocket> = (0..RECEIVE_BATCH + 3).map(|_| bind()).collect();
        let expected: Vec<(SocketAddr, Vec<u8>)> = senders
            .iter()
            .enumerate()
            .map(|(index, sender)| (sender.local_addr().unwrap(), vec![index as u8; 50 + index]))
            .collect();
        for (sender, (_, datagram)) in senders.iter().zip(&expected) {
            sender.send_to(datagram, to).await.unwrap();
        }

        let mut inbound = Inbound::new(&receiver);
        let mut seen = Vec::new();
        while seen.len() < expected.len() {
            receiver.recv(&mut inbound).await.unwrap();
            for (from, datagrams) in inbound.received() {
                seen.extend(datagrams.map(|datagram| (from, datagram.to_vec())));
            }
        }
        assert_eq!(seen, expected);
    }

    /// Datagrams to one address and of one size leave in one send; a shorter one closes
    /// the group; another address or a longer one starts a new group. Each arrives whole,
    /// in order, where it was sent.
    #[tokio::test]
    async fn an_outbox_groups_datagrams_by_address_and_size() {
        let (sender, a, b) = (bind(), bind(), bind());
        let plan = [
            (100, &a),
            (100, &a),
            (100, &a),
            (60, &a),
            (100, &a),
            (100, &b),
            (100, &b),
            (120, &b),
            (50, &a),
        ];
        let mut outbox = Outbox::new(&sender);
        for (index, (len, to)) in plan.iter().enumerate() {
            outbox.room()[..*len].fill(index as u8);
            outbox.push(*len, to.local_addr().unwrap()).await;
        }
        let sends = outbox.finish().await;
        let groups = if sender.max_segments() > 1 {
            5
        } else {
            plan.len()
        };
        assert_eq!(sends, groups, "sends for {} datagrams", plan.len());

        for socket in [&a, &b] {
            let expected: Vec<Vec<u8>> = plan
                .iter()
                .enumerate()
                .filter(|(_, (_, to))| std::ptr::eq(*to, socket))
                .map(|(index, (len, _))| vec![index as u8; *len])
                .collect();
            assert_eq!(receive(socket, expected.len()).await, expected);
        }
        // The buffer went back to the socket for the next sender.
        assert_eq!(sender.spare.borrow().len(), 1);
    }

    /// Datagrams that leave in one segmented send arrive one by one, each as long as its
    /// segment, in order; and a receive of datagrams cut by stride gives them back.
    #[tokio::test]
    async fn a_segmented_send_arrives_as_separate_datagrams() {
        let (sender, receiver) = (bind(), bind());
        let to = receiver.local_addr().unwrap();
        let segments = sender.max_segments().min(5);
        if segments == 1 {
            eprintln!("skipped: this kernel has no UDP segmentation offload");
            return;
        }
        // Segments of 100 bytes, the last one shorter, each filled with its index.
        let mut contents = Vec::new();
        for index in 0..segments {
            let len = if index + 1 == segments { 40 } else { 100 };
            contents.extend(std::iter::repeat_n(index as u8, len));
        }
        sender.send(&contents, 100, to).await.unwrap();

        let datagrams = receive(&receiver, segments).await;
        assert_eq!(datagrams.len(), segments);
        for (index, datagram) in datagrams.iter().enumerate() {
            let len = if index + 1 == segments { 40 } else { 100 };
            assert_eq!(datagram, &vec![index as u8; len], "datagram {index}");
        }
    }
}
