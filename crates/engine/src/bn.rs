//! Radix-2^52 big numbers: the representation shared by both kernels, and the
//! scalar constant-time helpers used outside the hot loops (key setup, CRT
//! recombination, conversions).
//!
//! A number is a little-endian slice of limbs, each `< 2^52` when normalized.
//! Every function here runs in time that depends only on slice lengths, never
//! on limb values: no data-dependent branch or index.

use zeroize::Zeroize;

pub const LIMB_BITS: usize = 52;
pub const MASK52: u64 = (1 << LIMB_BITS) - 1;
/// Lanes of the multi-buffer layout (64-bit lanes of a 512-bit register).
pub const LANES: usize = 8;

/// One limb position of 8 independent numbers ("vertical" layout: a number
/// `[Lanes; N]` holds limb k of lane i in `x[k].0[i]`), aligned like a zmm.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Lanes(pub [u64; LANES]);

impl Zeroize for Lanes {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}

/// Hides a mask from the optimizer. Without it LLVM recognizes
/// `(x & m) | (y & !m)` with `m` in {0, !0} and may emit a branch, which the
/// valgrind check (ct/run.sh) caught. `black_box` forces the value through
/// memory, so the compiler can no longer reason about its range.
#[inline(always)]
pub fn barrier(x: u64) -> u64 {
    core::hint::black_box(x)
}

/// Limbs needed for `bits` bits.
pub const fn limbs_for_bits(bits: usize) -> usize {
    bits.div_ceil(LIMB_BITS)
}

/// Big-endian bytes -> `n` limbs. Bytes beyond `n * 52` bits must be zero
/// (callers check lengths; the loop is over the public byte length).
pub fn from_be_bytes(bytes: &[u8], n: usize) -> Vec<u64> {
    let mut out = vec![0u64; n];
    for (i, &b) in bytes.iter().rev().enumerate() {
        let bit = i * 8;
        let (limb, off) = (bit / LIMB_BITS, bit % LIMB_BITS);
        if limb < n {
            out[limb] |= ((b as u64) << off) & MASK52;
            if off > LIMB_BITS - 8 && limb + 1 < n {
                out[limb + 1] |= (b as u64) >> (LIMB_BITS - off);
            }
        }
    }
    out
}

/// Normalized limbs -> big-endian bytes of length `len`.
pub fn to_be_bytes(x: &[u64], len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (i, o) in out.iter_mut().rev().enumerate() {
        let bit = i * 8;
        let (limb, off) = (bit / LIMB_BITS, bit % LIMB_BITS);
        let mut v = 0u64;
        if limb < x.len() {
            v = x[limb] >> off;
            if off > LIMB_BITS - 8 && limb + 1 < x.len() {
                v |= x[limb + 1] << (LIMB_BITS - off);
            }
        }
        *o = v as u8;
    }
    out
}

/// Propagates carries so that every limb is `< 2^52`; returns the carry out.
pub fn normalize(x: &mut [u64]) -> u64 {
    let mut carry = 0u64;
    for l in x.iter_mut() {
        let v = *l + carry;
        *l = v & MASK52;
        carry = v >> LIMB_BITS;
    }
    carry
}

/// `r = a + b` (normalized inputs, same length); returns the carry out.
pub fn add(r: &mut [u64], a: &[u64], b: &[u64]) -> u64 {
    let mut carry = 0u64;
    for i in 0..r.len() {
        let v = a[i] + b[i] + carry;
        r[i] = v & MASK52;
        carry = v >> LIMB_BITS;
    }
    carry
}

/// `r = a - b` (normalized inputs); returns the borrow out (1 if a < b).
pub fn sub(r: &mut [u64], a: &[u64], b: &[u64]) -> u64 {
    let mut borrow = 0u64;
    for i in 0..r.len() {
        let v = a[i].wrapping_sub(b[i]).wrapping_sub(borrow);
        r[i] = v & MASK52;
        borrow = v >> 63;
    }
    borrow
}

/// If `x >= m` then `x -= m`, by mask (constant time).
pub fn cond_sub(x: &mut [u64], m: &[u64]) {
    let mut t = vec![0u64; x.len()];
    let borrow = sub(&mut t, x, m);
    // borrow == 1 -> keep x; borrow == 0 -> take t.
    let keep = barrier(borrow.wrapping_neg());
    for i in 0..x.len() {
        x[i] = (x[i] & keep) | (t[i] & !keep);
    }
    t.zeroize();
}

/// All-ones if `a == b`, else zero (constant time).
pub fn ct_eq_mask(a: &[u64], b: &[u64]) -> u64 {
    let mut acc = 0u64;
    for i in 0..a.len() {
        acc |= a[i] ^ b[i];
    }
    // acc == 0 <=> equal; (acc | -acc) has the top bit set iff acc != 0.
    barrier(((acc | acc.wrapping_neg()) >> 63).wrapping_sub(1))
}

/// Schoolbook product of normalized `a` and `b` into `r` (len a + len b),
/// normalized.
pub fn mul(r: &mut [u64], a: &[u64], b: &[u64]) {
    debug_assert_eq!(r.len(), a.len() + b.len());
    r.fill(0);
    // Lazy carries: each column sums at most 2*min(len) values < 2^52.
    for (i, &ai) in a.iter().enumerate() {
        for (j, &bj) in b.iter().enumerate() {
            let p = ai as u128 * bj as u128;
            r[i + j] += (p as u64) & MASK52;
            r[i + j + 1] += (p >> LIMB_BITS) as u64;
        }
        if i % 512 == 511 {
            normalize(r);
        }
    }
    normalize(r);
}

/// `-m^-1 mod 2^52` for odd `m0` (Newton iteration, constant time).
pub fn mont_k0(m0: u64) -> u64 {
    let mut inv = m0; // correct to 3 bits for odd m0
    for _ in 0..5 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(m0.wrapping_mul(inv)));
    }
    inv.wrapping_neg() & MASK52
}

/// Almost Montgomery multiplication of one number: `a*b*2^(-52n) mod m`,
/// result `< 2m` when `a*b < 4m^2` and `4m < 2^(52n)`. Same algorithm, limb by
/// limb, as the SIMD kernel, so both give bit-identical results.
pub fn amm(r: &mut [u64], a: &[u64], b: &[u64], m: &[u64], k0: u64) {
    let n = m.len();
    // t has n+1 accumulators; each receives at most 4n values < 2^52 over its
    // lifetime, which fits in 64 bits for n <= 1000.
    let mut t = [0u64; 81];
    let t = &mut t[..n + 1];
    for &bi in b.iter() {
        for j in 0..n {
            let p = a[j] as u128 * bi as u128;
            t[j] += (p as u64) & MASK52;
            t[j + 1] += (p >> LIMB_BITS) as u64;
        }
        let y = t[0].wrapping_mul(k0) & MASK52;
        for j in 0..n {
            let p = m[j] as u128 * y as u128;
            t[j] += (p as u64) & MASK52;
            t[j + 1] += (p >> LIMB_BITS) as u64;
        }
        // t[0] is now divisible by 2^52: shift the accumulator down one limb.
        let carry = t[0] >> LIMB_BITS;
        for j in 0..n {
            t[j] = t[j + 1];
        }
        t[n] = 0;
        t[0] += carry;
    }
    r.copy_from_slice(&t[..n]);
    normalize(r);
    t.zeroize();
}

/// `2^(52 * n * k) mod m`... computed as `2^bits mod m` by doubling with masked
/// subtraction (constant time; used once per key).
pub fn pow2_mod(bits: usize, m: &[u64]) -> Vec<u64> {
    let n = m.len();
    let mut x = vec![0u64; n];
    x[0] = 1;
    let mut t = vec![0u64; n];
    for _ in 0..bits {
        // x < m < 2^(52n - 1) here (callers give m with headroom), so 2x fits.
        for l in x.iter_mut() {
            *l <<= 1;
        }
        normalize(&mut x);
        let borrow = sub(&mut t, &x, m);
        let keep = barrier(borrow.wrapping_neg());
        for i in 0..n {
            x[i] = (x[i] & keep) | (t[i] & !keep);
        }
    }
    t.zeroize();
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_roundtrip() {
        let bytes: Vec<u8> = (0..256u32).map(|i| (i * 37 + 11) as u8).collect();
        let l = from_be_bytes(&bytes, 40);
        assert!(l.iter().all(|&x| x <= MASK52));
        assert_eq!(to_be_bytes(&l, 256), bytes);
    }

    #[test]
    fn k0_inverts() {
        for m0 in [1u64, 3, 0xf_ffff_ffff_ffff, 0x1234_5678_9abd] {
            assert_eq!(m0.wrapping_mul(mont_k0(m0)).wrapping_add(1) & MASK52, 0);
        }
    }

    #[test]
    fn eq_mask() {
        assert_eq!(ct_eq_mask(&[1, 2], &[1, 2]), u64::MAX);
        assert_eq!(ct_eq_mask(&[1, 2], &[1, 3]), 0);
    }
}
