//! The HTTP/3 client of `--http3`: quiche over the same BoringSSL as the server, one UDP
//! socket per connection, driven by the thread's tokio current-thread runtime.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{bail, Context};
use quiche::h3::{self, NameValue};
use tokio::net::UdpSocket;

use crate::http::Response;

/// UDP payloads sent and accepted: what fits an Ethernet path with IPv6, as the server's.
const MAX_DATAGRAM: usize = 1350;
/// Flow-control windows the client grants: a bulk response of several MiB streams without
/// waiting for window updates (quiche's largest windows).
const CONNECTION_WINDOW: u64 = 24 * 1024 * 1024;
const STREAM_WINDOW: u64 = 16 * 1024 * 1024;
/// The server's HTTP/3 control and QPACK streams, with room for its extras.
const MAX_UNI_STREAMS: u64 = 8;
/// How long an idle connection lives on either side: longer than any unit's timeout, so
/// that the unit's own timeout is what ends a stuck one.
const IDLE_TIMEOUT_MS: u64 = 60_000;
/// HTTP/3's "no error" code, sent when the client is done with a connection.
const H3_NO_ERROR: u64 = 0x100;

/// QUIC options as given on the command line.
#[derive(Clone, Debug)]
pub struct QuicOptions {
    /// "x25519mlkem768", "x25519", "p256" or "p384": the only group offered.
    pub group: String,
    pub insecure: bool,
    /// PEM file with trust anchors (used unless `insecure`).
    pub cacert: Option<String>,
    /// The SNI and the name the certificate must carry; `None` for an IP address.
    pub server_name: Option<String>,
}

impl QuicOptions {
    /// BoringSSL's name of the group offered.
    fn boringssl_group(&self) -> anyhow::Result<&'static str> {
        Ok(match self.group.as_str() {
            "x25519mlkem768" | "X25519MLKEM768" => "X25519MLKEM768",
            "x25519" | "X25519" => "X25519",
            "p256" | "P-256" | "secp256r1" | "prime256v1" => "P-256",
            "p384" | "P-384" | "secp384r1" => "P-384",
            g => bail!("unknown group {g:?} (x25519mlkem768, x25519, p256, p384)"),
        })
    }

    /// What the report lists as negotiated: QUIC is TLS 1.3 with ALPN h3, and the one
    /// group offered is the one a completed handshake used.
    pub fn negotiated(&self) -> String {
        let group = self.boringssl_group().unwrap_or("?");
        format!("QUICv1 TLSv1_3 h3 {group}")
    }
}

/// One thread's client: quiche's configuration (not shareable between threads) and the
/// HTTP/3 settings.
pub struct Client {
    config: RefCell<quiche::Config>,
    h3: h3::Config,
    server_name: Option<String>,
}

impl Client {
    pub fn new(opts: &QuicOptions) -> anyhow::Result<Client> {
        let mut config = quiche::Config::new(quiche::PROTOCOL_VERSION)?;
        config.set_application_protos(h3::APPLICATION_PROTOCOL)?;
        config.set_curves_list(opts.boringssl_group()?)?;
        if opts.insecure {
            // BoringSSL still checks the server's CertificateVerify signature.
            config.verify_peer(false);
        } else {
            let path = opts.cacert.as_deref().context("--cacert FILE")?;
            config
                .load_verify_locations_from_file(path)
                .with_context(|| format!("reading {path}"))?;
            config.verify_peer(true);
        }
        config.set_max_idle_timeout(IDLE_TIMEOUT_MS);
        config.set_max_recv_udp_payload_size(MAX_DATAGRAM);
        config.set_max_send_udp_payload_size(MAX_DATAGRAM);
        config.set_initial_max_data(CONNECTION_WINDOW);
        config.set_initial_max_stream_data_bidi_local(STREAM_WINDOW);
        config.set_initial_max_stream_data_uni(STREAM_WINDOW);
        config.set_initial_max_streams_uni(MAX_UNI_STREAMS);
        config.set_disable_active_migration(true);
        Ok(Client {
            config: RefCell::new(config),
            h3: h3::Config::new()?,
            server_name: opts.server_name.clone(),
        })
    }
}

/// An established QUIC connection with HTTP/3 on it.
pub struct H3Conn {
    link: Link,
    h3: h3::Connection,
    body: Vec<u8>,
    /// The server sent GOAWAY: no new request may go on this connection.
    goaway: bool,
}

/// Why a connection failed, in the report's words (`handshake: ...`, `read: ...`).
fn error_text(stage: &str, e: impl std::fmt::Display) -> String {
    format!("{stage}: {e}")
}

impl H3Conn {
    /// Opens a connection to `peer` from a socket of its own, offering `session` (a ticket
    /// from an earlier connection) if given; returns once the handshake is complete.
    pub async fn connect(
        client: &Client,
        peer: SocketAddr,
        session: Option<&[u8]>,
    ) -> Result<H3Conn, String> {
        let any: SocketAddr = if peer.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(any)
            .await
            .map_err(|e| error_text("connect", e.kind()))?;
        socket
            .connect(peer)
            .await
            .map_err(|e| error_text("connect", e.kind()))?;
        let local = socket
            .local_addr()
            .map_err(|e| error_text("connect", e.kind()))?;
        let mut scid = [0u8; quiche::MAX_CONN_ID_LEN];
        boring::rand::rand_bytes(&mut scid).map_err(|e| error_text("connect", e))?;
        let scid = quiche::ConnectionId::from_ref(&scid);
        let mut conn = quiche::connect(
            client.server_name.as_deref(),
            &scid,
            local,
            peer,
            &mut client.config.borrow_mut(),
        )
        .map_err(|e| error_text("handshake", e))?;
        if let Some(session) = session {
            conn.set_session(session)
                .map_err(|e| error_text("handshake: session", e))?;
        }
        let mut link = Link {
            conn,
            socket,
            local,
            peer,
            datagram: vec![0; 64 * 1024],
        };
        while !link.conn.is_established() {
            link.flush().await?;
            if link.conn.is_closed() {
                return Err(link.close_reason("handshake"));
            }
            link.wait().await?;
        }
        let h3 = h3::Connection::with_transport(&mut link.conn, &client.h3)
            .map_err(|e| error_text("http3", e))?;
        Ok(H3Conn {
            link,
            h3,
            body: vec![0; 64 * 1024],
            goaway: false,
        })
    }

    /// Whether the handshake resumed a session (a ticket was accepted).
    pub fn is_resumed(&self) -> bool {
        self.link.conn.is_resumed()
    }

    /// The newest session ticket the server has sent on this connection, serialized.
    pub fn session(&self) -> Option<Vec<u8>> {
        self.link.conn.session().map(<[u8]>::to_vec)
    }

    /// Whether another request may go on this connection.
    pub fn reusable(&self) -> bool {
        let conn = &self.link.conn;
        !self.goaway && !conn.is_closed() && !conn.is_draining()
    }

    /// Sends a GET with `headers` (pseudo-headers first) and reads its whole response; the
    /// body is counted, not kept. `wire_len` counts the body and the header fields' names
    /// and values (HTTP/3 has no header bytes on the wire to count as HTTP/1.1's).
    pub async fn get(&mut self, headers: &[h3::Header]) -> Result<Response, String> {
        let stream = loop {
            match self.h3.send_request(&mut self.link.conn, headers, true) {
                Ok(id) => break id,
                Err(h3::Error::StreamBlocked)
                | Err(h3::Error::TransportError(quiche::Error::StreamLimit)) => {
                    self.link.flush().await?;
                    self.link.wait().await?;
                }
                Err(e) => return Err(error_text("write", e)),
            }
        };
        let mut response = Response {
            status: 0,
            body_len: 0,
            wire_len: 0,
            close: false,
        };
        loop {
            self.link.flush().await?;
            while let Some(event) = self.poll()? {
                match event {
                    (id, h3::Event::Headers { list, .. }) if id == stream => {
                        read_head(&list, &mut response)?;
                    }
                    (id, h3::Event::Data) if id == stream => {
                        let n = self.drain_body(stream)?;
                        response.body_len += n;
                        response.wire_len += n;
                    }
                    (id, h3::Event::Finished) if id == stream => {
                        if response.status == 0 {
                            return Err("http: no response headers".to_string());
                        }
                        response.close = self.goaway;
                        return Ok(response);
                    }
                    (id, h3::Event::Reset(code)) if id == stream => {
                        return Err(format!("read: stream reset (code {code:#x})"));
                    }
                    (_, h3::Event::GoAway) => self.goaway = true,
                    _ => {}
                }
            }
            if self.link.conn.is_closed() {
                return Err(self.link.close_reason("read"));
            }
            self.link.wait().await?;
        }
    }

    /// The next HTTP/3 event, or `None` when there is none until more datagrams arrive.
    fn poll(&mut self) -> Result<Option<(u64, h3::Event)>, String> {
        match self.h3.poll(&mut self.link.conn) {
            Ok(event) => Ok(Some(event)),
            Err(h3::Error::Done) => Ok(None),
            Err(e) => Err(error_text("http3", e)),
        }
    }

    /// Reads (and discards) what body bytes `stream` has; returns how many.
    fn drain_body(&mut self, stream: u64) -> Result<u64, String> {
        let mut total = 0u64;
        loop {
            match self
                .h3
                .recv_body(&mut self.link.conn, stream, &mut self.body)
            {
                Ok(n) => total += n as u64,
                Err(h3::Error::Done) => return Ok(total),
                Err(e) => return Err(error_text("read", e)),
            }
        }
    }

    /// Closes the connection with HTTP/3's "no error" and sends the close to the server,
    /// which then forgets the connection at once instead of after its idle timeout.
    pub async fn close(mut self) {
        if self.link.conn.close(true, H3_NO_ERROR, b"").is_ok() {
            let _ = self.link.flush().await;
        }
    }
}

/// The status and header sizes of a response head, into `response`.
fn read_head(list: &[h3::Header], response: &mut Response) -> Result<(), String> {
    for header in list {
        response.wire_len += (header.name().len() + header.value().len()) as u64;
        if header.name() == b":status" {
            response.status = std::str::from_utf8(header.value())
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| "http: bad :status".to_string())?;
        }
    }
    Ok(())
}

/// A QUIC connection and its socket: moves datagrams between them.
struct Link {
    conn: quiche::Connection,
    socket: UdpSocket,
    local: SocketAddr,
    peer: SocketAddr,
    datagram: Vec<u8>,
}

impl Link {
    /// Sends every datagram the connection has ready. Pacing is not followed: the client
    /// and the server share a host, where a burst costs nothing.
    async fn flush(&mut self) -> Result<(), String> {
        loop {
            let len = match self.conn.send(&mut self.datagram) {
                Ok((len, _)) => len,
                Err(quiche::Error::Done) => return Ok(()),
                Err(e) => return Err(error_text("write", e)),
            };
            self.socket
                .send(&self.datagram[..len])
                .await
                .map_err(|e| error_text("write", e.kind()))?;
        }
    }

    /// Waits for the next datagram (and takes every one already queued) or for the
    /// connection's timer, and hands them to the connection.
    async fn wait(&mut self) -> Result<(), String> {
        let deadline = self.conn.timeout_instant();
        let received = match deadline {
            Some(at) => {
                tokio::select! {
                    r = self.socket.recv(&mut self.datagram) => Some(r),
                    _ = tokio::time::sleep_until(at.into()) => None,
                }
            }
            None => Some(self.socket.recv(&mut self.datagram).await),
        };
        let Some(received) = received else {
            self.conn.on_timeout();
            return Ok(());
        };
        let mut len = received.map_err(|e| error_text("read", e.kind()))?;
        loop {
            let info = quiche::RecvInfo {
                from: self.peer,
                to: self.local,
            };
            // A datagram the connection refuses (a stray or damaged one) is dropped, as
            // QUIC requires; a fatal error shows as the connection closing.
            let _ = self.conn.recv(&mut self.datagram[..len], info);
            match self.socket.try_recv(&mut self.datagram) {
                Ok(n) => len = n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(error_text("read", e.kind())),
            }
        }
        if self
            .conn
            .timeout_instant()
            .is_some_and(|t| t <= Instant::now())
        {
            self.conn.on_timeout();
        }
        Ok(())
    }

    /// Why the connection closed, for the error counts.
    fn close_reason(&mut self, stage: &str) -> String {
        if let Some(e) = self.conn.peer_error() {
            let reason = String::from_utf8_lossy(&e.reason);
            return match e.error_code {
                code @ 0x100..=0x1ff if !e.is_app => {
                    format!("{stage}: TLS alert {} received {reason}", code - 0x100)
                }
                code => format!("{stage}: closed by the server (code {code:#x}) {reason}"),
            };
        }
        if let Some(e) = self.conn.local_error() {
            // QUIC carries a TLS alert as the transport error 0x100 + alert (RFC 9001).
            return match e.error_code {
                code @ 0x100..=0x1ff if !e.is_app => {
                    format!("{stage}: TLS alert {} sent", code - 0x100)
                }
                code => format!("{stage}: closed (code {code:#x})"),
            };
        }
        if self.conn.is_timed_out() {
            return format!("{stage}: idle timeout");
        }
        format!("{stage}: connection closed")
    }
}
