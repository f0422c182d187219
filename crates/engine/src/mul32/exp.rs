//! The fixed-window exponentiation with the numbers kept in the kernel's own
//! limbs: the same sequence of squarings, multiplications and table
//! selections as `crate::exp::fixed_window`, so the same bits come out, but
//! without converting to and from radix 2^52 around each multiplication.
//!
//! The table stays in radix 2^52 (20 limbs instead of 36 for RSA-2048): the
//! masked selection reads every entry once per window, and the one selected
//! number is cheaper to convert than 32 wider entries are to read.

use zeroize::Zeroize;

use super::{convert, load_modulus, mont, Buf, Simd, View};
use crate::bn::Lanes;
use crate::exp::{limbs, window, ExpJob, Table, WINDOW};
use crate::kernel::TABLE;

/// `r = base^exp` in the Montgomery domain for the first `halves` halves.
/// Buffers: B holds the base, X each new table entry and then the selected
/// entry, A the accumulator.
/// Compiled into each width's entry point (`Simd::mod_exp`).
#[inline(always)]
pub(super) unsafe fn mod_exp<V: Simd, const N: usize, const L: usize, const B: i32>(
    s: &mut View<'_, V>,
    ops: &ExpJob<'_>,
    r: &mut [Lanes],
    halves: usize,
) {
    let halves = super::registers::<V>(halves);
    let exp = limbs::<N>(ops.exp);
    assert!(ops.base.len() == N && ops.m.len() == N && r.len() == N);
    let mut table = Table::<N>::new(ops);
    // SAFETY: the width's feature enabled (caller); the scratch holds L
    // limbs per buffer (t: 2L) per half.
    unsafe {
        load_modulus::<V, L, B>(s, ops.m, ops.k0, halves);
        for h in 0..halves {
            convert::split::<V, L, B>(ops.base, h, s.at(Buf::B, h, L));
        }
        // Even entries square their half, odd ones multiply the entry below
        // (in X from the step before) by the base, as the shared sequence does.
        for i in 2..TABLE {
            if i % 2 == 0 {
                for h in 0..halves {
                    convert::split::<V, L, B>(&table[i / 2], h, s.at(Buf::X, h, L));
                }
                mont::<V, N, L, B>(s, Buf::X, Buf::X, None, halves);
            } else {
                mont::<V, N, L, B>(s, Buf::X, Buf::X, Some(Buf::B), halves);
            }
            for h in 0..halves {
                convert::join::<V, L, B>(s.at(Buf::X, h, L), &mut table[i], h);
            }
        }
        let windows = ops.exp_bits.div_ceil(WINDOW);
        let mut picked = [Lanes::default(); N];
        let top = window(exp, (windows - 1) * WINDOW);
        V::select(&mut picked, &table, &top, halves);
        for h in 0..halves {
            convert::split::<V, L, B>(&picked, h, s.at(Buf::A, h, L));
        }
        for w in (0..windows - 1).rev() {
            for _ in 0..WINDOW {
                mont::<V, N, L, B>(s, Buf::A, Buf::A, None, halves);
            }
            V::select(&mut picked, &table, &window(exp, w * WINDOW), halves);
            for h in 0..halves {
                convert::split::<V, L, B>(&picked, h, s.at(Buf::X, h, L));
            }
            mont::<V, N, L, B>(s, Buf::A, Buf::A, Some(Buf::X), halves);
        }
        for h in 0..halves {
            convert::join::<V, L, B>(s.at(Buf::A, h, L), r, h);
        }
        picked.zeroize();
    }
}
