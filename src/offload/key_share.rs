//! The server's key share of a TLS 1.3 handshake, computed outside BoringSSL.
//!
//! BoringSSL computes its (EC)DHE share inline, and its X25519 and ML-KEM-768 are about
//! half as fast as aws-lc's (its P-384 several times slower). Here a share is computed from the client's share of the
//! group the handshake will use: the server's public value (or, for ML-KEM, the
//! ciphertext) and the shared secret. `tls::key_share_hint` hands the result to BoringSSL.

use aws_lc_rs::agreement::{self, PrivateKey, UnparsedPublicKey};
use aws_lc_rs::kem::{EncapsulationKey, ML_KEM_768};
use zeroize::Zeroizing;

/// A key-exchange group whose server share tlsterm can compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// The post-quantum hybrid: ML-KEM-768 followed by X25519, in both shares and in the
    /// secret (the order of draft-ietf-tls-ecdhe-mlkem, which BoringSSL follows).
    X25519MlKem768,
    X25519,
    P256,
    P384,
}

const X25519_LEN: usize = 32;
const MLKEM768_PUBLIC_LEN: usize = 1184;
const P256_POINT_LEN: usize = 65;
const P384_POINT_LEN: usize = 97;

impl Group {
    /// The group of a TLS `NamedGroup` code point, if tlsterm computes its shares.
    pub fn from_id(id: u16) -> Option<Group> {
        match id {
            0x11ec => Some(Group::X25519MlKem768),
            0x001d => Some(Group::X25519),
            0x0017 => Some(Group::P256),
            0x0018 => Some(Group::P384),
            _ => None,
        }
    }

    /// The TLS `NamedGroup` code point.
    pub fn id(self) -> u16 {
        match self {
            Group::X25519MlKem768 => 0x11ec,
            Group::X25519 => 0x001d,
            Group::P256 => 0x0017,
            Group::P384 => 0x0018,
        }
    }

    /// The name in `/metrics` (as `tls_groups_total` names groups).
    pub fn label(self) -> &'static str {
        match self {
            Group::X25519MlKem768 => "X25519MLKEM768",
            Group::X25519 => "X25519",
            Group::P256 => "P-256",
            Group::P384 => "P-384",
        }
    }
}

/// The server's share and the shared secret, ready for the key schedule.
pub struct ServerShare {
    pub group: Group,
    /// What the ServerHello's key_share carries (`ciphertext` in BoringSSL's terms).
    pub public: Vec<u8>,
    pub secret: Zeroizing<Vec<u8>>,
}

/// Why no share was computed; BoringSSL then computes (and judges) it itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyShareError {
    /// The client's share has the wrong length or is not a valid key of its group.
    BadPeerShare,
    /// aws-lc failed (key generation, or an X25519 result of all zeros).
    Crypto,
}

/// Computes the server's share for the client's share `peer` of `group` with aws-lc.
pub fn compute(group: Group, peer: &[u8]) -> Result<ServerShare, KeyShareError> {
    match group {
        Group::X25519 => {
            let (public, secret) = ecdh(&agreement::X25519, peer)?;
            Ok(ServerShare {
                group,
                public,
                secret,
            })
        }
        Group::P256 => nist_ecdh(group, &agreement::ECDH_P256, P256_POINT_LEN, peer),
        Group::P384 => nist_ecdh(group, &agreement::ECDH_P384, P384_POINT_LEN, peer),
        Group::X25519MlKem768 => {
            let (peer_mlkem, peer_x25519) = split_hybrid(peer)?;
            let mlkem = encapsulate(peer_mlkem)?;
            let (x25519_public, x25519_secret) = ecdh(&agreement::X25519, &peer_x25519)?;
            Ok(hybrid(mlkem, &x25519_public, &x25519_secret))
        }
    }
}

/// A P-256 or P-384 share: the client's point must be uncompressed, as BoringSSL accepts
/// only those in TLS 1.3.
fn nist_ecdh(
    group: Group,
    alg: &'static agreement::Algorithm,
    point_len: usize,
    peer: &[u8],
) -> Result<ServerShare, KeyShareError> {
    if peer.len() != point_len || peer[0] != 4 {
        return Err(KeyShareError::BadPeerShare);
    }
    let (public, secret) = ecdh(alg, peer)?;
    Ok(ServerShare {
        group,
        public,
        secret,
    })
}

/// A client's X25519MLKEM768 share: its ML-KEM-768 encapsulation key and its X25519 share.
pub fn split_hybrid(peer: &[u8]) -> Result<(&[u8], [u8; X25519_LEN]), KeyShareError> {
    if peer.len() != MLKEM768_PUBLIC_LEN + X25519_LEN {
        return Err(KeyShareError::BadPeerShare);
    }
    let (mlkem, x25519) = peer.split_at(MLKEM768_PUBLIC_LEN);
    Ok((mlkem, x25519.try_into().expect("32 bytes")))
}

/// An ML-KEM-768 encapsulation to the client's key: (ciphertext, shared secret).
pub struct Encapsulation {
    pub(super) ciphertext: Vec<u8>,
    pub(super) secret: Zeroizing<Vec<u8>>,
}

impl From<tlsterm_engine::MlKemEncapsulation> for Encapsulation {
    fn from(engine: tlsterm_engine::MlKemEncapsulation) -> Encapsulation {
        Encapsulation {
            ciphertext: engine.ciphertext.to_vec(),
            secret: Zeroizing::new(engine.secret.to_vec()),
        }
    }
}

/// Encapsulates to a client's ML-KEM-768 key with aws-lc.
pub fn encapsulate(peer_mlkem: &[u8]) -> Result<Encapsulation, KeyShareError> {
    let key =
        EncapsulationKey::new(&ML_KEM_768, peer_mlkem).map_err(|_| KeyShareError::BadPeerShare)?;
    // aws-lc checks the key (coefficients reduced mod q) when it encapsulates.
    let (ciphertext, secret) = key.encapsulate().map_err(|_| KeyShareError::BadPeerShare)?;
    Ok(Encapsulation {
        ciphertext: ciphertext.as_ref().to_vec(),
        secret: Zeroizing::new(secret.as_ref().to_vec()),
    })
}

/// The X25519MLKEM768 server share from its two halves: ML-KEM first, in the share and
/// in the secret.
pub fn hybrid(mlkem: Encapsulation, x25519_public: &[u8], x25519_secret: &[u8]) -> ServerShare {
    let mut public = mlkem.ciphertext;
    public.extend_from_slice(x25519_public);
    let mut secret = Zeroizing::new(Vec::with_capacity(2 * X25519_LEN));
    secret.extend_from_slice(&mlkem.secret);
    secret.extend_from_slice(x25519_secret);
    ServerShare {
        group: Group::X25519MlKem768,
        public,
        secret,
    }
}

/// A fresh key pair of `alg` and its agreement with `peer`: (public value, secret).
fn ecdh(
    alg: &'static agreement::Algorithm,
    peer: &[u8],
) -> Result<(Vec<u8>, Zeroizing<Vec<u8>>), KeyShareError> {
    let private = PrivateKey::generate(alg).map_err(|_| KeyShareError::Crypto)?;
    let public = private
        .compute_public_key()
        .map_err(|_| KeyShareError::Crypto)?
        .as_ref()
        .to_vec();
    // aws-lc refuses an X25519 result of all zeros (a low-order client share), as
    // RFC 8446 section 7.4.2 asks of servers.
    let secret = agreement::agree(
        &private,
        UnparsedPublicKey::new(alg, peer),
        KeyShareError::BadPeerShare,
        |secret| Ok(Zeroizing::new(secret.to_vec())),
    )?;
    Ok((public, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a client derives the secret from the server's share.
    type ClientFinish = Box<dyn FnOnce(&[u8]) -> Vec<u8>>;

    /// The client's half of each group, with aws-lc: its share, and its finish.
    fn client_half(group: Group) -> (Vec<u8>, ClientFinish) {
        match group {
            Group::X25519 | Group::P256 | Group::P384 => {
                let alg = match group {
                    Group::X25519 => &agreement::X25519,
                    Group::P256 => &agreement::ECDH_P256,
                    _ => &agreement::ECDH_P384,
                };
                let private = PrivateKey::generate(alg).unwrap();
                let share = private.compute_public_key().unwrap().as_ref().to_vec();
                let finish = move |server: &[u8]| {
                    agreement::agree(&private, UnparsedPublicKey::new(alg, server), (), |s| {
                        Ok(s.to_vec())
                    })
                    .unwrap()
                };
                (share, Box::new(finish))
            }
            Group::X25519MlKem768 => {
                let mlkem = aws_lc_rs::kem::DecapsulationKey::generate(&ML_KEM_768).unwrap();
                let x25519 = PrivateKey::generate(&agreement::X25519).unwrap();
                let mut share = mlkem
                    .encapsulation_key()
                    .unwrap()
                    .key_bytes()
                    .unwrap()
                    .as_ref()
                    .to_vec();
                share.extend_from_slice(x25519.compute_public_key().unwrap().as_ref());
                let finish = move |server: &[u8]| {
                    let (ciphertext, x25519_public) = server.split_at(server.len() - 32);
                    let mut secret = mlkem
                        .decapsulate(ciphertext.into())
                        .unwrap()
                        .as_ref()
                        .to_vec();
                    let ecdh = agreement::agree(
                        &x25519,
                        UnparsedPublicKey::new(&agreement::X25519, x25519_public),
                        (),
                        |s| Ok(s.to_vec()),
                    )
                    .unwrap();
                    secret.extend_from_slice(&ecdh);
                    secret
                };
                (share, Box::new(finish))
            }
        }
    }

    #[test]
    fn each_group_agrees_with_the_client() {
        for group in [
            Group::X25519MlKem768,
            Group::X25519,
            Group::P256,
            Group::P384,
        ] {
            let (share, finish) = client_half(group);
            let server = compute(group, &share).unwrap();
            assert_eq!(finish(&server.public), *server.secret, "{group:?}");
            assert_eq!(Group::from_id(group.id()), Some(group));
        }
    }

    #[test]
    fn a_low_order_x25519_share_is_refused() {
        // u = 0 and u = 1 are of small order: every scalar gives the all-zero secret.
        for u in [[0u8; 32], {
            let mut one = [0u8; 32];
            one[0] = 1;
            one
        }] {
            assert_eq!(
                compute(Group::X25519, &u).err(),
                Some(KeyShareError::BadPeerShare)
            );
        }
    }

    #[test]
    fn malformed_shares_are_refused() {
        assert!(compute(Group::X25519, &[9u8; 31]).is_err());
        assert!(compute(Group::X25519MlKem768, &[0u8; 1184]).is_err());
        // A compressed point: valid, but not what TLS 1.3 allows.
        for (group, coordinate) in [(Group::P256, 32), (Group::P384, 48)] {
            let (share, _) = client_half(group);
            let mut compressed = vec![2 + (share[2 * coordinate] & 1)];
            compressed.extend_from_slice(&share[1..=coordinate]);
            assert_eq!(
                compute(group, &compressed).err(),
                Some(KeyShareError::BadPeerShare),
                "{group:?}"
            );
            // A point that is not on the curve.
            let mut off_curve = share.clone();
            off_curve[coordinate] ^= 1;
            assert_eq!(
                compute(group, &off_curve).err(),
                Some(KeyShareError::BadPeerShare),
                "{group:?}"
            );
        }
        // An ML-KEM key whose coefficients are not reduced mod q (all bits set).
        let mut bad = vec![0xffu8; 1184];
        bad.extend_from_slice(&[9u8; 32]);
        assert_eq!(
            compute(Group::X25519MlKem768, &bad).err(),
            Some(KeyShareError::BadPeerShare)
        );
    }
}
