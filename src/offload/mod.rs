//! Private-key operations of handshakes, taken off the handshake's path.
//!
//! Every signature a handshake needs comes here through BoringSSL's asynchronous private
//! key hook (see `tls::keymethod`). In `inline` mode it is computed at once by BoringSSL.
//! In `batch` mode an RSA signature, and an ECDSA P-256 one where the CPU has the curve
//! kernel (AVX-512 IFMA) and `[engine] ecdsa` batches, joins its worker's queue and the
//! handshake is suspended; the worker's queue runs the multi-buffer engine when a kind's
//! batch is full, when every handshake of the worker is waiting on it, or when the poll
//! delay expires. An ECDSA P-384 signature, which has no kernel, is aws-lc's at once
//! (unless `[engine]` asks for inline signing).

mod key;
pub mod key_share;
pub mod metrics;
mod queue;
mod signer;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use boring::ssl::SslSignatureAlgorithm;

use tlsterm_engine::{CurveKernel, MlKemKernel};

use crate::config::{EcdsaMode, EngineConfig, EngineKernel, EngineMode, KeyShares};
pub use key::{HashAlg, KeyKind, Scheme, SigningKey};
pub use queue::{install_worker_queue, HandshakeGuard};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadError {
    /// The handshake asked for a signature scheme this key cannot make.
    WrongKeyType,
    /// A scheme tlsterm does not sign with (SHA-1, MD5-SHA1).
    UnsupportedScheme,
    /// BoringSSL failed to sign.
    Signing,
    /// The engine refused or its result failed the public-key check.
    Engine,
    /// The worker's queue went away before the result came.
    Cancelled,
}

impl std::fmt::Display for OffloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// So that `?` carries it into `anyhow` and other error chains.
impl std::error::Error for OffloadError {}

/// A signature on its way.
pub type PendingSignature = Pin<Box<dyn Future<Output = Result<Vec<u8>, OffloadError>> + Send>>;

/// How a worker computes private-key operations (copied from `[engine]` at start and reload).
#[derive(Debug, Clone, Copy)]
pub struct OffloadSettings {
    /// RSA signatures: `Batch` only when a multi-buffer kernel signs them: the effective
    /// mode, not the asked one.
    pub mode: EngineMode,
    /// The kernel that signs batches of RSA signatures.
    pub kernel: tlsterm_engine::Kernel,
    /// RSA signatures that make a full batch.
    pub batch_size: usize,
    pub poll_delay: std::time::Duration,
    /// Below this many queued RSA signatures, they are signed one by one (by aws-lc
    /// when [`OffloadSettings::rsa_singles_aws_lc`], else BoringSSL).
    pub small_batch_threshold: usize,
    /// ECDSA P-256 signatures: `Batch` only when the curve kernel signs them (the
    /// effective mode, like `mode`). A full batch fills the curve kernel's lanes.
    pub ecdsa: EngineMode,
    /// Below this many queued ECDSA P-256 signatures, BoringSSL signs them one by one.
    pub ecdsa_small_batch_threshold: usize,
    /// Who computes TLS 1.3 key shares (`Batch`: the X25519 part, where a kernel has it).
    pub key_shares: KeySharePath,
    /// The kernel of the curves: batches of X25519 key shares and of ECDSA P-256
    /// signatures.
    pub curve_kernel: CurveKernel,
    /// Below this many queued X25519 shares, aws-lc computes them one by one.
    pub x25519_small_batch_threshold: usize,
    /// The kernel of ML-KEM-768 encapsulations (the other half of X25519MLKEM768 shares).
    pub mlkem_kernel: MlKemKernel,
    /// Below this many ML-KEM-768 encapsulations in a flushed batch of key shares, aws-lc
    /// computes them one by one (`usize::MAX` where the kernel is slower than aws-lc).
    pub mlkem_small_batch_threshold: usize,
    /// ECDSA P-384 signatures (no kernel) by aws-lc, about 4x as fast as BoringSSL's;
    /// false when `[engine]` asks for inline signing, which is BoringSSL's.
    pub p384_aws_lc: bool,
}

/// Who computed a key share: `/metrics` counts each path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySharePath {
    /// The multi-buffer engine (the X25519 part; the ML-KEM part too when enough of
    /// them were queued together), as a hint.
    Batch,
    /// aws-lc, in tlsterm, handed to BoringSSL as a hint.
    AwsLc,
    /// BoringSSL itself.
    Inline,
}

impl KeySharePath {
    pub fn label(self) -> &'static str {
        match self {
            KeySharePath::Batch => "batch",
            KeySharePath::AwsLc => "aws-lc-rs",
            KeySharePath::Inline => "inline",
        }
    }
}

/// The kernels a CPU has, from which the settings are chosen (a fake one in tests, so
/// every choice is tested on every machine).
#[derive(Debug, Clone)]
pub struct CpuKernels {
    /// RSA: the multi-buffer kernels, fastest first (empty: only the portable one).
    pub rsa: Vec<tlsterm_engine::Kernel>,
    /// X25519 and P-256: the fastest kernel (`Portable` when there is no multi-buffer one).
    pub curve: CurveKernel,
    /// ML-KEM-768: the fastest kernel (`Portable` without AVX-512).
    pub mlkem: MlKemKernel,
}

impl CpuKernels {
    /// The kernels of this machine's CPU.
    pub fn detect() -> CpuKernels {
        CpuKernels {
            rsa: tlsterm_engine::Kernel::simd_available(),
            curve: CurveKernel::detect(),
            mlkem: MlKemKernel::detect(),
        }
    }
}

impl OffloadSettings {
    pub fn from_config(config: &EngineConfig) -> OffloadSettings {
        Self::choose(config, &CpuKernels::detect())
    }

    /// What `config` means on a CPU with `cpu`'s kernels.
    pub fn choose(config: &EngineConfig, cpu: &CpuKernels) -> OffloadSettings {
        let count = |value: &Option<toml::Spanned<usize>>| value.as_ref().map(|v| *v.get_ref());
        let lanes = tlsterm_engine::MAX_BATCH;
        let kernel = choose_kernel(config.kernel, &cpu.rsa);
        let curve_kernel = cpu.curve;
        let batch_size = count(&config.batch_size).unwrap_or(lanes).clamp(1, 64);
        let small_batch_threshold =
            count(&config.small_batch_threshold).unwrap_or_else(|| small_batch_threshold(kernel));
        let ecdsa_small_batch_threshold = count(&config.ecdsa_small_batch_threshold)
            .unwrap_or_else(|| ecdsa_small_batch_threshold(curve_kernel));
        // Without IFMA, AVX-512F or AVX2 only the portable kernel is left, which is slower
        // than BoringSSL (it exists for correctness and cross-checks): batching would cost.
        // A batch never larger than the small-batch threshold is always signed inline, so
        // queueing would only add waiting.
        let mode = if !kernel.is_simd() {
            EngineMode::Inline
        } else if config.mode == EngineMode::Batch && batch_size < small_batch_threshold {
            tracing::warn!(
                batch_size,
                small_batch_threshold,
                kernel = kernel.name(),
                "engine.batch_size is below the small-batch threshold, so no batch would \
                 reach the kernel: signing inline"
            );
            EngineMode::Inline
        } else {
            config.mode
        };
        OffloadSettings {
            mode,
            kernel,
            batch_size,
            poll_delay: config.poll_delay,
            small_batch_threshold,
            ecdsa: ecdsa_mode_for(
                config.mode,
                config.ecdsa,
                curve_kernel,
                ecdsa_small_batch_threshold,
            ),
            ecdsa_small_batch_threshold,
            key_shares: key_share_path_for(config.key_shares, curve_kernel),
            curve_kernel,
            x25519_small_batch_threshold: count(&config.x25519_small_batch_threshold)
                .unwrap_or_else(|| x25519_small_batch_threshold(curve_kernel)),
            mlkem_kernel: cpu.mlkem,
            mlkem_small_batch_threshold: count(&config.mlkem_small_batch_threshold)
                .unwrap_or_else(|| mlkem_small_batch_threshold(cpu.mlkem)),
            p384_aws_lc: config.mode == EngineMode::Batch && config.ecdsa == EcdsaMode::Batch,
        }
    }

    /// Whether RSA signatures are queued and batched (else BoringSSL signs inline).
    pub fn batched(&self) -> bool {
        self.mode == EngineMode::Batch
    }

    /// RSA signatures signed one by one (below the small-batch threshold, or redone after
    /// an engine error) by aws-lc rather than BoringSSL: where RSA is batched by the IFMA
    /// kernel, whose CPUs also run aws-lc's own IFMA code for a single signature.
    pub fn rsa_singles_aws_lc(&self) -> bool {
        self.batched() && self.kernel == tlsterm_engine::Kernel::Ifma
    }

    /// "batch" or "inline": what the start-up line, `/metrics` and `tlsterm stats` show.
    pub fn signing(&self) -> &'static str {
        if self.batched() {
            "batch"
        } else {
            "inline"
        }
    }

    /// The kernel that signs batches, or "none" when signatures are inline.
    pub fn kernel_name(&self) -> &'static str {
        if self.batched() {
            self.kernel.name()
        } else {
            "none"
        }
    }

    /// Shows these settings in `tlsterm_engine_info` (at start and at each reload).
    pub fn publish(&self) {
        metrics::set_engine_info(self.kernel_name(), self.signing());
    }
}

/// The kernel `[engine] kernel` asks for, if it is among `available` (the CPU's
/// multi-buffer kernels, fastest first); else the fastest there is.
fn choose_kernel(
    asked: EngineKernel,
    available: &[tlsterm_engine::Kernel],
) -> tlsterm_engine::Kernel {
    use tlsterm_engine::Kernel;
    let best = available.first().copied().unwrap_or(Kernel::Portable);
    let wanted = match asked {
        EngineKernel::Auto => return best,
        EngineKernel::Avx512ifma => Kernel::Ifma,
        EngineKernel::Avx512f => Kernel::Avx512,
        EngineKernel::Avx2 => Kernel::Avx2,
    };
    if available.contains(&wanted) {
        wanted
    } else {
        tracing::warn!(
            asked = wanted.name(),
            using = best.name(),
            "[engine] kernel: this CPU lacks the kernel asked for; using the fastest it has"
        );
        best
    }
}

/// Below this many queued operations a batch is signed one by one: the measured
/// break-even of each kernel against signing alone for RSA-2048 (`tlsterm speed
/// --batch-sizes`, docs/BENCHMARKS-engine.md). With IFMA a lone signature is faster by
/// aws-lc (its own IFMA code, which computes one signature's two halves side by side)
/// than by a pass of the kernel, which costs as much for 2 signatures: 422 against 525 µs
/// on an Intel Emerald Rapids, 265-320 against 374 µs on an AMD EPYC Zen 4; 2 signatures
/// are cheaper in one pass. With AVX2 a signature takes 2 of a register's 4 lanes: 1 signature
/// ran at 0.72-0.75x BoringSSL, 2 (one register) at 1.33-1.48x, 3 at 1.35-1.41x and a
/// full 4 at 1.69-1.82x (AMD EPYC Zen 3, two runs). With AVX-512F a pass costs the same
/// for 1 to 4 signatures: 1 ran at 0.70-0.78x, 2 at 1.40-1.56x, 4 at 2.76-3.08x (AMD EPYC
/// Zen 5, RSA-2048/3072/4096).
fn small_batch_threshold(kernel: tlsterm_engine::Kernel) -> usize {
    match kernel {
        tlsterm_engine::Kernel::Ifma
        | tlsterm_engine::Kernel::Avx512
        | tlsterm_engine::Kernel::Avx2 => 2,
        tlsterm_engine::Kernel::Portable => usize::MAX,
    }
}

/// Whether ECDSA P-256 signatures are batched: when `[engine] mode` and `[engine] ecdsa`
/// both ask for it and the CPU has a multi-lane curve kernel (the portable one is slower
/// than BoringSSL), unless the small-batch threshold is above the kernel's lanes: then no
/// batch could reach the kernel, and queueing would only add waiting. RSA's own settings
/// (its kernel, batch size and threshold) play no part.
fn ecdsa_mode_for(
    mode: EngineMode,
    ecdsa: EcdsaMode,
    kernel: CurveKernel,
    small_batch_threshold: usize,
) -> EngineMode {
    if mode == EngineMode::Inline || ecdsa == EcdsaMode::Inline || kernel.lanes() < 2 {
        return EngineMode::Inline;
    }
    if small_batch_threshold > kernel.lanes() {
        tracing::warn!(
            small_batch_threshold,
            lanes = kernel.lanes(),
            kernel = kernel.name(),
            "engine.ecdsa_small_batch_threshold is above the curve kernel's lanes, so no \
             batch would reach the kernel: signing ECDSA inline"
        );
        return EngineMode::Inline;
    }
    EngineMode::Batch
}

/// Below this many queued ECDSA P-256 signatures a batch is signed one by one by
/// BoringSSL: the measured break-even of the curve kernel against BoringSSL (the engine's
/// `p256_speed` example, timing each batch size from 1 to 8). A pass of the IFMA kernel
/// costs about the same for 1 to 8 signatures: on an Intel Emerald Rapids core (a shared,
/// loaded machine, two runs) 1 signature ran at 0.37-0.39x BoringSSL, 2 at 0.70-0.86x,
/// 3 at 1.06-1.28x, 4 at 1.39-1.70x and 8 at 2.56-2.66x.
fn ecdsa_small_batch_threshold(kernel: CurveKernel) -> usize {
    match kernel {
        CurveKernel::Ifma => 3,
        CurveKernel::Portable => usize::MAX,
    }
}

/// Who computes key shares, from `[engine] key_shares` and the curve kernel the CPU has.
/// Batches only with a multi-buffer kernel: the portable one is slower than aws-lc.
fn key_share_path_for(asked: KeyShares, kernel: CurveKernel) -> KeySharePath {
    let simd = kernel != CurveKernel::Portable;
    match asked {
        KeyShares::Auto if simd => KeySharePath::Batch,
        KeyShares::Batch if simd => KeySharePath::Batch,
        KeyShares::Batch => {
            tracing::warn!(
                "[engine] key_shares = \"batch\": this CPU has no multi-buffer X25519 kernel \
                 (AVX-512 IFMA); computing key shares with aws-lc"
            );
            KeySharePath::AwsLc
        }
        KeyShares::Auto | KeyShares::AwsLcRs => KeySharePath::AwsLc,
        KeyShares::Inline => KeySharePath::Inline,
    }
}

/// Below this many ML-KEM-768 encapsulations in a batch of key shares, aws-lc computes
/// them one by one: the break-even of the AVX-512 kernel against aws-lc. A pass costs the
/// same for 1 to 8: on an AMD EPYC Zen 4 core a pass took about 70 µs and aws-lc 13.5 µs
/// per encapsulation in a loop in the quiet runs (the engine's `mlkem_speed` example),
/// and aws-lc about 19 µs inside handshakes (perf of `serve`), so 5 in a pass break even
/// against aws-lc in a loop and save a little against aws-lc in a handshake. The portable kernel is slower
/// than aws-lc at any size.
fn mlkem_small_batch_threshold(kernel: MlKemKernel) -> usize {
    match kernel {
        MlKemKernel::Avx512 => 5,
        MlKemKernel::Portable => usize::MAX,
    }
}

/// Below this many queued X25519 shares, aws-lc computes them one by one: the measured
/// break-even of the IFMA kernel against aws-lc (`tlsterm speed --batch-sizes x25519`,
/// docs/BENCHMARKS-engine.md). A pass costs the same for 1 to 8 shares: on an Intel Emerald
/// Rapids core 1 share ran at 0.40x aws-lc, 2 at 0.81x, 3 at 1.15x, 8 at 3.06x.
fn x25519_small_batch_threshold(kernel: CurveKernel) -> usize {
    match kernel {
        CurveKernel::Ifma => 3,
        CurveKernel::Portable => usize::MAX,
    }
}

/// Starts the signature `alg` over `message` with `key`.
pub fn sign(key: Arc<SigningKey>, alg: SslSignatureAlgorithm, message: &[u8]) -> PendingSignature {
    let Some(scheme) = Scheme::from_tls(alg) else {
        return Box::pin(std::future::ready(Err(OffloadError::UnsupportedScheme)));
    };
    match queue::try_enqueue(&key, scheme, message) {
        Some(pending) => pending,
        None => {
            let result = queue::counted_single(&key, scheme, message);
            Box::pin(std::future::ready(result))
        }
    }
}

#[cfg(test)]
mod tests;

/// Who computes this worker's key shares (aws-lc off workers, as in tests).
pub fn key_share_path() -> KeySharePath {
    queue::settings().map_or(KeySharePath::AwsLc, |settings| settings.key_shares)
}

/// A key share on its way, with who computed it (`None`: BoringSSL is to compute it).
pub type PendingKeyShare =
    Pin<Box<dyn Future<Output = Option<(key_share::ServerShare, KeySharePath)>> + Send>>;

/// The server's key share of `group` for the client's share `peer`, computed the way this
/// worker is set to; `None` when BoringSSL is to compute it (inline, or a share it
/// will refuse).
pub fn key_share(group: key_share::Group, peer: &[u8]) -> Option<PendingKeyShare> {
    use key_share::{compute, hybrid, split_hybrid, Group, ServerShare};
    let path = key_share_path();
    let ready = |share: Option<ServerShare>, path| -> Option<PendingKeyShare> {
        let done = share.map(|share| (share, path));
        Some(Box::pin(std::future::ready(done)))
    };
    match (path, group) {
        (KeySharePath::Inline, _) => None,
        (KeySharePath::AwsLc, _) | (KeySharePath::Batch, Group::P256 | Group::P384) => {
            ready(compute(group, peer).ok(), KeySharePath::AwsLc)
        }
        (KeySharePath::Batch, Group::X25519) => {
            let pending = queue::try_enqueue_share(peer.try_into().ok()?, None)?;
            Some(Box::pin(async move {
                let (halves, path) = pending.await?;
                let share = ServerShare {
                    group,
                    public: halves.x25519.public.to_vec(),
                    secret: zeroize::Zeroizing::new(halves.x25519.shared.to_vec()),
                };
                Some((share, path))
            }))
        }
        (KeySharePath::Batch, Group::X25519MlKem768) => {
            // Both halves join the batch: the ML-KEM kernel encapsulates when enough of
            // them do, aws-lc otherwise.
            let (peer_mlkem, peer_x25519) = split_hybrid(peer).ok()?;
            let pending = queue::try_enqueue_share(peer_x25519, Some(peer_mlkem))?;
            Some(Box::pin(async move {
                let (halves, path) = pending.await?;
                let x25519 = halves.x25519;
                Some((hybrid(halves.mlkem?, &x25519.public, &*x25519.shared), path))
            }))
        }
    }
}
