//! PROXY protocol: the decoder never panics on arbitrary bytes, and whatever the encoder
//! writes (v1 and v2, any addresses, any TLS details a handshake can produce) decodes back
//! to the same addresses and TLVs, consuming exactly the header.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tlsterm::proxy::proxy_protocol::{
    self, decode, encode_v1, encode_v2, ClientIdentity, DecodeError, TlsDetails, PP2_TYPE_ALPN,
    PP2_TYPE_AUTHORITY, PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE, PP2_TYPE_TLSTERM_CLIENT_SAN,
    PP2_TYPE_TLSTERM_CLIENT_SHA256, PP2_TYPE_TLSTERM_CLIENT_SUBJECT,
};

#[derive(Arbitrary, Debug)]
enum Addr {
    V4([u8; 4], u16),
    V6([u8; 16], u16),
}

impl Addr {
    fn socket(&self) -> SocketAddr {
        match *self {
            Addr::V4(ip, port) => SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port),
            Addr::V6(ip, port) => SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    source: Addr,
    destination: Addr,
    alpn: Option<Vec<u8>>,
    sni: Option<String>,
    version: String,
    cipher: String,
    key_alg: Option<String>,
    client_cert: Option<(Option<String>, String, Vec<String>, String)>,
    early_data: bool,
    resumed: bool,
    trailing: Vec<u8>,
    raw: Vec<u8>,
}

/// TLS bounds what a handshake can give the encoder: ALPN protocols and host names are at
/// most 255 bytes; version and cipher names are short.
fn bounded(bytes: &[u8], max: usize) -> &[u8] {
    &bytes[..bytes.len().min(max)]
}

fn bounded_str(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn v6_mapped(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V4(ip) => SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), a.port()),
        IpAddr::V6(_) => a,
    }
}

fuzz_target!(|input: Input| {
    // 1. Arbitrary bytes: no panic, and a success never claims more bytes than given.
    match decode(&input.raw) {
        Ok((_, used)) => assert!(used <= input.raw.len() && used > 0),
        Err(DecodeError::Incomplete) | Err(DecodeError::Invalid(_)) => {}
    }
    // Every prefix of arbitrary bytes too (the streaming decoder sees them that way).
    for cut in 0..input.raw.len().min(64) {
        let _ = decode(&input.raw[..cut]);
    }

    let (source, destination) = (input.source.socket(), input.destination.socket());
    let tls = TlsDetails {
        alpn: input.alpn.as_deref().map(|a| bounded(a, 255).to_vec()),
        sni: input.sni.as_deref().map(|s| bounded_str(s, 255)),
        version: bounded_str(&input.version, 64),
        cipher: bounded_str(&input.cipher, 128),
        key_alg: input.key_alg.as_deref().map(|s| bounded_str(s, 64)),
        // Bounded so that every field fits whole (longer ones are left out and listed in
        // PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE; the unit tests cover that).
        client_cert: input
            .client_cert
            .as_ref()
            .map(|(cn, subject, san, sha)| ClientIdentity {
                common_name: cn.as_deref().map(|s| bounded_str(s, 255)),
                subject: bounded_str(subject, 1024),
                san: san.iter().take(16).map(|s| bounded_str(s, 255)).collect(),
                sha256_hex: bounded_str(sha, 64),
            }),
        early_data: input.early_data,
        resumed: input.resumed,
        client_policy: input.sni.as_deref().map(|s| bounded_str(s, 255)),
    };

    // 2. v1 round trip.
    let v1 = encode_v1(source, destination);
    let mut stream = v1.clone();
    stream.extend_from_slice(&input.trailing);
    let (header, used) = decode(&stream).expect("own v1 header decodes");
    assert_eq!(used, v1.len());
    assert_eq!(header.version, 1);
    if source.is_ipv4() == destination.is_ipv4() {
        assert_eq!(header.source, Some(source));
        assert_eq!(header.destination, Some(destination));
    } else {
        assert_eq!((header.source, header.destination), (None, None));
    }
    // A truncated header is incomplete, never wrong.
    for cut in 0..v1.len() {
        assert_eq!(
            decode(&v1[..cut]).unwrap_err(),
            DecodeError::Incomplete,
            "cut {cut}"
        );
    }

    // 3. v2 round trip.
    let v2 = encode_v2(source, destination, &tls);
    let mut stream = v2.clone();
    stream.extend_from_slice(&input.trailing);
    let (header, used) = decode(&stream).expect("own v2 header decodes");
    assert_eq!(used, v2.len());
    assert_eq!(header.version, 2);
    if source.is_ipv4() && destination.is_ipv4() {
        assert_eq!(header.source, Some(source));
        assert_eq!(header.destination, Some(destination));
    } else {
        assert_eq!(header.source, Some(v6_mapped(source)));
        assert_eq!(header.destination, Some(v6_mapped(destination)));
    }
    assert_eq!(header.tlv(PP2_TYPE_ALPN), tls.alpn.as_deref());
    assert_eq!(
        header.tlv(PP2_TYPE_AUTHORITY),
        tls.sni.as_deref().map(str::as_bytes)
    );
    let ssl = header.ssl().expect("SSL TLV");
    assert_eq!(
        ssl.client & proxy_protocol::PP2_CLIENT_SSL,
        proxy_protocol::PP2_CLIENT_SSL
    );
    assert_eq!(ssl.verify, if tls.client_cert.is_some() { 0 } else { 1 });
    // CERT_SESS with a client certificate; CERT_CONN only when it came on this connection.
    let certificate_bits =
        proxy_protocol::PP2_CLIENT_CERT_SESS | proxy_protocol::PP2_CLIENT_CERT_CONN;
    let expected_bits = match (&tls.client_cert, tls.resumed) {
        (None, _) => 0,
        (Some(_), true) => proxy_protocol::PP2_CLIENT_CERT_SESS,
        (Some(_), false) => certificate_bits,
    };
    assert_eq!(ssl.client & certificate_bits, expected_bits);
    assert_eq!(
        ssl.get(proxy_protocol::PP2_SUBTYPE_SSL_VERSION),
        Some(tls.version.as_bytes())
    );
    assert_eq!(
        ssl.get(proxy_protocol::PP2_SUBTYPE_SSL_CIPHER),
        Some(tls.cipher.as_bytes())
    );
    assert_eq!(
        ssl.get(proxy_protocol::PP2_SUBTYPE_SSL_KEY_ALG),
        tls.key_alg.as_deref().map(str::as_bytes)
    );
    let client = tls.client_cert.as_ref();
    assert_eq!(
        ssl.get(proxy_protocol::PP2_SUBTYPE_SSL_CN),
        client
            .and_then(|c| c.common_name.as_deref())
            .map(str::as_bytes)
    );
    assert_eq!(
        header.tlv(PP2_TYPE_TLSTERM_CLIENT_SUBJECT),
        client.map(|c| c.subject.as_bytes())
    );
    let san: Vec<&[u8]> = header.all_tlvs(PP2_TYPE_TLSTERM_CLIENT_SAN).collect();
    let expected: Vec<&[u8]> = client
        .map(|c| c.san.iter().map(|s| s.as_bytes()).collect())
        .unwrap_or_default();
    assert_eq!(san, expected);
    assert_eq!(header.tlv(PP2_TYPE_TLSTERM_CLIENT_INCOMPLETE), None);
    assert_eq!(
        header.tlv(PP2_TYPE_TLSTERM_CLIENT_SHA256),
        client.map(|c| c.sha256_hex.as_bytes())
    );
    for cut in 0..v2.len() {
        assert_eq!(
            decode(&v2[..cut]).unwrap_err(),
            DecodeError::Incomplete,
            "cut {cut}"
        );
    }
});
