//! A bound on how much early data reaches the backend before the handshake is confirmed.
//!
//! With 0-RTT accepted, BoringSSL returns from the handshake as soon as it has read the
//! ClientHello, and reads of the connection return early data until the client's Finished
//! arrives. Early data can be replayed; the anti-replay memory refuses copies it sees, and
//! this gate bounds what one connection can hand to the backend while unconfirmed:
//! `max_early_data` bytes pass at once, the rest is held until the handshake completes and
//! dropped if it never does. BoringSSL itself accepts at most 14,336 bytes of early data,
//! so the held bytes are bounded too. Every connection that accepted early data goes
//! through the gate, which also lets it end with a close_notify (see `poll_shutdown`), and
//! tells whoever reads through it whether the handshake is confirmed yet (see
//! [`Confirmation`]): HTTP requests forwarded before it are marked as early data.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use boring::ssl::{ClientHello, ExtensionType, SslRef};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tokio_boring::SslStream;

use super::server_tls::CLIENT_ADDRESS;
use crate::session::replay::Verdict;
use crate::session::{EarlyDataCheck, Sessions};

/// Whether the handshake is complete: the client's Finished has been read.
fn confirmed(ssl: &SslRef) -> bool {
    crate::sys::handshake_confirmed(ssl)
}

/// Whether a connection's handshake is confirmed, as its [`EarlyDataGate`] last saw it.
/// BoringSSL reads the client's Finished only within a read, and every read of the
/// connection goes through the gate, so what the gate saw is the connection's state:
/// what was read before it turned true came as early data.
#[derive(Clone, Default)]
pub struct Confirmation(Rc<ConfirmationState>);

#[derive(Default)]
struct ConfirmationState {
    confirmed: Cell<bool>,
    /// Told when `confirmed` turns true.
    turned: Notify,
}

impl Confirmation {
    pub fn confirmed(&self) -> bool {
        self.0.confirmed.get()
    }

    /// Until the handshake is confirmed (forever, should the connection end before: its
    /// timeout for the client's Finished ends it then).
    pub async fn wait(&self) {
        let turned = self.0.turned.notified();
        tokio::pin!(turned);
        // Registered before the check, so that a turn between the two is not missed.
        turned.as_mut().enable();
        if !self.confirmed() {
            turned.await;
        }
    }

    fn set(&self, confirmed: bool) {
        if confirmed && !self.0.confirmed.replace(true) {
            self.0.turned.notify_waiters();
        }
    }
}

/// The client side of a relay for a connection that accepted early data.
pub struct EarlyDataGate<S> {
    stream: SslStream<S>,
    confirmation: Confirmation,
    /// Early-data bytes that may still pass before the handshake is confirmed.
    allowance: usize,
    /// Bytes read but not passed on yet, in order; delivered once confirmed.
    held: Vec<u8>,
    delivered: usize,
    /// The handshake timeout still applies after BoringSSL returned early: a client that
    /// sends early data but never its Finished is cut off, not kept until the idle timeout.
    confirm_by: Pin<Box<Sleep>>,
}

impl<S> EarlyDataGate<S> {
    pub fn new(stream: SslStream<S>, max_early_data: usize, confirm_by: Instant) -> Self {
        EarlyDataGate {
            stream,
            confirmation: Confirmation::default(),
            allowance: max_early_data,
            held: Vec::new(),
            delivered: 0,
            confirm_by: Box::pin(tokio::time::sleep_until(confirm_by)),
        }
    }

    /// What tells whether the handshake is confirmed, for as long as the connection lives.
    pub fn confirmation(&self) -> Confirmation {
        self.confirmation.clone()
    }

    /// Whether the handshake is confirmed now; what [`Confirmation`] says follows.
    fn confirmed(&self) -> bool {
        let confirmed = confirmed(self.stream.ssl());
        self.confirmation.set(confirmed);
        confirmed
    }

    /// An error once the deadline for the client's Finished has passed (the timer wakes
    /// the task then).
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.confirm_by.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not complete the handshake after its early data",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for EarlyDataGate<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.confirmed() {
                if this.delivered < this.held.len() {
                    let rest = &this.held[this.delivered..];
                    let n = rest.len().min(buf.remaining());
                    buf.put_slice(&rest[..n]);
                    this.delivered += n;
                    return Poll::Ready(Ok(()));
                }
                this.held = Vec::new();
                return Pin::new(&mut this.stream).poll_read(cx, buf);
            }
            this.check_deadline(cx)?;
            // Never more than the caller can take, so what is allowed need not be held.
            let mut scratch = [0u8; 4096];
            let room = buf.remaining().min(scratch.len());
            let mut chunk = ReadBuf::new(&mut scratch[..room]);
            if Pin::new(&mut this.stream)
                .poll_read(cx, &mut chunk)?
                .is_pending()
            {
                // The read may have completed the handshake and then found no more data:
                // what is held can go now, not when the client next sends something.
                if this.confirmed() && !this.held.is_empty() {
                    continue;
                }
                return Poll::Pending;
            }
            let got = chunk.filled();
            if got.is_empty() {
                // The read may have confirmed the handshake and then met the end of the
                // stream: what is held goes first. Unconfirmed, it goes nowhere.
                if this.confirmed() && !this.held.is_empty() {
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            // A read that completed the handshake returns data sent after it (1-RTT).
            let early = !this.confirmed();
            let pass = match (early, this.held.is_empty()) {
                (true, true) => got.len().min(this.allowance),
                (false, true) => got.len(),
                (_, false) => 0,
            };
            buf.put_slice(&got[..pass]);
            if early {
                this.allowance -= pass;
            }
            this.held.extend_from_slice(&got[pass..]);
            if pass > 0 {
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for EarlyDataGate<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    /// BoringSSL sends no close_notify before the handshake is complete, and a backend
    /// that answers the early request may close before the client's Finished is read: read
    /// on until it is (keeping any data for `poll_read`), then close cleanly.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while !this.confirmed() {
            this.check_deadline(cx)?;
            let mut scratch = [0u8; 4096];
            let mut chunk = ReadBuf::new(&mut scratch);
            let polled = Pin::new(&mut this.stream).poll_read(cx, &mut chunk)?;
            this.held.extend_from_slice(chunk.filled());
            if this.confirmed() {
                break;
            }
            match polled {
                Poll::Pending => return Poll::Pending,
                // The client left unconfirmed: nothing to close cleanly.
                Poll::Ready(()) if chunk.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(()) => {}
            }
        }
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

/// The anti-replay check for a ClientHello that offers 0-RTT with a PSK (without a PSK
/// there is no resumption, and BoringSSL refuses the early data itself).
pub(super) fn early_data_check(
    hello: &ClientHello<'_>,
    sessions: &Sessions,
) -> Option<EarlyDataCheck> {
    hello.get_extension(ExtensionType::EARLY_DATA)?;
    let pre_shared_key = hello.get_extension(ExtensionType::PRE_SHARED_KEY)?;
    let client = hello.ssl().ex_data(*CLIENT_ADDRESS).copied();
    let client = client.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    Some(sessions.check_early_data(pre_shared_key, client))
}

/// Whether the verdict refuses 0-RTT: seen before (a replay), the memory or the client's
/// share of it full, Redis silent, or a process too young to know what its predecessor
/// saw. Counted here, as a replayed handshake may never complete.
pub(super) fn early_data_refused(verdict: Verdict) -> bool {
    if verdict == Verdict::Fresh {
        return false;
    }
    tracing::debug!(result = verdict.label(), "0-RTT refused");
    super::metrics::record_early_data(verdict.label());
    true
}

/// What became of the early data of a completed handshake: `None` if the client offered
/// none (or the listener allows none), else "accepted" or BoringSSL's reason for refusing
/// it (e.g. "ticket_age_skew", "alpn_mismatch"). Refusals for replay are counted earlier.
pub fn early_data_outcome(ssl: &SslRef) -> Option<&'static str> {
    use boring_sys::ssl_early_data_reason_t as Reason;
    let (reason, text) = crate::sys::early_data_reason(ssl);
    match reason {
        Reason::ssl_early_data_accepted => Some("accepted"),
        Reason::ssl_early_data_unknown
        | Reason::ssl_early_data_disabled
        | Reason::ssl_early_data_peer_declined
        | Reason::ssl_early_data_no_session_offered => None,
        _ => Some(text.unwrap_or("other")),
    }
}
