//! One pass of the IFMA kernel: up to 8 nonces packed into lanes (radix 2^52
//! limbs and signed digits), the kernel, the results unpacked. Scalar code,
//! constant time like the rest: memcheck runs it (`ct_p256_ifma_lanes`),
//! since it cannot run the kernel itself.

use super::ifma::IfmaP256;
use super::mont::U256;
use super::point::{signed_digits, DIGITS};
use super::NoncePoint;
use crate::bn::{Lanes, LANES};
use zeroize::Zeroize;

/// What a pass reads, lane by lane: each nonce as five radix-2^52 limbs and
/// as 65 signed radix-16 digits.
struct PassInput {
    k: [Lanes; 5],
    d: [Lanes; DIGITS],
}

impl Zeroize for PassInput {
    fn zeroize(&mut self) {
        self.k.zeroize();
        self.d.zeroize();
    }
}

/// Packs up to 8 nonces; missing lanes get k = 1 (a dummy, thrown away).
fn pack(ks: &[U256]) -> PassInput {
    let mut input = PassInput {
        k: [Lanes::default(); 5],
        d: [Lanes::default(); DIGITS],
    };
    for lane in 0..LANES {
        let k = ks.get(lane).unwrap_or(&[1, 0, 0, 0]);
        let mut d = signed_digits(k);
        for (i, di) in input.d.iter_mut().enumerate() {
            di.0[lane] = d[i] as i64 as u64;
        }
        d.zeroize();
        let mut limbs = to_limbs52(k);
        for (j, kj) in input.k.iter_mut().enumerate() {
            kj.0[lane] = limbs[j];
        }
        limbs.zeroize();
    }
    input
}

/// Lane `lane` of a radix-2^52 result.
fn unpack(r: &[Lanes; 5], lane: usize) -> U256 {
    let mut limbs = [0u64; 5];
    for (j, l) in limbs.iter_mut().enumerate() {
        *l = r[j].0[lane];
    }
    let out = from_limbs52(&limbs);
    limbs.zeroize();
    out
}

/// The nonce points of up to 8 nonces (see `super::nonce_points`).
pub(super) fn nonce_points(kernel: &IfmaP256, ks: &[U256], out: &mut [NoncePoint]) {
    let mut input = pack(ks);
    let mut r = [[Lanes::default(); 5]; 3];
    kernel.nonce_points(&mut r, &input.k, &input.d);
    for (lane, o) in out.iter_mut().enumerate() {
        *o = NoncePoint {
            x: unpack(&r[0], lane),
            y: unpack(&r[1], lane),
            k_inv: unpack(&r[2], lane),
        };
    }
    input.zeroize();
    r.zeroize();
}

/// Test hook (feature `test-hooks`) for the constant-time check
/// (`ct/run.sh`): the nonce side of an IFMA pass without the IFMA part, which
/// valgrind cannot run. Packs up to 8 nonces (canonical limbs) as a pass does
/// and unpacks the limbs again through the results' path. With marked nonces
/// memcheck must report nothing.
#[cfg(feature = "test-hooks")]
pub fn ct_p256_ifma_lanes(ks: &[U256]) -> Vec<U256> {
    let mut input = pack(ks);
    core::hint::black_box(&mut input);
    let out = (0..ks.len().min(LANES))
        .map(|l| unpack(&input.k, l))
        .collect();
    input.zeroize();
    out
}

/// Four 64-bit limbs -> five radix-2^52 limbs.
fn to_limbs52(w: &U256) -> [u64; 5] {
    const M: u64 = (1 << 52) - 1;
    [
        w[0] & M,
        ((w[0] >> 52) | (w[1] << 12)) & M,
        ((w[1] >> 40) | (w[2] << 24)) & M,
        ((w[2] >> 28) | (w[3] << 36)) & M,
        w[3] >> 16,
    ]
}

/// Five radix-2^52 limbs (a value below 2^256) -> four 64-bit limbs.
fn from_limbs52(l: &[u64; 5]) -> U256 {
    [
        l[0] | (l[1] << 52),
        (l[1] >> 12) | (l[2] << 40),
        (l[2] >> 24) | (l[3] << 28),
        (l[3] >> 36) | (l[4] << 16),
    ]
}
