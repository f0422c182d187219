//! The sponges against aws-lc's SHA-3 and RustCrypto's SHAKE, with both permutations, over
//! lengths on both sides of each rate.

use super::*;
use aws_lc_rs::digest;

fn random(len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    getrandom::getrandom(&mut m).unwrap();
    m
}

fn permutations() -> Vec<Permutation> {
    [Permutation::Avx512, Permutation::Portable]
        .into_iter()
        .filter(|p| p.is_available())
        .collect()
}

#[test]
fn sha3_matches_aws_lc() {
    for (sponge, algorithm, out_len) in [
        (SHA3_256, &digest::SHA3_256, 32),
        (SHA3_512, &digest::SHA3_512, 64),
    ] {
        for len in [0, 1, 33, 64, 71, 72, 73, 135, 136, 137, 1184] {
            let messages: Vec<Vec<u8>> = (0..LANES).map(|_| random(len)).collect();
            for permutation in permutations() {
                let state = State8::absorb(
                    sponge,
                    permutation,
                    core::array::from_fn(|l| &messages[l][..]),
                );
                for (lane, message) in messages.iter().enumerate() {
                    let mut out = vec![0u8; out_len];
                    state.read(lane, &mut out);
                    let want = digest::digest(algorithm, message);
                    assert_eq!(
                        out,
                        want.as_ref(),
                        "{permutation:?}, {len} bytes, lane {lane}"
                    );
                }
            }
        }
    }
}

/// SHAKE's later blocks too: three blocks squeezed, compared with RustCrypto's
/// `sha3` output of that length.
#[test]
fn shake_matches_aws_lc() {
    use sha3::digest::{ExtendableOutput, Update, XofReader};
    fn reference(sponge: Sponge, message: &[u8], out: &mut [u8]) {
        if sponge == SHAKE128 {
            sha3::Shake128::default()
                .chain(message)
                .finalize_xof()
                .read(out);
        } else {
            sha3::Shake256::default()
                .chain(message)
                .finalize_xof()
                .read(out);
        }
    }
    for sponge in [SHAKE128, SHAKE256] {
        for len in [0, 33, 34, 167, 168, 200] {
            let messages: Vec<Vec<u8>> = (0..LANES).map(|_| random(len)).collect();
            for permutation in permutations() {
                let mut state = State8::absorb(
                    sponge,
                    permutation,
                    core::array::from_fn(|l| &messages[l][..]),
                );
                let rate = state.rate();
                let mut outputs = vec![Vec::new(); LANES];
                for block in 0..3 {
                    if block > 0 {
                        state.permute();
                    }
                    for (lane, output) in outputs.iter_mut().enumerate() {
                        let mut out = vec![0u8; rate];
                        state.read(lane, &mut out);
                        output.extend_from_slice(&out);
                    }
                }
                for (message, output) in messages.iter().zip(&outputs) {
                    let mut want = vec![0u8; 3 * rate];
                    reference(sponge, message, &mut want);
                    assert_eq!(output, &want, "{permutation:?}, {len} bytes");
                }
            }
        }
    }
}
