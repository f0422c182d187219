//! The QUIC endpoint's system calls: its per-worker UDP sockets, and the TLS context
//! handed to quiche.

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
