//! One client connection: TLS handshake, backend connection, PROXY header, relay.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boring::ssl::SslRef;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_boring::SslStreamBuilder;

use super::failure::HandshakeFailure;
use super::ListenerState;
use crate::config::ProxyProtocol;
use crate::metrics::{self, HandshakeRecord};
use crate::offload::HandshakeGuard;
use crate::proxy::proxy_protocol::{self, ClientIdentity, TlsDetails};
use crate::proxy::relay::{self, RelayEnd};
use crate::tls::early_data::EarlyDataGate;

/// What was negotiated, for the log line and the PROXY v2 TLVs.
struct Negotiated {
    sni: Option<String>,
    alpn: Option<Vec<u8>>,
    version: &'static str,
    cipher: String,
    /// The key-exchange group (e.g. X25519MLKEM768); none on a TLS 1.2 resumption.
    group: Option<&'static str>,
    resumed: bool,
    /// Encrypted Client Hello: accepted, rejected or not_offered; none without ech_keys.
    ech: Option<&'static str>,
    client_cert: Option<ClientIdentity>,
    /// 0-RTT data was accepted: the first bytes may be a replay.
    early_data: bool,
}

/// The verified client certificate, if the client presented one.
fn client_identity(ssl: &SslRef) -> Option<ClientIdentity> {
    let cert = ssl.peer_certificate()?;
    let text = |data: &boring::asn1::Asn1StringRef| {
        data.as_utf8().map(|s| s.to_string()).unwrap_or_default()
    };
    // RFC 4514 (2253): special characters in values escaped, bytes beyond ASCII as \XX,
    // so a value cannot pass for more attributes; empty if BoringSSL cannot print it.
    let subject = cert
        .subject_name()
        .print_ex(boring_sys::XN_FLAG_RFC2253)
        .unwrap_or_default();
    let common_name = cert
        .subject_name()
        .entries_by_nid(boring::nid::Nid::COMMONNAME)
        .next()
        .map(|e| text(e.data()));
    let san = cert
        .subject_alt_names()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| {
                    n.dnsname()
                        .map(|d| format!("DNS:{d}"))
                        .or_else(|| n.email().map(|e| format!("email:{e}")))
                        .or_else(|| n.uri().map(|u| format!("URI:{u}")))
                        .or_else(|| n.ipaddress().and_then(ip_text).map(|ip| format!("IP:{ip}")))
                })
                .collect()
        })
        .unwrap_or_default();
    let sha256_hex = cert
        .digest(boring::hash::MessageDigest::sha256())
        .map(|d| hex(&d))
        .unwrap_or_default();
    Some(ClientIdentity {
        common_name,
        subject,
        san,
        sha256_hex,
    })
}

fn ip_text(raw: &[u8]) -> Option<std::net::IpAddr> {
    match raw.len() {
        4 => Some(<[u8; 4]>::try_from(raw).ok()?.into()),
        16 => Some(<[u8; 16]>::try_from(raw).ok()?.into()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Negotiated {
    fn from_ssl(ssl: &SslRef, early_data: bool, ech: Option<&'static str>) -> Negotiated {
        Negotiated {
            sni: ssl
                .servername(boring::ssl::NameType::HOST_NAME)
                .map(str::to_string),
            alpn: ssl.selected_alpn_protocol().map(<[u8]>::to_vec),
            version: ssl.version_str(),
            cipher: ssl
                .current_cipher()
                .map(|c| c.standard_name().unwrap_or(c.name()).to_string())
                .unwrap_or_default(),
            group: ssl.curve_name(),
            resumed: ssl.session_reused(),
            ech,
            client_cert: client_identity(ssl),
            early_data,
        }
    }
}

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
enum Outcome {
    HandshakeTimeout,
    HandshakeFailed,
    BackendUnavailable,
    Relayed(RelayEnd),
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::HandshakeTimeout => "handshake_timeout",
            Outcome::HandshakeFailed => "handshake_failed",
            Outcome::BackendUnavailable => "backend_unavailable",
            Outcome::Relayed(end) => end.label(),
        }
    }
}

pub async fn handle(
    stream: TcpStream,
    client: SocketAddr,
    state: Arc<ListenerState>,
    log_connections: bool,
) {
    let started = Instant::now();
    let local = stream.local_addr().unwrap_or(state.config.address());
    let _ = stream.set_nodelay(true);
    let ssl = match state.tls.new_ssl(client.ip()) {
        Ok(ssl) => ssl,
        Err(err) => {
            tracing::error!(error = %err, "cannot create a TLS connection object");
            return;
        }
    };

    let guard = HandshakeGuard::enter();
    let handshake = PollTimer {
        inner: Box::pin(SslStreamBuilder::new(ssl, stream).accept()),
        busy: Duration::ZERO,
    };
    let result = tokio::time::timeout(state.config.handshake_timeout, handshake).await;
    drop(guard);
    let handshake_time = started.elapsed();
    let (mut tls, early_data, ech) = match result {
        Ok((Ok(tls), in_tls)) => {
            let ssl = tls.ssl();
            metrics::record_handshake(
                &HandshakeRecord {
                    resumed: ssl.session_reused(),
                    version: ssl.version_str(),
                    cipher: ssl
                        .current_cipher()
                        .map(|c| c.standard_name().unwrap_or(c.name()))
                        .unwrap_or("-"),
                    group: ssl.curve_name(),
                    alpn: ssl.selected_alpn_protocol(),
                    total: handshake_time,
                    in_tls,
                },
                &state.metrics,
            );
            let early_data = crate::tls::early_data_outcome(ssl);
            if let Some(outcome) = early_data {
                metrics::record_early_data(outcome);
            }
            let accepted = early_data == Some("accepted");
            let ech = state
                .config
                .ech_keys
                .is_some()
                .then(|| crate::tls::ech_outcome(ssl));
            (tls, accepted, ech)
        }
        Ok((Err(err), _)) => {
            let reason = HandshakeFailure::classify(&format!("{err} {err:?}"));
            metrics::record_handshake_failure(reason.label(), &state.metrics);
            tracing::debug!(%client, error = %err, reason = reason.label(), "handshake failed");
            log_end(
                log_connections,
                client,
                None,
                handshake_time,
                0,
                0,
                Outcome::HandshakeFailed,
            );
            return;
        }
        Err(_) => {
            metrics::record_handshake_failure(HandshakeFailure::Timeout.label(), &state.metrics);
            tracing::debug!(%client, "handshake timed out");
            log_end(
                log_connections,
                client,
                None,
                handshake_time,
                0,
                0,
                Outcome::HandshakeTimeout,
            );
            return;
        }
    };
    let negotiated = Negotiated::from_ssl(tls.ssl(), early_data, ech);

    let mut backend = match open_backend(&state, client, local, &negotiated).await {
        Ok(backend) => backend,
        Err(err) => {
            tracing::warn!(%client, error = %err, "closing client: no backend");
            // A close_notify, so the client sees the connection end rather than a reset
            // (BoringSSL sends none while a 0-RTT handshake is still unconfirmed).
            let _ = tokio::time::timeout(Duration::from_secs(1), tls.shutdown()).await;
            log_end(
                log_connections,
                client,
                Some(&negotiated),
                handshake_time,
                0,
                0,
                Outcome::BackendUnavailable,
            );
            return;
        }
    };

    let (buffer_size, idle_timeout) = (state.config.buffer_size, state.config.idle_timeout);
    let max_early_data = *state.config.max_early_data.get_ref();
    let outcome = if negotiated.early_data {
        let confirm_by = tokio::time::Instant::from_std(started) + state.config.handshake_timeout;
        let mut gated = EarlyDataGate::new(&mut tls, max_early_data, confirm_by);
        relay::relay(&mut gated, &mut backend, buffer_size, idle_timeout).await
    } else {
        relay::relay(&mut tls, &mut backend, buffer_size, idle_timeout).await
    };
    log_end(
        log_connections,
        client,
        Some(&negotiated),
        handshake_time,
        outcome.to_backend,
        outcome.to_client,
        Outcome::Relayed(outcome.end),
    );
}

/// Connects to a backend of the connection's pool and sends the PROXY header, if any.
async fn open_backend(
    state: &ListenerState,
    client: SocketAddr,
    local: SocketAddr,
    negotiated: &Negotiated,
) -> anyhow::Result<TcpStream> {
    let (mut backend, _) = state.pool_for(negotiated.sni.as_deref()).connect().await?;
    let header = match state.config.proxy_protocol {
        ProxyProtocol::None => return Ok(backend),
        ProxyProtocol::V1 => proxy_protocol::encode_v1(client, local),
        ProxyProtocol::V2 => proxy_protocol::encode_v2(
            client,
            local,
            &TlsDetails {
                alpn: negotiated.alpn.clone(),
                sni: negotiated.sni.clone(),
                version: negotiated.version.to_string(),
                cipher: negotiated.cipher.clone(),
                key_alg: None,
                client_cert: negotiated.client_cert.clone(),
                early_data: negotiated.early_data,
            },
        ),
    };
    backend
        .write_all(&header)
        .await
        .map_err(|err| anyhow::anyhow!("cannot send the PROXY header: {err}"))?;
    Ok(backend)
}

fn log_end(
    enabled: bool,
    client: SocketAddr,
    negotiated: Option<&Negotiated>,
    handshake_time: Duration,
    to_backend: u64,
    to_client: u64,
    outcome: Outcome,
) {
    metrics::record_close(outcome.label(), to_backend, to_client);
    if !enabled {
        return;
    }
    let empty = Negotiated {
        sni: None,
        alpn: None,
        version: "-",
        cipher: String::new(),
        group: None,
        resumed: false,
        ech: None,
        client_cert: None,
        early_data: false,
    };
    let n = negotiated.unwrap_or(&empty);
    tracing::info!(
        target: "tlsterm::connection",
        %client,
        sni = %n.sni.as_deref().unwrap_or("-"),
        alpn = %n.alpn.as_deref().map(String::from_utf8_lossy).as_deref().unwrap_or("-"),
        version = %n.version,
        cipher = %n.cipher,
        group = %n.group.unwrap_or("-"),
        resumed = n.resumed,
        ech = %n.ech.unwrap_or("-"),
        early_data = n.early_data,
        handshake_us = handshake_time.as_micros() as u64,
        bytes_in = to_backend,
        bytes_out = to_client,
        close = %outcome.label(),
        "connection closed"
    );
}
