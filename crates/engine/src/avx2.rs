//! AVX2 kernel: 4 lanes per ymm register, radix 2^26, `vpmuludq` (32x32->64).
//!
//! For CPUs without AVX-512 IFMA (AMD Zen 2/3, Intel up to Cascade Lake, most
//! desktops). Layout is vertical like the IFMA kernel's: limb k of 4
//! independent numbers is one ymm, each lane with its own modulus. A pass of
//! 8 lanes runs as two halves of 4.
//!
//! Why radix 2^26: a 52-bit limb of the shared representation splits exactly
//! into two 26-bit limbs, so `R = 2^(52N)` is the same for every kernel and
//! results are bit-identical to the IFMA and portable kernels (the Montgomery
//! quotient is the unique one below R whatever the radix). Products are below
//! 2^52, so a 64-bit lane absorbs 4,096 of them: no carry pass is needed
//! inside a multiplication for any supported size. A radix of 2^28 or 2^29
//! would need ~15% fewer multiplies but its own Montgomery constants per key
//! and intermediate carry passes for 4096-bit keys.
//!
//! Schedule (per multiplication of L = 2N limbs): the product `a*b` (or the
//! square, from the upper triangle with one operand doubled) is accumulated
//! in 2L columns in memory, 4 rows at a time: the 4 row multiplicands stay in
//! registers and a window of 4 column accumulators slides along the other
//! operand, so each loaded limb feeds 4 multiplies and each column is loaded
//! and stored once per 4 rows. The Montgomery reduction runs the same way, 4
//! quotient digits at a time: a short serial head computes y_i..y_i+3 from
//! the lowest columns (with the carries), then the window adds `m*y` to the
//! rest. With two halves, both heads of a block run side by side (two
//! independent chains) before the two bodies. The first block of the product
//! writes its columns instead of adding to them, so only the columns above it
//! are cleared.
//!
//! Constant time: straight-line code over the public limb count and table
//! size; no branch or address depends on lane values. valgrind executes AVX2,
//! so `ct/run.sh` checks this kernel under memcheck exactly as built.
//!
//! Scratch: the operands (converted to radix 2^26) and the column
//! accumulators live in one buffer owned by the kernel value, reused by every
//! operation of a pass and zeroized when the kernel is dropped.

use core::arch::x86_64::*;
use core::cell::RefCell;

use zeroize::Zeroize;

use crate::bn::{Lanes, LANES};
use crate::kernel::{MontKernel, TABLE};

/// Lanes per ymm register.
const HALF: usize = 4;
/// Largest operand in 26-bit limbs: 80 limbs of 52 bits (the 4096-bit
/// modulus of the public-key check).
const MAXL: usize = 160;
/// Rows per block of the product and reduction windows.
const ROWS: usize = 4;

/// One ymm of 4 lanes, as plain integers (so the scratch can be zeroized).
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Y([u64; HALF]);

impl Zeroize for Y {
    fn zeroize(&mut self) {
        self.0.zeroize();
    }
}

/// Scratch of one kernel value (radix-2^26 operands, doubled operand of a
/// squaring, column accumulators).
/// One set per half of an 8-lane pass.
struct Scratch {
    a: [[Y; MAXL]; 2],
    b: [[Y; MAXL]; 2],
    m: [[Y; MAXL]; 2],
    t: [[Y; 2 * MAXL]; 2],
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
                a: [[Y::default(); MAXL]; 2],
                b: [[Y::default(); MAXL]; 2],
                m: [[Y::default(); MAXL]; 2],
                t: [[Y::default(); 2 * MAXL]; 2],
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
        for h in 0..2 {
            s.a[h].zeroize();
            s.b[h].zeroize();
            s.m[h].zeroize();
            s.t[h].zeroize();
        }
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

/// Splits half `h` of `x` (limbs of 52 bits) into twice as many limbs of 26
/// bits at `dst`.
#[inline(always)]
unsafe fn split(x: &[Lanes], h: usize, dst: *mut Y) {
    // SAFETY: dst has 2 * x.len() <= MAXL entries (caller); AVX2 enabled.
    unsafe {
        let mask = _mm256_set1_epi64x((1 << 26) - 1);
        for (k, xk) in x.iter().enumerate() {
            let v = ld_half(xk, h);
            st(dst.add(2 * k), _mm256_and_si256(v, mask));
            st(dst.add(2 * k + 1), _mm256_srli_epi64::<26>(v));
        }
    }
}

/// Column `k` of the accumulators, or zero in the first block (`FIRST`),
/// which writes the columns instead of adding to them (no clearing pass).
#[inline(always)]
unsafe fn col<const FIRST: bool>(t: *const Y, k: usize) -> __m256i {
    // SAFETY: k < 2L (caller); AVX2 enabled.
    unsafe {
        if FIRST {
            _mm256_setzero_si256()
        } else {
            ld(t.add(k))
        }
    }
}

/// One block of 4 rows of `a * b` into the columns (see `product`).
#[inline(always)]
unsafe fn product_block<const L: usize, const FIRST: bool>(
    t: *mut Y,
    a: *const Y,
    b: *const Y,
    i0: usize,
) {
    // SAFETY: a, b have L entries, t has 2L (column i0 + j + 3 <= 2L - 2).
    unsafe {
        let (b0, b1, b2, b3) = (
            ld(b.add(i0)),
            ld(b.add(i0 + 1)),
            ld(b.add(i0 + 2)),
            ld(b.add(i0 + 3)),
        );
        let (mut w0, mut w1, mut w2) = (
            col::<FIRST>(t, i0),
            col::<FIRST>(t, i0 + 1),
            col::<FIRST>(t, i0 + 2),
        );
        for j in 0..L {
            let aj = ld(a.add(j));
            let w3 = mac(col::<FIRST>(t, i0 + j + 3), aj, b3);
            st(t.add(i0 + j), mac(w0, aj, b0));
            w0 = mac(w1, aj, b1);
            w1 = mac(w2, aj, b2);
            w2 = w3;
        }
        st(t.add(i0 + L), w0);
        st(t.add(i0 + L + 1), w1);
        st(t.add(i0 + L + 2), w2);
    }
}

/// Column accumulators `t[0..2L]` = `a * b`, 4 rows of `b` at a time. The
/// first block writes columns 0..L+2; the columns above are zeroed first.
#[inline(always)]
unsafe fn product<const L: usize>(t: *mut Y, a: *const Y, b: *const Y) {
    // SAFETY: a, b have L entries, t has 2L.
    unsafe {
        clear_upper::<L>(t);
        product_block::<L, true>(t, a, b, 0);
        for i0 in (ROWS..L).step_by(ROWS) {
            product_block::<L, false>(t, a, b, i0);
        }
    }
}

/// One block of 4 rows of the square into the columns (see `square`).
#[inline(always)]
unsafe fn square_block<const L: usize, const FIRST: bool>(
    t: *mut Y,
    a: *const Y,
    d: *const Y,
    i0: usize,
) {
    // SAFETY: a, d have L entries, t has 2L.
    unsafe {
        let b = [
            ld(a.add(i0)),
            ld(a.add(i0 + 1)),
            ld(a.add(i0 + 2)),
            ld(a.add(i0 + 3)),
        ];
        // Window at step j: columns i0 + j + r for r = 0..3.
        let mut w = [
            col::<FIRST>(t, 2 * i0),
            col::<FIRST>(t, 2 * i0 + 1),
            col::<FIRST>(t, 2 * i0 + 2),
            _mm256_setzero_si256(),
        ];
        // The triangle: j = i0 + jj for jj < 4 meets rows r <= jj.
        for jj in 0..ROWS {
            let j = i0 + jj;
            w[3] = col::<FIRST>(t, i0 + j + 3);
            for r in 0..ROWS {
                if jj == r {
                    w[r] = mac(w[r], b[r], ld(a.add(j)));
                } else if jj > r {
                    w[r] = mac(w[r], b[r], ld(d.add(j)));
                }
            }
            st(t.add(i0 + j), w[0]);
            w = [w[1], w[2], w[3], w[3]];
        }
        let (mut w0, mut w1, mut w2) = (w[0], w[1], w[2]);
        for j in i0 + ROWS..L {
            let dj = ld(d.add(j));
            let w3 = mac(col::<FIRST>(t, i0 + j + 3), dj, b[3]);
            st(t.add(i0 + j), mac(w0, dj, b[0]));
            w0 = mac(w1, dj, b[1]);
            w1 = mac(w2, dj, b[2]);
            w2 = w3;
        }
        st(t.add(i0 + L), w0);
        st(t.add(i0 + L + 1), w1);
        st(t.add(i0 + L + 2), w2);
    }
}

/// Column accumulators `t[0..2L]` = `a^2`: rows `a_i`, columns `2a_j` for
/// `j > i` (`d` holds `2a`) plus the squares `a_i^2`. As in `product`, the
/// first block writes columns 0..L+2 and the columns above are zeroed first.
#[inline(always)]
unsafe fn square<const L: usize>(t: *mut Y, a: *const Y, d: *const Y) {
    // SAFETY: a, d have L entries, t has 2L.
    unsafe {
        clear_upper::<L>(t);
        square_block::<L, true>(t, a, d, 0);
        for i0 in (ROWS..L).step_by(ROWS) {
            square_block::<L, false>(t, a, d, i0);
        }
    }
}

/// One operand's Montgomery reduction in progress: the 2L columns at `t`, the
/// modulus and `k0`, and the carry out of the last completed column.
struct Reduction {
    t: *mut Y,
    m: *const Y,
    k0: __m256i,
    carry: __m256i,
}

/// Quotient digits of one block of 4 rows.
type Digits = [__m256i; ROWS];

/// The serial part of a block: the 4 quotient digits `y_i = c_i * k0 mod
/// 2^26` of columns i0..i0+3, each column carried into the next as it
/// completes.
#[inline(always)]
unsafe fn head(r: &mut Reduction, i0: usize) -> Digits {
    // SAFETY: columns i0..i0+3 < 2L and limbs 0..3 are in bounds (caller).
    unsafe {
        let (t, m, k0) = (r.t, r.m, r.k0);
        let mask = _mm256_set1_epi64x((1 << 26) - 1);
        let digit = |c: __m256i| _mm256_and_si256(_mm256_mul_epu32(c, k0), mask);
        let (m0, m1, m2, m3) = (ld(m), ld(m.add(1)), ld(m.add(2)), ld(m.add(3)));
        let c0 = _mm256_add_epi64(ld(t.add(i0)), r.carry);
        let y0 = digit(c0);
        let carry = _mm256_srli_epi64::<26>(mac(c0, m0, y0));
        let c1 = _mm256_add_epi64(mac(ld(t.add(i0 + 1)), m1, y0), carry);
        let y1 = digit(c1);
        let carry = _mm256_srli_epi64::<26>(mac(c1, m0, y1));
        let c2 = _mm256_add_epi64(mac(mac(ld(t.add(i0 + 2)), m2, y0), m1, y1), carry);
        let y2 = digit(c2);
        let carry = _mm256_srli_epi64::<26>(mac(c2, m0, y2));
        let c3 = _mm256_add_epi64(
            mac(mac(mac(ld(t.add(i0 + 3)), m3, y0), m2, y1), m1, y2),
            carry,
        );
        let y3 = digit(c3);
        r.carry = _mm256_srli_epi64::<26>(mac(c3, m0, y3));
        [y0, y1, y2, y3]
    }
}

/// The parallel part of a block: `m_j * y_r` into column i0+j+r for every
/// pair the head did not add (j + r >= 4), with a window of 4 columns.
#[inline(always)]
unsafe fn body<const L: usize>(r: &Reduction, i0: usize, y: Digits) {
    // SAFETY: columns up to i0+L+2 <= 2L-2 and limbs below L (caller).
    unsafe {
        let (t, m) = (r.t, r.m);
        let [y0, y1, y2, y3] = y;
        let (m1, m2, m3) = (ld(m.add(1)), ld(m.add(2)), ld(m.add(3)));
        let mut w0 = mac(mac(mac(ld(t.add(i0 + 4)), m1, y3), m2, y2), m3, y1);
        let mut w1 = mac(mac(ld(t.add(i0 + 5)), m2, y3), m3, y2);
        let mut w2 = mac(ld(t.add(i0 + 6)), m3, y3);
        for j in ROWS..L {
            let mj = ld(m.add(j));
            let w3 = mac(ld(t.add(i0 + j + 3)), mj, y3);
            st(t.add(i0 + j), mac(w0, mj, y0));
            w0 = mac(w1, mj, y1);
            w1 = mac(w2, mj, y2);
            w2 = w3;
        }
        st(t.add(i0 + L), w0);
        st(t.add(i0 + L + 1), w1);
        st(t.add(i0 + L + 2), w2);
    }
}

/// The upper L columns plus the final carry, normalized and joined in pairs
/// of 26-bit limbs into the `L / 2` limbs of 52 bits of half `h` of `res`.
#[inline(always)]
unsafe fn finish<const L: usize>(r: &Reduction, res: &mut [Lanes], h: usize) {
    // SAFETY: t has 2L entries; res has L / 2 limbs (checked by `mont`).
    unsafe {
        let mask = _mm256_set1_epi64x((1 << 26) - 1);
        let mut carry = r.carry;
        for (k, rk) in res.iter_mut().enumerate() {
            let lo = _mm256_add_epi64(ld(r.t.add(L + 2 * k)), carry);
            carry = _mm256_srli_epi64::<26>(lo);
            let hi = _mm256_add_epi64(ld(r.t.add(L + 2 * k + 1)), carry);
            carry = _mm256_srli_epi64::<26>(hi);
            let v = _mm256_or_si256(
                _mm256_and_si256(lo, mask),
                _mm256_slli_epi64::<26>(_mm256_and_si256(hi, mask)),
            );
            st_half(rk, h, v);
        }
    }
}

/// Montgomery reduction of the 2L columns by `m`, for the first `halves`
/// halves together: adds `m*y` with the quotient digits `y_i = t_i * k0 mod
/// 2^26`, 4 at a time, and writes the upper L columns, normalized, as
/// 52-bit limbs to `res`. Per block the two halves' serial heads come first, side by side
/// (independent chains), then the two bodies. The result is `< 2m` for a
/// column value `< 4m^2` (`4m < R`).
#[inline(always)]
unsafe fn reduce<const L: usize>(red: &mut [Reduction; 2], res: &mut [Lanes], halves: usize) {
    // SAFETY: as for `head`, `body` and `finish`.
    unsafe {
        let [r0, r1] = red;
        if halves == 2 {
            for i0 in (0..L).step_by(ROWS) {
                let y0 = head(r0, i0);
                let y1 = head(r1, i0);
                body::<L>(r0, i0, y0);
                body::<L>(r1, i0, y1);
            }
            finish::<L>(r0, res, 0);
            finish::<L>(r1, res, 1);
        } else {
            for i0 in (0..L).step_by(ROWS) {
                let y0 = head(r0, i0);
                body::<L>(r0, i0, y0);
            }
            finish::<L>(r0, res, 0);
        }
    }
}

/// Zeroes the column accumulators the first product block does not write
/// (L+3..2L).
#[inline(always)]
unsafe fn clear_upper<const L: usize>(t: *mut Y) {
    // SAFETY: t has 2L entries.
    unsafe {
        for k in L + 3..2 * L {
            st(t.add(k), _mm256_setzero_si256());
        }
    }
}

/// One Montgomery multiplication (or squaring when `b` is `None`) of the
/// first `halves` halves: operands of `L / 2` limbs of 52 bits, computed as
/// `L` limbs of 26. Two halves are reduced together (see `reduce`). With `a`
/// `None` the first operand is `r` itself: every operand is split into the
/// scratch before the result is written, so `r` can be overwritten in place.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn mont<const L: usize>(
    s: &mut Scratch,
    r: &mut [Lanes],
    a: Option<&[Lanes]>,
    b: Option<&[Lanes]>,
    m: &[Lanes],
    k0: &Lanes,
    halves: usize,
) {
    const { assert!(L <= MAXL && L.is_multiple_of(ROWS)) };
    let a = a.unwrap_or(r);
    assert!(r.len() * 2 == L && a.len() * 2 == L && m.len() * 2 == L);
    assert!(b.is_none_or(|b| b.len() * 2 == L) && (1..=2).contains(&halves));
    // SAFETY: AVX2 is enabled (the caller holds an `Avx2`); every buffer of
    // the scratch has at least L (t: 2L) entries per half.
    unsafe {
        let mask = _mm256_set1_epi64x((1 << 26) - 1);
        let mut red = [0, 1].map(|h| Reduction {
            t: s.t[h].as_mut_ptr(),
            m: s.m[h].as_ptr(),
            k0: _mm256_and_si256(ld_half(k0, h), mask),
            carry: _mm256_setzero_si256(),
        });
        for h in 0..halves {
            let (pa, pb, pm, pt) = (
                s.a[h].as_mut_ptr(),
                s.b[h].as_mut_ptr(),
                s.m[h].as_mut_ptr(),
                s.t[h].as_mut_ptr(),
            );
            split(a, h, pa);
            split(m, h, pm);
            match b {
                Some(b) => {
                    split(b, h, pb);
                    product::<L>(pt, pa, pb);
                }
                None => {
                    for k in 0..L {
                        let v = ld(pa.add(k));
                        st(pb.add(k), _mm256_add_epi64(v, v));
                    }
                    square::<L>(pt, pa, pb);
                }
            }
        }
        reduce::<L>(&mut red, r, halves);
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
        // SAFETY: `self` proves AVX2 was detected at runtime. L = 2N is spelled
        // out per supported N (const generics cannot compute it); `mont`
        // checks the lengths.
        unsafe {
            let (a, b) = (a.map(|a| a.as_slice()), b.map(|b| b.as_slice()));
            match N {
                20 => mont::<40>(&mut s, r, a, b, m, k0, halves),
                30 => mont::<60>(&mut s, r, a, b, m, k0, halves),
                40 => mont::<80>(&mut s, r, a, b, m, k0, halves),
                60 => mont::<120>(&mut s, r, a, b, m, k0, halves),
                80 => mont::<160>(&mut s, r, a, b, m, k0, halves),
                _ => unreachable!("limb counts of 2048/3072/4096-bit keys"),
            }
        }
    }
}

/// Masked table lookup: every entry is read; lanes whose index matches take
/// the entry through an and/or mask.
#[target_feature(enable = "avx2")]
unsafe fn select<const N: usize>(
    r: &mut [Lanes; N],
    table: &[[Lanes; N]; TABLE],
    idx: &Lanes,
    halves: usize,
) {
    // SAFETY: AVX2 present (caller); indices are within the arrays.
    unsafe {
        for h in 0..halves {
            let idx = ld_half(idx, h);
            // Blocks of 10 limbs keep the running result in registers.
            for base in (0..N).step_by(10) {
                let len = (N - base).min(10);
                let mut acc = [_mm256_setzero_si256(); 10];
                for (k, entry) in table.iter().enumerate() {
                    let mask = _mm256_cmpeq_epi64(idx, _mm256_set1_epi64x(k as i64));
                    for (j, accj) in acc.iter_mut().enumerate().take(len) {
                        let v = _mm256_and_si256(mask, ld_half(&entry[base + j], h));
                        *accj = _mm256_or_si256(*accj, v);
                    }
                }
                for (j, &accj) in acc.iter().enumerate().take(len) {
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
}
