//! HTTP/3: a QUIC endpoint per worker and listener (`quic = true`), whose requests go to
//! the listener's backends as HTTP/1.1.
//!
//! QUIC is quiche's, over the same BoringSSL as the TCP path: the listener's TLS is built
//! by `tls::ServerTls` (certificates, selection by SNI, per-name settings, client
//! certificates, the asynchronous private-key method that queues signatures for the
//! worker's engine) with ALPN `h3`, and handed to quiche. Each worker has its own UDP
//! socket of the address (SO_REUSEPORT); the connection IDs it issues name the worker, and
//! the socket group's reuseport program sends a packet to the worker its destination
//! connection ID names, so a connection stays on its worker when the client's address
//! changes. One task per connection runs quiche; one task per request stream talks
//! HTTP/1.1 to a backend, with bodies streamed both ways under QUIC's flow control.
//! Under load (or always, by `quic_retry`) a new connection first gets a stateless Retry
//! whose token (`token`) proves the client's address before a handshake is spent on it.
//! Each connection ID comes with a stateless reset token (`reset`), so a client whose
//! connection tlsterm no longer has learns it from its next packet.

// `cid`, `packet`, `reset` and `token` are public for the fuzz target of the packet path
// (fuzz/fuzz_targets/quic_packet.rs), which feeds them what the endpoint reads first.
pub mod cid;
mod connection;
mod endpoint;
mod headers;
mod inbox;
pub mod metrics;
pub mod packet;
mod request;
mod request_body;
pub mod reset;
mod service;
mod sockets;
mod tls;
pub mod token;
mod udp;

pub use endpoint::{serve, Endpoint};
pub use service::QuicService;
pub use sockets::bind_per_worker;
