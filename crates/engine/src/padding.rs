//! Signature encodings applied before the raw RSA operation (RFC 8017 §9).

use crate::EngineError;
use sha2::{Digest, Sha256, Sha384, Sha512};

/// Hash functions TLS uses with RSA signatures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hash {
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

/// Signature scheme. PSS is the TLS profile: MGF1 with the same hash, salt
/// length = hash length, random salt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RsaPadding {
    /// PKCS#1 v1.5 (RFC 8017 §9.2) with this hash.
    Pkcs1v15(Hash),
    /// PSS (RFC 8017 §9.1) with this hash, MGF1 with the same hash.
    Pss(Hash),
}

impl Hash {
    /// Digest length in bytes.
    pub fn output_len(self) -> usize {
        match self {
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// The digest of the concatenation of `parts`.
    pub fn digest(self, parts: &[&[u8]]) -> Vec<u8> {
        fn run<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
            let mut h = D::new();
            for p in parts {
                h.update(p);
            }
            h.finalize().to_vec()
        }
        match self {
            Hash::Sha256 => run::<Sha256>(parts),
            Hash::Sha384 => run::<Sha384>(parts),
            Hash::Sha512 => run::<Sha512>(parts),
        }
    }

    /// DER of DigestInfo up to the digest (RFC 8017 §9.2, note 1).
    fn digest_info_prefix(self) -> &'static [u8] {
        match self {
            Hash::Sha256 => &[
                0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
                0x01, 0x05, 0x00, 0x04, 0x20,
            ],
            Hash::Sha384 => &[
                0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
                0x02, 0x05, 0x00, 0x04, 0x30,
            ],
            Hash::Sha512 => &[
                0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
                0x03, 0x05, 0x00, 0x04, 0x40,
            ],
        }
    }
}

/// EMSA-PKCS1-v1_5 encoding of `message` into `k` bytes.
pub fn pkcs1v15_encode(hash: Hash, message: &[u8], k: usize) -> Result<Vec<u8>, EngineError> {
    let prefix = hash.digest_info_prefix();
    let t_len = prefix.len() + hash.output_len();
    if k < t_len + 11 {
        return Err(EngineError::MessageTooLong);
    }
    let mut em = vec![0xffu8; k];
    em[0] = 0x00;
    em[1] = 0x01;
    em[k - t_len - 1] = 0x00;
    em[k - t_len..k - hash.output_len()].copy_from_slice(prefix);
    em[k - hash.output_len()..].copy_from_slice(&hash.digest(&[message]));
    Ok(em)
}

/// EMSA-PSS-ENCODE with a random salt of the hash length, as TLS uses it.
pub fn pss_encode(hash: Hash, message: &[u8], mod_bits: usize) -> Result<Vec<u8>, EngineError> {
    let mut salt = vec![0u8; hash.output_len()];
    getrandom::getrandom(&mut salt).map_err(|_| EngineError::Rng)?;
    pss_encode_with_salt(hash, message, &salt, mod_bits)
}

/// EMSA-PSS-ENCODE (RFC 8017 §9.1.1) with MGF1(`hash`) and the given salt;
/// returns the encoded message left-padded to the modulus length, ready for
/// the raw operation. Public for known-answer tests.
pub fn pss_encode_with_salt(
    hash: Hash,
    message: &[u8],
    salt: &[u8],
    mod_bits: usize,
) -> Result<Vec<u8>, EngineError> {
    let h_len = hash.output_len();
    let em_bits = mod_bits - 1;
    let em_len = em_bits.div_ceil(8);
    if em_len < h_len + salt.len() + 2 {
        return Err(EngineError::MessageTooLong);
    }
    let m_hash = hash.digest(&[message]);
    let h = hash.digest(&[&[0u8; 8], &m_hash, salt]);
    let db_len = em_len - h_len - 1;
    // DB = PS || 0x01 || salt, then masked with MGF1(H).
    let mut db = vec![0u8; db_len];
    db[db_len - salt.len() - 1] = 0x01;
    db[db_len - salt.len()..].copy_from_slice(salt);
    for (counter, chunk) in db.chunks_mut(h_len).enumerate() {
        let mask = hash.digest(&[&h, &(counter as u32).to_be_bytes()]);
        for (d, m) in chunk.iter_mut().zip(mask) {
            *d ^= m;
        }
    }
    db[0] &= 0xffu8 >> (8 * em_len - em_bits);
    let k = mod_bits.div_ceil(8);
    let mut em = vec![0u8; k - em_len];
    em.extend_from_slice(&db);
    em.extend_from_slice(&h);
    em.push(0xbc);
    Ok(em)
}

/// Encodes `message` for a `mod_bits`-bit key.
pub fn encode(
    padding: RsaPadding,
    message: &[u8],
    mod_bits: usize,
) -> Result<Vec<u8>, EngineError> {
    match padding {
        RsaPadding::Pkcs1v15(h) => pkcs1v15_encode(h, message, mod_bits.div_ceil(8)),
        RsaPadding::Pss(h) => pss_encode(h, message, mod_bits),
    }
}
