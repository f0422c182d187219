//! Conversions between the shared radix-2^52 limbs and the kernel's own
//! B-bit limbs, one register's lanes (a half of 4 with AVX2) at a time. Bit
//! positions depend only on the limb counts, never on values.

use core::arch::x86_64::_mm_cvtsi64_si128;

use super::Simd;
use crate::bn::{Lanes, LIMB_BITS};

/// `v << s` for `s` in 0..64 or `v >> -s` for `s` in -63..0 (a count of 64
/// or more gives zero, as the instructions define it).
#[inline(always)]
unsafe fn shift<V: Simd>(v: V::R, s: isize) -> V::R {
    // SAFETY: the width's feature enabled (caller).
    unsafe {
        if s >= 0 {
            V::sll(v, _mm_cvtsi64_si128(s as i64))
        } else {
            V::srl(v, _mm_cvtsi64_si128(-s as i64))
        }
    }
}

/// Half `h` of `x` (normalized 52-bit limbs) as `L` limbs of `B` bits at
/// `dst` (limbs above the value are zero).
#[inline(always)]
pub(super) unsafe fn split<V: Simd, const L: usize, const B: i32>(
    x: &[Lanes],
    h: usize,
    dst: *mut V::M,
) {
    // SAFETY: dst has L entries (caller); the width's feature enabled.
    unsafe {
        let mask = V::splat((1 << B) - 1);
        let b = B as usize;
        for i in 0..L {
            let (q, o) = (b * i / LIMB_BITS, b * i % LIMB_BITS);
            let mut v = V::zero();
            if q < x.len() {
                v = shift::<V>(V::ld_lanes(&x[q], h), -(o as isize));
                if o + b > LIMB_BITS && q + 1 < x.len() {
                    let hi = shift::<V>(V::ld_lanes(&x[q + 1], h), (LIMB_BITS - o) as isize);
                    v = V::or(v, hi);
                }
            }
            V::st(dst.add(i), V::and(v, mask));
        }
    }
}

/// `L` limbs of `B` bits at `src` (normalized) as 52-bit limbs in half `h`
/// of `x`.
#[inline(always)]
pub(super) unsafe fn join<V: Simd, const L: usize, const B: i32>(
    src: *const V::M,
    x: &mut [Lanes],
    h: usize,
) {
    // SAFETY: src has L entries (caller); the width's feature enabled.
    unsafe {
        let mask = V::splat((1 << LIMB_BITS) - 1);
        let b = B as usize;
        for (k, xk) in x.iter_mut().enumerate() {
            let lo = k * LIMB_BITS;
            let mut v = V::zero();
            let mut i = lo / b;
            while i < L && b * i < lo + LIMB_BITS {
                v = V::or(
                    v,
                    shift::<V>(V::ld(src.add(i)), (b * i) as isize - lo as isize),
                );
                i += 1;
            }
            V::st_lanes(xk, h, V::and(v, mask));
        }
    }
}
