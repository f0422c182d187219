//! A prototype, not a kernel: X25519 on AVX2, 4 scalar multiplications at once
//! (one per 64-bit lane of a ymm register), to decide whether CPUs without
//! AVX-512 IFMA should get a curve kernel or keep aws-lc-rs: the engine takes
//! a kernel only where it beats aws-lc-rs by 1.3x or more. `x25519_speed`
//! times it beside BoringSSL, aws-lc-rs and the engine's kernels, after
//! checking it against aws-lc-rs.
//!
//! Field elements mod 2^255 - 19 in radix 2^25.5 (ten limbs of 26 and 25
//! bits, the layout 32x32-bit multipliers call for: AVX2's `vpmuludq` reads
//! the low 32 bits of each lane), limb i of the 4 elements in one register.
//! The agreement is RFC 7748's ladder with masked swaps; the public value
//! comes from the IFMA kernel's fixed-base table (converted to this radix),
//! 64 additions on edwards25519 with entries selected by masks over every
//! entry; a server share inverts once for both. What a kernel would add: the
//! packing in SIMD, zeroizing, the small-order refusal, the constant-time
//! checks, and tuning (carries after a sum are skipped only in the ladder).

use core::arch::x86_64::*;

/// Ten limbs of four elements.
type Fe = [__m256i; 10];

/// Where limb i starts: ceil(25.5 i).
const POSITION: [u32; 10] = [0, 26, 51, 77, 102, 128, 153, 179, 204, 230];

const fn width(i: usize) -> u32 {
    if i.is_multiple_of(2) {
        26
    } else {
        25
    }
}

pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// `X25519(k[l], u[l])` for the 4 lanes (scalars clamped here, bit 255
/// of the points ignored, as RFC 7748 says).
pub fn x25519(k: &[[u8; 32]; 4], u: &[[u8; 32]; 4]) -> [[u8; 32]; 4] {
    assert!(available());
    let words = words(&clamped(k));
    let mut out = [[0u64; 4]; 10];
    // SAFETY: `available()` asserted AVX2 above.
    unsafe { ladder(&mut out, &words, &points(u)) };
    unpack(&out)
}

fn to_limbs(bytes: &[u8; 32]) -> [u64; 10] {
    let mut x = [0u64; 4];
    for (w, word) in x.iter_mut().enumerate() {
        *word = u64::from_le_bytes(bytes[8 * w..8 * w + 8].try_into().unwrap());
    }
    x[3] &= !(1 << 63);
    core::array::from_fn(|i| {
        let (word, offset) = ((POSITION[i] / 64) as usize, POSITION[i] % 64);
        let mut v = x[word] >> offset;
        if offset + width(i) > 64 {
            v |= x[word + 1] << (64 - offset);
        }
        v & ((1 << width(i)) - 1)
    })
}

/// The canonical little-endian encoding of a carried element (limbs at
/// most a few bits over their width).
fn to_bytes(limbs: [u64; 10]) -> [u8; 32] {
    let mut x = [0u64; 5];
    for (i, limb) in limbs.into_iter().enumerate() {
        let (word, offset) = ((POSITION[i] / 64) as usize, POSITION[i] % 64);
        let v = (limb as u128) << offset;
        let mut carry = add_to(&mut x[word], v as u64, 0);
        carry = add_to(&mut x[word + 1], (v >> 64) as u64, carry);
        let mut w = word + 2;
        while w < 5 {
            carry = add_to(&mut x[w], 0, carry);
            w += 1;
        }
    }
    // Bits at and above 2^255 come back times 19, twice; then p is
    // subtracted (by mask) where x + 19 reaches 2^255.
    for _ in 0..2 {
        let top = (x[3] >> 63) | (x[4] << 1);
        x[3] &= !(1 << 63);
        x[4] = 0;
        let mut carry = add_to(&mut x[0], 19 * top, 0);
        for word in &mut x[1..5] {
            carry = add_to(word, 0, carry);
        }
    }
    let mut y = [0u64; 4];
    let mut carry = 0;
    for w in 0..4 {
        y[w] = x[w];
        carry = add_to(&mut y[w], if w == 0 { 19 } else { 0 }, carry);
    }
    let mask = 0u64.wrapping_sub(y[3] >> 63);
    y[3] &= !(1 << 63);
    let mut out = [0u8; 32];
    for w in 0..4 {
        let v = (y[w] & mask) | (x[w] & !mask);
        out[8 * w..8 * w + 8].copy_from_slice(&v.to_le_bytes());
    }
    out
}

fn add_to(word: &mut u64, v: u64, carry: u64) -> u64 {
    let (s, c1) = word.overflowing_add(v);
    let (s, c2) = s.overflowing_add(carry);
    *word = s;
    (c1 as u64) + (c2 as u64)
}

#[inline(always)]
unsafe fn c(x: i64) -> __m256i {
    // SAFETY: AVX is enabled in every caller (inlined into the
    // `#[target_feature]` entry point).
    unsafe { _mm256_set1_epi64x(x) }
}

/// One carry from limb i (width W) into limb i + 1.
#[inline(always)]
unsafe fn carry_from<const W: i32>(h: &mut Fe, i: usize) {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let carry = _mm256_srli_epi64::<W>(h[i]);
        h[i] = _mm256_and_si256(h[i], c((1 << W) - 1));
        h[i + 1] = _mm256_add_epi64(h[i + 1], carry);
    }
}

/// Limbs below 2^63 to limbs at most a bit over their width: two chains
/// interleaved (0..4 and 4..9), the carry out of limb 9 back times 19.
#[inline(always)]
unsafe fn carry(mut h: Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        carry_from::<26>(&mut h, 0);
        carry_from::<26>(&mut h, 4);
        carry_from::<25>(&mut h, 1);
        carry_from::<25>(&mut h, 5);
        carry_from::<26>(&mut h, 2);
        carry_from::<26>(&mut h, 6);
        carry_from::<25>(&mut h, 3);
        carry_from::<25>(&mut h, 7);
        carry_from::<26>(&mut h, 4);
        carry_from::<26>(&mut h, 8);
        let top = _mm256_srli_epi64::<25>(h[9]);
        h[9] = _mm256_and_si256(h[9], c((1 << 25) - 1));
        let times19 = _mm256_add_epi64(
            _mm256_add_epi64(top, _mm256_slli_epi64::<1>(top)),
            _mm256_slli_epi64::<4>(top),
        );
        h[0] = _mm256_add_epi64(h[0], times19);
        carry_from::<26>(&mut h, 0);
        h
    }
}

#[inline(always)]
unsafe fn times19(a: __m256i) -> __m256i {
    // SAFETY: AVX2 enabled by the caller.
    unsafe { _mm256_mul_epu32(a, c(19)) }
}

/// The sum of a column's products, as a balanced tree (short chains).
#[inline(always)]
unsafe fn sum<const N: usize>(t: [__m256i; N]) -> __m256i {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let mut t = t;
        let mut n = N;
        while n > 1 {
            let half = n / 2;
            for i in 0..half {
                t[i] = _mm256_add_epi64(t[i], t[n - 1 - i]);
            }
            n -= half;
        }
        t[0]
    }
}

// No closures that hold intrinsics (`array::from_fn`, `map`): a closure does
// not inherit the entry point's `#[target_feature]`, and every intrinsic in it
// becomes a call.

#[inline(always)]
unsafe fn m(a: __m256i, b: __m256i) -> __m256i {
    // SAFETY: AVX2 enabled by the caller.
    unsafe { _mm256_mul_epu32(a, b) }
}

/// `2x`.
#[inline(always)]
unsafe fn dbl1(x: __m256i) -> __m256i {
    // SAFETY: AVX2 enabled by the caller.
    unsafe { _mm256_add_epi64(x, x) }
}

/// 19 times each limb.
#[inline(always)]
unsafe fn times19_all(g: &Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let mut r = *g;
        for i in 0..10 {
            r[i] = times19(g[i]);
        }
        r
    }
}

/// `f * g`: 100 32x32-bit products, column by column (column k weighs
/// 2^ceil(25.5 k)); a product reaching 2^255 comes back times 19 (from g's
/// side), an odd-by-odd product is doubled (two half-bits of weight).
/// Written out, one line per column (generated): loops over both indices
/// stayed loops, with the columns in memory (4x slower), and loops over
/// const-generic columns took rustc minutes.
#[rustfmt::skip]
#[inline(always)]
unsafe fn mul(f: &Fe, g: &Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9] = *f;
        let [g0, g1, g2, g3, g4, g5, g6, g7, g8, g9] = *g;
        let [_, g1_19, g2_19, g3_19, g4_19, g5_19, g6_19, g7_19, g8_19, g9_19] = times19_all(g);
        let (f1_2, f3_2, f5_2, f7_2, f9_2) = (dbl1(f1), dbl1(f3), dbl1(f5), dbl1(f7), dbl1(f9));
        let h0 = sum([m(f0, g0), m(f1_2, g9_19), m(f2, g8_19), m(f3_2, g7_19), m(f4, g6_19), m(f5_2, g5_19), m(f6, g4_19), m(f7_2, g3_19), m(f8, g2_19), m(f9_2, g1_19)]);
        let h1 = sum([m(f0, g1), m(f1, g0), m(f2, g9_19), m(f3, g8_19), m(f4, g7_19), m(f5, g6_19), m(f6, g5_19), m(f7, g4_19), m(f8, g3_19), m(f9, g2_19)]);
        let h2 = sum([m(f0, g2), m(f1_2, g1), m(f2, g0), m(f3_2, g9_19), m(f4, g8_19), m(f5_2, g7_19), m(f6, g6_19), m(f7_2, g5_19), m(f8, g4_19), m(f9_2, g3_19)]);
        let h3 = sum([m(f0, g3), m(f1, g2), m(f2, g1), m(f3, g0), m(f4, g9_19), m(f5, g8_19), m(f6, g7_19), m(f7, g6_19), m(f8, g5_19), m(f9, g4_19)]);
        let h4 = sum([m(f0, g4), m(f1_2, g3), m(f2, g2), m(f3_2, g1), m(f4, g0), m(f5_2, g9_19), m(f6, g8_19), m(f7_2, g7_19), m(f8, g6_19), m(f9_2, g5_19)]);
        let h5 = sum([m(f0, g5), m(f1, g4), m(f2, g3), m(f3, g2), m(f4, g1), m(f5, g0), m(f6, g9_19), m(f7, g8_19), m(f8, g7_19), m(f9, g6_19)]);
        let h6 = sum([m(f0, g6), m(f1_2, g5), m(f2, g4), m(f3_2, g3), m(f4, g2), m(f5_2, g1), m(f6, g0), m(f7_2, g9_19), m(f8, g8_19), m(f9_2, g7_19)]);
        let h7 = sum([m(f0, g7), m(f1, g6), m(f2, g5), m(f3, g4), m(f4, g3), m(f5, g2), m(f6, g1), m(f7, g0), m(f8, g9_19), m(f9, g8_19)]);
        let h8 = sum([m(f0, g8), m(f1_2, g7), m(f2, g6), m(f3_2, g5), m(f4, g4), m(f5_2, g3), m(f6, g2), m(f7_2, g1), m(f8, g0), m(f9_2, g9_19)]);
        let h9 = sum([m(f0, g9), m(f1, g8), m(f2, g7), m(f3, g6), m(f4, g5), m(f5, g4), m(f6, g3), m(f7, g2), m(f8, g1), m(f9, g0)]);
        carry([h0, h1, h2, h3, h4, h5, h6, h7, h8, h9])
    }
}

/// `f^2`: each cross product once, doubled (`_2`, or `_4` for odd by odd),
/// and the ten squares: 55 products.
#[rustfmt::skip]
#[inline(always)]
unsafe fn sqr(f: &Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9] = *f;
        let [_, _, _, _, _, f5_19, f6_19, f7_19, f8_19, f9_19] = times19_all(f);
        let (f0_2, f1_2, f2_2, f3_2, f4_2) = (dbl1(f0), dbl1(f1), dbl1(f2), dbl1(f3), dbl1(f4));
        let (f5_2, f6_2, f7_2, f8_2, f9_2) = (dbl1(f5), dbl1(f6), dbl1(f7), dbl1(f8), dbl1(f9));
        let (f1_4, f3_4, f5_4, f7_4) = (dbl1(f1_2), dbl1(f3_2), dbl1(f5_2), dbl1(f7_2));
        let h0 = sum([m(f0, f0), m(f1_4, f9_19), m(f2_2, f8_19), m(f3_4, f7_19), m(f4_2, f6_19), m(f5_2, f5_19)]);
        let h1 = sum([m(f0_2, f1), m(f2_2, f9_19), m(f3_2, f8_19), m(f4_2, f7_19), m(f5_2, f6_19)]);
        let h2 = sum([m(f0_2, f2), m(f1_2, f1), m(f3_4, f9_19), m(f4_2, f8_19), m(f5_4, f7_19), m(f6, f6_19)]);
        let h3 = sum([m(f0_2, f3), m(f1_2, f2), m(f4_2, f9_19), m(f5_2, f8_19), m(f6_2, f7_19)]);
        let h4 = sum([m(f0_2, f4), m(f1_4, f3), m(f2, f2), m(f5_4, f9_19), m(f6_2, f8_19), m(f7_2, f7_19)]);
        let h5 = sum([m(f0_2, f5), m(f1_2, f4), m(f2_2, f3), m(f6_2, f9_19), m(f7_2, f8_19)]);
        let h6 = sum([m(f0_2, f6), m(f1_4, f5), m(f2_2, f4), m(f3_2, f3), m(f7_4, f9_19), m(f8, f8_19)]);
        let h7 = sum([m(f0_2, f7), m(f1_2, f6), m(f2_2, f5), m(f3_2, f4), m(f8_2, f9_19)]);
        let h8 = sum([m(f0_2, f8), m(f1_4, f7), m(f2_2, f6), m(f3_4, f5), m(f4, f4), m(f9_2, f9_19)]);
        let h9 = sum([m(f0_2, f9), m(f1_2, f8), m(f2_2, f7), m(f3_2, f6), m(f4_2, f5)]);
        carry([h0, h1, h2, h3, h4, h5, h6, h7, h8, h9])
    }
}

#[inline(always)]
unsafe fn sqr_n(a: &Fe, n: usize) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let mut r = sqr(a);
        for _ in 1..n {
            r = sqr(&r);
        }
        r
    }
}

/// `a + b`, carried.
#[inline(always)]
unsafe fn add(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe { carry(add_lazy(a, b)) }
}

/// `a + b` without a carry, for two carried elements whose sum is only
/// multiplied: limbs below 2^27.01 keep 19 times a limb under 2^32 and a
/// column of a square (at most 6 products of 4a by 19a) under 2^63.
#[inline(always)]
unsafe fn add_lazy(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let mut r = *a;
        for i in 0..10 {
            r[i] = _mm256_add_epi64(a[i], b[i]);
        }
        r
    }
}

/// `a - b + 2p`: each limb of 2p is above the carried limb of b.
#[inline(always)]
unsafe fn sub(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let mut r = *a;
        for i in 0..10 {
            let two_p = match i {
                0 => (1 << 27) - 38,
                _ if i % 2 == 0 => (1 << 27) - 2,
                _ => (1 << 26) - 2,
            };
            r[i] = _mm256_sub_epi64(_mm256_add_epi64(a[i], c(two_p)), b[i]);
        }
        carry(r)
    }
}

#[inline(always)]
unsafe fn mul_a24(a: &Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let mut r = *a;
        for i in 0..10 {
            r[i] = _mm256_mul_epu32(a[i], c(121_665));
        }
        carry(r)
    }
}

#[inline(always)]
unsafe fn cswap(a: &mut Fe, b: &mut Fe, mask: __m256i) {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        for i in 0..10 {
            let t = _mm256_and_si256(_mm256_xor_si256(a[i], b[i]), mask);
            a[i] = _mm256_xor_si256(a[i], t);
            b[i] = _mm256_xor_si256(b[i], t);
        }
    }
}

/// `z^(p-2)`.
#[inline(always)]
unsafe fn invert(z: &Fe) -> Fe {
    // SAFETY: AVX2 enabled by the caller.
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

/// RFC 7748's ladder in the 4 lanes: the projective result (x2, z2).
#[inline(always)]
unsafe fn ladder_xz(k: &[[u64; 4]; 4], x1: &Fe) -> (Fe, Fe) {
    // SAFETY: AVX2 enabled by the caller; loads read the 32-byte arrays
    // `k[w]`.
    unsafe {
        let zero = _mm256_setzero_si256();
        let mut one = [zero; 10];
        one[0] = c(1);
        let (mut x2, mut z2, mut x3, mut z3) = (one, [zero; 10], *x1, one);
        let mut previous = zero;
        for t in (0..255).rev() {
            let word = _mm256_loadu_si256(k[t / 64].as_ptr().cast());
            let bit = _mm256_and_si256(
                _mm256_srl_epi64(word, _mm_cvtsi64_si128((t % 64) as i64)),
                c(1),
            );
            let mask = _mm256_sub_epi64(zero, _mm256_xor_si256(bit, previous));
            previous = bit;
            cswap(&mut x2, &mut x3, mask);
            cswap(&mut z2, &mut z3, mask);
            let a = add_lazy(&x2, &z2);
            let aa = sqr(&a);
            let b = sub(&x2, &z2);
            let bb = sqr(&b);
            let e = sub(&aa, &bb);
            let cc = add_lazy(&x3, &z3);
            let d = sub(&x3, &z3);
            let da = mul(&d, &a);
            let cb = mul(&cc, &b);
            x3 = sqr(&add_lazy(&da, &cb));
            z3 = mul(x1, &sqr(&sub(&da, &cb)));
            x2 = mul(&aa, &bb);
            z2 = mul(&e, &add_lazy(&aa, &mul_a24(&e)));
        }
        let mask = _mm256_sub_epi64(zero, previous);
        cswap(&mut x2, &mut x3, mask);
        cswap(&mut z2, &mut z3, mask);
        (x2, z2)
    }
}

#[inline(always)]
unsafe fn load(limbs: &[[u64; 4]; 10]) -> Fe {
    // SAFETY: AVX2 enabled by the caller; each load reads one 32-byte array.
    unsafe {
        let mut r = [_mm256_setzero_si256(); 10];
        for i in 0..10 {
            r[i] = _mm256_loadu_si256(limbs[i].as_ptr().cast());
        }
        r
    }
}

#[inline(always)]
unsafe fn store(out: &mut [[u64; 4]; 10], x: &Fe) {
    // SAFETY: AVX2 enabled by the caller; each store writes one 32-byte array.
    unsafe {
        for i in 0..10 {
            _mm256_storeu_si256(out[i].as_mut_ptr().cast(), x[i]);
        }
    }
}

/// `X25519(k, u)`: the ladder, then x2 / z2.
#[target_feature(enable = "avx2")]
unsafe fn ladder(out: &mut [[u64; 4]; 10], k: &[[u64; 4]; 4], u: &[[u64; 4]; 10]) {
    // SAFETY: AVX2 is enabled here.
    unsafe {
        let (x2, z2) = ladder_xz(k, &load(u));
        store(out, &mul(&x2, &invert(&z2)));
    }
}

/// A point of edwards25519 in extended coordinates (x = X/Z, y = Y/Z,
/// T = XY/Z).
struct Ext {
    x: Fe,
    y: Fe,
    z: Fe,
    t: Fe,
}

/// The point (EF, GH, FG, EH): the last step of an addition and a doubling.
#[inline(always)]
unsafe fn from_efgh(e: &Fe, f: &Fe, g: &Fe, h: &Fe) -> Ext {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        Ext {
            x: mul(e, f),
            y: mul(g, h),
            z: mul(f, g),
            t: mul(e, h),
        }
    }
}

/// `p + q`, q affine as (y + x, y - x, 2dxy): Hisil-Wong-Carter-Dawson
/// for a = -1, 7 multiplications. The formulas are the IFMA kernel's
/// (`src/x25519/ifma.rs`) over another field type; a kernel would share
/// them through a field trait, a prototype repeats them.
#[inline(always)]
unsafe fn madd(p: &Ext, ypx: &Fe, ymx: &Fe, xy2d: &Fe) -> Ext {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let a = mul(&sub(&p.y, &p.x), ymx);
        let b = mul(&add(&p.y, &p.x), ypx);
        let c = mul(&p.t, xy2d);
        let d = add(&p.z, &p.z);
        let (e, f, g, h) = (sub(&b, &a), sub(&d, &c), add(&d, &c), add(&b, &a));
        from_efgh(&e, &f, &g, &h)
    }
}

/// `2p`.
#[inline(always)]
unsafe fn dbl(p: &Ext) -> Ext {
    // SAFETY: AVX2 enabled by the caller.
    unsafe {
        let zero = [_mm256_setzero_si256(); 10];
        let a = sqr(&p.x);
        let b = sqr(&p.y);
        let zz = sqr(&p.z);
        let c = add(&zz, &zz);
        let ab = add(&a, &b);
        let e = sub(&sqr(&add(&p.x, &p.y)), &ab);
        let g = sub(&b, &a);
        let f = sub(&g, &c);
        let h = sub(&zero, &ab);
        from_efgh(&e, &f, &g, &h)
    }
}

/// Per lane `digit * row[0]` (`row[j - 1]` = j P, digits in [-8, 8]):
/// every entry is read and kept by mask where |digit| matches; a negative
/// digit swaps y + x and y - x and negates 2dxy, by mask too.
#[inline(always)]
unsafe fn select(row: &[[[u64; 10]; 3]; 8], digit: __m256i) -> (Fe, Fe, Fe) {
    // SAFETY: AVX2 enabled by the caller; indices are loop counters.
    unsafe {
        let zero = _mm256_setzero_si256();
        let neg = _mm256_cmpgt_epi64(zero, digit);
        let abs = _mm256_sub_epi64(_mm256_xor_si256(digit, neg), neg);
        let mut v = [[zero; 10]; 3];
        v[0][0] = c(1);
        v[1][0] = c(1);
        for (j, entry) in row.iter().enumerate() {
            let m = _mm256_cmpeq_epi64(abs, c(j as i64 + 1));
            for f in 0..3 {
                for l in 0..10 {
                    let e = c(entry[f][l] as i64);
                    v[f][l] =
                        _mm256_or_si256(_mm256_and_si256(m, e), _mm256_andnot_si256(m, v[f][l]));
                }
            }
        }
        let minus = sub(&[zero; 10], &v[2]);
        let (mut ypx, mut ymx, mut xy2d) = (v[0], v[1], v[2]);
        cswap(&mut ypx, &mut ymx, neg);
        for l in 0..10 {
            xy2d[l] = _mm256_or_si256(
                _mm256_and_si256(neg, minus[l]),
                _mm256_andnot_si256(neg, xy2d[l]),
            );
        }
        (ypx, ymx, xy2d)
    }
}

/// `k B` on edwards25519 from 64 signed radix-16 digits (odd digits,
/// 4 doublings, even digits: 64 additions), as u = (Z + Y) / (Z - Y), a
/// fraction.
#[inline(always)]
unsafe fn base_xz(table: &Table, digits: &[[i64; 4]; 64]) -> (Fe, Fe) {
    // SAFETY: AVX2 enabled by the caller; loads read `digits[i]`.
    unsafe {
        let zero = _mm256_setzero_si256();
        let mut one = [zero; 10];
        one[0] = c(1);
        let mut h = Ext {
            x: [zero; 10],
            y: one,
            z: one,
            t: [zero; 10],
        };
        for half in [1, 0] {
            for i in (half..64).step_by(2) {
                let digit = _mm256_loadu_si256(digits[i].as_ptr().cast());
                let (ypx, ymx, xy2d) = select(&table[i / 2], digit);
                h = madd(&h, &ypx, &ymx, &xy2d);
            }
            if half == 1 {
                for _ in 0..4 {
                    h = dbl(&h);
                }
            }
        }
        (add(&h.z, &h.y), sub(&h.z, &h.y))
    }
}

/// A server key share: the public value by the table, the shared secret
/// by the ladder, one inversion for both (of den * z2).
#[target_feature(enable = "avx2")]
unsafe fn share(
    public: &mut [[u64; 4]; 10],
    shared: &mut [[u64; 4]; 10],
    table: &Table,
    digits: &[[i64; 4]; 64],
    k: &[[u64; 4]; 4],
    u: &[[u64; 4]; 10],
) {
    // SAFETY: AVX2 is enabled here.
    unsafe {
        let (num, den) = base_xz(table, digits);
        let (x2, z2) = ladder_xz(k, &load(u));
        let inv = invert(&mul(&den, &z2));
        store(public, &mul(&num, &mul(&inv, &z2)));
        store(shared, &mul(&x2, &mul(&inv, &den)));
    }
}

/// The engine's fixed-base table, converted to radix 2^25.5.
pub type Table = [[[[u64; 10]; 3]; 8]; 32];

pub fn table() -> Box<Table> {
    let source = tlsterm_engine::x25519_base_table();
    let mut table = Box::new([[[[0u64; 10]; 3]; 8]; 32]);
    for (row, source_row) in table.iter_mut().zip(source) {
        for (entry, limbs52) in row.iter_mut().zip(source_row) {
            for (f, field) in entry.iter_mut().enumerate() {
                let mut bytes = [0u8; 32];
                let mut acc = 0u128;
                let (mut bits, mut at) = (0, 0);
                for limb in &limbs52[5 * f..5 * f + 5] {
                    acc |= (*limb as u128) << bits;
                    bits += 52;
                    while bits >= 8 && at < 32 {
                        bytes[at] = acc as u8;
                        acc >>= 8;
                        bits -= 8;
                        at += 1;
                    }
                }
                while at < 32 {
                    bytes[at] = acc as u8;
                    acc >>= 8;
                    at += 1;
                }
                *field = to_limbs(&bytes);
            }
        }
    }
    table
}

/// Clamped scalars of the 4 lanes as words and as signed radix-16 digits.
/// The 4 scalars, clamped as RFC 7748 says.
fn clamped(k: &[[u8; 32]; 4]) -> [[u8; 32]; 4] {
    let mut c = *k;
    for s in &mut c {
        s[0] &= 248;
        s[31] = (s[31] & 127) | 64;
    }
    c
}

/// Clamped scalars as words, lane by lane: what the ladder reads.
fn words(c: &[[u8; 32]; 4]) -> [[u64; 4]; 4] {
    let mut words = [[0u64; 4]; 4];
    for (lane, s) in c.iter().enumerate() {
        for (w, word) in words.iter_mut().enumerate() {
            word[lane] = u64::from_le_bytes(s[8 * w..8 * w + 8].try_into().unwrap());
        }
    }
    words
}

/// Clamped scalars as signed radix-16 digits, lane by lane: what the
/// fixed-base table reads.
fn digits(c: &[[u8; 32]; 4]) -> [[i64; 4]; 64] {
    let mut digits = [[0i64; 4]; 64];
    for (lane, s) in c.iter().enumerate() {
        for (i, di) in tlsterm_engine::x25519_signed_digits(s)
            .into_iter()
            .enumerate()
        {
            digits[i][lane] = di;
        }
    }
    digits
}

fn points(u: &[[u8; 32]; 4]) -> [[u64; 4]; 10] {
    let mut limbs = [[0u64; 4]; 10];
    for (lane, point) in u.iter().enumerate() {
        for (i, limb) in to_limbs(point).into_iter().enumerate() {
            limbs[i][lane] = limb;
        }
    }
    limbs
}

fn unpack(x: &[[u64; 4]; 10]) -> [[u8; 32]; 4] {
    let mut out = [[0u8; 32]; 4];
    for (lane, o) in out.iter_mut().enumerate() {
        let mut limbs = [0u64; 10];
        for i in 0..10 {
            limbs[i] = x[i][lane];
        }
        *o = to_bytes(limbs);
    }
    out
}

/// `(X25519(k[l], 9), X25519(k[l], u[l]))` for the 4 lanes: a server's
/// public value and shared secret.
pub fn server_share(
    table: &Table,
    k: &[[u8; 32]; 4],
    u: &[[u8; 32]; 4],
) -> ([[u8; 32]; 4], [[u8; 32]; 4]) {
    assert!(available());
    let k = clamped(k);
    let (words, digits) = (words(&k), digits(&k));
    let (mut public, mut shared) = ([[0u64; 4]; 10], [[0u64; 4]; 10]);
    // SAFETY: `available()` asserted AVX2 above.
    unsafe { share(&mut public, &mut shared, table, &digits, &words, &points(u)) };
    (unpack(&public), unpack(&shared))
}

/// A public value aws-lc-rs made: a valid point to multiply.
pub fn random_public(rng: &aws_lc_rs::rand::SystemRandom) -> [u8; 32] {
    use aws_lc_rs::agreement;
    let key = agreement::EphemeralPrivateKey::generate(&agreement::X25519, rng).unwrap();
    key.compute_public_key()
        .unwrap()
        .as_ref()
        .try_into()
        .unwrap()
}

/// aws-lc-rs's public value for `scalar` and its shared secret with `point`.
fn aws_lc_share(scalar: &[u8; 32], point: &[u8; 32]) -> ([u8; 32], [u8; 32]) {
    use aws_lc_rs::agreement;
    let private = agreement::PrivateKey::from_private_key(&agreement::X25519, scalar).unwrap();
    let public = private
        .compute_public_key()
        .unwrap()
        .as_ref()
        .try_into()
        .unwrap();
    let shared = agreement::agree(
        &private,
        agreement::UnparsedPublicKey::new(&agreement::X25519, point),
        (),
        |s| Ok(<[u8; 32]>::try_from(s).unwrap()),
    )
    .unwrap();
    (public, shared)
}

/// Every lane agrees with aws-lc-rs (random scalars and points, 64 passes of
/// the ladder and of the server share) and with RFC 7748 section 5.2's first
/// vector; the timing means nothing otherwise.
pub fn check_against_aws_lc() {
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let table = table();
    for _ in 0..64 {
        let mut scalars = [[0u8; 32]; 4];
        getrandom::getrandom(scalars.as_flattened_mut()).unwrap();
        let points: [[u8; 32]; 4] = core::array::from_fn(|_| random_public(&rng));
        let ladder = x25519(&scalars, &points);
        let (public, shared) = server_share(&table, &scalars, &points);
        for lane in 0..4 {
            let (want_public, want_shared) = aws_lc_share(&scalars[lane], &points[lane]);
            assert_eq!(
                ladder[lane], want_shared,
                "lane {lane} differs from aws-lc-rs"
            );
            assert_eq!(
                public[lane], want_public,
                "lane {lane}: public value differs"
            );
            assert_eq!(
                shared[lane], want_shared,
                "lane {lane}: shared secret differs"
            );
        }
    }
    let hex = |s: &str| -> [u8; 32] {
        core::array::from_fn(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
    };
    let k = hex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4");
    let u = hex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c");
    let want = hex("c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552");
    assert!(x25519(&[k; 4], &[u; 4]).iter().all(|r| *r == want));
    println!(
        "checked: 256 scalar multiplications and 256 server shares equal aws-lc-rs's, and RFC 7748's vector"
    );
}
