//! The kernel's scratch: operands, modulus and column accumulators in one
//! buffer owned by the kernel value, reused by every operation of a pass and
//! zeroized when it is dropped or outgrown.

use zeroize::Zeroize;

use super::Simd;

/// The buffers of the scratch, per half: operands A, B and X and the modulus
/// M (L limbs each), the column accumulators T (2L).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Buf {
    A,
    B,
    X,
    M,
    T,
}

/// Entries of the scratch per limb of the operand size: the buffers of both
/// halves (AVX2; AVX-512F uses the first half of each).
const SCRATCH_PER_LIMB: usize = 12;

/// Scratch of one kernel value, in the kernel's limbs.
pub(crate) struct Scratch<V: Simd> {
    /// The buffers of both halves back to back, at offsets that follow the
    /// operand size: a multiplication's working set is contiguous, and
    /// buffers the kernel stores to and loads from in the same loop are not
    /// a multiple of 4 KiB apart (the CPU would take those loads for reads
    /// of the stored lines and wait: twice the time, measured).
    /// Sized by `view` for the largest operand seen: allocating and zeroizing
    /// the 4096-bit size for every RSA-2048 pass took 1.7% of the time.
    buf: Vec<V::M>,
    /// `k0` per half, low B bits.
    k0: [V::M; 2],
}

impl<V: Simd> Scratch<V> {
    pub(super) fn new() -> Self {
        Scratch {
            buf: Vec::new(),
            k0: [V::M::default(); 2],
        }
    }

    /// Makes room for operands of `l` limbs and lends the scratch out for
    /// one operation. The old buffer is zeroized before it is freed.
    pub(super) fn view(&mut self, l: usize) -> View<'_, V> {
        if self.buf.len() < SCRATCH_PER_LIMB * l {
            self.buf.zeroize();
            self.buf = vec![V::M::default(); SCRATCH_PER_LIMB * l];
        }
        View {
            buf: &mut self.buf,
            k0: &mut self.k0,
        }
    }
}

impl<V: Simd> Drop for Scratch<V> {
    fn drop(&mut self) {
        self.buf.zeroize();
        self.k0.zeroize();
    }
}

/// The scratch as the kernel's code works in it, for one operation.
///
/// The entry points (`Simd::mod_exp`, `Simd::mont52`) take its two parts,
/// and every number, as separate arguments rather than behind a pointer to a
/// structure: the static constant-time check of the AVX-512F width then sees
/// every pointer and length arrive in a register or the stack frame, and
/// anything else loaded into a general-purpose register as data.
pub(crate) struct View<'a, V: Simd> {
    pub(super) buf: &'a mut [V::M],
    pub(super) k0: &'a mut [V::M; 2],
}

impl<V: Simd> View<'_, V> {
    /// Half `h` of buffer `b` for operands of `l` limbs.
    pub(super) fn at(&mut self, b: Buf, h: usize, l: usize) -> *mut V::M {
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
