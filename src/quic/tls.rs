//! The listener's TLS for QUIC: the same `ServerTls` as TCP (certificates, selection by
//! SNI, per-name settings, client certificates, the asynchronous private-key method),
//! built from the listener's settings with what QUIC requires, and handed to quiche.

use crate::config::{ListenerConfig, SessionConfig, TlsVersion};
use crate::session::Sessions;
use crate::tls::{CertifiedKey, ServerTls};

/// HTTP/3's ALPN identifier, the only protocol a QUIC listener speaks.
pub(super) const H3: &[u8] = b"h3";

/// The listener's settings as QUIC sees them: ALPN `h3` on every name (a TCP listener's
/// `h2`/`http/1.1` mean nothing over QUIC) and TLS 1.3 only. `early_data` applies as on
/// TCP (the same anti-replay check in the certificate-selection callback); what early
/// data may reach the backend is the connection's rule (see `request::forward`).
fn quic_settings(listener: &ListenerConfig) -> ListenerConfig {
    let mut quic = listener.clone();
    quic.alpn = vec![String::from_utf8_lossy(H3).into_owned()];
    quic.min_version = TlsVersion::Tls13;
    for name in &mut quic.server_names {
        if name.alpn.is_some() {
            name.alpn = Some(quic.alpn.clone());
        }
        name.min_version = None;
    }
    quic
}

/// Builds the listener's QUIC TLS and a quiche configuration over it. The `ServerTls` is
/// returned too: its profiles say which `[[listener.server_name]]` a connection follows.
pub(super) fn build(
    listener: &ListenerConfig,
    certs: Vec<CertifiedKey>,
    sessions: &Sessions,
    session_config: &SessionConfig,
) -> anyhow::Result<(quiche::Config, ServerTls)> {
    let tls = ServerTls::build(&quic_settings(listener), certs, sessions, session_config)?;
    // quiche creates each connection from this context (and sets its own session and ALPN
    // callbacks on it): a context of its own, never the TCP listener's.
    let builder = crate::sys::builder_sharing(tls.base_context());
    let mut config =
        quiche::Config::with_boring_ssl_ctx_builder(quiche::PROTOCOL_VERSION, builder)?;
    config.set_application_protos(&[H3])?;
    config.set_max_idle_timeout(listener.quic_idle_timeout.as_millis() as u64);
    config.set_max_recv_udp_payload_size(MAX_DATAGRAM);
    config.set_max_send_udp_payload_size(MAX_DATAGRAM);
    config.set_initial_max_data(CONNECTION_WINDOW);
    config.set_initial_max_stream_data_bidi_remote(STREAM_WINDOW);
    config.set_initial_max_stream_data_bidi_local(STREAM_WINDOW);
    config.set_initial_max_stream_data_uni(STREAM_WINDOW);
    config.set_initial_max_streams_bidi(MAX_STREAMS);
    config.set_initial_max_streams_uni(MAX_UNI_STREAMS);
    // Connection IDs are issued by the endpoint (they name the worker); a client may move
    // to another address with the one it has or with a spare one.
    config.set_disable_active_migration(false);
    config.set_active_connection_id_limit(ACTIVE_CONNECTION_IDS);
    Ok((config, tls))
}

/// Connection IDs each side keeps for the other: the one in use and spares for moving to
/// another address or network (with an ID an observer cannot link to the old one). Each is
/// a route in the worker's table while the connection lives.
const ACTIVE_CONNECTION_IDS: u64 = 4;
/// UDP payloads sent and accepted: what fits an Ethernet path with IPv6 and no tunnel.
pub(super) const MAX_DATAGRAM: usize = 1350;
/// Flow-control windows: bodies move in windows of this size, never whole.
const CONNECTION_WINDOW: u64 = 16 * 1024 * 1024;
const STREAM_WINDOW: u64 = 1024 * 1024;
/// Requests open at once on one connection.
const MAX_STREAMS: u64 = 128;
/// HTTP/3's control and QPACK streams, with room for a client's extras.
const MAX_UNI_STREAMS: u64 = 8;
