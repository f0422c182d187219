//! Tests of the P-256 signer: arithmetic against num-bigint, signatures
//! against BoringSSL and aws-lc-rs, edge cases of keys and digests, the fault
//! check, and the IFMA kernel against the portable one.

use super::mont::{self, Modulus, N, P, U256};
use super::*;
use boring::bn::{BigNum, BigNumContext};
use boring::ec::{EcGroup, EcKey, EcPoint, PointConversionForm};
use boring::ecdsa::EcdsaSig;
use boring::nid::Nid;
use num_bigint::BigUint;
use proptest::prelude::*;

const N_BE: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
];

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn bytes<const L: usize>(&mut self) -> [u8; L] {
        core::array::from_fn(|_| {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 as u8
        })
    }
    fn key(&mut self) -> EcdsaP256Key {
        loop {
            if let Ok(k) = EcdsaP256Key::from_private_scalar(&self.bytes::<32>()) {
                return k;
            }
        }
    }
}

/// `x` as a num-bigint integer (also used by the IFMA kernel's own tests).
pub(super) fn big(x: &U256) -> BigUint {
    BigUint::from_bytes_be(&mont::to_be(x))
}

fn limbs(x: &BigUint) -> U256 {
    let b = x.to_bytes_be();
    let mut out = [0u8; 32];
    out[32 - b.len()..].copy_from_slice(&b);
    mont::from_be(&out)
}

pub(super) fn modulus_big(m: &Modulus) -> BigUint {
    big(&m.m)
}

/// Checks add, sub, mul, invert and the Montgomery conversions for a, b < m
/// against num-bigint.
fn check_arith(m: &Modulus, a: &BigUint, b: &BigUint) {
    let mb = modulus_big(m);
    let (a, b) = (a % &mb, b % &mb);
    let (al, bl) = (limbs(&a), limbs(&b));
    let (am, bm) = (mont::to_mont(&al, m), mont::to_mont(&bl, m));
    let r = BigUint::from(1u8) << 256;
    assert_eq!(big(&am), &a * &r % &mb, "to_mont");
    assert_eq!(
        big(&mont::from_mont(&mont::mul(&am, &bm, m), m)),
        &a * &b % &mb,
        "mul"
    );
    assert_eq!(big(&mont::add(&al, &bl, m)), (&a + &b) % &mb, "add");
    assert_eq!(big(&mont::sub(&al, &bl, m)), (&a + &mb - &b) % &mb, "sub");
    let inv = big(&mont::from_mont(&mont::invert(&am, m), m));
    let want = a.modpow(&(&mb - 2u8), &mb);
    assert_eq!(inv, want, "invert");
}

#[test]
fn arithmetic_edges_match_num_bigint() {
    for m in [&P, &N] {
        let mb = modulus_big(m);
        let edges = [
            BigUint::from(0u8),
            BigUint::from(1u8),
            BigUint::from(2u8),
            &mb - 1u8,
            &mb - 2u8,
            (BigUint::from(1u8) << 255) - 1u8,
            BigUint::from(1u8) << 255,
        ];
        for a in &edges {
            for b in &edges {
                check_arith(m, a, b);
            }
        }
        // reduce_once takes any 256-bit value.
        for x in [
            (BigUint::from(1u8) << 256) - 1u8,
            mb.clone(),
            &mb + 1u8,
            &mb - 1u8,
        ] {
            assert_eq!(big(&mont::reduce_once(&limbs(&x), m)), &x % &mb);
        }
    }
}

proptest! {
    #[test]
    fn arithmetic_matches_num_bigint(a in any::<[u8; 32]>(), b in any::<[u8; 32]>()) {
        for m in [&P, &N] {
            check_arith(m, &BigUint::from_bytes_be(&a), &BigUint::from_bytes_be(&b));
        }
    }

    #[test]
    fn signed_digits_recombine(k in any::<[u8; 32]>()) {
        let d = point::signed_digits(&mont::from_be(&k));
        let mut acc = num_bigint::BigInt::from(0);
        for &di in d.iter().rev() {
            prop_assert!((-8..=8).contains(&di));
            acc = acc * 16 + di;
        }
        prop_assert_eq!(acc, num_bigint::BigInt::from_bytes_be(num_bigint::Sign::Plus, &k));
    }
}

fn group() -> EcGroup {
    EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()
}

/// BoringSSL's public point for the scalar `d`.
fn boring_public(d: &[u8; 32]) -> Vec<u8> {
    let g = group();
    let mut ctx = BigNumContext::new().unwrap();
    let mut pt = EcPoint::new(&g).unwrap();
    pt.mul_generator(&g, &BigNum::from_slice(d).unwrap(), &mut ctx)
        .unwrap();
    pt.to_bytes(&g, PointConversionForm::UNCOMPRESSED, &mut ctx)
        .unwrap()
}

/// Verifies a DER signature of a digest with BoringSSL.
fn boring_verify_digest(public: &[u8], digest: &[u8], sig: &[u8]) -> bool {
    let g = group();
    let mut ctx = BigNumContext::new().unwrap();
    let pt = EcPoint::from_bytes(&g, public, &mut ctx).unwrap();
    let key = EcKey::from_public_key(&g, &pt).unwrap();
    EcdsaSig::from_der(sig)
        .unwrap()
        .verify(digest, &key)
        .unwrap()
}

/// Verifies a DER signature of a message with aws-lc-rs.
fn awslc_verify(public: &[u8], hash: Hash, message: &[u8], sig: &[u8]) -> bool {
    use aws_lc_rs::signature::{self as s, UnparsedPublicKey};
    let alg = match hash {
        Hash::Sha256 => &s::ECDSA_P256_SHA256_ASN1,
        Hash::Sha384 => &s::ECDSA_P256_SHA384_ASN1,
        Hash::Sha512 => &s::ECDSA_P256_SHA512_ASN1,
    };
    UnparsedPublicKey::new(alg, public)
        .verify(message, sig)
        .is_ok()
}

fn check_signatures(reqs: &[EcdsaRequest<'_>], sigs: &[Result<Vec<u8>, EngineError>]) {
    assert_eq!(reqs.len(), sigs.len());
    for (r, sig) in reqs.iter().zip(sigs) {
        let sig = sig.as_ref().expect("signed");
        let digest = r.hash.digest(&[r.message]);
        assert!(
            boring_verify_digest(r.key.public_key(), &digest, sig),
            "BoringSSL rejects"
        );
        assert!(
            awslc_verify(r.key.public_key(), r.hash, r.message, sig),
            "aws-lc-rs rejects"
        );
    }
}

#[test]
fn public_key_matches_boringssl() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..32 {
        let d = rng.bytes::<32>();
        if let Ok(k) = EcdsaP256Key::from_private_scalar(&d) {
            assert_eq!(k.public_key().as_slice(), boring_public(&d).as_slice());
        }
    }
}

#[test]
fn key_validation() {
    let mut n_minus_1 = N_BE;
    n_minus_1[31] -= 1;
    let mut n_plus_1 = N_BE;
    n_plus_1[31] += 1;
    let mut one = [0u8; 32];
    one[31] = 1;
    for bad in [[0u8; 32], N_BE, n_plus_1, [0xff; 32]] {
        assert!(matches!(
            EcdsaP256Key::from_private_scalar(&bad),
            Err(EngineError::InvalidKey(_))
        ));
    }
    assert!(EcdsaP256Key::from_private_scalar(&[1; 31]).is_err());
    assert!(EcdsaP256Key::from_private_scalar(&[1; 33]).is_err());
    for good in [one, n_minus_1] {
        let k = EcdsaP256Key::from_private_scalar(&good).unwrap();
        assert_eq!(k.public_key().as_slice(), boring_public(&good).as_slice());
    }
}

#[test]
fn debug_shows_no_secret() {
    let d = [0x5a; 32];
    let k = EcdsaP256Key::from_private_scalar(&d).unwrap();
    let s = format!("{k:?}");
    assert!(!s.contains("d_bytes") && !s.contains("d_mont"), "{s}");
    assert!(!s.contains(&format!("{:?}", d)), "{s}");
}

fn available_kernels() -> Vec<P256Kernel> {
    let all: Vec<_> = P256Kernel::ALL
        .into_iter()
        .filter(|k| k.is_available())
        .collect();
    if !P256Kernel::Ifma.is_available() {
        println!("IFMA kernel skipped: CPU lacks avx512ifma");
    }
    all
}

#[test]
fn signatures_verify_for_every_batch_size() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for kernel in available_kernels() {
        for size in 1..=17 {
            let keys: Vec<EcdsaP256Key> = (0..size).map(|_| rng.key()).collect();
            let msgs: Vec<Vec<u8>> = (0..size)
                .map(|i| rng.bytes::<64>()[..i * 3].to_vec())
                .collect();
            let hashes = [Hash::Sha256, Hash::Sha384, Hash::Sha512];
            let reqs: Vec<EcdsaRequest<'_>> = keys
                .iter()
                .zip(&msgs)
                .enumerate()
                .map(|(i, (key, m))| EcdsaRequest {
                    key,
                    hash: hashes[i % 3],
                    message: m,
                })
                .collect();
            check_signatures(&reqs, &ecdsa_p256_sign_batch(kernel, &reqs));
        }
    }
}

#[test]
fn nonces_are_fresh() {
    let key = EcdsaP256Key::from_private_scalar(&[7; 32]).unwrap();
    for kernel in available_kernels() {
        let req = || EcdsaRequest {
            key: &key,
            hash: Hash::Sha256,
            message: b"same message",
        };
        let a = ecdsa_p256_sign_batch(kernel, &[req(), req()]);
        let b = ecdsa_p256_sign_batch(kernel, &[req()]);
        let (a0, a1, b0) = (
            a[0].as_ref().unwrap(),
            a[1].as_ref().unwrap(),
            b[0].as_ref().unwrap(),
        );
        assert!(a0 != a1 && a0 != b0 && a1 != b0, "a nonce repeated");
    }
}

/// Signs digests directly (the pipeline after hashing), with a fixed nonce
/// entropy: the edge cases of e that no message can be found for.
fn sign_digest(kernel: P256Kernel, key: &EcdsaP256Key, e: &[u8; 32]) -> Vec<u8> {
    let k = nonce::derive(&key.d_bytes, e, &[3; 32]);
    let pt = nonce_points(kernel, &[*k]);
    finish(key, e, &k, &pt[0], false).unwrap()
}

#[test]
fn edge_keys_and_digests() {
    let mut n_minus_1 = N_BE;
    n_minus_1[31] -= 1;
    let mut one = [0u8; 32];
    one[31] = 1;
    let mut n_plus_5 = N_BE;
    n_plus_5[31] += 5;
    let digests = [[0u8; 32], N_BE, n_plus_5, [0xff; 32], n_minus_1, one];
    let mut rng = Rng(77);
    let random = rng.bytes::<32>();
    for kernel in available_kernels() {
        for d in [one, n_minus_1, random] {
            let key = EcdsaP256Key::from_private_scalar(&d).unwrap();
            for e in &digests {
                let sig = sign_digest(kernel, &key, e);
                assert!(
                    boring_verify_digest(key.public_key(), e, &sig),
                    "digest {e:x?}"
                );
            }
            // A message through the whole pipeline, for the same key.
            let req = EcdsaRequest {
                key: &key,
                hash: Hash::Sha256,
                message: b"edge",
            };
            check_signatures(
                &[req],
                &ecdsa_p256_sign_batch(
                    kernel,
                    &[EcdsaRequest {
                        key: &key,
                        hash: Hash::Sha256,
                        message: b"edge",
                    }],
                ),
            );
        }
    }
}

#[test]
fn fault_is_caught() {
    let mut rng = Rng(4242);
    let keys: Vec<EcdsaP256Key> = (0..10).map(|_| rng.key()).collect();
    let reqs: Vec<EcdsaRequest<'_>> = keys
        .iter()
        .map(|key| EcdsaRequest {
            key,
            hash: Hash::Sha256,
            message: b"fault",
        })
        .collect();
    for kernel in available_kernels() {
        for fault in [0, 7, 9] {
            let out = ecdsa_p256_sign_batch_with_fault(kernel, &reqs, fault);
            for (i, r) in out.iter().enumerate() {
                if i == fault {
                    assert_eq!(r, &Err(EngineError::FaultDetected));
                } else {
                    check_signatures(&reqs[i..i + 1], &out[i..i + 1]);
                }
            }
        }
    }
}

#[test]
fn rng_failure_is_reported() {
    let key = EcdsaP256Key::from_private_scalar(&[9; 32]).unwrap();
    let reqs = [EcdsaRequest {
        key: &key,
        hash: Hash::Sha256,
        message: b"x",
    }];
    let out = sign_impl(
        P256Kernel::Portable,
        &reqs,
        &mut |_| Err(EngineError::Rng),
        None,
    );
    assert_eq!(out, vec![Err(EngineError::Rng)]);
}

#[test]
fn unavailable_kernel_is_refused() {
    if P256Kernel::Ifma.is_available() {
        return;
    }
    let key = EcdsaP256Key::from_private_scalar(&[9; 32]).unwrap();
    let reqs = [EcdsaRequest {
        key: &key,
        hash: Hash::Sha256,
        message: b"x",
    }];
    assert_eq!(
        ecdsa_p256_sign_batch(P256Kernel::Ifma, &reqs),
        vec![Err(EngineError::KernelUnavailable)]
    );
}

#[test]
fn der_encoding() {
    let mut r = [0u8; 32];
    r[31] = 1;
    let mut s = [0xff; 32];
    s[0] = 0x80;
    let der = der::encode(&r, &s);
    assert_eq!(&der[..5], &[0x30, 3 + 35, 0x02, 0x01, 0x01]);
    assert_eq!(&der[5..8], &[0x02, 33, 0x00]);
    assert_eq!(&der[8..], &s);
    let mut small = [0u8; 32];
    small[30] = 0x7f;
    small[31] = 0x01;
    assert_eq!(
        der::encode(&small, &small),
        vec![0x30, 8, 2, 2, 0x7f, 1, 2, 2, 0x7f, 1]
    );
}

#[test]
fn ifma_matches_portable() {
    if !P256Kernel::Ifma.is_available() {
        println!("skipped: CPU lacks avx512ifma");
        return;
    }
    let mut rng = Rng(0xdead_beef_1234_5678);
    for size in 1..=17 {
        let keys: Vec<EcdsaP256Key> = (0..size).map(|_| rng.key()).collect();
        let msgs: Vec<[u8; 16]> = (0..size).map(|_| rng.bytes()).collect();
        let reqs: Vec<EcdsaRequest<'_>> = keys
            .iter()
            .zip(&msgs)
            .map(|(key, m)| EcdsaRequest {
                key,
                hash: Hash::Sha256,
                message: m,
            })
            .collect();
        let seed = rng.bytes::<8>();
        let sign = |kernel| {
            let mut src = Rng(u64::from_le_bytes(seed) | 1);
            let mut fill = |out: &mut [[u8; 32]]| {
                out.iter_mut().for_each(|o| *o = src.bytes());
                Ok(())
            };
            sign_impl(kernel, &reqs, &mut fill, None)
        };
        let ifma = sign(P256Kernel::Ifma);
        assert_eq!(ifma, sign(P256Kernel::Portable), "batch size {size}");
        check_signatures(&reqs, &ifma);
    }
    // Raw nonce points for scalars near the edges: 1, 2, n - 1, and n - 2^k.
    let mut ks: Vec<U256> = vec![
        [1, 0, 0, 0],
        [2, 0, 0, 0],
        mont::sub_borrow(&N.m, &[1, 0, 0, 0]).0,
    ];
    for i in [0usize, 64, 128, 200, 255] {
        let mut b = [0u64; 4];
        b[i / 64] = 1 << (i % 64);
        ks.push(mont::sub_borrow(&N.m, &b).0);
        ks.push(b);
    }
    for _ in 0..40 {
        ks.push(mont::reduce_once(&mont::from_be(&rng.bytes::<32>()), &N));
    }
    let a = nonce_points(P256Kernel::Ifma, &ks);
    let b = nonce_points(P256Kernel::Portable, &ks);
    for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
        assert_eq!((x.x, x.y, x.k_inv), (y.x, y.y, y.k_inv), "nonce {i}");
    }
}
