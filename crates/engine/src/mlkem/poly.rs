//! Polynomials of ML-KEM (FIPS 203) for eight encapsulations at once: a
//! [`Poly8`] holds coefficient `i` of the eight lanes' polynomials in one
//! `[i32; 8]`, so every step below is the same arithmetic on each lane, which
//! the compiler turns into one vector instruction for the eight.
//!
//! Coefficients live in Z_q, q = 3329, as signed representatives; products
//! are reduced by Montgomery reduction (R = 2^16) and sums by Barrett
//! reduction, the bounds of the Kyber reference implementation, whose 16-bit
//! arithmetic these 32-bit lanes contain with room to spare. No branch and no
//! memory index depends on a coefficient: the noise and the message are
//! secret.

use crate::bn::LANES;
use zeroize::Zeroize;

/// Coefficients per polynomial.
pub(crate) const N: usize = 256;
/// The modulus.
pub(crate) const Q: i32 = 3329;

/// Coefficient `i` of eight polynomials, one per lane.
pub(crate) type Coefficients = [i32; LANES];

/// Eight polynomials, coefficient-major.
#[derive(Clone, Zeroize)]
pub(crate) struct Poly8(pub(crate) [Coefficients; N]);

impl Poly8 {
    pub(crate) const ZERO: Poly8 = Poly8([[0; LANES]; N]);
}

/// `a * R^-1 mod q` for |a| < 2^15 q, in (-q, q).
#[inline(always)]
fn montgomery_reduce(a: i32) -> i32 {
    // q^-1 mod 2^16 is -3327 as a signed 16-bit value; t = a q^-1 mod 2^16, so
    // a - t q is a multiple of 2^16.
    let t = (a as i16).wrapping_mul(-3327) as i32;
    (a - t * Q) >> 16
}

/// `a * b * R^-1 mod q` for |a b| < 2^15 q.
#[inline(always)]
fn fqmul(a: i32, b: i32) -> i32 {
    montgomery_reduce(a * b)
}

/// `a mod q` in [-(q-1)/2, (q-1)/2] for |a| < 2^15.
#[inline(always)]
fn barrett_reduce(a: i32) -> i32 {
    // 20159 = round(2^26 / q).
    let t = (20159 * a + (1 << 25)) >> 26;
    a - t * Q
}

/// The 7-bit reversal of `k`.
const fn bit_reverse7(k: usize) -> usize {
    let mut r = 0;
    let mut i = 0;
    while i < 7 {
        r |= ((k >> i) & 1) << (6 - i);
        i += 1;
    }
    r
}

/// `zeta^bitrev7(k) * R mod q`, centred, with zeta = 17 the 256th root of
/// unity FIPS 203 fixes: the NTT's twiddle factors in Montgomery form.
const ZETAS: [i32; 128] = {
    let mut table = [0i32; 128];
    let mut k = 0;
    while k < 128 {
        let mut power: i64 = 1;
        let mut e = 0;
        while e < bit_reverse7(k) {
            power = power * 17 % Q as i64;
            e += 1;
        }
        let mont = (power << 16) % Q as i64;
        table[k] = if mont > (Q as i64) / 2 {
            (mont - Q as i64) as i32
        } else {
            mont as i32
        };
        k += 1;
    }
    table
};

/// Applies `f` to every coefficient of every lane.
#[inline(always)]
fn map(p: &mut Poly8, f: impl Fn(i32) -> i32) {
    for x in p.0.as_flattened_mut() {
        *x = f(*x);
    }
}

/// Barrett-reduces every coefficient.
#[inline(always)]
pub(crate) fn reduce(p: &mut Poly8) {
    map(p, barrett_reduce);
}

/// `a += b`.
#[inline(always)]
pub(crate) fn add(a: &mut Poly8, b: &Poly8) {
    for (x, y) in a.0.as_flattened_mut().iter_mut().zip(b.0.as_flattened()) {
        *x += y;
    }
}

/// The forward NTT in place (FIPS 203 algorithm 9, Cooley-Tukey butterflies),
/// then reduced: from |a| < q to |a| < q/2 in the NTT domain.
#[inline(always)]
pub(crate) fn ntt(p: &mut Poly8) {
    let mut k = 1;
    let mut len = 128;
    while len >= 2 {
        let mut start = 0;
        while start < N {
            let zeta = ZETAS[k];
            k += 1;
            let (low, high) = p.0[start..start + 2 * len].split_at_mut(len);
            for (x, y) in low
                .as_flattened_mut()
                .iter_mut()
                .zip(high.as_flattened_mut())
            {
                let t = fqmul(zeta, *y);
                *y = *x - t;
                *x += t;
            }
            start += 2 * len;
        }
        len /= 2;
    }
    reduce(p);
}

/// The inverse NTT in place (FIPS 203 algorithm 10, Gentleman-Sande
/// butterflies), its final scaling by 1/128 combined with a factor R: the
/// product of two NTT-domain polynomials by [`multiply_accumulate`] (which
/// leaves a factor R^-1) comes back in the normal domain.
#[inline(always)]
pub(crate) fn inverse_ntt(p: &mut Poly8) {
    // R^2 / 128 mod q.
    const SCALE: i32 = 1441;
    let mut k = 127;
    let mut len = 2;
    while len <= 128 {
        let mut start = 0;
        while start < N {
            let zeta = ZETAS[k];
            k -= 1;
            let (low, high) = p.0[start..start + 2 * len].split_at_mut(len);
            for (x, y) in low
                .as_flattened_mut()
                .iter_mut()
                .zip(high.as_flattened_mut())
            {
                let t = *x;
                *x = barrett_reduce(t + *y);
                *y = fqmul(zeta, *y - t);
            }
            start += 2 * len;
        }
        len *= 2;
    }
    map(p, |x| fqmul(x, SCALE));
}

/// `acc = sum of a[i] * b[i]` in the NTT domain (FIPS 203 algorithm 11: 128
/// products of degree-one polynomials mod X^2 - zeta^(2 bitrev7(i) + 1)),
/// with a factor R^-1, reduced. `a` is the public matrix row or key (|a| < q),
/// `b` the NTT of the noise (|b| < q/2).
#[inline(always)]
pub(crate) fn multiply_accumulate(acc: &mut Poly8, a: &[Poly8], b: &[Poly8]) {
    *acc = Poly8::ZERO;
    for (a, b) in a.iter().zip(b) {
        for i in 0..N / 4 {
            let zeta = ZETAS[64 + i];
            for (pair, zeta) in [(4 * i, zeta), (4 * i + 2, -zeta)] {
                let (a0, a1, b0, b1) = (a.0[pair], a.0[pair + 1], b.0[pair], b.0[pair + 1]);
                for l in 0..LANES {
                    let c0 = fqmul(fqmul(a1[l], b1[l]), zeta) + fqmul(a0[l], b0[l]);
                    let c1 = fqmul(a0[l], b1[l]) + fqmul(a1[l], b0[l]);
                    acc.0[pair][l] += c0;
                    acc.0[pair + 1][l] += c1;
                }
            }
        }
    }
    reduce(acc);
}

/// The two 12-bit values in three bytes, little-endian (the layout of
/// ByteDecode12, and of SampleNTT's candidates).
#[inline(always)]
pub(crate) fn unpack12(b: &[u8]) -> [i32; 2] {
    let (b0, b1, b2) = (i32::from(b[0]), i32::from(b[1]), i32::from(b[2]));
    [b0 | ((b1 & 0x0f) << 8), (b1 >> 4) | (b2 << 4)]
}

/// Lane `lane` of `p` from 384 bytes of 12-bit coefficients (ByteDecode12,
/// FIPS 203 algorithm 6). `false` if a coefficient is q or more: the modulus
/// check FIPS 203 asks of an encapsulation key (the key is public).
pub(crate) fn decode12(p: &mut Poly8, lane: usize, bytes: &[u8]) -> bool {
    let mut valid = true;
    for (i, b) in bytes.chunks_exact(3).enumerate() {
        let [c0, c1] = unpack12(b);
        valid &= c0 < Q && c1 < Q;
        p.0[2 * i][lane] = c0;
        p.0[2 * i + 1][lane] = c1;
    }
    valid
}

/// Adds the message: coefficient `8i + j` of lane `l` gains
/// Decompress1(bit j of byte i of `messages[l]`), that is 0 or (q + 1) / 2,
/// by a mask (the message is secret).
#[inline(always)]
pub(crate) fn add_message(p: &mut Poly8, messages: &[[u8; 32]; LANES]) {
    for (i, c) in p.0.iter_mut().enumerate() {
        for (l, x) in c.iter_mut().enumerate() {
            let bit = i32::from(messages[l][i / 8] >> (i % 8)) & 1;
            *x += -bit & ((Q + 1) / 2);
        }
    }
}

/// Each lane of `p` from its 128 bytes of pseudo-random output: the centred
/// binomial distribution with eta = 2 (FIPS 203 algorithm 8), each
/// coefficient the difference of two 2-bit popcounts, lane-wise. Branch-free:
/// the bytes are the secret noise.
#[inline(always)]
pub(crate) fn centred_binomial2(p: &mut Poly8, bytes: &[[u8; 128]; LANES]) {
    for (i, eight) in p.0.chunks_exact_mut(8).enumerate() {
        let t: [u32; LANES] = core::array::from_fn(|l| {
            u32::from_le_bytes(bytes[l][4 * i..4 * i + 4].try_into().expect("4 bytes"))
        });
        let d: [u32; LANES] =
            core::array::from_fn(|l| (t[l] & 0x5555_5555) + ((t[l] >> 1) & 0x5555_5555));
        for (j, c) in eight.iter_mut().enumerate() {
            for (x, d) in c.iter_mut().zip(&d) {
                *x = ((d >> (4 * j)) & 3) as i32 - ((d >> (4 * j + 2)) & 3) as i32;
            }
        }
    }
}

/// The representative in [0, q) of a reduced coefficient (|x| < q).
#[inline(always)]
fn positive(x: i32) -> u32 {
    (x + ((x >> 31) & Q)) as u32
}

/// Compress_10 (FIPS 203 (4.7)): round(2^10 x / q) mod 2^10, the division
/// by q as a multiplication and a shift (exact for every x in [0, q)).
#[inline(always)]
pub(crate) fn compress10(x: i32) -> u32 {
    let n = (u64::from(positive(x)) << 10) + (Q as u64 / 2);
    ((n * 2_580_335) >> 33) as u32 & 0x3ff
}

/// Compress_4: round(16 x / q) mod 16, likewise.
#[inline(always)]
pub(crate) fn compress4(x: i32) -> u32 {
    let n = (positive(x) << 4) + (Q as u32 / 2);
    ((n * 20_159) >> 26) & 0xf
}

/// Compresses every coefficient (reduced) in place by `compress`
/// ([`compress10`] or [`compress4`]).
#[inline(always)]
pub(crate) fn compress(p: &mut Poly8, compress: fn(i32) -> u32) {
    map(p, |x| compress(x) as i32);
}

/// Lane `lane` of `p` (compressed to 10 bits), packed: 320 bytes.
pub(crate) fn pack10(p: &Poly8, lane: usize, out: &mut [u8]) {
    for (four, bytes) in p.0.chunks_exact(4).zip(out.chunks_exact_mut(5)) {
        let t: [u32; 4] = core::array::from_fn(|k| four[k][lane] as u32);
        bytes[0] = t[0] as u8;
        bytes[1] = ((t[0] >> 8) | (t[1] << 2)) as u8;
        bytes[2] = ((t[1] >> 6) | (t[2] << 4)) as u8;
        bytes[3] = ((t[2] >> 4) | (t[3] << 6)) as u8;
        bytes[4] = (t[3] >> 2) as u8;
    }
}

/// Lane `lane` of `p` (compressed to 4 bits), packed: 128 bytes.
pub(crate) fn pack4(p: &Poly8, lane: usize, out: &mut [u8]) {
    for (two, byte) in p.0.chunks_exact(2).zip(out.iter_mut()) {
        *byte = (two[0][lane] | (two[1][lane] << 4)) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zetas_match_fips_203() {
        // Appendix A's first entries are 17^bitrev7(k): 1, 1729, 2580, 3289.
        for (k, plain) in [(0, 1), (1, 1729), (2, 2580), (3, 3289)] {
            let mont = (ZETAS[k] as i64).rem_euclid(Q as i64);
            assert_eq!(mont, (plain << 16) % Q as i64);
        }
    }

    #[test]
    fn compression_is_exact_rounding() {
        for x in 0..Q {
            let round =
                |d: u32| ((((x as u64) << d) * 2 + Q as u64) / (2 * Q as u64)) as u32 % (1 << d);
            assert_eq!(compress10(x), round(10), "{x}");
            assert_eq!(compress4(x), round(4), "{x}");
            // The centred representative compresses the same.
            if x > 0 {
                assert_eq!(compress10(x - Q), round(10), "{x} - q");
                assert_eq!(compress4(x - Q), round(4), "{x} - q");
            }
        }
    }

    #[test]
    fn reductions_are_congruent_and_bounded() {
        for a in -(1 << 15) + 1..(1 << 15) {
            let r = barrett_reduce(a);
            assert_eq!((r - a).rem_euclid(Q), 0);
            assert!(r.abs() <= (Q - 1) / 2, "{a} -> {r}");
        }
        for a in [-(Q << 15) + 1, -12345678, -1, 0, 1, 99999, (Q << 15) - 1] {
            let r = montgomery_reduce(a);
            assert_eq!(
                ((r as i64) << 16).rem_euclid(Q as i64),
                (a as i64).rem_euclid(Q as i64)
            );
            assert!(r.abs() < Q);
        }
    }

    /// The schoolbook product in Z_q[X]/(X^256 + 1) of one lane, against the
    /// NTT route (forward, multiply, inverse).
    #[test]
    fn ntt_multiplication_matches_schoolbook() {
        let mut seed = [0u8; 4 * N * LANES];
        getrandom::getrandom(&mut seed).unwrap();
        let coefficient =
            |i: usize| i32::from(u16::from_le_bytes([seed[2 * i], seed[2 * i + 1]])) % Q;
        let (mut a, mut b) = (Poly8::ZERO, Poly8::ZERO);
        for i in 0..N {
            for l in 0..LANES {
                a.0[i][l] = coefficient(i * LANES + l);
                // The noise side: small and signed, as in an encapsulation.
                b.0[i][l] = coefficient(N * LANES + i * LANES + l) % 5 - 2;
            }
        }
        let mut want = vec![[0i64; LANES]; N];
        for (i, a) in a.0.iter().enumerate() {
            for (j, b) in b.0.iter().enumerate() {
                // X^256 = -1.
                let (k, sign) = if i + j < N {
                    (i + j, 1)
                } else {
                    (i + j - N, -1)
                };
                for (w, (x, y)) in want[k].iter_mut().zip(a.iter().zip(b)) {
                    *w += sign * i64::from(*x) * i64::from(*y);
                }
            }
        }
        let (mut a_hat, mut b_hat) = (a.clone(), b.clone());
        ntt(&mut a_hat);
        ntt(&mut b_hat);
        let mut product = Poly8::ZERO;
        multiply_accumulate(
            &mut product,
            core::slice::from_ref(&a_hat),
            core::slice::from_ref(&b_hat),
        );
        inverse_ntt(&mut product);
        for (i, (got, want)) in product.0.iter().zip(&want).enumerate() {
            for (l, (got, want)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    i64::from(*got).rem_euclid(Q as i64),
                    want.rem_euclid(Q as i64),
                    "coefficient {i}, lane {l}"
                );
            }
        }
    }
}
