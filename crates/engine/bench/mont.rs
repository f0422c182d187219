//! Prototype timing of the Montgomery kernels: one 1024/1536/2048-bit
//! Montgomery multiplication and squaring (the CRT halves of RSA-2048/3072/
//! 4096), per lane, beside the cost per multiplication that BoringSSL's
//! RSA-2048 signature implies (sign time / 2,500 multiplications).
//!
//!   cargo run --release -p tlsterm-engine --example mont [-- ITERS [mul|sqr|exp]]
//!
//! With an operation named, only that one is timed (for a profiler) and the
//! BoringSSL comparison is left out.
//!
//! Cycles are TSC cycles (the clock `cpu MHz` in /proc/cpuinfo reports); run
//! it pinned (`taskset -c 1`) on a quiet machine.

use std::time::{Duration, Instant};

use boring::hash::MessageDigest;
use boring::pkey::PKey;
use boring::rsa::Rsa;
use boring::sign::Signer;
use tlsterm_engine::microbench::{mont_time, MontOp};
use tlsterm_engine::Kernel;

fn tsc_ghz() -> f64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map(|mhz| mhz / 1000.0)
        .unwrap_or(1.0)
}

/// The fastest run: on a shared machine, other work only ever adds time.
fn best(v: Vec<Duration>) -> Duration {
    v.into_iter().min().expect("runs")
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let only = std::env::args().nth(2);
    let ghz = tsc_ghz();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(str::to_owned)
        })
        .unwrap_or_default();
    println!("{model}; TSC {ghz:.2} GHz; {iters} dependent operations per run, best of 9");
    println!(
        "{:<11} {:>5} {:>5} {:>4} {:>10} {:>12} {:>12}",
        "kernel", "bits", "op", "lanes", "ns/op", "ns/lane-op", "cyc/lane-op"
    );
    for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available()) {
        let lanes_list: &[usize] = match kernel {
            Kernel::Ifma => &[8],
            Kernel::Avx2 => &[4, 8],
            Kernel::Portable => &[1],
        };
        for bits in [1024usize, 1536, 2048] {
            for op in [MontOp::Mul, MontOp::Sqr, MontOp::Exp] {
                let name = format!("{op:?}").to_lowercase();
                if only.as_ref().is_some_and(|o| *o != name) {
                    continue;
                }
                for &lanes in lanes_list {
                    // An exponentiation is reported per Montgomery operation
                    // it runs (30 for the table, 5 squarings and 1
                    // multiplication per further window), so the rows compare.
                    let per_call = match op {
                        MontOp::Exp => 30 + (bits.div_ceil(5) - 1) * 6,
                        _ => 1,
                    };
                    let n = if kernel == Kernel::Portable {
                        iters / 20
                    } else {
                        iters
                    };
                    let n = (n / per_call).max(2);
                    let runs: Vec<Duration> = (0..9)
                        .map(|_| mont_time(kernel, bits, op, lanes, n).expect("available"))
                        .collect();
                    let ns = best(runs).as_nanos() as f64 / (n * per_call) as f64;
                    let per_lane = ns / lanes as f64;
                    println!(
                        "{:<11} {:>5} {:>5} {:>4} {:>10.1} {:>12.1} {:>12.0}",
                        kernel.name(),
                        bits,
                        name,
                        lanes,
                        ns,
                        per_lane,
                        per_lane * ghz
                    );
                }
            }
        }
    }
    if only.is_some() {
        return;
    }
    // BoringSSL: RSA-2048 sign time / ~2,500 Montgomery multiplications of
    // 1024 bits (two CRT exponentiations of ~1,024 squarings + ~230
    // multiplications each).
    let rsa = Rsa::generate(2048).expect("key");
    let pkey = PKey::from_rsa(rsa).expect("pkey");
    let sign_once = || {
        let mut s = Signer::new(MessageDigest::sha256(), &pkey).expect("signer");
        s.update(b"tlsterm mont prototype").expect("update");
        s.sign_to_vec().expect("sign")
    };
    let count = 400;
    let runs: Vec<Duration> = (0..9)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..count {
                std::hint::black_box(sign_once());
            }
            start.elapsed()
        })
        .collect();
    let sign_ns = best(runs).as_nanos() as f64 / count as f64;
    println!(
        "BoringSSL RSA-2048 sign: {:.0} us ({:.0}/s); implied 1024-bit Montgomery multiplication: {:.0} ns = {:.0} cycles",
        sign_ns / 1000.0,
        1e9 / sign_ns,
        sign_ns / 2500.0,
        sign_ns / 2500.0 * ghz
    );
}
