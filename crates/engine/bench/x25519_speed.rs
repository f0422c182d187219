//! Time of one X25519 server key share (key generation + agreement) per
//! kernel, against BoringSSL (`X25519_keypair` + `X25519`, what its TLS
//! stack runs inline) and aws-lc-rs (ephemeral key, public value,
//! agreement), on one thread. Last, the AVX2 prototype (`x25519_avx2.rs`, not
//! an engine kernel), checked against aws-lc-rs first.
//!
//!     cargo run --release -p tlsterm-engine --features avx2-x25519-prototype \
//!         --example x25519_speed [SECONDS]
//!
//! Times are the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall
//! time, so that other processes on a shared machine do not count; each
//! figure is the best of 5 rounds.

#[path = "cpu_time.rs"]
mod cpu_time;
#[cfg(target_arch = "x86_64")]
#[path = "x25519_avx2.rs"]
mod x25519_avx2;

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
    let private = aws_lc_rs::agreement::PrivateKey::from_private_key(
        &aws_lc_rs::agreement::X25519,
        &peer_priv,
    )
    .unwrap();
    let awslc_mult = per_share(secs, 1, || {
        aws_lc_rs::agreement::agree(
            &private,
            aws_lc_rs::agreement::UnparsedPublicKey::new(&aws_lc_rs::agreement::X25519, &peer),
            (),
            |s| {
                std::hint::black_box(s);
                Ok(())
            },
        )
        .unwrap();
    });
    println!("aws-lc-rs     X25519 one scalar multiplication: {awslc_mult:7.2} us");

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
    #[cfg(target_arch = "x86_64")]
    avx2_prototype(secs, [boring, awslc, awslc_mult], &peer_priv, &peer);
}

/// The AVX2 prototype's rows: a server share and one scalar multiplication per
/// lane of a 4-lane pass, against `reference` = [BoringSSL share, aws-lc-rs
/// share, aws-lc-rs scalar multiplication].
#[cfg(target_arch = "x86_64")]
fn avx2_prototype(secs: f64, reference: [f64; 3], scalar: &[u8; 32], peer: &[u8; 32]) {
    let [boring, awslc, awslc_mult] = reference;
    if !x25519_avx2::available() {
        println!("avx2 prototype skipped: this CPU lacks AVX2");
        return;
    }
    x25519_avx2::check_against_aws_lc();
    let table = x25519_avx2::table();
    let peers = [*peer; 4];
    let t = per_share(secs, 4, || {
        let mut fresh = [[0u8; 32]; 4];
        getrandom::getrandom(fresh.as_flattened_mut()).unwrap();
        std::hint::black_box(x25519_avx2::server_share(&table, &fresh, &peers));
    });
    println!(
        "avx2 prototype X25519 server share: {t:7.2} us (batch of 4; {:.2}x BoringSSL, {:.2}x aws-lc-rs)",
        boring / t,
        awslc / t
    );
    let t = per_share(secs, 4, || {
        std::hint::black_box(x25519_avx2::x25519(&[*scalar; 4], &peers));
    });
    println!(
        "avx2 prototype X25519 one scalar multiplication: {t:7.2} us (batch of 4; {:.2}x aws-lc-rs)",
        awslc_mult / t
    );
}
