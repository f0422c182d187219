//! The hint against BoringSSL itself: a client and a server in one process, over a socket
//! pair, the server's certificate callback setting the hint as `ServerTls` does.

use std::sync::Arc;

use boring::ssl::{SelectCertError, SslConnector, SslContextBuilder, SslMethod, SslVerifyMode};

use super::*;
use crate::offload::key_share::compute;
use crate::testing::over_socket_pair;
use crate::tls::selfsigned::{generate, SelfSignedKey};

/// Every group tlsterm computes, and P-521, which it does not (BoringSSL has it, a
/// listener cannot ask for it).
const SERVER_GROUPS: &str = "X25519MLKEM768:X25519:P-256:P-384:P-521";
const SERVER_GROUP_IDS: [u16; 5] = [0x11ec, 0x001d, 0x0017, 0x0018, 0x0019];

/// What the server's certificate callback does with the share it computed.
#[derive(Clone, Copy)]
enum Hint {
    /// Sets it, as `ServerTls` does.
    AsComputed,
    /// Sets it with one bit of the secret flipped: the handshake fails if BoringSSL uses it.
    Corrupted,
    /// Sets a corrupted share of this group instead of the one predicted.
    OtherGroup(Group),
}

/// A handshake between a BoringSSL client offering `client_groups` and a server setting
/// `hint`: the negotiated group, or the error.
fn handshake(client_groups: &str, hint: Hint) -> Result<u16, String> {
    let (cert, key) = generate(SelfSignedKey::EcdsaP256).unwrap();
    let mut server = SslContextBuilder::new(SslMethod::tls()).unwrap();
    server.set_certificate(&cert).unwrap();
    server.set_private_key(&key).unwrap();
    server.set_curves_list(SERVER_GROUPS).unwrap();
    server.set_select_certificate_callback(move |mut hello| {
        let Some(request) = request(&hello, &SERVER_GROUP_IDS) else {
            return Ok(());
        };
        let group = match hint {
            Hint::OtherGroup(other) => other,
            _ => request.group,
        };
        let peer = if group == request.group {
            request.peer.clone()
        } else {
            // A valid share of the other group, from a client of our own.
            let client = compute(group, &client_share_of(group)).unwrap();
            client.public
        };
        let mut share = compute(group, &peer).map_err(|_| SelectCertError::ERROR)?;
        if !matches!(hint, Hint::AsComputed) {
            share.secret[0] ^= 1;
        }
        assert!(apply(hello.ssl_mut(), &share, KeySharePath::AwsLc));
        Ok(())
    });
    let server = Arc::new(server.build());
    let mut client = SslConnector::builder(SslMethod::tls()).unwrap();
    client.set_verify(SslVerifyMode::NONE);
    client.set_curves_list(client_groups).unwrap();
    let client = client.build();
    let (server_result, client_result) = over_socket_pair(
        move |server_socket| {
            let ssl = boring::ssl::Ssl::new(&server).unwrap();
            let result = ssl.accept(server_socket).map(|tls| {
                let group = tls.ssl().curve().unwrap();
                record(tls.ssl());
                group
            });
            result.map_err(|e| e.to_string())
        },
        |client_socket| {
            client
                .configure()
                .unwrap()
                .connect("localhost", client_socket)
                .map(|tls| tls.ssl().curve().unwrap())
                .map_err(|e| e.to_string())
        },
    );
    let group = server_result?;
    assert_eq!(client_result?, group);
    Ok(group)
}

/// Some valid client share of `group` (X25519 and P-256: a server share is one too).
fn client_share_of(group: Group) -> Vec<u8> {
    match group {
        Group::X25519 => compute(Group::X25519, &[9u8; 32]).unwrap().public,
        Group::P256 => {
            let generator = hex_p256_generator();
            compute(Group::P256, &generator).unwrap().public
        }
        Group::X25519MlKem768 | Group::P384 => panic!("not needed"),
    }
}

fn hex_p256_generator() -> Vec<u8> {
    let x = "6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296";
    let y = "4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5";
    let mut point = vec![4u8];
    for hex in [x, y] {
        point.extend((0..32).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()));
    }
    point
}

#[test]
fn boringssl_uses_the_hint_for_every_group() {
    for (groups, id) in [
        ("X25519MLKEM768:X25519", 0x11ec),
        ("X25519", 0x001d),
        ("P-256:X25519", 0x0017),
        ("P-384:X25519", 0x0018),
    ] {
        assert_eq!(handshake(groups, Hint::AsComputed), Ok(id), "{groups}");
        // If BoringSSL stopped applying hints, the corrupted secret would go unnoticed.
        let corrupted = handshake(groups, Hint::Corrupted);
        assert!(
            corrupted.is_err(),
            "{groups}: a corrupted hint was not used"
        );
    }
}

#[test]
fn a_hint_of_another_group_is_ignored() {
    // The client offers only X25519; a (corrupted) P-256 hint must change nothing.
    assert_eq!(
        handshake("X25519", Hint::OtherGroup(Group::P256)),
        Ok(0x001d)
    );
    assert_eq!(
        handshake("P-256", Hint::OtherGroup(Group::X25519)),
        Ok(0x0017)
    );
}

#[test]
fn no_hint_for_a_group_tlsterm_does_not_compute() {
    // P-521: BoringSSL computes it, and the callback sets nothing.
    assert_eq!(handshake("P-521", Hint::Corrupted), Ok(0x0019));
}

#[test]
fn the_encoding_is_boringssl_handshake_hints() {
    let share = ServerShare {
        group: Group::X25519,
        public: vec![0xaa; 32],
        secret: Zeroizing::new(vec![0xbb; 32]),
    };
    let der = encode(&share).unwrap();
    // SEQUENCE { [1] CONSTRUCTED { INTEGER 29, OCTET STRING public, OCTET STRING secret } }
    let mut expected = vec![0x30, 73, 0xa1, 71, 0x02, 0x01, 0x1d, 0x04, 32];
    expected.extend([0xaa; 32]);
    expected.extend([0x04, 32]);
    expected.extend([0xbb; 32]);
    assert_eq!(*der, expected);
}

#[test]
fn the_client_share_of_the_group() {
    // key_share: total length, then (group, length, share)...
    let ext = [0, 10, 0x00, 0x1d, 0, 2, 1, 2, 0x00, 0x17, 0, 0];
    // A zero-length share is malformed: no hint at all.
    assert_eq!(client_share(&ext, 0x001d), None);
    let ext = [0, 11, 0x00, 0x1d, 0, 2, 1, 2, 0x00, 0x17, 0, 1, 7];
    assert_eq!(client_share(&ext, 0x001d), Some(&[1u8, 2][..]));
    assert_eq!(client_share(&ext, 0x0017), Some(&[7u8][..]));
    assert_eq!(client_share(&ext, 0x11ec), None);
    // Twice the same group: BoringSSL refuses the ClientHello.
    let twice = [0, 12, 0x00, 0x1d, 0, 2, 1, 2, 0x00, 0x1d, 0, 2, 3, 4];
    assert_eq!(client_share(&twice, 0x001d), None);
    // A length beyond the data.
    assert_eq!(client_share(&[0, 6, 0x00, 0x1d, 0, 9, 1, 2], 0x001d), None);
    assert_eq!(client_share(&[0, 9, 0x00, 0x1d], 0x001d), None);
}
