//! The log line of one request of a `mode = "http"` connection (`[log] requests`), written
//! once its answer's head is on its way: who asked what, who answered with which status,
//! and how long it took. The path goes without its query, which may carry credentials
//! (tokens, signatures); what the query said stays out of the log.

use std::time::Instant;

use hyper::header::HOST;
use hyper::{Method, Request, StatusCode};

use super::{ClientHttp, HttpContext};

/// What is logged of a request, taken as it arrives.
pub(super) struct RequestLine {
    started: Instant,
    version: ClientHttp,
    method: Method,
    /// `Host`, or an HTTP/2 request's `:authority`; `-` without either.
    host: String,
    path: String,
    /// Forwarded before the client's handshake was confirmed (0-RTT data).
    early: bool,
}

impl RequestLine {
    pub fn of<B>(request: &Request<B>, context: &HttpContext, version: ClientHttp) -> Self {
        let host = request
            .headers()
            .get(HOST)
            .and_then(|host| host.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()))
            .unwrap_or("-");
        RequestLine {
            started: Instant::now(),
            version,
            method: request.method().clone(),
            host: host.to_string(),
            path: request.uri().path().to_string(),
            early: context.early_data.as_ref().is_some_and(|c| !c.confirmed()),
        }
    }

    /// The line, for an answer from `answered_by` (`backend`, or tlsterm's own status).
    pub fn log(&self, client: std::net::IpAddr, answered_by: &str, status: StatusCode) {
        tracing::info!(
            target: "tlsterm::request",
            %client,
            version = %self.version.label(),
            method = %self.method,
            host = %self.host,
            path = %self.path,
            status = status.as_u16(),
            answered_by = %answered_by,
            head_us = self.started.elapsed().as_micros() as u64,
            early_data = self.early,
            "request"
        );
    }
}
