//! A real HTTP/1.1 backend for the tests of forwarded requests (HTTP/3, `mode = "http"`):
//! it echoes a request's body and shows what it received as `x-seen-*` response headers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;

/// What the client sends with `-body-bytes n`: byte i is i mod 251.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

pub fn hex_sha256(data: &[u8]) -> String {
    boring::sha::sha256(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What one echo backend has seen, and what lets the requests it holds go. Each backend has
/// its own, so that tests running side by side do not see each other's requests.
#[derive(Default)]
pub struct Echo {
    accepted: AtomicUsize,
    waiting: AtomicUsize,
    /// The paths of the requests received, in order, each with its `Early-Data` header
    /// (empty without one).
    received: Mutex<Vec<(String, String)>>,
    release: Notify,
}

impl Echo {
    /// Connections accepted.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Requests to `/wait` being held.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Answers the requests to `/wait` being held.
    pub fn release_waiting(&self) {
        self.release.notify_waiters();
    }

    /// The `Early-Data` header (empty without one) of each request for `path` received.
    pub fn received(&self, path: &str) -> Vec<String> {
        let received = self.received.lock().unwrap();
        received
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, early)| early.clone())
            .collect()
    }
}

/// Echoes a request: its body back, and what it saw as `x-seen-*` headers. A request to
/// `/wait` is answered once the test releases it, one to `/never` never; one for a path
/// that starts with `/too-early` is refused with 425 Too Early while it carries
/// `Early-Data: 1` (as a backend does for what it must not act on twice).
async fn echo(
    request: Request<Incoming>,
    state: Arc<Echo>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if request.uri().path() == "/never" {
        std::future::pending::<()>().await;
    }
    if request.uri().path() == "/wait" {
        let released = state.release.notified();
        state.waiting.fetch_add(1, Ordering::SeqCst);
        released.await;
    }
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let seen = |name: &str| {
        parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap_or("?").to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    state
        .received
        .lock()
        .unwrap()
        .push((parts.uri.path().to_string(), seen("early-data")));
    if parts.uri.path().starts_with("/too-early") && seen("early-data") == "1" {
        let too_early = Response::builder()
            .status(425)
            .header("x-seen-early-data", "1");
        return Ok(too_early.body(Full::default()).unwrap());
    }
    let mut response = Response::builder()
        .header("x-seen-method", parts.method.as_str())
        .header("x-seen-path", parts.uri.to_string())
        .header("x-seen-version", format!("{:?}", parts.version))
        .header("x-seen-body-len", body.len().to_string());
    for name in [
        "host",
        "x-forwarded-for",
        "x-forwarded-proto",
        "forwarded",
        "x-custom",
        "x-client-cert-subject",
        "x-client-cert-san",
        "x-client-cert-sha256",
        "early-data",
        "cookie",
    ] {
        response = response.header(format!("x-seen-{name}"), seen(name));
    }
    Ok(response.body(Full::new(body)).unwrap())
}

/// A real HTTP/1.1 backend on a free port, serving `echo` until the test ends.
pub async fn echo_backend() -> SocketAddr {
    echo_backend_watched().await.0
}

/// `echo_backend`, and what it sees.
pub async fn echo_backend_watched() -> (SocketAddr, Arc<Echo>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let state = Arc::new(Echo::default());
    let seen = state.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            seen.accepted.fetch_add(1, Ordering::SeqCst);
            let per_request = seen.clone();
            let service =
                hyper::service::service_fn(move |request| echo(request, per_request.clone()));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (address, state)
}
