//! ML-KEM-768 encapsulation (FIPS 203) in batches: the server's half of the
//! X25519MLKEM768 key exchange for eight connections at once.
//!
//! Eight encapsulations share every step: their hashes run in the eight
//! lanes of the Keccak states (`keccak/`: one AVX-512 permutation for eight
//! states, or the portable one eight times) and their polynomial arithmetic
//! in the eight lanes of [`poly::Poly8`]. A short batch is padded with
//! dummy lanes. The result of each lane is the ciphertext for the client and
//! the 32-byte shared secret.
//!
//! Constant time: the random message, the seed derived from it, the noise and
//! the shared secret never decide a branch or an address. The encapsulation
//! key, the public matrix expanded from it (rejection sampling reads public
//! bytes only) and the ciphertext are public.
//!
//! No long-term secret takes part in an encapsulation, so a fault can only
//! give the client a ciphertext it decapsulates to another key (ML-KEM's
//! implicit rejection): that handshake fails its Finished check. The tests
//! check every result by decapsulating it with aws-lc.

mod poly;
#[cfg(target_arch = "x86_64")]
mod sample_avx512;

use crate::bn::LANES;
use crate::keccak::{Permutation, State8, SHA3_256, SHA3_512, SHAKE128, SHAKE256};
use crate::EngineError;
use core::cell::RefCell;
use poly::{Poly8, N, Q};
use zeroize::{Zeroize, Zeroizing};

/// Bytes of an ML-KEM-768 encapsulation key (the client's share).
pub const MLKEM768_ENCAPSULATION_KEY_LEN: usize = 1184;
/// Bytes of an ML-KEM-768 ciphertext (the server's share).
pub const MLKEM768_CIPHERTEXT_LEN: usize = 1088;

/// The module rank of ML-KEM-768.
const K: usize = 3;
/// Bytes of the compressed `u` (10 bits per coefficient) in a ciphertext.
const U_BYTES: usize = K * 320;

/// One encapsulation: the ciphertext for the client and the shared secret.
pub struct MlKemEncapsulation {
    /// The ciphertext (the server's key share).
    pub ciphertext: Box<[u8; MLKEM768_CIPHERTEXT_LEN]>,
    /// The shared secret (zeroized on drop).
    pub secret: Zeroizing<[u8; 32]>,
}

impl core::fmt::Debug for MlKemEncapsulation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The shared secret is never printed.
        f.debug_struct("MlKemEncapsulation").finish_non_exhaustive()
    }
}

/// Which kernel computes a batch of encapsulations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlKemKernel {
    /// The eight lanes' Keccak in zmm registers (AVX-512F), their arithmetic
    /// compiled for AVX2 and AVX-512F.
    Avx512,
    /// Portable Rust: the same lanes, one Keccak state at a time.
    Portable,
}

impl MlKemKernel {
    /// Every kernel, fastest first.
    pub const ALL: [MlKemKernel; 2] = [MlKemKernel::Avx512, MlKemKernel::Portable];

    /// The fastest kernel this CPU supports.
    pub fn detect() -> MlKemKernel {
        MlKemKernel::ALL
            .into_iter()
            .find(|k| k.is_available())
            .unwrap_or(MlKemKernel::Portable)
    }

    /// Whether this CPU can run the kernel (detected at run time).
    pub fn is_available(self) -> bool {
        match self {
            MlKemKernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            MlKemKernel::Avx512 => {
                Permutation::Avx512.is_available() && is_x86_feature_detected!("avx2")
            }
            #[cfg(not(target_arch = "x86_64"))]
            MlKemKernel::Avx512 => false,
        }
    }

    /// The kernel's name in configuration and logs (`avx512f`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            MlKemKernel::Avx512 => "avx512f",
            MlKemKernel::Portable => "portable",
        }
    }

    fn permutation(self) -> Permutation {
        match self {
            MlKemKernel::Avx512 => Permutation::Avx512,
            MlKemKernel::Portable => Permutation::Portable,
        }
    }
}

/// For each client key: a fresh random message (zeroized after use) and its
/// encapsulation, ML-KEM.Encaps of FIPS 203. A key that fails the modulus
/// check (a coefficient of q or more) or has the wrong length gives
/// [`EngineError::InvalidPeerKey`], the others are unaffected. Any number of
/// keys, eight per pass.
pub fn mlkem768_encapsulate_batch(
    kernel: MlKemKernel,
    keys: &[&[u8]],
) -> Vec<Result<MlKemEncapsulation, EngineError>> {
    encapsulate_with(kernel, keys, |messages| {
        getrandom::getrandom(messages.as_flattened_mut()).map_err(|_| EngineError::Rng)
    })
}

/// Test hook (feature `test-hooks`): the encapsulations with the given
/// messages instead of random ones (`messages[i]` for `keys[i]`), for known
/// answers and the comparison of kernels.
#[cfg(feature = "test-hooks")]
pub fn mlkem768_encapsulate_deterministic(
    kernel: MlKemKernel,
    keys: &[&[u8]],
    messages: &[[u8; 32]],
) -> Vec<Result<MlKemEncapsulation, EngineError>> {
    assert_eq!(keys.len(), messages.len());
    let mut next = messages.chunks(LANES);
    encapsulate_with(kernel, keys, |out| {
        let chunk = next.next().expect("one chunk per pass");
        out[..chunk.len()].copy_from_slice(chunk);
        Ok(())
    })
}

fn encapsulate_with(
    kernel: MlKemKernel,
    keys: &[&[u8]],
    mut draw: impl FnMut(&mut [[u8; 32]; LANES]) -> Result<(), EngineError>,
) -> Vec<Result<MlKemEncapsulation, EngineError>> {
    if !kernel.is_available() {
        return keys
            .iter()
            .map(|_| Err(EngineError::KernelUnavailable))
            .collect();
    }
    thread_local! {
        // One pass's scratch (about 100 KiB: eleven polynomials of 8 KiB and the
        // sampling lists), kept by the thread between batches rather than
        // allocated, zeroed and moved each time.
        static SCRATCH: RefCell<Option<Box<Scratch>>> = const { RefCell::new(None) };
    }
    let mut out = Vec::with_capacity(keys.len());
    SCRATCH.with(|cell| {
        let mut slot = cell.borrow_mut();
        let scratch = slot.get_or_insert_with(|| Box::new(Scratch::new()));
        for group in keys.chunks(LANES) {
            let mut messages = Zeroizing::new([[0u8; 32]; LANES]);
            if let Err(e) = draw(&mut messages) {
                out.extend(group.iter().map(|_| Err(e.clone())));
                continue;
            }
            crate::ct::mark_secret(&messages[..]);
            out.extend(encapsulate_pass(kernel, scratch, group, &messages));
            scratch.zeroize_secrets();
        }
    });
    out
}

/// The polynomials of one pass (eight lanes). Those derived from the secret
/// message are zeroized after each pass, all of them when dropped.
#[derive(Zeroize)]
#[zeroize(drop)]
struct Scratch {
    /// The key's t-hat, in the NTT domain (public).
    t: [Poly8; K],
    /// The noise y, then its NTT.
    y: [Poly8; K],
    /// The noise e1[i] added to u[i], then e2 added to v.
    noise: Poly8,
    /// One row of the transposed public matrix (public).
    row: [Poly8; K],
    /// u[i], then v.
    acc: Poly8,
    /// Each lane's accepted matrix coefficients while sampling (public).
    candidates: [[i32; CANDIDATES]; LANES],
}

/// Room for a lane's accepted coefficients: a block adds at most 112 to the
/// 255 of a lane not yet full, and the AVX-512 path stores 16 at a time.
const CANDIDATES: usize = N + 112 + 16;

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            t: [Poly8::ZERO, Poly8::ZERO, Poly8::ZERO],
            y: [Poly8::ZERO, Poly8::ZERO, Poly8::ZERO],
            noise: Poly8::ZERO,
            row: [Poly8::ZERO, Poly8::ZERO, Poly8::ZERO],
            acc: Poly8::ZERO,
            candidates: [[0; CANDIDATES]; LANES],
        }
    }

    fn zeroize_secrets(&mut self) {
        self.y.zeroize();
        self.noise.zeroize();
        self.acc.zeroize();
    }
}

/// Up to eight encapsulations with their messages (lane `l` of `messages`
/// for `keys[l]`).
fn encapsulate_pass(
    kernel: MlKemKernel,
    s: &mut Scratch,
    keys: &[&[u8]],
    messages: &[[u8; 32]; LANES],
) -> Vec<Result<MlKemEncapsulation, EngineError>> {
    // Keys that fail their checks, and the lanes past the batch, compute on
    // the all-zero key (valid: t-hat = 0, rho = 0); their results are dropped.
    const ZERO_KEY: [u8; MLKEM768_ENCAPSULATION_KEY_LEN] = [0; MLKEM768_ENCAPSULATION_KEY_LEN];
    let mut valid = [false; LANES];
    let mut lane_keys = [&ZERO_KEY[..]; LANES];
    for (l, (lane_key, valid)) in lane_keys.iter_mut().zip(valid.iter_mut()).enumerate() {
        let key = keys.get(l).copied();
        let key = key.filter(|k| k.len() == MLKEM768_ENCAPSULATION_KEY_LEN);
        let mut ok = key.is_some();
        let key = key.unwrap_or(&ZERO_KEY[..]);
        for (i, t) in s.t.iter_mut().enumerate() {
            ok &= poly::decode12(t, l, &key[384 * i..384 * (i + 1)]);
        }
        if ok {
            *lane_key = key;
        } else {
            for t in s.t.iter_mut() {
                poly::decode12(t, l, &ZERO_KEY[..384]);
            }
        }
        *valid = ok;
    }

    let permutation = kernel.permutation();
    // (K, r) = G(m || H(ek)).
    let h = State8::absorb(SHA3_256, permutation, lane_keys);
    let mut g_input = Zeroizing::new([[0u8; 64]; LANES]);
    for (l, input) in g_input.iter_mut().enumerate() {
        input[..32].copy_from_slice(&messages[l]);
        h.read(l, &mut input[32..]);
    }
    let g = State8::absorb(
        SHA3_512,
        permutation,
        core::array::from_fn(|l| &g_input[l][..]),
    );
    let mut kr = Zeroizing::new([[0u8; 64]; LANES]);
    for (l, out) in kr.iter_mut().enumerate() {
        g.read(l, out);
    }
    drop(g);

    let mut seeds = Zeroizing::new([[0u8; 32]; LANES]);
    for (seed, kr) in seeds.iter_mut().zip(kr.iter()) {
        seed.copy_from_slice(&kr[32..]);
    }

    let mut ciphertexts = vec![[0u8; MLKEM768_CIPHERTEXT_LEN]; LANES];
    let rho: [&[u8]; LANES] = core::array::from_fn(|l| &lane_keys[l][384 * K..]);
    arithmetic(kernel, s, messages, &seeds, &rho, &mut ciphertexts);

    let mut out = Vec::with_capacity(keys.len());
    for l in 0..keys.len() {
        crate::ct::declassify(&ciphertexts[l][..]);
        out.push(if valid[l] {
            let mut secret = Zeroizing::new([0u8; 32]);
            secret.copy_from_slice(&kr[l][..32]);
            Ok(MlKemEncapsulation {
                ciphertext: Box::new(ciphertexts[l]),
                secret,
            })
        } else {
            Err(EngineError::InvalidPeerKey)
        });
    }
    out
}

/// K-PKE.Encrypt (FIPS 203 algorithm 14) once the seed `r` of each lane is
/// known: the noise y, e1, e2 from it, u = NTT^-1(A^T y-hat) + e1,
/// v = NTT^-1(t-hat^T y-hat) + e2 + Decompress1(m), compressed into the
/// ciphertexts.
fn arithmetic(
    kernel: MlKemKernel,
    s: &mut Scratch,
    messages: &[[u8; 32]; LANES],
    seeds: &[[u8; 32]; LANES],
    rho: &[&[u8]; LANES],
    ciphertexts: &mut [[u8; MLKEM768_CIPHERTEXT_LEN]],
) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: this kernel is only chosen where AVX2 and AVX-512F are present
        // (`is_available`).
        MlKemKernel::Avx512 => unsafe {
            arithmetic_avx512(kernel, s, messages, seeds, rho, ciphertexts)
        },
        _ => arithmetic_lanes(kernel, s, messages, seeds, rho, ciphertexts),
    }
}

/// [`arithmetic_lanes`] compiled for AVX2 and AVX-512F: each lane-wise step on
/// eight 32-bit coefficients is one ymm instruction, the NTT's butterflies on
/// sixteen one zmm instruction. The arguments stay separate pointers, not a
/// struct of them: the static constant-time check (`ct/avx512_branches.py`)
/// counts a pointer loaded from memory as data.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn arithmetic_avx512(
    kernel: MlKemKernel,
    s: &mut Scratch,
    messages: &[[u8; 32]; LANES],
    seeds: &[[u8; 32]; LANES],
    rho: &[&[u8]; LANES],
    ciphertexts: &mut [[u8; MLKEM768_CIPHERTEXT_LEN]],
) {
    arithmetic_lanes(kernel, s, messages, seeds, rho, ciphertexts);
}

#[inline(always)]
fn arithmetic_lanes(
    kernel: MlKemKernel,
    s: &mut Scratch,
    messages: &[[u8; 32]; LANES],
    seeds: &[[u8; 32]; LANES],
    rho: &[&[u8]; LANES],
    ciphertexts: &mut [[u8; MLKEM768_CIPHERTEXT_LEN]],
) {
    for (n, y) in (0u8..).zip(s.y.iter_mut()) {
        sample_noise(kernel, y, seeds, n);
        poly::ntt(y);
    }
    for i in 0..K {
        for (j, row) in s.row.iter_mut().enumerate() {
            sample_ntt(kernel, row, &mut s.candidates, rho, i as u8, j as u8);
        }
        poly::multiply_accumulate(&mut s.acc, &s.row, &s.y);
        poly::inverse_ntt(&mut s.acc);
        sample_noise(kernel, &mut s.noise, seeds, (K + i) as u8);
        poly::add(&mut s.acc, &s.noise);
        poly::reduce(&mut s.acc);
        poly::compress(&mut s.acc, poly::compress10);
        for (l, c) in ciphertexts.iter_mut().enumerate() {
            poly::pack10(&s.acc, l, &mut c[320 * i..320 * (i + 1)]);
        }
    }
    poly::multiply_accumulate(&mut s.acc, &s.t, &s.y);
    poly::inverse_ntt(&mut s.acc);
    sample_noise(kernel, &mut s.noise, seeds, (2 * K) as u8);
    poly::add(&mut s.acc, &s.noise);
    poly::add_message(&mut s.acc, messages);
    poly::reduce(&mut s.acc);
    poly::compress(&mut s.acc, poly::compress4);
    for (l, c) in ciphertexts.iter_mut().enumerate() {
        poly::pack4(&s.acc, l, &mut c[U_BYTES..]);
    }
}

/// Noise polynomial `n` of each lane: the centred binomial distribution
/// (eta = 2) of PRF(r, n) = SHAKE256(r || n), 128 bytes (FIPS 203 algorithms
/// 8 and 14). Secret: the bytes are only computed on.
#[inline(always)]
fn sample_noise(kernel: MlKemKernel, p: &mut Poly8, seeds: &[[u8; 32]; LANES], n: u8) {
    let inputs = Zeroizing::new(core::array::from_fn::<[u8; 33], LANES, _>(|l| {
        let mut input = [0u8; 33];
        input[..32].copy_from_slice(&seeds[l]);
        input[32] = n;
        input
    }));
    let prf = State8::absorb(
        SHAKE256,
        kernel.permutation(),
        core::array::from_fn(|l| &inputs[l][..]),
    );
    let mut bytes = Zeroizing::new([[0u8; 128]; LANES]);
    for (l, bytes) in bytes.iter_mut().enumerate() {
        prf.read(l, bytes);
    }
    poly::centred_binomial2(p, &bytes);
}

/// Entry (i, j) of the transposed public matrix for each lane, SampleNTT of
/// FIPS 203 (algorithm 7): SHAKE128(rho || i || j) read three bytes at a time
/// into two 12-bit candidates, those below q kept, until 256 are. The lanes
/// squeeze together until the last one has its 256. Only public bytes decide
/// here; kept out of line, so that the constant-time check of the arithmetic
/// it is called from (`ct/avx512_branches.py`) does not take its branches and
/// data-dependent stores for the arithmetic's own.
#[inline(never)]
fn sample_ntt(
    kernel: MlKemKernel,
    p: &mut Poly8,
    lists: &mut [[i32; CANDIDATES]; LANES],
    rho: &[&[u8]; LANES],
    i: u8,
    j: u8,
) {
    let inputs: [[u8; 34]; LANES] = core::array::from_fn(|l| {
        let mut input = [0u8; 34];
        input[..32].copy_from_slice(&rho[l][..32]);
        input[32] = i;
        input[33] = j;
        input
    });
    let mut xof = State8::absorb(
        SHAKE128,
        kernel.permutation(),
        core::array::from_fn(|l| &inputs[l][..]),
    );
    // Candidates are appended to each lane's list without a branch on their
    // value (written, then counted if below q).
    let mut filled = [0usize; LANES];
    let mut block = [0u8; crate::keccak::MAX_RATE];
    let rate = xof.rate();
    // The portable kernel keeps the scalar loop: the reference the tests compare with.
    #[cfg(target_arch = "x86_64")]
    let vector = kernel == MlKemKernel::Avx512 && sample_avx512::available();
    loop {
        for (l, (list, count)) in lists.iter_mut().zip(filled.iter_mut()).enumerate() {
            if *count == N {
                continue;
            }
            xof.read(l, &mut block[..rate]);
            #[cfg(target_arch = "x86_64")]
            if vector {
                *count = sample_avx512::append_candidates(&block[..rate], list, *count).min(N);
                continue;
            }
            let mut n = *count;
            for c in block[..rate].chunks_exact(3) {
                let [d0, d1] = poly::unpack12(c);
                let (keep0, keep1) = (usize::from(d0 < Q), usize::from(d1 < Q));
                list[n] = d0;
                list[n + keep0] = d1;
                n += keep0 + keep1;
            }
            *count = n.min(N);
        }
        if filled.iter().all(|&count| count == N) {
            break;
        }
        xof.permute();
    }
    for (i, c) in p.0.iter_mut().enumerate() {
        for (x, list) in c.iter_mut().zip(lists.iter()) {
            *x = list[i];
        }
    }
}

#[cfg(test)]
mod tests;
