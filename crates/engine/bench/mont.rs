//! Prototype timing of the Montgomery kernels: one 1024/1536/2048-bit
//! Montgomery multiplication and squaring (the CRT halves of RSA-2048/3072/
//! 4096), per lane, beside the cost per multiplication that BoringSSL's
//! RSA-2048 signature implies (sign time / 2,500 multiplications).
//!
//!   cargo run --release -p tlsterm-engine --example mont [-- ITERS [mul|sqr|exp]]
//!
//! With an operation named, only that one is timed (for a profiler) and the
//! BoringSSL comparison is left out. Otherwise three lines give the ceilings
//! of AVX2 arithmetic with every operand in a register: multiply-adds
//! (`vpmuludq` + `vpaddq`) per cycle, the rate no kernel built on them can
//! pass; the same loop with a scalar MULX/ADX multiply-accumulate stream in
//! its body, which tells whether the integer units could run one more
//! exponentiation beside the vector lanes without slowing them; and exact
//! 52x52-bit products per cycle done with double-precision FMA instead (the
//! other way to multiply on a CPU without IFMA), each worth (52/29)^2 = 3.2 of
//! the 29-bit multiply-adds.
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

/// The fastest of 9 runs of `run` (each gives its own time): on a shared
/// machine, other work only ever adds time.
fn fastest(mut run: impl FnMut() -> Duration) -> Duration {
    (0..9).map(|_| run()).min().expect("runs")
}

/// How long `f` takes.
fn timed(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// The ceilings of AVX2 arithmetic on this CPU, each from a loop whose
/// operands stay in registers, so nothing but the execution units limits
/// the rate: multiply-adds per TSC cycle (8 independent sums), alone and
/// beside scalar MULX/ADX products in the same loop, and exact 52x52-bit
/// products per cycle made with FMA instead. A line is left out
/// when the CPU lacks the instructions.
#[cfg(target_arch = "x86_64")]
fn print_ceilings(ghz: f64) {
    // Operations per TSC cycle of `f(ITERS)`, which does `per_round` per
    // round of its loop.
    let per_cycle = |per_round: u64, f: &dyn Fn(u64)| {
        const ITERS: u64 = 20_000_000;
        let t = fastest(|| timed(|| f(ITERS)));
        (ITERS * per_round) as f64 / (t.as_nanos() as f64 * ghz)
    };
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("bmi2")
        && is_x86_feature_detected!("adx")
    {
        // SAFETY (each call): AVX2, BMI2 and ADX are present (checked above).
        let vector = per_cycle(8, &|n| unsafe { ceiling_loop(CeilingLoop::Vector, n) });
        println!(
            "AVX2 ceiling: {vector:.2} multiply-adds (vpmuludq + vpaddq, 4 lanes each) per cycle, 8 independent sums in registers"
        );
        let scalar = per_cycle(4, &|n| unsafe { ceiling_loop(CeilingLoop::Scalar, n) });
        // Rounds of both per cycle: each round is 8 multiply-adds and 4 products.
        let both = per_cycle(1, &|n| unsafe { ceiling_loop(CeilingLoop::Both, n) });
        println!(
            "AVX2 and MULX in one loop: {:.2} multiply-adds and {:.2} 64x64-bit products per cycle (MULX/ADX alone: {scalar:.2} products)",
            8.0 * both,
            4.0 * both
        );
    }
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA are present (checked above).
        let rate = per_cycle(4, &|n| unsafe { fma_loop(n) });
        println!(
            "FMA ceiling: {rate:.2} exact 52x52-bit products (4 lanes each) per cycle, worth {:.2} of those multiply-adds",
            rate * (52.0f64 / 29.0).powi(2)
        );
    }
}

/// One round of 8 independent multiply-adds on registers (`vpmuludq` +
/// `vpaddq`, 4 lanes each): the vector side of a Montgomery kernel's inner
/// loop with nothing but the execution units to wait for.
#[cfg(target_arch = "x86_64")]
macro_rules! madd_round {
    () => {
        concat!(
            "vpmuludq {t0}, {x}, {y}\n",
            "vpaddq {a0}, {a0}, {t0}\n",
            "vpmuludq {t1}, {x}, {x}\n",
            "vpaddq {a1}, {a1}, {t1}\n",
            "vpmuludq {t2}, {y}, {y}\n",
            "vpaddq {a2}, {a2}, {t2}\n",
            "vpmuludq {t3}, {y}, {x}\n",
            "vpaddq {a3}, {a3}, {t3}\n",
            "vpmuludq {t0}, {x}, {y}\n",
            "vpaddq {a4}, {a4}, {t0}\n",
            "vpmuludq {t1}, {x}, {x}\n",
            "vpaddq {a5}, {a5}, {t1}\n",
            "vpmuludq {t2}, {y}, {y}\n",
            "vpaddq {a6}, {a6}, {t2}\n",
            "vpmuludq {t3}, {y}, {x}\n",
            "vpaddq {a7}, {a7}, {t3}\n",
        )
    };
}

/// One round of 4 scalar 64x64-bit products (`mulx`), each added to a
/// running sum by the two carry chains of a MULX/ADX Montgomery
/// multiplication (`adcx` the low halves, `adox` the high halves), as
/// BoringSSL's and OpenSSL's RSA code does on these CPUs.
#[cfg(target_arch = "x86_64")]
macro_rules! mulx_round {
    () => {
        concat!(
            "xor {z:e}, {z:e}\n",
            "mulx {h}, {l}, {s0}\n",
            "adcx {c0}, {l}\n",
            "adox {c1}, {h}\n",
            "mulx {h}, {l}, {s1}\n",
            "adcx {c0}, {l}\n",
            "adox {c1}, {h}\n",
            "mulx {h}, {l}, {s0}\n",
            "adcx {c0}, {l}\n",
            "adox {c1}, {h}\n",
            "mulx {h}, {l}, {s1}\n",
            "adcx {c0}, {l}\n",
            "adox {c1}, {h}\n",
        )
    };
}

/// What one round of `ceiling_loop` runs: `madd_round!`, `mulx_round!`, or
/// both in one loop body, so that the out-of-order core may run the vector
/// and the integer work side by side if its units allow.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum CeilingLoop {
    Vector,
    Scalar,
    Both,
}

/// `iters` rounds of `which`. Every operand is a register; the sums are
/// thrown away.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi2,adx")]
unsafe fn ceiling_loop(which: CeilingLoop, iters: u64) {
    use std::arch::asm;
    use std::arch::x86_64::_mm256_set1_epi64x;
    let (x, y) = (
        _mm256_set1_epi64x(0x1234_5678),
        _mm256_set1_epi64x(0x0bad_cafe),
    );
    let (s0, s1, d) = (
        0x9e37_79b9_7f4a_7c15u64,
        0x2545_f491_4f6c_dd1du64,
        0xbf58_476d_1ce4_e5b9u64,
    );
    // Each block only reads its inputs and writes the registers it declares
    // as outputs; AVX2, BMI2 and ADX are enabled for this function.
    macro_rules! run {
        ($($body:expr),*) => {
            // SAFETY: as above.
            unsafe {
                asm!(
                    "2:",
                    $($body,)*
                    "dec {n}",
                    "jnz 2b",
                    // Operands a body leaves out are named in a comment:
                    // asm! refuses operands that no template line uses.
                    "/* {x}{y}{t0}{t1}{t2}{t3}{a0}{a1}{a2}{a3}{a4}{a5}{a6}{a7}{z}{h}{l}{s0}{s1}{c0}{c1} */",
                    n = inout(reg) iters => _,
                    x = in(ymm_reg) x,
                    y = in(ymm_reg) y,
                    t0 = out(ymm_reg) _,
                    t1 = out(ymm_reg) _,
                    t2 = out(ymm_reg) _,
                    t3 = out(ymm_reg) _,
                    a0 = inout(ymm_reg) x => _,
                    a1 = inout(ymm_reg) x => _,
                    a2 = inout(ymm_reg) x => _,
                    a3 = inout(ymm_reg) x => _,
                    a4 = inout(ymm_reg) y => _,
                    a5 = inout(ymm_reg) y => _,
                    a6 = inout(ymm_reg) y => _,
                    a7 = inout(ymm_reg) y => _,
                    z = out(reg) _,
                    h = out(reg) _,
                    l = out(reg) _,
                    s0 = in(reg) s0,
                    s1 = in(reg) s1,
                    c0 = inout(reg) s0 => _,
                    c1 = inout(reg) s1 => _,
                    in("rdx") d,
                    options(nomem, nostack),
                )
            }
        };
    }
    match which {
        CeilingLoop::Vector => run!(madd_round!()),
        CeilingLoop::Scalar => run!(mulx_round!()),
        CeilingLoop::Both => run!(madd_round!(), mulx_round!()),
    }
}

/// `iters` rounds of 4 independent exact products of 52-bit integers held
/// in doubles, each split the way a kernel would have to: `hi = a*b + 2^104`
/// (its low 52 bits of mantissa are the high half, rounded), `lo = a*b -
/// (hi - 2^104)` exactly (signed, below 2^51), `lo + 1.5*2^52` (so its bits
/// are an integer), and both halves added as 64-bit integers to column sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop(iters: u64) {
    use std::arch::asm;
    use std::arch::x86_64::{_mm256_set1_pd, _mm256_setzero_si256};
    let (a, b) = (
        _mm256_set1_pd(3_456_789_012_345.0),
        _mm256_set1_pd(1_234_567_890_123.0),
    );
    // 2^104 and 1.5 * 2^52.
    let (c, m) = (
        _mm256_set1_pd(2f64.powi(104)),
        _mm256_set1_pd(1.5 * 2f64.powi(52)),
    );
    let zero = _mm256_setzero_si256();
    // SAFETY: the block only reads its inputs and writes the registers it
    // declares as outputs; AVX2 and FMA are enabled for this function.
    unsafe {
        asm!(
            "2:",
            "vmovapd {t0}, {c}", "vfmadd231pd {t0}, {a}, {b}", "vsubpd {s0}, {t0}, {c}",
            "vfmsub231pd {s0}, {a}, {b}", "vaddpd {s0}, {s0}, {m}",
            "vpaddq {h0}, {h0}, {t0}", "vpaddq {l0}, {l0}, {s0}",
            "vmovapd {t1}, {c}", "vfmadd231pd {t1}, {b}, {a}", "vsubpd {s1}, {t1}, {c}",
            "vfmsub231pd {s1}, {b}, {a}", "vaddpd {s1}, {s1}, {m}",
            "vpaddq {h0}, {h0}, {t1}", "vpaddq {l0}, {l0}, {s1}",
            "vmovapd {t2}, {c}", "vfmadd231pd {t2}, {a}, {a}", "vsubpd {s2}, {t2}, {c}",
            "vfmsub231pd {s2}, {a}, {a}", "vaddpd {s2}, {s2}, {m}",
            "vpaddq {h1}, {h1}, {t2}", "vpaddq {l1}, {l1}, {s2}",
            "vmovapd {t3}, {c}", "vfmadd231pd {t3}, {b}, {b}", "vsubpd {s3}, {t3}, {c}",
            "vfmsub231pd {s3}, {b}, {b}", "vaddpd {s3}, {s3}, {m}",
            "vpaddq {h1}, {h1}, {t3}", "vpaddq {l1}, {l1}, {s3}",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) iters => _,
            a = in(ymm_reg) a,
            b = in(ymm_reg) b,
            c = in(ymm_reg) c,
            m = in(ymm_reg) m,
            t0 = out(ymm_reg) _,
            t1 = out(ymm_reg) _,
            t2 = out(ymm_reg) _,
            t3 = out(ymm_reg) _,
            s0 = out(ymm_reg) _,
            s1 = out(ymm_reg) _,
            s2 = out(ymm_reg) _,
            s3 = out(ymm_reg) _,
            h0 = inout(ymm_reg) zero => _,
            h1 = inout(ymm_reg) zero => _,
            l0 = inout(ymm_reg) zero => _,
            l1 = inout(ymm_reg) zero => _,
            options(nomem, nostack),
        );
    }
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
            Kernel::Ifma | Kernel::Avx512 => &[8],
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
                    // it runs (14 for the table, 4 squarings and 1
                    // multiplication per further window), so the rows compare.
                    let per_call = match op {
                        MontOp::Exp => 14 + (bits.div_ceil(4) - 1) * 5,
                        _ => 1,
                    };
                    let n = if kernel == Kernel::Portable {
                        iters / 20
                    } else {
                        iters
                    };
                    let n = (n / per_call).max(2);
                    let t = fastest(|| mont_time(kernel, bits, op, lanes, n).expect("available"));
                    let ns = t.as_nanos() as f64 / (n * per_call) as f64;
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
    #[cfg(target_arch = "x86_64")]
    print_ceilings(ghz);
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
    let t = fastest(|| {
        timed(|| {
            for _ in 0..count {
                std::hint::black_box(sign_once());
            }
        })
    });
    let sign_ns = t.as_nanos() as f64 / count as f64;
    println!(
        "BoringSSL RSA-2048 sign: {:.0} us ({:.0}/s); implied 1024-bit Montgomery multiplication: {:.0} ns = {:.0} cycles",
        sign_ns / 1000.0,
        1e9 / sign_ns,
        sign_ns / 2500.0,
        sign_ns / 2500.0 * ghz
    );
}
