//! Multi-buffer RSA private-key engine, and batched X25519 key shares.
//!
//! Signs batches of RSA requests (PKCS#1 v1.5 or PSS, 2048/3072/4096-bit
//! keys, keys may differ within a batch) with 8 modular exponentiations at a
//! time in the 64-bit lanes of SIMD registers: AVX-512 IFMA (`ifma.rs`, 8
//! lanes per zmm, or 4 per ymm for a pass of 1 or 2 signatures), or 32-bit
//! multiplies with AVX-512F (8 lanes per zmm) or AVX2 (two halves of 4 lanes
//! per ymm) (`mul32/`), with a portable constant-time kernel (`kernel.rs`) as
//! the reference the tests compare them with. Every signature is checked with
//! the public key before it is returned.
//!
//! X25519 key shares (`x25519/`) and ECDSA P-256 signatures (`p256/`) are
//! batched the same way: 8 scalar multiplications per pass with AVX-512
//! IFMA, or a portable constant-time kernel, the reference the tests compare
//! it with (`curve_kernel.rs`: the choice between the two). Every P-256
//! signature is fault-checked before it is returned.
//!
//! ML-KEM-768 encapsulations (`mlkem/`, the post-quantum half of the
//! X25519MLKEM768 key share) are batched 8 per pass too: their Keccak in the
//! lanes of zmm registers (`keccak/`), their polynomial arithmetic lane-wise.
//!
//! `unsafe` appears only in the SIMD kernels (`ifma.rs`, `mul32/`,
//! `x25519/ifma.rs`, `p256/ifma.rs`, `keccak/avx512.rs`, the AVX2/AVX-512
//! build of `mlkem/`'s arithmetic, the curve kernels' loads and stores in
//! `zmm.rs`) and in the constant-time check's hooks (`ct.rs`: the
//! valgrind client requests of the optional `ct-valgrind` feature, and the
//! volatile read back of a declassified value).
//!
//! The feature `test-hooks` (off by default) exports what this crate's own
//! tests, the constant-time harness (`ct/`), fuzzing and the benchmarks need
//! beyond the API: `ct`, `microbench`, the `*_with_fault` functions,
//! `pss_encode_with_salt`, `x25519_base_batch`, `x25519_base_table`,
//! `x25519_signed_digits`, the `ct_mark_secret` methods and the `ct_*_lanes`
//! functions. They are not a stable API.

#![warn(missing_docs)]

mod bn;
#[cfg(feature = "test-hooks")]
pub mod ct;
#[cfg(not(feature = "test-hooks"))]
mod ct;
mod curve_kernel;
mod exp;
#[cfg(target_arch = "x86_64")]
mod ifma;
#[cfg(target_arch = "x86_64")]
mod mul32;
#[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
pub use ifma::planted_select;
#[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
pub use keccak::planted_permute_unless_zero;
#[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
pub use mul32::planted_mac;
#[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
pub use p256::planted_select_p256;
#[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
pub use x25519::planted_cswap;
mod keccak;
mod kernel;
#[cfg(feature = "test-hooks")]
pub mod microbench;
mod mlkem;
mod p256;
mod padding;
mod rsa;
#[cfg(test)]
mod tests;
mod x25519;
#[cfg(target_arch = "x86_64")]
mod zmm;

pub use curve_kernel::CurveKernel;
#[cfg(feature = "test-hooks")]
pub use mlkem::mlkem768_encapsulate_deterministic;
pub use mlkem::{
    mlkem768_encapsulate_batch, MlKemEncapsulation, MlKemKernel, MLKEM768_CIPHERTEXT_LEN,
    MLKEM768_ENCAPSULATION_KEY_LEN,
};
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub use p256::ct_p256_ifma_lanes;
#[cfg(feature = "test-hooks")]
pub use p256::ecdsa_p256_sign_batch_with_fault;
pub use p256::{ecdsa_p256_sign_batch, EcdsaP256Key, EcdsaRequest, P256Kernel};
pub use padding::{Hash, RsaPadding};
pub use rsa::{RsaComponents, RsaPrivateKey};
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub use x25519::ct_ifma_lanes;
#[cfg(feature = "test-hooks")]
pub use x25519::x25519_base_batch;
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub use x25519::{x25519_base_table, x25519_signed_digits};
pub use x25519::{x25519_batch, x25519_server_shares, X25519Kernel, X25519Share};

use kernel::{MontKernel, Portable};

// The README's example compiles as a doc test, so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Signatures that fill one multi-buffer pass: each signature takes two
/// lanes (its mod-p and mod-q exponentiations), and a pass has 8 lanes.
/// `sign_batch` accepts any number; 8 saves a little more, since the
/// public-key check pass then also runs full.
pub const MAX_BATCH: usize = 4;

/// Lanes of one pass (exponentiations computed together).
pub const LANES: usize = bn::LANES;

/// Errors of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// Modulus size (bits) other than 2048, 3072 or 4096.
    UnsupportedKeySize(usize),
    /// Components that do not form a supported key (RSA or P-256).
    InvalidKey(&'static str),
    /// The encoding does not fit the modulus.
    MessageTooLong,
    /// A raw input longer than the modulus or not below it.
    InputOutOfRange,
    /// The result failed its fault check (RSA: the public-key check, s^e mod
    /// n != input; ECDSA: see `p256/mod.rs`) and was discarded.
    FaultDetected,
    /// The requested kernel needs CPU features this machine lacks.
    KernelUnavailable,
    /// The system random generator failed (PSS salt, X25519 private key).
    Rng,
    /// The X25519 shared secret with this peer's share is all zero (a point
    /// of small order): refused, as RFC 7748 section 6.1 allows.
    InvalidPeerKey,
}

impl core::fmt::Display for EngineError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EngineError::UnsupportedKeySize(b) => write!(f, "unsupported RSA key size: {b} bits"),
            EngineError::InvalidKey(why) => write!(f, "invalid key: {why}"),
            EngineError::MessageTooLong => write!(f, "message too long for the modulus"),
            EngineError::InputOutOfRange => write!(f, "RSA input out of range"),
            EngineError::FaultDetected => write!(f, "result failed its fault check"),
            EngineError::KernelUnavailable => write!(f, "kernel not available on this CPU"),
            EngineError::Rng => write!(f, "random number generator failed"),
            EngineError::InvalidPeerKey => write!(f, "X25519 peer share gives an all-zero secret"),
        }
    }
}

impl std::error::Error for EngineError {}

/// Which arithmetic kernel computes a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512 IFMA, 8 lanes per zmm register.
    Ifma,
    /// AVX-512F without IFMA, 8 lanes per zmm register (`vpmuludq`; the AVX2
    /// kernel's limbs and schedule at twice the width).
    Avx512,
    /// AVX2, 4 lanes per ymm register (`vpmuludq`; 29, 28 or 26-bit limbs by key size).
    Avx2,
    /// Portable constant-time Rust (u64 limbs, u128 products).
    Portable,
}

impl Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Kernel; 4] = [Kernel::Ifma, Kernel::Avx512, Kernel::Avx2, Kernel::Portable];

    /// The fastest kernel this CPU supports (the portable one when it has
    /// none of IFMA, AVX-512F and AVX2).
    pub fn detect() -> Kernel {
        Kernel::ALL
            .into_iter()
            .find(|k| k.is_available())
            .unwrap_or(Kernel::Portable)
    }

    /// The SIMD kernels this CPU supports, fastest first (empty without IFMA,
    /// AVX-512F and AVX2).
    pub fn simd_available() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.is_simd() && k.is_available())
            .collect()
    }

    /// Whether this is a multi-buffer SIMD kernel (faster than signing one at a
    /// time); the portable kernel is a reference, slower than BoringSSL.
    pub fn is_simd(self) -> bool {
        !matches!(self, Kernel::Portable)
    }

    /// Whether this CPU can run the kernel (detected at run time).
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Ifma => ifma::Ifma::new(LANES).is_some(),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => mul32::Avx512::detected(),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => mul32::Avx2::detected(),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Ifma | Kernel::Avx512 | Kernel::Avx2 => false,
        }
    }

    /// The kernel's name in configuration and logs (`avx512ifma`, `avx512f`,
    /// `avx2`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Ifma => "avx512ifma",
            Kernel::Avx512 => "avx512f",
            Kernel::Avx2 => "avx2",
            Kernel::Portable => "portable",
        }
    }

    /// The kernel with this name (as `name` gives it).
    pub fn from_name(name: &str) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One signature to compute.
pub struct SignRequest<'a> {
    /// The key to sign with.
    pub key: &'a RsaPrivateKey,
    /// The signature scheme (PKCS#1 v1.5 or PSS) and its hash.
    pub padding: RsaPadding,
    /// The full data to sign; the engine hashes it.
    pub message: &'a [u8],
}

/// Signs every request (keys and sizes may differ; requests are grouped by
/// size and computed in multi-buffer passes). Every signature is verified
/// with the public key; a mismatch gives [`EngineError::FaultDetected`].
/// Results are in request order, each the modulus-length big-endian
/// signature or the error of that request alone.
///
/// # Example
///
/// ```
/// use tlsterm_engine::{sign_batch, Hash, Kernel, RsaComponents, RsaPadding, RsaPrivateKey, SignRequest};
///
/// # fn load() -> [Vec<u8>; 8] {
/// #     let r = boring::rsa::Rsa::generate(2048).unwrap();
/// #     [r.n(), r.e(), r.d(), r.p().unwrap(), r.q().unwrap(), r.dmp1().unwrap(),
/// #      r.dmq1().unwrap(), r.iqmp().unwrap()].map(|x| x.to_vec())
/// # }
/// // The big-endian components of a 2048-bit key, e.g. from a PKCS#1 file.
/// let [n, e, d, p, q, dp, dq, qinv] = load();
/// let key = RsaPrivateKey::from_components(&RsaComponents {
///     n: &n, e: &e, d: &d, p: &p, q: &q, dp: &dp, dq: &dq, qinv: &qinv,
/// })?;
/// let requests = [
///     SignRequest { key: &key, padding: RsaPadding::Pss(Hash::Sha256), message: b"first" },
///     SignRequest { key: &key, padding: RsaPadding::Pkcs1v15(Hash::Sha384), message: b"second" },
/// ];
/// // The fastest kernel this CPU runs (the portable one at worst).
/// let kernel = Kernel::detect();
/// for signature in sign_batch(kernel, &requests) {
///     assert_eq!(signature?.len(), key.modulus_len());
/// }
/// # Ok::<(), tlsterm_engine::EngineError>(())
/// ```
pub fn sign_batch(kernel: Kernel, reqs: &[SignRequest<'_>]) -> Vec<Result<Vec<u8>, EngineError>> {
    let encoded: Vec<Result<Vec<u8>, EngineError>> = reqs
        .iter()
        .map(|r| padding::encode(r.padding, r.message, r.key.modulus_bits()))
        .collect();
    let (mut keys, mut inputs, mut idx) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (r, em)) in reqs.iter().zip(&encoded).enumerate() {
        if let Ok(em) = em {
            keys.push(r.key);
            inputs.push(em.as_slice());
            idx.push(i);
        }
    }
    let mut raw = rsa_private_batch(kernel, &keys, &inputs).into_iter();
    let mut out: Vec<Result<Vec<u8>, EngineError>> = encoded;
    for i in idx {
        out[i] = raw.next().expect("one result per input");
    }
    out
}

/// The raw private operation `input^d mod n` (CRT), batched like
/// [`sign_batch`]: `inputs[i]` (big-endian, below the modulus) with
/// `keys[i]`. Results are modulus-length big-endian and checked with the
/// public key.
///
/// # Panics
///
/// If `keys` and `inputs` differ in length.
pub fn rsa_private_batch(
    kernel: Kernel,
    keys: &[&RsaPrivateKey],
    inputs: &[&[u8]],
) -> Vec<Result<Vec<u8>, EngineError>> {
    private_batch_impl(kernel, keys, inputs, None)
}

/// Test hook (feature `test-hooks`): like [`rsa_private_batch`], but
/// corrupts the CRT result of request `fault_index` before the public-key
/// check (which must catch it).
#[cfg(feature = "test-hooks")]
pub fn rsa_private_batch_with_fault(
    kernel: Kernel,
    keys: &[&RsaPrivateKey],
    inputs: &[&[u8]],
    fault_index: usize,
) -> Vec<Result<Vec<u8>, EngineError>> {
    private_batch_impl(kernel, keys, inputs, Some(fault_index))
}

/// Test hook (feature `test-hooks`): PSS encoding with a caller-chosen
/// salt, for known-answer tests.
#[cfg(feature = "test-hooks")]
pub fn pss_encode_with_salt(
    hash: Hash,
    message: &[u8],
    salt: &[u8],
    mod_bits: usize,
) -> Result<Vec<u8>, EngineError> {
    padding::pss_encode_with_salt(hash, message, salt, mod_bits)
}

/// Encodes a message as `sign_batch` does (PSS with a random salt).
pub fn encode_message(
    padding: RsaPadding,
    message: &[u8],
    mod_bits: usize,
) -> Result<Vec<u8>, EngineError> {
    padding::encode(padding, message, mod_bits)
}

fn private_batch_impl(
    kernel: Kernel,
    keys: &[&RsaPrivateKey],
    inputs: &[&[u8]],
    fault: Option<usize>,
) -> Vec<Result<Vec<u8>, EngineError>> {
    assert_eq!(keys.len(), inputs.len(), "one input per key");
    let mut out: Vec<Result<Vec<u8>, EngineError>> =
        vec![Err(EngineError::KernelUnavailable); keys.len()];
    if !kernel.is_available() {
        return out;
    }
    // Group by key size, keeping request order within a group.
    for bits in [2048, 3072, 4096] {
        let (mut gk, mut gi, mut gidx) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (key, input)) in keys.iter().zip(inputs).enumerate() {
            if key.modulus_bits() != bits {
                continue;
            }
            match key.parse_input(input) {
                Ok(c) => {
                    gk.push(*key);
                    gi.push(c);
                    gidx.push(i);
                }
                Err(e) => out[i] = Err(e),
            }
        }
        if gk.is_empty() {
            continue;
        }
        let gfault = fault.and_then(|f| gidx.iter().position(|&i| i == f));
        let res = match kernel {
            #[cfg(target_arch = "x86_64")]
            Kernel::Ifma => run_size(
                &|lanes| ifma::Ifma::new(lanes).expect("checked above"),
                bits,
                &gk,
                &gi,
                gfault,
            ),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => run_size(
                &|lanes| mul32::Avx512::new(lanes).expect("checked above"),
                bits,
                &gk,
                &gi,
                gfault,
            ),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => run_size(
                &|lanes| mul32::Avx2::new(lanes).expect("checked above"),
                bits,
                &gk,
                &gi,
                gfault,
            ),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Ifma | Kernel::Avx512 | Kernel::Avx2 => unreachable!("checked above"),
            Kernel::Portable => run_size(&|lanes| Portable { lanes }, bits, &gk, &gi, gfault),
        };
        for (i, r) in gidx.into_iter().zip(res) {
            out[i] = r;
        }
    }
    out
}

/// One monomorphized pipeline per key size: 20/30/40 limbs per CRT half.
fn run_size<K: MontKernel>(
    make: &dyn Fn(usize) -> K,
    bits: usize,
    keys: &[&RsaPrivateKey],
    inputs: &[Vec<u64>],
    fault: Option<usize>,
) -> Vec<Result<Vec<u8>, EngineError>> {
    match bits {
        2048 => rsa::private_batch::<K, 20, 40>(make, keys, inputs, fault),
        3072 => rsa::private_batch::<K, 30, 60>(make, keys, inputs, fault),
        4096 => rsa::private_batch::<K, 40, 80>(make, keys, inputs, fault),
        _ => unreachable!("sizes are checked at key construction"),
    }
}
