//! One Montgomery multiplication or squaring of up to 8 lanes (two halves of
//! 4 with AVX2, one register with AVX-512F), in the kernel's own limbs: `L`
//! limbs of `B` bits (per key size: see `by_layout!` in `mod.rs`).
//!
//! Schedule: the product `a*b` (or the square, from the upper triangle with
//! the rows doubled) is accumulated in 2L columns in memory, 4 rows at a
//! time: the 4 row multiplicands stay in registers and a window of 4 column
//! accumulators slides along the other operand, so each loaded limb feeds 4
//! multiplies and each column is loaded and stored once per 4 rows. The
//! Montgomery reduction runs the same way, 4 quotient digits at a time: a
//! short serial head computes y_i..y_i+3 from the lowest columns (with their
//! carries), then the window adds `m*y` to the rest. The heads of the next
//! block (one per half, two independent chains side by side) are issued as
//! soon as the bodies have finished the 4 columns they read, so that their
//! dependency chains run under the rest of the bodies' multiplies instead of
//! stalling between blocks. The first block of the product writes its
//! columns instead of adding to them, so only the columns above it are
//! cleared.
//!
//! Carries are lazy: a 64-bit lane holds the sum of many products. Where a
//! column could reach 2^64 before the reduction has passed it (radix 2^29:
//! the middle columns take up to 72 products below 2^58), those columns
//! alone are carried once between product and reduction.

use core::arch::x86_64::_mm_cvtsi64_si128;

use super::{mac, Simd};

/// Rows per block of the product and reduction windows.
pub(super) const ROWS: usize = 4;

/// Column `k` of the accumulators, or zero in the first block (`FIRST`),
/// which writes the columns instead of adding to them (no clearing pass).
#[inline(always)]
unsafe fn col<V: Simd, const FIRST: bool>(t: *const V::M, k: usize) -> V::R {
    // SAFETY: k < 2L (caller); the width's feature enabled.
    unsafe {
        if FIRST {
            V::zero()
        } else {
            V::ld(t.add(k))
        }
    }
}

/// One step of `slide`: limb `x_j` into the window, the lowest column out.
/// A function rather than a closure: a closure is compiled on its own,
/// without the width's feature, and its vector operations would stay calls.
#[inline(always)]
unsafe fn slide_step<V: Simd, const FIRST: bool>(
    t: *mut V::M,
    i0: usize,
    x: *const V::M,
    rows: &[V::R; ROWS],
    w: &mut [V::R; ROWS - 1],
    j: usize,
) {
    // SAFETY: as for `slide`.
    unsafe {
        let xj = V::ld(x.add(j));
        let top = mac::<V>(col::<V, FIRST>(t, i0 + j + 3), xj, rows[3]);
        V::st(t.add(i0 + j), mac::<V>(w[0], xj, rows[0]));
        *w = [
            mac::<V>(w[1], xj, rows[1]),
            mac::<V>(w[2], xj, rows[2]),
            top,
        ];
    }
}

/// The sliding window shared by the product, the square and the reduction:
/// for each limb `x_j` (j in j0..j1) adds `x_j * rows[r]` to column
/// i0+j+r, r = 0..3. The window `w` holds columns i0+j0..i0+j0+2 on entry;
/// each step takes in the column above it (zero in the first block of a
/// product, which writes instead of adding) and stores the one it completes.
/// Two steps per iteration: the loop's own instructions are a sixth of a
/// step's, which the dispatch width notices.
#[inline(always)]
unsafe fn slide<V: Simd, const FIRST: bool>(
    t: *mut V::M,
    i0: usize,
    x: *const V::M,
    rows: &[V::R; ROWS],
    mut w: [V::R; ROWS - 1],
    j0: usize,
    j1: usize,
) {
    // SAFETY: x has j1 entries and t has i0+j1+3 <= 2L (caller); the width's
    // feature enabled.
    unsafe {
        debug_assert!((j1 - j0).is_multiple_of(2));
        for j in (j0..j1).step_by(2) {
            slide_step::<V, FIRST>(t, i0, x, rows, &mut w, j);
            slide_step::<V, FIRST>(t, i0, x, rows, &mut w, j + 1);
        }
        V::st(t.add(i0 + j1), w[0]);
        V::st(t.add(i0 + j1 + 1), w[1]);
        V::st(t.add(i0 + j1 + 2), w[2]);
    }
}

/// The 4 limbs at `p`: one block's row multiplicands. Written out rather
/// than mapped over an array: see `slide_step`.
#[inline(always)]
unsafe fn block_rows<V: Simd>(p: *const V::M) -> [V::R; ROWS] {
    // SAFETY: p has 4 entries (caller).
    unsafe { [V::ld(p), V::ld(p.add(1)), V::ld(p.add(2)), V::ld(p.add(3))] }
}

/// One block of 4 rows of `a * b` into the columns (see `product`).
#[inline(always)]
unsafe fn product_block<V: Simd, const L: usize, const FIRST: bool>(
    t: *mut V::M,
    a: *const V::M,
    b: *const V::M,
    i0: usize,
) {
    // SAFETY: a, b have L entries, t has 2L (column i0 + j + 3 <= 2L - 2).
    unsafe {
        let rows = block_rows::<V>(b.add(i0));
        let w = [
            col::<V, FIRST>(t, i0),
            col::<V, FIRST>(t, i0 + 1),
            col::<V, FIRST>(t, i0 + 2),
        ];
        slide::<V, FIRST>(t, i0, a, &rows, w, 0, L);
    }
}

/// Column accumulators `t[0..2L]` = `a * b`, 4 rows of `b` at a time. The
/// first block writes columns 0..L+2; the columns above are zeroed first.
#[inline(always)]
pub(super) unsafe fn product<V: Simd, const L: usize>(
    t: *mut V::M,
    a: *const V::M,
    b: *const V::M,
) {
    // SAFETY: a, b have L entries, t has 2L.
    unsafe {
        clear_upper::<V, L>(t);
        product_block::<V, L, true>(t, a, b, 0);
        for i0 in (ROWS..L).step_by(ROWS) {
            product_block::<V, L, false>(t, a, b, i0);
        }
    }
}

/// One block of 4 rows of the square into the columns (see `square`).
#[inline(always)]
unsafe fn square_block<V: Simd, const L: usize, const FIRST: bool>(
    t: *mut V::M,
    a: *const V::M,
    i0: usize,
) {
    // SAFETY: a has L entries, t has 2L.
    unsafe {
        let b = block_rows::<V>(a.add(i0));
        // The rows doubled: every product a_i*a_j with i < j counts twice.
        // Below 2^(B+1) <= 2^30, so still a 32-bit multiplicand.
        let b2 = [
            V::add(b[0], b[0]),
            V::add(b[1], b[1]),
            V::add(b[2], b[2]),
            V::add(b[3], b[3]),
        ];
        // Window at step j: columns i0 + j + r for r = 0..3.
        let mut w = [
            col::<V, FIRST>(t, 2 * i0),
            col::<V, FIRST>(t, 2 * i0 + 1),
            col::<V, FIRST>(t, 2 * i0 + 2),
            V::zero(),
        ];
        // The triangle: j = i0 + jj for jj < 4 meets rows r <= jj.
        for jj in 0..ROWS {
            let j = i0 + jj;
            w[3] = col::<V, FIRST>(t, i0 + j + 3);
            for r in 0..ROWS {
                if jj == r {
                    w[r] = mac::<V>(w[r], b[r], b[jj]);
                } else if jj > r {
                    w[r] = mac::<V>(w[r], b2[r], b[jj]);
                }
            }
            V::st(t.add(i0 + j), w[0]);
            w = [w[1], w[2], w[3], w[3]];
        }
        slide::<V, FIRST>(t, i0, a, &b2, [w[0], w[1], w[2]], i0 + ROWS, L);
    }
}

/// Column accumulators `t[0..2L]` = `a^2`: the upper triangle, rows `2a_i`
/// (doubled in registers) times `a_j` for `j > i`, plus the squares `a_i^2`.
/// As in `product`, the first block writes columns 0..L+2 and the columns
/// above are zeroed first.
#[inline(always)]
pub(super) unsafe fn square<V: Simd, const L: usize>(t: *mut V::M, a: *const V::M) {
    // SAFETY: a has L entries, t has 2L.
    unsafe {
        clear_upper::<V, L>(t);
        square_block::<V, L, true>(t, a, 0);
        for i0 in (ROWS..L).step_by(ROWS) {
            square_block::<V, L, false>(t, a, i0);
        }
    }
}

/// Zeroes the column accumulators the first product block does not write
/// (L+3..2L).
#[inline(always)]
unsafe fn clear_upper<V: Simd, const L: usize>(t: *mut V::M) {
    // SAFETY: t has 2L entries.
    unsafe {
        for k in L + 3..2 * L {
            V::st(t.add(k), V::zero());
        }
    }
}

/// The columns whose worst-case total (every product of the multiplication
/// and of the reduction, limbs `2^B - 1`, plus carries below 2^40) could
/// overflow a 64-bit lane: `(first, last)`, empty when `first > last`.
/// Column k takes `min(k + 1, 2L - 1 - k)` products of each kind.
pub(super) const fn crowded(l: usize, b: u32) -> (usize, usize) {
    let max = ((1u128 << b) - 1) * ((1u128 << b) - 1);
    let (mut first, mut last, mut k) = (usize::MAX, 0, 0);
    while k < 2 * l {
        let n = if k + 1 < 2 * l - 1 - k {
            k + 1
        } else {
            2 * l - 1 - k
        };
        if 2 * n as u128 * max + (1u128 << 40) >= 1u128 << 64 {
            if first == usize::MAX {
                first = k;
            }
            last = k;
        }
        k += 1;
    }
    if first == usize::MAX {
        (1, 0)
    } else {
        (first, last)
    }
}

/// Carries the crowded columns `first..=last` of a finished product into the
/// column above each, so that each is below 2^B plus a carry and the
/// reduction's products fit beside them (see `crowded`). Public positions
/// only: the same instructions for every value.
#[inline(always)]
pub(super) unsafe fn carry_crowded<V: Simd, const L: usize, const B: i32>(t: *mut V::M) {
    let (first, last) = const { crowded(L, B as u32) };
    // SAFETY: last + 1 < 2L (the top column holds no product); the width's feature enabled.
    unsafe {
        if first > last {
            return;
        }
        let mask = V::splat((1 << B) - 1);
        let mut carry = V::zero();
        for k in first..=last {
            let v = V::add(V::ld(t.add(k)), carry);
            carry = V::srli::<B>(v);
            V::st(t.add(k), V::and(v, mask));
        }
        V::st(t.add(last + 1), V::add(V::ld(t.add(last + 1)), carry));
    }
}

/// One operand's Montgomery reduction in progress: the 2L columns at `t`, the
/// modulus and `k0` (low B bits), the mask of the last digit (`W` bits,
/// where `R = 2^(B(L-1) + W)`), and the carry out of the last completed
/// column.
pub(super) struct Reduction<V: Simd> {
    pub t: *mut V::M,
    pub m: *const V::M,
    pub k0: V::R,
    pub last_mask: V::R,
    pub carry: V::R,
}

/// Quotient digits of one block of 4 rows.
type Digits<V> = [<V as Simd>::R; ROWS];

/// The serial part of a block: the 4 quotient digits `y_i = c_i * k0 mod
/// 2^B` of columns i0..i0+3, each column carried into the next as it
/// completes. In the last block the last digit has W bits: column L-1 is
/// then not carried but kept whole (its low W bits are zero and the result
/// starts above them, see `finish`).
#[inline(always)]
unsafe fn head<V: Simd, const B: i32>(r: &mut Reduction<V>, i0: usize, last: bool) -> Digits<V> {
    // SAFETY: columns i0..i0+3 < 2L and limbs 0..3 are in bounds (caller).
    unsafe {
        let (t, m, k0) = (r.t, r.m, r.k0);
        let mask = V::splat((1 << B) - 1);
        let (m0, m1, m2, m3) = (V::ld(m), V::ld(m.add(1)), V::ld(m.add(2)), V::ld(m.add(3)));
        let c0 = V::add(V::ld(t.add(i0)), r.carry);
        let y0 = V::and(V::mul(c0, k0), mask);
        let carry = V::srli::<B>(mac::<V>(c0, m0, y0));
        let c1 = V::add(mac::<V>(V::ld(t.add(i0 + 1)), m1, y0), carry);
        let y1 = V::and(V::mul(c1, k0), mask);
        let carry = V::srli::<B>(mac::<V>(c1, m0, y1));
        let c2 = V::add(
            mac::<V>(mac::<V>(V::ld(t.add(i0 + 2)), m2, y0), m1, y1),
            carry,
        );
        let y2 = V::and(V::mul(c2, k0), mask);
        let carry = V::srli::<B>(mac::<V>(c2, m0, y2));
        let c3 = V::add(
            mac::<V>(
                mac::<V>(mac::<V>(V::ld(t.add(i0 + 3)), m3, y0), m2, y1),
                m1,
                y2,
            ),
            carry,
        );
        let y3 = if last {
            let y3 = V::and(V::mul(c3, k0), r.last_mask);
            V::st(t.add(i0 + 3), mac::<V>(c3, m0, y3));
            r.carry = V::zero();
            y3
        } else {
            let y3 = V::and(V::mul(c3, k0), mask);
            r.carry = V::srli::<B>(mac::<V>(c3, m0, y3));
            y3
        };
        [y0, y1, y2, y3]
    }
}

/// The parallel part of a block: `m_j * y_r` into column i0+j+r for every
/// pair the head did not add (j + r >= 4), with a window of 4 columns
/// sliding over limbs `j0..j1`. The window's partial columns are loaded at
/// the start and stored at the end, so a body can run in two parts: the
/// first (limbs 4..8) completes the 4 columns the next block's head reads,
/// and both halves' heads then run side by side, before the rest.
#[inline(always)]
unsafe fn body<V: Simd, const L: usize>(
    r: &Reduction<V>,
    i0: usize,
    y: &Digits<V>,
    j0: usize,
    j1: usize,
) {
    // SAFETY: columns up to i0+L+2 <= 2L-2 and limbs below L (caller).
    unsafe {
        let (t, m) = (r.t, r.m);
        let w = if j0 == ROWS {
            let (m1, m2, m3) = (V::ld(m.add(1)), V::ld(m.add(2)), V::ld(m.add(3)));
            [
                mac::<V>(
                    mac::<V>(mac::<V>(V::ld(t.add(i0 + 4)), m1, y[3]), m2, y[2]),
                    m3,
                    y[1],
                ),
                mac::<V>(mac::<V>(V::ld(t.add(i0 + 5)), m2, y[3]), m3, y[2]),
                mac::<V>(V::ld(t.add(i0 + 6)), m3, y[3]),
            ]
        } else {
            [
                V::ld(t.add(i0 + j0)),
                V::ld(t.add(i0 + j0 + 1)),
                V::ld(t.add(i0 + j0 + 2)),
            ]
        };
        slide::<V, false>(t, i0, m, y, w, j0, j1);
    }
}

/// The result: columns L-1..2L-1 plus the final carry, normalized to B-bit
/// limbs and shifted down by W bits (the low W bits of column L-1 are the
/// last digit's zeros), as L limbs at `res[h]`, for the first H halves in
/// one loop (the carries are serial: two chains side by side).
#[inline(always)]
unsafe fn finish<V: Simd, const L: usize, const B: i32, const H: usize>(
    red: &[Reduction<V>; 2],
    w: i64,
    res: [*mut V::M; 2],
) {
    // SAFETY: t has 2L entries, res L; the width's feature enabled.
    unsafe {
        let mask = V::splat((1 << B) - 1);
        let (down, up) = (_mm_cvtsi64_si128(w), _mm_cvtsi64_si128(B as i64 - w));
        let mut prev = [V::zero(); H];
        let mut carry = [V::zero(); H];
        for h in 0..H {
            let v = V::ld(red[h].t.add(L - 1));
            prev[h] = V::and(v, mask);
            carry[h] = V::srli::<B>(v);
        }
        for k in 0..L {
            for h in 0..H {
                let v = V::add(V::ld(red[h].t.add(L + k)), carry[h]);
                carry[h] = V::srli::<B>(v);
                let z = V::and(v, mask);
                let limb = V::or(V::srl(prev[h], down), V::sll(z, up));
                V::st(res[h].add(k), V::and(limb, mask));
                prev[h] = z;
            }
        }
    }
}

/// Montgomery reduction of the 2L columns of each of the first `halves`
/// halves: adds `m*y` with the quotient digits, 4 at a time, and writes the
/// result to `res[h]` (L limbs of B bits). The two halves' blocks alternate
/// (independent chains). The result is `< 2m` for a column value `< 4m^2`
/// (`4m < R`).
#[inline(always)]
pub(super) unsafe fn reduce<V: Simd, const L: usize, const B: i32>(
    red: &mut [Reduction<V>; 2],
    w: i64,
    res: [*mut V::M; 2],
    halves: usize,
) {
    // SAFETY: as for `head`, `body` and `finish`.
    unsafe {
        let mut y = [[V::zero(); ROWS]; 2];
        for h in 0..halves {
            y[h] = head::<V, B>(&mut red[h], 0, ROWS == L);
        }
        for i0 in (0..L).step_by(ROWS) {
            for h in 0..halves {
                body::<V, L>(&red[h], i0, &y[h], ROWS, 2 * ROWS);
            }
            let mut next = [[V::zero(); ROWS]; 2];
            if i0 + ROWS < L {
                for h in 0..halves {
                    next[h] = head::<V, B>(&mut red[h], i0 + ROWS, i0 + 2 * ROWS == L);
                }
            }
            for h in 0..halves {
                body::<V, L>(&red[h], i0, &y[h], 2 * ROWS, L);
            }
            y = next;
        }
        if halves == 2 {
            finish::<V, L, B, 2>(red, w, res);
        } else {
            finish::<V, L, B, 1>(red, w, res);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::crowded;

    #[test]
    fn crowded_columns_per_layout() {
        // 29-bit limbs: columns 31..=39 take 64 or more products of up to
        // 2^58 between them; every other layout fits in 64 bits as it is.
        assert_eq!(crowded(36, 29), (31, 39));
        for (l, b) in [(56, 28), (80, 26), (120, 26), (160, 26)] {
            let (first, last) = crowded(l, b);
            assert!(first > last, "{l} limbs of {b} bits need no carry pass");
        }
    }
}
