//! Scalar Montgomery multiplications that run beside the vector lanes.
//!
//! The vector units and the integer multiplier are separate: while the AVX2
//! lanes multiply, the 64x64-bit `mulx` unit is idle. A scalar Montgomery
//! multiplication (radix 2^64, CIOS: one row of `a * b_i` and its reduction
//! at a time) advanced a row or two between the vector blocks gives the
//! out-of-order core independent work within its window, so both run at
//! once instead of one after the other.
//!
//! Constant time: the row sequence and the final subtraction are straight-line
//! code over the public limb count; the row counter is public.

use zeroize::Zeroize;

/// One scalar Montgomery multiplication of S 64-bit limbs in progress:
/// `a * b / 2^(64S) mod m`, fully reduced, one row per `row` call.
pub(crate) struct RowMont<const S: usize> {
    pub a: [u64; S],
    pub b: [u64; S],
    pub m: [u64; S],
    /// `-m^-1 mod 2^64`.
    pub k0: u64,
    /// The running sum, S limbs plus the two above them.
    t: [u64; S],
    t_hi: u64,
    t_top: u64,
    /// Rows done (public).
    done: usize,
}

impl<const S: usize> RowMont<S> {
    const FITS: () = assert!(S == 16, "the row is written for 16 limbs");
    pub(crate) fn new(a: [u64; S], b: [u64; S], m: [u64; S], k0: u64) -> Self {
        let () = Self::FITS;
        RowMont {
            a,
            b,
            m,
            k0,
            t: [0; S],
            t_hi: 0,
            t_top: 0,
            done: 0,
        }
    }

    /// `t = (t + a * b_i + q * m) / 2^64` with `q` making the low limb zero.
    #[inline(always)]
    pub(crate) fn row(&mut self) {
        let bi = self.b[self.done];
        let mut th = [self.t_hi, self.t_top];
        // SAFETY: a, m and t are S = 16 limbs; th two. The CPU has BMI2 and
        // ADX (the only caller checks). Two carry chains: CF for the low
        // halves of the products, OF for the high halves.
        unsafe {
            core::arch::asm!(
                // t += a * b_i
                "mov rdx, {bi}",
                "xor eax, eax",
                "mulx r9, r8, [{a}]",
                "adcx r8, [{t}]",
                "mov [{t}], r8",
                ".irp j,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
                "mulx r11, r10, [{a} + 8*\\j]",
                "adcx r10, [{t} + 8*\\j]",
                "adox r10, r9",
                "mov [{t} + 8*\\j], r10",
                "mov r9, r11",
                ".endr",
                "mov r10, [{th}]",
                "adcx r10, rax",
                "adox r10, r9",
                "mov [{th}], r10",
                "mov r10, 0",
                "adcx r10, rax",
                "adox r10, rax",
                "mov [{th} + 8], r10",
                // t = (t + q * m) / 2^64
                "mov rdx, [{t}]",
                "imul rdx, {k0}",
                "xor eax, eax",
                "mulx r9, r8, [{m}]",
                "adcx r8, [{t}]",
                ".irp j,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
                "mulx r11, r10, [{m} + 8*\\j]",
                "adcx r10, [{t} + 8*\\j]",
                "adox r10, r9",
                "mov [{t} + 8*\\j - 8], r10",
                "mov r9, r11",
                ".endr",
                "mov r10, [{th}]",
                "adcx r10, rax",
                "adox r10, r9",
                "mov [{t} + 120], r10",
                "mov r10, [{th} + 8]",
                "adcx r10, rax",
                "adox r10, rax",
                "mov [{th}], r10",
                a = in(reg) self.a.as_ptr(),
                m = in(reg) self.m.as_ptr(),
                t = in(reg) self.t.as_mut_ptr(),
                th = in(reg) th.as_mut_ptr(),
                bi = in(reg) bi,
                k0 = in(reg) self.k0,
                out("rax") _, out("rdx") _, out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                options(nostack),
            );
        }
        self.t_hi = th[0];
        self.t_top = 0;
        self.done += 1;
    }

    /// After the last row: the result `< m` (from `t < 2m`, by a masked
    /// subtraction), written to `a`, and the sum cleared for the next
    /// multiplication.
    #[inline(always)]
    pub(crate) fn finish(&mut self) {
        let mut d = [0u64; S];
        let mut borrow = 0u64;
        for ((dj, &tj), &mj) in d.iter_mut().zip(&self.t).zip(&self.m) {
            let (x, b1) = tj.overflowing_sub(mj);
            let (x, b2) = x.overflowing_sub(borrow);
            *dj = x;
            borrow = (b1 | b2) as u64;
        }
        // Keep t when the subtraction borrowed past the limb above it.
        let keep = crate::bn::barrier(0u64.wrapping_sub(borrow & !self.t_hi & 1));
        for ((aj, &tj), &dj) in self.a.iter_mut().zip(&self.t).zip(&d) {
            *aj = (tj & keep) | (dj & !keep);
        }
        d.zeroize();
        self.t.zeroize();
        self.t_hi = 0;
        self.t_top = 0;
        self.done = 0;
    }
}

impl<const S: usize> Drop for RowMont<S> {
    fn drop(&mut self) {
        self.a.zeroize();
        self.b.zeroize();
        self.m.zeroize();
        self.t.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::RowMont;
    use num_bigint::BigUint;

    fn big(x: &[u64; 16]) -> BigUint {
        BigUint::from_slice(
            &x.iter()
                .flat_map(|&l| [l as u32, (l >> 32) as u32])
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn rows_give_the_montgomery_product() {
        if !(is_x86_feature_detected!("bmi2") && is_x86_feature_detected!("adx")) {
            eprintln!("skipped: the scalar rows need BMI2 and ADX");
            return;
        }
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..200 {
            let mut v = [[0u64; 16]; 3];
            v.iter_mut().flatten().for_each(|x| *x = next());
            v[2][0] |= 1;
            v[2][15] |= 1 << 63;
            let m = big(&v[2]);
            let (a, b) = (big(&v[0]) % &m, big(&v[1]) % &m);
            let limbs = |x: &BigUint| {
                let mut r = [0u64; 16];
                for (i, d) in x.to_u64_digits().iter().enumerate() {
                    r[i] = *d;
                }
                r
            };
            let mut inv = v[2][0];
            for _ in 0..6 {
                inv = inv.wrapping_mul(2u64.wrapping_sub(v[2][0].wrapping_mul(inv)));
            }
            let mut mont = RowMont::new(limbs(&a), limbs(&b), v[2], inv.wrapping_neg());
            for _ in 0..16 {
                mont.row();
            }
            mont.finish();
            let r_inv = (BigUint::from(1u8) << 1024u32)
                .modinv(&m)
                .expect("odd modulus");
            assert_eq!(big(&mont.a), a * b * r_inv % &m);
        }
    }
}
