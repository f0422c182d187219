//! A prototype, not a kernel: the Keccak-f[1600] permutation for eight states at once
//! (state word i of the eight in one zmm register, one state per 64-bit lane), to measure
//! the part of an ML-KEM-768 encapsulation that an eight-lane engine kernel would batch
//! best. Keccak (SHA3-256 of the client's encapsulation key, SHA3-512, SHAKE128 for the
//! public matrix, SHAKE256 for the noise) is about 60% of aws-lc's encapsulation inside a
//! handshake, most of it one state at a time. `keccak_speed` times this beside a portable
//! one-state permutation and aws-lc's SHA3-256, after checking both permutations against
//! aws-lc's SHA3-256.
//!
//! What a kernel would add: absorbing and squeezing eight messages (transposed into the
//! lanes), SHAKE's rejection sampling with a lane mask, and the rest of ML-KEM.

/// The round constants (FIPS 202, the iota step).
pub const ROUND_CONSTANTS: [u64; 24] = [
    0x0000000000000001,
    0x0000000000008082,
    0x800000000000808a,
    0x8000000080008000,
    0x000000000000808b,
    0x0000000080000001,
    0x8000000080008081,
    0x8000000000008009,
    0x000000000000008a,
    0x0000000000000088,
    0x0000000080008009,
    0x000000008000000a,
    0x000000008000808b,
    0x800000000000008b,
    0x8000000000008089,
    0x8000000000008003,
    0x8000000000008002,
    0x8000000000000080,
    0x000000000000800a,
    0x800000008000000a,
    0x8000000080008081,
    0x8000000000008080,
    0x0000000080000001,
    0x8000000080008008,
];

/// The rho step's rotation of word `x + 5y`.
const ROTATIONS: [u32; 25] = [
    0, 1, 62, 28, 27, 36, 44, 6, 55, 20, 3, 10, 43, 25, 39, 41, 45, 15, 21, 8, 18, 2, 61, 56, 14,
];

/// Where the pi step moves word `x + 5y`: to `y + 5((2x + 3y) mod 5)`.
const fn pi_target(i: usize) -> usize {
    let (x, y) = (i % 5, i / 5);
    y + 5 * ((2 * x + 3 * y) % 5)
}

/// One state, word `x + 5y` at index `x + 5y`.
pub fn permute(a: &mut [u64; 25]) {
    for rc in ROUND_CONSTANTS {
        let mut c = [0u64; 5];
        for (x, c) in c.iter_mut().enumerate() {
            *c = a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20];
        }
        for x in 0..5 {
            let d = c[(x + 4) % 5] ^ c[(x + 1) % 5].rotate_left(1);
            for y in 0..5 {
                a[x + 5 * y] ^= d;
            }
        }
        let mut b = [0u64; 25];
        for (i, word) in a.iter().enumerate() {
            b[pi_target(i)] = word.rotate_left(ROTATIONS[i]);
        }
        for y in 0..5 {
            for x in 0..5 {
                a[x + 5 * y] = b[x + 5 * y] ^ (!b[(x + 1) % 5 + 5 * y] & b[(x + 2) % 5 + 5 * y]);
            }
        }
        a[0] ^= rc;
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::ROUND_CONSTANTS;
    use core::arch::x86_64::*;

    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }

    /// Eight states: `lanes[l]` is state l. Needs AVX-512F ([`available`]).
    pub fn permute8(lanes: &mut [[u64; 25]; 8]) {
        assert!(available(), "AVX-512F");
        // SAFETY: AVX-512F is present (checked above).
        unsafe { permute8_avx512(lanes) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn permute8_avx512(lanes: &mut [[u64; 25]; 8]) {
        // Word i of the eight states in one register: gathered through an array (a
        // prototype's transpose; a kernel would absorb into this layout directly).
        let mut a = [_mm512_setzero_si512(); 25];
        for (i, word) in a.iter_mut().enumerate() {
            let w: [u64; 8] = core::array::from_fn(|l| lanes[l][i]);
            // SAFETY: `w` holds eight u64, the 64 bytes the unaligned load reads.
            *word = unsafe { _mm512_loadu_si512(w.as_ptr().cast()) };
        }
        permute_words(&mut a);
        for (i, word) in a.iter().enumerate() {
            let mut w = [0u64; 8];
            // SAFETY: `w` has room for the 64 bytes the unaligned store writes.
            unsafe { _mm512_storeu_si512(w.as_mut_ptr().cast(), *word) };
            for (l, lane) in lanes.iter_mut().enumerate() {
                lane[i] = w[l];
            }
        }
    }

    /// Eight states already in the register layout, as a kernel would keep them between
    /// the permutations of one hash. Needs AVX-512F ([`available`]).
    pub fn permute8_words(a: &mut [__m512i; 25]) {
        assert!(available(), "AVX-512F");
        // SAFETY: AVX-512F is present (checked above).
        unsafe { permute_words(a) }
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
    }
}
