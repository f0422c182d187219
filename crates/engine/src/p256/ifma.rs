//! P-256 on AVX-512 IFMA: the nonce points of 8 signatures at once, one per
//! 64-bit lane, in radix 2^52 (five limbs, limb k of the 8 elements in one
//! zmm: the "vertical" layout of the RSA and X25519 kernels).
//!
//! One Montgomery arithmetic (R = 2^260) serves both moduli, generic over
//! their constants ([`Modulus52`]): mod p for the point arithmetic, mod n for
//! the inversion of the 8 nonces. An element is kept below 2m with
//! normalized limbs (each < 2^52), which every operation preserves: a
//! product of two such elements is below (2m)^2 / 2^260 + m < 2m without a
//! final subtraction, and sums and differences are brought back by one
//! masked subtraction of 2m, except those whose only use is as a factor of
//! a product (below 4m is enough there: see [`add_to_mul`]). IFMA reads only
//! the low 52 bits of its multiplicands, hence normalized limbs before every
//! product.
//!
//! Constant time: straight-line code. A table lookup reads every entry of
//! its row and keeps the lane's own by a mask from the lane's digit, and the
//! inversions are fixed addition chains written out as straight-line code,
//! so no address or branch ever depends on a digit or an exponent bit. Valgrind
//! cannot run AVX-512, so `ct/run.sh` checks this code statically
//! (`ct/avx512_branches.py`), like the other IFMA kernels.

use super::base_table::BASE_TABLE_52;
use super::point::{complete_add, DIGITS};
use crate::bn::{Lanes, LANES};
use crate::zmm::{ld, st};
use core::arch::x86_64::*;

const M52: u64 = (1 << 52) - 1;

/// Proof that the CPU has AVX-512F and IFMA: only `new` creates one.
#[derive(Clone, Copy)]
pub(crate) struct IfmaP256 {
    _detected: (),
}

impl IfmaP256 {
    pub fn new() -> Option<Self> {
        crate::curve_kernel::ifma_detected().then_some(IfmaP256 { _detected: () })
    }

    /// For the 8 lanes' nonces k (`k`: five radix-2^52 limbs, canonical, 0 <
    /// k < n; `digits`: the same k as 65 signed radix-16 digits in [-8, 8],
    /// two's complement, as `point::signed_digits` gives them): the affine
    /// point k * G in `x`, `y` and k^-1 mod n in `k_inv`, all canonical,
    /// radix 2^52, not in Montgomery form.
    pub fn nonce_points(
        &self,
        out: &mut [[Lanes; 5]; 3],
        k: &[Lanes; 5],
        digits: &[Lanes; DIGITS],
    ) {
        // SAFETY: `self` proves AVX-512F and IFMA were detected at runtime.
        unsafe { nonce_points(out, k, digits) }
    }
}

const _: () = assert!(LANES == 8 && core::mem::size_of::<Lanes>() == 64);

type Fe = [__m512i; 5];

/// The constants of Montgomery arithmetic (R = 2^260) modulo m, in radix 2^52.
pub(crate) trait Modulus52 {
    const M: [u64; 5];
    const TWO_M: [u64; 5];
    /// -m^-1 mod 2^52.
    const K0: u64;
    /// 2^520 mod m: a product with it brings x into Montgomery form.
    const R2: [u64; 5];
}

/// p, the field of the coordinates.
pub(crate) struct ModP;
impl Modulus52 for ModP {
    const M: [u64; 5] = [
        0xfffffffffffff,
        0x00fffffffffff,
        0x0000000000000,
        0x0001000000000,
        0x0ffffffff0000,
    ];
    const TWO_M: [u64; 5] = [
        0xffffffffffffe,
        0x01fffffffffff,
        0x0000000000000,
        0x0002000000000,
        0x1fffffffe0000,
    ];
    const K0: u64 = 1;
    const R2: [u64; 5] = [
        0x0000000000300,
        0xffffffff00000,
        0xffffefffffffb,
        0xfdfffffffffff,
        0x0000004ffffff,
    ];
}

/// n, the order of G.
pub(crate) struct ModN;
impl Modulus52 for ModN {
    const M: [u64; 5] = [
        0x9cac2fc632551,
        0xada7179e84f3b,
        0xfffffffbce6fa,
        0x0000fffffffff,
        0x0ffffffff0000,
    ];
    const TWO_M: [u64; 5] = [
        0x39585f8c64aa2,
        0x5b4e2f3d09e77,
        0xfffffff79cdf5,
        0x0001fffffffff,
        0x1fffffffe0000,
    ];
    const K0: u64 = 0x1c8aaee00bc4f;
    const R2: [u64; 5] = [
        0x5cc0dea6dc3ba,
        0x192a067d8a084,
        0xbec59615571bb,
        0x1fc245b2392b6,
        0x0e12d9559d956,
    ];
}

/// 2^260 mod p: one in Montgomery form (mod p).
const ONE_P: [u64; 5] = [
    0x0000000000010,
    0xf000000000000,
    0xfffffffffffff,
    0xffeffffffffff,
    0x00000000fffff,
];
/// b of the curve equation, Montgomery form (R = 2^260).
const B_P: [u64; 5] = [
    0xdf6229c4bddfd,
    0xca8843090d89c,
    0x212ed6acf005c,
    0x83415a220abf7,
    0x0c30061dd4874,
];

#[inline(always)]
unsafe fn c(x: u64) -> __m512i {
    // SAFETY: AVX-512F is enabled in every caller (it is inlined into the
    // `#[target_feature]` entry point).
    unsafe { _mm512_set1_epi64(x as i64) }
}

/// A constant in every lane.
#[inline(always)]
unsafe fn cfe(x: &[u64; 5]) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe { core::array::from_fn(|i| c(x[i])) }
}

/// Limbs 0..3 brought to 52 bits, carries (signed: limbs may be negative)
/// into the next; limb 4 keeps the rest, negative where the value is.
#[inline(always)]
unsafe fn carry(mut r: Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        for i in 0..4 {
            r[i + 1] = _mm512_add_epi64(r[i + 1], _mm512_srai_epi64::<52>(r[i]));
            r[i] = _mm512_and_si512(r[i], c(M52));
        }
        r
    }
}

/// `x - k` in the lanes where that is not negative, `x` elsewhere (x
/// normalized, below 2k).
#[inline(always)]
unsafe fn sub_if_ge(x: &Fe, k: &[u64; 5]) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let d = carry(core::array::from_fn(|i| _mm512_sub_epi64(x[i], c(k[i]))));
        let neg = _mm512_cmplt_epi64_mask(d[4], _mm512_setzero_si512());
        core::array::from_fn(|i| _mm512_mask_blend_epi64(neg, d[i], x[i]))
    }
}

/// `a + b`, below 2m.
#[inline(always)]
unsafe fn add<M: Modulus52>(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let s = carry(core::array::from_fn(|i| _mm512_add_epi64(a[i], b[i])));
        sub_if_ge(&s, &M::TWO_M)
    }
}

/// `a - b + 2m` (positive, below 4m), brought below 2m.
#[inline(always)]
unsafe fn sub<M: Modulus52>(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let s = carry(core::array::from_fn(|i| {
            _mm512_sub_epi64(_mm512_add_epi64(a[i], c(M::TWO_M[i])), b[i])
        }));
        sub_if_ge(&s, &M::TWO_M)
    }
}

/// `a + b` for inputs below 2m, left below 4m (carried, not reduced): only
/// ever a factor of [`mul`], whose result stays below 2m for factors below
/// 4m (16m^2 / 2^260 < m). Skipping the masked subtraction saves a third of
/// the operations of an addition.
#[inline(always)]
unsafe fn add_to_mul(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe { carry(core::array::from_fn(|i| _mm512_add_epi64(a[i], b[i]))) }
}

/// `a - b + 2m` for inputs below 2m: positive, below 4m, carried, not
/// reduced; only ever a factor of [`mul`] (see [`add_to_mul`]).
#[inline(always)]
unsafe fn sub_to_mul<M: Modulus52>(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        carry(core::array::from_fn(|i| {
            _mm512_sub_epi64(_mm512_add_epi64(a[i], c(M::TWO_M[i])), b[i])
        }))
    }
}

/// `a * b / 2^260 mod m`, below 2m for inputs below 2m: five rounds of
/// "add a_i * b, add u * m with u making the lowest limb 0 mod 2^52, shift
/// one limb down". Column sums stay below 2^57 (at most 4 products and a
/// carry per round each).
#[inline(always)]
unsafe fn mul<M: Modulus52>(a: &Fe, b: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let z = _mm512_setzero_si512();
        let m = cfe(&M::M);
        let mut t = [z; 6];
        for ai in a {
            for j in 0..5 {
                t[j] = _mm512_madd52lo_epu64(t[j], *ai, b[j]);
                t[j + 1] = _mm512_madd52hi_epu64(t[j + 1], *ai, b[j]);
            }
            let u = if M::K0 == 1 {
                _mm512_and_si512(t[0], c(M52))
            } else {
                _mm512_madd52lo_epu64(z, t[0], c(M::K0))
            };
            // A zero limb of m (p has one) adds nothing: skipped at compile time.
            for j in (0..5).filter(|&j| M::M[j] != 0) {
                t[j] = _mm512_madd52lo_epu64(t[j], u, m[j]);
                t[j + 1] = _mm512_madd52hi_epu64(t[j + 1], u, m[j]);
            }
            let low = _mm512_srli_epi64::<52>(t[0]);
            t = [_mm512_add_epi64(t[1], low), t[2], t[3], t[4], t[5], z];
        }
        carry([t[0], t[1], t[2], t[3], t[4]])
    }
}

/// `a^2 / 2^260 mod m`, below 2m for `a` below 2m: the product's columns
/// first, with each cross product once and doubled (30 multiply-adds instead
/// of 50), then five reduction rounds as in [`mul`]. Columns stay below
/// 2^57 (cross terms under 2^56 after doubling, plus the squares and at most
/// two reduction terms and a carry per round).
#[inline(always)]
unsafe fn sqr<M: Modulus52>(a: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let z = _mm512_setzero_si512();
        let m = cfe(&M::M);
        let mut t = [z; 10];
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
        for i in 0..5 {
            let u = if M::K0 == 1 {
                _mm512_and_si512(t[i], c(M52))
            } else {
                _mm512_madd52lo_epu64(z, t[i], c(M::K0))
            };
            for j in (0..5).filter(|&j| M::M[j] != 0) {
                t[i + j] = _mm512_madd52lo_epu64(t[i + j], u, m[j]);
                t[i + j + 1] = _mm512_madd52hi_epu64(t[i + j + 1], u, m[j]);
            }
            t[i + 1] = _mm512_add_epi64(t[i + 1], _mm512_srli_epi64::<52>(t[i]));
        }
        carry([t[5], t[6], t[7], t[8], t[9]])
    }
}

/// `x` (canonical) into Montgomery form.
#[inline(always)]
unsafe fn to_mont<M: Modulus52>(x: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe { mul::<M>(x, &cfe(&M::R2)) }
}

/// `x` (below 2m) out of Montgomery form, canonical: x / 2^260 is at most m
/// (m only for x = 0 mod m), so one masked subtraction suffices.
#[inline(always)]
unsafe fn from_mont<M: Modulus52>(x: &Fe) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe { sub_if_ge(&mul::<M>(x, &cfe(&[1, 0, 0, 0, 0])), &M::M) }
}

/// `a^n` for n squarings (Montgomery form).
#[inline(always)]
unsafe fn sqr_n<M: Modulus52>(a: &Fe, n: usize) -> Fe {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let mut r = *a;
        for _ in 0..n {
            r = sqr::<M>(&r);
        }
        r
    }
}

/// `a^n` mod p and `b^n` mod n for n squarings of each, in one loop: the two
/// chains of squarings do not depend on each other, so the processor runs one
/// while the other waits on the multiplier's latency.
#[inline(always)]
unsafe fn sqr_n_both(a: &mut Fe, b: &mut Fe, n: usize) {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        for _ in 0..n {
            *a = sqr::<ModP>(a);
            *b = sqr::<ModN>(b);
        }
    }
}

/// `(z^-1 mod p, k^-1 mod n)` (Montgomery form in and out; 0 gives 0): Fermat's
/// inversions by two fixed addition chains, for p - 2 (255 squarings, 13
/// multiplications) and n - 2 (253 squarings, 39 multiplications), run side by
/// side: straight-line code generated by `gen_inversions.py`, which explains
/// the chains and checks them.
#[inline(always)]
unsafe fn invert_both(z: &Fe, k: &Fe) -> (Fe, Fe) {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe { include!("inversions.rs") }
}

/// A projective point mod p, coordinates in Montgomery form below 2p.
struct Proj {
    x: Fe,
    y: Fe,
    z: Fe,
}

/// `p + q`, complete (the formula shared with the portable kernel).
#[inline(always)]
unsafe fn point_add(p: &Proj, q: &Proj) -> Proj {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let b = cfe(&B_P);
        let (x, y, z) = complete_add!(
            mul::<ModP>,
            add::<ModP>,
            sub::<ModP>,
            &b,
            (&p.x, &p.y, &p.z),
            (&q.x, &q.y, &q.z)
        );
        Proj { x, y, z }
    }
}

/// Per lane: `digit * row[0]` where `row[j - 1]` is `j * 256^i * G`, digits
/// in [-8, 8], as affine (x, y), and the mask of the lanes whose digit is 0
/// (there (x, y) is meaningless: the caller keeps its sum unchanged). Every
/// entry is read (broadcast from the public table) and taken by a mask where
/// the lane's |digit| matches; y is negated by blend where the digit is
/// negative.
#[inline(always)]
unsafe fn select(row: &[[u64; 10]; 8], digit: __m512i) -> (Fe, Fe, __mmask8) {
    // SAFETY: target features enabled by the caller (inlined into the entry
    // point); indices are loop counters within the row.
    unsafe {
        let z = _mm512_setzero_si512();
        let neg = _mm512_cmplt_epi64_mask(digit, z);
        let abs = _mm512_abs_epi64(digit);
        let (mut x, mut y) = ([z; 5], [z; 5]);
        for (j, entry) in row.iter().enumerate() {
            let m = _mm512_cmpeq_epi64_mask(abs, c(j as u64 + 1));
            for l in 0..5 {
                x[l] = _mm512_mask_mov_epi64(x[l], m, c(entry[l]));
                y[l] = _mm512_mask_mov_epi64(y[l], m, c(entry[5 + l]));
            }
        }
        let minus_y = sub::<ModP>(&[z; 5], &y);
        for (yl, ml) in y.iter_mut().zip(minus_y) {
            *yl = _mm512_mask_blend_epi64(neg, *yl, ml);
        }
        (x, y, _mm512_cmpeq_epi64_mask(digit, z))
    }
}

/// `p + (x2, y2)` for an affine point (not the point at infinity) by the
/// mixed formula of the same paper (algorithm 5, a = -3: 11 multiplications,
/// 23 additions), complete for any projective `p`, the point at infinity
/// included. The eight sums and differences written `add_to_mul` and
/// `sub_to_mul` are read only as factors of products further on, never by
/// another sum or by the result, so they are left below 4p; every factor
/// pair of a product is then below 4p * 4p, and every product below 2p.
#[inline(always)]
unsafe fn point_add_affine(p: &Proj, x2: &Fe, y2: &Fe) -> Proj {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let (mul, add, sub) = (mul::<ModP>, add::<ModP>, sub::<ModP>);
        let b = cfe(&B_P);
        let (x1, y1, z1) = (&p.x, &p.y, &p.z);
        let mut t0 = mul(x1, x2);
        let mut t1 = mul(y1, y2);
        let mut t3 = mul(&add_to_mul(x2, y2), &add_to_mul(x1, y1));
        let mut t4 = add(&t0, &t1);
        t3 = sub_to_mul::<ModP>(&t3, &t4);
        t4 = add_to_mul(&mul(y2, z1), y1);
        let mut y3 = add(&mul(x2, z1), x1);
        let mut z3 = mul(&b, z1);
        let mut x3 = sub(&y3, &z3);
        z3 = add(&x3, &x3);
        x3 = add(&x3, &z3);
        z3 = sub_to_mul::<ModP>(&t1, &x3);
        x3 = add_to_mul(&t1, &x3);
        y3 = mul(&b, &y3);
        t1 = add(z1, z1);
        let mut t2 = add(&t1, z1);
        y3 = sub(&y3, &t2);
        y3 = sub(&y3, &t0);
        t1 = add(&y3, &y3);
        y3 = add_to_mul(&t1, &y3);
        t1 = add(&t0, &t0);
        t0 = add(&t1, &t0);
        t0 = sub_to_mul::<ModP>(&t0, &t2);
        t1 = mul(&t4, &y3);
        t2 = mul(&t0, &y3);
        y3 = add(&mul(&x3, &z3), &t2);
        x3 = sub(&mul(&t3, &x3), &t1);
        z3 = mul(&t4, &z3);
        t1 = mul(&t3, &t0);
        z3 = add(&z3, &t1);
        Proj {
            x: x3,
            y: y3,
            z: z3,
        }
    }
}

/// `h + digit * row[0]` per lane (see [`select`]): the mixed addition, kept
/// only in the lanes whose digit is not 0.
#[inline(always)]
unsafe fn add_digit(h: &Proj, row: &[[u64; 10]; 8], digit: __m512i) -> Proj {
    // SAFETY: target features enabled by the caller (inlined into the entry point).
    unsafe {
        let (x, y, zero) = select(row, digit);
        let sum = point_add_affine(h, &x, &y);
        let keep = |a: &Fe, b: &Fe| -> Fe {
            core::array::from_fn(|l| _mm512_mask_blend_epi64(zero, a[l], b[l]))
        };
        Proj {
            x: keep(&sum.x, &h.x),
            y: keep(&sum.y, &h.y),
            z: keep(&sum.z, &h.z),
        }
    }
}

/// `k * G` from k's 65 signed digits: the odd digits first (row i holds
/// multiples of 256^i G), times 16, then the even ones (the order of the
/// portable kernel).
#[inline(always)]
unsafe fn base_mult(digits: &[Lanes; DIGITS]) -> Proj {
    // SAFETY: target features enabled by the caller; loads index `digits`
    // (i < 65) and the table by loop counters.
    unsafe {
        let z = _mm512_setzero_si512();
        let mut h = Proj {
            x: [z; 5],
            y: cfe(&ONE_P),
            z: [z; 5],
        };
        for i in (1..DIGITS).step_by(2) {
            h = add_digit(&h, &BASE_TABLE_52[i / 2], ld(&digits[i]));
        }
        for _ in 0..4 {
            h = point_add(&h, &h);
        }
        for i in (0..DIGITS).step_by(2) {
            h = add_digit(&h, &BASE_TABLE_52[i / 2], ld(&digits[i]));
        }
        h
    }
}

/// See [`IfmaP256::nonce_points`].
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn nonce_points(out: &mut [[Lanes; 5]; 3], k: &[Lanes; 5], digits: &[Lanes; DIGITS]) {
    // SAFETY: the caller guarantees AVX-512F/IFMA; stores index `out` by
    // loop counters.
    unsafe {
        let r = base_mult(digits);
        let km = to_mont::<ModN>(&core::array::from_fn(|i| ld(&k[i])));
        let (zinv, k_inv) = invert_both(&r.z, &km);
        let x = from_mont::<ModP>(&mul::<ModP>(&r.x, &zinv));
        let y = from_mont::<ModP>(&mul::<ModP>(&r.y, &zinv));
        let k_inv = from_mont::<ModN>(&k_inv);
        for (o, v) in out.iter_mut().zip([x, y, k_inv]) {
            for i in 0..5 {
                st(&mut o[i], v[i]);
            }
        }
    }
}

/// The static check's own test for this kernel (`ct/run.sh`, feature
/// `ct-planted`): a table selection that branches on the secret digit
/// instead of masking, which the check must refuse. Never called.
#[cfg(feature = "ct-planted")]
#[inline(never)]
pub fn planted_select_p256(out: &mut [Lanes; 10], digits: &[Lanes; DIGITS], i: usize) {
    for lane in 0..LANES {
        // The planted leak: a branch (and an index) on a secret digit.
        let d = core::hint::black_box(digits[i].0[lane]) as usize;
        if d != 0 {
            for (l, o) in out.iter_mut().enumerate() {
                o.0[lane] = BASE_TABLE_52[i / 2][(d - 1) & 7][l];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The mixed addition at the top of its inputs' range: the sums it leaves unreduced
    //! (`add_to_mul`, `sub_to_mul`) are safe only if every product's factors stay below
    //! 4p, which random signatures rarely come near. Here every coordinate is given as
    //! its largest representation, value + p (just under 2p, every limb used), and the
    //! sum is checked against affine arithmetic with num-bigint.
    use super::*;
    use crate::p256::mont;
    use crate::p256::point;
    use crate::p256::tests::{big, modulus_big};
    use num_bigint::BigUint;

    fn p() -> BigUint {
        modulus_big(&mont::P)
    }

    fn inverse(x: &BigUint) -> BigUint {
        x.modpow(&(p() - 2u32), &p())
    }

    /// `x` (below p) as its Montgomery form plus p: below 2p, as large as the kernel's
    /// invariant allows.
    fn largest_form(x: &BigUint) -> [u64; 5] {
        let v = (x << 260u32) % p() + p();
        core::array::from_fn(|i| {
            ((&v >> (52 * i)) & BigUint::from((1u64 << 52) - 1))
                .to_u64_digits()
                .first()
                .copied()
                .unwrap_or(0)
        })
    }

    fn value(limbs: &[u64; 8 * 5], lane: usize) -> BigUint {
        (0..5).fold(BigUint::default(), |acc, i| {
            acc + (BigUint::from(limbs[i * 8 + lane]) << (52 * i))
        })
    }

    /// `p + q` by the kernel, every lane alike; projective coordinates out, Montgomery form.
    #[target_feature(enable = "avx512f,avx512ifma")]
    unsafe fn add_in_lanes(p: [[u64; 5]; 3], q: [[u64; 5]; 2]) -> [[u64; 40]; 3] {
        // SAFETY: the caller checked AVX-512F and IFMA.
        unsafe {
            let lanes = |x: &[u64; 5]| -> Fe { core::array::from_fn(|i| c(x[i])) };
            let sum = point_add_affine(
                &Proj {
                    x: lanes(&p[0]),
                    y: lanes(&p[1]),
                    z: lanes(&p[2]),
                },
                &lanes(&q[0]),
                &lanes(&q[1]),
            );
            [sum.x, sum.y, sum.z].map(|fe| {
                let mut out = [0u64; 40];
                for (i, limb) in fe.iter().enumerate() {
                    _mm512_storeu_si512(out[i * 8..].as_mut_ptr().cast(), *limb);
                }
                out
            })
        }
    }

    #[test]
    fn mixed_addition_holds_at_the_top_of_its_range() {
        if IfmaP256::new().is_none() {
            eprintln!("skipped: mixed_addition_holds_at_the_top_of_its_range needs AVX-512 IFMA");
            return;
        }
        let modulus = p();
        let affine = |k: u64| {
            let (x, y) = point::to_affine(&point::base_mult(&[k, 0, 0, 0]));
            (big(&x), big(&y))
        };
        // Small and large Z, and a doubling (the formula is complete).
        for (a, b, z) in [
            (3u64, 5u64, BigUint::from(7u32)),
            (11, 2, &modulus - 1u32),
            (1, 1 << 40, &modulus - 2u32),
            (9, 9, &modulus - 5u32),
        ] {
            let ((x1, y1), (x2, y2)) = (affine(a), affine(b));
            // P projective with the given Z; Q affine.
            let p_in =
                [&x1 * &z % &modulus, &y1 * &z % &modulus, z.clone()].map(|v| largest_form(&v));
            let q_in = [largest_form(&x2), largest_form(&y2)];
            // SAFETY: IFMA was detected above.
            let out = unsafe { add_in_lanes(p_in, q_in) };
            let want = if a == b {
                (3u32 * &x1 * &x1 + &modulus * 3u32 - 3u32) * inverse(&(2u32 * &y1)) % &modulus
            } else {
                (&y2 + &modulus - &y1) * inverse(&((&x2 + &modulus - &x1) % &modulus)) % &modulus
            };
            let x3 = (&want * &want + &modulus * 2u32 - &x1 - &x2) % &modulus;
            let y3 = (&want * ((&x1 + &modulus - &x3) % &modulus) + &modulus - &y1) % &modulus;
            let r_inv = inverse(&((BigUint::from(1u32) << 260u32) % &modulus));
            for lane in 0..8 {
                let [x, y, z] = [0, 1, 2].map(|i| value(&out[i], lane) * &r_inv % &modulus);
                let z_inv = inverse(&z);
                assert_eq!(x * &z_inv % &modulus, x3, "x, {a}G + {b}G");
                assert_eq!(y * &z_inv % &modulus, y3, "y, {a}G + {b}G");
            }
        }
    }
}
