//! Encapsulations checked by decapsulating them with aws-lc, the kernels
//! against each other, and keys that must be refused.

use super::*;

#[path = "../../bench/mlkem_clients.rs"]
mod mlkem_clients;
use mlkem_clients::clients as client_keys;

fn kernels() -> Vec<MlKemKernel> {
    MlKemKernel::ALL
        .into_iter()
        .filter(|k| k.is_available())
        .collect()
}

/// Eleven keys (a full pass and a short one): each ciphertext decapsulates,
/// with the client's key, to the secret the engine returned.
#[test]
fn aws_lc_decapsulates_to_our_secret() {
    let clients = client_keys(11);
    let keys: Vec<&[u8]> = clients.iter().map(|(_, ek)| &ek[..]).collect();
    for kernel in kernels() {
        let results = mlkem768_encapsulate_batch(kernel, &keys);
        assert_eq!(results.len(), keys.len());
        for ((dk, _), result) in clients.iter().zip(results) {
            let encapsulation = result.unwrap();
            let secret = dk.decapsulate(encapsulation.ciphertext[..].into()).unwrap();
            assert_eq!(
                secret.as_ref(),
                &encapsulation.secret[..],
                "{}",
                kernel.name()
            );
        }
    }
}

/// With the same messages every kernel gives the same bytes, and a lane's
/// result does not depend on the batch it was computed in.
#[test]
fn kernels_and_batch_sizes_agree() {
    let clients = client_keys(9);
    let keys: Vec<&[u8]> = clients.iter().map(|(_, ek)| &ek[..]).collect();
    let messages: Vec<[u8; 32]> = (0..keys.len() as u8)
        .map(|i| [i.wrapping_mul(37); 32])
        .collect();
    let reference: Vec<_> =
        mlkem768_encapsulate_deterministic(MlKemKernel::Portable, &keys, &messages)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
    for kernel in kernels() {
        let batch = mlkem768_encapsulate_deterministic(kernel, &keys, &messages);
        for (want, got) in reference.iter().zip(batch) {
            let got = got.unwrap();
            assert_eq!(want.ciphertext, got.ciphertext, "{}", kernel.name());
            assert_eq!(want.secret, got.secret, "{}", kernel.name());
        }
        let alone = mlkem768_encapsulate_deterministic(kernel, &keys[3..4], &messages[3..4]);
        assert_eq!(
            alone[0].as_ref().unwrap().ciphertext,
            reference[3].ciphertext
        );
    }
}

/// A coefficient of q or more, or a key of the wrong length, is refused; the
/// lanes beside it are computed as usual.
#[test]
fn bad_keys_are_refused_alone() {
    let clients = client_keys(3);
    let mut over_q = clients[1].1.clone();
    // The first coefficient of t-hat is the low 12 bits of the first two bytes.
    over_q[0] = 0x01;
    over_q[1] = (over_q[1] & 0xf0) | 0x0d; // 0xd01 = 3329 = q
    let short = &clients[2].1[..MLKEM768_ENCAPSULATION_KEY_LEN - 1];
    let keys: Vec<&[u8]> = vec![&clients[0].1, &over_q, short, &clients[2].1];
    for kernel in kernels() {
        let results = mlkem768_encapsulate_batch(kernel, &keys);
        assert_eq!(
            results[1].as_ref().err(),
            Some(&EngineError::InvalidPeerKey)
        );
        assert_eq!(
            results[2].as_ref().err(),
            Some(&EngineError::InvalidPeerKey)
        );
        for (client, result) in [(&clients[0], &results[0]), (&clients[2], &results[3])] {
            let encapsulation = result.as_ref().unwrap();
            let secret = client
                .0
                .decapsulate(encapsulation.ciphertext[..].into())
                .unwrap();
            assert_eq!(secret.as_ref(), &encapsulation.secret[..]);
        }
    }
}
