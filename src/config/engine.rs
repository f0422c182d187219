//! `[engine]`: how private-key operations are computed (inline or in multi-buffer
//! batches) and by which kernel.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::source::{ConfigError, SourceMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineMode {
    /// Every private-key operation is computed by BoringSSL as soon as it is asked for.
    Inline,
    /// RSA signatures, and ECDSA P-256 ones where `ecdsa` lets them, are queued per
    /// worker and computed in multi-buffer batches.
    Batch,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    #[serde(default = "default_engine_mode")]
    pub mode: EngineMode,
    /// Flush as soon as this many operations are queued (at most the engine's lane capacity).
    pub batch_size: Option<Spanned<usize>>,
    /// The longest an operation waits for companions before the batch runs anyway.
    #[serde(default = "default_poll_delay", with = "humantime_serde")]
    pub poll_delay: Duration,
    /// Batches smaller than this are computed one operation at a time (default: the
    /// measured break-even of the kernel in use).
    pub small_batch_threshold: Option<Spanned<usize>>,
    /// Which multi-buffer kernel computes batches.
    #[serde(default)]
    pub kernel: EngineKernel,
    /// Who computes the server's TLS 1.3 key share (X25519, X25519MLKEM768, P-256).
    #[serde(default)]
    pub key_shares: KeyShares,
    /// Batches of X25519 key shares smaller than this are computed one by one by aws-lc
    /// (default: the measured break-even of the kernel in use).
    pub x25519_small_batch_threshold: Option<Spanned<usize>>,
    /// Batches of X25519MLKEM768 key shares with fewer ML-KEM-768 encapsulations than
    /// this have them computed one by one by aws-lc (default: the measured break-even of
    /// the ML-KEM kernel in use).
    pub mlkem_small_batch_threshold: Option<Spanned<usize>>,
    /// Whether ECDSA P-256 signatures are batched by the curve kernel, apart from RSA.
    #[serde(default)]
    pub ecdsa: EcdsaMode,
    /// Batches of ECDSA P-256 signatures smaller than this are signed one by one by
    /// BoringSSL (default: the measured break-even of the curve kernel in use).
    pub ecdsa_small_batch_threshold: Option<Spanned<usize>>,
}

/// `[engine] ecdsa`: whether ECDSA P-256 signatures are batched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EcdsaMode {
    /// Queued per worker and signed in multi-buffer batches where the CPU has the curve
    /// kernel (AVX-512 IFMA) and `mode` batches; else inline.
    #[default]
    Batch,
    /// Signed at once by BoringSSL, whatever RSA signatures and key shares do.
    Inline,
}

/// `[engine] key_shares`: who computes the server's key share of a TLS 1.3 handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyShares {
    /// tlsterm, handed to BoringSSL as a handshake hint: the X25519 part in multi-buffer
    /// batches where the CPU has a kernel for it (AVX-512 IFMA), else with aws-lc (about
    /// twice BoringSSL's speed).
    #[default]
    Auto,
    /// The X25519 part in multi-buffer batches (aws-lc if the CPU has no kernel for it).
    Batch,
    /// The same, named: aws-lc.
    AwsLcRs,
    /// BoringSSL, inline (as before tlsterm computed shares itself).
    Inline,
}

/// The multi-buffer kernel `[engine] kernel` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKernel {
    /// The fastest the CPU has: AVX-512 IFMA, else AVX-512F, else AVX2, else none
    /// (inline signing).
    #[default]
    Auto,
    /// AVX-512 IFMA (8 lanes per register).
    Avx512ifma,
    /// AVX-512F without IFMA (8 lanes per register, 32-bit multiplies).
    Avx512f,
    /// AVX2 (4 lanes per register).
    Avx2,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            mode: default_engine_mode(),
            batch_size: None,
            poll_delay: default_poll_delay(),
            small_batch_threshold: None,
            kernel: EngineKernel::Auto,
            key_shares: KeyShares::Auto,
            x25519_small_batch_threshold: None,
            mlkem_small_batch_threshold: None,
            ecdsa: EcdsaMode::Batch,
            ecdsa_small_batch_threshold: None,
        }
    }
}

fn default_engine_mode() -> EngineMode {
    EngineMode::Batch
}
fn default_poll_delay() -> Duration {
    Duration::from_micros(200)
}

impl EngineConfig {
    pub(super) fn validate(&self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        for (key, value) in [
            ("batch_size", &self.batch_size),
            ("small_batch_threshold", &self.small_batch_threshold),
            (
                "x25519_small_batch_threshold",
                &self.x25519_small_batch_threshold,
            ),
            (
                "mlkem_small_batch_threshold",
                &self.mlkem_small_batch_threshold,
            ),
            (
                "ecdsa_small_batch_threshold",
                &self.ecdsa_small_batch_threshold,
            ),
        ] {
            if let Some(value) = value.as_ref().filter(|value| *value.get_ref() == 0) {
                return Err(map.error(value, format!("key `engine.{key}`: must be at least 1")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
