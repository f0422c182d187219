//! Constant-time check, run under valgrind memcheck by `ct/run.sh`.
//!
//! Every secret-derived field of the keys (p, q, dp, dq, qinv and the
//! Montgomery constants derived from p and q) is marked undefined; memcheck
//! then reports any conditional jump, memory address or variable-latency
//! operation input computed from them. The engine declassifies only the
//! signature after the public-key check.
//!
//! Modes: `sign [KERNEL]` (the real check: must be clean; KERNEL is `avx2` or
//! `portable`, default the best one valgrind can run), `keysetup` (the key
//! components are marked before `from_components` builds the key, which must
//! then be clean through signing), `x25519` (the portable X25519 kernel with
//! its scalars and points marked, raw and through the server's key shares,
//! and the IFMA pass's lane packing: must be clean), `p256` (the portable
//! P-256 signer with the private scalars and the nonce entropy marked,
//! through key setup, signing, the fault check and the IFMA pass's lane
//! packing: must be clean), `mlkem` (the portable ML-KEM-768 encapsulation,
//! its random messages marked inside the engine: must be clean),
//! `control-local`, `control-input`, `control-x25519`, `control-p256` and
//! `control-mlkem` (negative controls: must be reported, proving the marking
//! works and reaches the engine's code).

#[path = "../bench/mlkem_clients.rs"]
mod mlkem_clients;

use boring::rsa::Rsa;
use tlsterm_engine::*;

fn key(bits: u32) -> (Rsa<boring::pkey::Private>, RsaPrivateKey) {
    let r = Rsa::generate(bits).unwrap();
    let k = RsaPrivateKey::from_components(&RsaComponents {
        n: &r.n().to_vec(),
        e: &r.e().to_vec(),
        d: &r.d().to_vec(),
        p: &r.p().unwrap().to_vec(),
        q: &r.q().unwrap().to_vec(),
        dp: &r.dmp1().unwrap().to_vec(),
        dq: &r.dmq1().unwrap().to_vec(),
        qinv: &r.iqmp().unwrap().to_vec(),
    })
    .unwrap();
    (r, k)
}

/// Scalars and points for the X25519 modes: fixed pseudo-random bytes (the
/// first point has bit 255 set, the second is p + 9, non-canonical), and a
/// point of order 8 whose shared secret is all zero.
fn x25519_inputs() -> (Vec<[u8; 32]>, Vec<[u8; 32]>) {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut bytes = || {
        let mut b = [0u8; 32];
        for x in b.iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *x = s as u8;
        }
        b
    };
    let scalars: Vec<[u8; 32]> = (0..5).map(|_| bytes()).collect();
    let mut points: Vec<[u8; 32]> = (0..5).map(|_| bytes()).collect();
    points[0][31] |= 0x80;
    points[1] = [0xff; 32];
    points[1][0] = 0xf6;
    points[1][31] = 0x7f;
    points[2] = [0; 32];
    points[2][..8].copy_from_slice(&[0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae]);
    points[2][8..16].copy_from_slice(&[0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a]);
    points[2][16..24].copy_from_slice(&[0xda, 0x09, 0x8d, 0xeb, 0x9c, 0x32, 0xb1, 0xfd]);
    points[2][24..].copy_from_slice(&[0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00]);
    (scalars, points)
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "sign".into());
    if mode.contains("x25519") {
        return x25519_mode(&mode);
    }
    if mode.contains("p256") {
        return p256_mode(&mode);
    }
    if mode.contains("mlkem") {
        return mlkem_mode(&mode);
    }
    let kernel = match std::env::args().nth(2) {
        Some(name) => Kernel::from_name(&name).expect("kernel name"),
        None => Kernel::detect(),
    };
    assert!(
        kernel.is_available(),
        "kernel {} unavailable",
        kernel.name()
    );
    eprintln!("ct_check: mode {mode}, kernel {}", kernel.name());
    match mode.as_str() {
        "control-local" => {
            let secret = [std::process::id() as u64];
            ct::mark_secret(&secret);
            // black_box: read it back from memory, after the marking.
            if std::hint::black_box(&secret)[0] % 3 == 1 {
                println!("branch on a secret");
            }
        }
        "keysetup" => {
            let r = Rsa::generate(2048).unwrap();
            let parts = [
                r.d().to_vec(),
                r.p().unwrap().to_vec(),
                r.q().unwrap().to_vec(),
                r.dmp1().unwrap().to_vec(),
                r.dmq1().unwrap().to_vec(),
                r.iqmp().unwrap().to_vec(),
            ];
            for part in &parts {
                ct::mark_secret(part);
            }
            let [d, p, q, dp, dq, qinv] = &parts;
            let k = RsaPrivateKey::from_components(&RsaComponents {
                n: &r.n().to_vec(),
                e: &r.e().to_vec(),
                d,
                p,
                q,
                dp,
                dq,
                qinv,
            })
            .expect("valid key");
            let msg = [1u8; 40];
            let req = SignRequest {
                key: &k,
                padding: RsaPadding::Pkcs1v15(Hash::Sha256),
                message: &msg,
            };
            assert!(sign_batch(kernel, &[req]).iter().all(|r| r.is_ok()));
            eprintln!("ct_check: key setup and a signature done");
        }
        "control-input" => {
            let (_, k) = key(2048);
            let input = vec![7u8; 256];
            ct::mark_secret(&input);
            let _ = rsa_private_batch(kernel, &[&k], &[&input]);
        }
        "sign" => {
            let sizes: &[u32] = if std::env::var_os("CT_ALL_SIZES").is_some() {
                &[2048, 3072, 4096]
            } else {
                &[2048]
            };
            for &bits in sizes {
                let keys: Vec<_> = (0..2).map(|_| key(bits)).collect();
                // Reference signatures before marking (the engine is checked
                // against BoringSSL by the test suite; here only its control
                // flow matters).
                let msgs: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 40]).collect();
                let mk = |pad| -> Vec<SignRequest<'_>> {
                    msgs.iter()
                        .enumerate()
                        .map(|(i, m)| SignRequest {
                            key: &keys[i % 2].1,
                            padding: pad,
                            message: m,
                        })
                        .collect()
                };
                let before = sign_batch(kernel, &mk(RsaPadding::Pkcs1v15(Hash::Sha256)));
                for (_, k) in &keys {
                    k.ct_mark_secret();
                }
                let after = sign_batch(kernel, &mk(RsaPadding::Pkcs1v15(Hash::Sha256)));
                assert_eq!(before, after, "signatures changed under marking");
                let pss = sign_batch(kernel, &mk(RsaPadding::Pss(Hash::Sha384)));
                assert!(pss.iter().all(|r| r.is_ok()));
                // A detected fault must not leak either.
                let input = vec![3u8; (bits / 8) as usize];
                let f = rsa_private_batch_with_fault(
                    kernel,
                    &[&keys[0].1, &keys[1].1],
                    &[&input, &input],
                    1,
                );
                assert!(f[0].is_ok() && f[1] == Err(EngineError::FaultDetected));
                eprintln!("ct_check: {bits}-bit signatures done");
            }
        }
        #[cfg(all(feature = "ct-planted", target_arch = "x86_64"))]
        "planted" => {
            // Only keeps the planted functions in the binary for the static check.
            let table = Box::new([[Default::default(); 20]; 16]);
            let idx = Default::default();
            std::hint::black_box(planted_select(&table, &idx));
            std::hint::black_box(planted_mac(&idx, &idx));
            let (mut a, mut b) = ([Default::default(); 5], [Default::default(); 5]);
            planted_cswap(&mut a, &mut b, &[Default::default(); 4], 3);
            std::hint::black_box((a, b));
            let mut out = [Default::default(); 10];
            planted_select_p256(&mut out, &[Default::default(); 65], 3);
            std::hint::black_box(out);
            let mut words = [Default::default(); 25];
            planted_permute_unless_zero(&mut words);
            std::hint::black_box(words);
        }
        other => panic!("unknown mode {other}"),
    }
}

/// The X25519 modes (the portable kernel: valgrind cannot run IFMA, which
/// `ct/avx512_branches.py` checks statically).
fn x25519_mode(mode: &str) {
    let kernel = X25519Kernel::Portable;
    eprintln!("ct_check: mode {mode}, X25519 kernel {}", kernel.name());
    let (scalars, points) = x25519_inputs();
    // Reference results before marking (the test suite checks the values).
    let before = x25519_batch(kernel, &scalars, &points);
    let unmarked_points = points.clone();
    for s in &scalars {
        ct::mark_secret(s);
    }
    for p in &points {
        ct::mark_secret(p);
    }
    let after = x25519_batch(kernel, &scalars, &points);
    match mode {
        "control-x25519" => {
            // A branch on a result that was not declassified: the marking
            // must have flowed through the whole scalar multiplication.
            if std::hint::black_box(&after)[0][0] & 1 == 1 {
                println!("branch on a shared secret");
            }
        }
        "x25519" => {
            ct::declassify(&after);
            assert_eq!(before, after, "X25519 results changed under marking");
            assert_eq!(after[2], [0u8; 32], "order-8 point: all-zero secret");
            // The server path: fresh scalars (marked inside), peers marked,
            // the all-zero check and its per-lane refusal.
            let shares = x25519_server_shares(kernel, &points);
            for (i, s) in shares.iter().enumerate() {
                assert_eq!(s.is_err(), i == 2, "share {i}: {s:?}");
            }
            // The IFMA pass's scalar-side code (clamping, signed digits, lane
            // packing, results back to bytes), which runs outside the kernel.
            let mut lanes = ct_ifma_lanes(&scalars, &points);
            ct::declassify(&lanes);
            for (l, p) in lanes.iter_mut().zip(&unmarked_points) {
                l[31] |= p[31] & 0x80;
                assert_eq!(l, p, "lane packing round trip");
            }
            eprintln!("ct_check: X25519 raw and server shares done");
        }
        other => panic!("unknown mode {other}"),
    }
}

/// The ML-KEM modes (the portable kernel: valgrind cannot run AVX-512, and
/// `ct/avx512_branches.py` checks that kernel's arithmetic and Keccak
/// statically). The messages are marked inside the engine; everything derived
/// from them stays marked until the ciphertext is declassified there.
fn mlkem_mode(mode: &str) {
    let kernel = MlKemKernel::Portable;
    eprintln!("ct_check: mode {mode}, ML-KEM kernel {}", kernel.name());
    let clients = mlkem_clients::clients(3);
    let keys: Vec<&[u8]> = clients.iter().map(|(_, ek)| &ek[..]).collect();
    let results = mlkem768_encapsulate_batch(kernel, &keys);
    match mode {
        "control-mlkem" => {
            // A branch on a shared secret that was not declassified.
            let secret = &results[0].as_ref().unwrap().secret;
            if std::hint::black_box(secret[0]) & 1 == 1 {
                println!("branch on a shared secret");
            }
        }
        "mlkem" => {
            for ((dk, _), result) in clients.iter().zip(&results) {
                let e = result.as_ref().unwrap();
                ct::declassify(&e.secret[..]);
                let secret = dk.decapsulate(e.ciphertext[..].into()).unwrap();
                assert_eq!(secret.as_ref(), &e.secret[..], "decapsulated by aws-lc");
            }
            eprintln!("ct_check: ML-KEM-768 encapsulations done");
        }
        other => panic!("unknown mode {other}"),
    }
}

/// The P-256 modes (the portable kernel and the IFMA pass's lane packing:
/// valgrind cannot run IFMA, which `ct/avx512_branches.py` checks
/// statically). The nonce entropy is marked inside the engine.
fn p256_mode(mode: &str) {
    let kernel = P256Kernel::Portable;
    eprintln!("ct_check: mode {mode}, P-256 kernel {}", kernel.name());
    // Key setup from marked scalars: 1, n - 1 and two others.
    let mut scalars = vec![[0u8; 32], [0x5a; 32], [0x17; 32]];
    scalars[0][31] = 1;
    let mut n_minus_1: [u8; 32] = [
        0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xbc,
        0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
    ];
    n_minus_1[31] -= 1;
    scalars.push(n_minus_1);
    for s in &scalars {
        ct::mark_secret(s);
    }
    let keys: Vec<EcdsaP256Key> = scalars
        .iter()
        .map(|s| EcdsaP256Key::from_private_scalar(s).expect("valid scalar"))
        .collect();
    match mode {
        "control-p256" => {
            // A branch on packed nonce limbs that were not declassified: the
            // marking must flow through the lane packing.
            let lanes = ct_p256_ifma_lanes(&[[0x1234, 0, 0, 0x5678]].map(|k| {
                ct::mark_secret(&k);
                k
            }));
            if std::hint::black_box(&lanes)[0][0] & 1 == 0 {
                println!("branch on a nonce");
            }
        }
        "p256" => {
            for k in &keys {
                k.ct_mark_secret();
            }
            let msgs: Vec<Vec<u8>> = (0..9u8).map(|i| vec![i; 40]).collect();
            let reqs: Vec<EcdsaRequest<'_>> = msgs
                .iter()
                .enumerate()
                .map(|(i, m)| EcdsaRequest {
                    key: &keys[i % keys.len()],
                    hash: [Hash::Sha256, Hash::Sha384][i % 2],
                    message: m,
                })
                .collect();
            assert!(ecdsa_p256_sign_batch(kernel, &reqs)
                .iter()
                .all(|r| r.is_ok()));
            // A detected fault must not leak either.
            let f = ecdsa_p256_sign_batch_with_fault(kernel, &reqs[..2], 1);
            assert!(f[0].is_ok() && f[1] == Err(EngineError::FaultDetected));
            // The IFMA pass's nonce-side code (signed digits, lane packing,
            // results back to limbs), which runs outside the kernel.
            let nonces: Vec<[u64; 4]> = (1..10u64)
                .map(|i| [i * 0x9e37_79b9, i, !i, i << 40])
                .collect();
            let marked = nonces.clone();
            ct::mark_secret(&marked);
            let mut lanes = ct_p256_ifma_lanes(&marked);
            ct::declassify(&lanes);
            assert_eq!(lanes, nonces[..8], "lane packing round trip");
            lanes.clear();
            eprintln!("ct_check: P-256 key setup, signatures and the fault check done");
        }
        other => panic!("unknown mode {other}"),
    }
}
