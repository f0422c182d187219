//! AVX-512 IFMA kernel: 8 lanes x radix-2^52 limbs in zmm registers, or, for a pass of
//! at most 4 exponentiations (1 or 2 signatures), lanes 0..4 in ymm registers: the
//! same instructions at half the width, which cores that split a zmm operation in two
//! (AMD Zen 4) or issue more of them per cycle at 256 bits run in about half the time.
//!
//! Layout is vertical: limb k of the 8 numbers is one zmm (its low half one ymm). The
//! accumulator lives in registers while multiplicands and moduli are read as memory
//! operands of `vpmadd52{l,h}uq` (keeping them in registers as well spills).
//! Carries are lazy: 64-bit lanes absorb up to 2^12 52-bit additions, far
//! more than the 4N (mul) or 6N (sqr) a limb receives for N <= 80, so limbs
//! are normalized only once, at the end.
//!
//! Constant time: every function is straight-line code over the limb count
//! N (a public const generic) and the fixed table size; there is no branch
//! and no address that depends on lane values. IFMA, add, shift, and,
//! compare-to-mask and blend have data-independent latency. Valgrind cannot
//! run AVX-512, so `ct/run.sh` checks this kernel statically
//! (`ct/avx512_branches.py`: no branch and no address in its machine code
//! derives from loaded data). The rest of the RSA pipeline is shared with the
//! portable kernel and checked under valgrind.

use crate::bn::{Lanes, LANES};
use crate::kernel::{MontKernel, TABLE};
use core::arch::x86_64::*;
use core::mem::MaybeUninit;

/// Proof that the CPU has AVX-512F, VL and IFMA: only `new` creates one.
#[derive(Clone, Copy)]
pub(crate) struct Ifma {
    /// Only lanes 0..4 are computed, in ymm registers (the others of every result are 0).
    narrow: bool,
}

impl Ifma {
    /// The kernel for a pass whose operations fill the first `lanes` lanes.
    pub fn new(lanes: usize) -> Option<Self> {
        (is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512ifma"))
        .then_some(Ifma {
            narrow: lanes <= Ymm::LANES,
        })
    }
}

/// One register width of the kernel: the instructions it uses, each one intrinsic with
/// no branch and no address that depends on the values.
///
/// # Safety
/// Every operation needs the CPU features `Ifma::new` checked, enabled in the function
/// it is inlined into; loads and stores take pointers into live arrays of [`Lanes`].
trait Width {
    /// Lanes per register, from lane 0 of a [`Lanes`].
    const LANES: usize;
    type R: Copy;
    unsafe fn ld(p: *const Lanes) -> Self::R;
    unsafe fn st(p: *mut Lanes, v: Self::R);
    unsafe fn zero() -> Self::R;
    unsafe fn splat(x: i64) -> Self::R;
    unsafe fn add(a: Self::R, b: Self::R) -> Self::R;
    unsafe fn and(a: Self::R, b: Self::R) -> Self::R;
    /// `v >> 52` per lane.
    unsafe fn srli52(v: Self::R) -> Self::R;
    /// `acc + lo52(lo52(b) * lo52(c))` per lane.
    unsafe fn madd52lo(acc: Self::R, b: Self::R, c: Self::R) -> Self::R;
    /// `acc + hi52(lo52(b) * lo52(c))` per lane.
    unsafe fn madd52hi(acc: Self::R, b: Self::R, c: Self::R) -> Self::R;
    /// `entry` in the lanes where `idx == k`, `acc` in the others.
    unsafe fn take_where(acc: Self::R, idx: Self::R, k: i64, entry: Self::R) -> Self::R;
}

/// All 8 lanes in a zmm register.
struct Zmm;

/// Lanes 0..4 in a ymm register.
struct Ymm;

/// The `Width` of one register type, each operation its one intrinsic.
// SAFETY (every `unsafe` block this expands to): the callers guarantee the CPU features
// and, for loads and stores, pointers to live `Lanes`, which are 64-byte aligned and 64
// bytes long (a ymm load reads their first 32 bytes; a ymm store writes all 64).
macro_rules! width {
    ($width:ty, $lanes:literal, $r:ty, $load:ident, $store:ident, $zero:ident, $splat:ident,
     $add:ident, $and:ident, $srli:ident, $lo:ident, $hi:ident, $eq:ident, $mov:ident) => {
        impl Width for $width {
            const LANES: usize = $lanes;
            type R = $r;
            #[inline(always)]
            unsafe fn ld(p: *const Lanes) -> $r {
                // SAFETY: see the macro.
                unsafe { $load(p.cast()) }
            }
            #[inline(always)]
            unsafe fn st(p: *mut Lanes, v: $r) {
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
            unsafe fn srli52(v: $r) -> $r {
                // SAFETY: see the macro.
                unsafe { $srli::<52>(v) }
            }
            #[inline(always)]
            unsafe fn madd52lo(acc: $r, b: $r, c: $r) -> $r {
                // SAFETY: see the macro.
                unsafe { $lo(acc, b, c) }
            }
            #[inline(always)]
            unsafe fn madd52hi(acc: $r, b: $r, c: $r) -> $r {
                // SAFETY: see the macro.
                unsafe { $hi(acc, b, c) }
            }
            #[inline(always)]
            unsafe fn take_where(acc: $r, idx: $r, k: i64, entry: $r) -> $r {
                // SAFETY: see the macro.
                unsafe { $mov(acc, $eq(idx, $splat(k)), entry) }
            }
        }
    };
}

width!(
    Zmm,
    8,
    __m512i,
    _mm512_load_si512,
    _mm512_store_si512,
    _mm512_setzero_si512,
    _mm512_set1_epi64,
    _mm512_add_epi64,
    _mm512_and_si512,
    _mm512_srli_epi64,
    _mm512_madd52lo_epu64,
    _mm512_madd52hi_epu64,
    _mm512_cmpeq_epi64_mask,
    _mm512_mask_mov_epi64
);
/// A ymm register stored as a whole [`Lanes`], lanes 4..8 zero: results are written
/// into uninitialized memory, and a narrow pass's unused lanes stay zero.
///
/// # Safety
/// The CPU features of [`Width`]; `p` points to a live [`Lanes`].
#[inline(always)]
unsafe fn store_ymm_zero_upper(p: *mut __m512i, v: __m256i) {
    // SAFETY: see the function's contract; `Lanes` is 64-byte aligned.
    unsafe { _mm512_store_si512(p, _mm512_zextsi256_si512(v)) }
}

width!(
    Ymm,
    4,
    __m256i,
    _mm256_load_si256,
    store_ymm_zero_upper,
    _mm256_setzero_si256,
    _mm256_set1_epi64x,
    _mm256_add_epi64,
    _mm256_and_si256,
    _mm256_srli_epi64,
    _mm256_madd52lo_epu64,
    _mm256_madd52hi_epu64,
    _mm256_cmpeq_epi64_mask,
    _mm256_mask_mov_epi64
);

const _: () = assert!(LANES == 8 && core::mem::size_of::<Lanes>() == 64);

/// Returns `p` through an empty asm statement: LLVM can no longer prove the
/// loads through it loop-invariant, so it keeps them as memory operands
/// instead of hoisting them into (spilled) registers. Unlike
/// `core::hint::black_box` it has no memory clobber, which would force the
/// accumulators out of registers.
#[inline(always)]
fn opaque<T>(p: *const T) -> *const T {
    p.map_addr(|mut a| {
        // SAFETY: an empty asm template; it only passes the address through
        // a register (map_addr keeps the pointer's provenance).
        unsafe {
            core::arch::asm!("/* {0} */", inout(reg) a, options(nomem, nostack, preserves_flags))
        };
        a
    })
}

/// Final carry propagation of `N` accumulators into normalized limbs.
#[inline(always)]
unsafe fn normalize_store<V: Width, const N: usize>(r: *mut Lanes, t: &[V::R]) {
    // SAFETY: target features are enabled by the caller; `r` has N limbs.
    unsafe {
        let mask = V::splat((1 << 52) - 1);
        let mut carry = V::zero();
        for (j, &tj) in t.iter().enumerate().take(N) {
            let v = V::add(tj, carry);
            V::st(r.add(j), V::and(v, mask));
            carry = V::srli52(v);
        }
    }
}

/// Almost Montgomery multiplication, operand scanning: for each limb b_i,
/// t += a*b_i, t += m*y with y = t_0*k0 mod 2^52, then t >>= 52.
///
/// `r` is written only once the product is complete, so it may be `a` or `b`
/// (the exponentiation multiplies its accumulator in place).
#[inline(always)]
unsafe fn amm<V: Width, const N: usize>(
    r: *mut Lanes,
    a: *const Lanes,
    b: *const Lanes,
    m: &[Lanes; N],
    k0: &Lanes,
) {
    // SAFETY: the caller guarantees AVX-512F/VL/IFMA (an `Ifma` value exists)
    // and N limbs at `r`, `a` and `b`; all pointers below index them with j < N.
    unsafe {
        let zero = V::zero();
        let k0 = V::ld(k0);
        let mut t = [zero; N];
        for i in 0..N {
            let bi = V::ld(b.add(i));
            let ap = opaque(a);
            let mp = opaque(m.as_ptr());
            let mut t0 = V::madd52lo(t[0], bi, V::ld(ap));
            let y = V::madd52lo(zero, t0, k0);
            t0 = V::madd52lo(t0, y, V::ld(mp));
            // t0 is now a multiple of 2^52; its carry joins the next limb.
            let carry = V::srli52(t0);
            // Shift down one limb while accumulating (new t_j = old t_{j+1}
            // + ...). Written this way, not as a separate copy loop, so that
            // LLVM does not turn the shift into a memmove and keeps t in
            // registers.
            for j in 0..N - 1 {
                let mut v = V::madd52lo(t[j + 1], bi, V::ld(ap.add(j + 1)));
                v = V::madd52hi(v, bi, V::ld(ap.add(j)));
                v = V::madd52lo(v, y, V::ld(mp.add(j + 1)));
                t[j] = V::madd52hi(v, y, V::ld(mp.add(j)));
            }
            let top = V::madd52hi(zero, bi, V::ld(ap.add(N - 1)));
            t[N - 1] = V::madd52hi(top, y, V::ld(mp.add(N - 1)));
            t[0] = V::add(t[0], carry);
        }
        normalize_store::<V, N>(r, &t);
    }
}

/// Tile width of the squaring's product phase; divides every limb count
/// used (20, 30, 40, 60, 80), and a 5x5 tile is small enough for LLVM to
/// unroll completely, so its 20 accumulators (10 columns, lo and hi apart)
/// stay in registers.
const TILE: usize = 5;

/// One band of the squaring's cross products: rows `a[0..TILE]` times the
/// `blocks` TILE-limb blocks that start at `a` (of the first block only the
/// upper triangle, pairs j > i), added into `p` (lo halves of `a_i * a_j` at
/// column i+j, hi halves at i+j+1, columns counted from `p`); the `first` band
/// stores into `p` instead, which holds nothing yet.
///
/// The 2*TILE columns a tile touches stay in registers while the band moves
/// from one block to the next: the lower TILE are finished and added to `p`,
/// the upper TILE carry over. Lo and hi halves have separate accumulators, so
/// a column waits on at most TILE multiply-adds in a row. Summing each tile
/// in memory instead chained every tile to the previous one's stores and, on
/// cores that issue two IFMA per cycle (AMD Zen 5), ran the product at half
/// the IFMA rate.
#[inline(always)]
unsafe fn square_band<V: Width>(p: *mut V::R, a: *const Lanes, blocks: usize, first: bool) {
    // SAFETY: the caller guarantees the target features, `a[0..TILE * blocks]`
    // and `p[0..TILE * (blocks + 1)]`, initialized up to its last TILE entries
    // unless `first`.
    unsafe {
        let zero = V::zero();
        let mut lo = [zero; 2 * TILE];
        let mut hi = [zero; 2 * TILE];
        for bj in 0..blocks {
            let b = a.add(TILE * bj);
            for i in 0..TILE {
                let ai = V::ld(a.add(i));
                for j in 0..TILE {
                    if bj > 0 || j > i {
                        lo[i + j] = V::madd52lo(lo[i + j], ai, V::ld(b.add(j)));
                        hi[i + j + 1] = V::madd52hi(hi[i + j + 1], ai, V::ld(b.add(j)));
                    }
                }
            }
            // Columns TILE*bj .. TILE*bj + TILE are complete for this band.
            add_columns::<V>(p.add(TILE * bj), &lo, &hi, first);
            for c in 0..TILE {
                lo[c] = lo[c + TILE];
                hi[c] = hi[c + TILE];
                lo[c + TILE] = zero;
                hi[c + TILE] = zero;
            }
        }
        add_columns::<V>(p.add(TILE * blocks), &lo, &hi, true);
    }
}

/// `out[c] += lo[c] + hi[c]` for the TILE columns a band has finished, or
/// `out[c] = ...` where no band has reached them yet (`fresh`). Band `bi`
/// covers columns `2*TILE*bi .. N + TILE*(bi + 1)`, so the first band is the
/// first to reach all its columns, and every band the first to reach its last
/// TILE.
#[inline(always)]
unsafe fn add_columns<V: Width>(
    out: *mut V::R,
    lo: &[V::R; 2 * TILE],
    hi: &[V::R; 2 * TILE],
    fresh: bool,
) {
    // SAFETY: the caller guarantees the target features and `out[0..TILE]`,
    // initialized unless `fresh`.
    unsafe {
        for c in 0..TILE {
            let sum = V::add(lo[c], hi[c]);
            let before = if fresh { V::zero() } else { out.add(c).read() };
            out.add(c).write(V::add(before, sum));
        }
    }
}

/// Dedicated squaring: the N(N-1)/2 cross products once (in bands of TILE
/// rows, TILE x TILE blocks at a time), doubled, plus the N squares, then a
/// separate Montgomery reduction of the 2N-limb product with the window in
/// registers. About
/// N^2 + 3N IFMA instead of 4N^2 + N for `amm(a, a)`'s 2N^2 products...
/// precisely: cross 2*N(N-1)/2, squares 2N, reduction 2N^2 + N. Same result
/// as `amm(a, a)`: y_i depends only on the running low limbs, which agree.
///
/// `a` is read only before the reduction and `r` written only after it, so `r`
/// may be `a` (the exponentiation squares its accumulator in place).
#[inline(always)]
unsafe fn sqr<V: Width, const N: usize>(
    r: *mut Lanes,
    a: *const Lanes,
    m: &[Lanes; N],
    k0: &Lanes,
) {
    const { assert!(N.is_multiple_of(TILE) && 2 * N <= 160) };
    // SAFETY: the caller guarantees AVX-512F/VL/IFMA and N limbs at `r` and
    // `a`; band offsets stay below 2N <= 160 entries of `p`, limb offsets
    // below N.
    unsafe {
        let zero = V::zero();
        let k0 = V::ld(k0);
        // Not cleared first: the bands store each column the first time they
        // reach it (clearing 2.5 KiB per squaring, which the compiler makes a
        // `memset` call, took 6% of the exponentiation).
        let mut buf = core::mem::MaybeUninit::<[V::R; 160]>::uninit();
        let pp = buf.as_mut_ptr().cast::<V::R>();
        let blocks = N / TILE;
        for bi in 0..blocks {
            square_band::<V>(
                pp.add(2 * TILE * bi),
                a.add(TILE * bi),
                blocks - bi,
                bi == 0,
            );
        }
        // The bands wrote through `pp`; only now is it borrowed as a slice.
        let p = core::slice::from_raw_parts_mut(pp, 2 * N);
        for i in 0..N {
            let ai = V::ld(a.add(i));
            let lo = V::add(p[2 * i], p[2 * i]);
            let hi = V::add(p[2 * i + 1], p[2 * i + 1]);
            p[2 * i] = V::madd52lo(lo, ai, ai);
            p[2 * i + 1] = V::madd52hi(hi, ai, ai);
        }
        // Reduction: window t = p[i..i+N] in registers, shifted as in amm.
        let mut t = [zero; N];
        t.copy_from_slice(&p[..N]);
        for i in 0..N {
            let mp = opaque(m.as_ptr());
            let y = V::madd52lo(zero, t[0], k0);
            let t0 = V::madd52lo(t[0], y, V::ld(mp));
            let carry = V::srli52(t0);
            for j in 0..N - 1 {
                let v = V::madd52lo(t[j + 1], y, V::ld(mp.add(j + 1)));
                t[j] = V::madd52hi(v, y, V::ld(mp.add(j)));
            }
            t[N - 1] = V::madd52hi(p[i + N], y, V::ld(mp.add(N - 1)));
            t[0] = V::add(t[0], carry);
        }
        normalize_store::<V, N>(r, &t);
        // The product of the secret operand stays behind in `buf`: wipe it with
        // one vector store per entry (volatile, so the stores are not dropped as
        // dead).
        for k in 0..2 * N {
            core::ptr::write_volatile(pp.add(k), zero);
        }
    }
}

/// Masked table lookup: every entry is read; lanes whose index matches take
/// the entry through a blend mask.
#[inline(always)]
unsafe fn select<V: Width, const N: usize>(
    r: *mut Lanes,
    table: &[[Lanes; N]; TABLE],
    idx: &Lanes,
) {
    // SAFETY: AVX-512F/VL present and N limbs at `r` (caller); indices are
    // within the arrays.
    unsafe {
        let idx = V::ld(idx);
        // Blocks of 16 limbs keep the running result in registers.
        for base in (0..N).step_by(16) {
            let len = (N - base).min(16);
            let mut acc = [V::zero(); 16];
            for (k, entry) in table.iter().enumerate() {
                for (j, accj) in acc.iter_mut().enumerate().take(len) {
                    *accj = V::take_where(*accj, idx, k as i64, V::ld(&entry[base + j]));
                }
            }
            for (j, &accj) in acc.iter().enumerate().take(len) {
                V::st(r.add(base + j), accj);
            }
        }
    }
}

// The entry points: the width-generic code above, inlined into functions compiled with
// the CPU features it needs, at the width `narrow` chooses. That choice comes from the
// lane count (public) as an argument, so it is a branch on a register the static check
// sees is not data.

#[target_feature(enable = "avx512f,avx512vl,avx512ifma")]
unsafe fn amm_at<const N: usize>(
    narrow: bool,
    r: *mut Lanes,
    a: *const Lanes,
    b: *const Lanes,
    m: &[Lanes; N],
    k0: &Lanes,
) {
    // SAFETY: the features are enabled here; the rest is the caller's.
    unsafe {
        if narrow {
            amm::<Ymm, N>(r, a, b, m, k0)
        } else {
            amm::<Zmm, N>(r, a, b, m, k0)
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx512ifma")]
unsafe fn sqr_at<const N: usize>(
    narrow: bool,
    r: *mut Lanes,
    a: *const Lanes,
    m: &[Lanes; N],
    k0: &Lanes,
) {
    // SAFETY: as for the multiplication.
    unsafe {
        if narrow {
            sqr::<Ymm, N>(r, a, m, k0)
        } else {
            sqr::<Zmm, N>(r, a, m, k0)
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx512ifma")]
unsafe fn select_at<const N: usize>(
    narrow: bool,
    r: *mut Lanes,
    table: &[[Lanes; N]; TABLE],
    idx: &Lanes,
) {
    // SAFETY: as for the multiplication.
    unsafe {
        if narrow {
            select::<Ymm, N>(r, table, idx)
        } else {
            select::<Zmm, N>(r, table, idx)
        }
    }
}

/// A number made by `write`, which is given a pointer to N uninitialized limbs.
///
/// # Safety
/// `write` writes all N limbs (narrow passes included: their stores write whole
/// [`Lanes`]).
#[inline(always)]
unsafe fn written<const N: usize>(write: impl FnOnce(*mut Lanes)) -> [Lanes; N] {
    let mut r = MaybeUninit::<[Lanes; N]>::uninit();
    write(r.as_mut_ptr().cast());
    // SAFETY: the caller's contract: every limb was written.
    unsafe { r.assume_init() }
}

impl MontKernel for Ifma {
    // Results are written straight into uninitialized memory or over an operand: on
    // 1,024-bit numbers, clearing and copying a 1,280-byte result around every
    // operation took a tenth of the exponentiation.
    fn mul<const N: usize>(
        &self,
        a: &[Lanes; N],
        b: &[Lanes; N],
        m: &[Lanes; N],
        k0: &Lanes,
    ) -> [Lanes; N] {
        // SAFETY: `self` proves AVX-512F, VL and IFMA were detected at runtime;
        // the multiplication writes all N limbs of its result.
        unsafe { written(|r| amm_at(self.narrow, r, a.as_ptr(), b.as_ptr(), m, k0)) }
    }

    fn mul_assign<const N: usize>(
        &self,
        a: &mut [Lanes; N],
        b: &[Lanes; N],
        m: &[Lanes; N],
        k0: &Lanes,
    ) {
        let ap = a.as_mut_ptr();
        // SAFETY: as in `mul`; `amm` allows its result over its first operand.
        unsafe { amm_at(self.narrow, ap, ap, b.as_ptr(), m, k0) };
    }

    fn sqr<const N: usize>(&self, a: &[Lanes; N], m: &[Lanes; N], k0: &Lanes) -> [Lanes; N] {
        // SAFETY: as in `mul`.
        unsafe { written(|r| sqr_at(self.narrow, r, a.as_ptr(), m, k0)) }
    }

    fn sqr_assign<const N: usize>(&self, a: &mut [Lanes; N], m: &[Lanes; N], k0: &Lanes) {
        let ap = a.as_mut_ptr();
        // SAFETY: as in `mul`; `sqr` allows its result over its operand.
        unsafe { sqr_at(self.narrow, ap, ap, m, k0) };
    }

    fn select<const N: usize>(&self, table: &[[Lanes; N]; TABLE], idx: &Lanes) -> [Lanes; N] {
        // SAFETY: as in `mul`; the selection writes all N limbs of its result.
        unsafe { written(|r| select_at(self.narrow, r, table, idx)) }
    }
}

/// The static check's own test (`ct/run.sh`, feature `ct-planted`): a copy of the
/// selection with a branch on the secret index planted in it, which the check must
/// refuse. Never called.
#[cfg(feature = "ct-planted")]
#[inline(never)]
pub fn planted_select(table: &[[Lanes; 20]; TABLE], idx: &Lanes) -> [Lanes; 20] {
    let mut r = [Lanes::default(); 20];
    for lane in 0..LANES {
        // The planted leak: a branch on a secret window value.
        if core::hint::black_box(idx.0[lane]) == 7 {
            for j in 0..20 {
                r[j].0[lane] = table[7][j].0[lane];
            }
        }
    }
    r
}
