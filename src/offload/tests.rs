//! How `[engine]` settings become a worker's settings, on CPUs of every class: the
//! kernels are given, not detected, so each case runs on any machine.

use tlsterm_engine::{CurveKernel, Kernel, MlKemKernel};

use super::*;

fn cpu(rsa: &[Kernel], curve: CurveKernel) -> CpuKernels {
    // Every CPU with the IFMA curve kernel has AVX-512F, which the ML-KEM kernel needs.
    let mlkem = match curve {
        CurveKernel::Ifma => MlKemKernel::Avx512,
        CurveKernel::Portable => MlKemKernel::Portable,
    };
    CpuKernels {
        rsa: rsa.to_vec(),
        curve,
        mlkem,
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
    // A lone RSA signature is aws-lc's; two or more go to the kernel.
    assert_eq!(settings.small_batch_threshold, 2);
    assert!(settings.rsa_singles_aws_lc());
    assert_eq!(settings.key_shares, KeySharePath::Batch);
    assert_eq!(settings.x25519_small_batch_threshold, 3);
    assert_eq!(settings.mlkem_kernel, MlKemKernel::Avx512);
    assert_eq!(settings.mlkem_small_batch_threshold, 5);
    assert_eq!(settings.ecdsa, EngineMode::Batch);
    assert_eq!(settings.ecdsa_small_batch_threshold, 3);
    let asked = OffloadSettings::choose(&config("mlkem_small_batch_threshold = 2"), &ifma());
    assert_eq!(asked.mlkem_small_batch_threshold, 2);
}

#[test]
fn without_an_x25519_kernel_aws_lc_computes_key_shares() {
    let settings = OffloadSettings::choose(&config(""), &avx2_only());
    assert_eq!(settings.kernel, Kernel::Avx2);
    assert_eq!(settings.small_batch_threshold, 2);
    // aws-lc's single RSA signature was measured faster only with IFMA.
    assert!(!settings.rsa_singles_aws_lc());
    assert_eq!(settings.key_shares, KeySharePath::AwsLc);
    assert_eq!(settings.mlkem_small_batch_threshold, usize::MAX);
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

#[test]
fn lone_rsa_signatures_go_to_aws_lc_only_where_rsa_is_batched_with_ifma() {
    assert!(OffloadSettings::choose(&config(""), &ifma()).rsa_singles_aws_lc());
    let inline = OffloadSettings::choose(&config("mode = \"inline\""), &ifma());
    assert!(
        !inline.rsa_singles_aws_lc(),
        "inline signing stays BoringSSL's"
    );
    let avx512 = OffloadSettings::choose(&config("kernel = \"avx512f\""), &ifma());
    assert!(!avx512.rsa_singles_aws_lc());
    assert!(!OffloadSettings::choose(&config(""), &no_simd()).rsa_singles_aws_lc());
}

/// A signer whose single RSA signatures are aws-lc's (the queue's signer in `serve` on
/// an IFMA CPU), without the kernels playing any part.
fn aws_lc_singles() -> signer::EngineSigner {
    signer::EngineSigner {
        kernel: Kernel::Portable,
        curve_kernel: CurveKernel::Portable,
        rsa_singles_aws_lc: true,
        mlkem_kernel: MlKemKernel::Portable,
    }
}

#[test]
fn aws_lc_signs_lone_rsa_signatures_of_every_scheme_and_they_verify() {
    use boring::hash::MessageDigest;
    use boring::sign::{RsaPssSaltlen, Verifier};
    use signer::{BatchOp, BatchSigner, SinglePath};

    let pkey = boring::pkey::PKey::from_rsa(boring::rsa::Rsa::generate(2048).unwrap()).unwrap();
    let key = SigningKey::new(pkey.clone()).unwrap();
    let message = b"the transcript a TLS server signs";
    for (hash, digest) in [
        (HashAlg::Sha256, MessageDigest::sha256()),
        (HashAlg::Sha384, MessageDigest::sha384()),
        (HashAlg::Sha512, MessageDigest::sha512()),
    ] {
        for scheme in [Scheme::RsaPkcs1(hash), Scheme::RsaPss(hash)] {
            let op = BatchOp {
                key: &key,
                scheme,
                message,
            };
            let (signature, path) = aws_lc_singles().sign_single(&op);
            assert_eq!(path, SinglePath::AwsLc, "{scheme:?}");
            let signature = signature.expect("aws-lc signs");
            let mut verifier = Verifier::new(digest, &pkey).unwrap();
            if let Scheme::RsaPss(_) = scheme {
                verifier
                    .set_rsa_padding(boring::rsa::Padding::PKCS1_PSS)
                    .unwrap();
                verifier
                    .set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH)
                    .unwrap();
            }
            verifier.update(message).unwrap();
            assert!(verifier.verify(&signature).unwrap(), "{scheme:?}");
        }
    }
}

#[test]
fn other_signatures_and_other_settings_stay_with_boringssl() {
    use signer::{BatchOp, BatchSigner, SinglePath};

    let rsa = boring::pkey::PKey::from_rsa(boring::rsa::Rsa::generate(2048).unwrap()).unwrap();
    let rsa = SigningKey::new(rsa).unwrap();
    let ec = boring::ec::EcKey::generate(
        &boring::ec::EcGroup::from_curve_name(boring::nid::Nid::X9_62_PRIME256V1).unwrap(),
    )
    .unwrap();
    let ec = SigningKey::new(boring::pkey::PKey::from_ec_key(ec).unwrap()).unwrap();
    let ecdsa = BatchOp {
        key: &ec,
        scheme: Scheme::Ecdsa(HashAlg::Sha256),
        message: b"m",
    };
    let (signature, path) = aws_lc_singles().sign_single(&ecdsa);
    assert_eq!(path, SinglePath::Inline);
    assert!(signature.is_ok());
    let boringssl = signer::EngineSigner {
        rsa_singles_aws_lc: false,
        ..aws_lc_singles()
    };
    let pss = BatchOp {
        key: &rsa,
        scheme: Scheme::RsaPss(HashAlg::Sha256),
        message: b"m",
    };
    let (signature, path) = boringssl.sign_single(&pss);
    assert_eq!(path, SinglePath::Inline);
    assert!(signature.is_ok());
}
