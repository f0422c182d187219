//! Handshakes through `serve` with the batch engine: many concurrent clients, RSA keys of
//! every size, PSS and PKCS#1 v1.5, ECDSA P-256 and P-384; each client verifies the server's
//! signature (BoringSSL checks CertificateVerify / ServerKeyExchange even when it does not
//! check the chain).
//!
//! Every test runs through the best kernel this CPU has and asserts the path that kernel
//! implies: batched with AVX-512 IFMA or AVX2, inline without either. Each SIMD kernel the
//! CPU has is also forced once (`[engine] kernel`), so an IFMA machine covers AVX2 too.

use crate::common::*;
use boring::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
use tlsterm_engine::{Kernel, P256Kernel};
use tokio::net::TcpStream;

#[derive(Clone, Copy)]
enum Sig {
    Pss13,
    Pss12,
    Pkcs1v15,
    /// ECDSA (the certificate's key decides the algorithm in TLS 1.3).
    Any13,
    Ecdsa12,
    /// TLS 1.2, ECDSA with SHA-384 only (what a P-384 key signs in TLS 1.3).
    EcdsaSha384Tls12,
}

async fn handshake(port: u16, sig: Sig) -> anyhow::Result<()> {
    let mut builder = SslConnector::builder(SslMethod::tls())?;
    builder.set_verify(SslVerifyMode::NONE);
    match sig {
        Sig::Pss13 | Sig::Any13 => builder.set_min_proto_version(Some(SslVersion::TLS1_3))?,
        Sig::Pss12 => {
            builder.set_max_proto_version(Some(SslVersion::TLS1_2))?;
            builder.set_sigalgs_list("RSA-PSS+SHA256:RSA-PSS+SHA384")?;
        }
        Sig::Pkcs1v15 => {
            builder.set_max_proto_version(Some(SslVersion::TLS1_2))?;
            builder.set_sigalgs_list("RSA+SHA256:RSA+SHA512")?;
        }
        Sig::Ecdsa12 => {
            builder.set_max_proto_version(Some(SslVersion::TLS1_2))?;
            builder.set_sigalgs_list("ECDSA+SHA256:ECDSA+SHA384")?;
        }
        Sig::EcdsaSha384Tls12 => {
            builder.set_max_proto_version(Some(SslVersion::TLS1_2))?;
            builder.set_sigalgs_list("ECDSA+SHA384")?;
        }
    }
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let mut tls = tokio_boring::connect(builder.build().configure()?, "localhost", tcp).await?;
    let body = http_get(&mut tls, "/bytes/64").await?;
    anyhow::ensure!(body.len() == 64);
    Ok(())
}

/// What the server reports about its signing path.
struct Load {
    /// Signatures made with the certificate's key (batch and inline).
    signatures: f64,
    /// Of those, the ones the multi-buffer engine made.
    batched: f64,
    /// Of those, the ones aws-lc made.
    aws_lc: f64,
    batches: f64,
    ops_in_batches: f64,
    /// Batches below their kind's small-batch threshold, signed one by one inline.
    small_batches: f64,
    /// `tlsterm_engine_info` labels: the kernel that signs, and "batch" or "inline".
    kernel: String,
    signing: String,
}

/// `openssl req -newkey` arguments, the `algorithm` label of the key's signatures, and the
/// client's signature choices, for `key` ("rsa:BITS", "ec:P-256" or "ec:P-384").
fn key_type(key: &str) -> (Vec<&str>, &'static str, &'static [Sig]) {
    if key == "ec:P-256" {
        let args = vec!["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        (args, "ecdsap256", &[Sig::Any13, Sig::Ecdsa12])
    } else if key == "ec:P-384" {
        let args = vec!["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:secp384r1"];
        (args, "ecdsap384", &[Sig::Any13, Sig::EcdsaSha384Tls12])
    } else {
        let algorithm = match key {
            "rsa:2048" => "rsa2048",
            "rsa:3072" => "rsa3072",
            "rsa:4096" => "rsa4096",
            other => panic!("no test key type {other}"),
        };
        (
            vec!["-newkey", key],
            algorithm,
            &[Sig::Pss13, Sig::Pss12, Sig::Pkcs1v15],
        )
    }
}

async fn run_load(engine: &str, key: &str, clients: usize, per_client: usize) -> Load {
    let dir = tempfile::tempdir().unwrap();
    let (newkey, algorithm, sigs) = key_type(key);
    let port = free_port();
    let cert = dir.path().join("c.pem");
    let keyfile = dir.path().join("k.pem");
    run(std::process::Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "2"])
        .args(&newkey)
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&keyfile)
        .arg("-out")
        .arg(&cert));
    let listener = format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        keyfile.display().to_string()
    );
    // Every batch goes to the kernel, however small, unless the test sets its own threshold.
    let mut thresholds = String::new();
    for key in ["small_batch_threshold", "ecdsa_small_batch_threshold"] {
        if !engine
            .lines()
            .any(|line| line.starts_with(&format!("{key} =")))
        {
            thresholds += &format!("{key} = 1\n");
        }
    }
    let header = format!("[engine]\n{engine}\n{thresholds}poll_delay = \"2ms\"\n");
    let config = write_config(dir.path(), &header, &[listener]);
    let _server = Server::start(&config);
    let admin = admin_address(&config).unwrap();

    let mut tasks = Vec::new();
    for client in 0..clients {
        let sig = sigs[client % sigs.len()];
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_client {
                handshake(port, sig)
                    .await
                    .expect("handshake with a verified signature");
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(DEADLINE * 4, task)
            .await
            .expect("load finishes")
            .unwrap();
    }
    let ops = "tlsterm_engine_operations_total";
    let signatures = metric(admin, ops, &format!("algorithm=\"{algorithm}"));
    let batched = metric(
        admin,
        ops,
        &format!("algorithm=\"{algorithm}\",path=\"batch\""),
    );
    let aws_lc = metric(
        admin,
        ops,
        &format!("algorithm=\"{algorithm}\",path=\"aws-lc-rs\""),
    );
    let batches = metric(admin, "tlsterm_engine_batch_operations_count", "");
    let ops_in_batches = metric(admin, "tlsterm_engine_batch_operations_sum", "");
    let small_batches = metric(admin, "tlsterm_engine_flushes_total", "cause=\"small\"");
    assert_eq!(
        signatures,
        (clients * per_client) as f64,
        "one signature per handshake"
    );
    let (status, text) = admin_get(admin, "/metrics");
    assert_eq!(status, 200);
    let info = text
        .lines()
        .find(|l| l.starts_with("tlsterm_engine_info{") && l.ends_with(" 1"))
        .expect("tlsterm_engine_info")
        .to_string();
    let label = |name: &str| {
        let start = info.find(&format!("{name}=\"")).expect("label") + name.len() + 2;
        info[start..start + info[start..].find('"').unwrap()].to_string()
    };
    Load {
        signatures,
        batched,
        aws_lc,
        batches,
        ops_in_batches,
        small_batches,
        kernel: label("kernel"),
        signing: label("signing"),
    }
}

/// The kernel `serve` signs with by default here, if any ("none": inline).
fn best_kernel() -> &'static str {
    match Kernel::simd_available().first() {
        Some(k) => k.name(),
        None => "none",
    }
}

/// Asserts the path `load` took: batched through `kernel`, or inline when it is "none".
fn assert_path(load: &Load, kernel: &str, what: &str) {
    assert_eq!(load.kernel, kernel, "{what}: kernel in tlsterm_engine_info");
    if kernel == "none" {
        eprintln!("note: {what}: no SIMD kernel (AVX-512 IFMA, AVX-512F, AVX2) on this CPU; checking the inline path");
        assert_eq!(load.signing, "inline", "{what}");
        assert_eq!(load.batches, 0.0, "{what}: no batch without a SIMD kernel");
    } else {
        assert_eq!(load.signing, "batch", "{what}");
        assert_eq!(
            load.ops_in_batches, load.signatures,
            "{what}: every RSA signature went through a multi-buffer batch ({kernel})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa2048_concurrent_handshakes_through_the_best_kernel() {
    let load = run_load("mode = \"batch\"", "rsa:2048", 48, 6).await;
    assert_path(&load, best_kernel(), "rsa2048");
    if best_kernel() != "none" {
        assert!(
            load.ops_in_batches / load.batches > 1.0,
            "batches held more than one operation on average ({} ops in {} batches)",
            load.ops_in_batches,
            load.batches
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa3072_and_rsa4096_through_the_best_kernel() {
    for key in ["rsa:3072", "rsa:4096"] {
        let load = run_load("mode = \"batch\"", key, 12, 2).await;
        assert_path(&load, best_kernel(), key);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_simd_kernel_of_this_cpu_signs_handshakes() {
    for kernel in Kernel::ALL.into_iter().filter(|k| k.is_simd()) {
        let name = kernel.name();
        if !kernel.is_available() {
            eprintln!("note: kernel {name} skipped: this CPU lacks it");
            continue;
        }
        let load = run_load(
            &format!("mode = \"batch\"\nkernel = \"{name}\""),
            "rsa:2048",
            12,
            3,
        )
        .await;
        assert_path(&load, name, name);
    }
}

/// ECDSA P-256 signatures join the queue where the IFMA kernel signs them (TLS 1.3 and
/// 1.2 handshakes); without IFMA, BoringSSL signs them inline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecdsa_p256_handshakes_are_batched_with_ifma() {
    let load = run_load("mode = \"batch\"", "ec:P-256", 16, 3).await;
    if P256Kernel::Ifma.is_available() && best_kernel() != "none" {
        assert_eq!(
            load.batched, load.signatures,
            "every P-256 signature was batched"
        );
        assert_eq!(load.ops_in_batches, load.signatures);
    } else {
        eprintln!("note: no IFMA kernel on this CPU; checking that P-256 signs inline");
        assert_eq!(load.batched, 0.0);
    }
}

/// `[engine] ecdsa = "inline"`: BoringSSL signs every P-256 signature at once, and RSA
/// signatures are batched as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecdsa_inline_signs_p256_inline_and_leaves_rsa_batched() {
    let engine = "mode = \"batch\"\necdsa = \"inline\"";
    let load = run_load(engine, "ec:P-256", 8, 2).await;
    assert_eq!(load.batched, 0.0, "no P-256 signature was batched");
    assert_eq!(load.batches + load.small_batches, 0.0, "none was queued");
    let load = run_load(engine, "rsa:2048", 8, 2).await;
    assert_path(&load, best_kernel(), "rsa2048 beside ecdsa = \"inline\"");
}

/// ECDSA P-384 has no kernel: aws-lc signs each signature at once on every CPU (TLS 1.3,
/// and TLS 1.2 with SHA-384), without the queue; `ecdsa = "inline"` leaves them to BoringSSL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecdsa_p384_is_signed_by_aws_lc_unless_inline() {
    let load = run_load("mode = \"batch\"", "ec:P-384", 8, 2).await;
    assert_eq!(
        load.aws_lc, load.signatures,
        "every P-384 signature was aws-lc's"
    );
    assert_eq!(load.batches + load.small_batches, 0.0, "none was queued");
    let load = run_load("mode = \"batch\"\necdsa = \"inline\"", "ec:P-384", 4, 2).await;
    assert_eq!(load.aws_lc, 0.0, "BoringSSL signed every P-384 signature");
    let load = run_load("mode = \"inline\"", "ec:P-384", 4, 2).await;
    assert_eq!(load.aws_lc, 0.0, "BoringSSL signed every P-384 signature");
}

/// ECDSA P-256 batches follow `ecdsa_small_batch_threshold`, not RSA's threshold (1 here):
/// with at most 4 handshakes in flight, no batch reaches 8, so each P-256 signature is
/// queued and then signed inline as part of a small batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_ecdsa_batch_is_signed_inline() {
    let engine = "mode = \"batch\"\necdsa_small_batch_threshold = 8";
    let load = run_load(engine, "ec:P-256", 4, 3).await;
    assert_eq!(load.batched, 0.0);
    assert_eq!(load.batches, 0.0);
    if P256Kernel::Ifma.is_available() && best_kernel() != "none" {
        assert!(load.small_batches > 0.0, "P-256 signatures were queued");
        assert_eq!(load.signing, "batch", "RSA signing is still batched");
    } else {
        eprintln!("note: no IFMA kernel on this CPU; checking that P-256 signs inline");
        assert_eq!(load.small_batches, 0.0);
    }
}

/// One handshake at a time: each RSA signature is a batch of one, below the threshold of
/// 2 (IFMA's default). Where the IFMA kernel batches RSA, aws-lc signs it (its own IFMA
/// code is faster for one signature than a pass of the kernel); elsewhere BoringSSL does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_rsa_signature_is_aws_lcs_where_ifma_batches_rsa() {
    let engine = "mode = \"batch\"\nsmall_batch_threshold = 2";
    let load = run_load(engine, "rsa:2048", 1, 3).await;
    assert_eq!(load.batches, 0.0, "no batch reached the kernel");
    if best_kernel() == "avx512ifma" {
        assert_eq!(load.small_batches, load.signatures, "each was queued alone");
        assert_eq!(load.aws_lc, load.signatures, "aws-lc signed every one");
    } else {
        eprintln!(
            "note: no IFMA kernel on this CPU; checking that BoringSSL signs lone RSA signatures"
        );
        assert_eq!(load.aws_lc, 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_never_batches() {
    let load = run_load("mode = \"inline\"", "rsa:2048", 8, 2).await;
    assert_eq!(load.batches, 0.0);
    assert_eq!(
        (load.kernel.as_str(), load.signing.as_str()),
        ("none", "inline")
    );
}

/// A batch size below the small-batch threshold would queue every signature only to sign
/// it inline (no batch could reach the kernel): `serve` signs inline from the start, without
/// the queue's wait, and `tlsterm_engine_info` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_size_below_the_small_batch_threshold_signs_inline() {
    let engine = "mode = \"batch\"\nbatch_size = 1\nsmall_batch_threshold = 2";
    let load = run_load(engine, "rsa:2048", 8, 2).await;
    assert_eq!(load.batches, 0.0);
    assert_eq!(
        (load.kernel.as_str(), load.signing.as_str()),
        ("none", "inline")
    );
}

/// `tlsterm speed --batch-sizes` prints, per kernel this CPU has, a table of batches of 1
/// to 8 with the size from which batching pays: for RSA on every kernel, for ECDSA P-256
/// on its IFMA kernel; with IFMA, aws-lc's single RSA signature too.
#[test]
fn speed_batch_sizes_has_a_table_per_kernel() {
    let out = run(std::process::Command::new(TLSTERM).args([
        "speed",
        "--batch-sizes",
        "--seconds",
        "0.02",
        "rsa2048",
        "ecdsap256",
    ]));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut expected: Vec<String> = Kernel::simd_available()
        .iter()
        .map(|k| format!("rsa2048, kernel {}", k.name()))
        .collect();
    if Kernel::simd_available().contains(&Kernel::Ifma) {
        expected.push("ecdsap256, kernel avx512ifma".to_string());
    }
    for table in &expected {
        let at = text
            .find(&format!("{table}: inline (BoringSSL)"))
            .unwrap_or_else(|| panic!("no table for {table} in {text}"));
        let rows: Vec<&str> = text[at..].lines().skip(2).take(8).collect();
        for (n, row) in rows.iter().enumerate() {
            assert!(row.trim_start().starts_with(&(n + 1).to_string()), "{row}");
        }
        let verdict = text[at..].lines().nth(10).unwrap_or_default();
        assert!(verdict.starts_with("batching "), "{verdict}");
    }
    assert_eq!(text.matches("kernel ").count(), expected.len(), "{text}");
    // With IFMA, aws-lc signs the RSA batches below the threshold: its single signature is
    // timed beside the table.
    let ifma = Kernel::simd_available().contains(&Kernel::Ifma);
    assert_eq!(text.contains("rsa2048: aws-lc-rs "), ifma, "{text}");
}

/// `tlsterm speed` prints one column per multi-buffer kernel this CPU has (none, and says
/// so, without either), and with `--rounds` the median of the rounds' paired ratios and
/// their range. Every signature it times is checked by the engine (a wrong one panics).
#[test]
fn speed_has_a_column_per_kernel_and_pairs_rounds() {
    let out = run(std::process::Command::new(TLSTERM).args([
        "speed",
        "--seconds",
        "0.05",
        "--rounds",
        "2",
        "rsa2048",
    ]));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let kernels = Kernel::simd_available();
    if kernels.is_empty() {
        eprintln!("no multi-buffer kernel on this CPU: checking the inline-only table");
        assert!(text.contains("no multi-buffer kernel"), "{text}");
    }
    let header = text
        .lines()
        .find(|l| l.starts_with("algorithm"))
        .unwrap_or_else(|| panic!("no table header in {text}"));
    for k in &kernels {
        assert!(header.contains(&format!("{}/s", k.name())), "{header}");
    }
    assert_eq!(header.matches("range").count(), kernels.len(), "{header}");
    let row = table_row(&text, "rsa2048");
    // algorithm, inline/s, then ops/s, ratio and range per kernel.
    assert_eq!(row.len(), 2 + 3 * kernels.len(), "{row:?}");
    assert!(row[1].parse::<f64>().expect("inline/s") > 0.0, "{row:?}");
    for k in 0..kernels.len() {
        let ratio: f64 = row[3 + 3 * k].parse().expect("ratio");
        let (lo, hi) = row[4 + 3 * k].split_once('-').expect("range lo-hi");
        let (lo, hi): (f64, f64) = (lo.parse().expect("lo"), hi.parse().expect("hi"));
        assert!(lo <= ratio && ratio <= hi && lo > 0.0, "{row:?}");
    }
    assert!(text.contains("2 rounds:"), "{text}");
}

/// `tlsterm speed` for what `serve` takes from BoringSSL to aws-lc or a curve kernel: a row
/// per key share and for ECDSA P-384 signatures, with BoringSSL's and aws-lc's figures and
/// ratio; P-384 signatures have no kernel, so their kernel columns are empty. A CPU without
/// the X25519 kernel is told that aws-lc-rs computes X25519 there.
#[test]
fn speed_compares_key_shares_and_p384_signatures_with_boringssl() {
    let out = run(std::process::Command::new(TLSTERM).args([
        "speed",
        "--seconds",
        "0.05",
        "x25519",
        "p384ecdh",
        "ecdsap384",
    ]));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let header = text
        .lines()
        .find(|l| l.starts_with("operation"))
        .unwrap_or_else(|| panic!("no table header in {text}"));
    let kernels = header.matches("/s").count() - 2;
    assert_eq!(
        kernels,
        usize::from(P256Kernel::Ifma.is_available()),
        "{header}"
    );
    for name in ["x25519", "p384ecdh", "ecdsap384"] {
        let row = table_row(&text, name);
        // name, then ops/s, µs per operation and (after the first) a ratio per column.
        assert_eq!(row.len(), 3 + 3 + 3 * kernels, "{row:?}");
        for column in [1, 3, 5] {
            assert!(
                row[column].parse::<f64>().expect("a figure") > 0.0,
                "{row:?}"
            );
        }
        if name == "ecdsap384" {
            assert!(row[6..].iter().all(|c| *c == "-"), "{row:?}");
        }
    }
    assert_eq!(
        text.contains("no X25519 kernel on this CPU"),
        kernels == 0,
        "{text}"
    );
}

/// `--kernel` chooses the X25519 kernels as it does the RSA ones: `portable` adds the
/// reference kernel's column, and a list without an X25519 kernel (`avx2`) gives no kernel
/// column and says so.
#[test]
fn speed_takes_the_x25519_kernels_that_kernel_names() {
    let speed = |kernel: &str| {
        let out = run(std::process::Command::new(TLSTERM).args([
            "speed",
            "--seconds",
            "0.05",
            "--kernel",
            kernel,
            "x25519",
        ]));
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let text = speed("portable");
    let header = text.lines().find(|l| l.starts_with("operation"));
    assert!(header.is_some_and(|h| h.contains("portable/s")), "{text}");
    assert!(!text.contains("no X25519 kernel"), "{text}");
    if !Kernel::Avx2.is_available() {
        eprintln!("note: --kernel avx2 skipped: this CPU lacks AVX2");
        return;
    }
    let text = speed("avx2");
    let row = table_row(&text, "x25519");
    assert_eq!(row.len(), 6, "BoringSSL and aws-lc-rs only: {row:?}");
    assert!(
        text.contains("no X25519 kernel among those --kernel names"),
        "{text}"
    );
}

/// The cells of the row of `tlsterm speed`'s table that starts with `name`.
fn table_row<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} row in {text}"))
        .split_whitespace()
        .collect()
}
