//! A decoder of both versions, for the built-in backend, tests and fuzzing: strict about
//! lengths, and telling "more bytes needed" apart from "not a PROXY header".

use std::net::{IpAddr, SocketAddr};

use super::*;

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

/// What a v1 header starts with.
const V1_PREFIX: &[u8] = b"PROXY ";

/// Whether `data` begins the way a header of either version does, or is too short to
/// tell: when it does not, [`decode`] answers "not a PROXY header" and the stream is
/// plain application data; when it does, any other [`DecodeError::Invalid`] means a
/// malformed header.
pub fn may_be_header(data: &[u8]) -> bool {
    let agrees = |magic: &[u8]| {
        let n = data.len().min(magic.len());
        data[..n] == magic[..n]
    };
    agrees(&V2_SIGNATURE) || agrees(V1_PREFIX)
}

/// Decodes a header at the start of `data`; returns it and the bytes it took.
pub fn decode(data: &[u8]) -> Result<(ProxyHeader, usize), DecodeError> {
    if !may_be_header(data) {
        return Err(DecodeError::Invalid("not a PROXY header"));
    }
    if data.starts_with(&V2_SIGNATURE) {
        return decode_v2(data);
    }
    if V2_SIGNATURE.starts_with(data) {
        // Also the empty input: either version may follow.
        return Err(DecodeError::Incomplete);
    }
    decode_v1(data)
}

/// `data` starts with (a prefix of) "PROXY ".
fn decode_v1(data: &[u8]) -> Result<(ProxyHeader, usize), DecodeError> {
    // A v1 line is at most 107 bytes including CRLF.
    let window = &data[..data.len().min(107)];
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
