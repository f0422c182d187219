//! Keccak-f[1600] and its sponges (FIPS 202) for eight messages at once, the
//! hashing of a batch of ML-KEM encapsulations: word `i` of the eight states
//! is one [`Lanes`], so that with AVX-512F (`avx512.rs`) each word is one zmm
//! register and a permutation advances all eight states. Without AVX-512F the
//! portable permutation (below) runs the eight states one after another, the
//! reference the AVX-512 one is tested against.
//!
//! The eight messages of one absorb have the same length (in ML-KEM they do:
//! encapsulation keys, seeds with their indices), so every lane takes the same
//! path; states hold secrets (the noise seed, the shared key) and are zeroized
//! when dropped.

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
pub use avx512::planted_permute_unless_zero;

use crate::bn::{Lanes, LANES};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// The round constants (FIPS 202, the iota step).
const ROUND_CONSTANTS: [u64; 24] = [
    0x0000000000000001,
    0x0000000000008082,
    0x800000000000808a,
    0x8000000080008000,
    0x000000000000808b,
    0x0000000080000001,
    0x8000000080008081,
    0x8000000000008009,
    0x000000000000008a,
    0x0000000000000088,
    0x0000000080008009,
    0x000000008000000a,
    0x000000008000808b,
    0x800000000000008b,
    0x8000000000008089,
    0x8000000000008003,
    0x8000000000008002,
    0x8000000000000080,
    0x000000000000800a,
    0x800000008000000a,
    0x8000000080008081,
    0x8000000000008080,
    0x0000000080000001,
    0x8000000080008008,
];

/// The rho step's rotation of word `x + 5y`.
const ROTATIONS: [u32; 25] = [
    0, 1, 62, 28, 27, 36, 44, 6, 55, 20, 3, 10, 43, 25, 39, 41, 45, 15, 21, 8, 18, 2, 61, 56, 14,
];

/// Where the pi step moves word `x + 5y`: to `y + 5((2x + 3y) mod 5)`.
const fn pi_target(i: usize) -> usize {
    let (x, y) = (i % 5, i / 5);
    y + 5 * ((2 * x + 3 * y) % 5)
}

/// The permutation of one state, word `x + 5y` at index `x + 5y`: written to
/// be checked, not to be fast.
pub(crate) fn permute(a: &mut [u64; 25]) {
    for rc in ROUND_CONSTANTS {
        let mut c = [0u64; 5];
        for (x, c) in c.iter_mut().enumerate() {
            *c = a[x] ^ a[x + 5] ^ a[x + 10] ^ a[x + 15] ^ a[x + 20];
        }
        for x in 0..5 {
            let d = c[(x + 4) % 5] ^ c[(x + 1) % 5].rotate_left(1);
            for y in 0..5 {
                a[x + 5 * y] ^= d;
            }
        }
        let mut b = [0u64; 25];
        for (i, word) in a.iter().enumerate() {
            b[pi_target(i)] = word.rotate_left(ROTATIONS[i]);
        }
        for y in 0..5 {
            for x in 0..5 {
                a[x + 5 * y] = b[x + 5 * y] ^ (!b[(x + 1) % 5 + 5 * y] & b[(x + 2) % 5 + 5 * y]);
            }
        }
        a[0] ^= rc;
    }
}

/// A sponge function of FIPS 202: its rate in bytes and its domain padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sponge {
    rate: usize,
    pad: u8,
}

impl Sponge {
    const fn new(rate: usize, pad: u8) -> Sponge {
        Sponge { rate, pad }
    }
}

/// SHA3-256 (ML-KEM's H).
pub(crate) const SHA3_256: Sponge = Sponge::new(136, 0x06);
/// SHA3-512 (ML-KEM's G).
pub(crate) const SHA3_512: Sponge = Sponge::new(72, 0x06);
/// SHAKE128 (ML-KEM's XOF, which expands the public matrix).
pub(crate) const SHAKE128: Sponge = Sponge::new(168, 0x1f);
/// SHAKE256 (ML-KEM's PRF, which expands the noise).
pub(crate) const SHAKE256: Sponge = Sponge::new(136, 0x1f);

/// The largest rate (SHAKE128's): the most bytes one squeezed block has.
pub(crate) const MAX_RATE: usize = 168;

/// Which permutation advances the eight states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Permutation {
    /// AVX-512F: the eight states in the lanes of 25 zmm registers.
    Avx512,
    /// The portable permutation, one state after another.
    Portable,
}

impl Permutation {
    /// Whether this CPU runs it.
    pub(crate) fn is_available(self) -> bool {
        match self {
            Permutation::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Permutation::Avx512 => avx512::available(),
            #[cfg(not(target_arch = "x86_64"))]
            Permutation::Avx512 => false,
        }
    }
}

/// Eight sponge states of one function, word `i` of state `l` in
/// `words[i].0[l]`.
#[derive(Zeroize, ZeroizeOnDrop)]
pub(crate) struct State8 {
    words: [Lanes; 25],
    #[zeroize(skip)]
    sponge: Sponge,
    #[zeroize(skip)]
    permutation: Permutation,
}

impl State8 {
    /// Absorbs `messages[l]` into state `l` (all of one length), pads them
    /// and permutes: the first block of output is then ready for
    /// [`State8::read`].
    ///
    /// # Panics
    ///
    /// If the messages differ in length or the permutation is unavailable.
    pub(crate) fn absorb(
        sponge: Sponge,
        permutation: Permutation,
        messages: [&[u8]; LANES],
    ) -> State8 {
        assert!(permutation.is_available(), "Keccak permutation unavailable");
        let len = messages[0].len();
        assert!(
            messages.iter().all(|m| m.len() == len),
            "messages of one length"
        );
        let mut state = State8 {
            words: [Lanes::default(); 25],
            sponge,
            permutation,
        };
        let rate = sponge.rate;
        let mut offset = 0;
        loop {
            let take = (len - offset).min(rate);
            let last = take < rate;
            for (lane, message) in messages.iter().enumerate() {
                // XORed into the state word by word, no block buffer: these are
                // short, and a copy per lane and block cost more than the permutation
                // of a 34-byte SHAKE input.
                let bytes = &message[offset..offset + take];
                let words = bytes.chunks_exact(8);
                let tail = words.remainder();
                let full = words.len();
                for (word, chunk) in state.words.iter_mut().zip(words) {
                    word.0[lane] ^= u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
                }
                if last {
                    let mut partial = 0u64;
                    for (i, byte) in tail.iter().enumerate() {
                        partial |= u64::from(*byte) << (8 * i);
                    }
                    partial |= u64::from(sponge.pad) << (8 * tail.len());
                    state.words[full].0[lane] ^= partial;
                    state.words[rate / 8 - 1].0[lane] ^= 0x80 << 56;
                }
            }
            state.permute();
            offset += take;
            if last {
                break;
            }
        }
        state
    }

    /// Copies state `lane`'s current output block (the first `out.len()`
    /// bytes of it, at most the rate).
    pub(crate) fn read(&self, lane: usize, out: &mut [u8]) {
        assert!(out.len() <= self.sponge.rate);
        let full = out.len() / 8;
        let mut chunks = out.chunks_exact_mut(8);
        for (bytes, word) in (&mut chunks).zip(&self.words) {
            *<&mut [u8; 8]>::try_from(bytes).expect("8 bytes") = word.0[lane].to_le_bytes();
        }
        let tail = chunks.into_remainder();
        for (i, byte) in tail.iter_mut().enumerate() {
            *byte = (self.words[full].0[lane] >> (8 * i)) as u8;
        }
    }

    /// The rate: bytes per output block.
    pub(crate) fn rate(&self) -> usize {
        self.sponge.rate
    }

    /// Squeezes: the next output block of every state.
    pub(crate) fn permute(&mut self) {
        match self.permutation {
            #[cfg(target_arch = "x86_64")]
            Permutation::Avx512 => avx512::permute8(&mut self.words),
            #[cfg(not(target_arch = "x86_64"))]
            Permutation::Avx512 => unreachable!("checked when absorbing"),
            Permutation::Portable => {
                for lane in 0..LANES {
                    let mut one: [u64; 25] = core::array::from_fn(|i| self.words[i].0[lane]);
                    permute(&mut one);
                    for (word, value) in self.words.iter_mut().zip(&one) {
                        word.0[lane] = *value;
                    }
                    one.zeroize();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
