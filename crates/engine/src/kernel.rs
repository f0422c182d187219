//! The multi-buffer Montgomery kernels: 8 independent operations, one per
//! lane, each lane with its own modulus. [`Portable`] is plain Rust (u64 limbs,
//! u128 products); [`crate::ifma::Ifma`] uses AVX-512 IFMA. Both implement the
//! same radix-2^52 "almost Montgomery" algorithm and give bit-identical
//! results, which the tests use as a cross-check.

use crate::bn::{self, Lanes, LANES};
use zeroize::Zeroize;

/// Entries of the exponentiation table (window of 4 bits).
pub(crate) const TABLE: usize = 16;

/// Operations the exponentiation needs. All are constant time with respect
/// to the values (lane count and limb count are public).
pub(crate) trait MontKernel {
    /// `a*b/R mod m` per lane, result `< 2m` for inputs `< 2m` (`R = 2^(52N)`,
    /// `4m < R`).
    fn mul<const N: usize>(
        &self,
        a: &[Lanes; N],
        b: &[Lanes; N],
        m: &[Lanes; N],
        k0: &Lanes,
    ) -> [Lanes; N];
    /// `a = a*b/R mod m` in place; same contract as `mul`. The exponentiation
    /// multiplies its accumulator by a table entry once per window; the default
    /// keeps `mul`'s behaviour.
    fn mul_assign<const N: usize>(
        &self,
        a: &mut [Lanes; N],
        b: &[Lanes; N],
        m: &[Lanes; N],
        k0: &Lanes,
    ) {
        *a = self.mul(a, b, m, k0);
    }
    /// `a*a/R mod m`; same contract as `mul`.
    fn sqr<const N: usize>(&self, a: &[Lanes; N], m: &[Lanes; N], k0: &Lanes) -> [Lanes; N];
    /// `a = a*a/R mod m` in place; same contract as `sqr`. The exponentiation
    /// squares its accumulator 4 times per window: a kernel that writes the
    /// result over its operand saves clearing and copying the whole vertical
    /// number on every squaring. The default keeps `sqr`'s behaviour.
    fn sqr_assign<const N: usize>(&self, a: &mut [Lanes; N], m: &[Lanes; N], k0: &Lanes) {
        *a = self.sqr(a, m, k0);
    }
    /// Per lane `l`: `table[idx[l]]`, reading every entry (no secret index).
    fn select<const N: usize>(&self, table: &[[Lanes; N]; TABLE], idx: &Lanes) -> [Lanes; N];
    /// The exponentiation of `job`, by [`crate::exp::fixed_window`]. A kernel whose own
    /// limb layout differs from the shared radix 2^52 overrides it to keep
    /// its numbers in that layout from the first power to the last instead
    /// of converting around every multiplication; the result must be the
    /// same bits.
    fn mod_exp<const N: usize>(&self, job: &crate::exp::ExpJob<'_>) -> [Lanes; N]
    where
        Self: Sized,
    {
        crate::exp::fixed_window(self, job)
    }
}

/// Portable kernel: runs the scalar algorithm lane by lane, only for the
/// first `lanes` lanes (a short batch costs proportionally less).
pub(crate) struct Portable {
    pub lanes: usize,
}

pub(crate) fn get_lane<const N: usize>(x: &[Lanes; N], lane: usize, out: &mut [u64]) {
    for (o, l) in out.iter_mut().zip(x.iter()) {
        *o = l.0[lane];
    }
}

pub(crate) fn set_lane<const N: usize>(x: &mut [Lanes; N], lane: usize, v: &[u64]) {
    for (l, &vv) in x.iter_mut().zip(v.iter()) {
        l.0[lane] = vv;
    }
}

impl MontKernel for Portable {
    fn mul<const N: usize>(
        &self,
        a: &[Lanes; N],
        b: &[Lanes; N],
        m: &[Lanes; N],
        k0: &Lanes,
    ) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        let (mut sa, mut sb, mut sm, mut sr) = ([0u64; N], [0u64; N], [0u64; N], [0u64; N]);
        for lane in 0..self.lanes.min(LANES) {
            get_lane(a, lane, &mut sa);
            get_lane(b, lane, &mut sb);
            get_lane(m, lane, &mut sm);
            bn::amm(&mut sr, &sa, &sb, &sm, k0.0[lane]);
            set_lane(&mut r, lane, &sr);
        }
        for t in [&mut sa, &mut sb, &mut sm, &mut sr] {
            t.zeroize();
        }
        r
    }

    fn sqr<const N: usize>(&self, a: &[Lanes; N], m: &[Lanes; N], k0: &Lanes) -> [Lanes; N] {
        self.mul(a, a, m, k0)
    }

    fn select<const N: usize>(&self, table: &[[Lanes; N]; TABLE], idx: &Lanes) -> [Lanes; N] {
        let mut r = [Lanes::default(); N];
        for (k, entry) in table.iter().enumerate() {
            for lane in 0..LANES {
                let d = idx.0[lane] ^ k as u64;
                // all-ones iff d == 0, without a branch
                let mask = bn::barrier(((d | d.wrapping_neg()) >> 63).wrapping_sub(1));
                for j in 0..N {
                    r[j].0[lane] |= entry[j].0[lane] & mask;
                }
            }
        }
        r
    }
}
