//! Time of one X25519 server key share (key generation + agreement) per
//! kernel, against BoringSSL (`X25519_keypair` + `X25519`, what its TLS
//! stack runs inline) and aws-lc-rs (ephemeral key, public value,
//! agreement), on one thread.
//!
//!     cargo run --release -p tlsterm-engine --example x25519_speed [SECONDS]
//!
//! Times are the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall
//! time, so that other processes on a shared machine do not count; each
//! figure is the best of 5 rounds.

#[path = "cpu_time.rs"]
mod cpu_time;

use cpu_time::per_op as per_share;
use tlsterm_engine::*;

fn main() {
    let secs = cpu_time::seconds_arg();
    let mut peer_priv = [0u8; 32];
    getrandom::getrandom(&mut peer_priv).unwrap();
    let mut nine = [0u8; 32];
    nine[0] = 9;
    let peer = x25519_batch(X25519Kernel::Portable, &[peer_priv], &[nine])[0];

    let boring = per_share(secs, 1, || {
        let (mut public, mut private, mut shared) = ([0u8; 32], [0u8; 32], [0u8; 32]);
        // SAFETY: both functions write/read 32-byte buffers, all live arrays.
        unsafe {
            boring_sys::X25519_keypair(public.as_mut_ptr(), private.as_mut_ptr());
            assert_eq!(
                boring_sys::X25519(shared.as_mut_ptr(), private.as_ptr(), peer.as_ptr()),
                1
            );
        }
        std::hint::black_box((public, shared));
    });
    println!("boringssl     X25519 server share: {boring:7.2} us");

    let rng = aws_lc_rs::rand::SystemRandom::new();
    let awslc = per_share(secs, 1, || {
        use aws_lc_rs::agreement;
        let key = agreement::EphemeralPrivateKey::generate(&agreement::X25519, &rng).unwrap();
        let public = key.compute_public_key().unwrap();
        std::hint::black_box(public.as_ref());
        agreement::agree_ephemeral(
            key,
            agreement::UnparsedPublicKey::new(&agreement::X25519, &peer),
            (),
            |s| {
                std::hint::black_box(s);
                Ok(())
            },
        )
        .unwrap();
    });
    println!(
        "aws-lc-rs     X25519 server share: {awslc:7.2} us ({:.2}x BoringSSL)",
        boring / awslc
    );

    for kernel in X25519Kernel::ALL {
        if !kernel.is_available() {
            println!("{:13} skipped: this CPU lacks it", kernel.name());
            continue;
        }
        let batches: &[usize] = if kernel.lanes() > 1 {
            &[1, 2, 3, 4, 8, 64]
        } else {
            &[1]
        };
        for &n in batches {
            let peers = vec![peer; n];
            let t = per_share(secs, n, || {
                let r = x25519_server_shares(kernel, &peers);
                assert!(r.iter().all(|s| s.is_ok()));
                std::hint::black_box(r);
            });
            println!(
                "{:13} X25519 server share: {t:7.2} us (batch of {n}; {:.2}x BoringSSL, {:.2}x aws-lc-rs)",
                kernel.name(),
                boring / t,
                awslc / t
            );
        }
        let n = kernel.lanes();
        let (ks, us) = (vec![peer_priv; n], vec![peer; n]);
        let t = per_share(secs, n, || {
            std::hint::black_box(x25519_batch(kernel, &ks, &us));
        });
        println!(
            "{:13} X25519 one scalar multiplication: {t:7.2} us (batch of {n})",
            kernel.name()
        );
    }
}
