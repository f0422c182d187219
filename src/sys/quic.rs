//! The QUIC endpoint's system calls: its per-worker UDP sockets, the reuseport program
//! that steers each datagram to its connection's worker, and the TLS context handed to
//! quiche.

use boring::ssl::{SslContextBuilder, SslContextRef};
use foreign_types::ForeignTypeRef;

/// A builder over an already built context, holding a reference of its own: quiche takes
/// its TLS context as a builder, and makes each connection from the context it builds.
pub fn builder_sharing(context: &SslContextRef) -> SslContextBuilder {
    // SAFETY: `context` is a live SSL_CTX for the duration of the borrow; SSL_CTX_up_ref
    // gives the builder a reference of its own, which it releases when dropped (or hands on
    // when built), so the context outlives both owners.
    unsafe {
        boring_sys::SSL_CTX_up_ref(context.as_ptr());
        SslContextBuilder::from_ptr(context.as_ptr())
    }
}

/// A non-blocking UDP socket with SO_REUSEPORT, so that every worker has its own socket of
/// the address, and receive and send buffers large enough for a burst of handshakes.
pub fn quic_socket(address: std::net::SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(address),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    socket.bind(&address.into())?;
    Ok(socket.into())
}

const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

/// The classic BPF program of a QUIC socket group: it returns the index of the socket (in
/// binding order: the worker's) that the 16-bit big-endian number at `worker_at` in the
/// packet's destination connection ID names, modulo `workers`. A short-header packet's
/// DCID starts at byte 1; a long-header packet's at byte 6, after its length at byte 5.
/// A long header whose DCID is too short to hold the number returns an index past the
/// group, so the kernel picks a socket by its own hash of the addresses.
pub fn steering_program(worker_at: u32, workers: u32) -> [libc::sock_filter; 10] {
    use libc::{
        BPF_A, BPF_ABS, BPF_ALU, BPF_B, BPF_H, BPF_JA, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K, BPF_LD,
        BPF_MOD, BPF_RET,
    };
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    [
        /* 0 */ op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 0),
        // The header form bit: long (1) or short (0, to 6).
        /* 1 */
        op(BPF_JMP | BPF_JSET | BPF_K, 0, 4, 0x80),
        /* 2 */ op(BPF_LD | BPF_B | BPF_ABS, 0, 0, 5),
        // DCID long enough to hold the number, or the kernel's hash (9).
        /* 3 */
        op(BPF_JMP | BPF_JGE | BPF_K, 0, 5, worker_at + 2),
        /* 4 */ op(BPF_LD | BPF_H | BPF_ABS, 0, 0, 6 + worker_at),
        /* 5 */ op(BPF_JMP | BPF_JA, 0, 0, 1),
        /* 6 */ op(BPF_LD | BPF_H | BPF_ABS, 0, 0, 1 + worker_at),
        /* 7 */ op(BPF_ALU | BPF_MOD | BPF_K, 0, 0, workers),
        /* 8 */ op(BPF_RET | BPF_A, 0, 0, 0),
        /* 9 */ op(BPF_RET | BPF_K, 0, 0, u32::MAX),
    ]
}

/// Attaches the steering program to the reuseport group `socket` belongs to (one socket
/// per worker, bound in worker order): see [`steering_program`]. Packets that fall outside
/// the program's reach (too short to read) go to the first worker.
pub fn steer_by_connection_id(
    socket: &std::net::UdpSocket,
    worker_at: u32,
    workers: u32,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if workers == 0 {
        return Err(std::io::Error::other("no worker to steer packets to"));
    }
    let program = steering_program(worker_at, workers);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `program`, which lives until the call returns; the kernel
    // copies and checks the program (refusing an invalid one) before setsockopt returns.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
