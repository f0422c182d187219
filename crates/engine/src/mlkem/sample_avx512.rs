//! SampleNTT's rejection step with AVX-512 (F, BW and VBMI) and POPCNT: sixteen 12-bit
//! candidates from 24 bytes at a time, those below q packed to the front of
//! a register (`vpcompressd`) and appended to the list. The bytes are public
//! (SHAKE128 of the client's seed), so their values may decide the count.

use super::poly::Q;
use core::arch::x86_64::*;

/// Whether this CPU has what [`append_candidates`] needs.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vbmi")
        && is_x86_feature_detected!("popcnt")
}

/// Appends to `list[n..]` the candidates of `block` (a multiple of 24 bytes)
/// that are below q, in order; returns the new length. `list` needs room for
/// `n` plus every candidate plus 16 (a whole register is stored each time).
///
/// # Panics
///
/// If this CPU lacks the features ([`available`]) or `list` is too short.
pub(super) fn append_candidates(block: &[u8], list: &mut [i32], n: usize) -> usize {
    assert!(available(), "AVX-512 F, BW and VBMI, and POPCNT");
    assert_eq!(block.len() % 24, 0);
    assert!(
        list.len() >= n + block.len() / 3 * 2 + 16,
        "room for the candidates"
    );
    // SAFETY: the features are present (checked above).
    unsafe { append_avx512(block, list, n) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,popcnt")]
unsafe fn append_avx512(block: &[u8], list: &mut [i32], mut n: usize) -> usize {
    // Dword k takes the two bytes that hold candidate k: bytes 3(k/2) and the next for
    // an even k (the low 12 bits), bytes 3(k/2) + 1 and the next for an odd one (the
    // high 12 bits, shifted down by 4); its upper two bytes are zeroed by the mask.
    let index: [u8; 64] = core::array::from_fn(|b| {
        let (k, byte) = (b / 4, b % 4);
        (3 * (k / 2) + (k % 2) + byte.min(1)) as u8
    });
    let index = _mm512_loadu_si512(index.as_ptr().cast());
    let shifts = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    let twelve_bits = _mm512_set1_epi32(0xfff);
    let q = _mm512_set1_epi32(Q);
    for chunk in block.chunks_exact(24) {
        // SAFETY: the masked load reads the chunk's 24 bytes only.
        let bytes = unsafe { _mm512_maskz_loadu_epi8(0xff_ffff, chunk.as_ptr().cast()) };
        let pairs = _mm512_maskz_permutexvar_epi8(0x3333_3333_3333_3333, index, bytes);
        let candidates = _mm512_and_si512(_mm512_srlv_epi32(pairs, shifts), twelve_bits);
        let keep = _mm512_cmplt_epi32_mask(candidates, q);
        let packed = _mm512_maskz_compress_epi32(keep, candidates);
        // SAFETY: `list` has room for 16 values from `n` (asserted by the caller).
        unsafe { _mm512_storeu_si512(list.as_mut_ptr().add(n).cast(), packed) };
        n += keep.count_ones() as usize;
    }
    n
}
