//! The admin listener: plain HTTP on loopback with `/metrics` (Prometheus text format)
//! and `/healthz`. HTTP parsing is hyper's: malformed requests get its 400.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

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
        "/healthz" => respond(StatusCode::OK, TEXT, "ok\n"),
        _ => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /metrics or /healthz\n",
        ),
    })
}

/// Binds the admin address now (so a conflict is reported at start) and returns the task.
pub async fn bind(address: SocketAddr) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let listener = TcpListener::bind(address).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot bind admin address {address}: {e} (set [admin] address, or enabled = false)"
        )
    })?;
    Ok(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(route);
                let _ = hyper::server::conn::http1::Builder::new()
                    .max_buf_size(64 * 1024)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
