//! ML-KEM-768 clients for the engine's ML-KEM tests, benchmark and constant-time harness:
//! aws-lc key pairs, whose decapsulation checks the engine's encapsulations.

use aws_lc_rs::kem::{AlgorithmId, DecapsulationKey, ML_KEM_768};

/// `n` fresh clients: each one's decapsulation key, and its encapsulation key's bytes
/// (the client's share).
pub fn clients(n: usize) -> Vec<(DecapsulationKey<AlgorithmId>, Vec<u8>)> {
    (0..n)
        .map(|_| {
            let dk = DecapsulationKey::generate(&ML_KEM_768).expect("ML-KEM-768 key");
            let ek = dk.encapsulation_key().expect("its encapsulation key");
            let bytes = ek.key_bytes().expect("its bytes").as_ref().to_vec();
            (dk, bytes)
        })
        .collect()
}
