//! Keccak-f[1600] for eight states in the 64-bit lanes of zmm registers
//! (AVX-512F): word `i` of the eight states is one register, so one pass of
//! 24 rounds permutes all eight.

use super::ROUND_CONSTANTS;
use crate::bn::Lanes;
use core::arch::x86_64::*;

/// Whether this CPU has AVX-512F.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// Permutes the eight states.
pub(super) fn permute8(words: &mut [Lanes; 25]) {
    assert!(available(), "AVX-512F");
    // SAFETY: AVX-512F is present (checked above).
    unsafe { permute8_avx512(words) }
}

/// The static check's own test (feature `ct-planted`): permutes only when the
/// first state word is not zero, a branch on secret data that the check must
/// refuse. Never called in earnest.
#[cfg(feature = "ct-planted")]
#[inline(never)]
pub fn planted_permute_unless_zero(words: &mut [Lanes; 25]) {
    if core::hint::black_box(words[0].0[0]) != 0 {
        permute8(words);
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn permute8_avx512(words: &mut [Lanes; 25]) {
    let mut a = [_mm512_setzero_si512(); 25];
    for (register, word) in a.iter_mut().zip(words.iter()) {
        // SAFETY: a `Lanes` is 64 aligned bytes in a live array, as `ld` needs.
        *register = unsafe { crate::zmm::ld(word) };
    }
    permute_words(&mut a);
    for (word, register) in words.iter_mut().zip(a.iter()) {
        // SAFETY: as for the loads.
        unsafe { crate::zmm::st(word, *register) };
    }
    // The registers' copy of the states is overwritten: they may hold secrets.
    a = [_mm512_setzero_si512(); 25];
    core::hint::black_box(&a);
}

/// One plane (row `y`) of the next state: its five words are rho-rotated words of the
/// state after theta (`(source word, its column, rotation)`), in pi's order, then chi,
/// in one ternary operation each (0xD2: b ^ (!b1 & b2)).
macro_rules! plane {
    ($a:ident, $d:ident, $e:ident, $y:literal; $(($i:literal, $x:literal, $r:literal)),*) => {{
        let b = [$(_mm512_rol_epi64::<$r>(_mm512_xor_si512($a[$i], $d[$x]))),*];
        for x in 0..5 {
            $e[x + 5 * $y] = _mm512_ternarylogic_epi64::<0xD2>(
                b[x],
                b[(x + 1) % 5],
                b[(x + 2) % 5],
            );
        }
    }};
}

/// The 24 rounds, theta's column parities kept in registers and the next state written
/// plane by plane (the layout of XKCP's compact implementations): few enough live
/// registers that the state is not spilled at every step. No closures here: they would
/// not inherit the target feature, and their intrinsics would become calls.
#[target_feature(enable = "avx512f")]
#[inline]
fn permute_words(a: &mut [__m512i; 25]) {
    let mut e = [_mm512_setzero_si512(); 25];
    for rc in ROUND_CONSTANTS {
        // theta: each column's parity by two three-way XORs (0x96), then the mix.
        let mut c = [_mm512_setzero_si512(); 5];
        for x in 0..5 {
            let t = _mm512_ternarylogic_epi64::<0x96>(a[x], a[x + 5], a[x + 10]);
            c[x] = _mm512_ternarylogic_epi64::<0x96>(t, a[x + 15], a[x + 20]);
        }
        let mut d = [_mm512_setzero_si512(); 5];
        for x in 0..5 {
            d[x] = _mm512_xor_si512(c[(x + 4) % 5], _mm512_rol_epi64::<1>(c[(x + 1) % 5]));
        }
        plane!(a, d, e, 0; (0, 0, 0), (6, 1, 44), (12, 2, 43), (18, 3, 21), (24, 4, 14));
        plane!(a, d, e, 1; (3, 3, 28), (9, 4, 20), (10, 0, 3), (16, 1, 45), (22, 2, 61));
        plane!(a, d, e, 2; (1, 1, 1), (7, 2, 6), (13, 3, 25), (19, 4, 8), (20, 0, 18));
        plane!(a, d, e, 3; (4, 4, 27), (5, 0, 36), (11, 1, 10), (17, 2, 15), (23, 3, 56));
        plane!(a, d, e, 4; (2, 2, 62), (8, 3, 55), (14, 4, 39), (15, 0, 41), (21, 1, 2));
        e[0] = _mm512_xor_si512(e[0], _mm512_set1_epi64(rc as i64));
        core::mem::swap(a, &mut e);
    }
    // The scratch state holds the previous round's: overwritten.
    e = [_mm512_setzero_si512(); 25];
    core::hint::black_box(&e);
}
