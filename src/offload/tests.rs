//! How `[engine]` settings become a worker's settings, on CPUs of every class: the
//! kernels are given, not detected, so each case runs on any machine.

use tlsterm_engine::{Kernel, X25519Kernel};

use super::*;

fn cpu(rsa: &[Kernel], x25519: X25519Kernel) -> CpuKernels {
    CpuKernels {
        rsa: rsa.to_vec(),
        x25519,
    }
}

fn ifma() -> CpuKernels {
    cpu(
        &[Kernel::Ifma, Kernel::Avx512, Kernel::Avx2],
        X25519Kernel::Ifma,
    )
}

fn avx2_only() -> CpuKernels {
    cpu(&[Kernel::Avx2], X25519Kernel::Portable)
}

fn no_simd() -> CpuKernels {
    cpu(&[], X25519Kernel::Portable)
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
