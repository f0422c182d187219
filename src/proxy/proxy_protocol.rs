//! The PROXY protocol (haproxy.org/download/2.9/doc/proxy-protocol.txt), versions 1 and 2:
//! the encoder tlsterm uses towards backends, and a decoder (for the built-in backend,
//! tests and fuzzing).

use std::net::{IpAddr, SocketAddr};

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
    pub sni: Option<String>,
    pub version: String,
    pub cipher: String,
    pub key_alg: Option<String>,
    pub client_cert: Option<ClientIdentity>,
    /// The client sent 0-RTT data that tlsterm accepted.
    pub early_data: bool,
}

/// Encodes a version 1 header: one text line.
pub fn encode_v1(source: SocketAddr, destination: SocketAddr) -> Vec<u8> {
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => format!(
            "PROXY TCP4 {s} {d} {} {}\r\n",
            source.port(),
            destination.port()
        ),
        (IpAddr::V6(s), IpAddr::V6(d)) => format!(
            "PROXY TCP6 {s} {d} {} {}\r\n",
            source.port(),
            destination.port()
        ),
        // Mixed families cannot be expressed: the specification's UNKNOWN form.
        _ => "PROXY UNKNOWN\r\n".to_string(),
    }
    .into_bytes()
}

/// The longest value tlsterm puts in one TLV, and the most bytes of subject alternative
/// names it sends. Every value it sends is short except those taken from a client
/// certificate (subject, CN, names), which the client controls in part; bounding them keeps
/// the whole header far below the 64 KiB the length field allows.
pub const MAX_TLV_VALUE: usize = 4096;

/// ALPN and SNI, at most 255 bytes in TLS: never cut in practice, only bounded here so
/// that the header's size does not rest on the TLS library alone.
fn capped(value: &[u8]) -> &[u8] {
    &value[..value.len().min(MAX_TLV_VALUE)]
}

/// Whether a client-certificate field can be sent whole; if not, `kind` joins `incomplete`.
fn fits(value: &str, kind: u8, incomplete: &mut Vec<u8>) -> bool {
    let fits = value.len() <= MAX_TLV_VALUE;
    if !fits {
        incomplete.push(kind);
    }
    fits
}

fn push_tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    let len = u16::try_from(value.len()).expect("TLV values are bounded by construction");
    out.push(kind);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value);
}

/// Encodes a version 2 header (binary) with ALPN, authority and SSL TLVs.
pub fn encode_v2(source: SocketAddr, destination: SocketAddr, tls: &TlsDetails) -> Vec<u8> {
    let mut body = Vec::with_capacity(128);
    let family = match (source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            body.extend_from_slice(&s.ip().octets());
            body.extend_from_slice(&d.ip().octets());
            body.extend_from_slice(&s.port().to_be_bytes());
            body.extend_from_slice(&d.port().to_be_bytes());
            0x11 // TCP over IPv4
        }
        _ => {
            let v6 = |a: SocketAddr| match a.ip() {
                IpAddr::V4(ip) => ip.to_ipv6_mapped(),
                IpAddr::V6(ip) => ip,
            };
            body.extend_from_slice(&v6(source).octets());
            body.extend_from_slice(&v6(destination).octets());
            body.extend_from_slice(&source.port().to_be_bytes());
            body.extend_from_slice(&destination.port().to_be_bytes());
            0x21 // TCP over IPv6
        }
    };
    if let Some(alpn) = &tls.alpn {
        push_tlv(&mut body, PP2_TYPE_ALPN, capped(alpn));
    }
    if let Some(sni) = &tls.sni {
        push_tlv(&mut body, PP2_TYPE_AUTHORITY, capped(sni.as_bytes()));
    }
    // Client-certificate fields too long to send whole, by type.
    let mut incomplete = Vec::new();
    let common_name = tls
        .client_cert
        .as_ref()
        .and_then(|c| c.common_name.as_ref())
        .filter(|cn| fits(cn, PP2_SUBTYPE_SSL_CN, &mut incomplete));
    if let Some(client) = &tls.client_cert {
        if fits(
            &client.subject,
            PP2_TYPE_TLSTERM_CLIENT_SUBJECT,
            &mut incomplete,
        ) {
            push_tlv(
                &mut body,
                PP2_TYPE_TLSTERM_CLIENT_SUBJECT,
                client.subject.as_bytes(),
            );
        }
        let mut budget = MAX_TLV_VALUE;
        for name in &client.san {
            if name.len() > budget {
                incomplete.push(PP2_TYPE_TLSTERM_CLIENT_SAN);
                break;
            }
            budget -= name.len();
            push_tlv(&mut body, PP2_TYPE_TLSTERM_CLIENT_SAN, name.as_bytes());
        }
        push_tlv(
            &mut body,
            PP2_TYPE_TLSTERM_CLIENT_SHA256,
            client.sha256_hex.as_bytes(),
        );
        if !incomplete.is_empty() {
            push_tlv(&mut body, PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE, &incomplete);
        }
    }
    if tls.early_data {
        push_tlv(&mut body, PP2_TYPE_TLSTERM_EARLY_DATA, &[1]);
    }
    let client_bits = match tls.client_cert {
        Some(_) => PP2_CLIENT_SSL | PP2_CLIENT_CERT_CONN,
        None => PP2_CLIENT_SSL,
    };
    let mut ssl = vec![client_bits];
    // `verify` is zero only for a presented and verified client certificate.
    let verify: u32 = if tls.client_cert.is_some() { 0 } else { 1 };
    ssl.extend_from_slice(&verify.to_be_bytes());
    push_tlv(&mut ssl, PP2_SUBTYPE_SSL_VERSION, tls.version.as_bytes());
    if let Some(cn) = common_name {
        push_tlv(&mut ssl, PP2_SUBTYPE_SSL_CN, cn.as_bytes());
    }
    push_tlv(&mut ssl, PP2_SUBTYPE_SSL_CIPHER, tls.cipher.as_bytes());
    if let Some(key_alg) = &tls.key_alg {
        push_tlv(&mut ssl, PP2_SUBTYPE_SSL_KEY_ALG, key_alg.as_bytes());
    }
    push_tlv(&mut body, PP2_TYPE_SSL, &ssl);

    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(0x21); // version 2, command PROXY
    out.push(family);
    // Addresses, ALPN and SNI (255 bytes each at most in TLS), subject and CN of at most
    // MAX_TLV_VALUE bytes each, names of at most MAX_TLV_VALUE bytes together (with a
    // 3-byte TLV header each, and each at least 4 bytes long) and short constants: well
    // under 64 KiB.
    let len = u16::try_from(body.len()).expect("capped TLVs keep the header under 64 KiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// One type-length-value entry: (type, value).
pub type Tlv = (u8, Vec<u8>);

/// The PP2_TYPE_SSL value, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SslTlv {
    /// PP2_CLIENT_* bits.
    pub client: u8,
    /// Zero only for a verified client certificate.
    pub verify: u32,
    pub subtlvs: Vec<Tlv>,
}

impl SslTlv {
    pub fn get(&self, kind: u8) -> Option<&[u8]> {
        self.subtlvs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| v.as_slice())
    }
}

/// A decoded header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyHeader {
    pub version: u8,
    /// `None` for UNKNOWN (v1) or LOCAL / unspecified family (v2).
    pub source: Option<SocketAddr>,
    pub destination: Option<SocketAddr>,
    /// v2 TLVs in order: (type, value).
    pub tlvs: Vec<Tlv>,
}

impl ProxyHeader {
    /// The first TLV of type `kind`.
    pub fn tlv(&self, kind: u8) -> Option<&[u8]> {
        self.all_tlvs(kind).next()
    }

    /// Every TLV of type `kind`, in order (e.g. the client's subject alternative names).
    pub fn all_tlvs(&self, kind: u8) -> impl Iterator<Item = &[u8]> {
        self.tlvs
            .iter()
            .filter(move |(k, _)| *k == kind)
            .map(|(_, v)| v.as_slice())
    }

    /// Sub-TLVs of PP2_TYPE_SSL, after its `client` byte and `verify` field.
    pub fn ssl(&self) -> Option<SslTlv> {
        let ssl = self.tlv(PP2_TYPE_SSL)?;
        if ssl.len() < 5 {
            return None;
        }
        Some(SslTlv {
            client: ssl[0],
            verify: u32::from_be_bytes(ssl[1..5].try_into().ok()?),
            subtlvs: parse_tlvs(&ssl[5..]).ok()?,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// More bytes are needed.
    Incomplete,
    Invalid(&'static str),
}

fn parse_tlvs(mut data: &[u8]) -> Result<Vec<Tlv>, DecodeError> {
    let mut tlvs = Vec::new();
    while !data.is_empty() {
        if data.len() < 3 {
            return Err(DecodeError::Invalid("truncated TLV header"));
        }
        let len = u16::from_be_bytes([data[1], data[2]]) as usize;
        let value = data
            .get(3..3 + len)
            .ok_or(DecodeError::Invalid("TLV longer than header"))?;
        tlvs.push((data[0], value.to_vec()));
        data = &data[3 + len..];
    }
    Ok(tlvs)
}

/// Decodes a header at the start of `data`; returns it and the bytes it took.
pub fn decode(data: &[u8]) -> Result<(ProxyHeader, usize), DecodeError> {
    if data.len() >= 12 && data[..12] == V2_SIGNATURE {
        return decode_v2(data);
    }
    let prefix_len = data.len().min(V2_SIGNATURE.len());
    if data[..prefix_len] == V2_SIGNATURE[..prefix_len] && prefix_len < 12 {
        return Err(DecodeError::Incomplete);
    }
    decode_v1(data)
}

fn decode_v1(data: &[u8]) -> Result<(ProxyHeader, usize), DecodeError> {
    // A v1 line is at most 107 bytes including CRLF.
    let window = &data[..data.len().min(107)];
    if !b"PROXY ".starts_with(&window[..window.len().min(6)]) {
        return Err(DecodeError::Invalid("not a PROXY header"));
    }
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        return if data.len() >= 107 {
            Err(DecodeError::Invalid("v1 line too long"))
        } else {
            Err(DecodeError::Incomplete)
        };
    };
    let line =
        std::str::from_utf8(&window[..end]).map_err(|_| DecodeError::Invalid("not ASCII"))?;
    let fields: Vec<&str> = line.split(' ').collect();
    let header = match fields.as_slice() {
        ["PROXY", "UNKNOWN", ..] => ProxyHeader {
            version: 1,
            source: None,
            destination: None,
            tlvs: Vec::new(),
        },
        ["PROXY", proto @ ("TCP4" | "TCP6"), src, dst, sport, dport] => {
            let ip = |s: &str| {
                s.parse::<IpAddr>()
                    .map_err(|_| DecodeError::Invalid("bad address"))
            };
            let port = |s: &str| {
                s.parse::<u16>()
                    .map_err(|_| DecodeError::Invalid("bad port"))
            };
            let (src, dst) = (ip(src)?, ip(dst)?);
            if (*proto == "TCP4") != (src.is_ipv4() && dst.is_ipv4()) {
                return Err(DecodeError::Invalid("address family mismatch"));
            }
            ProxyHeader {
                version: 1,
                source: Some(SocketAddr::new(src, port(sport)?)),
                destination: Some(SocketAddr::new(dst, port(dport)?)),
                tlvs: Vec::new(),
            }
        }
        _ => return Err(DecodeError::Invalid("malformed v1 line")),
    };
    Ok((header, end + 2))
}

fn decode_v2(data: &[u8]) -> Result<(ProxyHeader, usize), DecodeError> {
    if data.len() < 16 {
        return Err(DecodeError::Incomplete);
    }
    let ver_cmd = data[12];
    if ver_cmd >> 4 != 2 {
        return Err(DecodeError::Invalid("unsupported version"));
    }
    let command = ver_cmd & 0x0f;
    if command > 1 {
        return Err(DecodeError::Invalid("unknown command"));
    }
    let family = data[13];
    let len = u16::from_be_bytes([data[14], data[15]]) as usize;
    let body = data.get(16..16 + len).ok_or(DecodeError::Incomplete)?;
    let (addresses, rest) = match family {
        0x11 if body.len() >= 12 => {
            let ip = |b: &[u8]| IpAddr::from(<[u8; 4]>::try_from(b).expect("4 bytes"));
            let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
            (
                Some((
                    SocketAddr::new(ip(&body[0..4]), port(&body[8..10])),
                    SocketAddr::new(ip(&body[4..8]), port(&body[10..12])),
                )),
                &body[12..],
            )
        }
        0x21 if body.len() >= 36 => {
            let ip = |b: &[u8]| IpAddr::from(<[u8; 16]>::try_from(b).expect("16 bytes"));
            let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
            (
                Some((
                    SocketAddr::new(ip(&body[0..16]), port(&body[32..34])),
                    SocketAddr::new(ip(&body[16..32]), port(&body[34..36])),
                )),
                &body[36..],
            )
        }
        0x11 | 0x21 => return Err(DecodeError::Invalid("address block too short")),
        // UNSPEC or a family we do not decode (UNIX, UDP): skip the addresses, no TLVs.
        _ => (None, &body[body.len()..]),
    };
    let addresses = if command == 0 { None } else { addresses };
    Ok((
        ProxyHeader {
            version: 2,
            source: addresses.map(|a| a.0),
            destination: addresses.map(|a| a.1),
            tlvs: parse_tlvs(rest)?,
        },
        16 + len,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_matches_the_specification_text() {
        let header = encode_v1(addr("192.168.0.1:56324"), addr("192.168.0.11:443"));
        assert_eq!(header, b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n");
        let v6 = encode_v1(addr("[::1]:1"), addr("[::1]:2"));
        assert_eq!(v6, b"PROXY TCP6 ::1 ::1 1 2\r\n");
    }

    #[test]
    fn v2_round_trip_with_tlvs() {
        let tls = TlsDetails {
            alpn: Some(b"h2".to_vec()),
            sni: Some("example.com".into()),
            version: "TLSv1.3".into(),
            cipher: "TLS_AES_128_GCM_SHA256".into(),
            key_alg: Some("RSA2048".into()),
            client_cert: None,
            early_data: true,
        };
        let bytes = encode_v2(addr("10.0.0.1:1234"), addr("10.0.0.2:443"), &tls);
        assert_eq!(&bytes[..12], &V2_SIGNATURE);
        assert_eq!(bytes[12], 0x21);
        assert_eq!(bytes[13], 0x11);
        let (header, used) = decode(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(header.source, Some(addr("10.0.0.1:1234")));
        assert_eq!(header.tlv(PP2_TYPE_ALPN), Some(&b"h2"[..]));
        assert_eq!(header.tlv(PP2_TYPE_AUTHORITY), Some(&b"example.com"[..]));
        assert_eq!(header.tlv(PP2_TYPE_TLSTERM_EARLY_DATA), Some(&[1u8][..]));
        let ssl = header.ssl().unwrap();
        assert_eq!(ssl.client, PP2_CLIENT_SSL);
        assert_ne!(ssl.verify, 0);
        assert_eq!(ssl.get(PP2_SUBTYPE_SSL_VERSION), Some(&b"TLSv1.3"[..]));
    }

    #[test]
    fn oversized_client_certificate_fields_are_left_out_and_marked() {
        let huge = "x".repeat(70_000);
        let tls = TlsDetails {
            alpn: Some(vec![b'a'; 255]),
            sni: Some("s".repeat(255)),
            version: "TLSv1.3".into(),
            cipher: "TLS_AES_128_GCM_SHA256".into(),
            key_alg: None,
            client_cert: Some(ClientIdentity {
                common_name: Some(huge.clone()),
                subject: huge.clone(),
                san: vec![huge.clone(), huge],
                sha256_hex: "00".repeat(32),
            }),
            early_data: false,
        };
        let bytes = encode_v2(addr("[::1]:1"), addr("[::1]:2"), &tls);
        let (header, used) = decode(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(header.tlv(PP2_TYPE_TLSTERM_EARLY_DATA), None);
        // Left out rather than cut, and said so.
        assert_eq!(header.tlv(PP2_TYPE_TLSTERM_CLIENT_SUBJECT), None);
        assert_eq!(header.ssl().unwrap().get(PP2_SUBTYPE_SSL_CN), None);
        assert_eq!(header.tlv(PP2_TYPE_TLSTERM_CLIENT_SAN), None);
        assert_eq!(
            header.tlv(PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE),
            Some(
                &[
                    PP2_SUBTYPE_SSL_CN,
                    PP2_TYPE_TLSTERM_CLIENT_SUBJECT,
                    PP2_TYPE_TLSTERM_CLIENT_SAN
                ][..]
            )
        );
    }

    #[test]
    fn each_subject_alternative_name_is_a_tlv_of_its_own() {
        let names = |header: &ProxyHeader| -> Vec<Vec<u8>> {
            header
                .all_tlvs(PP2_TYPE_TLSTERM_CLIENT_SAN)
                .map(<[u8]>::to_vec)
                .collect()
        };
        let uri = "URI:https://x,DNS:admin.internal".to_string();
        let mut tls = TlsDetails {
            client_cert: Some(ClientIdentity {
                common_name: Some("alice".into()),
                subject: "CN=alice\\,O=Admin".into(),
                san: vec![uri.clone(), "DNS:alice.test".into()],
                sha256_hex: "00".repeat(32),
            }),
            ..TlsDetails::default()
        };
        let bytes = encode_v2(addr("10.0.0.1:1"), addr("10.0.0.2:2"), &tls);
        let (header, _) = decode(&bytes).unwrap();
        assert_eq!(names(&header), [uri.as_bytes(), b"DNS:alice.test"]);
        assert_eq!(header.tlv(PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE), None);

        // The names that fit in MAX_TLV_VALUE bytes go; the rest is said to be missing.
        let long = format!("DNS:{}", "a".repeat(3000));
        let client = tls.client_cert.as_mut().unwrap();
        client.san = vec![long.clone(), long.clone(), "DNS:b.test".into()];
        let bytes = encode_v2(addr("10.0.0.1:1"), addr("10.0.0.2:2"), &tls);
        let (header, _) = decode(&bytes).unwrap();
        assert_eq!(names(&header), [long.as_bytes()]);
        assert_eq!(
            header.tlv(PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE),
            Some(&[PP2_TYPE_TLSTERM_CLIENT_SAN][..])
        );
        assert_eq!(
            header.tlv(PP2_TYPE_TLSTERM_CLIENT_SUBJECT),
            Some(&b"CN=alice\\,O=Admin"[..])
        );
    }

    #[test]
    fn partial_input_is_incomplete_not_invalid() {
        let bytes = encode_v2(addr("[::1]:1"), addr("[::1]:2"), &TlsDetails::default());
        for cut in 0..bytes.len() {
            assert_eq!(
                decode(&bytes[..cut]).unwrap_err(),
                DecodeError::Incomplete,
                "cut {cut}"
            );
        }
        let line = encode_v1(addr("1.2.3.4:5"), addr("6.7.8.9:10"));
        for cut in 0..line.len() {
            assert_eq!(decode(&line[..cut]).unwrap_err(), DecodeError::Incomplete);
        }
    }

    #[test]
    fn garbage_is_invalid() {
        assert!(matches!(
            decode(b"GET / HTTP/1.1\r\n"),
            Err(DecodeError::Invalid(_))
        ));
        assert!(matches!(
            decode(b"PROXY TCP4 1.2.3.4 ::1 1 2\r\n"),
            Err(DecodeError::Invalid(_))
        ));
    }
}
