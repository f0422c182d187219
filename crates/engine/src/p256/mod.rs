//! ECDSA P-256 signatures (FIPS 186-4 with SHA-2, the `ecdsa_secp256r1_*`
//! schemes of TLS) in batches: the server's signature for many handshakes at
//! once.
//!
//! The costly part of a signature, the nonce point R = k * G and k^-1 mod n,
//! is computed by a kernel: [`P256Kernel::Ifma`], 8 signatures per pass in the
//! lanes of AVX-512 IFMA registers (`ifma.rs`), or [`P256Kernel::Portable`],
//! one at a time (`point.rs`, `mont.rs`), the reference the tests compare it
//! with. The rest is shared (this file): hashing, the hedged nonce
//! (`nonce.rs`), s = k^-1 (e + r d) mod n, the fault check and the DER
//! encoding (`der.rs`). Both kernels are constant time with respect to the
//! key, the nonce and every intermediate point.
//!
//! The fault check. A full verification (u1 G + u2 Q) costs more than the
//! signature, so every signature passes two cheap checks instead, before it
//! leaves the engine:
//! - R's affine point is on the curve (y^2 = x^3 - 3x + b). A fault in the
//!   point arithmetic (a flipped bit in any coordinate of any intermediate
//!   point) leads off the curve with overwhelming probability, and a
//!   signature on an invalid point is what fault attacks on ECDSA exploit.
//! - s k = e + r d (mod n), with r d computed a second time and k in its
//!   own Montgomery conversion: a fault in k^-1 (the kernel's inversion), in
//!   r d or in s changes one side only.
//!
//! What they do not catch is a fault that turns R into another point of the
//! curve (a skipped table addition, say): such a signature fails
//! verification and reveals at most the skipped digit of its nonce, and
//! causing it takes a precise physical fault, not a flipped bit.

mod base_table;
mod der;
#[cfg(target_arch = "x86_64")]
mod ifma;
#[cfg(target_arch = "x86_64")]
mod ifma_pass;
mod mont;
mod nonce;
mod point;
#[cfg(test)]
mod tests;

#[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
pub use ifma::planted_select_p256;
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub use ifma_pass::ct_p256_ifma_lanes;

use crate::bn::LANES;
use crate::curve_kernel::CurveKernel;
use crate::{ct, EngineError, Hash};
use mont::{N, U256};
use zeroize::{Zeroize, Zeroizing};

/// Which P-256 kernel computes a batch: [`P256Kernel::Ifma`] or
/// [`P256Kernel::Portable`].
pub type P256Kernel = CurveKernel;

/// A P-256 private key: the scalar d and its public point d * G.
pub struct EcdsaP256Key {
    /// d, big-endian: the HMAC key of the nonce derivation.
    d_bytes: [u8; 32],
    /// d in Montgomery form mod n.
    d_mont: U256,
    /// d * G, uncompressed (0x04 || x || y).
    public: [u8; 65],
}

impl EcdsaP256Key {
    /// The key with private scalar `d` (32 bytes, big-endian, as SEC 1 and
    /// BoringSSL's `EC_KEY` give it); refused unless 0 < d < n.
    pub fn from_private_scalar(d: &[u8]) -> Result<EcdsaP256Key, EngineError> {
        let d: &[u8; 32] = d
            .try_into()
            .map_err(|_| EngineError::InvalidKey("a P-256 private scalar is 32 bytes"))?;
        let mut limbs = Zeroizing::new(mont::from_be(d));
        let below_n = mont::sub_borrow(&limbs, &N.m).1;
        let zero = mont::zero_mask(limbs.iter().fold(0, |a, w| a | w)) & 1;
        // Only the one bit (valid or not) leaves the constant-time code.
        if ct::declassified(below_n & (zero ^ 1)) != 1 {
            return Err(EngineError::InvalidKey(
                "the P-256 private scalar must be in [1, n - 1]",
            ));
        }
        let mut point = point::base_mult(&limbs);
        let (x, y) = point::to_affine(&point);
        point.zeroize();
        let mut public = [4u8; 65];
        public[1..33].copy_from_slice(&mont::to_be(&x));
        public[33..].copy_from_slice(&mont::to_be(&y));
        ct::declassify(&public);
        let key = EcdsaP256Key {
            d_bytes: *d,
            d_mont: mont::to_mont(&limbs, &N),
            public,
        };
        limbs.zeroize();
        ct::wipe_stack();
        Ok(key)
    }

    /// The public point d * G, uncompressed (SEC 1: 0x04 || x || y).
    pub fn public_key(&self) -> &[u8; 65] {
        &self.public
    }

    /// Test hook (feature `test-hooks`) for the constant-time check
    /// (`ct/run.sh`): marks the private scalar undefined for valgrind
    /// memcheck (no-op without the `ct-valgrind` feature or outside
    /// valgrind).
    #[cfg(feature = "test-hooks")]
    pub fn ct_mark_secret(&self) {
        ct::mark_secret(&self.d_bytes);
        ct::mark_secret(&self.d_mont);
    }
}

impl Drop for EcdsaP256Key {
    fn drop(&mut self) {
        self.d_bytes.zeroize();
        self.d_mont.zeroize();
    }
}

impl core::fmt::Debug for EcdsaP256Key {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The private scalar is never printed.
        f.debug_struct("EcdsaP256Key")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

/// One ECDSA signature to compute.
pub struct EcdsaRequest<'a> {
    /// The key to sign with.
    pub key: &'a EcdsaP256Key,
    /// The hash of the TLS signature scheme; its digest's leftmost 256 bits
    /// are e.
    pub hash: Hash,
    /// The full data to sign; the engine hashes it (as [`crate::sign_batch`]
    /// does for RSA: BoringSSL's private-key callback hands over the message).
    pub message: &'a [u8],
}

/// Signs every request (keys may differ) with hedged nonces, 8 per pass on
/// the IFMA kernel: DER-encoded (r, s), as TLS sends it. Every signature is
/// fault-checked (see the module documentation); a failure gives
/// [`EngineError::FaultDetected`] for that request only.
///
/// # Example
///
/// ```
/// use tlsterm_engine::{ecdsa_p256_sign_batch, EcdsaP256Key, EcdsaRequest, Hash, P256Kernel};
///
/// // A 32-byte big-endian private scalar in [1, n - 1].
/// let key = EcdsaP256Key::from_private_scalar(&[0x42; 32])?;
/// let requests = [
///     EcdsaRequest { key: &key, hash: Hash::Sha256, message: b"first" },
///     EcdsaRequest { key: &key, hash: Hash::Sha384, message: b"second" },
/// ];
/// for signature in ecdsa_p256_sign_batch(P256Kernel::detect(), &requests) {
///     let der = signature?;
///     assert_eq!(der[0], 0x30); // DER SEQUENCE { r, s }
/// }
/// # Ok::<(), tlsterm_engine::EngineError>(())
/// ```
pub fn ecdsa_p256_sign_batch(
    kernel: P256Kernel,
    reqs: &[EcdsaRequest<'_>],
) -> Vec<Result<Vec<u8>, EngineError>> {
    sign_impl(kernel, reqs, &mut system_entropy, None)
}

/// Test hook (feature `test-hooks`): like [`ecdsa_p256_sign_batch`], but
/// corrupts s of request `fault_index` before the fault check (which must
/// catch it).
#[cfg(feature = "test-hooks")]
pub fn ecdsa_p256_sign_batch_with_fault(
    kernel: P256Kernel,
    reqs: &[EcdsaRequest<'_>],
    fault_index: usize,
) -> Vec<Result<Vec<u8>, EngineError>> {
    sign_impl(kernel, reqs, &mut system_entropy, Some(fault_index))
}

/// Fresh random bytes for the nonces of one pass.
fn system_entropy(out: &mut [[u8; 32]]) -> Result<(), EngineError> {
    getrandom::getrandom(out.as_flattened_mut()).map_err(|_| EngineError::Rng)
}

/// Fills the nonce entropy of one pass.
type EntropySource<'a> = dyn FnMut(&mut [[u8; 32]]) -> Result<(), EngineError> + 'a;

fn sign_impl(
    kernel: P256Kernel,
    reqs: &[EcdsaRequest<'_>],
    entropy: &mut EntropySource<'_>,
    fault: Option<usize>,
) -> Vec<Result<Vec<u8>, EngineError>> {
    if !kernel.is_available() {
        return reqs
            .iter()
            .map(|_| Err(EngineError::KernelUnavailable))
            .collect();
    }
    let mut out = Vec::with_capacity(reqs.len());
    // Nonces are drawn one pass (8 lanes) at a time, for either kernel, so
    // that at most 8 exist at once.
    for (g, group) in reqs.chunks(LANES).enumerate() {
        let mut fresh = Zeroizing::new(vec![[0u8; 32]; group.len()]);
        if let Err(e) = entropy(&mut fresh) {
            out.extend(group.iter().map(|_| Err(e.clone())));
            continue;
        }
        ct::mark_secret(&fresh);
        let es: Vec<[u8; 32]> = group
            .iter()
            .map(|r| digest_integer(r.hash, r.message))
            .collect();
        let mut ks = Zeroizing::new(Vec::with_capacity(group.len()));
        for ((r, e), fresh) in group.iter().zip(&es).zip(fresh.iter()) {
            ks.push(*nonce::derive(&r.key.d_bytes, e, fresh));
        }
        let points = nonce_points(kernel, &ks);
        for (lane, r) in group.iter().enumerate() {
            let corrupt = fault == Some(g * LANES + lane);
            out.push(finish(r.key, &es[lane], &ks[lane], &points[lane], corrupt));
        }
        ct::wipe_stack();
    }
    out
}

/// e of FIPS 186-4: the leftmost 256 bits of the message's digest, big-endian
/// (not yet reduced mod n).
fn digest_integer(hash: Hash, message: &[u8]) -> [u8; 32] {
    let digest = hash.digest(&[message]);
    digest[..32]
        .try_into()
        .expect("every TLS hash has 32 bytes or more")
}

/// What a kernel gives for one nonce k: R = k * G affine (x, y) and k^-1 mod
/// n, all canonical (not Montgomery form).
#[derive(Clone, Copy, Default, Zeroize)]
struct NoncePoint {
    x: U256,
    y: U256,
    k_inv: U256,
}

/// The nonce points of one pass (up to 8 nonces), by the kernel.
fn nonce_points(kernel: P256Kernel, ks: &[U256]) -> Zeroizing<Vec<NoncePoint>> {
    let mut out = Zeroizing::new(vec![NoncePoint::default(); ks.len()]);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        P256Kernel::Ifma => {
            let k = ifma::IfmaP256::new().expect("checked by the caller");
            for (ks, out) in ks.chunks(LANES).zip(out.chunks_mut(LANES)) {
                ifma_pass::nonce_points(&k, ks, out);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        P256Kernel::Ifma => unreachable!("checked by the caller"),
        P256Kernel::Portable => {
            for (o, k) in out.iter_mut().zip(ks) {
                let (x, y, k_inv) = point::nonce_point(k);
                *o = NoncePoint { x, y, k_inv };
            }
        }
    }
    out
}

/// s = k^-1 (e + r d) mod n, the fault check, and the DER encoding. Only r
/// and s leave constant-time code (declassified), and the one bit of the
/// check. `corrupt` flips a bit of s before the check (the test hook).
fn finish(
    key: &EcdsaP256Key,
    e: &[u8; 32],
    k: &U256,
    pt: &NoncePoint,
    corrupt: bool,
) -> Result<Vec<u8>, EngineError> {
    let e_m = mont::to_mont(&mont::reduce_once(&mont::from_be(e), &N), &N);
    // x < p < 2n: one subtraction reduces it mod n.
    let r = mont::reduce_once(&pt.x, &N);
    let r_m = mont::to_mont(&r, &N);
    let mut sum = mont::add(&e_m, &mont::mul(&r_m, &key.d_mont, &N), &N);
    let mut s_m = mont::mul(&mont::to_mont(&pt.k_inv, &N), &sum, &N);
    if corrupt {
        s_m[0] ^= 1;
    }
    let s = mont::from_mont(&s_m, &N);
    // The check, from independently computed values: s k against e + d r.
    let mut k_m = mont::to_mont(k, &N);
    let lhs = mont::mul(&s_m, &k_m, &N);
    let rhs = mont::add(&e_m, &mont::mul(&key.d_mont, &r_m, &N), &N);
    let nonzero = !mont::zero_mask(r.iter().fold(0, |a, w| a | w))
        & !mont::zero_mask(s.iter().fold(0, |a, w| a | w));
    let ok = mont::eq_mask(&lhs, &rhs) & point::on_curve_mask(&pt.x, &pt.y) & nonzero;
    sum.zeroize();
    s_m.zeroize();
    k_m.zeroize();
    // r = 0 or s = 0 (probability 2^-256) is refused like a fault: the
    // caller's fallback signs again with a fresh nonce, as FIPS 186-4 asks.
    if ct::declassified(ok & 1) != 1 {
        return Err(EngineError::FaultDetected);
    }
    let (r, s) = (mont::to_be(&r), mont::to_be(&s));
    ct::declassify(&r);
    ct::declassify(&s);
    Ok(der::encode(&r, &s))
}
