//! The header fields of a request forwarded to a backend as HTTP/1.1, whether it came as
//! HTTP/3, HTTP/2 or HTTP/1.1 over TLS: connection-specific fields dropped both ways (each hop's
//! framing is its own), and the client's own `Forwarded`/`X-Forwarded-*` and
//! `X-Client-Cert-*` replaced by tlsterm's, so that a backend can trust them. `Early-Data`
//! is the exception: it only ever makes a backend more careful, and a client that sends it
//! is an intermediary that forwarded the request in early data itself (RFC 8470 forbids
//! removing it), so it stays, as one `Early-Data: 1`.

use std::net::IpAddr;

use hyper::header::{HeaderName, HeaderValue, CONNECTION, COOKIE, HOST, UPGRADE};
use hyper::{HeaderMap, Uri};

use super::client_cert;

/// Fields that describe one HTTP/1.1 connection, never forwarded either way.
pub const CONNECTION_SPECIFIC: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// Fields tlsterm sets toward the backend. A client's `Early-Data` is dropped as sent and
/// set again as `1` (RFC 8470: several or invalid copies mean `1`).
const FORWARDING: [&str; 4] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-proto",
    "early-data",
];

// The names tlsterm adds, made once: a name given as text is parsed and checked again at
// every insertion.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static EARLY_DATA: HeaderName = HeaderName::from_static("early-data");

/// The client's address and its `X-Forwarded-For` value, written out once per client
/// connection (and again when a QUIC client moves) rather than for each request: formatting
/// an address is a good part of what rewriting a request's fields costs.
#[derive(Clone, Debug)]
pub struct ClientAddress {
    ip: IpAddr,
    value: HeaderValue,
}

impl ClientAddress {
    pub fn new(ip: IpAddr) -> ClientAddress {
        let value =
            HeaderValue::from_str(&ip.to_string()).expect("an address is a valid field value");
        ClientAddress { ip, value }
    }

    pub fn ip(&self) -> IpAddr {
        self.ip
    }
}

/// Whether a field of the client's request says an earlier hop forwarded it in early data;
/// the request then goes on with `Early-Data: 1` (see [`add_forwarding`]).
pub fn marks_early_data(name: &HeaderName) -> bool {
    *name == EARLY_DATA
}

/// A field of the client's request that never reaches the backend as the client sent it.
pub fn dropped_from_request(name: &HeaderName) -> bool {
    let name = name.as_str();
    CONNECTION_SPECIFIC.contains(&name)
        || FORWARDING.contains(&name)
        || name.starts_with(client_cert::PREFIX)
}

/// Removes the connection-specific fields of one HTTP/1.1 hop, and those its `Connection`
/// field names (RFC 9110, 7.6.1).
pub fn drop_connection_specific(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|list| list.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named
        .iter()
        .map(HeaderName::as_str)
        .chain(CONNECTION_SPECIFIC)
    {
        headers.remove(name);
    }
}

/// Adds what the backend is told about the client: its address, that it came over TLS,
/// whether the request may be a replay (`Early-Data: 1`, RFC 8470: forwarded before the
/// client's handshake was confirmed, or marked so by the client; the backend may answer 425
/// Too Early, which goes back to the client as it is), and its verified certificate.
pub fn add_forwarding(
    headers: &mut HeaderMap,
    client: &ClientAddress,
    client_cert: &[(HeaderName, HeaderValue)],
    early: bool,
) {
    headers.insert(&X_FORWARDED_FOR, client.value.clone());
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("https"));
    if early {
        headers.insert(&EARLY_DATA, HeaderValue::from_static("1"));
    }
    for (name, value) in client_cert {
        headers.append(name.clone(), value.clone());
    }
}

/// The client's own forwarding fields and the connection's, replaced by tlsterm's; `early`:
/// the request is forwarded before the client's handshake was confirmed.
pub fn rewrite_request(
    headers: &mut HeaderMap,
    client: &ClientAddress,
    client_cert: &[(HeaderName, HeaderValue)],
    early: bool,
) {
    // Looked for before the connection's fields go: `Connection` may not name it away.
    let early = early || headers.contains_key(&EARLY_DATA);
    drop_connection_specific(headers);
    let theirs: Vec<HeaderName> = headers
        .keys()
        .filter(|name| dropped_from_request(name))
        .cloned()
        .collect();
    for name in theirs {
        headers.remove(name);
    }
    add_forwarding(headers, client, client_cert, early);
}

/// The protocol an HTTP/1.1 message asks to switch to (`Upgrade`, with `upgrade` among its
/// `Connection` options, RFC 9110, 7.8), e.g. `websocket`; `None` for any other message.
pub fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let asked = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|list| list.split(','))
        .any(|option| option.trim().eq_ignore_ascii_case("upgrade"));
    asked.then(|| headers.get(UPGRADE).cloned()).flatten()
}

/// Sets the fields that carry a switch to `protocol` over one hop (after the hop's own
/// fields were dropped).
pub fn keep_upgrade(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, protocol);
}

/// The Cookie field of an HTTP/2 or HTTP/3 request, which those may send in pieces, as the
/// one field HTTP/1.1 wants (RFC 9113, 8.2.3; RFC 9114, 4.2.1); `None` without a piece.
pub fn joined_cookie(pieces: &[&[u8]]) -> Result<Option<HeaderValue>, &'static str> {
    if pieces.is_empty() {
        return Ok(None);
    }
    HeaderValue::from_bytes(&pieces.join(&b"; "[..]))
        .map(Some)
        .map_err(|_| "invalid cookie")
}

/// What an HTTP/2 request's head needs before it goes out as HTTP/1.1: its `:authority`
/// (in `uri`) as the Host field, which must not disagree with a Host field beside it
/// (RFC 9113, 8.3.1: the authority wins), and its Cookie pieces joined.
pub fn http2_fields_as_http11(uri: &Uri, headers: &mut HeaderMap) -> Result<(), &'static str> {
    if let Some(authority) = uri.authority() {
        let host = HeaderValue::from_str(authority.as_str()).map_err(|_| "invalid :authority")?;
        headers.insert(HOST, host);
    }
    if !headers.contains_key(HOST) {
        return Err("no :authority or Host");
    }
    if headers.get_all(COOKIE).iter().nth(1).is_some() {
        let pieces: Vec<&[u8]> = headers
            .get_all(COOKIE)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        let cookie = joined_cookie(&pieces)?;
        headers.remove(COOKIE);
        headers.extend(cookie.map(|cookie| (COOKIE, cookie)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fields` rewritten for the backend (`early`: forwarded before the handshake was
    /// confirmed), sorted.
    fn rewritten(fields: &[(&'static str, &'static str)], early: bool) -> Vec<(String, String)> {
        let mut headers = HeaderMap::new();
        for &(name, value) in fields {
            headers.append(name, HeaderValue::from_static(value));
        }
        let cert = [(
            HeaderName::from_static("x-client-cert-subject"),
            HeaderValue::from_static("CN=alice"),
        )];
        let client = ClientAddress::new("192.0.2.7".parse().unwrap());
        rewrite_request(&mut headers, &client, &cert, early);
        let mut fields: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        fields.sort();
        fields
    }

    /// `pairs` as owned strings, to compare with [`rewritten`].
    fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let owned = pairs.iter().map(|(n, v)| (n.to_string(), v.to_string()));
        owned.collect()
    }

    #[test]
    fn a_request_loses_the_clients_forwarding_and_connection_fields() {
        let sent = [
            ("host", "a.test"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("x-forwarded-for", "10.9.9.9"),
            ("forwarded", "for=10.9.9.9"),
            ("x-client-cert-subject", "CN=mallory"),
            ("te", "trailers"),
            ("x-custom", "kept"),
        ];
        let expected = [
            ("host", "a.test"),
            ("x-client-cert-subject", "CN=alice"),
            ("x-custom", "kept"),
            ("x-forwarded-for", "192.0.2.7"),
            ("x-forwarded-proto", "https"),
        ];
        assert_eq!(rewritten(&sent, false), owned(&expected));
    }

    #[test]
    fn early_data_is_marked_once_whoever_says_so() {
        let host = ("host", "a.test");
        let early_data = |fields: &[(&'static str, &'static str)], early| {
            let fields = rewritten(fields, early);
            let marks = fields.into_iter().filter(|(name, _)| name == "early-data");
            marks.map(|(_, value)| value).collect::<Vec<_>>()
        };
        assert!(early_data(&[host], false).is_empty());
        assert_eq!(early_data(&[host], true), ["1"]);
        // The client's mark stays, as one `1` however it came, even named by `Connection`.
        for sent in [
            &[host, ("early-data", "1")][..],
            &[host, ("early-data", "0"), ("early-data", "1")],
            &[host, ("connection", "early-data"), ("early-data", "1")],
        ] {
            assert_eq!(early_data(sent, false), ["1"], "{sent:?}");
            assert_eq!(early_data(sent, true), ["1"], "{sent:?}");
        }
    }

    /// The fields of an HTTP/2 request's head, as `headers` lists them.
    fn http2_head(uri: &str, fields: &[(&'static str, &'static str)]) -> (Uri, HeaderMap) {
        let mut headers = HeaderMap::new();
        for &(name, value) in fields {
            headers.append(name, HeaderValue::from_static(value));
        }
        (uri.parse().unwrap(), headers)
    }

    #[test]
    fn an_http2_request_gets_its_authority_as_host_and_one_cookie_field() {
        let (uri, mut headers) = http2_head(
            "https://a.test/x",
            &[("host", "other.test"), ("cookie", "a=1"), ("cookie", "b=2")],
        );
        http2_fields_as_http11(&uri, &mut headers).unwrap();
        assert_eq!(headers["host"], "a.test");
        let cookies: Vec<_> = headers.get_all("cookie").iter().collect();
        assert_eq!(cookies, ["a=1; b=2"]);

        // A Host field alone stands; one cookie is left as it came.
        let (uri, mut headers) = http2_head("/x", &[("host", "b.test"), ("cookie", "a=1")]);
        http2_fields_as_http11(&uri, &mut headers).unwrap();
        assert_eq!(headers["host"], "b.test");
        assert_eq!(headers["cookie"], "a=1");

        let (uri, mut headers) = http2_head("/x", &[("cookie", "a=1")]);
        assert_eq!(
            http2_fields_as_http11(&uri, &mut headers),
            Err("no :authority or Host")
        );
    }

    #[test]
    fn an_upgrade_needs_the_connection_option_and_the_protocol() {
        let headers = |fields: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for &(name, value) in fields {
                map.append(name, HeaderValue::from_static(value));
            }
            map
        };
        let asked = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        assert_eq!(upgrade_of(&asked).unwrap(), "websocket");
        assert_eq!(upgrade_of(&headers(&[("upgrade", "websocket")])), None);
        assert_eq!(upgrade_of(&headers(&[("connection", "upgrade")])), None);
    }

    #[test]
    fn a_response_keeps_everything_but_its_hops_fields() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "close"),
            ("transfer-encoding", "chunked"),
            ("keep-alive", "timeout=5"),
            ("content-type", "text/plain"),
            ("x-forwarded-for", "backend's own business"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        drop_connection_specific(&mut headers);
        let mut names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        names.sort();
        assert_eq!(names, ["content-type", "x-forwarded-for"]);
    }
}
