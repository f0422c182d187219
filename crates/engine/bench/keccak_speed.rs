//! Time of one Keccak-f[1600] permutation per state: the eight-state AVX-512 prototype
//! (`keccak_x8.rs`, not an engine kernel), a portable one-state permutation, and aws-lc's
//! SHA3-256 (as aws-lc-rs computes it, hashing 136-byte blocks: one permutation each, with
//! its absorbing). Both permutations are first checked against aws-lc's SHA3-256 of random
//! messages shorter than a block (one padded block, one permutation).
//!
//!     cargo run --release -p tlsterm-engine --example keccak_speed [SECONDS]
//!
//! Times are the thread's CPU time, each figure the best of 5 rounds (`cpu_time.rs`).

#[path = "cpu_time.rs"]
mod cpu_time;
#[path = "keccak_x8.rs"]
mod keccak_x8;

use aws_lc_rs::digest;

/// SHA3-256's rate in bytes.
const RATE: usize = 136;

/// A message shorter than a block, padded for SHA3-256 and absorbed into a fresh state.
fn padded(message: &[u8]) -> [u64; 25] {
    assert!(message.len() < RATE);
    let mut block = [0u8; RATE];
    block[..message.len()].copy_from_slice(message);
    block[message.len()] ^= 0x06;
    block[RATE - 1] ^= 0x80;
    let mut state = [0u64; 25];
    for (word, bytes) in state.iter_mut().zip(block.chunks_exact(8)) {
        *word = u64::from_le_bytes(bytes.try_into().unwrap());
    }
    state
}

/// SHA3-256's output: the permuted state's first 32 bytes.
fn digest_of(state: &[u64; 25]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (bytes, word) in out.chunks_exact_mut(8).zip(state) {
        bytes.copy_from_slice(&word.to_le_bytes());
    }
    out
}

fn random_message(len: usize) -> Vec<u8> {
    let mut message = vec![0u8; len];
    getrandom::getrandom(&mut message).unwrap();
    message
}

fn check() {
    for len in [0, 1, 31, 32, 100, RATE - 1] {
        let messages: [Vec<u8>; 8] = core::array::from_fn(|_| random_message(len));
        let expected: Vec<[u8; 32]> = messages
            .iter()
            .map(|m| {
                digest::digest(&digest::SHA3_256, m)
                    .as_ref()
                    .try_into()
                    .unwrap()
            })
            .collect();
        for (m, want) in messages.iter().zip(&expected) {
            let mut state = padded(m);
            keccak_x8::permute(&mut state);
            assert_eq!(&digest_of(&state), want, "portable");
        }
        #[cfg(target_arch = "x86_64")]
        if keccak_x8::avx512::available() {
            // The eight padded states through one call, each compared with its digest.
            let mut states: [[u64; 25]; 8] = core::array::from_fn(|l| padded(&messages[l]));
            keccak_x8::avx512::permute8(&mut states);
            for (state, want) in states.iter().zip(&expected) {
                assert_eq!(&digest_of(state), want, "AVX-512, eight states");
            }
        }
    }
}

fn main() {
    let secs = cpu_time::seconds_arg();
    check();
    println!("Keccak-f[1600]: checked against aws-lc's SHA3-256; µs per permutation of one state");
    let mut state = [0u64; 25];
    let portable = cpu_time::per_op(secs, 1, || keccak_x8::permute(&mut state));
    println!("portable reference, one state  {portable:8.3}   (written for checking, not speed)");
    let blocks = vec![0xA5u8; RATE * 64 - 1];
    let aws_lc = cpu_time::per_op(secs, 64, || {
        std::hint::black_box(digest::digest(&digest::SHA3_256, &blocks));
    });
    println!("aws-lc SHA3-256, per block     {aws_lc:8.3}");
    #[cfg(target_arch = "x86_64")]
    if keccak_x8::avx512::available() {
        let mut states = [[0u64; 25]; 8];
        let x8 = cpu_time::per_op(secs, 8, || keccak_x8::avx512::permute8(&mut states));
        println!(
            "AVX-512 prototype, 8 states    {x8:8.3}   ({:.2}x aws-lc; transposed in and out)",
            aws_lc / x8
        );
        // SAFETY: all-zero bits are a valid __m512i.
        let mut words: [core::arch::x86_64::__m512i; 25] = unsafe { core::mem::zeroed() };
        let kept = cpu_time::per_op(secs, 8, || keccak_x8::avx512::permute8_words(&mut words));
        println!(
            "AVX-512 prototype, 8 states    {kept:8.3}   ({:.2}x aws-lc; kept in its layout)",
            aws_lc / kept
        );
    } else {
        println!("AVX-512 prototype: skipped, this CPU lacks AVX-512F");
    }
}
