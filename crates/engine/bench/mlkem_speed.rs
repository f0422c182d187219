//! Time of one ML-KEM-768 encapsulation (the server's half of X25519MLKEM768)
//! per kernel, eight per batch, against aws-lc-rs (`EncapsulationKey::
//! encapsulate`, what tlsterm calls without the engine) and BoringSSL's
//! `MLKEM768_encap` (what its TLS stack runs inline), on one thread. Each
//! encapsulation of the engine is first checked by decapsulating it with
//! aws-lc.
//!
//!     cargo run --release -p tlsterm-engine --example mlkem_speed [SECONDS]
//!
//! Times are the thread's CPU time, each figure the best of 5 rounds.

#[path = "cpu_time.rs"]
mod cpu_time;
#[path = "mlkem_clients.rs"]
mod mlkem_clients;

use aws_lc_rs::kem::{EncapsulationKey, ML_KEM_768};
use cpu_time::per_op;
use tlsterm_engine::*;

fn main() {
    let secs = cpu_time::seconds_arg();
    let clients = mlkem_clients::clients(8);
    let keys: Vec<&[u8]> = clients.iter().map(|(_, ek)| &ek[..]).collect();

    let aws = per_op(secs, 8, || {
        for key in &keys {
            let ek = EncapsulationKey::new(&ML_KEM_768, key).unwrap();
            std::hint::black_box(ek.encapsulate().unwrap());
        }
    });
    println!("aws-lc-rs              ML-KEM-768 encapsulation: {aws:7.2} us");

    let boring_keys: Vec<_> = keys
        .iter()
        .map(|k| {
            boring::mlkem::MlKemPublicKey::from_slice(boring::mlkem::Algorithm::MlKem768, k)
                .unwrap()
        })
        .collect();
    let boring = per_op(secs, 8, || {
        for key in &boring_keys {
            std::hint::black_box(key.encapsulate().unwrap());
        }
    });
    println!("boringssl              ML-KEM-768 encapsulation: {boring:7.2} us");

    for kernel in MlKemKernel::ALL {
        if !kernel.is_available() {
            println!("engine {:<15} skipped: this CPU lacks it", kernel.name());
            continue;
        }
        for ((dk, _), result) in clients
            .iter()
            .zip(mlkem768_encapsulate_batch(kernel, &keys))
        {
            let e = result.unwrap();
            let secret = dk.decapsulate(e.ciphertext[..].into()).unwrap();
            assert_eq!(secret.as_ref(), &e.secret[..], "decapsulated by aws-lc");
        }
        for batch in [1, 8] {
            let t = per_op(secs, batch, || {
                std::hint::black_box(mlkem768_encapsulate_batch(kernel, &keys[..batch]));
            });
            println!(
                "engine {:<9} batch {batch}  ML-KEM-768 encapsulation: {t:7.2} us  ({:.2}x aws-lc-rs)",
                kernel.name(),
                aws / t
            );
        }
    }
}
