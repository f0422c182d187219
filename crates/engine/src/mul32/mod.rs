//! The `vpmuludq` kernels (32x32->64-bit products in each 64-bit lane):
//! AVX2, 4 lanes per ymm register, and AVX-512F, 8 lanes per zmm register.
//! Limbs of 29 bits for RSA-2048, 28 for RSA-3072 and 26 above.
//!
//! For CPUs without AVX-512 IFMA: AVX2 on AMD Zen 2/3, Intel up to Comet
//! Lake and most desktops; AVX-512F on Intel Skylake-SP, Cascade Lake and
//! Cooper Lake servers, which have 512-bit multipliers but not IFMA. Layout
//! is vertical like the IFMA kernel's: limb k of W independent numbers is
//! one register, each lane with its own modulus. A pass of 8 lanes runs as
//! two halves of 4 with AVX2 and as one register with AVX-512F. The code is
//! written once over the register width (`simd.rs`), so the two widths
//! compute the same bits with the same schedule.
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
//! so `ct/run.sh` checks the AVX2 width under memcheck exactly as built; it
//! cannot execute AVX-512, so the AVX-512F width goes through the same static
//! check as the IFMA kernel (`ct/avx512_branches.py`).
//!
//! Scratch: operands, modulus and column accumulators live in one buffer
//! owned by the kernel value, reused by every operation of a pass and
//! zeroized when the kernel is dropped.

mod convert;
mod exp;
mod mont;
mod scratch;
mod simd;

use core::cell::RefCell;

use crate::bn::{Lanes, LANES};
use crate::kernel::{MontKernel, TABLE};
use scratch::{Buf, Scratch, View};
pub(crate) use simd::{Simd, Ymm, Zmm};

/// Most limbs of one operand: 160 limbs of 26 bits (the 4096-bit modulus of
/// the public-key check).
const MAXL: usize = 160;

/// Proof that the CPU has the width's feature (only `new` creates one),
/// with the pass's lane count and scratch.
pub(crate) struct Mul32<V: Simd> {
    lanes: usize,
    scratch: RefCell<Box<Scratch<V>>>,
}

/// The AVX2 kernel.
pub(crate) type Avx2 = Mul32<Ymm>;
/// The AVX-512F kernel.
pub(crate) type Avx512 = Mul32<Zmm>;

impl<V: Simd> Mul32<V> {
    /// The kernel for a pass of `lanes` exponentiations, if the CPU has the
    /// width's feature.
    pub fn new(lanes: usize) -> Option<Self> {
        Self::detected().then(|| Mul32 {
            lanes: lanes.clamp(1, LANES),
            scratch: RefCell::new(Box::new(Scratch::new())),
        })
    }

    pub fn detected() -> bool {
        V::detected()
    }

    /// Registers (groups of W lanes) that hold jobs.
    fn halves(&self) -> usize {
        self.lanes.div_ceil(V::W)
    }
}

/// The registers that hold jobs, given the halves asked for: with AVX-512F
/// the constant 1, so that every loop over them unrolls to fixed stack
/// offsets (which the static constant-time check follows slot by slot).
#[inline(always)]
fn registers<V: Simd>(halves: usize) -> usize {
    if V::W == LANES {
        1
    } else {
        halves
    }
}

/// `acc + lo32(x) * lo32(y)` per lane.
#[inline(always)]
unsafe fn mac<V: Simd>(acc: V::R, x: V::R, y: V::R) -> V::R {
    // SAFETY: the width's feature is enabled in every caller.
    unsafe { V::add(acc, V::mul(x, y)) }
}

/// The kernel's limbs for `N` 52-bit limbs: calls `$f::<N, L, B>($args)`
/// with `L` limbs of `B` bits (`B(L-1) < 52N <= BL`, `L` a multiple of the
/// block rows, column sums within 64 bits with at most one carry pass).
macro_rules! by_layout {
    ($n:expr, $($f:ident).+, $($arg:expr),*) => {
        match $n {
            20 => $($f).+::<20, 36, 29>($($arg),*),
            30 => $($f).+::<30, 56, 28>($($arg),*),
            40 => $($f).+::<40, 80, 26>($($arg),*),
            60 => $($f).+::<60, 120, 26>($($arg),*),
            80 => $($f).+::<80, 160, 26>($($arg),*),
            _ => unreachable!("limb counts of 2048/3072/4096-bit keys"),
        }
    };
}

/// Loads the modulus (split into B-bit limbs) and `k0` (low B bits) of the
/// first `halves` halves into the scratch (sized for L limbs): the first step
/// of every operation.
#[inline(always)]
unsafe fn load_modulus<V: Simd, const L: usize, const B: i32>(
    s: &mut View<'_, V>,
    m: &[Lanes],
    k0: &Lanes,
    halves: usize,
) {
    // SAFETY: the width's feature is enabled (caller); the scratch holds L
    // limbs per buffer.
    unsafe {
        let mask = V::splat((1 << B) - 1);
        for h in 0..halves {
            convert::split::<V, L, B>(m, h, s.at(Buf::M, h, L));
            V::st(&mut s.k0[h], V::and(V::ld_lanes(k0, h), mask));
        }
    }
}

/// `r = a*b/R mod m` (`a*a/R` when `b` is `None`) on the first `halves`
/// halves, operands and result in the kernel's limbs in the scratch, modulus
/// loaded by `load_modulus`. `r` may be `a` or `b`: both are read in full
/// before the result is written.
#[inline(always)]
unsafe fn mont<V: Simd, const N: usize, const L: usize, const B: i32>(
    s: &mut View<'_, V>,
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
    // SAFETY: the width's feature is enabled (caller); the scratch holds L
    // limbs per buffer (t: 2L) per half, the modulus loaded by `load_modulus`.
    unsafe {
        for h in 0..halves {
            let (pa, pt) = (s.at(a, h, L), s.at(Buf::T, h, L));
            match b {
                Some(b) => mont::product::<V, L>(pt, pa, s.at(b, h, L)),
                None => mont::square::<V, L>(pt, pa),
            }
            mont::carry_crowded::<V, L, B>(pt);
        }
        let last_mask = V::splat((1 << w) - 1);
        // Not mapped over [0, 1]: a closure is a function of its own,
        // compiled without the width's feature, and stays a call.
        let mut red = [
            reduction::<V, L>(s, 0, last_mask),
            reduction::<V, L>(s, 1, last_mask),
        ];
        let res = [s.at(r, 0, L), s.at(r, 1, L)];
        mont::reduce::<V, L, B>(&mut red, w, res, halves);
    }
}

/// The reduction state of half `h`: its columns, modulus and `k0` in the
/// scratch, no carry yet.
#[inline(always)]
unsafe fn reduction<V: Simd, const L: usize>(
    s: &mut View<'_, V>,
    h: usize,
    last_mask: V::R,
) -> mont::Reduction<V> {
    // SAFETY: the width's feature is enabled (caller); the scratch holds L
    // limbs per buffer.
    unsafe {
        mont::Reduction {
            t: s.at(Buf::T, h, L),
            m: s.at(Buf::M, h, L),
            k0: V::ld(&s.k0[h]),
            last_mask,
            carry: V::zero(),
        }
    }
}

/// One operation on shared radix-2^52 numbers: `r = a*b/R` (`a*a/R` when `b`
/// is `None`; `r*r/R` when `a` is `None` too, in place), converted into the
/// kernel's limbs and back. Compiled into each width's entry point
/// (`Simd::mont52`).
#[inline(always)]
unsafe fn mont52<V: Simd, const N: usize, const L: usize, const B: i32>(
    s: &mut View<'_, V>,
    r: &mut [Lanes],
    a: Option<&[Lanes]>,
    b: Option<&[Lanes]>,
    m: &[Lanes],
    k0: &Lanes,
    halves: usize,
) {
    assert!(r.len() == N && m.len() == N && a.is_none_or(|a| a.len() == N));
    assert!(b.is_none_or(|b| b.len() == N) && (1..=LANES / V::W).contains(&halves));
    let halves = registers::<V>(halves);
    // SAFETY: the width's feature is enabled (caller); the scratch holds L
    // limbs per buffer (t: 2L) per half.
    unsafe {
        load_modulus::<V, L, B>(s, m, k0, halves);
        for h in 0..halves {
            convert::split::<V, L, B>(a.unwrap_or(&*r), h, s.at(Buf::A, h, L));
            if let Some(b) = b {
                convert::split::<V, L, B>(b, h, s.at(Buf::B, h, L));
            }
        }
        mont::<V, N, L, B>(s, Buf::A, Buf::A, b.map(|_| Buf::B), halves);
        for h in 0..halves {
            convert::join::<V, L, B>(s.at(Buf::A, h, L), r, h);
        }
    }
}

impl<V: Simd> Mul32<V> {
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
        let (a, b) = (a.map(|a| a.as_slice()), b.map(|b| b.as_slice()));
        by_layout!(N, self.mont52, r, a, b, m, k0)
    }

    /// `Simd::mont52` for one layout, with the scratch sized for it.
    fn mont52<const N: usize, const L: usize, const B: i32>(
        &self,
        r: &mut [Lanes],
        a: Option<&[Lanes]>,
        b: Option<&[Lanes]>,
        m: &[Lanes],
        k0: &Lanes,
    ) {
        let mut scratch = self.scratch.borrow_mut();
        let s = scratch.view(L);
        // SAFETY: `self` proves the width's feature was detected at runtime.
        unsafe { V::mont52::<N, L, B>(s.buf, s.k0, r, a, b, m, k0, self.halves()) }
    }

    /// `Simd::mod_exp` for one layout, with the scratch sized for it.
    fn mod_exp_in<const N: usize, const L: usize, const B: i32>(
        &self,
        job: &crate::exp::ExpJob<'_>,
        r: &mut [Lanes],
    ) {
        let mut scratch = self.scratch.borrow_mut();
        let s = scratch.view(L);
        let halves = self.halves();
        // SAFETY: `self` proves the width's feature was detected at runtime.
        unsafe {
            V::mod_exp::<N, L, B>(
                s.buf,
                s.k0,
                job.base,
                job.exp,
                job.exp_bits,
                job.m,
                job.k0,
                job.one,
                r,
                halves,
            )
        }
    }
}

/// Masked table lookup for the first H halves in one pass over the table:
/// every entry is read; lanes whose index matches take the entry through a
/// blend mask. A limb of both AVX2 halves shares one 64-byte line, so reading
/// the table once instead of once per half halves the traffic from the cache
/// (the table is 36 KiB for RSA-2048 at 29-bit limbs). Compiled into
/// each width's entry point (`Simd::select`).
#[inline(always)]
unsafe fn select_halves<V: Simd, const N: usize, const H: usize>(
    r: &mut [Lanes; N],
    table: &[[Lanes; N]; TABLE],
    idx: &Lanes,
) {
    /// Limbs per block: the running results of both halves stay in registers.
    const BLOCK: usize = 5;
    // SAFETY: the width's feature is enabled (caller); indices are within
    // the arrays.
    unsafe {
        let mut wanted = [V::zero(); H];
        for (h, v) in wanted.iter_mut().enumerate() {
            *v = V::ld_lanes(idx, h);
        }
        for base in (0..N).step_by(BLOCK) {
            let len = (N - base).min(BLOCK);
            let mut acc = [[V::zero(); BLOCK]; H];
            for (k, entry) in table.iter().enumerate() {
                let key = V::splat(k as i64);
                for (h, acch) in acc.iter_mut().enumerate() {
                    let mask = V::eq(wanted[h], key);
                    for (j, accj) in acch.iter_mut().enumerate().take(len) {
                        *accj = V::blend(*accj, V::ld_lanes(&entry[base + j], h), mask);
                    }
                }
            }
            for (h, acch) in acc.iter().enumerate() {
                for (j, &accj) in acch.iter().enumerate().take(len) {
                    V::st_lanes(&mut r[base + j], h, accj);
                }
            }
        }
    }
}

impl<V: Simd> MontKernel for Mul32<V> {
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
        // SAFETY: `self` proves the width's feature was detected at runtime.
        unsafe { V::select(&mut r, table, idx, self.halves()) };
        r
    }

    fn mod_exp<const N: usize>(&self, job: &crate::exp::ExpJob<'_>) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        by_layout!(N, self.mod_exp_in, job, &mut r);
        r
    }
}

/// The static check's own test for the AVX-512F width (`ct/run.sh`, feature
/// `ct-planted`): a multiply-add in zmm registers whose result picks a
/// branch. The check selects the function by its zmm multiplies and must
/// refuse it. Never called by the engine.
#[cfg(feature = "ct-planted")]
#[inline(never)]
pub fn planted_mac(x: &Lanes, y: &Lanes) -> u64 {
    if !Zmm::detected() {
        return 0;
    }
    // SAFETY: AVX-512F detected above.
    unsafe { planted_mac_zmm(x, y) }
}

#[cfg(feature = "ct-planted")]
#[target_feature(enable = "avx512f")]
unsafe fn planted_mac_zmm(x: &Lanes, y: &Lanes) -> u64 {
    let mut out = Lanes::default();
    // SAFETY: AVX-512F enabled; `Lanes` is aligned and 8 lanes long.
    unsafe {
        let v = mac::<Zmm>(Zmm::zero(), Zmm::ld_lanes(x, 0), Zmm::ld_lanes(y, 0));
        Zmm::st_lanes(&mut out, 0, v);
    }
    // All 8 products stay (the whole vector escapes), and so does the branch
    // (one arm has an effect): the planted leak, a branch on a product of
    // secret limbs.
    let out = core::hint::black_box(out);
    if out.0[3] == 7 {
        core::hint::black_box(x);
        1
    } else {
        2
    }
}
