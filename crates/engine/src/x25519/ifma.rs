//! X25519 on AVX-512 IFMA: 8 scalar multiplications at once, one per 64-bit
//! lane, field elements in radix 2^52 (five limbs, limb k of the 8 elements
//! in one zmm: the "vertical" layout of the RSA kernel).
//!
//! A field element mod p = 2^255 - 19 is kept "normalized" between
//! operations: limbs 0..3 < 2^52, limb 4 < 2^48 (value < 2^256). IFMA reads
//! only the low 52 bits of its multiplicands, so every product input must be
//! normalized: sums and differences are carried before they are multiplied.
//! Products are reduced with 2^260 = 608 and 2^255 = 19 (mod p).
//!
//! Three entry points: the Montgomery ladder (`ladder`, any point), the
//! public value X25519(k, 9) from a fixed-base table on edwards25519
//! (`base_mult`: 64 table additions instead of 255 ladder steps), and both
//! for the same scalar with a single inversion (`server_share`).
//!
//! Constant time: straight-line code; the scalar bit of each lane becomes a
//! mask register that drives the conditional swaps (blends), and a table
//! lookup reads every entry of its row and keeps the lane's own by blend.
//! The scalar is read word by word (digit by digit) at addresses that depend
//! only on the (public) position. Valgrind cannot run AVX-512, so `ct/run.sh` checks this code
//! statically (`ct/avx512_branches.py`), like the RSA IFMA kernel.

use crate::bn::{Lanes, LANES};
use crate::zmm::{ld, st};
use core::arch::x86_64::*;

const M52: i64 = (1 << 52) - 1;
const M47: i64 = (1 << 47) - 1;

/// Proof that the CPU has AVX-512F and IFMA: only `new` creates one.
#[derive(Clone, Copy)]
pub(crate) struct Ifma25519 {
    _detected: (),
}

impl Ifma25519 {
    pub fn new() -> Option<Self> {
        crate::curve_kernel::ifma_detected().then_some(Ifma25519 { _detected: () })
    }

    /// `out[l] = X25519(k[l], u[l])` for the 8 lanes: `k` holds clamped scalars
    /// as 4 little-endian 64-bit words (word w of lane l in `k[w].0[l]`), `u`
    /// the points in radix 2^52 (bit 255 already cleared). `out` is canonical
    /// (< p), radix 2^52.
    pub fn scalar_mult(&self, out: &mut [Lanes; 5], k: &[Lanes; 4], u: &[Lanes; 5]) {
        // SAFETY: `self` proves AVX-512F and IFMA were detected at runtime.
        unsafe { ladder(out, k, u) }
    }

    /// `out[l] = X25519(k[l], 9)`, the public value, from the clamped scalar's
    /// 64 signed radix-16 digits (`digits[i].0[l]`, two's complement, in
    /// [-8, 8]) by the fixed-base table; canonical, radix 2^52.
    pub fn base_mult(&self, out: &mut [Lanes; 5], digits: &[Lanes; 64]) {
        // SAFETY: as in `scalar_mult`.
        unsafe { base_mult(out, digits) }
    }

    /// Both halves of a server key share at once: `public[l] = X25519(k[l],
    /// 9)` from `digits` (as for `base_mult`) and `shared[l] = X25519(k[l],
    /// u[l])` from `k` (as for `scalar_mult`), the same scalar in both forms.
    pub fn server_share(
        &self,
        public: &mut [Lanes; 5],
        shared: &mut [Lanes; 5],
        digits: &[Lanes; 64],
        k: &[Lanes; 4],
        u: &[Lanes; 5],
    ) {
        // SAFETY: as in `scalar_mult`.
        unsafe { server_share(public, shared, digits, k, u) }
    }
}

const _: () = assert!(LANES == 8 && core::mem::size_of::<Lanes>() == 64);

type Fe = [__m512i; 5];

#[inline(always)]
unsafe fn c(x: i64) -> __m512i {
    // SAFETY: AVX-512F is enabled in every caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe { _mm512_set1_epi64(x) }
}

/// Limbs 0..3 < 2^52, limb 4 < 2^48 from limbs < 2^63 plus `top`, a count of
/// 2^260 units (< 2^16): whatever is at or above 2^255 comes back times 19
/// into limb 0, then one carry pass. The top limb is not masked at the end of
/// the pass, so its carry-in (< 2^12) leaves it below 2^47 + 2^12.
#[inline(always)]
unsafe fn fold(mut r: Fe, top: __m512i) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let m52 = c(M52);
        let t = _mm512_add_epi64(_mm512_srli_epi64::<47>(r[4]), _mm512_slli_epi64::<5>(top));
        r[4] = _mm512_and_si512(r[4], c(M47));
        r[0] = _mm512_madd52lo_epu64(r[0], t, c(19));
        for i in 0..4 {
            r[i + 1] = _mm512_add_epi64(r[i + 1], _mm512_srli_epi64::<52>(r[i]));
            r[i] = _mm512_and_si512(r[i], m52);
        }
        r
    }
}

/// Reduces the ten columns of a product (each < 2^57; column k weighs
/// 2^(52 k)) to a normalized element. Columns 5..9 are first carried to 52
/// bits (IFMA multiplies only 52-bit inputs), then multiplied by
/// 2^260 mod p = 608 into columns 0..5.
#[inline(always)]
unsafe fn reduce(mut t: [__m512i; 10]) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let m52 = c(M52);
        let k = c(608);
        for i in 5..9 {
            t[i + 1] = _mm512_add_epi64(t[i + 1], _mm512_srli_epi64::<52>(t[i]));
            t[i] = _mm512_and_si512(t[i], m52);
        }
        let t10 = _mm512_srli_epi64::<52>(t[9]);
        t[9] = _mm512_and_si512(t[9], m52);
        let mut r = [t[0], t[1], t[2], t[3], t[4]];
        for i in 0..5 {
            r[i] = _mm512_madd52lo_epu64(r[i], t[i + 5], k);
        }
        for i in 0..4 {
            r[i + 1] = _mm512_madd52hi_epu64(r[i + 1], t[i + 5], k);
        }
        // Column 10 (t10 < 2^5) lands at column 5 times 608; the high half of
        // t9 * 608 is at column 5 too.
        let top = _mm512_madd52hi_epu64(_mm512_setzero_si512(), t[9], k);
        let top = _mm512_madd52lo_epu64(top, t10, k);
        fold(r, top)
    }
}

/// `a * b`, both normalized. Low and high halves of each partial product
/// go into the same column accumulators: a column waits on up to 9
/// dependent multiply-adds, but the ladder has 4 independent products in
/// flight, and 10 fewer additions per product count more on a core where
/// IFMA and the other vector operations share ports.
#[inline(always)]
unsafe fn mul(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let mut t = [_mm512_setzero_si512(); 10];
        for i in 0..5 {
            for j in 0..5 {
                t[i + j] = _mm512_madd52lo_epu64(t[i + j], a[i], b[j]);
                t[i + j + 1] = _mm512_madd52hi_epu64(t[i + j + 1], a[i], b[j]);
            }
        }
        reduce(t)
    }
}

/// `a^2`, normalized: the 10 cross products once, doubled, plus the 5
/// squares (30 IFMA instead of 50).
#[inline(always)]
unsafe fn sqr(a: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let mut t = [_mm512_setzero_si512(); 10];
        for i in 0..5 {
            for j in i + 1..5 {
                t[i + j] = _mm512_madd52lo_epu64(t[i + j], a[i], a[j]);
                t[i + j + 1] = _mm512_madd52hi_epu64(t[i + j + 1], a[i], a[j]);
            }
        }
        for tk in t.iter_mut().skip(1) {
            *tk = _mm512_add_epi64(*tk, *tk);
        }
        for i in 0..5 {
            t[2 * i] = _mm512_madd52lo_epu64(t[2 * i], a[i], a[i]);
            t[2 * i + 1] = _mm512_madd52hi_epu64(t[2 * i + 1], a[i], a[i]);
        }
        reduce(t)
    }
}

/// `a^(2^n)`.
#[inline(always)]
unsafe fn sqr_n(a: &Fe, n: usize) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let mut r = sqr(a);
        for _ in 1..n {
            r = sqr(&r);
        }
        r
    }
}

/// `acc + a * k` for a normalized `a` and a constant `k < 2^52` (`acc` limbs
/// < 2^52 as well).
#[inline(always)]
unsafe fn mul_small_add(acc: &Fe, a: &Fe, k: i64) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let k = c(k);
        let mut r = *acc;
        for i in 0..5 {
            r[i] = _mm512_madd52lo_epu64(r[i], a[i], k);
        }
        for i in 0..4 {
            r[i + 1] = _mm512_madd52hi_epu64(r[i + 1], a[i], k);
        }
        let top = _mm512_madd52hi_epu64(_mm512_setzero_si512(), a[4], k);
        // a4 * k < 2^100: top < 2^48 counts 2^260 units; it comes down as
        // column 5 of a product would.
        let mut t = [_mm512_setzero_si512(); 10];
        t[..5].copy_from_slice(&r);
        t[5] = top;
        reduce(t)
    }
}

/// `a + b`, normalized.
#[inline(always)]
unsafe fn add(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let mut r = *a;
        for i in 0..5 {
            r[i] = _mm512_add_epi64(a[i], b[i]);
        }
        fold(r, _mm512_setzero_si512())
    }
}

/// `a - b + 2p`, normalized; non-negative limb by limb, since b's limbs are
/// below 2p's (2^53 - 38, 2^53 - 2 three times, 2^48 - 2).
#[inline(always)]
unsafe fn sub(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let two_p = [
            (1 << 53) - 38,
            (1 << 53) - 2,
            (1 << 53) - 2,
            (1 << 53) - 2,
            (1 << 48) - 2,
        ];
        let mut r = *a;
        for i in 0..5 {
            r[i] = _mm512_sub_epi64(_mm512_add_epi64(a[i], c(two_p[i])), b[i]);
        }
        fold(r, _mm512_setzero_si512())
    }
}

/// Swaps `a` and `b` in the lanes set in `m`.
#[inline(always)]
unsafe fn cswap(a: &mut Fe, b: &mut Fe, m: __mmask8) {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        for i in 0..5 {
            let (x, y) = (a[i], b[i]);
            a[i] = _mm512_mask_blend_epi64(m, x, y);
            b[i] = _mm512_mask_blend_epi64(m, y, x);
        }
    }
}

/// `z^(p-2)`: 254 squarings and 11 multiplications (the chain of the
/// portable kernel).
#[inline(always)]
unsafe fn invert(z: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let z2 = sqr(z);
        let z9 = mul(&sqr_n(&z2, 2), z);
        let z11 = mul(&z9, &z2);
        let z_5_0 = mul(&sqr(&z11), &z9);
        let z_10_0 = mul(&sqr_n(&z_5_0, 5), &z_5_0);
        let z_20_0 = mul(&sqr_n(&z_10_0, 10), &z_10_0);
        let z_40_0 = mul(&sqr_n(&z_20_0, 20), &z_20_0);
        let z_50_0 = mul(&sqr_n(&z_40_0, 10), &z_10_0);
        let z_100_0 = mul(&sqr_n(&z_50_0, 50), &z_50_0);
        let z_200_0 = mul(&sqr_n(&z_100_0, 100), &z_100_0);
        let z_250_0 = mul(&sqr_n(&z_200_0, 50), &z_50_0);
        mul(&sqr_n(&z_250_0, 5), &z11)
    }
}

/// The canonical value (< p) of a normalized element: two folds bring it
/// below 2^255; then p is subtracted, by blend, in the lanes where x + 19
/// reaches 2^255.
#[inline(always)]
unsafe fn canonical(x: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (it is inlined into the
    // `#[target_feature]` entry points).
    unsafe {
        let z = _mm512_setzero_si512();
        let x = fold(fold(*x, z), z);
        let mut y = x;
        y[0] = _mm512_add_epi64(y[0], c(19));
        for i in 0..4 {
            y[i + 1] = _mm512_add_epi64(y[i + 1], _mm512_srli_epi64::<52>(y[i]));
            y[i] = _mm512_and_si512(y[i], c(M52));
        }
        let ge = _mm512_test_epi64_mask(y[4], c(1 << 47));
        y[4] = _mm512_and_si512(y[4], c(M47));
        core::array::from_fn(|i| _mm512_mask_blend_epi64(ge, x[i], y[i]))
    }
}

/// The Montgomery ladder of RFC 7748 (section 5) in every lane, from bit 254
/// down: the projective result (x2, z2).
#[inline(always)]
unsafe fn ladder_xz(k: &[Lanes; 4], u: &[Lanes; 5]) -> (Fe, Fe) {
    // SAFETY: target features enabled by the caller; every load indexes `k`
    // (word t / 64 < 4) or `u` (limb < 5).
    unsafe {
        let z = _mm512_setzero_si512();
        let one = [c(1), z, z, z, z];
        let x1: Fe = core::array::from_fn(|i| ld(&u[i]));
        let (mut x2, mut z2, mut x3, mut z3) = (one, [z; 5], x1, one);
        let mut prev = z;
        for t in (0..255).rev() {
            let w = ld(&k[t / 64]);
            let bit = _mm512_and_si512(_mm512_srlv_epi64(w, c((t % 64) as i64)), c(1));
            let swap = _mm512_test_epi64_mask(_mm512_xor_si512(bit, prev), c(1));
            prev = bit;
            cswap(&mut x2, &mut x3, swap);
            cswap(&mut z2, &mut z3, swap);
            let a = add(&x2, &z2);
            let aa = sqr(&a);
            let b = sub(&x2, &z2);
            let bb = sqr(&b);
            let e = sub(&aa, &bb);
            let cc = add(&x3, &z3);
            let d = sub(&x3, &z3);
            let da = mul(&d, &a);
            let cb = mul(&cc, &b);
            x3 = sqr(&add(&da, &cb));
            z3 = mul(&x1, &sqr(&sub(&da, &cb)));
            x2 = mul(&aa, &bb);
            z2 = mul(&e, &mul_small_add(&aa, &e, 121_665));
        }
        let swap = _mm512_test_epi64_mask(prev, c(1));
        cswap(&mut x2, &mut x3, swap);
        cswap(&mut z2, &mut z3, swap);
        (x2, z2)
    }
}

#[inline(always)]
unsafe fn store(out: &mut [Lanes; 5], r: &Fe) {
    // SAFETY: target features enabled by the caller; limb < 5.
    unsafe {
        for (i, ri) in r.iter().enumerate() {
            st(&mut out[i], *ri);
        }
    }
}

/// `X25519(k, u)` in every lane: the ladder, then `x2 / z2`, canonical.
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn ladder(out: &mut [Lanes; 5], k: &[Lanes; 4], u: &[Lanes; 5]) {
    // SAFETY: the caller guarantees AVX-512F/IFMA.
    unsafe {
        let (x2, z2) = ladder_xz(k, u);
        store(out, &canonical(&mul(&x2, &invert(&z2))));
    }
}

/// A point of edwards25519 (birationally equivalent to Curve25519, u =
/// (1 + y) / (1 - y)) in extended coordinates: x = X/Z, y = Y/Z, T = XY/Z.
struct Ext {
    x: Fe,
    y: Fe,
    z: Fe,
    t: Fe,
}

/// `p + q` for an affine `q` given as (y + x, y - x, 2dxy): the unified
/// formula of Hisil, Wong, Carter and Dawson for a = -1 (complete on
/// edwards25519; the identity (1, 1, 0) works as a table entry). 7
/// multiplications.
#[inline(always)]
unsafe fn madd(p: &Ext, ypx: &Fe, ymx: &Fe, xy2d: &Fe) -> Ext {
    // SAFETY: target features enabled by the caller (`base_xz`).
    unsafe {
        let a = mul(&sub(&p.y, &p.x), ymx);
        let b = mul(&add(&p.y, &p.x), ypx);
        let c = mul(&p.t, xy2d);
        let d = add(&p.z, &p.z);
        let (e, f, g, h) = (sub(&b, &a), sub(&d, &c), add(&d, &c), add(&b, &a));
        Ext {
            x: mul(&e, &f),
            y: mul(&g, &h),
            z: mul(&f, &g),
            t: mul(&e, &h),
        }
    }
}

/// `2p` (the same authors' doubling for a = -1).
#[inline(always)]
unsafe fn dbl(p: &Ext) -> Ext {
    // SAFETY: target features enabled by the caller (`base_xz`).
    unsafe {
        let zero = [_mm512_setzero_si512(); 5];
        let a = sqr(&p.x);
        let b = sqr(&p.y);
        let zz = sqr(&p.z);
        let c = add(&zz, &zz);
        let ab = add(&a, &b);
        let e = sub(&sqr(&add(&p.x, &p.y)), &ab);
        let g = sub(&b, &a);
        let f = sub(&g, &c);
        let h = sub(&zero, &ab);
        Ext {
            x: mul(&e, &f),
            y: mul(&g, &h),
            z: mul(&f, &g),
            t: mul(&e, &h),
        }
    }
}

/// Per lane: `digit * row[0]` where `row[j - 1]` is `j * P`, digits in
/// [-8, 8]. Every entry is read (broadcast from the public table) and taken
/// by a blend where the lane's |digit| matches; a negative digit then negates
/// the point ((y + x, y - x, 2dxy) -> (y - x, y + x, -2dxy)), by blend too.
#[inline(always)]
unsafe fn select(row: &[[u64; 15]; 8], digit: __m512i) -> (Fe, Fe, Fe) {
    // SAFETY: target features enabled by the caller (`base_xz`); indices
    // are loop counters within the row.
    unsafe {
        let z = _mm512_setzero_si512();
        let neg = _mm512_cmplt_epi64_mask(digit, z);
        let abs = _mm512_abs_epi64(digit);
        // The identity: y + x = y - x = 1, 2dxy = 0.
        let mut v = [z; 15];
        v[0] = c(1);
        v[5] = c(1);
        for (j, entry) in row.iter().enumerate() {
            let m = _mm512_cmpeq_epi64_mask(abs, c(j as i64 + 1));
            for (l, vl) in v.iter_mut().enumerate() {
                *vl = _mm512_mask_mov_epi64(*vl, m, c(entry[l] as i64));
            }
        }
        let ypx: Fe = core::array::from_fn(|l| v[l]);
        let ymx: Fe = core::array::from_fn(|l| v[5 + l]);
        let xy2d: Fe = core::array::from_fn(|l| v[10 + l]);
        let minus = sub(&[z; 5], &xy2d);
        (
            core::array::from_fn(|l| _mm512_mask_blend_epi64(neg, ypx[l], ymx[l])),
            core::array::from_fn(|l| _mm512_mask_blend_epi64(neg, ymx[l], ypx[l])),
            core::array::from_fn(|l| _mm512_mask_blend_epi64(neg, xy2d[l], minus[l])),
        )
    }
}

/// Fixed-base multiplication on edwards25519: with k = sum e_i 16^i, the odd
/// digits first (one table row per pair of digits: row i holds multiples of
/// 256^i B), times 16, then the even ones; 64 additions and 4 doublings
/// instead of 255 ladder steps. Returns u = (Z + Y) / (Z - Y) as a fraction
/// (numerator, denominator); the denominator is never 0, since a clamped
/// scalar is not a multiple of B's order.
#[inline(always)]
unsafe fn base_xz(digits: &[Lanes; 64]) -> (Fe, Fe) {
    // SAFETY: target features enabled by the caller; loads index `digits`
    // (i < 64) and the table by loop counters.
    unsafe {
        let z = _mm512_setzero_si512();
        let one = [c(1), z, z, z, z];
        let mut h = Ext {
            x: [z; 5],
            y: one,
            z: one,
            t: [z; 5],
        };
        for i in (1..64).step_by(2) {
            let (ypx, ymx, xy2d) = select(&super::base_table::BASE_TABLE[i / 2], ld(&digits[i]));
            h = madd(&h, &ypx, &ymx, &xy2d);
        }
        for _ in 0..4 {
            h = dbl(&h);
        }
        for i in (0..64).step_by(2) {
            let (ypx, ymx, xy2d) = select(&super::base_table::BASE_TABLE[i / 2], ld(&digits[i]));
            h = madd(&h, &ypx, &ymx, &xy2d);
        }
        (add(&h.z, &h.y), sub(&h.z, &h.y))
    }
}

/// `X25519(k, 9)` in every lane by the fixed-base table, canonical.
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn base_mult(out: &mut [Lanes; 5], digits: &[Lanes; 64]) {
    // SAFETY: the caller guarantees AVX-512F/IFMA.
    unsafe {
        let (num, den) = base_xz(digits);
        store(out, &canonical(&mul(&num, &invert(&den))));
    }
}

/// A server key share in every lane: the public value by the fixed-base
/// table and the shared secret by the ladder, with one inversion for both
/// (of den * z2; each inverse is then the product with the other factor).
/// Where the peer's point has small order z2 is 0 mod p: 1 stands in for it
/// in the product, and the lane's secret is 0, as x2 * z2^(p-2) would give.
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn server_share(
    public: &mut [Lanes; 5],
    shared: &mut [Lanes; 5],
    digits: &[Lanes; 64],
    k: &[Lanes; 4],
    u: &[Lanes; 5],
) {
    // SAFETY: the caller guarantees AVX-512F/IFMA.
    unsafe {
        let z = _mm512_setzero_si512();
        let (num, den) = base_xz(digits);
        let (x2, z2) = ladder_xz(k, u);
        let zc = canonical(&z2);
        let any = zc[1..].iter().fold(zc[0], |a, l| _mm512_or_si512(a, *l));
        let small = _mm512_cmpeq_epi64_mask(any, z);
        let one = [c(1), z, z, z, z];
        let z2: Fe = core::array::from_fn(|i| _mm512_mask_blend_epi64(small, z2[i], one[i]));
        let inv = invert(&mul(&den, &z2));
        store(public, &canonical(&mul(&num, &mul(&inv, &z2))));
        let s = canonical(&mul(&x2, &mul(&inv, &den)));
        let s: Fe = core::array::from_fn(|i| _mm512_maskz_mov_epi64(!small, s[i]));
        store(shared, &s);
    }
}

/// The static check's own test for this kernel (`ct/run.sh`, feature
/// `ct-planted`): a conditional swap that branches on the scalar bit instead
/// of blending, which the check must refuse. Never called.
#[cfg(feature = "ct-planted")]
#[inline(never)]
pub fn planted_cswap(a: &mut [Lanes; 5], b: &mut [Lanes; 5], k: &[Lanes; 4], t: usize) {
    for lane in 0..LANES {
        // The planted leak: a branch on a secret scalar bit.
        if core::hint::black_box(k[t / 64].0[lane] >> (t % 64)) & 1 == 1 {
            for j in 0..5 {
                core::mem::swap(&mut a[j].0[lane], &mut b[j].0[lane]);
            }
        }
    }
}
