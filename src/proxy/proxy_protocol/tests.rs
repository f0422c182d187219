//! Unit tests: PROXY v1/v2 encoding, decoding and their round trips.

use std::net::SocketAddr;

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
        resumed: false,
        client_policy: Some("admin.test".into()),
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
    assert_eq!(
        header.tlv(PP2_TYPE_TLSTERM_CLIENT_POLICY),
        Some(&b"admin.test"[..])
    );
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
        resumed: false,
        client_policy: None,
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

#[test]
fn may_be_header_tells_application_data_from_a_header() {
    // Application data: decode says "not a PROXY header", nothing to strip.
    for data in [&b"GET / HTTP/1.1\r\n"[..], b"POST", b"\r\n\r\nGET", b"x"] {
        assert!(!may_be_header(data), "{data:?}");
        assert_eq!(
            decode(data).unwrap_err(),
            DecodeError::Invalid("not a PROXY header")
        );
    }
    // Headers, whole, cut short, or malformed after their first bytes.
    let v2 = encode_v2(addr("[::1]:1"), addr("[::1]:2"), &TlsDetails::default());
    let v1 = encode_v1(addr("1.2.3.4:5"), addr("6.7.8.9:10"));
    for data in [
        &v2[..],
        &v2[..5],
        &v1[..],
        &v1[..3],
        b"",
        b"PROXY TCP9 x\r\n",
    ] {
        assert!(may_be_header(data), "{data:?}");
    }
}

/// As HAProxy sets them: CERT_SESS whenever the session was made with a client certificate,
/// CERT_CONN only when it was presented on this connection (not on a resumed session).
#[test]
fn client_certificate_bits_tell_a_resumed_session_from_a_full_handshake() {
    let client_bits = |tls: &TlsDetails| {
        let bytes = encode_v2(addr("10.0.0.1:1"), addr("10.0.0.2:2"), tls);
        decode(&bytes).unwrap().0.ssl().expect("SSL TLV").client
    };
    let mut tls = TlsDetails {
        client_cert: Some(ClientIdentity::default()),
        ..TlsDetails::default()
    };
    assert_eq!(
        client_bits(&tls),
        PP2_CLIENT_SSL | PP2_CLIENT_CERT_CONN | PP2_CLIENT_CERT_SESS
    );
    tls.resumed = true;
    assert_eq!(client_bits(&tls), PP2_CLIENT_SSL | PP2_CLIENT_CERT_SESS);
    tls.client_cert = None;
    assert_eq!(client_bits(&tls), PP2_CLIENT_SSL);
}
