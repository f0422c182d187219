//! What a listener's QUIC connections are made with: its quiche configuration (over the
//! listener's TLS), its backend pools and its timeouts (the idle timeout is quiche's,
//! in its configuration). Built with the listener's state and
//! replaced whole with it on reload: a new connection takes the current one, an
//! established connection keeps its own.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{ListenerConfig, QuicRetry, SessionConfig};
use crate::proxy::pool::BackendPool;
use crate::session::Sessions;
use crate::tls::{CertifiedKey, ServerTls};

pub struct QuicService {
    /// quiche needs it mutably to make a connection: held only for that.
    config: Mutex<quiche::Config>,
    tls: ServerTls,
    /// As the listener's: by `ServerTls::profile_index`.
    pools: Vec<Arc<BackendPool>>,
    pub(super) backend_timeout: Duration,
    /// The listener's `handshake_timeout`: a connection not established by then is closed.
    pub(super) handshake_timeout: Duration,
    retry: QuicRetry,
    retry_threshold: usize,
    /// Requests carry the verified client certificate as `X-Client-Cert-*` headers.
    pub(super) client_cert_headers: bool,
    /// A log line per request (`[log] requests`).
    pub(super) log_requests: bool,
}

impl QuicService {
    pub fn build(
        listener: &ListenerConfig,
        certs: Vec<CertifiedKey>,
        sessions: &Sessions,
        session_config: &SessionConfig,
        pools: Vec<Arc<BackendPool>>,
        log_requests: bool,
    ) -> anyhow::Result<QuicService> {
        let (config, tls) = super::tls::build(listener, certs, sessions, session_config)?;
        Ok(QuicService {
            config: Mutex::new(config),
            tls,
            pools,
            backend_timeout: listener.quic_backend_timeout,
            handshake_timeout: listener.handshake_timeout,
            retry: listener.quic_retry,
            retry_threshold: *listener.quic_retry_threshold.get_ref(),
            client_cert_headers: listener.quic_client_cert_headers,
            log_requests,
        })
    }

    /// Whether a new connection without a token gets a Retry, with `handshaking`
    /// handshakes in progress on the worker.
    pub(super) fn wants_retry(&self, handshaking: usize) -> bool {
        match self.retry {
            QuicRetry::Always => true,
            QuicRetry::Never => false,
            QuicRetry::Auto => handshaking >= self.retry_threshold,
        }
    }

    /// A server connection for a client's first Initial packet; `original_dcid` when the
    /// client answered a Retry (`scid` is then the ID the Retry gave it), which tells quiche
    /// that the address is validated.
    pub(super) fn accept(
        &self,
        scid: &quiche::ConnectionId<'_>,
        original_dcid: Option<&quiche::ConnectionId<'_>>,
        local: SocketAddr,
        peer: SocketAddr,
    ) -> quiche::Result<quiche::Connection> {
        let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        // The reset token of the ID the handshake uses, in the transport parameters.
        config.set_stateless_reset_token(Some(super::reset::token(scid.as_ref())));
        let mut conn = quiche::accept(scid, original_dcid, local, peer, &mut config)?;
        ServerTls::set_client(AsMut::<boring::ssl::SslRef>::as_mut(&mut conn), peer.ip());
        Ok(conn)
    }

    /// The backends of a connection with this SNI.
    pub(super) fn pool_for(&self, sni: Option<&str>) -> &Arc<BackendPool> {
        &self.pools[self.tls.profile_index(sni)]
    }
}
