//! Time of one ECDSA P-256 signature (SHA-256, a 64-byte message, DER
//! output) per kernel, against BoringSSL (`EVP_DigestSign`, what its TLS
//! stack runs inline) and aws-lc-rs (`EcdsaKeyPair::sign`), on one thread.
//!
//!     cargo run --release -p tlsterm-engine --example p256_speed [SECONDS]
//!
//! Times are the thread's CPU time, not wall time, so that other processes on
//! a shared machine do not count; each figure is the best of 5 rounds.

#[path = "cpu_time.rs"]
mod cpu_time;

use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::PKey;
use cpu_time::per_op;
use tlsterm_engine::*;

fn main() {
    let secs = cpu_time::seconds_arg();
    let message = [0x42u8; 64];
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    let ec = EcKey::generate(&group).unwrap();
    let scalar = ec.private_key().to_vec_padded(32).unwrap();
    let pkey = PKey::from_ec_key(ec).unwrap();

    let boring = per_op(secs, 1, || {
        let mut signer = boring::sign::Signer::new(MessageDigest::sha256(), &pkey).unwrap();
        signer.update(&message).unwrap();
        std::hint::black_box(signer.sign_to_vec().unwrap());
    });
    println!("boringssl     ECDSA P-256 signature: {boring:7.2} us");

    let rng = aws_lc_rs::rand::SystemRandom::new();
    let aws_key = {
        use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let k = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
        std::hint::black_box(k.public_key());
        k
    };
    let awslc = per_op(secs, 1, || {
        std::hint::black_box(aws_key.sign(&rng, &message).unwrap());
    });
    println!(
        "aws-lc-rs     ECDSA P-256 signature: {awslc:7.2} us ({:.2}x BoringSSL)",
        boring / awslc
    );

    let key = EcdsaP256Key::from_private_scalar(&scalar).unwrap();
    for kernel in P256Kernel::ALL {
        if !kernel.is_available() {
            println!("{:13} skipped: this CPU lacks it", kernel.name());
            continue;
        }
        let batches: &[usize] = if kernel.lanes() > 1 {
            &[1, 4, 8, 64]
        } else {
            &[1]
        };
        for &n in batches {
            let reqs: Vec<EcdsaRequest<'_>> = (0..n)
                .map(|_| EcdsaRequest {
                    key: &key,
                    hash: Hash::Sha256,
                    message: &message,
                })
                .collect();
            let t = per_op(secs, n, || {
                let r = ecdsa_p256_sign_batch(kernel, &reqs);
                assert!(r.iter().all(|s| s.is_ok()));
                std::hint::black_box(r);
            });
            println!(
                "{:13} ECDSA P-256 signature: {t:7.2} us (batch of {n}; {:.2}x BoringSSL, {:.2}x aws-lc-rs)",
                kernel.name(),
                boring / t,
                awslc / t
            );
        }
    }
}
