//! Conversions between the shared radix-2^52 limbs and the kernel's own
//! B-bit limbs, one half (4 lanes) at a time. Bit positions depend only on
//! the limb counts, never on values.

use core::arch::x86_64::*;

use super::{ld, ld_half, st, st_half, Y};
use crate::bn::{Lanes, LIMB_BITS};

/// `v << s` for `s` in 0..64 or `v >> -s` for `s` in -63..0 (a count of 64
/// or more gives zero, as the instructions define it).
#[inline(always)]
unsafe fn shift(v: __m256i, s: isize) -> __m256i {
    // SAFETY: AVX2 enabled (caller).
    unsafe {
        if s >= 0 {
            _mm256_sll_epi64(v, _mm_cvtsi64_si128(s as i64))
        } else {
            _mm256_srl_epi64(v, _mm_cvtsi64_si128(-s as i64))
        }
    }
}

/// Half `h` of `x` (normalized 52-bit limbs) as `L` limbs of `B` bits at
/// `dst` (limbs above the value are zero).
#[inline(always)]
pub(super) unsafe fn split<const L: usize, const B: i32>(x: &[Lanes], h: usize, dst: *mut Y) {
    // SAFETY: dst has L entries (caller); AVX2 enabled.
    unsafe {
        let mask = _mm256_set1_epi64x((1 << B) - 1);
        let b = B as usize;
        for i in 0..L {
            let (q, o) = (b * i / LIMB_BITS, b * i % LIMB_BITS);
            let mut v = _mm256_setzero_si256();
            if q < x.len() {
                v = shift(ld_half(&x[q], h), -(o as isize));
                if o + b > LIMB_BITS && q + 1 < x.len() {
                    let hi = shift(ld_half(&x[q + 1], h), (LIMB_BITS - o) as isize);
                    v = _mm256_or_si256(v, hi);
                }
            }
            st(dst.add(i), _mm256_and_si256(v, mask));
        }
    }
}

/// `L` limbs of `B` bits at `src` (normalized) as 52-bit limbs in half `h`
/// of `x`.
#[inline(always)]
pub(super) unsafe fn join<const L: usize, const B: i32>(src: *const Y, x: &mut [Lanes], h: usize) {
    // SAFETY: src has L entries (caller); AVX2 enabled.
    unsafe {
        let mask = _mm256_set1_epi64x((1 << LIMB_BITS) - 1);
        let b = B as usize;
        for (k, xk) in x.iter_mut().enumerate() {
            let lo = k * LIMB_BITS;
            let mut v = _mm256_setzero_si256();
            let mut i = lo / b;
            while i < L && b * i < lo + LIMB_BITS {
                v = _mm256_or_si256(v, shift(ld(src.add(i)), (b * i) as isize - lo as isize));
                i += 1;
            }
            st_half(xk, h, _mm256_and_si256(v, mask));
        }
    }
}
