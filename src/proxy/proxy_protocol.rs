//! The PROXY protocol (haproxy.org/download/2.9/doc/proxy-protocol.txt), versions 1 and 2:
//! the encoder tlsterm uses towards backends, and a decoder (for the built-in backend,
//! tests and fuzzing).

mod decode;
mod encode;

pub use decode::{decode, may_be_header, DecodeError, ProxyHeader, SslTlv, Tlv};
pub use encode::{encode_v1, encode_v2};

pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// TLV types (section 2.2).
pub const PP2_TYPE_ALPN: u8 = 0x01;
pub const PP2_TYPE_AUTHORITY: u8 = 0x02;
pub const PP2_TYPE_SSL: u8 = 0x20;
pub const PP2_SUBTYPE_SSL_VERSION: u8 = 0x21;
pub const PP2_SUBTYPE_SSL_CIPHER: u8 = 0x23;
pub const PP2_SUBTYPE_SSL_SIG_ALG: u8 = 0x24;
pub const PP2_SUBTYPE_SSL_KEY_ALG: u8 = 0x25;
pub const PP2_SUBTYPE_SSL_CN: u8 = 0x22;
pub const PP2_CLIENT_SSL: u8 = 0x01;
pub const PP2_CLIENT_CERT_CONN: u8 = 0x02;
pub const PP2_CLIENT_CERT_SESS: u8 = 0x04;
/// tlsterm's custom TLVs (the range 0xE0-0xEF is reserved for applications): the verified
/// client certificate's subject (an RFC 4514 string), its subject alternative names (one
/// TLV per name, `DNS:`/`IP:`/`email:`/`URI:` prefixed; the TLV's length delimits it, so
/// a comma in a name is only a comma) and SHA-256 fingerprint (hex).
pub const PP2_TYPE_TLSTERM_CLIENT_SUBJECT: u8 = 0xE0;
pub const PP2_TYPE_TLSTERM_CLIENT_SAN: u8 = 0xE1;
pub const PP2_TYPE_TLSTERM_CLIENT_SHA256: u8 = 0xE2;
/// Present when client-certificate fields were too long to send whole: its value lists
/// their types (one byte each: [`PP2_TYPE_TLSTERM_CLIENT_SUBJECT`] or [`PP2_SUBTYPE_SSL_CN`]
/// left out; [`PP2_TYPE_TLSTERM_CLIENT_SAN`]: names left out from there on). A value is
/// sent whole or not at all.
pub const PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE: u8 = 0xE4;
/// Present (value `0x01`) when the connection began with TLS 1.3 early data: its first
/// bytes reached tlsterm before the handshake completed and may be a replay (RFC 8470
/// tells an HTTP backend what not to do with such a request).
pub const PP2_TYPE_TLSTERM_EARLY_DATA: u8 = 0xE3;
/// Which client-certificate policy the connection was verified under: the first name of
/// the `[[listener.server_name]]` whose own policy applied (lower case, as in the
/// configuration), or empty for the listener's. With a backend shared by several
/// policies (allowed with PROXY v2 only), this, not the AUTHORITY TLV, says how much the
/// client certificate was checked.
pub const PP2_TYPE_TLSTERM_CLIENT_POLICY: u8 = 0xE5;

/// A client certificate that BoringSSL verified against `client_ca`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientIdentity {
    pub common_name: Option<String>,
    pub subject: String,
    pub san: Vec<String>,
    pub sha256_hex: String,
}

/// What the backend is told about a TLS connection (v2 only; v1 carries addresses alone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsDetails {
    pub alpn: Option<Vec<u8>>,
    /// The AUTHORITY TLV: the name as it selected the connection's settings (lower case,
    /// without a trailing dot).
    pub sni: Option<String>,
    pub version: String,
    pub cipher: String,
    pub key_alg: Option<String>,
    pub client_cert: Option<ClientIdentity>,
    /// The client sent 0-RTT data that tlsterm accepted.
    pub early_data: bool,
    /// The session was resumed: a client certificate, if any, was presented on the
    /// connection that made the session, not on this one.
    pub resumed: bool,
    /// [`PP2_TYPE_TLSTERM_CLIENT_POLICY`]; not sent when `None`.
    pub client_policy: Option<String>,
}

#[cfg(test)]
mod tests;
