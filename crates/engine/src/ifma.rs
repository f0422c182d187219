//! AVX-512 IFMA kernel: 8 lanes x radix-2^52 limbs in zmm registers.
//!
//! Layout is vertical: limb k of the 8 numbers is one zmm. The accumulator
//! lives in registers while multiplicands and moduli are read as memory
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
use crate::zmm::{ld, st};
use core::arch::x86_64::*;

/// Proof that the CPU has AVX-512F and IFMA: only `new` creates one.
#[derive(Clone, Copy)]
pub(crate) struct Ifma {
    _detected: (),
}

impl Ifma {
    pub fn new() -> Option<Self> {
        (is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512ifma"))
            .then_some(Ifma { _detected: () })
    }
}

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
unsafe fn normalize_store<const N: usize>(r: *mut Lanes, t: &[__m512i]) {
    // SAFETY: target features are enabled by the caller; `r` has N limbs.
    unsafe {
        let mask = _mm512_set1_epi64((1 << 52) - 1);
        let mut carry = _mm512_setzero_si512();
        for (j, &tj) in t.iter().enumerate().take(N) {
            let v = _mm512_add_epi64(tj, carry);
            st(r.add(j), _mm512_and_si512(v, mask));
            carry = _mm512_srli_epi64::<52>(v);
        }
    }
}

/// Almost Montgomery multiplication, operand scanning: for each limb b_i,
/// t += a*b_i, t += m*y with y = t_0*k0 mod 2^52, then t >>= 52.
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn amm<const N: usize>(
    r: &mut [Lanes; N],
    a: &[Lanes; N],
    b: &[Lanes; N],
    m: &[Lanes; N],
    k0: &Lanes,
) {
    // SAFETY: the caller guarantees AVX-512F/IFMA (an `Ifma` value exists);
    // all pointers below index arrays of N limbs with j < N.
    unsafe {
        let zero = _mm512_setzero_si512();
        let k0 = ld(k0);
        let mut t = [zero; N];
        for bi in b.iter() {
            let bi = ld(bi);
            let ap = opaque(a.as_ptr());
            let mp = opaque(m.as_ptr());
            let mut t0 = _mm512_madd52lo_epu64(t[0], bi, ld(ap));
            let y = _mm512_madd52lo_epu64(zero, t0, k0);
            t0 = _mm512_madd52lo_epu64(t0, y, ld(mp));
            // t0 is now a multiple of 2^52; its carry joins the next limb.
            let carry = _mm512_srli_epi64::<52>(t0);
            // Shift down one limb while accumulating (new t_j = old t_{j+1}
            // + ...). Written this way, not as a separate copy loop, so that
            // LLVM does not turn the shift into a memmove and keeps t in
            // registers.
            for j in 0..N - 1 {
                let mut v = _mm512_madd52lo_epu64(t[j + 1], bi, ld(ap.add(j + 1)));
                v = _mm512_madd52hi_epu64(v, bi, ld(ap.add(j)));
                v = _mm512_madd52lo_epu64(v, y, ld(mp.add(j + 1)));
                t[j] = _mm512_madd52hi_epu64(v, y, ld(mp.add(j)));
            }
            let top = _mm512_madd52hi_epu64(zero, bi, ld(ap.add(N - 1)));
            t[N - 1] = _mm512_madd52hi_epu64(top, y, ld(mp.add(N - 1)));
            t[0] = _mm512_add_epi64(t[0], carry);
        }
        normalize_store::<N>(r.as_mut_ptr(), &t);
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
/// column i+j, hi halves at i+j+1, columns counted from `p`).
///
/// The 2*TILE columns a tile touches stay in registers while the band moves
/// from one block to the next: the lower TILE are finished and added to `p`,
/// the upper TILE carry over. Lo and hi halves have separate accumulators, so
/// a column waits on at most TILE multiply-adds in a row. Summing each tile
/// in memory instead chained every tile to the previous one's stores and, on
/// cores that issue two IFMA per cycle (AMD Zen 5), ran the product at half
/// the IFMA rate.
#[inline(always)]
unsafe fn square_band(p: *mut __m512i, a: *const Lanes, blocks: usize) {
    // SAFETY: the caller guarantees the target features, `a[0..TILE * blocks]`
    // and `p[0..TILE * (blocks + 1)]`.
    unsafe {
        let zero = _mm512_setzero_si512();
        let mut lo = [zero; 2 * TILE];
        let mut hi = [zero; 2 * TILE];
        for bj in 0..blocks {
            let b = a.add(TILE * bj);
            for i in 0..TILE {
                let ai = ld(a.add(i));
                for j in 0..TILE {
                    if bj > 0 || j > i {
                        lo[i + j] = _mm512_madd52lo_epu64(lo[i + j], ai, ld(b.add(j)));
                        hi[i + j + 1] = _mm512_madd52hi_epu64(hi[i + j + 1], ai, ld(b.add(j)));
                    }
                }
            }
            // Columns TILE*bj .. TILE*bj + TILE are complete for this band.
            add_columns(p.add(TILE * bj), &lo, &hi);
            for c in 0..TILE {
                lo[c] = lo[c + TILE];
                hi[c] = hi[c + TILE];
                lo[c + TILE] = zero;
                hi[c + TILE] = zero;
            }
        }
        add_columns(p.add(TILE * blocks), &lo, &hi);
    }
}

/// `out[c] += lo[c] + hi[c]` for the TILE columns a band has finished.
#[inline(always)]
unsafe fn add_columns(out: *mut __m512i, lo: &[__m512i; 2 * TILE], hi: &[__m512i; 2 * TILE]) {
    // SAFETY: the caller guarantees the target features and `out[0..TILE]`.
    unsafe {
        for c in 0..TILE {
            let sum = _mm512_add_epi64(lo[c], hi[c]);
            out.add(c).write(_mm512_add_epi64(out.add(c).read(), sum));
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
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn sqr<const N: usize>(r: &mut [Lanes; N], a: &[Lanes; N], m: &[Lanes; N], k0: &Lanes) {
    const { assert!(N.is_multiple_of(TILE) && 2 * N <= 160) };
    // SAFETY: the caller guarantees AVX-512F/IFMA; band offsets stay below
    // 2N <= 160 entries of `p`, limb offsets below N.
    unsafe {
        let zero = _mm512_setzero_si512();
        let k0 = ld(k0);
        // Only the 2N entries used are zeroed (a full 10 KiB memset per
        // squaring costs ~10%).
        let mut buf = core::mem::MaybeUninit::<[__m512i; 160]>::uninit();
        let pp = buf.as_mut_ptr().cast::<__m512i>();
        for k in 0..2 * N {
            pp.add(k).write(zero);
        }
        let ap = a.as_ptr();
        let blocks = N / TILE;
        for bi in 0..blocks {
            square_band(pp.add(2 * TILE * bi), ap.add(TILE * bi), blocks - bi);
        }
        // The bands wrote through `pp`; only now is it borrowed as a slice.
        let p = core::slice::from_raw_parts_mut(pp, 2 * N);
        for i in 0..N {
            let ai = ld(ap.add(i));
            let lo = _mm512_add_epi64(p[2 * i], p[2 * i]);
            let hi = _mm512_add_epi64(p[2 * i + 1], p[2 * i + 1]);
            p[2 * i] = _mm512_madd52lo_epu64(lo, ai, ai);
            p[2 * i + 1] = _mm512_madd52hi_epu64(hi, ai, ai);
        }
        // Reduction: window t = p[i..i+N] in registers, shifted as in amm.
        let mut t = [zero; N];
        t.copy_from_slice(&p[..N]);
        for i in 0..N {
            let mp = opaque(m.as_ptr());
            let y = _mm512_madd52lo_epu64(zero, t[0], k0);
            let t0 = _mm512_madd52lo_epu64(t[0], y, ld(mp));
            let carry = _mm512_srli_epi64::<52>(t0);
            for j in 0..N - 1 {
                let v = _mm512_madd52lo_epu64(t[j + 1], y, ld(mp.add(j + 1)));
                t[j] = _mm512_madd52hi_epu64(v, y, ld(mp.add(j)));
            }
            t[N - 1] = _mm512_madd52hi_epu64(p[i + N], y, ld(mp.add(N - 1)));
            t[0] = _mm512_add_epi64(t[0], carry);
        }
        normalize_store::<N>(r.as_mut_ptr(), &t);
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
#[target_feature(enable = "avx512f")]
unsafe fn select<const N: usize>(r: &mut [Lanes; N], table: &[[Lanes; N]; TABLE], idx: &Lanes) {
    // SAFETY: AVX-512F present (caller); indices are within the arrays.
    unsafe {
        let idx = ld(idx);
        // Blocks of 16 limbs keep the running result in registers.
        for base in (0..N).step_by(16) {
            let len = (N - base).min(16);
            let mut acc = [_mm512_setzero_si512(); 16];
            for (k, entry) in table.iter().enumerate() {
                let mask = _mm512_cmpeq_epi64_mask(idx, _mm512_set1_epi64(k as i64));
                for (j, accj) in acc.iter_mut().enumerate().take(len) {
                    *accj = _mm512_mask_mov_epi64(*accj, mask, ld(&entry[base + j]));
                }
            }
            for (j, &accj) in acc.iter().enumerate().take(len) {
                st(&mut r[base + j], accj);
            }
        }
    }
}

impl MontKernel for Ifma {
    fn mul<const N: usize>(
        &self,
        a: &[Lanes; N],
        b: &[Lanes; N],
        m: &[Lanes; N],
        k0: &Lanes,
    ) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        // SAFETY: `self` proves AVX-512F + IFMA were detected at runtime.
        unsafe { amm(&mut r, a, b, m, k0) };
        r
    }

    fn sqr<const N: usize>(&self, a: &[Lanes; N], m: &[Lanes; N], k0: &Lanes) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        // SAFETY: as in `mul`.
        unsafe { sqr(&mut r, a, m, k0) };
        r
    }

    fn select<const N: usize>(&self, table: &[[Lanes; N]; TABLE], idx: &Lanes) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        // SAFETY: as in `mul`.
        unsafe { select(&mut r, table, idx) };
        r
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
