//! Hedged ECDSA nonces: k is derived from the private key, the message digest
//! and 32 fresh random bytes with HMAC-SHA-256. A broken random generator
//! then still gives a distinct k per message (the RFC 6979 property), and a
//! good one keeps k secret even if the same message is signed twice or a
//! fault repeats a computation.

use super::mont::{self, zero_mask, N, U256};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::{Zeroize, Zeroizing};

/// k in [1, n - 1] (little-endian limbs, canonical) for the key `d` (32
/// bytes, big-endian), the digest's integer `e` (32 bytes, big-endian) and
/// the fresh bytes `entropy`. Two HMAC blocks give 512 bits, reduced mod n:
/// the bias is below 2^-256. k = 0 (probability 2^-256) becomes 1 by mask.
pub(crate) fn derive(d: &[u8; 32], e: &[u8; 32], entropy: &[u8; 32]) -> Zeroizing<U256> {
    let block = |tag: u8| {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(d).expect("any key length");
        mac.update(&[tag]);
        mac.update(e);
        mac.update(entropy);
        let mut out = [0u8; 32];
        out.copy_from_slice(&mac.finalize().into_bytes());
        Zeroizing::new(out)
    };
    let (hi, lo) = (block(0), block(1));
    // hi * 2^256 + lo mod n: Montgomery multiplication by 2^512 mod n gives
    // hi * 2^256 mod n.
    let mut h = mont::reduce_once(&mont::from_be(&hi), &N);
    let mut l = mont::reduce_once(&mont::from_be(&lo), &N);
    let mut k = mont::add(&mont::to_mont(&h, &N), &l, &N);
    let zero = zero_mask(k.iter().fold(0, |a, w| a | w));
    k = mont::select(zero, &[1, 0, 0, 0], &k);
    h.zeroize();
    l.zeroize();
    Zeroizing::new(k)
}
