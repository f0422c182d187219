//! Test hook (feature `test-hooks`): timing of one Montgomery multiplication
//! or squaring per kernel, for the kernel benchmark (`bench/mont.rs`): the
//! arithmetic core alone, without table lookups, conversions or the RSA
//! pipeline. And the time of X25519 server key shares per kernel.

use std::time::{Duration, Instant};

use crate::bn::{self, Lanes, LANES, MASK52};
use crate::kernel::{MontKernel, Portable};
use crate::{EngineError, Kernel, X25519Kernel};

/// Runs `iters` calls of [`crate::x25519_server_shares`] with `batch` peer
/// shares each (8 fills one IFMA pass) and returns the elapsed time: the time
/// per share (key generation + agreement) is that over `iters * batch`.
pub fn x25519_share_time(
    kernel: X25519Kernel,
    batch: usize,
    iters: usize,
) -> Result<Duration, EngineError> {
    if !kernel.is_available() {
        return Err(EngineError::KernelUnavailable);
    }
    // Any point of large order will do; 9 is the base point.
    let mut peer = [0u8; 32];
    peer[0] = 9;
    let peers = vec![peer; batch];
    let start = Instant::now();
    for _ in 0..iters {
        for share in crate::x25519_server_shares(kernel, &peers) {
            std::hint::black_box(share?);
        }
    }
    Ok(start.elapsed())
}

/// Which operation to time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MontOp {
    /// One Montgomery multiplication of two different operands.
    Mul,
    /// One Montgomery squaring.
    Sqr,
    /// A whole fixed-window exponentiation with an exponent as long as the
    /// modulus (the kernel's own `mod_exp`: conversions once, not per
    /// multiplication): about 1.23 Montgomery operations per exponent bit.
    Exp,
}

/// Runs `iters` dependent operations (each input is the previous result) on
/// `bits`-bit moduli (1024, 1536 or 2048: the CRT halves of RSA-2048/3072/
/// 4096) in every lane the kernel computes in one call (`lanes`), and returns
/// the elapsed time.
pub fn mont_time(
    kernel: Kernel,
    bits: usize,
    op: MontOp,
    lanes: usize,
    iters: usize,
) -> Result<Duration, EngineError> {
    if !kernel.is_available() {
        return Err(EngineError::KernelUnavailable);
    }
    match (kernel, bits) {
        #[cfg(target_arch = "x86_64")]
        (Kernel::Ifma, _) => {
            let k = crate::ifma::Ifma::new(lanes).expect("checked above");
            by_size(&k, bits, op, iters)
        }
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx512, _) => {
            let k = crate::mul32::Avx512::new(lanes).expect("checked above");
            by_size(&k, bits, op, iters)
        }
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx2, _) => {
            let k = crate::mul32::Avx2::new(lanes).expect("checked above");
            by_size(&k, bits, op, iters)
        }
        (Kernel::Portable, _) => by_size(&Portable { lanes }, bits, op, iters),
        #[cfg(not(target_arch = "x86_64"))]
        _ => Err(EngineError::KernelUnavailable),
    }
}

fn by_size<K: MontKernel>(
    k: &K,
    bits: usize,
    op: MontOp,
    iters: usize,
) -> Result<Duration, EngineError> {
    match bits {
        1024 => Ok(chain::<K, 20>(k, op, bits, iters)),
        1536 => Ok(chain::<K, 30>(k, op, bits, iters)),
        2048 => Ok(chain::<K, 40>(k, op, bits, iters)),
        _ => Err(EngineError::UnsupportedKeySize(bits)),
    }
}

fn chain<K: MontKernel, const N: usize>(k: &K, op: MontOp, bits: usize, iters: usize) -> Duration {
    // Fixed pseudo-random operands: odd moduli with 4m < R, a and b below m.
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s & MASK52
    };
    let (mut m, mut a, mut b, mut k0) = (
        [Lanes::default(); N],
        [Lanes::default(); N],
        [Lanes::default(); N],
        Lanes::default(),
    );
    for lane in 0..LANES {
        for j in 0..N {
            m[j].0[lane] = next();
            a[j].0[lane] = next();
            b[j].0[lane] = next();
        }
        m[N - 1].0[lane] = (m[N - 1].0[lane] >> 4) | (1 << 47);
        m[0].0[lane] |= 1;
        a[N - 1].0[lane] >>= 6;
        b[N - 1].0[lane] >>= 6;
        k0.0[lane] = bn::mont_k0(m[0].0[lane]);
    }
    let start = Instant::now();
    for _ in 0..iters {
        a = match op {
            MontOp::Mul => k.mul(&a, &b, &m, &k0),
            MontOp::Sqr => k.sqr(&a, &m, &k0),
            MontOp::Exp => k.mod_exp(&crate::exp::ExpJob {
                base: &a,
                exp: &b,
                exp_bits: bits,
                m: &m,
                k0: &k0,
                one: &b,
            }),
        };
    }
    let elapsed = start.elapsed();
    std::hint::black_box(&a);
    elapsed
}
