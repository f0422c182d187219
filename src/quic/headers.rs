//! HTTP/3 header fields to an HTTP/1.1 request and back: pseudo-headers to the request
//! line and Host, connection-specific fields dropped (HTTP/3 has none, HTTP/1.1 framing is
//! hyper's), the client's own `Forwarded`/`X-Forwarded-*` and `X-Client-Cert-*` replaced
//! by tlsterm's, a client's `Early-Data` kept as one `Early-Data: 1`.

use hyper::header::{HeaderName, HeaderValue, COOKIE, HOST};
use hyper::{HeaderMap, Method, Request, Uri};
use quiche::h3::{Header, NameValue};

use crate::proxy::forwarding::{self, ClientAddress, CONNECTION_SPECIFIC};

/// Why a request cannot be forwarded (answered 400).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BadRequest(pub &'static str);

/// The HTTP/1.1 request head for an HTTP/3 request's header fields, from a client at
/// `client` whose verified certificate, if any, is `client_cert`; `early`: the request
/// came in 0-RTT data, which an attacker may have replayed, and the backend is told so
/// with `Early-Data: 1` (RFC 8470; it may answer 425 Too Early). The body is added by the
/// caller.
pub(super) fn request_head(
    fields: &[Header],
    client: &ClientAddress,
    client_cert: &[(HeaderName, HeaderValue)],
    early: bool,
) -> Result<hyper::http::request::Builder, BadRequest> {
    let (mut method, mut path, mut authority) = (None, None, None);
    let mut headers = HeaderMap::new();
    let mut cookies: Vec<&[u8]> = Vec::new();
    let mut early = early;
    for field in fields {
        let (name, value) = (field.name(), field.value());
        match name {
            b":method" => method = Some(value),
            b":path" => path = Some(value),
            b":authority" => authority = Some(value),
            b":scheme" | b":protocol" => {}
            _ if name.starts_with(b":") => return Err(BadRequest("unknown pseudo-header")),
            b"cookie" => cookies.push(value),
            _ => {
                let name =
                    HeaderName::from_bytes(name).map_err(|_| BadRequest("invalid field name"))?;
                early |= forwarding::marks_early_data(&name);
                if forwarding::dropped_from_request(&name) {
                    continue;
                }
                let value = HeaderValue::from_bytes(value)
                    .map_err(|_| BadRequest("invalid field value"))?;
                headers.append(name, value);
            }
        }
    }
    let method = Method::from_bytes(method.ok_or(BadRequest("no :method"))?)
        .map_err(|_| BadRequest("invalid :method"))?;
    if method == Method::CONNECT {
        return Err(BadRequest("CONNECT is not forwarded"));
    }
    let path = Uri::try_from(path.ok_or(BadRequest("no :path"))?)
        .map_err(|_| BadRequest("invalid :path"))?;
    if let Some(authority) = authority {
        // :authority is the request's host; a Host field beside it must not disagree.
        let host =
            HeaderValue::from_bytes(authority).map_err(|_| BadRequest("invalid :authority"))?;
        headers.insert(HOST, host);
    }
    if !headers.contains_key(HOST) {
        return Err(BadRequest("no :authority or Host"));
    }
    if let Some(cookie) = forwarding::joined_cookie(&cookies).map_err(BadRequest)? {
        headers.insert(COOKIE, cookie);
    }
    forwarding::add_forwarding(&mut headers, client, client_cert, early);
    let mut builder = Request::builder().method(method).uri(path);
    if let Some(map) = builder.headers_mut() {
        *map = headers;
    }
    Ok(builder)
}

/// The HTTP/3 fields of a backend's response head (or, without a status, its trailers).
/// A response head (or trailers) as the backend sent it, handed to quiche as borrowed
/// fields: no copy of each name and value (two allocations per field) on the way.
pub(super) struct ResponseFields {
    /// The status as three ASCII digits; `None` for trailers.
    status: Option<[u8; 3]>,
    headers: HeaderMap,
}

/// One field borrowed from a [`ResponseFields`].
pub(super) struct Field<'a>(&'a [u8], &'a [u8]);

impl NameValue for Field<'_> {
    fn name(&self) -> &[u8] {
        self.0
    }

    fn value(&self) -> &[u8] {
        self.1
    }
}

impl ResponseFields {
    /// A head with `status` (100-999), or trailers with `None`.
    pub(super) fn new(status: Option<u16>, headers: HeaderMap) -> ResponseFields {
        let status = status.map(|s| {
            let s = s.clamp(100, 999);
            [
                b'0' + (s / 100) as u8,
                b'0' + (s / 10 % 10) as u8,
                b'0' + (s % 10) as u8,
            ]
        });
        ResponseFields { status, headers }
    }

    /// The fields in order: `:status` first, then the headers less the connection-specific
    /// ones.
    pub(super) fn fields(&self) -> Vec<Field<'_>> {
        let mut fields = Vec::with_capacity(self.headers.len() + 1);
        if let Some(status) = &self.status {
            fields.push(Field(b":status", status));
        }
        for (name, value) in &self.headers {
            if !CONNECTION_SPECIFIC.contains(&name.as_str()) {
                fields.push(Field(name.as_str().as_bytes(), value.as_bytes()));
            }
        }
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(list: &[(&str, &str)]) -> Vec<Header> {
        list.iter()
            .map(|(n, v)| Header::new(n.as_bytes(), v.as_bytes()))
            .collect()
    }

    #[test]
    fn pseudo_headers_become_the_request_line_and_host() {
        let request = request_head(
            &fields(&[
                (":method", "POST"),
                (":scheme", "https"),
                (":authority", "example.com"),
                (":path", "/upload?x=1"),
                ("cookie", "a=1"),
                ("cookie", "b=2"),
                ("x-forwarded-for", "6.6.6.6"),
                ("forwarded", "for=6.6.6.6"),
                ("connection", "close"),
                ("content-type", "text/plain"),
                ("x-client-cert-subject", "CN=forged"),
                ("x-client-cert-anything", "forged"),
            ]),
            &ClientAddress::new("192.0.2.7".parse().unwrap()),
            &[(
                HeaderName::from_static("x-client-cert-subject"),
                HeaderValue::from_static("CN=alice"),
            )],
            false,
        )
        .unwrap()
        .body(())
        .unwrap();
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri(), "/upload?x=1");
        let h = request.headers();
        assert_eq!(h["host"], "example.com");
        assert_eq!(h["cookie"], "a=1; b=2");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert!(h.get("forwarded").is_none() && h.get("connection").is_none());
        assert_eq!(h["content-type"], "text/plain");
        let subjects: Vec<_> = h.get_all("x-client-cert-subject").iter().collect();
        assert_eq!(subjects, ["CN=alice"], "tlsterm's, never the client's");
        assert!(h.get("x-client-cert-anything").is_none());
        assert!(h.get("early-data").is_none());
    }

    #[test]
    fn a_request_from_early_data_says_so_as_does_one_a_client_marked() {
        let request = |early_data: &[&'static str]| {
            let mut pairs = vec![
                (":method", "GET"),
                (":authority", "example.com"),
                (":path", "/"),
            ];
            pairs.extend(early_data.iter().map(|value| ("early-data", *value)));
            fields(&pairs)
        };
        let client = ClientAddress::new("192.0.2.7".parse().unwrap());
        let early_data = |fields: &[Header], early| {
            let head = request_head(fields, &client, &[], early).unwrap();
            let head = head.body(()).unwrap();
            let values = head.headers().get_all("early-data").iter();
            values
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(early_data(&request(&[]), true), ["1"]);
        assert!(early_data(&request(&[]), false).is_empty());
        // Any copy the client sent, even invalid or several, is one `Early-Data: 1`.
        for sent in [&["1"][..], &["0"], &["1", "yes"]] {
            assert_eq!(early_data(&request(sent), false), ["1"], "{sent:?}");
            assert_eq!(early_data(&request(sent), true), ["1"], "{sent:?}");
        }
    }

    #[test]
    fn a_request_without_what_http1_needs_is_refused() {
        let client = &ClientAddress::new("::1".parse().unwrap());
        let no_path = fields(&[(":method", "GET"), (":authority", "a")]);
        assert_eq!(
            request_head(&no_path, client, &[], false).err(),
            Some(BadRequest("no :path"))
        );
        let no_host = fields(&[(":method", "GET"), (":path", "/")]);
        assert_eq!(
            request_head(&no_host, client, &[], false).err(),
            Some(BadRequest("no :authority or Host"))
        );
        let connect = fields(&[(":method", "CONNECT"), (":authority", "a:1")]);
        assert!(request_head(&connect, client, &[], false).is_err());
    }

    #[test]
    fn response_fields_start_with_the_status_and_drop_connection_fields() {
        let mut headers = HeaderMap::new();
        headers.insert("content-length", HeaderValue::from_static("5"));
        headers.insert("connection", HeaderValue::from_static("keep-alive"));
        headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        let head = ResponseFields::new(Some(200), headers.clone());
        let out = head.fields();
        let names: Vec<&[u8]> = out.iter().map(|f| f.name()).collect();
        assert_eq!(names, [&b":status"[..], b"content-length"]);
        assert_eq!(out[0].value(), b"200");
        assert_eq!(
            ResponseFields::new(Some(404), HeaderMap::new()).fields()[0].value(),
            b"404"
        );
        // Trailers have no status.
        let trailers = ResponseFields::new(None, headers);
        let fields = trailers.fields();
        let names: Vec<&[u8]> = fields.iter().map(|f| f.name()).collect();
        assert_eq!(names, [&b"content-length"[..]]);
    }
}
