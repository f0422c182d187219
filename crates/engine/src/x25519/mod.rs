//! X25519 (RFC 7748) key shares in batches: the server's half of a TLS key
//! exchange for many connections at once.
//!
//! Two kernels compute the same function: [`X25519Kernel::Ifma`], 8 scalar
//! multiplications per pass in the lanes of AVX-512 IFMA registers
//! (`ifma.rs`), and [`X25519Kernel::Portable`], one at a time in radix 2^51
//! (`portable.rs`), the reference the tests compare the IFMA kernel with.
//! Both are constant time with respect to scalars and points.

#[cfg(target_arch = "x86_64")]
mod base_table;
#[cfg(target_arch = "x86_64")]
mod ifma;
mod portable;

#[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
pub use ifma::planted_cswap;

use crate::bn::{Lanes, LANES};
use crate::EngineError;
use zeroize::{Zeroize, Zeroizing};

/// One server key share: our public value and the shared secret with the
/// client's share.
pub struct X25519Share {
    /// Our public value (the key share sent to the client).
    pub public: [u8; 32],
    /// The shared secret with the client's share (zeroized on drop).
    pub shared: Zeroizing<[u8; 32]>,
}

impl core::fmt::Debug for X25519Share {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The shared secret is never printed.
        f.debug_struct("X25519Share")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

/// Which X25519 kernel computes a batch: [`X25519Kernel::Ifma`] or
/// [`X25519Kernel::Portable`].
pub type X25519Kernel = crate::curve_kernel::CurveKernel;

/// The u-coordinate of the base point.
const BASE: [u8; 32] = {
    let mut b = [0u8; 32];
    b[0] = 9;
    b
};

/// For each client share: a fresh random private scalar (clamped, zeroized
/// after use), `public = X25519(k, 9)` and `shared = X25519(k, peer)`. A lane
/// whose shared secret is all zero (the peer sent a point of small order, RFC
/// 7748 section 6.1) gives [`EngineError::InvalidPeerKey`], the others are
/// unaffected. Any number of peers; the IFMA kernel computes them 8 at a time
/// (a short last pass is padded with dummy lanes).
pub fn x25519_server_shares(
    kernel: X25519Kernel,
    peers: &[[u8; 32]],
) -> Vec<Result<X25519Share, EngineError>> {
    if !kernel.is_available() {
        return peers
            .iter()
            .map(|_| Err(EngineError::KernelUnavailable))
            .collect();
    }
    let mut out = Vec::with_capacity(peers.len());
    // Scalars are drawn one pass (8 lanes) at a time, for either kernel, so
    // that at most 8 private keys exist at once.
    for group in peers.chunks(LANES) {
        let mut scalars = Zeroizing::new(vec![[0u8; 32]; group.len()]);
        if getrandom::getrandom(scalars.as_flattened_mut()).is_err() {
            out.extend(group.iter().map(|_| Err(EngineError::Rng)));
            continue;
        }
        crate::ct::mark_secret(&scalars);
        let (publics, shared) = compute(kernel, Op::Share, &scalars, group);
        for (public, secret) in publics.iter().zip(shared.iter()) {
            // Whether the secret is zero is public (the handshake fails on
            // it), so only that one bit is declassified.
            let zero = crate::ct::declassified(is_zero(secret));
            crate::ct::declassify(public);
            out.push(if zero != 0 {
                Err(EngineError::InvalidPeerKey)
            } else {
                Ok(X25519Share {
                    public: *public,
                    shared: Zeroizing::new(*secret),
                })
            });
        }
    }
    out
}

/// Test hook (feature `test-hooks`): `out[i] = X25519(scalars[i], 9)`, the
/// public values, by the kernel's key generation path (the IFMA kernel's
/// fixed-base table; the portable kernel's ladder).
///
/// # Panics
///
/// If the kernel is not available on this CPU.
#[cfg(feature = "test-hooks")]
pub fn x25519_base_batch(kernel: X25519Kernel, scalars: &[[u8; 32]]) -> Vec<[u8; 32]> {
    assert!(
        kernel.is_available(),
        "kernel {} unavailable",
        kernel.name()
    );
    compute(kernel, Op::Base, scalars, &[]).0.to_vec()
}

/// Test hook (feature `test-hooks`): the IFMA kernel's fixed-base table (row
/// i, entry j - 1: j * 256^i * B on edwards25519 as (y + x, y - x, 2dxy), five
/// radix-2^52 limbs each), for the AVX2 prototype's benchmark
/// (`bench/x25519_avx2.rs`), which converts it to its own radix.
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub fn x25519_base_table() -> &'static [[[u64; 15]; 8]; 32] {
    &base_table::BASE_TABLE
}

/// Test hook (feature `test-hooks`): a clamped scalar's 64 signed radix-16
/// digits, the fixed-base table's index (see `signed_digits`), for the AVX2
/// prototype's benchmark.
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub fn x25519_signed_digits(clamped: &[u8; 32]) -> [i64; 64] {
    signed_digits(clamped)
}

/// `out[i] = X25519(scalars[i], points[i])` (scalars clamped, bit 255 of each
/// point ignored, as RFC 7748 says): the raw function, for tests and known
/// answers. No result is refused here.
///
/// # Panics
///
/// If the kernel is not available on this CPU, or `scalars` and `points`
/// differ in length.
pub fn x25519_batch(
    kernel: X25519Kernel,
    scalars: &[[u8; 32]],
    points: &[[u8; 32]],
) -> Vec<[u8; 32]> {
    assert_eq!(scalars.len(), points.len(), "one point per scalar");
    assert!(
        kernel.is_available(),
        "kernel {} unavailable",
        kernel.name()
    );
    compute(kernel, Op::Ladder, scalars, points).0.to_vec()
}

/// 0xff if all 32 bytes are zero, else 0, without a branch on them.
fn is_zero(x: &[u8; 32]) -> u8 {
    let acc = x.iter().fold(0u8, |a, &b| a | b) as u32;
    // acc - 1 borrows into bit 8 iff acc == 0.
    (crate::bn::barrier(acc as u64) as u32)
        .wrapping_sub(1)
        .wrapping_shr(8) as u8
}

/// Results of one call, one entry per scalar, wiped when dropped.
type Results = Zeroizing<Vec<[u8; 32]>>;

/// What one pass computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// X25519(k, u) by the ladder.
    Ladder,
    /// X25519(k, 9), the public value (IFMA: by the fixed-base table).
    Base,
    /// Both, for the same scalar: a server key share (IFMA: one inversion
    /// for the two).
    Share,
}

/// For each scalar (clamped here): `Ladder` gives X25519(k, points[i]) in
/// the first vector, `Base` X25519(k, 9) in the first, `Share` the public
/// value in the first and X25519(k, points[i]) in the second; passes of the
/// kernel's width.
fn compute(
    kernel: X25519Kernel,
    op: Op,
    scalars: &[[u8; 32]],
    points: &[[u8; 32]],
) -> (Results, Results) {
    let n = scalars.len();
    let mut first = Zeroizing::new(vec![[0u8; 32]; n]);
    let mut second = Zeroizing::new(vec![[0u8; 32]; if op == Op::Share { n } else { 0 }]);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        X25519Kernel::Ifma => {
            let k = ifma::Ifma25519::new().expect("checked by the caller");
            for (i, ks) in scalars.chunks(LANES).enumerate() {
                let range = i * LANES..i * LANES + ks.len();
                let pts = points.get(range.clone()).unwrap_or(&[]);
                let sec = second.get_mut(range.clone()).unwrap_or(&mut []);
                ifma_pass(&k, op, ks, pts, &mut first[range], sec);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        X25519Kernel::Ifma => unreachable!("checked by the caller"),
        X25519Kernel::Portable => {
            for (i, k) in scalars.iter().enumerate() {
                let mut kc = portable::clamp(k);
                match op {
                    Op::Ladder => first[i] = portable::scalar_mult(&kc, &points[i]),
                    Op::Base => first[i] = portable::scalar_mult(&kc, &BASE),
                    Op::Share => {
                        first[i] = portable::scalar_mult(&kc, &BASE);
                        second[i] = portable::scalar_mult(&kc, &points[i]);
                    }
                }
                kc.zeroize();
            }
            crate::ct::wipe_stack();
        }
    }
    (first, second)
}

/// One pass of up to 8 lanes (see [`compute`]); missing lanes compute a dummy
/// (clamped zero scalar, base point) that is thrown away.
#[cfg(target_arch = "x86_64")]
fn ifma_pass(
    k: &ifma::Ifma25519,
    op: Op,
    scalars: &[[u8; 32]],
    points: &[[u8; 32]],
    first: &mut [[u8; 32]],
    second: &mut [[u8; 32]],
) {
    let mut input = PassInput::pack(op, scalars, points);
    let (mut r1, mut r2) = ([Lanes::default(); 5], [Lanes::default(); 5]);
    match op {
        Op::Ladder => k.scalar_mult(&mut r1, &input.k, &input.u),
        Op::Base => k.base_mult(&mut r1, &input.d),
        Op::Share => k.server_share(&mut r1, &mut r2, &input.d, &input.k, &input.u),
    }
    unpack(&r1, first);
    unpack(&r2, second);
    input.zeroize();
    r1.zeroize();
    r2.zeroize();
    crate::ct::wipe_stack();
}

/// What an IFMA pass reads, lane by lane: each clamped scalar as 4 words
/// (the ladder) and as 64 signed digits (the fixed-base table), each point
/// as 5 radix-2^52 limbs.
#[cfg(target_arch = "x86_64")]
struct PassInput {
    k: [Lanes; 4],
    u: [Lanes; 5],
    d: [Lanes; 64],
}

#[cfg(target_arch = "x86_64")]
impl PassInput {
    fn pack(op: Op, scalars: &[[u8; 32]], points: &[[u8; 32]]) -> PassInput {
        let mut input = PassInput {
            k: [Lanes::default(); 4],
            u: [Lanes::default(); 5],
            d: [Lanes::default(); 64],
        };
        for lane in 0..LANES {
            let mut kc = portable::clamp(scalars.get(lane).unwrap_or(&[0; 32]));
            if op != Op::Ladder {
                let mut d = signed_digits(&kc);
                for (i, di) in input.d.iter_mut().enumerate() {
                    di.0[lane] = d[i] as u64;
                }
                d.zeroize();
            }
            if op != Op::Base {
                for (w, kw) in input.k.iter_mut().enumerate() {
                    kw.0[lane] =
                        u64::from_le_bytes(kc[8 * w..8 * w + 8].try_into().expect("8 bytes"));
                }
                let limbs = to_limbs52(points.get(lane).unwrap_or(&BASE));
                for (j, uj) in input.u.iter_mut().enumerate() {
                    uj.0[lane] = limbs[j];
                }
            }
            kc.zeroize();
        }
        input
    }
}

#[cfg(target_arch = "x86_64")]
impl Zeroize for PassInput {
    fn zeroize(&mut self) {
        self.k.zeroize();
        self.u.zeroize();
        self.d.zeroize();
    }
}

/// The first `out.len()` lanes of a pass's result, as bytes.
#[cfg(target_arch = "x86_64")]
fn unpack(r: &[Lanes; 5], out: &mut [[u8; 32]]) {
    for (lane, o) in out.iter_mut().enumerate() {
        let mut limbs = [0u64; 5];
        for (j, l) in limbs.iter_mut().enumerate() {
            *l = r[j].0[lane];
        }
        *o = from_limbs52(&limbs);
        limbs.zeroize();
    }
}

/// Test hook (feature `test-hooks`) for the constant-time check
/// (`ct/run.sh`): the scalar-side code of an IFMA pass without the IFMA part,
/// which valgrind cannot run. Packs up to 8 scalars (clamping, signed digits,
/// words) and points (limbs) as a server share pass does, and returns the
/// points unpacked again through the results' path (bit 255 cleared). With
/// marked inputs memcheck must report nothing.
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub fn ct_ifma_lanes(scalars: &[[u8; 32]], points: &[[u8; 32]]) -> Vec<[u8; 32]> {
    let mut input = PassInput::pack(Op::Share, scalars, points);
    core::hint::black_box(&mut input);
    let mut out = vec![[0u8; 32]; points.len().min(LANES)];
    unpack(&input.u, &mut out);
    input.zeroize();
    out
}

/// A clamped scalar as 64 signed radix-16 digits in [-8, 8] (k = sum d_i
/// 16^i), for the fixed-base table: each digit is recentred with a carry into
/// the next, by arithmetic shifts, not branches. The top digit is at most
/// 7 + 1, since a clamped scalar is below 2^255.
#[cfg(target_arch = "x86_64")]
fn signed_digits(k: &[u8; 32]) -> [i64; 64] {
    let mut d = [0i64; 64];
    for (i, &b) in k.iter().enumerate() {
        d[2 * i] = (b & 15) as i64;
        d[2 * i + 1] = (b >> 4) as i64;
    }
    let mut carry = 0i64;
    for di in d.iter_mut().take(63) {
        *di += carry;
        carry = (*di + 8) >> 4;
        *di -= carry << 4;
    }
    d[63] += carry;
    d
}

/// Little-endian bytes -> five radix-2^52 limbs, bit 255 cleared.
#[cfg(target_arch = "x86_64")]
fn to_limbs52(b: &[u8; 32]) -> [u64; 5] {
    const M: u64 = (1 << 52) - 1;
    let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let (w0, w1, w2, w3) = (w(0), w(1), w(2), w(3));
    [
        w0 & M,
        ((w0 >> 52) | (w1 << 12)) & M,
        ((w1 >> 40) | (w2 << 24)) & M,
        ((w2 >> 28) | (w3 << 36)) & M,
        (w3 >> 16) & ((1 << 47) - 1),
    ]
}

/// Canonical radix-2^52 limbs (< p) -> little-endian bytes.
#[cfg(target_arch = "x86_64")]
fn from_limbs52(l: &[u64; 5]) -> [u8; 32] {
    let words = [
        l[0] | (l[1] << 52),
        (l[1] >> 12) | (l[2] << 40),
        (l[2] >> 24) | (l[3] << 28),
        (l[3] >> 36) | (l[4] << 16),
    ];
    let mut out = [0u8; 32];
    for (i, w) in words.iter().enumerate() {
        out[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}
