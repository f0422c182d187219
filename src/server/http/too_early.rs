//! A second try for a request the backend refused as too early (RFC 8470's 425): one that
//! tlsterm forwarded before the client's handshake was confirmed, marked `Early-Data: 1`,
//! is sent again without the mark once the handshake is confirmed, so the client gets the
//! backend's real answer without a round trip of its own. The RFC lets an intermediary do
//! so unless the request already carried `Early-Data` when it arrived (then an earlier hop
//! forwarded it early, and the 425 goes back for that hop to act on). A request with a body
//! is not tried again (its body is gone to the first try, and tlsterm keeps no copy), nor
//! one that asked to switch protocols.

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::http::request;
use hyper::{HeaderMap, Method, Request, Uri};

use crate::proxy::forwarding;

/// A request body on its way to a backend: the client's, or none (a second try).
pub type ToBackend = Either<Incoming, Empty<Bytes>>;

/// What a second try of a request sends: its head as the client sent it (HTTP/2's fields
/// already made HTTP/1.1's), before tlsterm's rewriting marked it early.
pub struct Retry {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl Retry {
    /// The second try of a request forwarded `early`, if it may have one: `bodiless`, and
    /// asking for no switch of protocols.
    pub fn of(parts: &request::Parts, early: bool, bodiless: bool, switch: bool) -> Option<Retry> {
        let marked_before = parts.headers.keys().any(forwarding::marks_early_data);
        (early && bodiless && !switch && !marked_before).then(|| Retry {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
        })
    }

    /// The head to rewrite for the backend as any request's, now after the handshake.
    pub fn into_parts(self) -> request::Parts {
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.method = self.method;
        parts.uri = self.uri;
        parts.headers = self.headers;
        parts
    }

    /// The body of the second try: none.
    pub fn body() -> ToBackend {
        Either::Right(Empty::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bodiless_request_that_tlsterm_forwarded_early_is_tried_again() {
        let parts = |marked: bool| {
            let mut request = Request::get("/a?b").header("host", "a.test");
            if marked {
                request = request.header("early-data", "1");
            }
            request.body(()).unwrap().into_parts().0
        };
        let retry = Retry::of(&parts(false), true, true, false).expect("a second try");
        let again = retry.into_parts();
        assert_eq!(
            (again.method, again.uri.to_string()),
            (Method::GET, "/a?b".into())
        );
        assert_eq!(again.headers["host"], "a.test");
        assert!(
            Retry::of(&parts(false), false, true, false).is_none(),
            "not early"
        );
        assert!(
            Retry::of(&parts(false), true, false, false).is_none(),
            "a body"
        );
        assert!(
            Retry::of(&parts(false), true, true, true).is_none(),
            "a switch"
        );
        assert!(
            Retry::of(&parts(true), true, true, false).is_none(),
            "marked by a hop"
        );
    }
}
