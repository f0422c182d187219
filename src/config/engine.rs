//! `[engine]`: how private-key operations are computed (inline or in multi-buffer
//! batches) and by which kernel.

use std::time::Duration;

use serde::Deserialize;

use super::source::{ConfigError, SourceMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineMode {
    /// Every private-key operation is computed by BoringSSL as soon as it is asked for.
    Inline,
    /// RSA operations are queued per worker and computed in multi-buffer batches.
    Batch,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    #[serde(default = "default_engine_mode")]
    pub mode: EngineMode,
    /// Flush as soon as this many operations are queued (at most the engine's lane capacity).
    pub batch_size: Option<usize>,
    /// The longest an operation waits for companions before the batch runs anyway.
    #[serde(default = "default_poll_delay", with = "humantime_serde")]
    pub poll_delay: Duration,
    /// Batches smaller than this are computed one operation at a time (default: the
    /// measured break-even of the kernel in use).
    pub small_batch_threshold: Option<usize>,
    /// Which multi-buffer kernel computes batches.
    #[serde(default)]
    pub kernel: EngineKernel,
    /// Who computes the server's TLS 1.3 key share (X25519, X25519MLKEM768, P-256).
    #[serde(default)]
    pub key_shares: KeyShares,
    /// Batches of X25519 key shares smaller than this are computed one by one by aws-lc
    /// (default: the measured break-even of the kernel in use).
    pub x25519_small_batch_threshold: Option<usize>,
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
        if let Some(0) = self.batch_size {
            return Err(map.plain("key `engine.batch_size`: must be at least 1"));
        }
        if let Some(0) = self.small_batch_threshold {
            return Err(map.plain("key `engine.small_batch_threshold`: must be at least 1"));
        }
        if let Some(0) = self.x25519_small_batch_threshold {
            return Err(map.plain("key `engine.x25519_small_batch_threshold`: must be at least 1"));
        }
        Ok(())
    }
}
