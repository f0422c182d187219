//! How `[engine]` settings become a worker's settings, on CPUs of every class: the
//! kernels are given, not detected, so each case runs on any machine.

use tlsterm_engine::{CurveKernel, Kernel};

use super::*;

fn cpu(rsa: &[Kernel], curve: CurveKernel) -> CpuKernels {
    CpuKernels {
        rsa: rsa.to_vec(),
        curve,
    }
}

fn ifma() -> CpuKernels {
    cpu(
        &[Kernel::Ifma, Kernel::Avx512, Kernel::Avx2],
        CurveKernel::Ifma,
    )
}

fn avx2_only() -> CpuKernels {
    cpu(&[Kernel::Avx2], CurveKernel::Portable)
}

fn no_simd() -> CpuKernels {
    cpu(&[], CurveKernel::Portable)
}

fn config(toml: &str) -> EngineConfig {
    toml::from_str(toml).expect("an [engine] section")
}

#[test]
fn auto_takes_the_fastest_kernel_and_batches_key_shares_with_ifma() {
    let settings = OffloadSettings::choose(&config(""), &ifma());
    assert_eq!(settings.kernel, Kernel::Ifma);
    assert_eq!(settings.mode, EngineMode::Batch);
    assert_eq!(settings.small_batch_threshold, 1);
    assert_eq!(settings.key_shares, KeySharePath::Batch);
    assert_eq!(settings.x25519_small_batch_threshold, 3);
    assert_eq!(settings.ecdsa, EngineMode::Batch);
    assert_eq!(settings.ecdsa_small_batch_threshold, 3);
}

#[test]
fn without_an_x25519_kernel_aws_lc_computes_key_shares() {
    let settings = OffloadSettings::choose(&config(""), &avx2_only());
    assert_eq!(settings.kernel, Kernel::Avx2);
    assert_eq!(settings.small_batch_threshold, 2);
    assert_eq!(settings.key_shares, KeySharePath::AwsLc);
    // Asking for batches does not make a kernel appear.
    let asked = OffloadSettings::choose(&config("key_shares = \"batch\""), &avx2_only());
    assert_eq!(asked.key_shares, KeySharePath::AwsLc);
}

#[test]
fn without_a_curve_kernel_ecdsa_signs_inline() {
    // AVX2 batches RSA, but has no P-256 kernel: asking does not make one appear.
    let settings = OffloadSettings::choose(&config("ecdsa = \"batch\""), &avx2_only());
    assert_eq!(settings.mode, EngineMode::Batch);
    assert_eq!(settings.ecdsa, EngineMode::Inline);
    let settings = OffloadSettings::choose(&config(""), &no_simd());
    assert_eq!(settings.ecdsa, EngineMode::Inline);
}

#[test]
fn ecdsa_inline_leaves_rsa_and_key_shares_batched() {
    let settings = OffloadSettings::choose(&config("ecdsa = \"inline\""), &ifma());
    assert_eq!(settings.ecdsa, EngineMode::Inline);
    assert_eq!(settings.mode, EngineMode::Batch);
    assert_eq!(settings.kernel, Kernel::Ifma);
    assert_eq!(settings.key_shares, KeySharePath::Batch);
    // `mode = "inline"` is every signature's switch.
    let settings = OffloadSettings::choose(&config("mode = \"inline\""), &ifma());
    assert_eq!(settings.ecdsa, EngineMode::Inline);
}

#[test]
fn ecdsa_has_its_own_small_batch_threshold() {
    let settings = OffloadSettings::choose(
        &config("small_batch_threshold = 2\necdsa_small_batch_threshold = 5"),
        &ifma(),
    );
    assert_eq!(
        (
            settings.small_batch_threshold,
            settings.ecdsa_small_batch_threshold
        ),
        (2, 5)
    );
    assert_eq!(settings.ecdsa, EngineMode::Batch);
    // RSA's threshold does not move ECDSA's default.
    let settings = OffloadSettings::choose(&config("small_batch_threshold = 1"), &ifma());
    assert_eq!(settings.ecdsa_small_batch_threshold, 3);
    // A full batch is the kernel's 8 lanes: a threshold above it leaves none for the kernel.
    let full = OffloadSettings::choose(&config("ecdsa_small_batch_threshold = 8"), &ifma());
    assert_eq!(full.ecdsa, EngineMode::Batch);
    let above = OffloadSettings::choose(&config("ecdsa_small_batch_threshold = 9"), &ifma());
    assert_eq!(above.ecdsa, EngineMode::Inline);
    assert_eq!(above.mode, EngineMode::Batch);
}

#[test]
fn rsa_signing_inline_leaves_ecdsa_batched() {
    // No RSA batch could reach the kernel; ECDSA's batches are its own.
    let settings = OffloadSettings::choose(
        &config("batch_size = 1\nsmall_batch_threshold = 2"),
        &ifma(),
    );
    assert_eq!(settings.mode, EngineMode::Inline);
    assert_eq!(settings.ecdsa, EngineMode::Batch);
}

#[test]
fn no_simd_signs_inline() {
    let settings = OffloadSettings::choose(&config("mode = \"batch\""), &no_simd());
    assert_eq!(settings.kernel, Kernel::Portable);
    assert_eq!(settings.mode, EngineMode::Inline);
    assert_eq!(settings.signing(), "inline");
    assert_eq!(settings.kernel_name(), "none");
}

#[test]
fn a_kernel_the_cpu_lacks_gives_the_fastest_it_has() {
    let settings = OffloadSettings::choose(&config("kernel = \"avx512ifma\""), &avx2_only());
    assert_eq!(settings.kernel, Kernel::Avx2);
    let settings = OffloadSettings::choose(&config("kernel = \"avx2\""), &ifma());
    assert_eq!(settings.kernel, Kernel::Avx2);
}

#[test]
fn a_batch_below_the_small_batch_threshold_signs_inline() {
    let settings = OffloadSettings::choose(&config("batch_size = 1"), &avx2_only());
    assert_eq!(settings.mode, EngineMode::Inline);
    let settings = OffloadSettings::choose(&config("batch_size = 2"), &avx2_only());
    assert_eq!(settings.mode, EngineMode::Batch);
}

#[test]
fn key_shares_as_configured() {
    let inline = OffloadSettings::choose(&config("key_shares = \"inline\""), &ifma());
    assert_eq!(inline.key_shares, KeySharePath::Inline);
    let aws_lc = OffloadSettings::choose(&config("key_shares = \"aws-lc-rs\""), &ifma());
    assert_eq!(aws_lc.key_shares, KeySharePath::AwsLc);
    let threshold = OffloadSettings::choose(&config("x25519_small_batch_threshold = 1"), &ifma());
    assert_eq!(threshold.x25519_small_batch_threshold, 1);
}

#[test]
fn aws_lc_signs_p384_on_every_cpu_unless_signing_is_inline() {
    for cpu in [ifma(), avx2_only(), no_simd()] {
        assert!(OffloadSettings::choose(&config(""), &cpu).p384_aws_lc);
        for inline in ["mode = \"inline\"", "ecdsa = \"inline\""] {
            assert!(
                !OffloadSettings::choose(&config(inline), &cpu).p384_aws_lc,
                "{inline}"
            );
        }
    }
}
