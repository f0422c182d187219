//! AVX2 kernel: 4 lanes per ymm register, `vpmuludq` (32x32->64), limbs of
//! 29 bits for RSA-2048, 28 for RSA-3072 and 26 above.
//!
//! For CPUs without AVX-512 IFMA (AMD Zen 2/3, Intel up to Cascade Lake, most
//! desktops). Layout is vertical like the IFMA kernel's: limb k of 4
//! independent numbers is one ymm, each lane with its own modulus. A pass of
//! 8 lanes runs as two halves of 4.
//!
//! Why these radixes: the work is the number of 32x32-bit multiplies, which
//! falls with the square of the limb count, so limbs are as wide as the
//! 64-bit column sums allow: 36 limbs of 29 bits for a 1040-bit CRT half
//! instead of 40 of 26 (19% fewer multiplies). The Montgomery constant stays
//! the shared `R = 2^(52N)`: the last of the reduction's digits is narrower
//! (25 bits for 1040 = 35*29 + 25), so the Montgomery quotient is the unique
//! one below R and every result is bit-identical to the IFMA and portable
//! kernels' — the tests compare them limb for limb. Where a 64-bit column
//! could overflow (29-bit limbs only), the crowded columns are carried once
//! per multiplication (`mont::carry_crowded`).
//!
//! The exponentiation keeps its numbers in this layout from the first power
//! to the last (`exp.rs`); the `MontKernel` operations on shared radix-2^52
//! numbers convert around one multiplication (used by the conversions into
//! and out of the Montgomery domain, the public-key check and the tests).
//!
//! Constant time: straight-line code over the public limb count and table
//! size; no branch or address depends on lane values. valgrind executes AVX2,
//! so `ct/run.sh` checks this kernel under memcheck exactly as built.
//!
//! Scratch: operands, modulus and column accumulators live in one buffer
//! owned by the kernel value, reused by every operation of a pass and
//! zeroized when the kernel is dropped.

mod convert;
mod exp;
mod mont;

use core::arch::x86_64::*;
use core::cell::RefCell;

use zeroize::Zeroize;

use crate::bn::{Lanes, LANES};
use crate::kernel::{MontKernel, TABLE};

/// Lanes per ymm register.
const HALF: usize = 4;
/// Most limbs of one operand: 160 limbs of 26 bits (the 4096-bit modulus of
/// the public-key check).
const MAXL: usize = 160;

/// One ymm of 4 lanes, as plain integers (so the scratch can be zeroized).
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Y([u64; HALF]);

impl Zeroize for Y {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}

/// The buffers of the scratch, per half: operands A, B and X and the modulus
/// M (L limbs each), the column accumulators T (2L).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Buf {
    A,
    B,
    X,
    M,
    T,
}

/// Entries of the scratch per limb of the operand size: the buffers of both
/// halves.
const SCRATCH_PER_LIMB: usize = 12;

/// Scratch of one kernel value, in the kernel's limbs.
struct Scratch {
    /// The buffers of both halves back to back, at offsets that follow the
    /// operand size: a multiplication's working set is contiguous, and
    /// buffers the kernel stores to and loads from in the same loop are not
    /// a multiple of 4 KiB apart (the CPU would take those loads for reads
    /// of the stored lines and wait: twice the time, measured).
    /// Sized by `fit` for the largest operand seen: allocating and zeroizing
    /// the 4096-bit size for every RSA-2048 pass took 1.7% of the time.
    buf: Vec<Y>,
    /// `k0` per half, low B bits.
    k0: [Y; 2],
}

impl Scratch {
    /// Makes room for operands of `l` limbs. The old buffer is zeroized
    /// before it is freed.
    fn fit(&mut self, l: usize) {
        if self.buf.len() < SCRATCH_PER_LIMB * l {
            self.buf.iter_mut().for_each(Y::zeroize);
            self.buf = vec![Y::default(); SCRATCH_PER_LIMB * l];
        }
    }

    /// Half `h` of buffer `b` for operands of `l` limbs (after `fit(l)`).
    fn at(&mut self, b: Buf, h: usize, l: usize) -> *mut Y {
        let (start, len) = match b {
            Buf::A => (0, l),
            Buf::B => (2 * l, l),
            Buf::X => (4 * l, l),
            Buf::M => (6 * l, l),
            Buf::T => (8 * l, 2 * l),
        };
        self.buf[start + h * len..][..len].as_mut_ptr()
    }
}

/// Proof that the CPU has AVX2 (only `new` creates one), with the pass's
/// lane count and scratch.
pub(crate) struct Avx2 {
    lanes: usize,
    scratch: RefCell<Box<Scratch>>,
}

impl Avx2 {
    /// The kernel for a pass of `lanes` exponentiations, if the CPU has AVX2.
    pub fn new(lanes: usize) -> Option<Self> {
        Self::detected().then(|| Avx2 {
            lanes: lanes.clamp(1, LANES),
            scratch: RefCell::new(Box::new(Scratch {
                buf: Vec::new(),
                k0: [Y::default(); 2],
            })),
        })
    }

    pub fn detected() -> bool {
        is_x86_feature_detected!("avx2")
    }

    /// Halves (groups of 4 lanes) that hold jobs.
    fn halves(&self) -> usize {
        self.lanes.div_ceil(HALF)
    }
}

impl Drop for Avx2 {
    fn drop(&mut self) {
        let s = self.scratch.get_mut();
        s.buf.iter_mut().for_each(Y::zeroize);
        s.k0.zeroize();
    }
}

#[inline(always)]
unsafe fn ld(p: *const Y) -> __m256i {
    // SAFETY: `Y` is 32-byte aligned and 32 bytes long; callers pass
    // pointers into live arrays.
    unsafe { _mm256_load_si256(p.cast()) }
}

#[inline(always)]
unsafe fn st(p: *mut Y, v: __m256i) {
    // SAFETY: as for `ld`.
    unsafe { _mm256_store_si256(p.cast(), v) }
}

/// Half `h` (lanes 4h..4h+4) of limb `k` of a vertical number.
#[inline(always)]
unsafe fn ld_half(x: &Lanes, h: usize) -> __m256i {
    // SAFETY: `Lanes` is 64-byte aligned and 8 lanes long, so lanes 4h..4h+4
    // (h < 2) are 32 aligned bytes inside it.
    unsafe { _mm256_load_si256(x.0.as_ptr().add(HALF * h).cast()) }
}

#[inline(always)]
unsafe fn st_half(x: &mut Lanes, h: usize, v: __m256i) {
    // SAFETY: as for `ld_half`.
    unsafe { _mm256_store_si256(x.0.as_mut_ptr().add(HALF * h).cast(), v) }
}

/// `acc + lo32(x) * lo32(y)` per lane.
#[inline(always)]
unsafe fn mac(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: AVX2 is enabled in every caller.
    unsafe { _mm256_add_epi64(acc, _mm256_mul_epu32(x, y)) }
}

/// The kernel's limbs for `N` 52-bit limbs: calls `$f::<N, L, B>($args)`
/// with `L` limbs of `B` bits (`B(L-1) < 52N <= BL`, `L` a multiple of the
/// block rows, column sums within 64 bits with at most one carry pass).
macro_rules! by_layout {
    ($n:expr, $($f:ident)::+, $($arg:expr),*) => {
        match $n {
            20 => $($f)::+::<20, 36, 29>($($arg),*),
            30 => $($f)::+::<30, 56, 28>($($arg),*),
            40 => $($f)::+::<40, 80, 26>($($arg),*),
            60 => $($f)::+::<60, 120, 26>($($arg),*),
            80 => $($f)::+::<80, 160, 26>($($arg),*),
            _ => unreachable!("limb counts of 2048/3072/4096-bit keys"),
        }
    };
}

/// Sizes the scratch for L limbs and loads the modulus (split into B-bit
/// limbs) and `k0` (low B bits) of the first `halves` halves into it: the
/// first step of every operation.
#[inline(always)]
unsafe fn load_modulus<const L: usize, const B: i32>(
    s: &mut Scratch,
    m: &[Lanes],
    k0: &Lanes,
    halves: usize,
) {
    s.fit(L);
    // SAFETY: AVX2 enabled (caller); the scratch holds L limbs per buffer.
    unsafe {
        let mask = _mm256_set1_epi64x((1 << B) - 1);
        for h in 0..halves {
            convert::split::<L, B>(m, h, s.at(Buf::M, h, L));
            st(&mut s.k0[h], _mm256_and_si256(ld_half(k0, h), mask));
        }
    }
}

/// `r = a*b/R mod m` (`a*a/R` when `b` is `None`) on the first `halves`
/// halves, operands and result in the kernel's limbs in the scratch, modulus
/// loaded by `load_modulus`. `r` may be `a` or `b`: both are read in full
/// before the result is written.
#[inline(always)]
unsafe fn mont<const N: usize, const L: usize, const B: i32>(
    s: &mut Scratch,
    r: Buf,
    a: Buf,
    b: Option<Buf>,
    halves: usize,
) {
    const {
        assert!(L <= MAXL && L.is_multiple_of(mont::ROWS) && L >= 2 * mont::ROWS);
        assert!(B as usize * (L - 1) < 52 * N && 52 * N <= B as usize * L);
    }
    // The last reduction digit's width: R = 2^(52N) = 2^(B(L-1) + W).
    let w = (52 * N - B as usize * (L - 1)) as i64;
    // SAFETY: AVX2 enabled (caller); `load_modulus` sized every buffer for L limbs (t:
    // 2L) per half.
    unsafe {
        for h in 0..halves {
            let (pa, pt) = (s.at(a, h, L), s.at(Buf::T, h, L));
            match b {
                Some(b) => mont::product::<L>(pt, pa, s.at(b, h, L)),
                None => mont::square::<L>(pt, pa),
            }
            mont::carry_crowded::<L, B>(pt);
        }
        let last_mask = _mm256_set1_epi64x((1 << w) - 1);
        let mut red = [0, 1].map(|h| mont::Reduction {
            t: s.at(Buf::T, h, L),
            m: s.at(Buf::M, h, L),
            k0: ld(&s.k0[h]),
            last_mask,
            carry: _mm256_setzero_si256(),
        });
        let res = [s.at(r, 0, L), s.at(r, 1, L)];
        mont::reduce::<L, B>(&mut red, w, res, halves);
    }
}

/// One operation on shared radix-2^52 numbers: `r = a*b/R` (`a*a/R` when `b`
/// is `None`; `r*r/R` when `a` is `None` too, in place), converted into the
/// kernel's limbs and back.
#[target_feature(enable = "avx2")]
unsafe fn mont52<const N: usize, const L: usize, const B: i32>(
    s: &mut Scratch,
    r: &mut [Lanes],
    a: Option<&[Lanes]>,
    b: Option<&[Lanes]>,
    m: &[Lanes],
    k0: &Lanes,
    halves: usize,
) {
    assert!(r.len() == N && m.len() == N && a.is_none_or(|a| a.len() == N));
    assert!(b.is_none_or(|b| b.len() == N) && (1..=2).contains(&halves));
    // SAFETY: AVX2 enabled; `load_modulus` sizes every buffer for L limbs
    // per half (t: 2L), before any other use.
    unsafe {
        load_modulus::<L, B>(s, m, k0, halves);
        for h in 0..halves {
            convert::split::<L, B>(a.unwrap_or(&*r), h, s.at(Buf::A, h, L));
            if let Some(b) = b {
                convert::split::<L, B>(b, h, s.at(Buf::B, h, L));
            }
        }
        mont::<N, L, B>(s, Buf::A, Buf::A, b.map(|_| Buf::B), halves);
        for h in 0..halves {
            convert::join::<L, B>(s.at(Buf::A, h, L), r, h);
        }
    }
}

impl Avx2 {
    /// `r = a*b/R` (`a*a/R` when `b` is `None`; `r*r/R` when `a` is `None`
    /// too, in place).
    fn run<const N: usize>(
        &self,
        r: &mut [Lanes; N],
        a: Option<&[Lanes; N]>,
        b: Option<&[Lanes; N]>,
        m: &[Lanes; N],
        k0: &Lanes,
    ) {
        let mut s = self.scratch.borrow_mut();
        let halves = self.halves();
        let (a, b) = (a.map(|a| a.as_slice()), b.map(|b| b.as_slice()));
        // SAFETY: `self` proves AVX2 was detected at runtime.
        unsafe { by_layout!(N, mont52, &mut s, r, a, b, m, k0, halves) }
    }
}

/// Masked table lookup: every entry is read; lanes whose index matches take
/// the entry through a blend mask.
#[target_feature(enable = "avx2")]
unsafe fn select<const N: usize>(
    r: &mut [Lanes; N],
    table: &[[Lanes; N]; TABLE],
    idx: &Lanes,
    halves: usize,
) {
    // SAFETY: AVX2 present (caller).
    unsafe {
        if halves == 2 {
            select_halves::<N, 2>(r, table, idx);
        } else {
            select_halves::<N, 1>(r, table, idx);
        }
    }
}

/// `select` for the first H halves in one pass over the table: a limb of
/// both halves shares one 64-byte line, and the table (40 KiB for RSA-2048)
/// is larger than the L1 cache, so reading it once instead of once per half
/// halves the traffic from L2.
#[inline(always)]
unsafe fn select_halves<const N: usize, const H: usize>(
    r: &mut [Lanes; N],
    table: &[[Lanes; N]; TABLE],
    idx: &Lanes,
) {
    /// Limbs per block: the running results of both halves stay in registers.
    const BLOCK: usize = 5;
    // SAFETY: AVX2 present (caller); indices are within the arrays.
    unsafe {
        let idx: [__m256i; H] = core::array::from_fn(|h| ld_half(idx, h));
        for base in (0..N).step_by(BLOCK) {
            let len = (N - base).min(BLOCK);
            let mut acc = [[_mm256_setzero_si256(); BLOCK]; H];
            for (k, entry) in table.iter().enumerate() {
                let key = _mm256_set1_epi64x(k as i64);
                for (h, acch) in acc.iter_mut().enumerate() {
                    let mask = _mm256_cmpeq_epi64(idx[h], key);
                    for (j, accj) in acch.iter_mut().enumerate().take(len) {
                        // One blend per limb instead of an and and an or: the
                        // mask chooses per byte, without a branch.
                        *accj = _mm256_blendv_epi8(*accj, ld_half(&entry[base + j], h), mask);
                    }
                }
            }
            for (h, acch) in acc.iter().enumerate() {
                for (j, &accj) in acch.iter().enumerate().take(len) {
                    st_half(&mut r[base + j], h, accj);
                }
            }
        }
    }
}

impl MontKernel for Avx2 {
    fn mul<const N: usize>(
        &self,
        a: &[Lanes; N],
        b: &[Lanes; N],
        m: &[Lanes; N],
        k0: &Lanes,
    ) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        self.run(&mut r, Some(a), Some(b), m, k0);
        r
    }

    fn sqr<const N: usize>(&self, a: &[Lanes; N], m: &[Lanes; N], k0: &Lanes) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        self.run(&mut r, Some(a), None, m, k0);
        r
    }

    fn sqr_assign<const N: usize>(&self, a: &mut [Lanes; N], m: &[Lanes; N], k0: &Lanes) {
        self.run(a, None, None, m, k0);
    }

    fn select<const N: usize>(&self, table: &[[Lanes; N]; TABLE], idx: &Lanes) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        // SAFETY: `self` proves AVX2 was detected at runtime.
        unsafe { select(&mut r, table, idx, self.halves()) };
        r
    }

    fn mod_exp<const N: usize>(&self, job: &crate::exp::ExpJob<'_>) -> [Lanes; N] {
        let mut s = self.scratch.borrow_mut();
        let halves = self.halves();
        let mut r = [Lanes::default(); N];
        // SAFETY: `self` proves AVX2 was detected at runtime.
        unsafe { by_layout!(N, exp::mod_exp, &mut s, job, &mut r, halves) };
        r
    }
}
