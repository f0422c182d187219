//! Portable constant-time P-256 point arithmetic: the fixed-base scalar
//! multiplication k * G of signing and key setup.
//!
//! Points are homogeneous projective (X : Y : Z), coordinates in Montgomery
//! form mod p. Additions use the complete formula of Renes, Costello and
//! Batina ("Complete addition formulas for prime order elliptic curves",
//! 2016, algorithm 4 for a = -3): it is correct for every pair of inputs,
//! the point at infinity (0 : 1 : 0) and doublings included, so no input
//! needs a branch.

use super::base_table::BASE_TABLE;
use super::mont::{self, zero_mask, N, P, U256};
use zeroize::Zeroize;

/// b of y^2 = x^3 - 3x + b, in Montgomery form.
pub(crate) const B_MONT: U256 = [
    0xd89cdf6229c4bddf,
    0xacf005cd78843090,
    0xe5a220abf7212ed6,
    0xdc30061d04874834,
];

/// Signed radix-16 digits of a scalar: 65 of them, each in [-8, 8].
pub(crate) const DIGITS: usize = 65;

#[derive(Clone, Copy, Zeroize)]
pub(crate) struct Point {
    pub x: U256,
    pub y: U256,
    pub z: U256,
}

fn fmul(a: &U256, b: &U256) -> U256 {
    mont::mul(a, b, &P)
}
fn fadd(a: &U256, b: &U256) -> U256 {
    mont::add(a, b, &P)
}
fn fsub(a: &U256, b: &U256) -> U256 {
    mont::sub(a, b, &P)
}

/// `(x1 : y1 : z1) + (x2 : y2 : z2)` by the complete formula (RCB algorithm
/// 4, a = -3: 12 multiplications, 2 by b, 29 additions), for any field
/// implementation: `$mul`, `$add` and `$sub` take two `&` elements and
/// return one, `$b` is b in that implementation's form. Shared by the
/// portable and IFMA kernels so that the formula is written once.
macro_rules! complete_add {
    ($mul:expr, $add:expr, $sub:expr, $b:expr, ($x1:expr, $y1:expr, $z1:expr), ($x2:expr, $y2:expr, $z2:expr)) => {{
        let (x1, y1, z1, x2, y2, z2) = ($x1, $y1, $z1, $x2, $y2, $z2);
        let mut t0 = $mul(x1, x2);
        let mut t1 = $mul(y1, y2);
        let mut t2 = $mul(z1, z2);
        let mut t3 = $mul(&$add(x1, y1), &$add(x2, y2));
        let mut t4 = $add(&t0, &t1);
        t3 = $sub(&t3, &t4);
        t4 = $mul(&$add(y1, z1), &$add(y2, z2));
        let mut x3 = $add(&t1, &t2);
        t4 = $sub(&t4, &x3);
        x3 = $mul(&$add(x1, z1), &$add(x2, z2));
        let mut y3 = $add(&t0, &t2);
        y3 = $sub(&x3, &y3);
        let mut z3 = $mul($b, &t2);
        x3 = $sub(&y3, &z3);
        z3 = $add(&x3, &x3);
        x3 = $add(&x3, &z3);
        z3 = $sub(&t1, &x3);
        x3 = $add(&t1, &x3);
        y3 = $mul($b, &y3);
        t1 = $add(&t2, &t2);
        t2 = $add(&t1, &t2);
        y3 = $sub(&y3, &t2);
        y3 = $sub(&y3, &t0);
        t1 = $add(&y3, &y3);
        y3 = $add(&t1, &y3);
        t1 = $add(&t0, &t0);
        t0 = $add(&t1, &t0);
        t0 = $sub(&t0, &t2);
        t1 = $mul(&t4, &y3);
        t2 = $mul(&t0, &y3);
        y3 = $mul(&x3, &z3);
        y3 = $add(&y3, &t2);
        x3 = $mul(&t3, &x3);
        x3 = $sub(&x3, &t1);
        z3 = $mul(&t4, &z3);
        t1 = $mul(&t3, &t0);
        z3 = $add(&z3, &t1);
        (x3, y3, z3)
    }};
}
pub(super) use complete_add;

/// `p + q`, complete.
pub(crate) fn add(p: &Point, q: &Point) -> Point {
    let (x, y, z) = complete_add!(
        fmul,
        fadd,
        fsub,
        &B_MONT,
        (&p.x, &p.y, &p.z),
        (&q.x, &q.y, &q.z)
    );
    Point { x, y, z }
}

/// The scalar `k < 2^256` (little-endian words) as 65 signed radix-16 digits
/// in [-8, 8], k = sum d_i 16^i: each digit is recentred with a carry into the
/// next by arithmetic shifts, not branches.
pub(crate) fn signed_digits(k: &U256) -> [i8; DIGITS] {
    let mut d = [0i8; DIGITS];
    let mut carry = 0i8;
    for (i, di) in d.iter_mut().take(64).enumerate() {
        let v = ((k[i / 16] >> (4 * (i % 16))) & 15) as i8 + carry;
        carry = (v + 8) >> 4;
        *di = v - (carry << 4);
    }
    d[64] = carry;
    d
}

/// `|digit| * row[0]` (`row[j - 1]` = j * 256^i * G), negated for a negative
/// digit, the point at infinity for 0: every entry is read and kept by mask.
fn select(row: &[[u64; 8]; 8], digit: i8) -> Point {
    let sign = (digit >> 7) as i64 as u64;
    let abs = ((digit as i64 as u64 ^ sign).wrapping_sub(sign)) & 15;
    let mut q = Point {
        x: [0; 4],
        y: P.one,
        z: [0; 4],
    };
    for (j, entry) in row.iter().enumerate() {
        let m = zero_mask(abs ^ (j as u64 + 1));
        let ex: U256 = entry[..4].try_into().expect("4 limbs");
        let ey: U256 = entry[4..].try_into().expect("4 limbs");
        q.x = mont::select(m, &ex, &q.x);
        q.y = mont::select(m, &ey, &q.y);
        q.z = mont::select(m, &P.one, &q.z);
    }
    let neg_y = fsub(&[0; 4], &q.y);
    q.y = mont::select(sign, &neg_y, &q.y);
    q
}

/// `k * G` for a scalar `k < 2^256`: with k = sum d_i 16^i, the odd digits
/// first (row i holds multiples of 256^i G), times 16, then the even ones: 65
/// additions and 4 doublings.
pub(crate) fn base_mult(k: &U256) -> Point {
    let mut d = signed_digits(k);
    let mut h = Point {
        x: [0; 4],
        y: P.one,
        z: [0; 4],
    };
    for i in (1..DIGITS).step_by(2) {
        h = add(&h, &select(&BASE_TABLE[i / 2], d[i]));
    }
    for _ in 0..4 {
        h = add(&h, &h);
    }
    for i in (0..DIGITS).step_by(2) {
        h = add(&h, &select(&BASE_TABLE[i / 2], d[i]));
    }
    d.zeroize();
    h
}

/// The affine coordinates (canonical, not Montgomery form) of `p`; the point
/// at infinity gives (0, 0).
pub(crate) fn to_affine(p: &Point) -> (U256, U256) {
    let zinv = mont::invert(&p.z, &P);
    (
        mont::from_mont(&fmul(&p.x, &zinv), &P),
        mont::from_mont(&fmul(&p.y, &zinv), &P),
    )
}

/// All ones if the affine (x, y) (canonical) satisfies y^2 = x^3 - 3x + b.
pub(crate) fn on_curve_mask(x: &U256, y: &U256) -> u64 {
    let (xm, ym) = (mont::to_mont(x, &P), mont::to_mont(y, &P));
    let x3 = fmul(&fmul(&xm, &xm), &xm);
    let three_x = fadd(&fadd(&xm, &xm), &xm);
    let rhs = fadd(&fsub(&x3, &three_x), &B_MONT);
    mont::eq_mask(&fmul(&ym, &ym), &rhs)
}

/// The portable kernel for one nonce `k` (canonical, 0 < k < n): the affine
/// point k * G and k^-1 mod n (canonical).
pub(crate) fn nonce_point(k: &U256) -> (U256, U256, U256) {
    let mut r = base_mult(k);
    let (x, y) = to_affine(&r);
    let mut km = mont::to_mont(k, &N);
    let kinv = mont::from_mont(&mont::invert(&km, &N), &N);
    r.zeroize();
    km.zeroize();
    (x, y, kinv)
}
