//! The fixed-window exponentiation every kernel runs: a table of the first
//! 16 powers, then 4 squarings and one multiplication by a table entry per
//! window of the exponent, in a sequence fixed by the public exponent size.

use crate::bn::{Lanes, LANES, LIMB_BITS};
use crate::kernel::{MontKernel, TABLE};
use zeroize::Zeroize;

/// Window width of the exponentiation (16-entry table). Against 5 bits it
/// costs a fifth more multiplications but halves the table, which every window
/// reads whole: for RSA-2048's halves 20 KiB, which stays in a 32 KiB L1 cache
/// beside the operands, where 40 KiB streamed from L2 on every window (with the
/// IFMA kernel on AMD Zen 4, RSA-2048 batches of 4 and 8 signatures 5-7% faster, of
/// one 14%: docs/BENCHMARKS-engine.md).
pub(crate) const WINDOW: usize = 4;
const _: () = assert!(1 << WINDOW == TABLE);

/// Bits `[pos, pos + WINDOW)` of each lane's exponent.
pub(crate) fn window<const N: usize>(exp: &[Lanes; N], pos: usize) -> Lanes {
    let (limb, off) = (pos / LIMB_BITS, pos % LIMB_BITS);
    let mut w = Lanes::default();
    for lane in 0..LANES {
        let mut v = exp[limb].0[lane] >> off;
        if off + WINDOW > LIMB_BITS && limb + 1 < N {
            v |= exp[limb + 1].0[lane] << (LIMB_BITS - off);
        }
        w.0[lane] = v & ((1 << WINDOW) - 1);
    }
    w
}

/// One exponentiation per lane: `base^exp` in the Montgomery domain (`one`
/// is R mod m), every lane's exponent `exp_bits` bits long (the public size,
/// not the actual bit length). The numbers have the N limbs of the kernel
/// call that takes them.
pub(crate) struct ExpJob<'a> {
    pub base: &'a [Lanes],
    pub exp: &'a [Lanes],
    pub exp_bits: usize,
    pub m: &'a [Lanes],
    pub k0: &'a Lanes,
    pub one: &'a [Lanes],
}

/// The table of the first 16 powers, on the heap (20 KiB for RSA-2048), with
/// entries 0 and 1 set (the Montgomery one and the base); zeroized when
/// dropped. Every kernel's exponentiation builds the rest in the same order.
pub(crate) struct Table<const N: usize>(Box<[[Lanes; N]; TABLE]>);

impl<const N: usize> Table<N> {
    pub(crate) fn new(job: &ExpJob<'_>) -> Self {
        let mut table: Box<[[Lanes; N]; TABLE]> = vec![[Lanes::default(); N]; TABLE]
            .into_boxed_slice()
            .try_into()
            .expect("TABLE entries");
        table[0] = *limbs::<N>(job.one);
        table[1] = *limbs::<N>(job.base);
        Table(table)
    }
}

impl<const N: usize> core::ops::Deref for Table<N> {
    type Target = [[Lanes; N]; TABLE];
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<const N: usize> core::ops::DerefMut for Table<N> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<const N: usize> Drop for Table<N> {
    fn drop(&mut self) {
        self.0.iter_mut().for_each(|e| e.zeroize());
    }
}

/// `x` as a number of N limbs.
pub(crate) fn limbs<const N: usize>(x: &[Lanes]) -> &[Lanes; N] {
    x.try_into().expect("a number of N limbs")
}

/// Fixed-window exponentiation in the Montgomery domain: squarings and
/// multiplications in a fixed sequence; the table entry is picked by
/// `select`, which reads all entries.
pub(crate) fn fixed_window<K: MontKernel, const N: usize>(k: &K, job: &ExpJob<'_>) -> [Lanes; N] {
    let (base, exp, m) = (limbs::<N>(job.base), limbs::<N>(job.exp), limbs::<N>(job.m));
    let (k0, exp_bits) = (job.k0, job.exp_bits);
    let mut table = Table::<N>::new(job);
    for i in 2..table.len() {
        table[i] = if i % 2 == 0 {
            k.sqr(&table[i / 2], m, k0)
        } else {
            k.mul(&table[i - 1], base, m, k0)
        };
    }
    let windows = exp_bits.div_ceil(WINDOW);
    let mut acc = k.select(&table, &window(exp, (windows - 1) * WINDOW));
    for w in (0..windows - 1).rev() {
        for _ in 0..WINDOW {
            k.sqr_assign(&mut acc, m, k0);
        }
        let mut t = k.select(&table, &window(exp, w * WINDOW));
        k.mul_assign(&mut acc, &t, m, k0);
        t.zeroize();
    }
    acc
}
