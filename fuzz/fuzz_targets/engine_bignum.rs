//! The engine's big-number arithmetic against num-bigint: a batch of raw RSA private
//! operations (`input^d mod n`, computed by the engine with CRT and Montgomery
//! multiplication in multi-buffer lanes) must equal num-bigint's `modpow` (textbook CRT), for 2048- and
//! 3072-bit keys mixed in one batch, on every kernel this CPU has. Inputs not below the
//! modulus must be refused, never computed. Arbitrary key components must give a key or
//! an error, never a panic.
#![no_main]

use std::sync::OnceLock;

use boring::rsa::Rsa;
use libfuzzer_sys::fuzz_target;
use num_bigint::BigUint;
use tlsterm_engine::{rsa_private_batch, EngineError, Kernel, RsaComponents, RsaPrivateKey};

struct Key {
    engine: RsaPrivateKey,
    n: BigUint,
    p: BigUint,
    q: BigUint,
    dp: BigUint,
    dq: BigUint,
    /// q^-1 mod p, computed here as q^(p-2) mod p (not taken from the key file).
    qinv: BigUint,
    len: usize,
}

impl Key {
    /// `x^d mod n` by the textbook CRT (Garner) in num-bigint: four times cheaper than
    /// one full-size modpow, and independent of the engine's Montgomery arithmetic.
    fn reference(&self, x: &BigUint) -> BigUint {
        let m1 = (x % &self.p).modpow(&self.dp, &self.p);
        let m2 = (x % &self.q).modpow(&self.dq, &self.q);
        // h = (m1 - m2) * q^-1 mod p.
        let diff = (&m1 + &self.p - (&m2 % &self.p)) % &self.p;
        let h = (diff * &self.qinv) % &self.p;
        m2 + h * &self.q
    }
}

fn load(pem: &[u8]) -> Key {
    let rsa = Rsa::private_key_from_pem(pem).expect("test key");
    let engine = RsaPrivateKey::from_components(&RsaComponents {
        n: &rsa.n().to_vec(),
        e: &rsa.e().to_vec(),
        d: &rsa.d().to_vec(),
        p: &rsa.p().unwrap().to_vec(),
        q: &rsa.q().unwrap().to_vec(),
        dp: &rsa.dmp1().unwrap().to_vec(),
        dq: &rsa.dmq1().unwrap().to_vec(),
        qinv: &rsa.iqmp().unwrap().to_vec(),
    })
    .expect("engine accepts the test key");
    let p = BigUint::from_bytes_be(&rsa.p().unwrap().to_vec());
    let q = BigUint::from_bytes_be(&rsa.q().unwrap().to_vec());
    Key {
        qinv: q.modpow(&(&p - 2u32), &p),
        len: engine.modulus_len(),
        engine,
        n: BigUint::from_bytes_be(&rsa.n().to_vec()),
        p,
        q,
        dp: BigUint::from_bytes_be(&rsa.dmp1().unwrap().to_vec()),
        dq: BigUint::from_bytes_be(&rsa.dmq1().unwrap().to_vec()),
    }
}

fn keys() -> &'static [Key; 2] {
    static KEYS: OnceLock<[Key; 2]> = OnceLock::new();
    KEYS.get_or_init(|| {
        [
            load(include_bytes!("../keys/rsa2048.pem")),
            load(include_bytes!("../keys/rsa3072.pem")),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    if control == 0xff {
        // Arbitrary components: eight length-prefixed fields.
        let mut fields = Vec::new();
        let mut rest = rest;
        for _ in 0..8 {
            let Some((&len, tail)) = rest.split_first() else {
                return;
            };
            let len = (len as usize * 2).min(tail.len());
            fields.push(&tail[..len]);
            rest = &tail[len..];
        }
        let _ = RsaPrivateKey::from_components(&RsaComponents {
            n: fields[0],
            e: fields[1],
            d: fields[2],
            p: fields[3],
            q: fields[4],
            dp: fields[5],
            dq: fields[6],
            qinv: fields[7],
        });
        return;
    }
    // control: low 2 bits = batch size - 1 (1..=4 requests, 2..=8 lanes), the next bits
    // pick the key of each request (bit i+3 for request i).
    let count = (control & 3) as usize + 1;
    let keys = keys();
    let mut chosen = Vec::new();
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    let mut rest = rest;
    for i in 0..count {
        let key = &keys[((control >> (3 + i % 5)) & 1) as usize];
        // Each input: up to the modulus length of bytes; short inputs are small numbers.
        let take = rest.len().min(key.len);
        let mut input = rest[..take].to_vec();
        rest = &rest[take..];
        if input.len() == key.len && i % 2 == 1 {
            // Half the full-length inputs are folded below n, so most reach the arithmetic.
            let reduced = BigUint::from_bytes_be(&input) % &key.n;
            let bytes = reduced.to_bytes_be();
            input = vec![0u8; key.len - bytes.len()];
            input.extend_from_slice(&bytes);
        }
        chosen.push(key);
        inputs.push(input);
    }
    let engine_keys: Vec<&RsaPrivateKey> = chosen.iter().map(|k| &k.engine).collect();
    let input_refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    for kernel in [Kernel::Portable, Kernel::Ifma] {
        if !kernel.is_available() {
            continue;
        }
        let results = rsa_private_batch(kernel, &engine_keys, &input_refs);
        assert_eq!(results.len(), count);
        for ((key, input), result) in chosen.iter().zip(&inputs).zip(results) {
            let x = BigUint::from_bytes_be(input);
            if x >= key.n {
                assert_eq!(result, Err(EngineError::InputOutOfRange), "{kernel:?}");
                continue;
            }
            let expected = key.reference(&x).to_bytes_be();
            let got = result.unwrap_or_else(|e| panic!("{kernel:?}: {e} for input {input:02x?}"));
            assert_eq!(got.len(), key.len, "modulus-length output");
            let zeros = key.len - expected.len();
            assert!(got[..zeros].iter().all(|&b| b == 0), "{kernel:?}");
            assert_eq!(
                &got[zeros..],
                &expected[..],
                "{kernel:?}: input {input:02x?}"
            );
        }
    }
});
