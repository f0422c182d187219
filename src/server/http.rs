//! `mode = "http"`: an established connection's HTTP/1.1 requests, each forwarded to the
//! backends over the worker's keep-alive connections (hyper on both sides), instead of a
//! backend connection opened, relayed to and closed for every client connection. That
//! connection is most of what a short-lived client connection costs a byte relay beside
//! the handshake (its TCP handshake, the backend's accept, both closes); pooled, it is paid
//! once per many clients.
//!
//! Bodies stream both ways (hyper's flow control; nothing is held whole). A backend
//! connection goes back to the worker's pool once the response body has been read whole.

use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_LENGTH};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::proxy::client_cert::CertFields;
use crate::proxy::forwarding;
use crate::proxy::http_backend::{Backends, Borrowed};
use crate::proxy::metrics;
use crate::proxy::pool::BackendPool;
use crate::proxy::relay::{RelayEnd, Side};

thread_local! {
    /// This worker's idle connections to every `mode = "http"` listener's backends.
    static BACKENDS: Rc<Backends<Incoming>> = Rc::default();
}

/// What every request of one client connection is forwarded with.
pub(super) struct HttpContext {
    /// The backends of the connection's server name.
    pub pool: Arc<BackendPool>,
    pub client: IpAddr,
    /// The connection's verified client certificate as fields (empty without one).
    pub client_cert: CertFields,
    /// No request head from the client for this long closes the connection; no response
    /// head from the backend for this long answers 504.
    pub idle_timeout: Duration,
}

/// Serves the connection's requests until the client closes it, stays idle past
/// `idle_timeout`, or sends what is not HTTP/1.1; once `stop` turns true, until the request
/// in progress, if any, is answered.
pub(super) async fn serve<S>(
    stream: S,
    context: HttpContext,
    mut stop: watch::Receiver<bool>,
) -> RelayEnd
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let idle_timeout = context.idle_timeout;
    let context = Rc::new(context);
    let backends = BACKENDS.with(Rc::clone);
    let service = hyper::service::service_fn(move |request| {
        forward(request, context.clone(), backends.clone())
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(idle_timeout)
        .serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        Ok(_) = stop.wait_for(|stop| *stop) => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    match served {
        Ok(()) => RelayEnd::Closed,
        Err(err) if err.is_timeout() => RelayEnd::IdleTimeout,
        Err(err) => {
            tracing::debug!(error = %err, "HTTP connection ended with an error");
            RelayEnd::Error(Side::Client)
        }
    }
}

/// One request: rewritten for the backend, sent on a pooled connection, its response
/// streamed back; 502 when no backend answers, 504 when it answers too late.
async fn forward(
    request: Request<Incoming>,
    context: Rc<HttpContext>,
    backends: Rc<Backends<Incoming>>,
) -> Result<Response<Relayed>, hyper::Error> {
    let (mut parts, body) = request.into_parts();
    forwarding::rewrite_request(&mut parts.headers, context.client, &context.client_cert);
    // The backend gets the origin form (`/path?query`) even from a client that sent the
    // absolute form, and HTTP/1.1 framing of hyper's choosing.
    if let Some(origin) = parts.uri.path_and_query() {
        parts.uri = Uri::from(origin.clone());
    }
    parts.version = Version::HTTP_11;
    let sent = tokio::time::timeout(
        context.idle_timeout,
        backends.send(&context.pool, Request::from_parts(parts, body)),
    )
    .await;
    let (response, connection) = match sent {
        Ok(Ok(answer)) => answer,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "HTTP request: no answer from the backend");
            metrics::record_http_request("502");
            return Ok(simple_answer(StatusCode::BAD_GATEWAY));
        }
        Err(_) => {
            metrics::record_http_request("504");
            return Ok(simple_answer(StatusCode::GATEWAY_TIMEOUT));
        }
    };
    metrics::record_http_request("backend");
    let (mut parts, body) = response.into_parts();
    forwarding::drop_connection_specific(&mut parts.headers);
    let give_back = GiveBack {
        backends,
        pool: context.pool.clone(),
        connection,
    };
    let body = if body.is_end_stream() {
        give_back.now();
        Relayed::empty()
    } else {
        Relayed {
            body: Some(body),
            give_back: Some(give_back),
        }
    };
    Ok(Response::from_parts(parts, body))
}

/// A response tlsterm makes itself: a status and no body.
fn simple_answer(status: StatusCode) -> Response<Relayed> {
    let mut response = Response::new(Relayed::empty());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
    response
}

/// A borrowed backend connection and where it goes back.
struct GiveBack {
    backends: Rc<Backends<Incoming>>,
    pool: Arc<BackendPool>,
    connection: Borrowed<Incoming>,
}

impl GiveBack {
    fn now(self) {
        self.backends.give_back(&self.pool, self.connection);
    }
}

/// A backend's response body on its way to the client; its connection goes back to the
/// pool when the body has been read to its end (dropped before: the connection closes,
/// since hyper cannot reuse one whose response is half read).
struct Relayed {
    body: Option<Incoming>,
    give_back: Option<GiveBack>,
}

impl Relayed {
    fn empty() -> Relayed {
        Relayed {
            body: None,
            give_back: None,
        }
    }
}

impl Body for Relayed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = std::task::ready!(Pin::new(&mut *body).poll_frame(cx));
        // hyper stops polling once the body says it has ended (its length reached), so
        // the end is noticed here, not only from a final `None`.
        if frame.is_none() || body.is_end_stream() {
            if let Some(give_back) = self.give_back.take() {
                give_back.now();
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}
