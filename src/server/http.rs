//! `mode = "http"`: an established connection's HTTP/1.1 requests, each forwarded to the
//! backends over the worker's keep-alive connections (hyper on both sides), instead of a
//! backend connection opened, relayed to and closed for every client connection. That
//! connection is most of what a short-lived client connection costs a byte relay beside
//! the handshake (its TCP handshake, the backend's accept, both closes); pooled, it is paid
//! once per many clients.
//!
//! Bodies stream both ways (hyper's flow control; nothing is held whole). A backend
//! connection goes back to the worker's pool once the response body has been read whole.

use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_LENGTH};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::proxy::client_cert::CertFields;
use crate::proxy::forwarding::{self, ClientAddress};
use crate::proxy::http_backend::{Backends, Borrowed};
use crate::proxy::metrics;
use crate::proxy::pool::BackendPool;
use crate::proxy::relay::{RelayEnd, RelayOutcome, Side};

mod activity;
use activity::{Activity, Counted, Watched};

thread_local! {
    /// This worker's idle connections to every `mode = "http"` listener's backends.
    static BACKENDS: Rc<Backends<Incoming>> = Rc::default();
}

/// What every request of one client connection is forwarded with.
pub(super) struct HttpContext {
    /// The backends of the connection's server name.
    pub pool: Arc<BackendPool>,
    pub client: ClientAddress,
    /// The connection's verified client certificate as fields (empty without one).
    pub client_cert: CertFields,
    /// Nothing moving between tlsterm and the client for this long (no request waiting on
    /// the backend) closes the connection; no response head from the backend for this long
    /// answers 504.
    pub idle_timeout: Duration,
}

/// Serves the connection's requests until the client closes it, sends what is not
/// HTTP/1.1, or stalls: no byte either way for `idle_timeout` while no request waits on the
/// backend (an idle keep-alive connection, a client that stopped reading its response or
/// sending its request). Once `stop` turns true, until the request in progress, if any, is
/// answered.
///
/// hyper's connection holds two buffers of 8 KiB and its state, several times what the
/// TLS connection costs: a connection on which nothing has moved for [`PARK_AFTER`]
/// between requests gives them up (hyper's connection ends without closing the stream), and
/// the client's next bytes start a new one.
#[allow(clippy::manual_async_fn)]
pub(super) fn serve<S>(
    stream: S,
    context: HttpContext,
    mut stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = RelayOutcome>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    // Made before the block, which then holds each once: an `async fn` keeps its arguments
    // and what is made of them side by side, for as long as the connection lives.
    let idle_timeout = context.idle_timeout;
    let activity = Rc::new(Activity::new());
    let mut stream = Watched {
        inner: stream,
        unread: Bytes::new(),
        activity: activity.clone(),
    };
    let context = Rc::new(context);
    let backends = BACKENDS.with(Rc::clone);
    async move {
        let end = loop {
            if stream.unread.is_empty() {
                // Parked (or new): nothing of hyper's is held until the client sends more.
                let read = tokio::select! {
                    biased;
                    Ok(_) = stop.wait_for(|stop| *stop) => {
                        super::conn::close_notify(&mut stream).await;
                        break RelayEnd::Closed;
                    }
                    read = stream.read_more() => read,
                    () = activity.stalled(idle_timeout) => break RelayEnd::IdleTimeout,
                };
                match read {
                    Ok(0) => break RelayEnd::Closed,
                    Ok(_) => {}
                    Err(_) => break RelayEnd::Error(Side::Client),
                }
            }
            // Boxed: hyper's connection state is large, and a parked connection keeps none of it.
            let round = Box::pin(serve_requests(
                stream, &context, &backends, &activity, &mut stop,
            ))
            .await;
            match round {
                Ok(parked) => {
                    metrics::record_http_parked();
                    stream = parked;
                }
                Err(end) => break end,
            }
        };
        // The client's plaintext both ways, request and response heads included: what a relay
        // of the same exchange would have counted.
        RelayOutcome {
            to_backend: activity.from_client.get(),
            to_client: activity.to_client.get(),
            end,
        }
    }
}

/// How long nothing moves between requests before a connection gives up hyper's buffers.
/// Long enough that a client sending its requests one after another keeps one hyper
/// connection; short against how long browsers keep idle connections open.
pub(super) const PARK_AFTER: Duration = Duration::from_secs(1);

/// Why hyper's connection was told to finish.
#[derive(PartialEq)]
enum Finish {
    /// Nothing moved for [`PARK_AFTER`] between requests: the stream goes on without it.
    Park,
    /// The process drains: the stream closes after the request in progress.
    Stop,
}

/// Serves requests with one hyper connection until it ends: `Ok` with the stream (and the
/// bytes hyper read but did not use) when it was parked, else how the connection ended.
async fn serve_requests<S>(
    stream: Watched<S>,
    context: &Rc<HttpContext>,
    backends: &Rc<Backends<Incoming>>,
    activity: &Rc<Activity>,
    stop: &mut watch::Receiver<bool>,
) -> Result<Watched<S>, RelayEnd>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let idle_timeout = context.idle_timeout;
    let (context, backends, on_request) = (context.clone(), backends.clone(), activity.clone());
    let service = hyper::service::service_fn(move |request| {
        on_request.requests.set(on_request.requests.get() + 1);
        let in_service = Counted::start(on_request.clone(), |activity| &activity.in_service);
        let answer = forward(
            request,
            context.clone(),
            backends.clone(),
            on_request.clone(),
        );
        Box::pin(async move {
            let mut response = answer.await?;
            response.body_mut().in_service = Some(in_service);
            Ok::<_, hyper::Error>(response)
        })
    });
    let mut connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // A request head sent byte by byte, slowly enough to pass as activity, still ends.
        .header_read_timeout(idle_timeout)
        .serve_connection(TokioIo::new(stream), service);
    let mut finish = None;
    let requests = activity.requests.get();
    let served = loop {
        let why = tokio::select! {
            // The stop first: a response written in the same wake-up as the stop was seen
            // then says `Connection: close`.
            biased;
            Ok(_) = stop.wait_for(|stop| *stop), if finish.is_none() => Finish::Stop,
            served = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => break served,
            () = activity.quiet_between_requests(PARK_AFTER, requests), if finish.is_none() => Finish::Park,
            () = activity.stalled(idle_timeout) => return Err(RelayEnd::IdleTimeout),
        };
        // Idle, hyper's connection ends at once; with a request in progress (only when
        // stopping), once it is answered, with `Connection: close`.
        Pin::new(&mut connection).graceful_shutdown();
        finish = Some(why);
    };
    if let Err(err) = served {
        return Err(end_of(Err(err)));
    }
    let parts = connection.into_parts();
    let mut stream = parts.io.into_inner();
    if !parts.read_buf.is_empty() {
        stream.unread = [parts.read_buf, std::mem::take(&mut stream.unread)]
            .concat()
            .into();
    }
    if finish == Some(Finish::Park) {
        Ok(stream)
    } else {
        // The client closed, or asked for the close, or the process drains.
        super::conn::close_notify(&mut stream).await;
        Err(RelayEnd::Closed)
    }
}

fn end_of(served: Result<(), hyper::Error>) -> RelayEnd {
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
/// streamed back; 502 when no backend answers, 504 when it answers too late, 405 for
/// CONNECT.
async fn forward(
    request: Request<Incoming>,
    context: Rc<HttpContext>,
    backends: Rc<Backends<Incoming>>,
    activity: Rc<Activity>,
) -> Result<Response<Relayed>, hyper::Error> {
    let (mut parts, body) = request.into_parts();
    if parts.method == Method::CONNECT {
        // A tunnel through the backend is not a request to it (a backend that is itself a
        // forward proxy would open it to anywhere).
        metrics::record_http_request("405");
        return Ok(simple_answer(StatusCode::METHOD_NOT_ALLOWED));
    }
    forwarding::rewrite_request(&mut parts.headers, &context.client, &context.client_cert);
    // The backend gets the origin form (`/path?query`) even from a client that sent the
    // absolute form, and HTTP/1.1 framing of hyper's choosing.
    if let Some(origin) = parts.uri.path_and_query() {
        parts.uri = Uri::from(origin.clone());
    }
    parts.version = Version::HTTP_11;
    let waiting = Counted::start(activity, |activity| &activity.waiting);
    let sent = tokio::time::timeout(
        context.idle_timeout,
        backends.send(&context.pool, Request::from_parts(parts, body)),
    )
    .await;
    drop(waiting);
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
            in_service: None,
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
    /// The request counted as being answered until hyper is done with its response.
    in_service: Option<Counted>,
}

impl Relayed {
    fn empty() -> Relayed {
        Relayed {
            body: None,
            give_back: None,
            in_service: None,
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
