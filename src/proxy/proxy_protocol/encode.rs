//! The encoder tlsterm uses towards backends: a v1 text line, or a v2 binary header with
//! what the backend should know about the TLS connection (each value whole or not at all).

use std::net::{IpAddr, SocketAddr};

use super::*;

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

/// Encodes a version 2 header (binary) with ALPN, authority and SSL TLVs. Over 80 lines
/// on purpose: the header in wire order, TLV by TLV, so that it reads against the PROXY
/// protocol specification (section 2.2) and the bound on its size below can be checked.
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
    if let Some(policy) = &tls.client_policy {
        push_tlv(
            &mut body,
            PP2_TYPE_TLSTERM_CLIENT_POLICY,
            capped(policy.as_bytes()),
        );
    }
    // CERT_SESS: the session was established with a client certificate; CERT_CONN: it
    // was presented on this very connection (a full handshake), as HAProxy reports them.
    let client_bits = match (&tls.client_cert, tls.resumed) {
        (Some(_), false) => PP2_CLIENT_SSL | PP2_CLIENT_CERT_SESS | PP2_CLIENT_CERT_CONN,
        (Some(_), true) => PP2_CLIENT_SSL | PP2_CLIENT_CERT_SESS,
        (None, _) => PP2_CLIENT_SSL,
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
