//! The DER encoding of an ECDSA signature (RFC 3279 section 2.2.3), as TLS
//! sends it: SEQUENCE { INTEGER r, INTEGER s }. r and s are public.

/// DER of (r, s), each 32 bytes big-endian and non-zero.
pub(crate) fn encode(r: &[u8; 32], s: &[u8; 32]) -> Vec<u8> {
    let (r, s) = (integer(r), integer(s));
    // At most 2 * 35 bytes of content: the short length form.
    let mut out = Vec::with_capacity(2 + r.len() + s.len());
    out.push(0x30);
    out.push((r.len() + s.len()) as u8);
    out.extend_from_slice(&r);
    out.extend_from_slice(&s);
    out
}

/// One INTEGER: leading zero bytes dropped, one 0x00 added where the top bit
/// is set (the value is positive).
fn integer(v: &[u8; 32]) -> Vec<u8> {
    let start = v.iter().position(|&b| b != 0).unwrap_or(31);
    let body = &v[start..];
    let pad = usize::from(body[0] & 0x80 != 0);
    let mut out = Vec::with_capacity(2 + pad + body.len());
    out.push(0x02);
    out.push((pad + body.len()) as u8);
    if pad == 1 {
        out.push(0);
    }
    out.extend_from_slice(body);
    out
}
