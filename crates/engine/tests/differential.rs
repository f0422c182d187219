//! Differential tests against BoringSSL: raw private operation, PKCS#1 v1.5
//! (byte-identical, deterministic) and PSS (verified by BoringSSL), for every
//! key size, lane counts 1..=8 (and a batch over 8), mixed keys and sizes,
//! edge inputs, both kernels; plus error paths and the fault check.

mod common;
use boring::bn::{BigNum, BigNumContext};
use boring::hash::MessageDigest;
use boring::pkey::PKey;
use boring::rsa::Padding;
use boring::sign::{RsaPssSaltlen, Signer, Verifier};
use common::*;
use tlsterm_engine::*;

const SIZES: [usize; 3] = [2048, 3072, 4096];

fn md(h: Hash) -> MessageDigest {
    match h {
        Hash::Sha256 => MessageDigest::sha256(),
        Hash::Sha384 => MessageDigest::sha384(),
        Hash::Sha512 => MessageDigest::sha512(),
    }
}

/// A random input below n: random bytes with the top byte cleared.
fn random_input(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = rng.bytes(len);
    v[0] &= 0x7f;
    v
}

#[test]
fn raw_matches_boringssl_all_sizes_lane_counts_and_mixed_keys() {
    let mut rng = Rng(0x1234_5678);
    for bits in SIZES {
        let ks = keys(bits);
        for kernel in kernels() {
            for count in 1..=9 {
                // Rotate through the keys so batches mix keys.
                let sel: Vec<&TestKey> = (0..count).map(|i| &ks[(i + count) % ks.len()]).collect();
                let inputs: Vec<Vec<u8>> = (0..count)
                    .map(|_| random_input(&mut rng, bits / 8))
                    .collect();
                let engine_keys: Vec<&RsaPrivateKey> = sel.iter().map(|k| &k.engine).collect();
                let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
                let out = rsa_private_batch(kernel, &engine_keys, &refs);
                assert_eq!(out.len(), count);
                for ((k, input), got) in sel.iter().zip(&inputs).zip(out) {
                    assert_eq!(
                        got.expect("signature"),
                        boring_raw(&k.boring, input),
                        "{bits} bits, {kernel:?}, batch of {count}"
                    );
                }
            }
        }
    }
}

#[test]
fn raw_edge_inputs() {
    for bits in SIZES {
        let k = &keys(bits)[0];
        let len = bits / 8;
        let n = k.boring.n().to_owned().unwrap();
        let p = k.boring.p().unwrap().to_owned().unwrap();
        let q = k.boring.q().unwrap().to_owned().unwrap();
        let one = BigNum::from_u32(1).unwrap();
        let mut ctx = BigNumContext::new().unwrap();
        let mut edge: Vec<BigNum> = vec![
            BigNum::from_u32(0).unwrap(),
            BigNum::from_u32(1).unwrap(),
            BigNum::from_u32(2).unwrap(),
        ];
        let mut nm1 = BigNum::new().unwrap();
        nm1.checked_sub(&n, &one).unwrap();
        edge.push(nm1);
        for prime in [&p, &q] {
            edge.push(BigNum::from_slice(&prime.to_vec()).unwrap()); // ≡ 0 mod that prime
            let mut x = BigNum::new().unwrap();
            x.checked_add(prime, &one).unwrap();
            edge.push(x); // just above the prime
            let mut y = BigNum::new().unwrap();
            y.checked_mul(prime, &BigNum::from_u32(3).unwrap(), &mut ctx)
                .unwrap();
            edge.push(y); // a multiple well above the prime
            let mut z = BigNum::new().unwrap();
            z.checked_sub(&n, prime).unwrap();
            edge.push(z); // (q-1)*p or (p-1)*q
        }
        // All ones in the low half (above p and q) and a value with only the top bit set.
        let mut hi = vec![0u8; len];
        for b in &mut hi[len / 2 - 1..] {
            *b = 0xff;
        }
        edge.push(BigNum::from_slice(&hi).unwrap());
        let mut top = vec![0u8; len];
        top[0] = 0x80;
        let top = BigNum::from_slice(&top).unwrap();
        if top < n {
            edge.push(top);
        }
        let inputs: Vec<Vec<u8>> = edge.iter().map(|x| bn_bytes(x, len)).collect();
        let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        let keys_v: Vec<&RsaPrivateKey> = inputs.iter().map(|_| &k.engine).collect();
        for kernel in kernels() {
            let out = rsa_private_batch(kernel, &keys_v, &refs);
            for (input, got) in inputs.iter().zip(out) {
                assert_eq!(
                    got.unwrap(),
                    boring_raw(&k.boring, input),
                    "{bits}, {kernel:?}, input {}",
                    hex(input)
                );
            }
            // Shorter inputs (without leading zeros) are accepted too.
            let out = rsa_private_batch(kernel, &[&k.engine], &[&[1u8][..]]);
            assert_eq!(
                out[0].as_ref().unwrap(),
                &boring_raw(&k.boring, &bn_bytes(&one, len))
            );
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn short_signatures_keep_leading_zeros() {
    // Signatures with leading zero bytes (s < 2^(bits-8), s < 2^(bits-16)).
    let mut rng = Rng(77);
    for bits in SIZES {
        let k = &keys(bits)[1];
        let len = bits / 8;
        let mut want = Vec::new();
        let mut inputs = Vec::new();
        for zeros in [1usize, 2, 5] {
            let mut s = rng.bytes(len);
            s[..zeros].fill(0);
            let mut c = vec![0u8; len];
            k.boring.public_encrypt(&s, &mut c, Padding::NONE).unwrap();
            want.push(s);
            inputs.push(c);
        }
        let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
        for kernel in kernels() {
            let out = rsa_private_batch(kernel, &[&k.engine; 3], &refs);
            for (w, got) in want.iter().zip(out) {
                assert_eq!(&got.unwrap(), w, "{bits} {kernel:?}");
            }
        }
    }
}

#[test]
fn raw_rejects_out_of_range_inputs() {
    let k = &keys(2048)[0];
    let n = k.engine.modulus_be();
    let too_long = vec![0u8; 257];
    let ones = vec![0xffu8; 256];
    for kernel in kernels() {
        let out = rsa_private_batch(
            kernel,
            &[&k.engine, &k.engine, &k.engine, &k.engine],
            &[&n, &too_long, &ones, &[5u8][..]],
        );
        assert_eq!(out[0], Err(EngineError::InputOutOfRange));
        assert_eq!(out[1], Err(EngineError::InputOutOfRange));
        assert_eq!(out[2], Err(EngineError::InputOutOfRange));
        assert!(out[3].is_ok(), "valid input next to rejected ones");
    }
}

#[test]
fn pkcs1_identical_to_boringssl() {
    let mut rng = Rng(99);
    for bits in SIZES {
        let ks = keys(bits);
        for kernel in kernels() {
            for (count, hash) in [
                (1, Hash::Sha256),
                (3, Hash::Sha384),
                (8, Hash::Sha512),
                (5, Hash::Sha256),
            ] {
                let msgs: Vec<Vec<u8>> = (0..count).map(|i| rng.bytes(i * 37 + 1)).collect();
                let reqs: Vec<SignRequest<'_>> = msgs
                    .iter()
                    .enumerate()
                    .map(|(i, m)| SignRequest {
                        key: &ks[i % ks.len()].engine,
                        padding: RsaPadding::Pkcs1v15(hash),
                        message: m,
                    })
                    .collect();
                let out = sign_batch(kernel, &reqs);
                for (i, (m, got)) in msgs.iter().zip(out).enumerate() {
                    let pkey = PKey::from_rsa(ks[i % ks.len()].boring.clone()).unwrap();
                    let mut s = Signer::new(md(hash), &pkey).unwrap();
                    s.update(m).unwrap();
                    assert_eq!(
                        got.unwrap(),
                        s.sign_to_vec().unwrap(),
                        "{bits} {kernel:?} {hash:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn pss_verifies_with_boringssl() {
    let mut rng = Rng(7);
    for bits in SIZES {
        let ks = keys(bits);
        for kernel in kernels() {
            for (count, hash) in [(2, Hash::Sha256), (4, Hash::Sha384), (7, Hash::Sha512)] {
                let msgs: Vec<Vec<u8>> = (0..count).map(|i| rng.bytes(100 + i)).collect();
                let reqs: Vec<SignRequest<'_>> = msgs
                    .iter()
                    .enumerate()
                    .map(|(i, m)| SignRequest {
                        key: &ks[i % ks.len()].engine,
                        padding: RsaPadding::Pss(hash),
                        message: m,
                    })
                    .collect();
                let out = sign_batch(kernel, &reqs);
                for (i, (m, got)) in msgs.iter().zip(out).enumerate() {
                    let sig = got.unwrap();
                    let pkey = PKey::from_rsa(ks[i % ks.len()].boring.clone()).unwrap();
                    let verify = |msg: &[u8]| {
                        let mut v = Verifier::new(md(hash), &pkey).unwrap();
                        v.set_rsa_padding(Padding::PKCS1_PSS).unwrap();
                        v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
                        v.set_rsa_mgf1_md(md(hash)).unwrap();
                        v.update(msg).unwrap();
                        v.verify(&sig).unwrap_or(false)
                    };
                    assert!(
                        verify(m),
                        "{bits} {kernel:?} {hash:?}: BoringSSL rejects the PSS signature"
                    );
                    let mut other = m.clone();
                    other[0] ^= 1;
                    assert!(!verify(&other), "verifier must reject another message");
                }
            }
        }
    }
}

#[test]
fn mixed_sizes_in_one_batch_keep_order() {
    let msgs: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i; 50]).collect();
    let order = [2048, 4096, 3072, 2048, 3072, 4096, 2048];
    let reqs: Vec<SignRequest<'_>> = order
        .iter()
        .zip(&msgs)
        .enumerate()
        .map(|(i, (&bits, m))| SignRequest {
            key: &keys(bits)[i % 2].engine,
            padding: RsaPadding::Pkcs1v15(Hash::Sha256),
            message: m,
        })
        .collect();
    for kernel in kernels() {
        let out = sign_batch(kernel, &reqs);
        for (i, ((&bits, m), got)) in order.iter().zip(&msgs).zip(out).enumerate() {
            let pkey = PKey::from_rsa(keys(bits)[i % 2].boring.clone()).unwrap();
            let mut s = Signer::new(MessageDigest::sha256(), &pkey).unwrap();
            s.update(m).unwrap();
            let got = got.unwrap();
            assert_eq!(got.len(), bits / 8);
            assert_eq!(
                got,
                s.sign_to_vec().unwrap(),
                "request {i} ({bits} bits), {kernel:?}"
            );
        }
    }
}

#[test]
fn corrupted_lane_is_caught_by_public_key_check() {
    let ks = keys(2048);
    let mut rng = Rng(5);
    let inputs: Vec<Vec<u8>> = (0..8).map(|_| random_input(&mut rng, 256)).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let kv: Vec<&RsaPrivateKey> = (0..8).map(|i| &ks[i % ks.len()].engine).collect();
    for kernel in kernels() {
        for bad in 0..8 {
            let out = rsa_private_batch_with_fault(kernel, &kv, &refs, bad);
            for (i, r) in out.iter().enumerate() {
                if i == bad {
                    assert_eq!(
                        r,
                        &Err(EngineError::FaultDetected),
                        "{kernel:?}: lane {bad} corrupted"
                    );
                } else {
                    assert_eq!(
                        r.as_ref().unwrap(),
                        &boring_raw(&ks[i % ks.len()].boring, &inputs[i])
                    );
                }
            }
        }
    }
    // Also for the other sizes (one lane each).
    for bits in [3072, 4096] {
        let k = &keys(bits)[0];
        let input = random_input(&mut rng, bits / 8);
        for kernel in kernels() {
            let out =
                rsa_private_batch_with_fault(kernel, &[&k.engine, &k.engine], &[&input, &input], 1);
            assert!(out[0].is_ok());
            assert_eq!(out[1], Err(EngineError::FaultDetected));
        }
    }
}

#[test]
fn inconsistent_key_gives_fault_not_a_wrong_signature() {
    // A key whose dp does not match e: the CRT result is wrong, and the
    // public-key check must refuse it.
    let k = &keys(2048)[0].boring;
    let mut bad_dp = k.dmp1().unwrap().to_vec();
    let last = bad_dp.len() - 1;
    bad_dp[last] ^= 2;
    let key = RsaPrivateKey::from_components(&RsaComponents {
        n: &k.n().to_vec(),
        e: &k.e().to_vec(),
        d: &k.d().to_vec(),
        p: &k.p().unwrap().to_vec(),
        q: &k.q().unwrap().to_vec(),
        dp: &bad_dp,
        dq: &k.dmq1().unwrap().to_vec(),
        qinv: &k.iqmp().unwrap().to_vec(),
    })
    .unwrap();
    for kernel in kernels() {
        let out = sign_batch(
            kernel,
            &[SignRequest {
                key: &key,
                padding: RsaPadding::Pss(Hash::Sha256),
                message: b"hello",
            }],
        );
        assert_eq!(out[0], Err(EngineError::FaultDetected));
    }
}

#[test]
fn key_validation() {
    let small = boring::rsa::Rsa::generate(1024).unwrap();
    let c = |r: &boring::rsa::Rsa<boring::pkey::Private>| {
        [
            r.n().to_vec(),
            r.e().to_vec(),
            r.d().to_vec(),
            r.p().unwrap().to_vec(),
            r.q().unwrap().to_vec(),
            r.dmp1().unwrap().to_vec(),
            r.dmq1().unwrap().to_vec(),
            r.iqmp().unwrap().to_vec(),
        ]
    };
    // The components in BoringSSL's order, by name.
    fn named(k: &[Vec<u8>; 8]) -> RsaComponents<'_> {
        let [n, e, d, p, q, dp, dq, qinv] = k;
        RsaComponents {
            n,
            e,
            d,
            p,
            q,
            dp,
            dq,
            qinv,
        }
    }
    let s = c(&small);
    assert_eq!(
        RsaPrivateKey::from_components(&named(&s)).unwrap_err(),
        EngineError::UnsupportedKeySize(1024)
    );
    let k = c(&keys(2048)[0].boring);
    let ok = RsaPrivateKey::from_components(&named(&k)).unwrap();
    assert_eq!((ok.modulus_bits(), ok.modulus_len()), (2048, 256));
    // Debug must not print secrets.
    let dbg = format!("{ok:?}");
    assert!(dbg.len() < 100 && !dbg.contains(&hex(&k[3])[..16]), "{dbg}");
    // p swapped with another prime: p*q != n.
    let other = c(&keys(2048)[1].boring);
    assert!(matches!(
        RsaPrivateKey::from_components(&RsaComponents {
            p: &other[3],
            ..named(&k)
        }),
        Err(EngineError::InvalidKey(_))
    ));
    // dp >= p.
    let big = vec![0xffu8; 128];
    assert!(matches!(
        RsaPrivateKey::from_components(&RsaComponents {
            dp: &big,
            ..named(&k)
        }),
        Err(EngineError::InvalidKey(_))
    ));
    // Even e.
    assert!(matches!(
        RsaPrivateKey::from_components(&RsaComponents {
            e: &[1, 0],
            ..named(&k)
        }),
        Err(EngineError::InvalidKey(_))
    ));
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RsaPrivateKey>();
}

#[test]
fn requested_kernel_must_exist() {
    let k = &keys(2048)[0];
    for kernel in Kernel::ALL {
        if !kernel.is_available() {
            let out = rsa_private_batch(kernel, &[&k.engine], &[&[1u8][..]]);
            assert_eq!(out[0], Err(EngineError::KernelUnavailable));
        }
        assert_eq!(Kernel::from_name(kernel.name()), Some(kernel));
    }
    assert!(Kernel::detect().is_available());
    assert_eq!(Kernel::Portable.name(), "portable");
}

/// BoringSSL generates keys with p > q; a key from elsewhere may have p < q. The CRT
/// recombination must not depend on the order.
#[test]
fn a_key_with_p_below_q() {
    let mut ctx = BigNumContext::new().unwrap();
    let mut rng = Rng(0x5eed);
    for bits in SIZES {
        let b = &keys(bits)[0].boring;
        let (p, q) = (b.p().unwrap(), b.q().unwrap());
        let (lo, hi) = if p < q { (p, q) } else { (q, p) };
        let (dlo, dhi) = if p < q {
            (b.dmp1().unwrap(), b.dmq1().unwrap())
        } else {
            (b.dmq1().unwrap(), b.dmp1().unwrap())
        };
        // qinv for the order (p = lo, q = hi): hi^-1 mod lo.
        let mut qinv = BigNum::new().unwrap();
        qinv.mod_inverse(hi, lo, &mut ctx).unwrap();
        let key = RsaPrivateKey::from_components(&RsaComponents {
            n: &b.n().to_vec(),
            e: &b.e().to_vec(),
            d: &b.d().to_vec(),
            p: &lo.to_vec(),
            q: &hi.to_vec(),
            dp: &dlo.to_vec(),
            dq: &dhi.to_vec(),
            qinv: &qinv.to_vec(),
        })
        .expect("p < q is a valid key");
        for kernel in kernels() {
            for count in [1, 3, 4, 8] {
                let inputs: Vec<Vec<u8>> = (0..count)
                    .map(|_| random_input(&mut rng, bits / 8))
                    .collect();
                let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
                let ks = vec![&key; count];
                for (input, got) in inputs.iter().zip(rsa_private_batch(kernel, &ks, &refs)) {
                    assert_eq!(
                        got.unwrap(),
                        boring_raw(b, input),
                        "{bits}, {kernel:?}, p < q"
                    );
                }
            }
        }
    }
}
