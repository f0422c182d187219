//! The per-worker queue of RSA operations and its flush policy.
//!
//! Each worker thread owns one queue (thread-local: a connection lives its whole life on
//! one worker, so no locks). A driver task on the worker's runtime decides when to run
//! the batch:
//! - `Full`: `batch_size` operations are queued (checked as each one joins);
//! - `AllWaiting`: every handshake in progress on this worker is waiting on the queue,
//!   so nothing else could add work (the QTLS "heuristic polling" condition);
//! - `Idle`: a whole scheduler round of the worker passed without a new operation
//!   joining: the worker has nothing better to do than compute;
//! - `Timer`: the oldest operation has waited `poll_delay`.
//!
//! Batches smaller than `small_batch_threshold` are computed one by one by BoringSSL.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{oneshot, Notify};

use super::{OffloadError, OffloadSettings, PendingSignature, Scheme, SigningKey};
use crate::config::EngineMode;
use crate::metrics::{self, FlushCause};

struct QueuedOp {
    key: Arc<SigningKey>,
    scheme: Scheme,
    message: Vec<u8>,
    queued_at: Instant,
    reply: oneshot::Sender<Result<Vec<u8>, OffloadError>>,
}

pub struct WorkerQueue {
    settings: Cell<OffloadSettings>,
    ops: RefCell<Vec<QueuedOp>>,
    /// Handshakes in progress on this worker (see `HandshakeGuard`).
    in_handshake: Cell<usize>,
    wake: Notify,
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
        let queue = Rc::new(WorkerQueue {
            settings: Cell::new(settings),
            ops: RefCell::new(Vec::new()),
            in_handshake: Cell::new(0),
            wake: Notify::new(),
        });
        tokio::task::spawn_local(drive(queue.clone()));
        *current = Some(queue);
    });
}

fn current() -> Option<Rc<WorkerQueue>> {
    CURRENT.with(|current| current.borrow().clone())
}

/// Counts a handshake in progress on this worker for the `AllWaiting` condition.
pub struct HandshakeGuard {
    queue: Option<Rc<WorkerQueue>>,
}

impl HandshakeGuard {
    pub fn enter() -> HandshakeGuard {
        let queue = current();
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
            if !queue.ops.borrow().is_empty() {
                // One fewer handshake may mean all the rest now wait on the queue.
                queue.wake.notify_one();
            }
        }
    }
}

/// Queues an RSA operation if this worker batches; `None` means: compute it inline.
pub(super) fn try_enqueue(
    key: &Arc<SigningKey>,
    scheme: Scheme,
    message: &[u8],
) -> Option<PendingSignature> {
    if matches!(scheme, Scheme::Ecdsa(_)) || key.engine_key().is_none() {
        return None;
    }
    let queue = current()?;
    let settings = queue.settings.get();
    if settings.mode != EngineMode::Batch {
        return None;
    }
    let (reply, result) = oneshot::channel();
    let queued = {
        let mut ops = queue.ops.borrow_mut();
        ops.push(QueuedOp {
            key: key.clone(),
            scheme,
            message: message.to_vec(),
            queued_at: Instant::now(),
            reply,
        });
        ops.len()
    };
    if queued >= settings.batch_size {
        queue.flush(FlushCause::Full);
    } else if queued >= queue.in_handshake.get() {
        queue.flush(FlushCause::AllWaiting);
    } else {
        queue.wake.notify_one();
    }
    Some(Box::pin(async move {
        result.await.unwrap_or(Err(OffloadError::Cancelled))
    }))
}

/// Computes one operation with BoringSSL and records it as an inline operation.
pub(super) fn timed_inline(
    key: &SigningKey,
    scheme: Scheme,
    message: &[u8],
) -> Result<Vec<u8>, OffloadError> {
    let start = Instant::now();
    let result = key.sign_inline(scheme, message);
    metrics::record_inline_op(key.kind(), start.elapsed());
    result
}

async fn drive(queue: Rc<WorkerQueue>) {
    loop {
        queue.wake.notified().await;
        loop {
            let (queued, oldest) = {
                let ops = queue.ops.borrow();
                match ops.first() {
                    Some(op) => (ops.len(), op.queued_at),
                    None => break,
                }
            };
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
            if queue.ops.borrow().len() == queued {
                queue.flush(FlushCause::Idle);
            }
        }
    }
}

impl WorkerQueue {
    fn flush(&self, cause: FlushCause) {
        let settings = self.settings.get();
        let batch: Vec<QueuedOp> = {
            let mut ops = self.ops.borrow_mut();
            let take = ops.len().min(settings.batch_size);
            ops.drain(..take).collect()
        };
        if batch.is_empty() {
            return;
        }
        let start = Instant::now();
        for op in &batch {
            metrics::record_queue_wait(start.duration_since(op.queued_at));
        }
        if batch.len() < settings.small_batch_threshold {
            metrics::record_flush(FlushCause::Small, batch.len());
            for op in batch {
                let result = timed_inline(&op.key, op.scheme, &op.message);
                let _ = op.reply.send(result);
            }
            return;
        }
        metrics::record_flush(cause, batch.len());
        let requests: Vec<tlsterm_engine::SignRequest<'_>> = batch
            .iter()
            .map(|op| tlsterm_engine::SignRequest {
                key: op.key.engine_key().expect("only engine keys are queued"),
                padding: match op.scheme {
                    Scheme::RsaPss(hash) => tlsterm_engine::RsaPadding::Pss(hash.engine()),
                    Scheme::RsaPkcs1(hash) => tlsterm_engine::RsaPadding::Pkcs1v15(hash.engine()),
                    Scheme::Ecdsa(_) => unreachable!("ECDSA is never queued"),
                },
                message: &op.message,
            })
            .collect();
        let results = tlsterm_engine::sign_batch(settings.kernel, &requests);
        drop(requests);
        metrics::record_batch(batch[0].key.kind(), batch.len(), start.elapsed());
        for (op, result) in batch.into_iter().zip(results) {
            let result = match result {
                Ok(signature) => Ok(signature),
                Err(err) => {
                    // A fault or refusal in the engine: BoringSSL computes this one instead,
                    // so the client sees no error.
                    tracing::error!(error = %err, "engine operation failed; signing inline");
                    metrics::record_engine_error();
                    timed_inline(&op.key, op.scheme, &op.message)
                }
            };
            let _ = op.reply.send(result);
        }
    }
}
