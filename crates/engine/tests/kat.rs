//! Known-answer tests from published suites (see tests/data/README.md):
//! Wycheproof RSASSA-PKCS1-v1_5 signature generation and NIST CAVP
//! SigGenPSS (FIPS 186-3), for both kernels.

mod common;
use common::{convert, kernels};
use num_bigint::BigUint;
use num_traits::{One, Zero};
use tlsterm_engine::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hash_of(name: &str) -> Option<Hash> {
    match name {
        "SHA-256" | "SHA256" => Some(Hash::Sha256),
        "SHA-384" | "SHA384" => Some(Hash::Sha384),
        "SHA-512" | "SHA512" => Some(Hash::Sha512),
        _ => None,
    }
}

#[test]
fn wycheproof_pkcs1_sig_gen() {
    let (mut checked, mut skipped) = (0, 0);
    for bits in [2048, 3072, 4096] {
        let path = format!(
            "{}/tests/data/wycheproof_rsa_pkcs1_{bits}_sig_gen.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for group in doc["testGroups"].as_array().unwrap() {
            let hash = hash_of(group["sha"].as_str().unwrap()).unwrap();
            let pem = group["privateKeyPem"].as_str().unwrap();
            let rsa = boring::rsa::Rsa::private_key_from_pem(pem.as_bytes()).unwrap();
            let (pb, qb) = (
                rsa.p().unwrap().num_bits() as usize,
                rsa.q().unwrap().num_bits() as usize,
            );
            if pb != bits / 2 || qb != bits / 2 {
                // Documented limitation: the engine needs primes of half the
                // modulus size (as every mainstream key generator makes).
                let c = |x: Option<&boring::bn::BigNumRef>| x.unwrap().to_vec();
                let r = RsaPrivateKey::from_components(&RsaComponents {
                    n: &rsa.n().to_vec(),
                    e: &rsa.e().to_vec(),
                    d: &rsa.d().to_vec(),
                    p: &c(rsa.p()),
                    q: &c(rsa.q()),
                    dp: &c(rsa.dmp1()),
                    dq: &c(rsa.dmq1()),
                    qinv: &c(rsa.iqmp()),
                });
                assert!(
                    matches!(r, Err(EngineError::InvalidKey(_))),
                    "unbalanced {pb}/{qb}-bit primes"
                );
                skipped += 1;
                continue;
            }
            let key = convert(&rsa);
            let tests = group["tests"].as_array().unwrap();
            let msgs: Vec<Vec<u8>> = tests
                .iter()
                .map(|t| unhex(t["msg"].as_str().unwrap()))
                .collect();
            let reqs: Vec<SignRequest<'_>> = msgs
                .iter()
                .map(|m| SignRequest {
                    key: &key,
                    padding: RsaPadding::Pkcs1v15(hash),
                    message: m,
                })
                .collect();
            for kernel in kernels() {
                let out = sign_batch(kernel, &reqs);
                for (t, got) in tests.iter().zip(out) {
                    let want = unhex(t["sig"].as_str().unwrap());
                    assert_eq!(
                        got.unwrap(),
                        want,
                        "tcId {} ({bits}, {kernel:?})",
                        t["tcId"]
                    );
                    checked += 1;
                }
            }
        }
    }
    // 9 groups x 8 tests x kernels; 5 single-test groups use unbalanced primes.
    assert_eq!(skipped, 5);
    assert_eq!(checked, 72 * kernels().len());
}

/// Factors n from (n, e, d) (the usual randomized square-root-of-one search;
/// deterministic bases here).
fn factor(n: &BigUint, e: &BigUint, d: &BigUint) -> (BigUint, BigUint) {
    let k: BigUint = e * d - 1u32;
    let t = k.trailing_zeros().unwrap();
    let r = &k >> t;
    let n1 = n - 1u32;
    for g in 2u32..100 {
        let mut x = BigUint::from(g).modpow(&r, n);
        for _ in 0..t {
            let y = x.modpow(&BigUint::from(2u32), n);
            if y.is_one() && !x.is_one() && x != n1 {
                let p = gcd(&(&x - 1u32), n);
                return (p.clone(), n / p);
            }
            x = y;
        }
    }
    panic!("could not factor");
}

fn gcd(a: &BigUint, b: &BigUint) -> BigUint {
    let (mut a, mut b) = (a.clone(), b.clone());
    while !b.is_zero() {
        let r = &a % &b;
        a = b;
        b = r;
    }
    a
}

#[test]
fn nist_pss_sig_gen_with_given_salt() {
    let path = format!(
        "{}/tests/data/nist_SigGenPSS_186-3_trimmed.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).unwrap();
    let (mut n, mut e, mut key): (Vec<u8>, Vec<u8>, Option<RsaPrivateKey>) = (vec![], vec![], None);
    let (mut alg, mut msg, mut sig) = (None, vec![], vec![]);
    let mut checked = 0;
    for line in text.lines() {
        let Some((name, value)) = line.split_once(" = ") else {
            continue;
        };
        let v = value.trim();
        match name.trim() {
            "n" => n = unhex(v),
            "e" => e = unhex(v),
            "d" => {
                let d = unhex(v);
                let (nb, eb, db) = (
                    BigUint::from_bytes_be(&n),
                    BigUint::from_bytes_be(&e),
                    BigUint::from_bytes_be(&d),
                );
                let (p, q) = factor(&nb, &eb, &db);
                let (p, q) = if p > q { (p, q) } else { (q, p) };
                let dp = &db % (&p - 1u32);
                let dq = &db % (&q - 1u32);
                let qinv = q.modpow(&(&p - 2u32), &p);
                key = Some(
                    RsaPrivateKey::from_components(&RsaComponents {
                        n: &n,
                        e: &e,
                        d: &d,
                        p: &p.to_bytes_be(),
                        q: &q.to_bytes_be(),
                        dp: &dp.to_bytes_be(),
                        dq: &dq.to_bytes_be(),
                        qinv: &qinv.to_bytes_be(),
                    })
                    .unwrap(),
                );
            }
            "SHAAlg" => alg = hash_of(v),
            "Msg" => msg = unhex(v),
            "S" => sig = unhex(v),
            "SaltVal" => {
                let key = key.as_ref().unwrap();
                let salt = if v == "00" { vec![] } else { unhex(v) };
                let em =
                    pss_encode_with_salt(alg.unwrap(), &msg, &salt, key.modulus_bits()).unwrap();
                for kernel in kernels() {
                    let out = rsa_private_batch(kernel, &[key], &[&em]);
                    assert_eq!(
                        out[0].as_ref().unwrap(),
                        &sig,
                        "{:?} {} bits {kernel:?}",
                        alg,
                        key.modulus_bits()
                    );
                }
                checked += 1;
            }
            _ => {}
        }
    }
    assert_eq!(checked, 18);
}
