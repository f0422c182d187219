//! Shared helpers: BoringSSL keys (generated once per test binary) converted
//! to engine keys.
#![allow(dead_code)]

use boring::bn::BigNum;
use boring::pkey::Private;
use boring::rsa::Rsa;
use std::sync::OnceLock;
use tlsterm_engine::{Kernel, RsaComponents, RsaPrivateKey};

pub struct TestKey {
    pub boring: Rsa<Private>,
    pub engine: RsaPrivateKey,
}

pub fn convert(r: &Rsa<Private>) -> RsaPrivateKey {
    RsaPrivateKey::from_components(&RsaComponents {
        n: &r.n().to_vec(),
        e: &r.e().to_vec(),
        d: &r.d().to_vec(),
        p: &r.p().unwrap().to_vec(),
        q: &r.q().unwrap().to_vec(),
        dp: &r.dmp1().unwrap().to_vec(),
        dq: &r.dmq1().unwrap().to_vec(),
        qinv: &r.iqmp().unwrap().to_vec(),
    })
    .expect("valid key")
}

fn gen(bits: u32, count: usize) -> Vec<TestKey> {
    (0..count)
        .map(|_| {
            let boring = Rsa::generate(bits).unwrap();
            let engine = convert(&boring);
            TestKey { boring, engine }
        })
        .collect()
}

/// A few keys per size (4096-bit generation is slow, so few).
pub fn keys(bits: usize) -> &'static [TestKey] {
    static K2048: OnceLock<Vec<TestKey>> = OnceLock::new();
    static K3072: OnceLock<Vec<TestKey>> = OnceLock::new();
    static K4096: OnceLock<Vec<TestKey>> = OnceLock::new();
    match bits {
        2048 => K2048.get_or_init(|| gen(2048, 4)),
        3072 => K3072.get_or_init(|| gen(3072, 3)),
        4096 => K4096.get_or_init(|| gen(4096, 2)),
        _ => panic!("unsupported size"),
    }
}

/// Every kernel this CPU runs; the ones it lacks are named as skipped.
pub fn kernels() -> Vec<Kernel> {
    let (have, lack): (Vec<Kernel>, Vec<Kernel>) =
        Kernel::ALL.into_iter().partition(|k| k.is_available());
    for k in lack {
        eprintln!("note: kernel {} skipped: this CPU lacks it", k.name());
    }
    have
}

/// Raw RSA private operation by BoringSSL (no padding).
pub fn boring_raw(r: &Rsa<Private>, input: &[u8]) -> Vec<u8> {
    let k = r.size() as usize;
    let mut padded = vec![0u8; k - input.len()];
    padded.extend_from_slice(input);
    let mut out = vec![0u8; k];
    let n = r
        .private_encrypt(&padded, &mut out, boring::rsa::Padding::NONE)
        .unwrap();
    assert_eq!(n, k);
    out
}

pub fn bn_bytes(x: &BigNum, len: usize) -> Vec<u8> {
    let v = x.to_vec();
    let mut out = vec![0u8; len - v.len()];
    out.extend_from_slice(&v);
    out
}

/// Deterministic pseudo-random bytes (xorshift) for reproducible tests.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}
