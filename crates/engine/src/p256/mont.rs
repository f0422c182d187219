//! Portable constant-time Montgomery arithmetic modulo the two P-256 primes:
//! p (coordinates) and n (the group order: scalars, nonces, signatures).
//!
//! An element is four little-endian 64-bit limbs, fully reduced (< m), in
//! Montgomery form x * 2^256 mod m unless a function says otherwise.
//! Products are u128; every reduction is a masked subtraction, so the time
//! depends on nothing but the (public) modulus and exponents.

use crate::bn::barrier;

/// Four little-endian 64-bit limbs.
pub(crate) type U256 = [u64; 4];

/// The constants of Montgomery arithmetic modulo an odd `m` with 2^255 < m < 2^256.
pub(crate) struct Modulus {
    pub m: U256,
    /// -m^-1 mod 2^64.
    pub m0: u64,
    /// 2^512 mod m: `mul(x, r2)` brings x into Montgomery form.
    pub r2: U256,
    /// 2^256 mod m: one, in Montgomery form.
    pub one: U256,
}

/// p = 2^256 - 2^224 + 2^192 + 2^96 - 1, the field of the coordinates.
pub(crate) const P: Modulus = Modulus {
    m: [
        0xffffffffffffffff,
        0x00000000ffffffff,
        0x0000000000000000,
        0xffffffff00000001,
    ],
    m0: 1,
    r2: [
        0x0000000000000003,
        0xfffffffbffffffff,
        0xfffffffffffffffe,
        0x00000004fffffffd,
    ],
    one: [
        0x0000000000000001,
        0xffffffff00000000,
        0xffffffffffffffff,
        0x00000000fffffffe,
    ],
};

/// n, the order of the generator G.
pub(crate) const N: Modulus = Modulus {
    m: [
        0xf3b9cac2fc632551,
        0xbce6faada7179e84,
        0xffffffffffffffff,
        0xffffffff00000000,
    ],
    m0: 0xccd1c8aaee00bc4f,
    r2: [
        0x83244c95be79eea2,
        0x4699799c49bd6fa6,
        0x2845b2392b6bec59,
        0x66e12d94f3d95620,
    ],
    one: [
        0x0c46353d039cdaaf,
        0x4319055258e8617b,
        0x0000000000000000,
        0x00000000ffffffff,
    ],
};

/// All ones if `x == 0`, else 0.
#[inline(always)]
pub(crate) fn zero_mask(x: u64) -> u64 {
    0u64.wrapping_sub(barrier((!x & x.wrapping_sub(1)) >> 63))
}

/// `a` where `mask` is all ones, `b` where it is 0.
#[inline(always)]
pub(crate) fn select(mask: u64, a: &U256, b: &U256) -> U256 {
    let mask = barrier(mask);
    core::array::from_fn(|i| (a[i] & mask) | (b[i] & !mask))
}

/// All ones if `a == b`, else 0.
pub(crate) fn eq_mask(a: &U256, b: &U256) -> u64 {
    zero_mask((0..4).fold(0, |acc, i| acc | (a[i] ^ b[i])))
}

/// `a - b` and the borrow out (0 or 1).
#[inline(always)]
pub(crate) fn sub_borrow(a: &U256, b: &U256) -> (U256, u64) {
    let mut out = [0u64; 4];
    let mut borrow = 0u64;
    for i in 0..4 {
        let (d, b1) = a[i].overflowing_sub(b[i]);
        let (d, b2) = d.overflowing_sub(borrow);
        out[i] = d;
        borrow = (b1 | b2) as u64;
    }
    (out, borrow)
}

/// `a + b` and the carry out (0 or 1).
#[inline(always)]
fn add_carry(a: &U256, b: &U256) -> (U256, u64) {
    let mut out = [0u64; 4];
    let mut carry = 0u64;
    for i in 0..4 {
        let (s, c1) = a[i].overflowing_add(b[i]);
        let (s, c2) = s.overflowing_add(carry);
        out[i] = s;
        carry = (c1 | c2) as u64;
    }
    (out, carry)
}

/// `hi * 2^256 + x` minus m if that is not negative, for `hi` in {0, 1} and
/// a value below 2m: the result is below m.
#[inline(always)]
fn sub_if_ge(x: &U256, hi: u64, m: &Modulus) -> U256 {
    let (d, borrow) = sub_borrow(x, &m.m);
    // hi - borrow wraps only where the subtraction went below zero.
    let keep_x = 0u64.wrapping_sub(hi.wrapping_sub(borrow) >> 63);
    select(keep_x, x, &d)
}

/// Any `x < 2^256` reduced modulo m (one subtraction suffices: m > 2^255).
pub(crate) fn reduce_once(x: &U256, m: &Modulus) -> U256 {
    sub_if_ge(x, 0, m)
}

/// `a + b mod m`.
pub(crate) fn add(a: &U256, b: &U256, m: &Modulus) -> U256 {
    let (s, carry) = add_carry(a, b);
    sub_if_ge(&s, carry, m)
}

/// `a - b mod m`.
pub(crate) fn sub(a: &U256, b: &U256, m: &Modulus) -> U256 {
    let (d, borrow) = sub_borrow(a, b);
    let mask = 0u64.wrapping_sub(borrow);
    let back = select(mask, &m.m, &[0; 4]);
    add_carry(&d, &back).0
}

/// `a * b / 2^256 mod m` (CIOS Montgomery multiplication), for a, b < m.
pub(crate) fn mul(a: &U256, b: &U256, m: &Modulus) -> U256 {
    let mut t = [0u64; 6];
    for &ai in a {
        let mut carry = 0u64;
        for j in 0..4 {
            let v = t[j] as u128 + ai as u128 * b[j] as u128 + carry as u128;
            t[j] = v as u64;
            carry = (v >> 64) as u64;
        }
        let v = t[4] as u128 + carry as u128;
        t[4] = v as u64;
        t[5] = (v >> 64) as u64;
        let u = t[0].wrapping_mul(m.m0);
        let v = t[0] as u128 + u as u128 * m.m[0] as u128;
        let mut carry = (v >> 64) as u64;
        for j in 1..4 {
            let v = t[j] as u128 + u as u128 * m.m[j] as u128 + carry as u128;
            t[j - 1] = v as u64;
            carry = (v >> 64) as u64;
        }
        let v = t[4] as u128 + carry as u128;
        t[3] = v as u64;
        t[4] = t[5] + (v >> 64) as u64;
    }
    sub_if_ge(&[t[0], t[1], t[2], t[3]], t[4], m)
}

/// `x` (below m) into Montgomery form.
pub(crate) fn to_mont(x: &U256, m: &Modulus) -> U256 {
    mul(x, &m.r2, m)
}

/// `x` out of Montgomery form (canonical, below m).
pub(crate) fn from_mont(x: &U256, m: &Modulus) -> U256 {
    mul(x, &[1, 0, 0, 0], m)
}

/// `a^e` for a public exponent `e`, Montgomery form in and out: 4-bit fixed
/// windows, so the table index comes from the exponent, never from `a`.
pub(crate) fn pow_public(a: &U256, e: &U256, m: &Modulus) -> U256 {
    let mut table = [m.one; 16];
    for i in 1..16 {
        table[i] = mul(&table[i - 1], a, m);
    }
    let mut r = m.one;
    for nib in (0..64).rev() {
        for _ in 0..4 {
            r = mul(&r, &r, m);
        }
        let w = (e[nib / 16] >> (4 * (nib % 16))) & 15;
        r = mul(&r, &table[w as usize], m);
    }
    r
}

/// `a^-1 mod m` for a prime m by Fermat (`a^(m-2)`), Montgomery form in and
/// out; 0 gives 0.
pub(crate) fn invert(a: &U256, m: &Modulus) -> U256 {
    let e = sub_borrow(&m.m, &[2, 0, 0, 0]).0;
    pow_public(a, &e, m)
}

/// Big-endian bytes -> limbs.
pub(crate) fn from_be(b: &[u8; 32]) -> U256 {
    core::array::from_fn(|i| u64::from_be_bytes(b[24 - 8 * i..32 - 8 * i].try_into().expect("8")))
}

/// Limbs -> big-endian bytes.
pub(crate) fn to_be(x: &U256) -> [u8; 32] {
    let mut out = [0u8; 32];
    for i in 0..4 {
        out[24 - 8 * i..32 - 8 * i].copy_from_slice(&x[i].to_be_bytes());
    }
    out
}
