//! Loads and stores of [`Lanes`] in zmm registers: the one way the X25519 and
//! P-256 IFMA kernels move their vertical-layout numbers between memory and
//! registers (the RSA kernel, which runs at zmm or ymm width, has its own in
//! `ifma.rs`).

use crate::bn::Lanes;
use core::arch::x86_64::*;

#[inline(always)]
pub(crate) unsafe fn ld(p: *const Lanes) -> __m512i {
    // SAFETY: `Lanes` is 64-byte aligned and 64 bytes long; callers pass
    // pointers into live arrays, from functions with AVX-512F enabled.
    unsafe { _mm512_load_si512(p.cast()) }
}

#[inline(always)]
pub(crate) unsafe fn st(p: *mut Lanes, v: __m512i) {
    // SAFETY: as for `ld`.
    unsafe { _mm512_store_si512(p.cast(), v) }
}
