//! What a worker's queue needs from the outside, as two small traits, so that its flush
//! policy can be driven in tests with a fake signer on any CPU (no engine, no AVX-512).
//!
//! - [`BatchSigner`]: computes a flushed batch, and one operation at once. In `serve` it is
//!   [`EngineSigner`]: the multi-buffer kernel for batches; for single operations aws-lc
//!   where the settings say it is faster (lone RSA signatures on IFMA CPUs), else BoringSSL.
//! - [`QueueStats`]: where the queue reports what it did. In `serve` it is
//!   [`MetricsStats`], the Prometheus registry.

use std::time::Duration;

use tlsterm_engine::{CurveKernel, MlKemKernel, X25519Share};
use zeroize::Zeroizing;

use super::key_share::{compute, encapsulate, Encapsulation, Group};
use super::metrics;
use super::{KeyKind, OffloadError, OffloadSettings, Scheme, SigningKey};

/// Why a batch of private-key operations ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushCause {
    Full,
    AllWaiting,
    Idle,
    Timer,
    /// Too few operations to be worth a multi-buffer pass: computed one by one.
    Small,
}

/// Who signed an operation that was not batched: `/metrics` counts each path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinglePath {
    AwsLc,
    Inline,
}

impl SinglePath {
    pub fn label(self) -> &'static str {
        match self {
            SinglePath::AwsLc => "aws-lc-rs",
            SinglePath::Inline => "inline",
        }
    }
}

impl FlushCause {
    pub fn label(self) -> &'static str {
        match self {
            FlushCause::Full => "full",
            FlushCause::AllWaiting => "all_waiting",
            FlushCause::Idle => "idle",
            FlushCause::Timer => "timer",
            FlushCause::Small => "small",
        }
    }
}

/// One queued operation, as a signer sees it.
pub struct BatchOp<'a> {
    pub key: &'a SigningKey,
    pub scheme: Scheme,
    pub message: &'a [u8],
}

/// Computes signatures for the queue.
///
/// Contract: `sign_batch` returns exactly one result per operation, in order; an `Err`
/// makes the queue compute that operation again with `sign_inline`, so a client never
/// sees an engine failure. `sign_inline` computes one operation at once on the calling
/// thread.
///
/// The same for X25519 key shares: `x25519_batch` gives one result per client share, in
/// order, `None` for one it could not compute (then `x25519_single`, one at a time,
/// computes it again); `None` from `x25519_single` refuses the client's share. And for
/// the ML-KEM-768 encapsulations of X25519MLKEM768 shares: `mlkem_batch` and
/// `mlkem_single`, one result per client key.
pub trait BatchSigner {
    fn sign_batch(&self, batch: &[BatchOp<'_>]) -> Vec<Result<Vec<u8>, OffloadError>>;
    fn sign_inline(&self, op: &BatchOp<'_>) -> Result<Vec<u8>, OffloadError>;
    /// One operation at once by the fastest single signer there is: `sign_inline` unless
    /// the signer knows better.
    fn sign_single(&self, op: &BatchOp<'_>) -> (Result<Vec<u8>, OffloadError>, SinglePath) {
        (self.sign_inline(op), SinglePath::Inline)
    }
    fn x25519_batch(&self, peers: &[[u8; 32]]) -> Vec<Option<X25519Share>>;
    fn x25519_single(&self, peer: &[u8; 32]) -> Option<X25519Share>;
    fn mlkem_batch(&self, keys: &[&[u8]]) -> Vec<Option<Encapsulation>>;
    fn mlkem_single(&self, key: &[u8]) -> Option<Encapsulation>;
}

/// Receives what the queue did: every call is a fact, never a question.
pub trait QueueStats {
    /// An operation waited this long in the queue before its batch ran.
    fn queue_wait(&self, wait: Duration);
    /// A batch of `ops` operations ran, for `cause` (`Small`: computed one by one).
    fn flush(&self, cause: FlushCause, ops: usize);
    /// A multi-buffer batch of `ops` operations took `elapsed`, whatever each result was.
    fn batch(&self, ops: usize, elapsed: Duration);
    /// One operation's signature came from a multi-buffer batch (and passed its check).
    fn batched_op(&self, kind: KeyKind);
    /// One operation was computed alone, by `path` (small batch, or redone after an engine
    /// error).
    fn single_op(&self, kind: KeyKind, path: SinglePath, elapsed: Duration);
    /// The engine failed an operation (fault check or refusal); it was redone inline.
    fn engine_error(&self);
    /// A batch of `shares` X25519 key shares ran, for `cause` (`Small`: one by one).
    fn share_flush(&self, cause: FlushCause, shares: usize);
    /// `count` ML-KEM-768 encapsulations of a flushed batch of key shares were computed,
    /// in a multi-buffer batch (`batched`) or one by one by aws-lc.
    fn encapsulations(&self, batched: bool, count: usize);
}

/// The signer of `serve`: the multi-buffer kernels for batches; for single signatures
/// aws-lc (lone RSA signatures where the settings ask for it) or BoringSSL; aws-lc for
/// single key shares.
pub struct EngineSigner {
    pub kernel: tlsterm_engine::Kernel,
    /// The curve kernel: X25519 key shares and ECDSA P-256 signatures.
    pub curve_kernel: CurveKernel,
    /// RSA signatures outside a batch by aws-lc instead of BoringSSL.
    pub rsa_singles_aws_lc: bool,
    /// The kernel of ML-KEM-768 encapsulations.
    pub mlkem_kernel: MlKemKernel,
}

impl EngineSigner {
    /// The kernels of these settings.
    pub fn of(settings: &OffloadSettings) -> EngineSigner {
        EngineSigner {
            kernel: settings.kernel,
            curve_kernel: settings.curve_kernel,
            rsa_singles_aws_lc: settings.rsa_singles_aws_lc(),
            mlkem_kernel: settings.mlkem_kernel,
        }
    }
}

impl BatchSigner for EngineSigner {
    fn sign_batch(&self, batch: &[BatchOp<'_>]) -> Vec<Result<Vec<u8>, OffloadError>> {
        // RSA and ECDSA operations go to their own engine functions; each result returns
        // to its operation's place.
        let (mut rsa, mut ecdsa, mut rsa_at, mut ecdsa_at) = (vec![], vec![], vec![], vec![]);
        for (i, op) in batch.iter().enumerate() {
            let padding = match op.scheme {
                Scheme::RsaPss(hash) => tlsterm_engine::RsaPadding::Pss(hash.engine()),
                Scheme::RsaPkcs1(hash) => tlsterm_engine::RsaPadding::Pkcs1v15(hash.engine()),
                Scheme::Ecdsa(hash) => {
                    ecdsa.push(tlsterm_engine::EcdsaRequest {
                        key: op.key.p256_key().expect("only engine keys are queued"),
                        hash: hash.engine(),
                        message: op.message,
                    });
                    ecdsa_at.push(i);
                    continue;
                }
            };
            rsa.push(tlsterm_engine::SignRequest {
                key: op.key.engine_key().expect("only engine keys are queued"),
                padding,
                message: op.message,
            });
            rsa_at.push(i);
        }
        let rsa = tlsterm_engine::sign_batch(self.kernel, &rsa);
        let ecdsa = tlsterm_engine::ecdsa_p256_sign_batch(self.curve_kernel, &ecdsa);
        let mut results = vec![Err(OffloadError::Engine); batch.len()];
        for (result, i) in rsa
            .into_iter()
            .zip(rsa_at)
            .chain(ecdsa.into_iter().zip(ecdsa_at))
        {
            results[i] = result.map_err(|err| {
                tracing::error!(error = %err, "engine operation failed; signing inline");
                OffloadError::Engine
            });
        }
        results
    }

    fn sign_inline(&self, op: &BatchOp<'_>) -> Result<Vec<u8>, OffloadError> {
        op.key.sign_inline(op.scheme, op.message)
    }

    fn sign_single(&self, op: &BatchOp<'_>) -> (Result<Vec<u8>, OffloadError>, SinglePath) {
        match self
            .rsa_singles_aws_lc
            .then(|| op.key.sign_rsa_aws_lc(op.scheme, op.message))
            .flatten()
        {
            Some(result) => (result, SinglePath::AwsLc),
            None => (self.sign_inline(op), SinglePath::Inline),
        }
    }

    fn x25519_batch(&self, peers: &[[u8; 32]]) -> Vec<Option<X25519Share>> {
        tlsterm_engine::x25519_server_shares(self.curve_kernel, peers)
            .into_iter()
            .map(Result::ok)
            .collect()
    }

    fn x25519_single(&self, peer: &[u8; 32]) -> Option<X25519Share> {
        let share = compute(Group::X25519, peer).ok()?;
        Some(X25519Share {
            public: share.public.as_slice().try_into().ok()?,
            shared: Zeroizing::new(share.secret.as_slice().try_into().ok()?),
        })
    }

    fn mlkem_batch(&self, keys: &[&[u8]]) -> Vec<Option<Encapsulation>> {
        tlsterm_engine::mlkem768_encapsulate_batch(self.mlkem_kernel, keys)
            .into_iter()
            .map(|result| result.ok().map(Encapsulation::from))
            .collect()
    }

    fn mlkem_single(&self, key: &[u8]) -> Option<Encapsulation> {
        encapsulate(key).ok()
    }
}

/// The queue's reports as Prometheus metrics.
pub struct MetricsStats;

impl QueueStats for MetricsStats {
    fn queue_wait(&self, wait: Duration) {
        metrics::record_queue_wait(wait);
    }
    fn flush(&self, cause: FlushCause, _ops: usize) {
        metrics::record_flush(cause.label());
    }
    fn batch(&self, ops: usize, elapsed: Duration) {
        metrics::record_batch(ops, elapsed);
    }
    fn batched_op(&self, kind: KeyKind) {
        metrics::record_op(kind.label(), "batch");
    }
    fn single_op(&self, kind: KeyKind, path: SinglePath, _elapsed: Duration) {
        metrics::record_op(kind.label(), path.label());
    }
    fn engine_error(&self) {
        metrics::record_engine_error();
    }
    fn share_flush(&self, cause: FlushCause, shares: usize) {
        metrics::record_share_flush(cause.label(), shares);
    }
    fn encapsulations(&self, batched: bool, count: usize) {
        let path = if batched { "batch" } else { "aws-lc-rs" };
        metrics::record_encapsulations(path, count);
    }
}
