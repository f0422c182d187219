//! The admin listener: plain HTTP (on loopback by default) with `/metrics` (Prometheus
//! text format) and `/healthz` (503 once stopping). HTTP parsing is hyper's: malformed requests get its 400.
//! It is bounded: [`MAX_CONNECTIONS`] at once, [`HEADER_TIMEOUT`] to send headers, 64 KiB
//! of them.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Set once the process stops accepting (SIGTERM): `/healthz` then says so, while the
/// admin listener, on its own thread, goes on answering through the drain.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// The process has stopped accepting connections and drains the open ones.
pub fn set_stopping() {
    STOPPING.store(true, Ordering::Relaxed);
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .expect("valid response")
}

async fn route(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Ok(respond(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n"));
    }
    Ok(match request.uri().path() {
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            super::render(),
        ),
        "/healthz" if STOPPING.load(Ordering::Relaxed) => {
            respond(StatusCode::SERVICE_UNAVAILABLE, TEXT, "stopping\n")
        }
        "/healthz" => respond(StatusCode::OK, TEXT, "ok\n"),
        _ => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /metrics or /healthz\n",
        ),
    })
}

/// Connections served at once; a new one beyond this closes the oldest (an idle client
/// cannot keep a scrape out).
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of a request hyper buffers (its headers): beyond, a 431 and the end.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The admin listener, bound and not serving yet.
pub struct Admin {
    listener: std::net::TcpListener,
}

/// Binds the admin address now, so that a conflict is reported at start.
pub fn bind(address: SocketAddr) -> anyhow::Result<Admin> {
    let listener = crate::sys::listening_socket(address, false).map_err(|e| {
        anyhow::anyhow!(
            "cannot bind admin address {address}: {e} (set [admin] address, or enabled = false)"
        )
    })?;
    if !address.ip().is_loopback() {
        tracing::warn!(%address, "the admin listener is not on loopback: /metrics (listeners, clients' TLS versions, load) is open, without authentication, to whoever can reach this address");
    }
    Ok(Admin { listener })
}

impl Admin {
    /// Serves on a thread of its own ("admin"), so that neither a burst of clients nor a
    /// slow scrape delays the main thread's signal handling (reload, stop), nor a reload a
    /// scrape.
    pub fn start(self) -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = self.listener;
        std::thread::Builder::new()
            .name("admin".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => serve(listener).await,
                        Err(err) => tracing::error!(error = %err, "admin listener not served"),
                    }
                })
            })?;
        Ok(())
    }
}

async fn serve(listener: TcpListener) {
    // Open connections, oldest first; dropping a sender ends its connection.
    let open: Arc<Mutex<BTreeMap<u64, oneshot::Sender<()>>>> = Arc::default();
    for id in 0u64.. {
        let stream = loop {
            match listener.accept().await {
                Ok((stream, _)) => break stream,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let (close, closed) = oneshot::channel();
        {
            let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
            if open.len() >= MAX_CONNECTIONS {
                open.pop_first();
            }
            open.insert(id, close);
        }
        let open = open.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(route);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_REQUEST_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = closed => {}
            }
            open.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        });
    }
}
