//! The log line of one forwarded request (`[log] requests`: `mode = "http"` and HTTP/3),
//! written once its answer has ended (or stopped short): who asked what, who answered with
//! which status, how long the head and the whole answer took, and how many body bytes went
//! to the client. The path goes without its query, which may carry credentials (tokens,
//! signatures): what the query said stays out of the log.

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

    /// The request is answered by `answered_by` (`backend`, or tlsterm's own status) with
    /// `status`, and a body follows the head if `body_follows`: the line is written when
    /// the answer that follows is dropped, ended or not.
    pub fn answered(
        self,
        client: IpAddr,
        answered_by: &'static str,
        status: u16,
        body_follows: bool,
    ) -> Answering {
        Answering {
            head_us: self.started.elapsed().as_micros() as u64,
            line: self,
            client,
            answered_by,
            status,
            bytes: 0,
            complete: !body_follows,
        }
    }
}

/// A request's answer on its way to the client, for its log line.
pub struct Answering {
    line: RequestLine,
    client: IpAddr,
    answered_by: &'static str,
    status: u16,
    head_us: u64,
    /// Body bytes handed on toward the client.
    bytes: u64,
    /// The answer's body reached its end (or it had none).
    complete: bool,
}

impl Answering {
    /// `bytes` more of the body go to the client.
    pub fn sent(&mut self, bytes: usize) {
        self.bytes += bytes as u64;
    }

    /// The body has ended: its whole length went to the client.
    pub fn ended(mut self) {
        self.complete = true;
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let line = &self.line;
        tracing::info!(
            target: "tlsterm::request",
            client = %self.client,
            version = %line.version,
            method = %line.method,
            host = %line.host,
            path = %line.path,
            status = self.status,
            answered_by = %self.answered_by,
            head_us = self.head_us,
            total_us = line.started.elapsed().as_micros() as u64,
            bytes = self.bytes,
            complete = self.complete,
            early_data = line.early,
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

    #[test]
    fn an_answer_is_complete_once_its_body_ended() {
        let client = IpAddr::from([127, 0, 0, 1]);
        let line = || RequestLine::new("2", "GET", "a.test", "/", false);
        let headless = line().answered(client, "502", 502, false);
        assert!(headless.complete, "no body: complete at once");
        let mut streamed = line().answered(client, "backend", 200, true);
        assert!(!streamed.complete, "dropped before its end: cut short");
        streamed.sent(1000);
        streamed.sent(24);
        assert_eq!((streamed.bytes, streamed.status), (1024, 200));
        streamed.ended();
    }
}
