//! One client connection: TLS handshake, then backend connection, PROXY header and relay,
//! or (`mode = "http"`) its requests forwarded over pooled backend connections.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio_boring::{HandshakeError, SslStream, SslStreamBuilder};

use super::read_ahead::ReadAhead;

use super::failure::{FailureFacts, HandshakeFailure};
use super::metrics;
use super::ListenerState;
use crate::config::{ListenerMode, ProxyProtocol};
use crate::offload::HandshakeGuard;
use crate::proxy::client_cert;
use crate::proxy::forwarding::ClientAddress;
use crate::proxy::pool::BackendStream;
use crate::proxy::proxy_protocol;
use crate::proxy::relay::{self, RelayEnd, RelayOutcome};
use crate::tls::early_data::EarlyDataGate;
use crate::tls::Negotiated;

/// A finished handshake: the TLS stream, or why there is none.
type TlsResult = Result<SslStream<ReadAhead<TcpStream>>, HandshakeError<ReadAhead<TcpStream>>>;

/// Adds up the time spent inside the wrapped future's `poll`: for a handshake, the time
/// inside BoringSSL (including its socket reads and writes), not the time waiting.
struct PollTimer<F> {
    inner: F,
    busy: Duration,
}

impl<F: std::future::Future + Unpin> std::future::Future for PollTimer<F> {
    type Output = (F::Output, Duration);

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let start = Instant::now();
        let result = std::pin::Pin::new(&mut self.inner).poll(cx);
        self.busy += start.elapsed();
        result.map(|output| (output, self.busy))
    }
}

/// Why a connection ended, for the log line.
#[derive(Debug, Clone, Copy)]
enum CloseReason {
    HandshakeTimeout,
    HandshakeFailed,
    /// An ACME CA's TLS-ALPN-01 validation: answered by the handshake alone.
    AcmeValidation,
    BackendUnavailable,
    Relayed(RelayEnd),
}

impl CloseReason {
    fn label(self) -> &'static str {
        match self {
            CloseReason::HandshakeTimeout => "handshake_timeout",
            CloseReason::HandshakeFailed => "handshake_failed",
            CloseReason::AcmeValidation => "acme_validation",
            CloseReason::BackendUnavailable => "backend_unavailable",
            CloseReason::Relayed(end) => end.label(),
        }
    }
}

/// One client connection, from accept to close: the handshake, the backend, the relay,
/// and the counters and log line of how it ended. `permits` (the listener's and the
/// process's connection limits) are held until it closes; `stop` turns true when the
/// process drains: forwarded HTTP requests then end the connection once answered (a relay
/// cannot tell where a request ends, so it goes on until its client or backend closes).
///
/// Its task holds this future from accept to close, sized for its largest state, so that
/// state is kept small: the handshake, the HTTP server, the backend connect and the relay
/// are each boxed for as long as they run (an idle `mode = "http"` connection then holds
/// no room for a relay, a relayed one none for the HTTP server, and neither any for the
/// handshake), and it is an `async` block rather than an `async fn` (whose arguments the
/// compiler stores twice: 56 bytes more per connection).
#[allow(clippy::manual_async_fn)]
pub fn handle(
    stream: TcpStream,
    client: SocketAddr,
    state: Arc<ListenerState>,
    log: Logging,
    stop: tokio::sync::watch::Receiver<bool>,
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
) -> impl std::future::Future<Output = ()> {
    // Made here rather than in the block: the block then keeps the permits once, not also
    // their moved-out room.
    let open = Open::new(state, permits);
    // Counted as a handshake in progress from its accept, not from the task's first poll:
    // a worker accepts the connections waiting in its backlog before their tasks run, and
    // the first of them to queue its key share would otherwise find itself the only
    // handshake in progress and have it computed alone.
    let in_progress = HandshakeGuard::enter();
    async move {
        let state = &open.state;
        let started = Instant::now();
        let handshake = handshake(stream, client, state, log.connections, started, in_progress);
        let Some(Established {
            mut tls,
            negotiated,
            end,
            local,
        }) = Box::pin(handshake).await
        else {
            return;
        };

        if *state.config.mode.get_ref() == ListenerMode::Http {
            let serving = serve_http(tls, &negotiated, state, client, started, log.requests, stop);
            let outcome = serving.await;
            return end.after_relay(&negotiated, outcome);
        }

        let connect = connect_backend(state, client, local, &negotiated, &mut tls, &end);
        let Some(mut backend) = Box::pin(connect).await else {
            return;
        };
        // How much a direction may have in flight, and how long nothing may move.
        let (buffer, idle) = (state.config.buffer_size, state.config.idle_timeout);
        let outcome = if negotiated.early_data {
            let mut gated = early_data_gate(tls, state, started);
            // The gate goes into the boxed relay: this future, which every connection keeps,
            // holds none of it.
            Box::pin(async move { relay::relay(&mut gated, &mut backend, buffer, idle).await })
                .await
        } else {
            Box::pin(relay::relay(&mut tls, &mut backend, buffer, idle)).await
        };
        end.after_relay(&negotiated, outcome);
    }
}

/// What is logged of a connection: a line when it closes, a line per request (`mode =
/// "http"`).
#[derive(Clone, Copy)]
pub struct Logging {
    pub connections: bool,
    pub requests: bool,
}

/// `mode = "http"`: the connection's requests, each forwarded over the worker's backend
/// connections (`log_requests`: a log line each). Boxed, which also makes one type of the
/// two streams it may read (the connection itself, or its early-data gate): the
/// connection's future, which every connection keeps, holds neither.
fn serve_http(
    tls: SslStream<ReadAhead<TcpStream>>,
    negotiated: &Negotiated,
    state: &ListenerState,
    client: SocketAddr,
    started: Instant,
    log_requests: bool,
    stop: watch::Receiver<bool>,
) -> Pin<Box<dyn Future<Output = RelayOutcome>>> {
    let mut context = super::http::HttpContext {
        pool: state.pool_for(negotiated.sni.as_deref()).clone(),
        client: ClientAddress::new(client.ip()),
        client_cert: client_cert::of(negotiated.client_cert.as_deref()),
        idle_timeout: state.config.idle_timeout,
        buffer_size: state.config.buffer_size,
        switched: Default::default(),
        early_data: None,
        log_requests,
    };
    let version = super::http::ClientHttp::of_alpn(negotiated.alpn.as_deref());
    if negotiated.early_data {
        let gated = early_data_gate(tls, state, started);
        context.early_data = Some(gated.confirmation());
        Box::pin(super::http::serve(gated, context, version, stop))
    } else {
        Box::pin(super::http::serve(tls, context, version, stop))
    }
}

/// A connection that accepted early data, read through the gate that bounds what of it
/// passes before the client's Finished (`max_early_data`; until then it could be a replay),
/// and that cuts a client who never sends its Finished within `handshake_timeout`.
fn early_data_gate<S>(
    tls: SslStream<S>,
    state: &ListenerState,
    started: Instant,
) -> EarlyDataGate<S> {
    let confirm_by = tokio::time::Instant::from_std(started) + state.config.handshake_timeout;
    EarlyDataGate::new(tls, *state.config.max_early_data.get_ref(), confirm_by)
}

/// A connection whose handshake succeeded.
struct Established {
    tls: SslStream<ReadAhead<TcpStream>>,
    negotiated: Negotiated,
    end: ConnectionEnd,
    /// The address the client reached (see [`local_address`]).
    local: SocketAddr,
}

/// The handshake, counted and classified; `None` when the connection ends with it (it
/// failed or timed out, or it was an ACME CA's validation, answered by the handshake).
async fn handshake(
    stream: TcpStream,
    client: SocketAddr,
    state: &ListenerState,
    log_connections: bool,
    started: Instant,
    in_progress: HandshakeGuard,
) -> Option<Established> {
    let local = local_address(&stream, state);
    let _ = stream.set_nodelay(true);
    let result = accept(stream, client, state, in_progress).await?;
    let end = ConnectionEnd {
        log: log_connections,
        client,
        handshake_time: started.elapsed(),
    };
    match result {
        Ok((Ok(mut tls), _))
            if tls.ssl().selected_alpn_protocol()
                == Some(crate::tls::acme_challenge::ACME_TLS_ALPN) =>
        {
            // An ACME CA has seen the challenge certificate; nothing else is served here.
            tracing::debug!(%client, "ACME TLS-ALPN-01 validation connection answered");
            close_notify(&mut tls).await;
            end.before_relay(None, CloseReason::AcmeValidation);
            None
        }
        Ok((Ok(tls), in_tls)) => {
            let negotiated = Negotiated::from_ssl(tls.ssl(), state.config.ech_keys.is_some());
            metrics::record_handshake(negotiated.resumed, &state.metrics);
            crate::tls::metrics::record_negotiated(&negotiated, end.handshake_time, in_tls);
            crate::tls::record_key_share(tls.ssl());
            Some(Established {
                tls,
                negotiated,
                end,
                local,
            })
        }
        Ok((Err(err), _)) => {
            let reason = HandshakeFailure::classify(&FailureFacts::of(&err));
            metrics::record_handshake_failure(reason.label(), &state.metrics);
            tracing::debug!(%client, error = %err, reason = reason.label(), "handshake failed");
            end.before_relay(None, CloseReason::HandshakeFailed);
            None
        }
        Err(_) => {
            metrics::record_handshake_failure(HandshakeFailure::Timeout.label(), &state.metrics);
            tracing::debug!(%client, "handshake timed out");
            end.before_relay(None, CloseReason::HandshakeTimeout);
            None
        }
    }
}

/// A connection counted as open, from when its future is made until it is dropped however
/// it ends, and its connection permits held as long.
struct Open {
    state: Arc<ListenerState>,
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl Open {
    fn new(
        state: Arc<ListenerState>,
        permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    ) -> Self {
        metrics::record_accept(&state.metrics);
        Open {
            state,
            _permits: permits,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        metrics::record_connection_end(&self.state.metrics);
    }
}

/// The TLS handshake, within `handshake_timeout`, with the time spent inside BoringSSL;
/// `None` when no connection object could be made. The handshake counts as in progress
/// for the worker's engine queue until this returns.
async fn accept(
    stream: TcpStream,
    client: SocketAddr,
    state: &ListenerState,
    _in_progress: HandshakeGuard,
) -> Option<Result<(TlsResult, Duration), tokio::time::error::Elapsed>> {
    let mut ssl = match state.tls.new_ssl(client.ip()) {
        Ok(ssl) => ssl,
        Err(err) => {
            tracing::error!(error = %err, "cannot create a TLS connection object");
            return None;
        }
    };
    // An established connection needs none of the listener's settings: nothing after its
    // handshake reads them (what it negotiated and the client's certificate are kept; a
    // server never renegotiates; tickets, OCSP and 0-RTT acceptance are part of the
    // handshake, which with early data ends at the client's Finished, read later), so
    // BoringSSL frees its copy once the handshake is done: about 1.3 KiB of each idle
    // connection's memory.
    crate::sys::shed_handshake_config(&mut ssl);

    let handshake = PollTimer {
        inner: Box::pin(SslStreamBuilder::new(ssl, ReadAhead::new(stream)).accept()),
        busy: Duration::ZERO,
    };
    Some(tokio::time::timeout(state.config.handshake_timeout, handshake).await)
}

/// The listener's own address, unless it is a wildcard and a PROXY header will carry it:
/// then the socket knows which address the client reached (one getsockname per connection
/// only then; nothing else reads this address).
fn local_address(stream: &TcpStream, state: &ListenerState) -> SocketAddr {
    let listening = state.config.address();
    let wildcard = listening.ip().is_unspecified() || listening.port() == 0;
    if wildcard && state.config.proxy_protocol != ProxyProtocol::None {
        stream.local_addr().unwrap_or(listening)
    } else {
        listening
    }
}

/// The connection's backend connection; `None` when none could be made, after the
/// client was told with a close_notify and the close was counted.
async fn connect_backend(
    state: &ListenerState,
    client: SocketAddr,
    local: SocketAddr,
    negotiated: &Negotiated,
    tls: &mut SslStream<ReadAhead<TcpStream>>,
    end: &ConnectionEnd,
) -> Option<BackendStream> {
    match open_backend(state, client, local, negotiated).await {
        Ok(backend) => Some(backend),
        Err(err) => {
            tracing::warn!(%client, error = %err, "closing client: no backend");
            // A close_notify, so the client sees the connection end rather than a reset
            // (BoringSSL sends none while a 0-RTT handshake is still unconfirmed).
            close_notify(tls).await;
            end.before_relay(Some(negotiated), CloseReason::BackendUnavailable);
            None
        }
    }
}

/// Ends the client's stream with a close_notify, within a second: a client that reads
/// nothing does not hold the connection.
pub(super) async fn close_notify<S: tokio::io::AsyncWrite + Unpin>(stream: &mut S) {
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.shutdown()).await;
}

/// Connects to a backend of the connection's pool and sends the PROXY header, if any.
async fn open_backend(
    state: &ListenerState,
    client: SocketAddr,
    local: SocketAddr,
    negotiated: &Negotiated,
) -> anyhow::Result<BackendStream> {
    let (mut backend, _) = state.pool_for(negotiated.sni.as_deref()).connect().await?;
    let header = match state.config.proxy_protocol {
        ProxyProtocol::None => return Ok(backend),
        ProxyProtocol::V1 => proxy_protocol::encode_v1(client, local),
        ProxyProtocol::V2 => {
            let policy = state.client_policy(negotiated.sni.as_deref());
            proxy_protocol::encode_v2(client, local, &negotiated.tls_details(policy))
        }
    };
    backend
        .write_all(&header)
        .await
        .map_err(|err| anyhow::anyhow!("cannot send the PROXY header: {err}"))?;
    Ok(backend)
}

/// What the end of a connection is counted and logged with, known once its handshake ends.
struct ConnectionEnd {
    /// `log_connections`: one log line per connection.
    log: bool,
    client: SocketAddr,
    handshake_time: Duration,
}

impl ConnectionEnd {
    /// A connection closed before anything was relayed.
    fn before_relay(&self, negotiated: Option<&Negotiated>, reason: CloseReason) {
        self.record(negotiated, 0, 0, reason);
    }

    /// A connection whose relay ended.
    fn after_relay(&self, negotiated: &Negotiated, outcome: relay::RelayOutcome) {
        self.record(
            Some(negotiated),
            outcome.to_backend,
            outcome.to_client,
            CloseReason::Relayed(outcome.end),
        );
    }

    fn record(&self, n: Option<&Negotiated>, to_backend: u64, to_client: u64, reason: CloseReason) {
        metrics::record_close(reason.label());
        crate::proxy::metrics::record_relayed(to_backend, to_client);
        if !self.log {
            return;
        }
        tracing::info!(
            target: "tlsterm::connection",
            client = %self.client,
            sni = %n.and_then(|n| n.sni.as_deref()).unwrap_or("-"),
            alpn = %n.and_then(|n| n.alpn.as_deref()).map(String::from_utf8_lossy).as_deref().unwrap_or("-"),
            version = %n.map_or("-", |n| n.version),
            cipher = %n.map_or("", |n| n.cipher),
            group = %n.and_then(|n| n.group).unwrap_or("-"),
            resumed = n.is_some_and(|n| n.resumed),
            ech = %n.and_then(|n| n.ech).unwrap_or("-"),
            early_data = n.is_some_and(|n| n.early_data),
            handshake_us = self.handshake_time.as_micros() as u64,
            bytes_in = to_backend,
            bytes_out = to_client,
            close = %reason.label(),
            "connection closed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::{watch, Semaphore};

    /// Every connection's task keeps this future from accept to close, sized for its largest
    /// state: with tens of thousands of idle connections it is a good part of what each
    /// costs (`bench/idle.sh` measures the whole). Something large held across an await
    /// (an unboxed HTTP server or relay, a second copy of the arguments) shows here first.
    #[tokio::test]
    async fn a_connection_future_stays_small() {
        let config = crate::config::Config::embedded_default();
        let sessions = crate::session::Sessions::new(&config.session).unwrap();
        let builtin = SocketAddr::from(([127, 0, 0, 1], 9));
        let state = super::super::build_states(&config, Some(builtin), &sessions, None)
            .unwrap()
            .remove(0);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let limit = Arc::new(Semaphore::new(2));
        let permits = (
            limit.clone().try_acquire_owned().unwrap(),
            limit.try_acquire_owned().unwrap(),
        );
        let (_stop_tx, stop) = watch::channel(false);
        let client = stream.local_addr().unwrap();
        let log = Logging {
            connections: false,
            requests: false,
        };
        let connection = handle(stream, client, state, log, stop, permits);
        let size = std::mem::size_of_val(&connection);
        assert!(
            size <= 512,
            "a connection's future takes {size} bytes: what made it grow beyond 512?"
        );
    }
}
