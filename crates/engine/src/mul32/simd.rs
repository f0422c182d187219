//! The two register widths the kernel is built for: AVX2 (4 lanes per ymm)
//! and AVX-512F (8 lanes per zmm). Both multiply with `vpmuludq` (the low 32
//! bits of each 64-bit lane), so the limb layouts, the schedule and the
//! results are the same; only the lanes per instruction differ. The kernel's
//! code is written once over [`Simd`] and compiled into each width's entry
//! points, which enable that width's CPU features.

use core::arch::x86_64::*;

use zeroize::Zeroize;

use super::View;
use crate::bn::Lanes;
use crate::exp::ExpJob;
use crate::kernel::TABLE;

/// One register width: its lanes, its register and memory forms, and the
/// operations the kernel uses. Every operation is one or two instructions
/// with no branch and no address that depends on the values.
pub(crate) trait Simd: Sized + 'static {
    /// 64-bit lanes per register.
    const W: usize;
    /// A register.
    type R: Copy;
    /// A register's worth of memory, aligned to its size.
    type M: Copy + Default + Zeroize;
    /// The result of a lane-wise comparison.
    type K: Copy;

    /// Whether this CPU has the width's feature.
    fn detected() -> bool;

    /// Loads from `p`.
    ///
    /// # Safety
    /// `p` points into a live buffer of `Self::M`; the CPU has the width's feature.
    unsafe fn ld(p: *const Self::M) -> Self::R;
    /// Stores to `p`; as for `ld`.
    unsafe fn st(p: *mut Self::M, v: Self::R);
    /// Lanes `W*h..W*h+W` of a vertical limb (`h < 8 / W`).
    unsafe fn ld_lanes(x: &Lanes, h: usize) -> Self::R;
    /// Stores lanes `W*h..W*h+W` of a vertical limb.
    unsafe fn st_lanes(x: &mut Lanes, h: usize, v: Self::R);
    unsafe fn zero() -> Self::R;
    unsafe fn splat(x: i64) -> Self::R;
    unsafe fn add(a: Self::R, b: Self::R) -> Self::R;
    /// `lo32(a) * lo32(b)` per lane.
    unsafe fn mul(a: Self::R, b: Self::R) -> Self::R;
    unsafe fn and(a: Self::R, b: Self::R) -> Self::R;
    unsafe fn or(a: Self::R, b: Self::R) -> Self::R;
    /// `v >> S` per lane, by an immediate.
    unsafe fn srli<const S: i32>(v: Self::R) -> Self::R;
    /// `v << c` per lane (0 from 64 on), `c` in the low 64 bits of `c`.
    unsafe fn sll(v: Self::R, c: __m128i) -> Self::R;
    /// `v >> c` per lane (0 from 64 on).
    unsafe fn srl(v: Self::R, c: __m128i) -> Self::R;
    /// Which lanes of `a` and `b` are equal.
    unsafe fn eq(a: Self::R, b: Self::R) -> Self::K;
    /// `b` in the lanes `k` selects, `a` in the others.
    unsafe fn blend(a: Self::R, b: Self::R, k: Self::K) -> Self::R;

    /// The exponentiation (`super::exp::mod_exp`) of the job `base`, `exp`,
    /// `exp_bits`, `m`, `k0`, `one` (see `ExpJob`) into `r`, with this
    /// width's features, in the scratch `buf` and `k0s` (sized for L limbs).
    /// Every part is its own argument: see `super::View`.
    ///
    /// # Safety
    /// The CPU has the width's feature; the numbers have N limbs.
    #[allow(clippy::too_many_arguments)]
    unsafe fn mod_exp<const N: usize, const L: usize, const B: i32>(
        buf: &mut [Self::M],
        k0s: &mut [Self::M; 2],
        base: &[Lanes],
        exp: &[Lanes],
        exp_bits: usize,
        m: &[Lanes],
        k0: &Lanes,
        one: &[Lanes],
        r: &mut [Lanes],
        halves: usize,
    );
    /// One operation on shared radix-2^52 numbers (`super::mont52`), in the
    /// scratch `buf` and `k0s` (sized for L limbs).
    ///
    /// # Safety
    /// As for `mod_exp`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn mont52<const N: usize, const L: usize, const B: i32>(
        buf: &mut [Self::M],
        k0s: &mut [Self::M; 2],
        r: &mut [Lanes],
        a: Option<&[Lanes]>,
        b: Option<&[Lanes]>,
        m: &[Lanes],
        k0: &Lanes,
        halves: usize,
    );
    /// The masked table lookup (`super::select_halves`).
    ///
    /// # Safety
    /// As for `mod_exp`.
    unsafe fn select<const N: usize>(
        r: &mut [Lanes; N],
        table: &[[Lanes; N]; TABLE],
        idx: &Lanes,
        halves: usize,
    );
}

/// One ymm register of 4 lanes, as plain integers (so the scratch can be
/// zeroized).
#[derive(Clone, Copy, Default, Zeroize)]
#[repr(C, align(32))]
pub(crate) struct Y([u64; 4]);

/// One zmm register of 8 lanes.
#[derive(Clone, Copy, Default, Zeroize)]
#[repr(C, align(64))]
pub(crate) struct Z([u64; 8]);

/// AVX2: two halves of 4 lanes make a pass of 8.
pub(crate) struct Ymm;

/// AVX-512F: the 8 lanes of a pass in one register.
pub(crate) struct Zmm;

/// The entry points of one width: the generic code, inlined into functions
/// compiled with the width's target feature.
macro_rules! entry_points {
    ($feature:literal) => {
        #[target_feature(enable = $feature)]
        unsafe fn mod_exp<const N: usize, const L: usize, const B: i32>(
            buf: &mut [Self::M],
            k0s: &mut [Self::M; 2],
            base: &[Lanes],
            exp: &[Lanes],
            exp_bits: usize,
            m: &[Lanes],
            k0: &Lanes,
            one: &[Lanes],
            r: &mut [Lanes],
            halves: usize,
        ) {
            let mut s = View { buf, k0: k0s };
            let job = ExpJob {
                base,
                exp,
                exp_bits,
                m,
                k0,
                one,
            };
            // SAFETY: the feature is enabled here; the rest is the caller's.
            unsafe { super::exp::mod_exp::<Self, N, L, B>(&mut s, &job, r, halves) }
        }

        #[target_feature(enable = $feature)]
        unsafe fn mont52<const N: usize, const L: usize, const B: i32>(
            buf: &mut [Self::M],
            k0s: &mut [Self::M; 2],
            r: &mut [Lanes],
            a: Option<&[Lanes]>,
            b: Option<&[Lanes]>,
            m: &[Lanes],
            k0: &Lanes,
            halves: usize,
        ) {
            let mut s = View { buf, k0: k0s };
            // SAFETY: as for `mod_exp`.
            unsafe { super::mont52::<Self, N, L, B>(&mut s, r, a, b, m, k0, halves) }
        }

        #[target_feature(enable = $feature)]
        unsafe fn select<const N: usize>(
            r: &mut [Lanes; N],
            table: &[[Lanes; N]; TABLE],
            idx: &Lanes,
            halves: usize,
        ) {
            // SAFETY: as for `mod_exp`.
            unsafe {
                if super::registers::<Self>(halves) == 2 {
                    super::select_halves::<Self, N, 2>(r, table, idx);
                } else {
                    super::select_halves::<Self, N, 1>(r, table, idx);
                }
            }
        }
    };
}

/// The operations that are one intrinsic each, named per width: loads and
/// stores of whole registers, zero, splat, add, and, or and the shifts by a
/// register count.
// SAFETY (every `unsafe` block these expand to): the caller guarantees the
// CPU feature and pointers into live, aligned buffers of the register's size.
macro_rules! one_instruction_ops {
    ($r:ty, $m:ty, $load:ident, $store:ident, $zero:ident, $splat:ident, $add:ident,
     $and:ident, $or:ident, $sll:ident, $srl:ident) => {
        #[inline(always)]
        unsafe fn ld(p: *const $m) -> $r {
            // SAFETY: see the macro.
            unsafe { $load(p.cast()) }
        }
        #[inline(always)]
        unsafe fn st(p: *mut $m, v: $r) {
            // SAFETY: see the macro.
            unsafe { $store(p.cast(), v) }
        }
        #[inline(always)]
        unsafe fn zero() -> $r {
            // SAFETY: see the macro.
            unsafe { $zero() }
        }
        #[inline(always)]
        unsafe fn splat(x: i64) -> $r {
            // SAFETY: see the macro.
            unsafe { $splat(x) }
        }
        #[inline(always)]
        unsafe fn add(a: $r, b: $r) -> $r {
            // SAFETY: see the macro.
            unsafe { $add(a, b) }
        }
        #[inline(always)]
        unsafe fn and(a: $r, b: $r) -> $r {
            // SAFETY: see the macro.
            unsafe { $and(a, b) }
        }
        #[inline(always)]
        unsafe fn or(a: $r, b: $r) -> $r {
            // SAFETY: see the macro.
            unsafe { $or(a, b) }
        }
        #[inline(always)]
        unsafe fn sll(v: $r, c: __m128i) -> $r {
            // SAFETY: see the macro.
            unsafe { $sll(v, c) }
        }
        #[inline(always)]
        unsafe fn srl(v: $r, c: __m128i) -> $r {
            // SAFETY: see the macro.
            unsafe { $srl(v, c) }
        }
    };
}

// SAFETY (every `unsafe` block in the two impls): the caller guarantees the
// CPU feature; `Lanes` is 64-byte aligned and 8 lanes long, so lanes
// W*h..W*h+W (h < 8/W) are aligned and inside it.
impl Simd for Ymm {
    const W: usize = 4;
    type R = __m256i;
    type M = Y;
    type K = __m256i;

    fn detected() -> bool {
        is_x86_feature_detected!("avx2")
    }

    one_instruction_ops!(
        __m256i,
        Y,
        _mm256_load_si256,
        _mm256_store_si256,
        _mm256_setzero_si256,
        _mm256_set1_epi64x,
        _mm256_add_epi64,
        _mm256_and_si256,
        _mm256_or_si256,
        _mm256_sll_epi64,
        _mm256_srl_epi64
    );

    #[inline(always)]
    unsafe fn ld_lanes(x: &Lanes, h: usize) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_load_si256(x.0.as_ptr().add(4 * h).cast()) }
    }
    #[inline(always)]
    unsafe fn st_lanes(x: &mut Lanes, h: usize, v: __m256i) {
        // SAFETY: see the impl.
        unsafe { _mm256_store_si256(x.0.as_mut_ptr().add(4 * h).cast(), v) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_mul_epu32(a, b) }
    }
    #[inline(always)]
    unsafe fn srli<const S: i32>(v: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_srli_epi64::<S>(v) }
    }
    #[inline(always)]
    unsafe fn eq(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_cmpeq_epi64(a, b) }
    }
    #[inline(always)]
    unsafe fn blend(a: __m256i, b: __m256i, k: __m256i) -> __m256i {
        // One blend per limb instead of an and and an or: the mask chooses
        // per byte, without a branch.
        // SAFETY: see the impl.
        unsafe { _mm256_blendv_epi8(a, b, k) }
    }

    entry_points!("avx2");
}

impl Simd for Zmm {
    const W: usize = 8;
    type R = __m512i;
    type M = Z;
    type K = __mmask8;

    fn detected() -> bool {
        is_x86_feature_detected!("avx512f")
    }

    one_instruction_ops!(
        __m512i,
        Z,
        _mm512_load_si512,
        _mm512_store_si512,
        _mm512_setzero_si512,
        _mm512_set1_epi64,
        _mm512_add_epi64,
        _mm512_and_si512,
        _mm512_or_si512,
        _mm512_sll_epi64,
        _mm512_srl_epi64
    );

    #[inline(always)]
    unsafe fn ld_lanes(x: &Lanes, h: usize) -> __m512i {
        debug_assert_eq!(h, 0);
        // SAFETY: see the impl.
        unsafe { _mm512_load_si512(x.0.as_ptr().cast()) }
    }
    #[inline(always)]
    unsafe fn st_lanes(x: &mut Lanes, h: usize, v: __m512i) {
        debug_assert_eq!(h, 0);
        // SAFETY: see the impl.
        unsafe { _mm512_store_si512(x.0.as_mut_ptr().cast(), v) }
    }
    /// In assembly: through `_mm512_mul_epu32` the compiler rewrites the
    /// product as a 64-bit multiplication of the masked operands, then
    /// loses track of the quotient digits being below 2^32 and lowers it as
    /// three multiplies and a shift (measured: 38% slower exponentiation).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn mul(a: __m512i, b: __m512i) -> __m512i {
        let r;
        // SAFETY: one instruction on registers; AVX-512F enabled.
        unsafe {
            core::arch::asm!(
                "vpmuludq {r}, {a}, {b}",
                r = lateout(zmm_reg) r,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        r
    }
    #[inline(always)]
    unsafe fn srli<const S: i32>(v: __m512i) -> __m512i {
        // The immediate form takes a `u32` count here; the kernel's shifts
        // are its limb widths, each a constant.
        // SAFETY: see the impl.
        unsafe {
            match S {
                26 => _mm512_srli_epi64::<26>(v),
                28 => _mm512_srli_epi64::<28>(v),
                29 => _mm512_srli_epi64::<29>(v),
                _ => _mm512_srl_epi64(v, _mm_cvtsi64_si128(S as i64)),
            }
        }
    }
    #[inline(always)]
    unsafe fn eq(a: __m512i, b: __m512i) -> __mmask8 {
        // SAFETY: see the impl.
        unsafe { _mm512_cmpeq_epi64_mask(a, b) }
    }
    #[inline(always)]
    unsafe fn blend(a: __m512i, b: __m512i, k: __mmask8) -> __m512i {
        // A masked move: the mask register chooses per lane, without a branch.
        // SAFETY: see the impl.
        unsafe { _mm512_mask_blend_epi64(k, a, b) }
    }

    entry_points!("avx512f");
}
