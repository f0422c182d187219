//! X25519 (RFC 7748) for every kernel the CPU has: the RFC's vectors
//! (section 5.2, including the iterated test, and the section 6.1
//! Diffie-Hellman example), Wycheproof's x25519 vectors (low-order and
//! non-canonical points, twist points, edge cases of the arithmetic), the
//! refusal of an all-zero shared secret, and a differential test of the IFMA
//! and portable kernels against BoringSSL and aws-lc-rs on random inputs and
//! every batch size from 1 to 17.
//!
//! A kernel the CPU lacks is skipped with a printed line, by name.

use proptest::prelude::*;
use tlsterm_engine::*;

fn unhex32(s: &str) -> [u8; 32] {
    let v: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect();
    v.try_into().expect("32 bytes")
}

/// The kernels this CPU runs; prints a line for each one skipped.
fn kernels(test: &str) -> Vec<X25519Kernel> {
    X25519Kernel::ALL
        .into_iter()
        .filter(|k| {
            let ok = k.is_available();
            if !ok {
                println!("{test}: kernel {} skipped: this CPU lacks it", k.name());
            }
            ok
        })
        .collect()
}

/// BoringSSL's X25519 (the output is returned even when BoringSSL reports the
/// all-zero result as an error).
fn boring_x25519(k: &[u8; 32], u: &[u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    // SAFETY: X25519 reads 32 bytes from each input and writes 32 to `out`,
    // all of which are live 32-byte arrays.
    unsafe { boring_sys::X25519(out.as_mut_ptr(), k.as_ptr(), u.as_ptr()) };
    out
}

/// aws-lc-rs's X25519; `None` where it refuses (all-zero result).
fn awslc_x25519(k: &[u8; 32], u: &[u8; 32]) -> Option<[u8; 32]> {
    use aws_lc_rs::agreement;
    let key = agreement::PrivateKey::from_private_key(&agreement::X25519, k).unwrap();
    agreement::agree(
        &key,
        agreement::UnparsedPublicKey::new(&agreement::X25519, u),
        (),
        |s| Ok(<[u8; 32]>::try_from(s).unwrap()),
    )
    .ok()
}

const RFC_5_2: [(&str, &str, &str); 2] = [
    (
        "a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
        "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
        "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552",
    ),
    (
        "4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
        "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
        "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957",
    ),
];

#[test]
fn rfc7748_section_5_2_vectors() {
    for kernel in kernels("rfc7748_section_5_2_vectors") {
        let scalars: Vec<_> = RFC_5_2.iter().map(|v| unhex32(v.0)).collect();
        let points: Vec<_> = RFC_5_2.iter().map(|v| unhex32(v.1)).collect();
        let out = x25519_batch(kernel, &scalars, &points);
        for (o, v) in out.iter().zip(RFC_5_2) {
            assert_eq!(*o, unhex32(v.2), "kernel {}", kernel.name());
        }
    }
}

/// Section 5.2's iterated test: k = X25519(k, u), u = the old k, from k = u = 9.
fn iterate(kernel: X25519Kernel, n: usize) -> [u8; 32] {
    let (mut k, mut u) = ([0u8; 32], [0u8; 32]);
    k[0] = 9;
    u[0] = 9;
    for _ in 0..n {
        let r = x25519_batch(kernel, &[k], &[u])[0];
        u = k;
        k = r;
    }
    k
}

#[test]
fn rfc7748_iterated_1_and_1000() {
    for kernel in kernels("rfc7748_iterated_1_and_1000") {
        assert_eq!(
            iterate(kernel, 1),
            unhex32("422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079"),
            "kernel {}",
            kernel.name()
        );
        assert_eq!(
            iterate(kernel, 1000),
            unhex32("684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51"),
            "kernel {}",
            kernel.name()
        );
    }
}

/// The million iterations (minutes with the portable kernel): run by hand.
#[test]
#[ignore]
fn rfc7748_iterated_1_000_000() {
    for kernel in kernels("rfc7748_iterated_1_000_000") {
        assert_eq!(
            iterate(kernel, 1_000_000),
            unhex32("7c3911e0ab2586fd864497297e575e6f3bc601c0883c30df5f4dd2d24f665424"),
            "kernel {}",
            kernel.name()
        );
    }
}

#[test]
fn rfc7748_section_6_1_diffie_hellman() {
    let alice = unhex32("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
    let alice_pub = unhex32("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
    let bob = unhex32("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
    let bob_pub = unhex32("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
    let shared = unhex32("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
    let mut nine = [0u8; 32];
    nine[0] = 9;
    for kernel in kernels("rfc7748_section_6_1_diffie_hellman") {
        let out = x25519_batch(
            kernel,
            &[alice, bob, alice, bob],
            &[nine, nine, bob_pub, alice_pub],
        );
        assert_eq!(
            out,
            vec![alice_pub, bob_pub, shared, shared],
            "kernel {}",
            kernel.name()
        );
    }
}

struct Vector {
    id: u64,
    private: [u8; 32],
    public: [u8; 32],
    shared: [u8; 32],
    flags: Vec<String>,
}

fn wycheproof() -> Vec<Vector> {
    let path = format!(
        "{}/tests/data/wycheproof_x25519_test.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for group in doc["testGroups"].as_array().unwrap() {
        assert_eq!(group["curve"], "curve25519");
        for t in group["tests"].as_array().unwrap() {
            // Every x25519 vector is "valid" or "acceptable": the function is
            // defined on all 32-byte inputs.
            assert_ne!(t["result"], "invalid");
            out.push(Vector {
                id: t["tcId"].as_u64().unwrap(),
                private: unhex32(t["private"].as_str().unwrap()),
                public: unhex32(t["public"].as_str().unwrap()),
                shared: unhex32(t["shared"].as_str().unwrap()),
                flags: t["flags"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| f.as_str().unwrap().to_owned())
                    .collect(),
            });
        }
    }
    out
}

#[test]
fn wycheproof_x25519_vectors() {
    let vectors = wycheproof();
    assert!(vectors.len() >= 500, "{} vectors", vectors.len());
    let has = |flag: &str| {
        vectors
            .iter()
            .filter(|v| v.flags.iter().any(|f| f == flag))
            .count()
    };
    // The classes this test is here for.
    assert!(has("LowOrderPublic") > 0 && has("NonCanonicalPublic") > 0 && has("Twist") > 0);
    assert!(has("ZeroSharedSecret") > 0);
    let scalars: Vec<_> = vectors.iter().map(|v| v.private).collect();
    let points: Vec<_> = vectors.iter().map(|v| v.public).collect();
    for kernel in kernels("wycheproof_x25519_vectors") {
        let out = x25519_batch(kernel, &scalars, &points);
        for (o, v) in out.iter().zip(&vectors) {
            assert_eq!(
                *o,
                v.shared,
                "tcId {} {:?}, kernel {}",
                v.id,
                v.flags,
                kernel.name()
            );
        }
        eprintln!(
            "wycheproof_x25519_vectors: {} vectors pass with kernel {}",
            vectors.len(),
            kernel.name()
        );
    }
}

/// The server refuses a peer share whose shared secret is all zero (every
/// low-order point from Wycheproof, with a fresh scalar), lane by lane: the
/// good peers of the same batch get their share, which a client holding the
/// peer's private key agrees with.
#[test]
fn server_shares_refuse_all_zero_secret() {
    let low_order: Vec<[u8; 32]> = {
        let mut v: Vec<_> = wycheproof()
            .into_iter()
            .filter(|v| v.flags.iter().any(|f| f == "ZeroSharedSecret"))
            .map(|v| v.public)
            .collect();
        v.sort();
        v.dedup();
        v
    };
    assert!(
        low_order.len() >= 10,
        "{} low-order points",
        low_order.len()
    );
    for kernel in kernels("server_shares_refuse_all_zero_secret") {
        // Interleave good and low-order peers: 2 good for each bad one.
        let mut peers = Vec::new();
        let mut clients = Vec::new();
        for (i, lo) in low_order.iter().enumerate() {
            for j in 0..2u8 {
                let mut priv_ = [0u8; 32];
                priv_[0] = i as u8;
                priv_[1] = j;
                priv_[2] = 0x5a;
                let public = x25519_batch(X25519Kernel::Portable, &[priv_], &[base()])[0];
                clients.push(Some(priv_));
                peers.push(public);
            }
            clients.push(None);
            peers.push(*lo);
        }
        let shares = x25519_server_shares(kernel, &peers);
        assert_eq!(shares.len(), peers.len());
        for (share, client) in shares.iter().zip(&clients) {
            match client {
                None => assert_eq!(share.as_ref().unwrap_err(), &EngineError::InvalidPeerKey),
                Some(priv_) => {
                    let share = share.as_ref().expect("a good peer gets its share");
                    assert_eq!(boring_x25519(priv_, &share.public), *share.shared);
                    assert_ne!(*share.shared, [0u8; 32]);
                }
            }
        }
    }
}

fn base() -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0] = 9;
    b
}

/// Fresh shares are fresh: two calls, and two lanes of one call, never repeat
/// a public value.
#[test]
fn server_shares_are_fresh() {
    for kernel in kernels("server_shares_are_fresh") {
        let peers = vec![base(); 9];
        let mut seen: Vec<[u8; 32]> = Vec::new();
        for _ in 0..2 {
            for s in x25519_server_shares(kernel, &peers) {
                seen.push(s.unwrap().public);
            }
        }
        let n = seen.len();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), n, "kernel {}", kernel.name());
    }
}

/// Every batch size from 1 to 17 (one, two and three IFMA passes, full and
/// partial), deterministic inputs: raw results, key generation and server
/// shares of every kernel agree with BoringSSL.
#[test]
fn every_batch_size_1_to_17() {
    let mut s = 0x0123_4567_89ab_cdefu64;
    let mut bytes = || -> [u8; 32] {
        core::array::from_fn(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
    };
    for kernel in kernels("every_batch_size_1_to_17") {
        for n in 1..=17 {
            let scalars: Vec<_> = (0..n).map(|_| bytes()).collect();
            let points: Vec<_> = (0..n).map(|_| bytes()).collect();
            let expect: Vec<_> = scalars
                .iter()
                .zip(&points)
                .map(|(k, u)| boring_x25519(k, u))
                .collect();
            assert_eq!(
                x25519_batch(kernel, &scalars, &points),
                expect,
                "n {n}, kernel {}",
                kernel.name()
            );
            let expect: Vec<_> = scalars.iter().map(|k| boring_x25519(k, &base())).collect();
            assert_eq!(
                x25519_base_batch(kernel, &scalars),
                expect,
                "n {n}, kernel {}",
                kernel.name()
            );
            let peers: Vec<_> = scalars.iter().map(|k| boring_x25519(k, &base())).collect();
            let shares = x25519_server_shares(kernel, &peers);
            assert_eq!(shares.len(), n);
            for (sh, k) in shares.iter().zip(&scalars) {
                let sh = sh.as_ref().unwrap();
                assert_eq!(
                    boring_x25519(k, &sh.public),
                    *sh.shared,
                    "n {n}, kernel {}",
                    kernel.name()
                );
            }
        }
    }
}

fn arb_batch() -> impl Strategy<Value = Vec<([u8; 32], [u8; 32])>> {
    prop::collection::vec((any::<[u8; 32]>(), any::<[u8; 32]>()), 1..=17)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random scalars and points (including non-canonical ones and bit 255
    /// set, which random bytes hit), batch sizes 1..=17: every kernel agrees
    /// with BoringSSL and aws-lc-rs.
    #[test]
    fn differential_vs_boringssl_and_aws_lc(batch in arb_batch()) {
        let scalars: Vec<_> = batch.iter().map(|b| b.0).collect();
        let points: Vec<_> = batch.iter().map(|b| b.1).collect();
        let expect: Vec<_> = batch.iter().map(|(k, u)| boring_x25519(k, u)).collect();
        for (e, (k, u)) in expect.iter().zip(&batch) {
            prop_assert_eq!(awslc_x25519(k, u), Some(*e));
        }
        for kernel in X25519Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            prop_assert_eq!(&x25519_batch(kernel, &scalars, &points), &expect, "kernel {}", kernel.name());
        }
    }

    /// The key generation path (IFMA: fixed-base table; portable: ladder)
    /// agrees with BoringSSL's X25519(k, 9) on random scalars, batch sizes
    /// 1..=17 (the edge digits: scalars with all nibbles 8 or 0xf are below).
    #[test]
    fn key_generation_vs_boringssl(scalars in prop::collection::vec(any::<[u8; 32]>(), 1..=17)) {
        let expect: Vec<_> = scalars.iter().map(|k| boring_x25519(k, &base())).collect();
        for kernel in X25519Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            prop_assert_eq!(&x25519_base_batch(kernel, &scalars), &expect, "kernel {}", kernel.name());
        }
    }

    /// Server shares of every batch size 1..=17: BoringSSL, as the client,
    /// derives the same secret from our public value.
    #[test]
    fn server_shares_agree_with_boringssl(clients in prop::collection::vec(any::<[u8; 32]>(), 1..=17)) {
        let peers: Vec<_> = clients.iter().map(|c| boring_x25519(c, &base())).collect();
        for kernel in X25519Kernel::ALL.into_iter().filter(|k| k.is_available()) {
            let shares = x25519_server_shares(kernel, &peers);
            prop_assert_eq!(shares.len(), peers.len());
            for (s, c) in shares.iter().zip(&clients) {
                let s = s.as_ref().unwrap();
                prop_assert_eq!(boring_x25519(c, &s.public), *s.shared);
            }
        }
    }
}

/// Scalars whose signed radix-16 digits hit the ends of [-8, 8] and carry
/// through long runs (every nibble 8, every nibble 0xf, alternating, all
/// zero or all one bytes before clamping).
#[test]
fn key_generation_edge_digits() {
    let mut scalars: Vec<[u8; 32]> = [0x00, 0x88, 0xff, 0x8f, 0xf8, 0x78, 0x87, 0x77, 0x01]
        .iter()
        .map(|&b| [b; 32])
        .collect();
    for i in 0..32 {
        let mut k = [0u8; 32];
        k[i] = 0x80;
        scalars.push(k);
        let mut k = [0xffu8; 32];
        k[i] = 0x08;
        scalars.push(k);
    }
    let expect: Vec<_> = scalars.iter().map(|k| boring_x25519(k, &base())).collect();
    for kernel in kernels("key_generation_edge_digits") {
        assert_eq!(
            x25519_base_batch(kernel, &scalars),
            expect,
            "kernel {}",
            kernel.name()
        );
    }
}

/// The IFMA kernel is named in the output when it runs, and skipped by name
/// when the CPU lacks it.
#[test]
fn ifma_kernel_detected() {
    let k = X25519Kernel::Ifma;
    if !k.is_available() {
        println!("ifma_kernel_detected: kernel avx512ifma skipped: this CPU lacks it");
        assert_eq!(X25519Kernel::detect(), X25519Kernel::Portable);
        let r = x25519_server_shares(k, &[base()]);
        assert_eq!(r[0].as_ref().unwrap_err(), &EngineError::KernelUnavailable);
        return;
    }
    assert_eq!(X25519Kernel::detect(), X25519Kernel::Ifma);
    assert_eq!(X25519Kernel::from_name("avx512ifma"), Some(k));
    assert_eq!(k.name(), "avx512ifma");
    assert_eq!(X25519Kernel::Portable.name(), "portable");
}

/// `tlsterm speed x25519`'s timing helper runs every available kernel and
/// refuses the others.
#[test]
fn microbench_share_time() {
    for kernel in X25519Kernel::ALL {
        let r = microbench::x25519_share_time(kernel, 8, 2);
        if kernel.is_available() {
            assert!(r.unwrap() > std::time::Duration::ZERO);
        } else {
            println!(
                "microbench_share_time: kernel {} skipped: this CPU lacks it",
                kernel.name()
            );
            assert_eq!(r, Err(EngineError::KernelUnavailable));
        }
    }
}
