//! The log line of one forwarded request (`[log] requests`: `mode = "http"` and HTTP/3),
//! written once its answer's head is on its way: who asked what, who answered with which
//! status, and how long it took. The path goes without its query, which may carry
//! credentials (tokens, signatures): what the query said stays out of the log.

use std::net::IpAddr;
use std::time::Instant;

/// What is logged of a request, taken as it arrives.
pub struct RequestLine {
    started: Instant,
    /// The client's HTTP version: `1.1`, `2` or `3`.
    version: &'static str,
    method: String,
    /// `Host`, or the request's `:authority`; `-` without either.
    host: String,
    path: String,
    /// Forwarded before the client's handshake was confirmed (0-RTT data).
    early: bool,
}

impl RequestLine {
    /// A request for `target` (its path, and maybe a query, which is dropped).
    pub fn new(version: &'static str, method: &str, host: &str, target: &str, early: bool) -> Self {
        let path = target.split_once('?').map_or(target, |(path, _)| path);
        RequestLine {
            started: Instant::now(),
            version,
            method: method.to_string(),
            host: host.to_string(),
            path: path.to_string(),
            early,
        }
    }

    /// The line, for an answer from `answered_by` (`backend`, or tlsterm's own status).
    pub fn log(&self, client: IpAddr, answered_by: &str, status: u16) {
        tracing::info!(
            target: "tlsterm::request",
            %client,
            version = %self.version,
            method = %self.method,
            host = %self.host,
            path = %self.path,
            status,
            answered_by = %answered_by,
            head_us = self.started.elapsed().as_micros() as u64,
            early_data = self.early,
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_stays_out() {
        let line = RequestLine::new("3", "GET", "a.test", "/login?token=secret&x=1", false);
        assert_eq!(line.path, "/login");
        assert_eq!(RequestLine::new("2", "GET", "-", "/a/b", true).path, "/a/b");
    }
}
