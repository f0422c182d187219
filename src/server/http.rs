//! `mode = "http"`: an established connection's HTTP requests, each forwarded to the
//! backends over the worker's keep-alive connections (hyper on both sides), instead of a
//! backend connection opened, relayed to and closed for every client connection. That
//! connection is most of what a short-lived client connection costs a byte relay beside
//! the handshake (its TCP handshake, the backend's accept, both closes); pooled, it is paid
//! once per many clients.
//!
//! A client that chose HTTP/2 by ALPN (`h2`, where the listener offers it) has its streams'
//! requests forwarded the same way, each on a pooled HTTP/1.1 backend connection while it
//! is answered: the backend never learns HTTP/2.
//!
//! Bodies stream both ways (hyper's flow control; nothing is held whole). A backend
//! connection goes back to the worker's pool once the response body has been read whole.
//! An HTTP/1.1 request that asks to switch protocols (WebSocket) is forwarded with its
//! `Upgrade` (an HTTP/2 client's WebSocket stream is asked the same way: `websocket.rs`);
//! once the backend answers 101, the client's connection and that backend
//! connection are relayed byte for byte, as `mode = "tcp"` relays them.

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Either;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_LENGTH};
use hyper::service::Service;
use hyper::upgrade::OnUpgrade;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::proxy::client_cert::CertFields;
use crate::proxy::forwarding::{self, ClientAddress};
use crate::proxy::http_backend::{Backends, Borrowed};
use crate::proxy::metrics;
use crate::proxy::pool::BackendPool;
use crate::proxy::relay::{self, RelayEnd, RelayOutcome, Side};
use crate::proxy::request_log::{Answering, RequestLine};
use crate::tls::early_data::Confirmation;

mod activity;
mod gather;
mod too_early;
mod websocket;
use activity::{Activity, Counted, Watched};
use gather::Gathered;
use too_early::{Retry, ToBackend};

thread_local! {
    /// This worker's idle connections to every `mode = "http"` listener's backends.
    static BACKENDS: Rc<Backends<ToBackend>> = Rc::default();
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
    /// What a direction of a switched connection (WebSocket) may have in flight.
    pub buffer_size: usize,
    /// The backend's side of a connection that a 101 answer switched to another protocol,
    /// until the client's side is taken back from hyper.
    pub switched: RefCell<Option<OnUpgrade>>,
    /// For a connection that accepted 0-RTT data: whether its handshake is confirmed yet.
    /// A request forwarded before then could be a replay, and says so (`Early-Data: 1`).
    pub early_data: Option<Confirmation>,
    /// One log line per request (`[log] requests`).
    pub log_requests: bool,
}

/// What a connection's requests are served with.
struct Served {
    context: Rc<HttpContext>,
    /// The worker's backend connections.
    backends: Rc<Backends<ToBackend>>,
    /// What moves on the connection, and when.
    activity: Rc<Activity>,
}

/// The HTTP version the client speaks on a connection, as ALPN chose it (HTTP/1.1 without
/// ALPN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClientHttp {
    Http1,
    Http2,
}

impl ClientHttp {
    pub fn of_alpn(alpn: Option<&[u8]>) -> ClientHttp {
        if alpn == Some(b"h2") {
            ClientHttp::Http2
        } else {
            ClientHttp::Http1
        }
    }

    /// As the `version` label of the request counter.
    fn label(self) -> &'static str {
        match self {
            ClientHttp::Http1 => "1.1",
            ClientHttp::Http2 => "2",
        }
    }
}

/// Serves the connection's requests until the client closes it, sends what is not
/// HTTP (of the version ALPN chose), or stalls: no byte either way for `idle_timeout` while
/// no request waits on the backend (an idle keep-alive connection, a client that stopped
/// reading its response or sending its request). Once `stop` turns true, until the
/// requests in progress, if any, are answered (HTTP/2: a GOAWAY tells the client first).
///
/// hyper's HTTP/1.1 connection holds two buffers of 8 KiB and its state, several times what
/// the TLS connection costs: a connection on which nothing has moved for [`PARK_AFTER`]
/// between requests gives them up (hyper's connection ends without closing the stream), and
/// the client's next bytes start a new one. An HTTP/2 connection keeps hyper's for its
/// life: its streams have no common point between requests to stop at.
#[allow(clippy::manual_async_fn)]
pub(super) fn serve<S>(
    stream: S,
    context: HttpContext,
    version: ClientHttp,
    mut stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = RelayOutcome>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    // Made before the block, which then holds each once: an `async fn` keeps its arguments
    // and what is made of them side by side, for as long as the connection lives.
    let activity = Rc::new(Activity::new());
    let stream = Watched {
        inner: stream,
        unread: Bytes::new(),
        activity: activity.clone(),
    };
    let served = Served {
        context: Rc::new(context),
        backends: BACKENDS.with(Rc::clone),
        activity,
    };
    async move {
        let end = match version {
            // Boxed as the HTTP/1.1 rounds are: the connection task stays small.
            ClientHttp::Http2 => Box::pin(serve_http2(stream, &served, &mut stop)).await,
            ClientHttp::Http1 => serve_http1(stream, &served, &mut stop).await,
        };
        // The client's plaintext both ways, request and response heads included: what a relay
        // of the same exchange would have counted.
        RelayOutcome {
            to_backend: served.activity.from_client.get(),
            to_client: served.activity.to_client.get(),
            end,
        }
    }
}

/// Serves HTTP/1.1 requests with one hyper connection after another, parked in between
/// (holding nothing of hyper's) while the client sends nothing; how the connection ended.
async fn serve_http1<S>(
    mut stream: Watched<S>,
    served: &Served,
    stop: &mut watch::Receiver<bool>,
) -> RelayEnd
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let Served {
        context, activity, ..
    } = served;
    loop {
        if stream.unread.is_empty() {
            // Parked (or new): nothing of hyper's is held until the client sends more.
            let read = tokio::select! {
                biased;
                Ok(_) = stop.wait_for(|stop| *stop) => {
                    super::conn::close_notify(&mut stream).await;
                    return RelayEnd::Closed;
                }
                read = stream.read_more() => read,
                () = activity.stalled(context.idle_timeout) => return RelayEnd::IdleTimeout,
            };
            match read {
                Ok(0) => return RelayEnd::Closed,
                Ok(_) => {}
                Err(_) => return RelayEnd::Error(Side::Client),
            }
        }
        // Boxed: hyper's connection state is large, and a parked connection keeps none of it.
        let round = Box::pin(serve_requests(stream, served, stop)).await;
        match round {
            Round::Parked(parked) => {
                metrics::record_http_parked();
                stream = parked;
            }
            Round::Switched(mut stream, backend) => {
                // From here on bytes, as a `mode = "tcp"` connection relays them.
                let Ok(backend) = backend.await else {
                    return RelayEnd::Error(Side::Backend);
                };
                let mut backend = TokioIo::new(backend);
                let (buffer, idle) = (context.buffer_size, context.idle_timeout);
                return relay::relay(&mut stream, &mut backend, buffer, idle)
                    .await
                    .end;
            }
            Round::Ended(end) => return end,
        }
    }
}

/// How one hyper HTTP/1.1 connection over the client's stream ended.
enum Round<S> {
    /// Nothing moved for [`PARK_AFTER`] between requests: the stream goes on without it.
    Parked(Watched<S>),
    /// A 101 answer switched the connection to another protocol (WebSocket): the client's
    /// stream, and the backend's once hyper hands it over.
    Switched(Watched<S>, OnUpgrade),
    Ended(RelayEnd),
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

/// Serves requests with one hyper connection until it ends: with the stream (and the bytes
/// hyper read but did not use) when it was parked or switched, else how the connection
/// ended.
async fn serve_requests<S>(
    stream: Watched<S>,
    served: &Served,
    stop: &mut watch::Receiver<bool>,
) -> Round<S>
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let Served {
        context, activity, ..
    } = served;
    let idle_timeout = context.idle_timeout;
    let service = forwarding_service(served, ClientHttp::Http1);
    let mut connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        // A request head sent byte by byte, slowly enough to pass as activity, still ends.
        .header_read_timeout(idle_timeout)
        .serve_connection(TokioIo::new(stream), service);
    let mut finish = None;
    let requests = activity.requests.get();
    let ended = loop {
        let why = tokio::select! {
            // The stop first: a response written in the same wake-up as the stop was seen
            // then says `Connection: close`.
            biased;
            Ok(_) = stop.wait_for(|stop| *stop), if finish.is_none() => Finish::Stop,
            ended = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => break ended,
            () = activity.quiet_between_requests(PARK_AFTER, requests), if finish.is_none() => Finish::Park,
            () = activity.stalled(idle_timeout) => return Round::Ended(RelayEnd::IdleTimeout),
        };
        // Idle, hyper's connection ends at once; with a request in progress (only when
        // stopping), once it is answered, with `Connection: close`.
        Pin::new(&mut connection).graceful_shutdown();
        finish = Some(why);
    };
    if let Err(err) = ended {
        return Round::Ended(end_of(Err(err)));
    }
    let parts = connection.into_parts();
    let mut stream = parts.io.into_inner();
    if !parts.read_buf.is_empty() {
        stream.unread = [parts.read_buf, std::mem::take(&mut stream.unread)]
            .concat()
            .into();
    }
    if let Some(backend) = context.switched.borrow_mut().take() {
        return Round::Switched(stream, backend);
    }
    if finish == Some(Finish::Park) {
        Round::Parked(stream)
    } else {
        // The client closed, or asked for the close, or the process drains.
        super::conn::close_notify(&mut stream).await;
        Round::Ended(RelayEnd::Closed)
    }
}

/// Streams one client opens at once on an HTTP/2 connection (what HAProxy and nginx allow,
/// about): each may hold a backend connection while it is answered.
const HTTP2_MAX_STREAMS: u32 = 100;

/// The header fields of one HTTP/2 request, at most (HPACK-decoded size): as much as an
/// HTTP/1.1 request head may bring through hyper's buffer.
const HTTP2_MAX_HEADER_LIST: u32 = 64 * 1024;

/// What a stream's response may have waiting for the client's flow control, at most: with
/// [`HTTP2_MAX_STREAMS`] open, 6.4 MiB a connection (hyper's own default is 400 KiB a
/// stream). Past it the backend's response is read no further until the client takes it.
const HTTP2_SEND_BUFFER: usize = 64 * 1024;

/// Serves an HTTP/2 connection's streams until the client closes it (or stalls, as over
/// HTTP/1.1); `stop` sends a GOAWAY and ends it once the streams already open are answered.
/// hyper's writes between two flushes leave as one TLS record ([`Gathered`]).
async fn serve_http2<S>(
    stream: Watched<S>,
    served: &Served,
    stop: &mut watch::Receiver<bool>,
) -> RelayEnd
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let Served {
        context, activity, ..
    } = served;
    let service = forwarding_service(served, ClientHttp::Http2);
    let connection = hyper::server::conn::http2::Builder::new(OnThisWorker)
        .timer(TokioTimer::new())
        .max_concurrent_streams(HTTP2_MAX_STREAMS)
        .max_header_list_size(HTTP2_MAX_HEADER_LIST)
        .max_send_buf_size(HTTP2_SEND_BUFFER)
        // WebSocket over a stream (RFC 8441): browsers use it where it is offered.
        .enable_connect_protocol()
        .serve_connection(TokioIo::new(Gathered::new(stream)), service);
    let mut connection = std::pin::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            biased;
            Ok(_) = stop.wait_for(|stop| *stop), if !stopping => {
                connection.as_mut().graceful_shutdown();
                stopping = true;
            }
            ended = connection.as_mut() => return end_of(ended),
            () = activity.stalled(context.idle_timeout) => return RelayEnd::IdleTimeout,
        }
    }
}

/// Runs the tasks hyper starts for an HTTP/2 connection's streams on the worker's own
/// thread, beside the connection (they share its `Rc`s).
#[derive(Clone, Copy)]
struct OnThisWorker;

impl<F> hyper::rt::Executor<F> for OnThisWorker
where
    F: std::future::Future + 'static,
{
    fn execute(&self, task: F) {
        tokio::task::spawn_local(task);
    }
}

/// A request's answer on its way.
type Answer = Pin<Box<dyn std::future::Future<Output = Result<Response<Relayed>, hyper::Error>>>>;

/// The service hyper calls for each request of a connection: the request forwarded, and
/// counted in `activity` while it is read, waits on the backend and is answered.
fn forwarding_service(
    served: &Served,
    version: ClientHttp,
) -> impl Service<Request<Incoming>, Response = Response<Relayed>, Error = hyper::Error, Future = Answer>
{
    let (context, backends, on_request) = (
        served.context.clone(),
        served.backends.clone(),
        served.activity.clone(),
    );
    hyper::service::service_fn(move |request| {
        on_request.requests.set(on_request.requests.get() + 1);
        let in_service = Counted::start(on_request.clone(), |activity| &activity.in_service);
        let answer = forward(
            request,
            context.clone(),
            backends.clone(),
            on_request.clone(),
            version,
        );
        Box::pin(async move {
            let mut response = answer.await?;
            response.body_mut().in_service = Some(in_service);
            Ok::<_, hyper::Error>(response)
        }) as Answer
    })
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
/// CONNECT (but for HTTP/2's WebSocket), 400 for an HTTP/2 request HTTP/1.1 cannot carry.
async fn forward(
    mut request: Request<Incoming>,
    context: Rc<HttpContext>,
    backends: Rc<Backends<ToBackend>>,
    activity: Rc<Activity>,
    version: ClientHttp,
) -> Result<Response<Relayed>, hyper::Error> {
    // Before the client's handshake is confirmed, the request could be a replay.
    let early = context.early_data.as_ref().is_some_and(|c| !c.confirmed());
    let mut logged = context
        .log_requests
        .then(|| request_line(&request, version, early));
    // Counts the request by who answered it; its log line is written once the answer
    // returned (which a body may follow) ends.
    let client_ip = context.client.ip();
    let mut answered = |answer: &'static str, status: StatusCode, body_follows: bool| {
        metrics::record_http_request(version.label(), answer);
        logged
            .take()
            .map(|line| line.answered(client_ip, answer, status.as_u16(), body_follows))
    };
    // tlsterm's own answer: a status, no body.
    let mut refuse = |answer: &'static str, status: StatusCode| {
        drop(answered(answer, status, false));
        simple_answer(status)
    };
    // HTTP/2's WebSocket (extended CONNECT): the client's side of its stream, once hyper
    // hands it over.
    let websocket_client = (version == ClientHttp::Http2 && websocket::asks_websocket(&request))
        .then(|| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    if parts.method == Method::CONNECT && websocket_client.is_none() {
        // A tunnel through the backend is not a request to it (a backend that is itself a
        // forward proxy would open it to anywhere).
        return Ok(refuse("405", StatusCode::METHOD_NOT_ALLOWED));
    }
    if version == ClientHttp::Http2 {
        if let Err(why) = forwarding::http2_fields_as_http11(&parts.uri, &mut parts.headers) {
            tracing::debug!(why, "HTTP/2 request refused");
            return Ok(refuse("400", StatusCode::BAD_REQUEST));
        }
    }
    // HTTP/1.1's switch to another protocol (WebSocket) is asked of the backend too; HTTP/2
    // asks for its WebSocket with an extended CONNECT instead (below).
    let upgrade = match version {
        ClientHttp::Http1 => forwarding::upgrade_of(&parts.headers),
        ClientHttp::Http2 => None,
    };
    if early {
        metrics::record_http_early_request(version.label());
    }
    let switch = upgrade.is_some() || websocket_client.is_some();
    let retry = Retry::of(&parts, early, body.is_end_stream(), switch);
    for_backend(&mut parts, &context, early);
    if let Some(protocol) = &upgrade {
        forwarding::keep_upgrade(&mut parts.headers, protocol.clone());
    }
    // An HTTP/2 client's WebSocket asks the backend as an HTTP/1.1 client's does.
    let websocket =
        websocket_client.map(|client| (websocket::as_upgrade_request(&mut parts), client));
    let request = Request::from_parts(parts, Either::Left(body));
    let (mut response, mut connection) = match ask(&backends, &context, &activity, request).await {
        Ok(answer) => answer,
        Err((answer, status)) => return Ok(refuse(answer, status)),
    };
    if let Some(retry) = retry.filter(|_| response.status() == StatusCode::TOO_EARLY) {
        let confirmation = context
            .early_data
            .as_ref()
            .expect("a request forwarded early");
        // The client's Finished is waited for no longer than a backend's answer.
        if tokio::time::timeout(context.idle_timeout, confirmation.wait())
            .await
            .is_ok()
        {
            if response.body().is_end_stream() {
                backends.give_back(&context.pool, connection);
            }
            metrics::record_too_early_retry(version.label());
            let mut parts = retry.into_parts();
            for_backend(&mut parts, &context, false);
            let request = Request::from_parts(parts, Retry::body());
            (response, connection) = match ask(&backends, &context, &activity, request).await {
                Ok(answer) => answer,
                Err((answer, status)) => return Ok(refuse(answer, status)),
            };
        }
    }
    let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    // The backend connection is the switched connection's now, never the pool's.
    if let Some((key, client)) = websocket.filter(|_| switching) {
        drop(connection);
        let (buffer, idle) = (context.buffer_size, context.idle_timeout);
        // Counted and logged as the client sees it: a 200, or tlsterm's 502 when the
        // backend's accept does not answer the key.
        let Some(head) = websocket::opened(response, &key, client, buffer, idle) else {
            return Ok(refuse("502", StatusCode::BAD_GATEWAY));
        };
        drop(answered("backend", head.status, false));
        return Ok(Response::from_parts(head, Relayed::empty()));
    }
    if switching && upgrade.is_some() {
        drop(answered("backend", response.status(), false));
        drop(connection);
        return Ok(switched(response, &context));
    }
    let body_follows = !response.body().is_end_stream();
    let log = answered("backend", response.status(), body_follows);
    let (mut parts, body) = response.into_parts();
    forwarding::drop_connection_specific(&mut parts.headers);
    let give_back = GiveBack {
        backends,
        pool: context.pool.clone(),
        connection,
    };
    let body = if body_follows {
        Relayed {
            body: Some(body),
            give_back: Some(give_back),
            in_service: None,
            log,
        }
    } else {
        give_back.now();
        Relayed::empty()
    };
    Ok(Response::from_parts(parts, body))
}

/// Rewrites a request's head for the backend: tlsterm's forwarding fields (and the
/// early-data mark for a request forwarded `early`), the origin form of its target
/// (`/path?query`, even from a client that sent the absolute form), and HTTP/1.1 (whose
/// framing hyper chooses).
fn for_backend(parts: &mut hyper::http::request::Parts, context: &HttpContext, early: bool) {
    forwarding::rewrite_request(
        &mut parts.headers,
        &context.client,
        &context.client_cert,
        early,
    );
    if let Some(origin) = parts.uri.path_and_query() {
        parts.uri = Uri::from(origin.clone());
    }
    parts.version = Version::HTTP_11;
}

/// Sends `request` over one of the worker's connections to the backends; `Err` is
/// tlsterm's own answer: 502 when no backend answers, 504 when none does within
/// `idle_timeout`.
async fn ask(
    backends: &Backends<ToBackend>,
    context: &HttpContext,
    activity: &Rc<Activity>,
    request: Request<ToBackend>,
) -> Result<(Response<Incoming>, Borrowed<ToBackend>), (&'static str, StatusCode)> {
    let waiting = Counted::start(activity.clone(), |activity| &activity.waiting);
    let sent =
        tokio::time::timeout(context.idle_timeout, backends.send(&context.pool, request)).await;
    drop(waiting);
    match sent {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "HTTP request: no answer from the backend");
            Err(("502", StatusCode::BAD_GATEWAY))
        }
        Err(_) => Err(("504", StatusCode::GATEWAY_TIMEOUT)),
    }
}

/// What the log line of `request` says of it (`[log] requests`); `early`: it came before
/// the client's handshake was confirmed.
fn request_line<B>(request: &Request<B>, version: ClientHttp, early: bool) -> RequestLine {
    let host = request
        .headers()
        .get(hyper::header::HOST)
        .and_then(|host| host.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or("-");
    let (method, path) = (request.method().as_str(), request.uri().path());
    RequestLine::new(version.label(), method, host, path, early)
}

/// The backend's 101 answer, on its way to the client: the backend's side of the connection
/// is kept for when hyper has written it and hands the client's side back.
fn switched(mut response: Response<Incoming>, context: &HttpContext) -> Response<Relayed> {
    *context.switched.borrow_mut() = Some(hyper::upgrade::on(&mut response));
    let protocol = forwarding::upgrade_of(response.headers());
    let (mut parts, _) = response.into_parts();
    forwarding::drop_connection_specific(&mut parts.headers);
    if let Some(protocol) = protocol {
        forwarding::keep_upgrade(&mut parts.headers, protocol);
    }
    Response::from_parts(parts, Relayed::empty())
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
    backends: Rc<Backends<ToBackend>>,
    pool: Arc<BackendPool>,
    connection: Borrowed<ToBackend>,
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
    /// The request's log line, written when the body ends or is dropped before.
    log: Option<Answering>,
}

impl Relayed {
    fn empty() -> Relayed {
        Relayed {
            body: None,
            give_back: None,
            in_service: None,
            log: None,
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
        let ended = frame.is_none() || body.is_end_stream();
        let data = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref());
        if let (Some(log), Some(data)) = (self.log.as_mut(), data) {
            log.sent(data.len());
        }
        if ended {
            if let Some(give_back) = self.give_back.take() {
                give_back.now();
            }
            if let Some(log) = self.log.take() {
                log.ended();
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
