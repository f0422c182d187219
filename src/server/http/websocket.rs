//! WebSocket over one stream of an HTTP/2 connection (RFC 8441's extended CONNECT, which
//! browsers use where the server offers it), to a backend that speaks HTTP/1.1's
//! `Upgrade: websocket` (RFC 6455). The two handshakes differ: HTTP/2 has no
//! `Sec-WebSocket-Key`, so tlsterm makes one for the backend and checks the backend's
//! `Sec-WebSocket-Accept` as a client would; the backend's 101 becomes the client's 200.
//! The stream and the backend connection are then relayed byte for byte, the WebSocket
//! frames inside them untouched.

use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::http::{request, response};
use hyper::upgrade::OnUpgrade;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;

use crate::proxy::forwarding;
use crate::proxy::relay;

static SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
static SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// What RFC 6455 appends to the key before hashing it into the accept value.
const ACCEPT_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Whether an HTTP/2 request is an extended CONNECT for a WebSocket.
pub fn asks_websocket<B>(request: &hyper::Request<B>) -> bool {
    request.method() == Method::CONNECT
        && request
            .extensions()
            .get::<hyper::ext::Protocol>()
            .is_some_and(|protocol| protocol.as_str().eq_ignore_ascii_case("websocket"))
}

/// The key tlsterm sent the backend, to check its answer with.
pub struct Key(HeaderValue);

impl Key {
    /// Whether the backend's `Sec-WebSocket-Accept` answers this key.
    pub fn accepted_by(&self, headers: &hyper::HeaderMap) -> bool {
        let expected = accept_for(self.0.as_bytes());
        headers
            .get(&SEC_WEBSOCKET_ACCEPT)
            .is_some_and(|accept| accept.as_bytes() == expected.as_bytes())
    }
}

/// RFC 6455's answer to `key`: the base64 of SHA-1 over the key and the GUID.
fn accept_for(key: &[u8]) -> String {
    let hashed = boring::sha::sha1(&[key, ACCEPT_GUID.as_bytes()].concat());
    boring::base64::encode_block(&hashed)
}

/// Turns an extended CONNECT (its fields already made HTTP/1.1's and tlsterm's) into an
/// HTTP/1.1 GET that asks to switch to WebSocket, with a fresh key, which it returns.
pub fn as_upgrade_request(parts: &mut request::Parts) -> Key {
    parts.method = Method::GET;
    let mut nonce = [0u8; 16];
    boring::rand::rand_bytes(&mut nonce).expect("BoringSSL's generator does not fail");
    let key = HeaderValue::from_str(&boring::base64::encode_block(&nonce))
        .expect("base64 is a valid field value");
    parts.headers.insert(&SEC_WEBSOCKET_KEY, key.clone());
    forwarding::keep_upgrade(&mut parts.headers, HeaderValue::from_static("websocket"));
    Key(key)
}

/// The backend switched: if its 101 answers `key`, the client gets a 200 with the
/// backend's fields (its subprotocol and extensions among them) but those of the HTTP/1.1
/// switch, and the two sides are relayed once hyper has handed both over, with the
/// listener's buffer size and idle timeout; `None` (a 502 for the client) if it does not.
pub fn opened(
    mut response: hyper::Response<Incoming>,
    key: &Key,
    client: OnUpgrade,
    buffer_size: usize,
    idle_timeout: std::time::Duration,
) -> Option<response::Parts> {
    if !key.accepted_by(response.headers()) {
        tracing::debug!("WebSocket over HTTP/2: the backend's accept does not match the key");
        return None;
    }
    let backend = hyper::upgrade::on(&mut response);
    tokio::task::spawn_local(async move {
        let (Ok(client), Ok(backend)) = (client.await, backend.await) else {
            tracing::debug!("WebSocket over HTTP/2: a side closed before it was switched");
            return;
        };
        let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
        relay::relay(&mut client, &mut backend, buffer_size, idle_timeout).await;
    });
    let (mut parts, _) = response.into_parts();
    parts.status = StatusCode::OK;
    forwarding::drop_connection_specific(&mut parts.headers);
    parts.headers.remove(&SEC_WEBSOCKET_ACCEPT);
    Some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_value_is_rfc_6455s() {
        // The example of RFC 6455, section 1.3.
        assert_eq!(
            accept_for(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn an_extended_connect_becomes_a_get_asking_to_switch_with_a_fresh_key() {
        let request = |protocol: Option<&'static str>| {
            let mut request = hyper::Request::connect("https://a.test/chat")
                .body(())
                .unwrap();
            if let Some(protocol) = protocol {
                let protocol = hyper::ext::Protocol::from_static(protocol);
                request.extensions_mut().insert(protocol);
            }
            request
        };
        assert!(!asks_websocket(&request(None)));
        assert!(!asks_websocket(&request(Some("connect-udp"))));
        let websocket = request(Some("websocket"));
        assert!(asks_websocket(&websocket));
        let mut parts = websocket.into_parts().0;
        let key = as_upgrade_request(&mut parts);
        assert_eq!(parts.method, Method::GET);
        assert_eq!(forwarding::upgrade_of(&parts.headers).unwrap(), "websocket");
        let sent = parts.headers[&SEC_WEBSOCKET_KEY].clone();
        assert_eq!(sent.len(), 24, "16 random bytes in base64");
        let other = as_upgrade_request(&mut request(Some("websocket")).into_parts().0);
        assert_ne!(other.0, sent, "a key per request");

        let mut answer = hyper::HeaderMap::new();
        assert!(!key.accepted_by(&answer));
        let accept = accept_for(sent.as_bytes());
        answer.insert(&SEC_WEBSOCKET_ACCEPT, accept.parse().unwrap());
        assert!(key.accepted_by(&answer));
        answer.insert(&SEC_WEBSOCKET_ACCEPT, accept_for(b"other").parse().unwrap());
        assert!(!key.accepted_by(&answer));
    }
}
