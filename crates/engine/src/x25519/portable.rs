//! Portable X25519: one scalar multiplication at a time, field elements in
//! radix 2^51 (five u64 limbs, u128 products). The reference the IFMA kernel
//! is compared with on every CPU, and the kernel of CPUs without IFMA.
//!
//! Constant time: straight-line field arithmetic (no branch, no index on
//! values; `u64 x u64 -> u128` is a single `mul` on x86_64 and aarch64), a
//! ladder whose conditional swaps are masks, and an inversion by a fixed
//! addition chain. `ct/run.sh` runs it under valgrind with the scalar marked
//! secret.

use zeroize::Zeroize;

const MASK51: u64 = (1 << 51) - 1;

/// A field element mod p = 2^255 - 19: value sum(l[i] * 2^(51 i)). After
/// `mul`, `sqr`, `sub` or `carry`, limbs are < 2^52; `add` of two such gives
/// limbs < 2^53, which `mul` and `sqr` accept (5 * 19 * 2^54 * 2^54 < 2^128).
#[derive(Clone, Copy, Default)]
pub(crate) struct Fe(pub(crate) [u64; 5]);

impl Zeroize for Fe {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}

impl Fe {
    pub(crate) const ONE: Fe = Fe([1, 0, 0, 0, 0]);

    /// Little-endian bytes; bit 255 is ignored (RFC 7748, section 5), and
    /// values in [p, 2^255) are taken as they are (reduced by the arithmetic).
    pub(crate) fn from_bytes(b: &[u8; 32]) -> Fe {
        let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let (w0, w1, w2, w3) = (w(0), w(1), w(2), w(3) & ((1 << 63) - 1));
        Fe([
            w0 & MASK51,
            ((w0 >> 51) | (w1 << 13)) & MASK51,
            ((w1 >> 38) | (w2 << 26)) & MASK51,
            ((w2 >> 25) | (w3 << 39)) & MASK51,
            w3 >> 12,
        ])
    }

    /// The canonical encoding (value reduced below p).
    pub(crate) fn encode(&self) -> [u8; 32] {
        // After two carry passes every limb is < 2^51 (the second pass's
        // top carry is 0 or 1, and when it is 1 the limbs it lands on are
        // small): the value is below 2^255, so p is subtracted at most once.
        let mut t = self.carry().carry().0;
        // x + 19 has bit 255 set iff x >= p; then x - p = (x + 19) - 2^255.
        let mut y = [0u64; 5];
        let mut c = 19u64;
        for i in 0..5 {
            let v = t[i] + c;
            y[i] = v & MASK51;
            c = v >> 51;
        }
        let ge = crate::bn::barrier(c.wrapping_neg()); // all ones iff x >= p
        for i in 0..5 {
            t[i] = (y[i] & ge) | (t[i] & !ge);
        }
        let mut out = [0u8; 32];
        let words = [
            t[0] | (t[1] << 51),
            (t[1] >> 13) | (t[2] << 38),
            (t[2] >> 26) | (t[3] << 25),
            (t[3] >> 39) | (t[4] << 12),
        ];
        for (i, w) in words.iter().enumerate() {
            out[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        t.zeroize();
        y.zeroize();
        out
    }

    /// One carry pass: limbs 0..3 < 2^51, limb 4 < 2^51 + 2^13 (for input
    /// limbs < 2^63).
    #[inline(always)]
    fn carry(&self) -> Fe {
        let mut l = self.0;
        let c4 = l[4] >> 51;
        l[4] &= MASK51;
        l[0] += 19 * c4;
        for i in 0..4 {
            l[i + 1] += l[i] >> 51;
            l[i] &= MASK51;
        }
        Fe(l)
    }

    #[inline(always)]
    pub(crate) fn add(&self, b: &Fe) -> Fe {
        let mut r = [0u64; 5];
        for (i, ri) in r.iter_mut().enumerate() {
            *ri = self.0[i] + b.0[i];
        }
        Fe(r)
    }

    /// `self - b + 4p`, limbs stay non-negative for `b` limbs < 2^53 - 76.
    #[inline(always)]
    pub(crate) fn sub(&self, b: &Fe) -> Fe {
        const FOUR_P: [u64; 5] = [
            4 * ((1 << 51) - 19),
            4 * MASK51,
            4 * MASK51,
            4 * MASK51,
            4 * MASK51,
        ];
        let mut r = [0u64; 5];
        for (i, ri) in r.iter_mut().enumerate() {
            *ri = self.0[i] + FOUR_P[i] - b.0[i];
        }
        Fe(r).carry()
    }

    #[inline(always)]
    pub(crate) fn mul(&self, b: &Fe) -> Fe {
        let (a, b) = (&self.0, &b.0);
        let m = |x: u64, y: u64| (x as u128) * (y as u128);
        let (b1, b2, b3, b4) = (19 * b[1], 19 * b[2], 19 * b[3], 19 * b[4]);
        let r = [
            m(a[0], b[0]) + m(a[1], b4) + m(a[2], b3) + m(a[3], b2) + m(a[4], b1),
            m(a[0], b[1]) + m(a[1], b[0]) + m(a[2], b4) + m(a[3], b3) + m(a[4], b2),
            m(a[0], b[2]) + m(a[1], b[1]) + m(a[2], b[0]) + m(a[3], b4) + m(a[4], b3),
            m(a[0], b[3]) + m(a[1], b[2]) + m(a[2], b[1]) + m(a[3], b[0]) + m(a[4], b4),
            m(a[0], b[4]) + m(a[1], b[3]) + m(a[2], b[2]) + m(a[3], b[1]) + m(a[4], b[0]),
        ];
        reduce_wide(r)
    }

    #[inline(always)]
    pub(crate) fn sqr(&self) -> Fe {
        let a = &self.0;
        let m = |x: u64, y: u64| (x as u128) * (y as u128);
        let (d0, d1, d2, d3) = (2 * a[0], 2 * a[1], 2 * a[2], 2 * a[3]);
        let (a3_19, a4_19) = (19 * a[3], 19 * a[4]);
        let r = [
            m(a[0], a[0]) + m(d1, a4_19) + m(d2, a3_19),
            m(d0, a[1]) + m(d2, a4_19) + m(a[3], a3_19),
            m(d0, a[2]) + m(a[1], a[1]) + m(d3, a4_19),
            m(d0, a[3]) + m(d1, a[2]) + m(a[4], a4_19),
            m(d0, a[4]) + m(d1, a[3]) + m(a[2], a[2]),
        ];
        reduce_wide(r)
    }

    /// `self * 121665` (the ladder's (A - 2) / 4).
    #[inline(always)]
    pub(crate) fn mul_a24(&self) -> Fe {
        let mut r = [0u128; 5];
        for (i, ri) in r.iter_mut().enumerate() {
            *ri = (self.0[i] as u128) * 121_665;
        }
        reduce_wide(r)
    }

    /// Swaps `a` and `b` where `mask` is all ones, leaves them where it is 0.
    #[inline(always)]
    pub(crate) fn cswap(a: &mut Fe, b: &mut Fe, mask: u64) {
        for i in 0..5 {
            let d = (a.0[i] ^ b.0[i]) & mask;
            a.0[i] ^= d;
            b.0[i] ^= d;
        }
    }

    /// `self^(2^n)`.
    #[inline(always)]
    fn sqr_n(&self, n: usize) -> Fe {
        let mut r = *self;
        for _ in 0..n {
            r = r.sqr();
        }
        r
    }

    /// `self^(p-2)` (the inverse, 0 for 0) by the usual fixed chain:
    /// 254 squarings, 11 multiplications.
    pub(crate) fn invert(&self) -> Fe {
        let z = *self;
        let z2 = z.sqr();
        let z9 = z2.sqr_n(2).mul(&z);
        let z11 = z9.mul(&z2);
        let z_5_0 = z11.sqr().mul(&z9);
        let z_10_0 = z_5_0.sqr_n(5).mul(&z_5_0);
        let z_20_0 = z_10_0.sqr_n(10).mul(&z_10_0);
        let z_40_0 = z_20_0.sqr_n(20).mul(&z_20_0);
        let z_50_0 = z_40_0.sqr_n(10).mul(&z_10_0);
        let z_100_0 = z_50_0.sqr_n(50).mul(&z_50_0);
        let z_200_0 = z_100_0.sqr_n(100).mul(&z_100_0);
        let z_250_0 = z_200_0.sqr_n(50).mul(&z_50_0);
        z_250_0.sqr_n(5).mul(&z11)
    }
}

/// Carries 128-bit column sums (< 2^116) into limbs < 2^52: the top carry
/// (< 2^66) comes back times 19, since 2^255 = 19 mod p.
#[inline(always)]
fn reduce_wide(r: [u128; 5]) -> Fe {
    let mut l = [0u64; 5];
    let mut c: u128 = 0;
    for i in 0..5 {
        let v = r[i] + c;
        l[i] = (v as u64) & MASK51;
        c = v >> 51;
    }
    let v = (l[0] as u128) + c * 19;
    l[0] = (v as u64) & MASK51;
    l[1] += (v >> 51) as u64;
    Fe(l)
}

/// RFC 7748's clamping of a scalar.
pub(crate) fn clamp(k: &[u8; 32]) -> [u8; 32] {
    let mut k = *k;
    k[0] &= 248;
    k[31] &= 127;
    k[31] |= 64;
    k
}

/// X25519(k, u) for a clamped scalar: the Montgomery ladder of RFC 7748,
/// section 5, from bit 254 down.
pub(crate) fn scalar_mult(k: &[u8; 32], u: &[u8; 32]) -> [u8; 32] {
    let x1 = Fe::from_bytes(u);
    let (mut x2, mut z2, mut x3, mut z3) = (Fe::ONE, Fe::default(), x1, Fe::ONE);
    let mut swap = 0u64;
    for t in (0..255).rev() {
        let bit = ((k[t / 8] >> (t % 8)) & 1) as u64;
        swap ^= bit;
        let mask = crate::bn::barrier(swap.wrapping_neg());
        Fe::cswap(&mut x2, &mut x3, mask);
        Fe::cswap(&mut z2, &mut z3, mask);
        swap = bit;
        ladder_step(&x1, &mut x2, &mut z2, &mut x3, &mut z3);
    }
    let mask = crate::bn::barrier(swap.wrapping_neg());
    Fe::cswap(&mut x2, &mut x3, mask);
    Fe::cswap(&mut z2, &mut z3, mask);
    let mut zi = z2.invert();
    let out = x2.mul(&zi).encode();
    for fe in [&mut x2, &mut z2, &mut x3, &mut z3, &mut zi] {
        fe.zeroize();
    }
    out
}

/// One differential addition and doubling (RFC 7748's formulas).
#[inline(always)]
fn ladder_step(x1: &Fe, x2: &mut Fe, z2: &mut Fe, x3: &mut Fe, z3: &mut Fe) {
    let a = x2.add(z2);
    let aa = a.sqr();
    let b = x2.sub(z2);
    let bb = b.sqr();
    let e = aa.sub(&bb);
    let c = x3.add(z3);
    let d = x3.sub(z3);
    let da = d.mul(&a);
    let cb = c.mul(&b);
    *x3 = da.add(&cb).sqr();
    *z3 = x1.mul(&da.sub(&cb).sqr());
    *x2 = aa.mul(&bb);
    *z2 = e.mul(&aa.add(&e.mul_a24()));
}
