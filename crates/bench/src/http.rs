//! Minimal HTTP/1.1 client side: build a GET request, read one response framed by
//! Content-Length (or by the end of the stream when the server closes). And the same GET
//! as HTTP/3 header fields.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Why a response could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum HttpError {
    /// The stream ended before a complete response.
    Eof,
    /// A read failed (reset, TLS alert, ...).
    Read(String),
    /// The response was not parseable HTTP/1.1.
    Parse(&'static str),
}

/// As the report's error counts name it (the first word is the kind).
impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Eof => f.write_str("eof: closed before a complete response"),
            HttpError::Read(e) => write!(f, "read: {e}"),
            HttpError::Parse(e) => write!(f, "http: {e}"),
        }
    }
}

/// One parsed response (the body is counted, not kept).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Body bytes received.
    pub body_len: u64,
    /// Total bytes received for this response, headers included.
    pub wire_len: u64,
    /// The server asked to close (or framed the body by closing).
    pub close: bool,
}

pub fn request(path: &str, host: &str, close: bool) -> Vec<u8> {
    let conn = if close { "close" } else { "keep-alive" };
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tlsterm-bench\r\nConnection: {conn}\r\n\r\n")
        .into_bytes()
}

/// The header fields of an HTTP/3 GET of `path` (`:authority` as HTTP/1.1's `Host`).
pub fn h3_request(path: &str, authority: &str) -> Vec<quiche::h3::Header> {
    [
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", authority),
        (":path", path),
        ("user-agent", "tlsterm-bench"),
    ]
    .iter()
    .map(|(name, value)| quiche::h3::Header::new(name.as_bytes(), value.as_bytes()))
    .collect()
}

/// A reusable read buffer; bytes past the end of one response stay for the next.
pub struct Reader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            buf: vec![0; 64 * 1024],
            start: 0,
            end: 0,
        }
    }
}

impl Reader {
    /// Forget buffered bytes; for a new connection, whose stream they are not part of.
    pub fn reset(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    async fn fill<S: AsyncRead + Unpin>(&mut self, s: &mut S) -> Result<usize, HttpError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            if self.start == 0 {
                return Err(HttpError::Parse("response header too large"));
            }
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        match s.read(&mut self.buf[self.end..]).await {
            Ok(n) => {
                self.end += n;
                Ok(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
            Err(e) => Err(HttpError::Read(e.to_string())),
        }
    }

    /// Read one response from `s`.
    pub async fn read_response<S: AsyncRead + Unpin>(
        &mut self,
        s: &mut S,
    ) -> Result<Response, HttpError> {
        // Headers.
        let header_end = loop {
            if let Some(i) = find(&self.buf[self.start..self.end], b"\r\n\r\n") {
                break self.start + i + 4;
            }
            if self.fill(s).await? == 0 {
                return Err(HttpError::Eof);
            }
        };
        let head = &self.buf[self.start..header_end];
        let (status, length, close) = parse_head(head)?;
        let mut wire = (header_end - self.start) as u64;
        self.start = header_end;

        // Body: count and discard.
        let mut body = 0u64;
        match length {
            Some(len) => {
                while body < len {
                    if self.start == self.end && self.fill(s).await? == 0 {
                        return Err(HttpError::Eof);
                    }
                    let take = ((self.end - self.start) as u64).min(len - body) as usize;
                    self.start += take;
                    body += take as u64;
                }
            }
            None => loop {
                // No Content-Length: the body ends when the server closes.
                body += (self.end - self.start) as u64;
                self.start = self.end;
                if self.fill(s).await? == 0 {
                    break;
                }
            },
        }
        wire += body;
        Ok(Response {
            status,
            body_len: body,
            wire_len: wire,
            close: close || length.is_none(),
        })
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Status, Content-Length and whether the server will close.
fn parse_head(head: &[u8]) -> Result<(u16, Option<u64>, bool), HttpError> {
    let text = std::str::from_utf8(head).map_err(|_| HttpError::Parse("non-UTF-8 header"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Parse("not an HTTP/1.x status line"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(HttpError::Parse("bad status code"))?;
    let mut length = None;
    let mut close = version == "HTTP/1.0";
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse()
                    .map_err(|_| HttpError::Parse("bad Content-Length"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::Parse("chunked responses are not supported"));
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    // 204/304 and 1xx carry no body.
    if status == 204 || status == 304 || (100..200).contains(&status) {
        length = Some(0);
    }
    Ok((status, length, close))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parses_split_responses() {
        let data = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nConnection: close\r\n\r\n";
        // Feed in small pieces to exercise buffering.
        let (mut client, mut server) = tokio::io::duplex(7);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            server.write_all(data).await.unwrap();
        });
        let mut r = Reader::default();
        let a = r.read_response(&mut client).await.unwrap();
        assert_eq!((a.status, a.body_len, a.close), (200, 5, false));
        let b = r.read_response(&mut client).await.unwrap();
        assert_eq!((b.status, b.body_len, b.close), (404, 0, true));
        writer.await.unwrap();
        assert_eq!(
            r.read_response(&mut client).await.unwrap_err(),
            HttpError::Eof
        );
    }
}
