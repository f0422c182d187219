//! One HTTP/3 request: sent to a backend as HTTP/1.1, and its response handed back to the
//! connection's task piece by piece (head, body chunks, trailers), each waiting for room
//! in a short channel, so a large or slow response is never held whole. The request runs
//! as a future polled by the connection's task among its other requests, not as a task of
//! its own: no task is spawned per request, and a reply wakes no other task.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::HeaderName;
use quiche::h3::{Header, NameValue};
use tokio::sync::{mpsc, watch};

use super::headers::{request_head, ResponseFields};
use super::metrics;
use super::request_body::{Backends, RequestBody};
use super::service::QuicService;
use crate::proxy::client_cert::CertFields;
use crate::proxy::forwarding::{self, ClientAddress};
use crate::proxy::http_backend::Borrowed;
use crate::proxy::pool::BackendPool;
use crate::proxy::request_log::RequestLine;

/// What the request's task tells the connection's task.
pub(super) enum Reply {
    /// The response head; `fin` when no body follows.
    Head {
        fields: ResponseFields,
        fin: bool,
    },
    Data(Bytes),
    /// Trailers, which end the response.
    Trailers(ResponseFields),
    /// The body is complete.
    End,
    /// The backend failed after the head was sent: the stream is reset.
    Abort,
}

/// Replies waiting for the connection's task, per request.
pub(super) const REPLY_QUEUE: usize = 4;

/// What a request needs besides its own fields and body.
pub(super) struct RequestContext {
    pub service: Arc<QuicService>,
    pub backends: Rc<Backends>,
    /// The backends of the connection's server name.
    pub pool: Arc<BackendPool>,
    pub client: ClientAddress,
    /// The connection's verified client certificate as fields (empty without one, or with
    /// `quic_client_cert_headers = false`).
    pub client_cert: CertFields,
    /// Set whenever a reply is queued: the connection's task then writes it out.
    pub replied: Rc<Cell<bool>>,
    /// The request came in 0-RTT data: `Some` until the handshake is confirmed (then
    /// `true`), `None` for a request of an established connection.
    pub early: Option<watch::Receiver<bool>>,
}

/// Forwards one request and streams its response into `replies`; ends early when the
/// connection's task drops its end (the stream was reset or the connection closed).
pub(super) async fn forward(
    fields: Vec<Header>,
    body: RequestBody,
    context: RequestContext,
    replies: mpsc::Sender<Reply>,
) {
    let send = |reply: Reply| {
        let (replies, replied) = (&replies, &context.replied);
        async move {
            let sent = replies.send(reply).await.is_ok();
            replied.set(true);
            sent
        }
    };
    if let Some(confirmed) = &context.early {
        metrics::record_early_request();
        // Only a request without a body goes to the backend before the handshake is
        // confirmed; one with a body waits, so no replayed upload reaches it. A client that
        // never confirms has its connection closed, which ends this task.
        if !body.is_empty() && confirmed.clone().wait_for(|c| *c).await.is_err() {
            return;
        }
    }
    let early = context.early.is_some();
    let mut logged = context
        .service
        .log_requests
        .then(|| request_line(&fields, early));
    // The request's log line, written once the answer (which a body may follow) ends.
    let client_ip = context.client.ip();
    let mut answered = |answer: &'static str, status: u16, body_follows: bool| {
        logged
            .take()
            .map(|line| line.answered(client_ip, answer, status, body_follows))
    };
    let head = match request_head(&fields, &context.client, &context.client_cert, early) {
        Ok(head) => head,
        Err(bad) => {
            tracing::debug!(reason = bad.0, "HTTP/3 request refused");
            drop(answered("400", 400, false));
            send(simple_answer(400)).await;
            return;
        }
    };
    // Sent again once the handshake is confirmed should the backend find it too early
    // (425): a request without a body that tlsterm marked early and no earlier hop had
    // (then the 425 goes back for that hop to act on, as RFC 8470 asks).
    let retry = early && body.is_empty() && !marked_early_before(&fields);
    let request = head.body(body).expect("a head checked field by field");
    let mut answer = ask(&context, request).await;
    if retry && matches!(&answer, Ok((head, _)) if head.status() == 425) {
        let mut confirmed = context.early.clone().expect("a request forwarded early");
        let wait = confirmed.wait_for(|confirmed| *confirmed);
        let in_time = matches!(
            tokio::time::timeout(context.service.backend_timeout, wait).await,
            Ok(Ok(_))
        );
        if in_time {
            if let Ok((response, connection)) = answer {
                if hyper::body::Body::is_end_stream(response.body()) {
                    context.backends.give_back(&context.pool, connection);
                }
            }
            crate::proxy::metrics::record_too_early_retry("3");
            let head = request_head(&fields, &context.client, &context.client_cert, false)
                .expect("the same fields as the first try");
            let request = head.body(RequestBody::empty()).expect("a checked head");
            answer = ask(&context, request).await;
        }
    }
    let (response, connection) = match answer {
        Ok(answer) => answer,
        Err((answer, status)) => {
            metrics::record_backend_error(status);
            drop(answered(answer, status, false));
            send(simple_answer(status)).await;
            return;
        }
    };
    let (parts, mut body) = response.into_parts();
    let fin = hyper::body::Body::is_end_stream(&body);
    let mut log = answered("backend", parts.status.as_u16(), !fin);
    let fields = ResponseFields::new(Some(parts.status.as_u16()), parts.headers);
    if !send(Reply::Head { fields, fin }).await || fin {
        if fin {
            context.backends.give_back(&context.pool, connection);
        }
        return;
    }
    loop {
        let reply = match body.frame().await {
            None => Reply::End,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => continue,
                Ok(data) => {
                    if let Some(log) = log.as_mut() {
                        log.sent(data.len());
                    }
                    Reply::Data(data)
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => Reply::Trailers(ResponseFields::new(None, trailers)),
                    Err(_) => continue,
                },
            },
            Some(Err(err)) => {
                tracing::debug!(error = %err, "backend response ended early");
                send(Reply::Abort).await;
                return;
            }
        };
        let last = matches!(reply, Reply::End | Reply::Trailers(_));
        if !send(reply).await {
            return;
        }
        if last {
            break;
        }
    }
    if let Some(log) = log {
        log.ended();
    }
    context.backends.give_back(&context.pool, connection);
}

/// A backend's answer and the connection it came on, or the answer tlsterm makes itself
/// (as the log line names it, and its status).
type Answer = Result<
    (
        hyper::Response<hyper::body::Incoming>,
        Borrowed<RequestBody>,
    ),
    (&'static str, u16),
>;

/// Sends `request` over one of the worker's connections to the backends; `Err` is
/// tlsterm's own answer: 502 when no backend answers, 504 when none does within the
/// backend timeout.
async fn ask(context: &RequestContext, request: hyper::Request<RequestBody>) -> Answer {
    let sent = tokio::time::timeout(
        context.service.backend_timeout,
        context.backends.send(&context.pool, request),
    )
    .await;
    match sent {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "HTTP/3 request: no answer from the backend");
            Err(("502", 502))
        }
        Err(_) => Err(("504", 504)),
    }
}

/// Whether the client's fields say an earlier hop forwarded the request in early data.
fn marked_early_before(fields: &[Header]) -> bool {
    fields.iter().any(|field| {
        HeaderName::from_bytes(field.name()).is_ok_and(|name| forwarding::marks_early_data(&name))
    })
}

/// What the log line of a request with these fields says of it (`[log] requests`).
fn request_line(fields: &[Header], early: bool) -> RequestLine {
    let field = |wanted: &[u8]| {
        let value = fields
            .iter()
            .find(|f| f.name() == wanted)
            .map(|f| f.value());
        String::from_utf8_lossy(value.unwrap_or(b"-")).into_owned()
    };
    let host = match field(b":authority") {
        authority if authority != "-" => authority,
        _ => field(b"host"),
    };
    RequestLine::new("3", &field(b":method"), &host, &field(b":path"), early)
}

/// A response tlsterm makes itself: a status and no body.
fn simple_answer(status: u16) -> Reply {
    let mut headers = hyper::HeaderMap::new();
    headers.insert(
        hyper::header::CONTENT_LENGTH,
        hyper::header::HeaderValue::from_static("0"),
    );
    Reply::Head {
        fields: ResponseFields::new(Some(status), headers),
        fin: true,
    }
}
