//! `tlsterm speed`: private-key operations per second on the calling thread,
//! inline (BoringSSL, one at a time) vs the batch engine, one column per
//! multi-buffer kernel the CPU has (like `openssl speed -async_jobs N`).

use anyhow::{bail, Context};
use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::rsa::Rsa;
use boring::sign::Signer;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use tlsterm_engine::{
    EcdsaP256Key, EcdsaRequest, Hash, Kernel, P256Kernel, RsaComponents, RsaPadding, RsaPrivateKey,
    SignRequest, MAX_BATCH,
};

mod curves;

#[derive(clap::Args, Debug)]
pub struct SpeedArgs {
    /// Which implementation to measure.
    #[arg(long, value_enum, default_value = "both")]
    pub engine: SpeedEngine,
    /// Operations per batch for the batch engine (default: MAX_BATCH).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Kernels to measure (repeatable; default: every multi-buffer kernel this CPU
    /// supports; `portable` only when asked). X25519 has two: `ifma` and `portable`.
    #[arg(long, value_enum)]
    pub kernel: Vec<SpeedKernel>,
    /// Measure batch sizes 1..=8 against inline: ops/s and per-batch
    /// latency, to choose the small-batch threshold.
    #[arg(long)]
    pub batch_sizes: bool,
    /// Divide by wall-clock time instead of the thread's CPU time (as
    /// `openssl speed -elapsed`).
    #[arg(long)]
    pub elapsed: bool,
    /// Use RSA-PSS (SHA-256) instead of PKCS#1 v1.5 (SHA-256).
    #[arg(long)]
    pub pss: bool,
    /// Rounds of measurements. Each round measures inline and then every
    /// kernel, one after the other; the figures printed are medians over the
    /// rounds and the ratio is the median of each round's own ratio, so that
    /// a noisy shared machine moves both sides of a ratio alike. Not used by
    /// `--batch-sizes`.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Algorithms to measure (rsa2048, rsa3072, rsa4096, ecdsap256, ecdsap384; key shares
    /// x25519, x25519mlkem768, p256ecdh, p384ecdh); all if none.
    pub algorithms: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpeedEngine {
    Inline,
    Batch,
    Both,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpeedKernel {
    #[value(alias = "avx512ifma")]
    Ifma,
    #[value(name = "avx512f")]
    Avx512,
    Avx2,
    Portable,
}

impl SpeedKernel {
    fn kernel(self) -> Kernel {
        match self {
            SpeedKernel::Ifma => Kernel::Ifma,
            SpeedKernel::Avx512 => Kernel::Avx512,
            SpeedKernel::Avx2 => Kernel::Avx2,
            SpeedKernel::Portable => Kernel::Portable,
        }
    }
}

/// `--seconds`: a positive, finite time that a `Duration` can hold (the measuring
/// loop runs for it, and divides by it).
fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v.is_finite() && v > 0.0) || Duration::try_from_secs_f64(v).is_err() {
        return Err(format!("{s:?} must be a positive number of seconds"));
    }
    Ok(v)
}

/// The message every signature signs (TLS signs ~100-byte transcripts).
const MESSAGE: &[u8] = &[0x5a; 130];

/// CPU time (user + system) of the calling thread, from
/// /proc/thread-self/stat, in seconds (Linux USER_HZ is 100).
fn thread_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Runs `f` (which performs `ops_per_call` operations) repeatedly for about
/// `seconds` of wall time; returns (operations per second, seconds per
/// call). Like `openssl speed`, the divisor is the thread's CPU time (so a
/// busy shared machine that preempts us does not lower the figure), unless
/// `elapsed` asks for wall-clock time (`openssl speed -elapsed`).
fn measure(seconds: f64, elapsed: bool, ops_per_call: usize, mut f: impl FnMut()) -> (f64, f64) {
    f(); // warm-up: caches, page faults, CPU frequency
    let limit = Duration::from_secs_f64(seconds);
    let cpu0 = thread_cpu_seconds();
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < limit {
        f();
        calls += 1;
    }
    let wall = start.elapsed().as_secs_f64();
    let secs = match (elapsed, cpu0, thread_cpu_seconds()) {
        (false, Some(a), Some(b)) if b > a => b - a,
        _ => wall,
    };
    (
        (calls as f64 * ops_per_call as f64) / secs,
        secs / calls as f64,
    )
}

struct RsaSetup {
    pkey: PKey<Private>,
    key: RsaPrivateKey,
}

fn rsa_setup(bits: u32) -> anyhow::Result<RsaSetup> {
    let rsa = Rsa::generate(bits)?;
    let c = |x: Option<&boring::bn::BigNumRef>| -> anyhow::Result<Vec<u8>> {
        Ok(x.context("missing CRT component")?.to_vec())
    };
    let key = RsaPrivateKey::from_components(&RsaComponents {
        n: &rsa.n().to_vec(),
        e: &rsa.e().to_vec(),
        d: &rsa.d().to_vec(),
        p: &c(rsa.p())?,
        q: &c(rsa.q())?,
        dp: &c(rsa.dmp1())?,
        dq: &c(rsa.dmq1())?,
        qinv: &c(rsa.iqmp())?,
    })?;
    Ok(RsaSetup {
        pkey: PKey::from_rsa(rsa)?,
        key,
    })
}

fn inline_rsa_sign(pkey: &PKey<Private>, pss: bool) -> Vec<u8> {
    let mut s = Signer::new(MessageDigest::sha256(), pkey).expect("signer");
    if pss {
        s.set_rsa_padding(boring::rsa::Padding::PKCS1_PSS)
            .expect("pss");
        s.set_rsa_pss_saltlen(boring::sign::RsaPssSaltlen::DIGEST_LENGTH)
            .expect("saltlen");
    }
    s.update(MESSAGE).expect("update");
    s.sign_to_vec().expect("sign")
}

/// A new P-256 key, as the engine's and as BoringSSL's.
fn ecdsa_setup() -> anyhow::Result<(EcdsaP256Key, PKey<Private>)> {
    progress("ecdsap256: generating key");
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    let ec = EcKey::generate(&group)?;
    let scalar = zeroize::Zeroizing::new(ec.private_key().to_vec_padded(32)?);
    let key = EcdsaP256Key::from_private_scalar(&scalar)?;
    Ok((key, PKey::from_ec_key(ec)?))
}

/// One ECDSA P-256 signature by BoringSSL, inline.
fn inline_ecdsa_sign(pkey: &PKey<Private>) {
    let mut s = Signer::new(MessageDigest::sha256(), pkey).expect("signer");
    s.update(MESSAGE).expect("update");
    s.sign_to_vec().expect("sign");
}

/// `n` ECDSA P-256 signatures by the IFMA kernel (each fault-checked by the engine).
fn ecdsa_sign(key: &EcdsaP256Key, n: usize) {
    let reqs: Vec<EcdsaRequest<'_>> = (0..n)
        .map(|_| EcdsaRequest {
            key,
            hash: Hash::Sha256,
            message: MESSAGE,
        })
        .collect();
    for r in tlsterm_engine::ecdsa_p256_sign_batch(P256Kernel::Ifma, &reqs) {
        r.expect("engine signature");
    }
}

fn batch_sign(kernel: Kernel, key: &RsaPrivateKey, padding: RsaPadding, n: usize) {
    let reqs: Vec<SignRequest<'_>> = (0..n)
        .map(|_| SignRequest {
            key,
            padding,
            message: MESSAGE,
        })
        .collect();
    for r in tlsterm_engine::sign_batch(kernel, &reqs) {
        r.expect("engine signature");
    }
}

/// One-line progress on a terminal (silent when stderr is redirected).
fn progress(msg: &str) {
    if std::io::stderr().is_terminal() {
        eprint!("\r{msg:<60}");
        let _ = std::io::stderr().flush();
    }
}

/// `tlsterm speed`. Over 80 lines on purpose: one report in the order it prints (the
/// arguments checked, one measurement loop per algorithm, then the table); a benchmark
/// command, off the serving path.
pub fn run(args: &SpeedArgs) -> anyhow::Result<()> {
    let kernels: Vec<Kernel> = if args.kernel.is_empty() {
        Kernel::simd_available()
    } else {
        args.kernel.iter().map(|k| k.kernel()).collect()
    };
    for kernel in &kernels {
        if !kernel.is_available() {
            bail!("kernel {} is not available on this CPU", kernel.name());
        }
    }
    if kernels.is_empty() {
        println!(
            "no multi-buffer kernel on this CPU (neither AVX-512 IFMA nor AVX2): `serve` signs inline; \
             `--kernel portable` measures the reference kernel"
        );
    }
    let jobs = args.jobs.unwrap_or(MAX_BATCH);
    if jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let algs: Vec<String> = if args.algorithms.is_empty() {
        ["rsa2048", "rsa3072", "rsa4096", "ecdsap256"]
            .into_iter()
            .chain(curves::NAMES)
            .map(String::from)
            .collect()
    } else {
        args.algorithms.clone()
    };
    let (curve_algs, algs): (Vec<String>, Vec<String>) = algs
        .into_iter()
        .partition(|alg| curves::NAMES.contains(&alg.as_str()));
    let curve_algs: Vec<&str> = curve_algs.iter().map(String::as_str).collect();
    let padding = if args.pss {
        RsaPadding::Pss(Hash::Sha256)
    } else {
        RsaPadding::Pkcs1v15(Hash::Sha256)
    };
    let pad_name = if args.pss { "PSS" } else { "PKCS#1 v1.5" };
    let do_inline = args.engine != SpeedEngine::Batch;
    let batch_kernels: &[Kernel] = if args.engine == SpeedEngine::Inline {
        &[]
    } else {
        &kernels
    };

    if args.batch_sizes {
        for &kernel in &kernels {
            batch_sizes(args, kernel, padding, &algs)?;
        }
        return curves::run(args, &curve_algs);
    }

    println!(
        "{}; one core, calling thread; {pad_name} SHA-256 for RSA; batch = {jobs} per call; per {} second",
        cpu_model(),
        if args.elapsed { "wall-clock" } else { "CPU" }
    );
    if algs.is_empty() {
        return curves::run(args, &curve_algs);
    }
    let mut rows = Vec::new();
    for alg in &algs {
        // Operations per second of each round, inline and per kernel.
        let (inline, batch): (Vec<f64>, Vec<Vec<f64>>) = match alg.as_str() {
            "rsa2048" | "rsa3072" | "rsa4096" => {
                let bits: u32 = alg[3..].parse()?;
                progress(&format!("{alg}: generating key"));
                let setup = rsa_setup(bits)?;
                let mut inline = Vec::new();
                let mut batch = vec![Vec::new(); batch_kernels.len()];
                for round in 1..=args.rounds {
                    if do_inline {
                        progress(&format!("{alg}: round {round}: inline (BoringSSL)"));
                        inline.push(
                            measure(args.seconds, args.elapsed, 1, || {
                                inline_rsa_sign(&setup.pkey, args.pss);
                            })
                            .0,
                        );
                    }
                    for (runs, &kernel) in batch.iter_mut().zip(batch_kernels) {
                        progress(&format!(
                            "{alg}: round {round}: batch of {jobs} ({})",
                            kernel.name()
                        ));
                        runs.push(
                            measure(args.seconds, args.elapsed, jobs, || {
                                batch_sign(kernel, &setup.key, padding, jobs)
                            })
                            .0,
                        );
                    }
                }
                (inline, batch)
            }
            "ecdsap256" => {
                let (key, pkey) = ecdsa_setup()?;
                let sign = || inline_ecdsa_sign(&pkey);
                let mut inline = Vec::new();
                let mut batch = vec![Vec::new(); batch_kernels.len()];
                for round in 1..=args.rounds {
                    if do_inline {
                        progress(&format!("{alg}: round {round}: inline (BoringSSL)"));
                        inline.push(measure(args.seconds, args.elapsed, 1, sign).0);
                    }
                    // P-256 has one multi-buffer kernel: its figure goes in the IFMA column.
                    for (runs, _) in batch
                        .iter_mut()
                        .zip(batch_kernels)
                        .filter(|(_, &k)| k == Kernel::Ifma)
                    {
                        let lanes = P256Kernel::Ifma.lanes();
                        progress(&format!(
                            "{alg}: round {round}: batch of {lanes} (avx512ifma)"
                        ));
                        runs.push(
                            measure(args.seconds, args.elapsed, lanes, || {
                                ecdsa_sign(&key, lanes)
                            })
                            .0,
                        );
                    }
                }
                (inline, batch)
            }
            other => bail!(
                "unknown algorithm {other:?} (rsa2048, rsa3072, rsa4096, ecdsap256, {})",
                curves::NAMES.join(", ")
            ),
        };
        rows.push((alg.clone(), inline, batch));
    }
    progress("");
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.0}"));
    let ranges = args.rounds > 1;
    let mut header = format!("{:<10} {:>12}", "algorithm", "inline/s");
    for kernel in batch_kernels {
        header += &format!(" {:>12} {:>7}", format!("{}/s", kernel.name()), "ratio");
        if ranges {
            header += &format!(" {:>11}", "range");
        }
    }
    println!("{header}");
    for (alg, inline, batch) in rows {
        let mut line = format!("{alg:<10} {:>12}", f(median(&inline)));
        for b in batch {
            let ratio = paired_ratio(&inline, &b);
            line += &format!(
                " {:>12} {:>7}",
                f(median(&b)),
                ratio.map_or("-".into(), |r| format!("{:.2}", r.median))
            );
            if ranges {
                let range = ratio.map_or("-".into(), |r| format!("{:.2}-{:.2}", r.min, r.max));
                line += &format!(" {range:>11}");
            }
        }
        println!("{line}");
    }
    if !batch_kernels.is_empty() {
        println!(
            "ratio: the kernel's operations per second over BoringSSL inline; ECDSA P-256: \
             the IFMA kernel only, batch of {}",
            P256Kernel::Ifma.lanes()
        );
    }
    if ranges {
        println!(
            "{} rounds: operations per second are medians; ratio is the median of the rounds' own ratios, range their lowest and highest",
            args.rounds
        );
    }
    println!();
    curves::run(args, &curve_algs)
}

/// The median of `v` (the mean of the middle two for an even count), `None`
/// when empty.
fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(s[n / 2]),
        _ => Some((s[n / 2 - 1] + s[n / 2]) / 2.0),
    }
}

/// Ratios of a kernel's rounds over inline's, each round with its own.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PairedRatio {
    median: f64,
    min: f64,
    max: f64,
}

/// `kernel[r] / inline[r]` over the rounds both measured; `None` if there
/// are none.
fn paired_ratio(inline: &[f64], kernel: &[f64]) -> Option<PairedRatio> {
    let ratios: Vec<f64> = inline.iter().zip(kernel).map(|(i, k)| k / i).collect();
    Some(PairedRatio {
        median: median(&ratios)?,
        min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// The CPU's model name, for every figure printed.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Batch sizes 1..=8 vs inline: where does batching start to pay? For each RSA size and
/// kernel, and for ECDSA P-256 on its IFMA kernel.
fn batch_sizes(
    args: &SpeedArgs,
    kernel: Kernel,
    padding: RsaPadding,
    algs: &[String],
) -> anyhow::Result<()> {
    for alg in algs {
        match alg.as_str() {
            "rsa2048" | "rsa3072" | "rsa4096" => {
                progress(&format!("{alg}: generating key"));
                let setup = rsa_setup(alg[3..].parse()?)?;
                progress(&format!("{alg}: inline"));
                let inline = measure(args.seconds, args.elapsed, 1, || {
                    inline_rsa_sign(&setup.pkey, args.pss);
                });
                batch_size_table(
                    args,
                    &format!("{alg}, kernel {}", kernel.name()),
                    "inline (BoringSSL)",
                    inline,
                    |n| batch_sign(kernel, &setup.key, padding, n),
                );
                if kernel == Kernel::Ifma {
                    aws_lc_single_rsa(args, alg, &setup.pkey)?;
                }
            }
            // P-256 has one multi-buffer kernel.
            "ecdsap256" if kernel == Kernel::Ifma => {
                let (key, pkey) = ecdsa_setup()?;
                progress(&format!("{alg}: inline"));
                let inline = measure(args.seconds, args.elapsed, 1, || {
                    inline_ecdsa_sign(&pkey);
                });
                batch_size_table(
                    args,
                    &format!("{alg}, kernel {}", kernel.name()),
                    "inline (BoringSSL)",
                    inline,
                    |n| ecdsa_sign(&key, n),
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// What a lone RSA signature costs by aws-lc, which signs the signatures below the IFMA
/// kernel's small-batch threshold: set beside the table's batch of 1.
fn aws_lc_single_rsa(args: &SpeedArgs, alg: &str, pkey: &PKey<Private>) -> anyhow::Result<()> {
    use crate::offload::{HashAlg, Scheme, SigningKey};
    let key = SigningKey::new(pkey.clone())?;
    let scheme = if args.pss {
        Scheme::RsaPss(HashAlg::Sha256)
    } else {
        Scheme::RsaPkcs1(HashAlg::Sha256)
    };
    progress(&format!("{alg}: aws-lc-rs, one at a time"));
    let (ops, seconds) = measure(args.seconds, args.elapsed, 1, || {
        key.sign_rsa_aws_lc(scheme, MESSAGE)
            .expect("an RSA key for aws-lc")
            .expect("aws-lc signature");
    });
    progress("");
    println!(
        "{alg}: aws-lc-rs {ops:.0} ops/s, {:.1} us per op: it signs the batches below \
         `small_batch_threshold` one by one\n",
        seconds * 1e6
    );
    Ok(())
}

/// Batches of 1..=8 operations of `what` against one at a time by `reference` (whose
/// operations per second and seconds per operation are `single`): the table, and the first
/// size at which a batch takes less time than that many single operations, which is what
/// the `[engine] *_small_batch_threshold` settings are chosen from.
fn batch_size_table(
    args: &SpeedArgs,
    what: &str,
    reference: &str,
    (single_ops, single): (f64, f64),
    mut batch: impl FnMut(usize),
) {
    let mut rows = Vec::new();
    for n in 1..=tlsterm_engine::LANES {
        progress(&format!("{what}: batch of {n}"));
        rows.push((n, measure(args.seconds, args.elapsed, n, || batch(n))));
    }
    progress("");
    println!(
        "{what}: {reference} {single_ops:.0} ops/s, {:.1} us per op",
        single * 1e6
    );
    println!(
        "{:>5} {:>10} {:>14} {:>16} {:>8}",
        "batch", "ops/s", "batch lat us", "n x single us", "ratio"
    );
    let mut threshold = None;
    for (n, (ops, latency)) in rows {
        let serial = n as f64 * single;
        if threshold.is_none() && latency < serial {
            threshold = Some(n);
        }
        println!(
            "{n:>5} {ops:>10.0} {:>14.1} {:>16.1} {:>8.2}",
            latency * 1e6,
            serial * 1e6,
            ops / single_ops
        );
    }
    match threshold {
        Some(k) => println!("batching beats {reference} from {k} operation(s) per batch\n"),
        None => println!(
            "batching never beats {reference} up to {}\n",
            tlsterm_engine::LANES
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{median, paired_ratio, PairedRatio, SpeedArgs};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SpeedArgs,
    }

    #[test]
    fn seconds_must_be_a_positive_finite_time() {
        for bad in ["-1", "0", "nan", "inf", "-inf", "1e300", "x"] {
            let arg = format!("--seconds={bad}");
            assert!(
                Cli::try_parse_from(["speed", arg.as_str()]).is_err(),
                "{arg} accepted"
            );
        }
        let ok = Cli::try_parse_from(["speed", "--seconds=0.5"]).unwrap();
        assert_eq!(ok.args.seconds, 0.5);
        assert_eq!(Cli::parse_from(["speed"]).args.seconds, 3.0);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ratio_pairs_each_round_with_its_own() {
        // A slow second round slows both sides: paired, the ratio stays 2;
        // the ratio of the medians would not.
        let inline = [100.0, 50.0, 100.0];
        let kernel = [200.0, 100.0, 150.0];
        assert_eq!(
            paired_ratio(&inline, &kernel),
            Some(PairedRatio {
                median: 2.0,
                min: 1.5,
                max: 2.0
            })
        );
        assert_eq!(paired_ratio(&[], &kernel), None);
    }
}
