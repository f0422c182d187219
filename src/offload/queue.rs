//! The per-worker queue of engine operations and its flush policy.
//!
//! It holds three kinds of operation, each computed by its own kernel: RSA signatures,
//! ECDSA P-256 signatures (where the IFMA kernel exists) and key shares (the server's
//! share of a TLS 1.3 handshake: X25519, or X25519MLKEM768, whose ML-KEM-768 half is
//! encapsulated by the ML-KEM kernel when the batch holds enough of them).
//! Each worker thread owns one queue (thread-local: a connection lives its whole life on
//! one worker, so no locks). A driver task on the worker's runtime decides when to run
//! the batch:
//! - `Full`: `batch_size` RSA signatures, or the curve kernel's lanes' worth of ECDSA
//!   P-256 signatures or of key shares, are queued (checked as each one joins); only that
//!   kind runs;
//! - `AllWaiting`: every handshake in progress on this worker is waiting on the queue,
//!   so nothing else could add work (the QTLS "heuristic polling" condition);
//! - `Idle`: a whole scheduler round of the worker passed without a new operation
//!   joining: the worker has nothing better to do than compute;
//! - `Timer`: the oldest operation has waited `poll_delay`.
//!
//! Otherwise every kind runs. Batches smaller than a kind's small-batch threshold (its own
//! setting: `small_batch_threshold`, `ecdsa_small_batch_threshold`,
//! `x25519_small_batch_threshold`, and `mlkem_small_batch_threshold` for the ML-KEM
//! halves of a batch of key shares) are computed one by one: RSA signatures by aws-lc
//! where the kernel is IFMA (faster than a pass of one there), other signatures by
//! BoringSSL, key shares by aws-lc.
//!
//! The queue computes through a [`BatchSigner`] and reports through [`QueueStats`]
//! (`signer.rs`), so the policy above is tested with a fake signer on any CPU.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use tokio::time::Instant;

use tokio::sync::{oneshot, Notify};

use super::key_share::Encapsulation;
use super::metrics;
use super::signer::FlushCause;
use super::signer::{BatchOp, BatchSigner, EngineSigner, MetricsStats, QueueStats};
use super::{KeySharePath, OffloadError, OffloadSettings, PendingSignature, Scheme, SigningKey};
use crate::config::EngineMode;
use tlsterm_engine::X25519Share;

/// The halves of a server key share computed in the queue: X25519, and for an
/// X25519MLKEM768 share its ML-KEM-768 encapsulation.
pub struct ShareHalves {
    pub x25519: X25519Share,
    pub mlkem: Option<Encapsulation>,
}

/// A key share on its way from the queue, with who computed its X25519 half (`None`: the
/// client's share was refused; BoringSSL then judges the handshake itself).
pub type PendingShare = std::pin::Pin<
    Box<dyn std::future::Future<Output = Option<(ShareHalves, KeySharePath)>> + Send>,
>;

struct QueuedShare {
    peer: [u8; 32],
    /// The client's ML-KEM-768 encapsulation key, for an X25519MLKEM768 share.
    mlkem: Option<Vec<u8>>,
    queued_at: Instant,
    reply: oneshot::Sender<Option<(ShareHalves, KeySharePath)>>,
}

/// One kind of signature's queue and its batch sizes.
struct SignatureQueue<'a> {
    ops: &'a RefCell<Vec<QueuedOp>>,
    /// How many of its operations make a full batch.
    full: usize,
    /// Fewer than this in a batch are signed one by one.
    small_batch_threshold: usize,
}

struct QueuedOp {
    key: Arc<SigningKey>,
    scheme: Scheme,
    message: Vec<u8>,
    queued_at: Instant,
    reply: oneshot::Sender<Result<Vec<u8>, OffloadError>>,
}

pub struct WorkerQueue {
    settings: Cell<OffloadSettings>,
    /// RSA signatures (a batch holds up to `batch_size`).
    ops: RefCell<Vec<QueuedOp>>,
    /// ECDSA P-256 signatures: a kind of their own, since a batch of them fills the curve
    /// kernel's lanes (8), and a pass costs about the same however few of them it holds:
    /// a batch of only a few is slower than BoringSSL.
    ecdsa: RefCell<Vec<QueuedOp>>,
    shares: RefCell<Vec<QueuedShare>>,
    /// Handshakes in progress on this worker (see `HandshakeGuard`).
    in_handshake: Cell<usize>,
    wake: Notify,
    /// `None`: the engine signer of the current settings' kernel.
    signer: Option<Box<dyn BatchSigner>>,
    stats: Box<dyn QueueStats>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<WorkerQueue>>> = const { RefCell::new(None) };
}

/// Installs this worker thread's queue and spawns its driver on the worker's `LocalSet`.
/// Calling it again (on reload) only updates the settings.
pub fn install_worker_queue(settings: OffloadSettings) {
    CURRENT.with(|current| {
        let mut current = current.borrow_mut();
        if let Some(queue) = current.as_ref() {
            queue.settings.set(settings);
            return;
        }
        *current = Some(WorkerQueue::start(settings, None, Box::new(MetricsStats)));
    });
}

fn current() -> Option<Rc<WorkerQueue>> {
    CURRENT.with(|current| current.borrow().clone())
}

/// This worker's settings, if it has a queue.
pub(super) fn settings() -> Option<OffloadSettings> {
    CURRENT.with(|current| current.borrow().as_ref().map(|queue| queue.settings.get()))
}

/// Counts a handshake in progress on this worker for the `AllWaiting` condition.
pub struct HandshakeGuard {
    queue: Option<Rc<WorkerQueue>>,
}

impl HandshakeGuard {
    pub fn enter() -> HandshakeGuard {
        Self::enter_queue(current())
    }

    fn enter_queue(queue: Option<Rc<WorkerQueue>>) -> HandshakeGuard {
        if let Some(queue) = &queue {
            queue.in_handshake.set(queue.in_handshake.get() + 1);
        }
        HandshakeGuard { queue }
    }
}

impl Drop for HandshakeGuard {
    fn drop(&mut self) {
        if let Some(queue) = &self.queue {
            queue.in_handshake.set(queue.in_handshake.get() - 1);
            if queue.queued() > 0 {
                // One fewer handshake may mean all the rest now wait on the queue.
                queue.wake.notify_one();
            }
        }
    }
}

/// Queues a signature if this worker batches its kind; `None` means: compute it inline.
pub(super) fn try_enqueue(
    key: &Arc<SigningKey>,
    scheme: Scheme,
    message: &[u8],
) -> Option<PendingSignature> {
    current()?.enqueue(key, scheme, message)
}

/// Queues a key share (its X25519 half, and the client's ML-KEM-768 key of an
/// X25519MLKEM768 share) if this worker batches them; `None` means: compute it another
/// way.
pub(super) fn try_enqueue_share(peer: [u8; 32], mlkem: Option<&[u8]>) -> Option<PendingShare> {
    current()?.enqueue_share(peer, mlkem)
}

/// Computes one operation at once and counts it by its path: aws-lc where it is faster
/// than BoringSSL and this worker's settings let it (ECDSA P-384), else BoringSSL inline.
pub(super) fn counted_single(
    key: &SigningKey,
    scheme: Scheme,
    message: &[u8],
) -> Result<Vec<u8>, OffloadError> {
    // Off a worker (as in tests) aws-lc signs, as it computes key shares there.
    let aws_lc = settings().is_none_or(|settings| settings.p384_aws_lc);
    if let Some(result) = aws_lc.then(|| key.sign_aws_lc(scheme, message)).flatten() {
        metrics::record_op(key.kind().label(), "aws-lc-rs");
        return result;
    }
    let result = key.sign_inline(scheme, message);
    metrics::record_op(key.kind().label(), "inline");
    result
}

async fn drive(queue: Rc<WorkerQueue>) {
    loop {
        queue.wake.notified().await;
        while let (queued, Some(oldest)) = (queue.queued(), queue.oldest()) {
            if queued >= queue.in_handshake.get() {
                queue.flush(FlushCause::AllWaiting);
                continue;
            }
            if oldest.elapsed() >= queue.settings.get().poll_delay {
                queue.flush(FlushCause::Timer);
                continue;
            }
            // Let every other runnable task of this worker (and the I/O they wait for)
            // run once; the deferred wake-up comes after the runtime polled the driver.
            tokio::task::yield_now().await;
            if queue.queued() == queued {
                queue.flush(FlushCause::Idle);
            }
        }
    }
}

impl WorkerQueue {
    /// A queue with its driver spawned on the current `LocalSet`. `signer: None` signs
    /// through the engine with the kernel of the settings in force at each flush.
    fn start(
        settings: OffloadSettings,
        signer: Option<Box<dyn BatchSigner>>,
        stats: Box<dyn QueueStats>,
    ) -> Rc<WorkerQueue> {
        let queue = Rc::new(WorkerQueue {
            settings: Cell::new(settings),
            ops: RefCell::new(Vec::new()),
            ecdsa: RefCell::new(Vec::new()),
            shares: RefCell::new(Vec::new()),
            in_handshake: Cell::new(0),
            wake: Notify::new(),
            signer,
            stats,
        });
        tokio::task::spawn_local(drive(queue.clone()));
        queue
    }

    /// Queues a signature (RSA, or ECDSA P-256 where the IFMA kernel signs it) if this
    /// queue batches; `None` means: compute it inline.
    fn enqueue(
        &self,
        key: &Arc<SigningKey>,
        scheme: Scheme,
        message: &[u8],
    ) -> Option<PendingSignature> {
        let settings = self.settings.get();
        let mode = match scheme {
            Scheme::Ecdsa(_) => settings.ecdsa,
            Scheme::RsaPkcs1(_) | Scheme::RsaPss(_) => settings.mode,
        };
        if mode != EngineMode::Batch || !key.batchable(scheme) {
            return None;
        }
        let kind = self.signature_queue(scheme);
        let (reply, result) = oneshot::channel();
        let queued = {
            let mut ops = kind.ops.borrow_mut();
            ops.push(QueuedOp {
                key: key.clone(),
                scheme,
                message: message.to_vec(),
                queued_at: Instant::now(),
                reply,
            });
            ops.len()
        };
        if queued >= kind.full {
            self.flush_signatures_of(&kind, FlushCause::Full);
        } else if self.queued() >= self.in_handshake.get() {
            self.flush(FlushCause::AllWaiting);
        } else {
            self.wake.notify_one();
        }
        Some(Box::pin(async move {
            result.await.unwrap_or(Err(OffloadError::Cancelled))
        }))
    }

    /// Queues a key share if this queue batches them.
    fn enqueue_share(&self, peer: [u8; 32], mlkem: Option<&[u8]>) -> Option<PendingShare> {
        let settings = self.settings.get();
        if settings.key_shares != KeySharePath::Batch {
            return None;
        }
        let (reply, result) = oneshot::channel();
        let queued = {
            let mut shares = self.shares.borrow_mut();
            shares.push(QueuedShare {
                peer,
                mlkem: mlkem.map(<[u8]>::to_vec),
                queued_at: Instant::now(),
                reply,
            });
            shares.len()
        };
        if queued >= settings.curve_kernel.lanes() {
            self.flush_shares(FlushCause::Full);
        } else if self.queued() >= self.in_handshake.get() {
            self.flush(FlushCause::AllWaiting);
        } else {
            self.wake.notify_one();
        }
        Some(Box::pin(async move { result.await.ok().flatten() }))
    }

    /// Operations of every kind waiting.
    fn queued(&self) -> usize {
        self.ops.borrow().len() + self.ecdsa.borrow().len() + self.shares.borrow().len()
    }

    /// When the longest-waiting operation of any kind joined.
    fn oldest(&self) -> Option<Instant> {
        let signature = [&self.ops, &self.ecdsa]
            .into_iter()
            .filter_map(|ops| ops.borrow().first().map(|op| op.queued_at))
            .min();
        let share = self.shares.borrow().first().map(|op| op.queued_at);
        signature.into_iter().chain(share).min()
    }

    /// Runs every kind that waits.
    fn flush(&self, cause: FlushCause) {
        self.flush_signatures(cause);
        self.flush_shares(cause);
    }

    /// Up to `max` of the oldest operations of one kind, each one's wait reported.
    fn take<T>(&self, queue: &RefCell<Vec<T>>, max: usize, queued_at: fn(&T) -> Instant) -> Vec<T> {
        let batch: Vec<T> = {
            let mut queue = queue.borrow_mut();
            let take = queue.len().min(max);
            queue.drain(..take).collect()
        };
        let now = Instant::now();
        for op in &batch {
            self.stats.queue_wait(now.duration_since(queued_at(op)));
        }
        batch
    }

    fn signer<'a>(&'a self, engine: &'a EngineSigner) -> &'a dyn BatchSigner {
        self.signer.as_deref().unwrap_or(engine)
    }

    fn flush_shares(&self, cause: FlushCause) {
        let settings = self.settings.get();
        let batch = self.take(&self.shares, settings.curve_kernel.lanes(), |op| {
            op.queued_at
        });
        if batch.is_empty() {
            return;
        }
        let engine = EngineSigner::of(&settings);
        let signer = self.signer(&engine);
        let single = |op: &QueuedShare| {
            signer
                .x25519_single(&op.peer)
                .map(|share| (share, KeySharePath::AwsLc))
        };
        let x25519: Vec<_> = if batch.len() < settings.x25519_small_batch_threshold {
            self.stats.share_flush(FlushCause::Small, batch.len());
            batch.iter().map(single).collect()
        } else {
            self.stats.share_flush(cause, batch.len());
            let peers: Vec<[u8; 32]> = batch.iter().map(|op| op.peer).collect();
            let results = signer.x25519_batch(&peers);
            // A lane the engine refused (a client share of small order) is computed by
            // aws-lc, which refuses it too: BoringSSL then answers the client.
            (results.into_iter().zip(&batch))
                .map(|(result, op)| match result {
                    Some(share) => Some((share, KeySharePath::Batch)),
                    None => single(op),
                })
                .collect()
        };
        let mlkem = self.encapsulate(&batch, signer, settings.mlkem_small_batch_threshold);
        for ((op, x25519), mlkem) in batch.into_iter().zip(x25519).zip(mlkem) {
            // A hybrid share whose ML-KEM half was refused is refused whole.
            let share = x25519.and_then(|(x25519, path)| {
                let mlkem = match mlkem {
                    None => None,
                    Some(None) => return None,
                    Some(Some(encapsulation)) => Some(encapsulation),
                };
                Some((ShareHalves { x25519, mlkem }, path))
            });
            let _ = op.reply.send(share);
        }
    }

    /// The ML-KEM-768 halves of a flushed batch of key shares, one entry per share:
    /// `None` for an X25519 share, `Some(None)` for a client key refused. In one
    /// multi-buffer pass from `threshold` of them on; fewer, one by one by aws-lc.
    fn encapsulate(
        &self,
        batch: &[QueuedShare],
        signer: &dyn BatchSigner,
        threshold: usize,
    ) -> Vec<Option<Option<Encapsulation>>> {
        let keys: Vec<&[u8]> = batch.iter().filter_map(|op| op.mlkem.as_deref()).collect();
        let computed: Vec<Option<Encapsulation>> = if keys.is_empty() {
            Vec::new()
        } else if keys.len() >= threshold {
            self.stats.encapsulations(true, keys.len());
            // A key the engine refused is tried by aws-lc, which refuses it too.
            (signer.mlkem_batch(&keys).into_iter().zip(&keys))
                .map(|(result, key)| result.or_else(|| signer.mlkem_single(key)))
                .collect()
        } else {
            self.stats.encapsulations(false, keys.len());
            keys.iter().map(|key| signer.mlkem_single(key)).collect()
        };
        let mut computed = computed.into_iter();
        batch
            .iter()
            .map(|op| op.mlkem.as_ref().map(|_| computed.next().flatten()))
            .collect()
    }

    fn single(&self, op: &BatchOp<'_>, signer: &dyn BatchSigner) -> Result<Vec<u8>, OffloadError> {
        let start = Instant::now();
        let (result, path) = signer.sign_single(op);
        self.stats.single_op(op.key.kind(), path, start.elapsed());
        result
    }

    /// The signature queues, RSA then ECDSA, each with its batch sizes.
    fn signature_queues(&self) -> [SignatureQueue<'_>; 2] {
        let settings = self.settings.get();
        [
            SignatureQueue {
                ops: &self.ops,
                full: settings.batch_size,
                small_batch_threshold: settings.small_batch_threshold,
            },
            SignatureQueue {
                ops: &self.ecdsa,
                full: settings.curve_kernel.lanes(),
                small_batch_threshold: settings.ecdsa_small_batch_threshold,
            },
        ]
    }

    /// The queue of a signature scheme.
    fn signature_queue(&self, scheme: Scheme) -> SignatureQueue<'_> {
        let [rsa, ecdsa] = self.signature_queues();
        match scheme {
            Scheme::Ecdsa(_) => ecdsa,
            Scheme::RsaPkcs1(_) | Scheme::RsaPss(_) => rsa,
        }
    }

    /// Runs the signatures of both kinds that wait.
    fn flush_signatures(&self, cause: FlushCause) {
        for kind in self.signature_queues() {
            self.flush_signatures_of(&kind, cause);
        }
    }

    /// Runs up to a full batch of the oldest signatures of one kind; fewer than its
    /// small-batch threshold are signed one by one.
    fn flush_signatures_of(&self, kind: &SignatureQueue<'_>, cause: FlushCause) {
        let settings = self.settings.get();
        let batch = self.take(kind.ops, kind.full, |op| op.queued_at);
        if batch.is_empty() {
            return;
        }
        let engine = EngineSigner::of(&settings);
        let signer = self.signer(&engine);
        let start = Instant::now();
        let ops: Vec<BatchOp<'_>> = batch
            .iter()
            .map(|op| BatchOp {
                key: &op.key,
                scheme: op.scheme,
                message: &op.message,
            })
            .collect();
        if batch.len() < kind.small_batch_threshold {
            self.stats.flush(FlushCause::Small, batch.len());
            let results: Vec<_> = ops.iter().map(|op| self.single(op, signer)).collect();
            drop(ops);
            for (op, result) in batch.into_iter().zip(results) {
                let _ = op.reply.send(result);
            }
            return;
        }
        self.stats.flush(cause, batch.len());
        let results = signer.sign_batch(&ops);
        self.stats.batch(batch.len(), start.elapsed());
        let results: Vec<_> = ops
            .iter()
            .zip(results)
            .map(|(op, result)| match result {
                Ok(signature) => {
                    // Counted per operation: a batch may mix key sizes.
                    self.stats.batched_op(op.key.kind());
                    Ok(signature)
                }
                Err(_) => {
                    // A fault or refusal in the engine: this one is signed alone instead,
                    // so the client sees no error, and it counts by who signed it.
                    self.stats.engine_error();
                    self.single(op, signer)
                }
            })
            .collect();
        drop(ops);
        for (op, result) in batch.into_iter().zip(results) {
            let _ = op.reply.send(result);
        }
    }
}

#[cfg(test)]
mod tests;
