//! Unit tests: the flush policy driven by a fake signer under paused time.

//! The flush policy with a fake signer under paused tokio time: no engine, any CPU.

use super::*;
use crate::offload::signer::SinglePath;
use crate::offload::KeyKind;
use std::sync::OnceLock;
use std::time::Duration;

/// What the fake signer and the stats saw.
#[derive(Default)]
struct Seen {
    batches: Vec<usize>,
    flushes: Vec<(FlushCause, usize)>,
    /// The kind of each operation counted as signed by a batch.
    batched: Vec<KeyKind>,
    inline: usize,
    engine_errors: usize,
    /// Key-share flushes (cause, shares) and how many shares each batch call held.
    share_flushes: Vec<(FlushCause, usize)>,
    share_batches: Vec<usize>,
    /// Client keys per ML-KEM batch call, and the encapsulations counted (batched, count).
    mlkem_batches: Vec<usize>,
    encapsulations: Vec<(bool, usize)>,
}

type Shared = Rc<RefCell<Seen>>;

/// Signs by tagging the message; a message "fail" fails in a batch.
struct FakeSigner(Shared);

impl BatchSigner for FakeSigner {
    fn sign_batch(&self, batch: &[BatchOp<'_>]) -> Vec<Result<Vec<u8>, OffloadError>> {
        self.0.borrow_mut().batches.push(batch.len());
        batch
            .iter()
            .map(|op| match op.message {
                b"fail" => Err(OffloadError::Engine),
                m => Ok([m, b"/batch"].concat()),
            })
            .collect()
    }
    fn sign_inline(&self, op: &BatchOp<'_>) -> Result<Vec<u8>, OffloadError> {
        Ok([op.message, b"/inline"].concat())
    }
    /// Public value: the peer with its first byte replaced by `B`; a peer of zeros fails.
    fn x25519_batch(&self, peers: &[[u8; 32]]) -> Vec<Option<X25519Share>> {
        self.0.borrow_mut().share_batches.push(peers.len());
        peers
            .iter()
            .map(|peer| (peer != &[0; 32]).then(|| fake_share(peer, b'B')))
            .collect()
    }
    /// Public value: the peer with its first byte replaced by `S`; a peer of zeros fails.
    fn x25519_single(&self, peer: &[u8; 32]) -> Option<X25519Share> {
        (peer != &[0; 32]).then(|| fake_share(peer, b'S'))
    }
    /// Ciphertext: `B` then the key; a key of zeros fails.
    fn mlkem_batch(&self, keys: &[&[u8]]) -> Vec<Option<Encapsulation>> {
        self.0.borrow_mut().mlkem_batches.push(keys.len());
        keys.iter()
            .map(|key| fake_encapsulation(key, b'B'))
            .collect()
    }
    /// Ciphertext: `S` then the key; a key of zeros fails.
    fn mlkem_single(&self, key: &[u8]) -> Option<Encapsulation> {
        fake_encapsulation(key, b'S')
    }
}

fn fake_encapsulation(key: &[u8], tag: u8) -> Option<Encapsulation> {
    (key.iter().any(|&b| b != 0)).then(|| Encapsulation {
        ciphertext: [&[tag], key].concat(),
        secret: zeroize::Zeroizing::new(key.to_vec()),
    })
}

fn fake_share(peer: &[u8; 32], tag: u8) -> X25519Share {
    let mut public = *peer;
    public[0] = tag;
    X25519Share {
        public,
        shared: zeroize::Zeroizing::new(*peer),
    }
}

struct FakeStats(Shared);

impl QueueStats for FakeStats {
    fn queue_wait(&self, _: Duration) {}
    fn flush(&self, cause: FlushCause, ops: usize) {
        self.0.borrow_mut().flushes.push((cause, ops));
    }
    fn batch(&self, _: usize, _: Duration) {}
    fn batched_op(&self, kind: KeyKind) {
        self.0.borrow_mut().batched.push(kind);
    }
    fn single_op(&self, _: KeyKind, _: SinglePath, _: Duration) {
        self.0.borrow_mut().inline += 1;
    }
    fn engine_error(&self) {
        self.0.borrow_mut().engine_errors += 1;
    }
    fn share_flush(&self, cause: FlushCause, shares: usize) {
        self.0.borrow_mut().share_flushes.push((cause, shares));
    }
    fn encapsulations(&self, batched: bool, count: usize) {
        self.0.borrow_mut().encapsulations.push((batched, count));
    }
}

fn key() -> Arc<SigningKey> {
    static KEY: OnceLock<Arc<SigningKey>> = OnceLock::new();
    KEY.get_or_init(|| rsa_key(2048)).clone()
}

fn rsa_key(bits: u32) -> Arc<SigningKey> {
    let rsa = boring::rsa::Rsa::generate(bits).expect("key");
    let pkey = boring::pkey::PKey::from_rsa(rsa).expect("pkey");
    Arc::new(SigningKey::new(pkey).expect("signing key"))
}

const RSA2048: KeyKind = KeyKind::Rsa { bits: 2048 };

fn settings(batch_size: usize, small_batch_threshold: usize) -> OffloadSettings {
    OffloadSettings {
        mode: EngineMode::Batch,
        kernel: tlsterm_engine::Kernel::Portable,
        batch_size,
        poll_delay: Duration::from_millis(2),
        small_batch_threshold,
        ecdsa: EngineMode::Batch,
        ecdsa_small_batch_threshold: small_batch_threshold,
        key_shares: KeySharePath::Batch,
        curve_kernel: tlsterm_engine::CurveKernel::Ifma,
        x25519_small_batch_threshold: small_batch_threshold,
        mlkem_kernel: tlsterm_engine::MlKemKernel::Portable,
        mlkem_small_batch_threshold: small_batch_threshold,
        p384_aws_lc: true,
    }
}

/// Runs `f` with a fresh queue under paused time; returns what was seen.
fn with_queue<F, Fut>(settings: OffloadSettings, f: F) -> Seen
where
    F: FnOnce(Rc<WorkerQueue>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let seen: Shared = Rc::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let queue = WorkerQueue::start(
            settings,
            Some(Box::new(FakeSigner(seen.clone()))),
            Box::new(FakeStats(seen.clone())),
        );
        f(queue).await;
    });
    // The driver task holds the queue (and its signer and stats) until the set goes.
    drop(local);
    Rc::try_unwrap(seen)
        .ok()
        .expect("queue dropped")
        .into_inner()
}

/// `n` handshakes in progress on the queue.
fn handshakes(queue: &Rc<WorkerQueue>, n: usize) -> Vec<HandshakeGuard> {
    (0..n)
        .map(|_| HandshakeGuard::enter_queue(Some(queue.clone())))
        .collect()
}

fn enqueue(queue: &Rc<WorkerQueue>, message: &[u8]) -> PendingSignature {
    enqueue_with(queue, &key(), message)
}

fn enqueue_with(
    queue: &Rc<WorkerQueue>,
    key: &Arc<SigningKey>,
    message: &[u8],
) -> PendingSignature {
    queue
        .enqueue(key, Scheme::RsaPss(super::super::HashAlg::Sha256), message)
        .expect("queued")
}

#[test]
fn a_full_batch_runs_at_once() {
    let seen = with_queue(settings(4, 1), |queue| async move {
        let _busy = handshakes(&queue, 10);
        let pending: Vec<_> = (0..4u8).map(|i| enqueue(&queue, &[b'a' + i])).collect();
        assert_eq!(queue.ops.borrow().len(), 0, "flushed as the 4th joined");
        for (i, p) in pending.into_iter().enumerate() {
            assert_eq!(
                p.await.unwrap(),
                [&[b'a' + i as u8][..], b"/batch"].concat()
            );
        }
    });
    assert_eq!(seen.batches, [4]);
    assert_eq!(seen.flushes, [(FlushCause::Full, 4)]);
    assert_eq!(seen.batched, [RSA2048; 4]);
}

#[test]
fn a_batch_runs_when_every_handshake_waits_on_it() {
    let seen = with_queue(settings(8, 1), |queue| async move {
        let _busy = handshakes(&queue, 3);
        let pending: Vec<_> = (0..3).map(|_| enqueue(&queue, b"x")).collect();
        for p in pending {
            p.await.unwrap();
        }
    });
    assert_eq!(seen.flushes, [(FlushCause::AllWaiting, 3)]);
}

#[test]
fn an_idle_worker_runs_what_is_queued() {
    let seen = with_queue(settings(8, 1), |queue| async move {
        let _busy = handshakes(&queue, 5);
        let pending: Vec<_> = (0..2).map(|_| enqueue(&queue, b"x")).collect();
        for p in pending {
            p.await.unwrap();
        }
    });
    assert_eq!(seen.flushes, [(FlushCause::Idle, 2)]);
}

#[test]
fn the_poll_delay_bounds_the_wait() {
    let seen = with_queue(settings(8, 1), |queue| async move {
        let _busy = handshakes(&queue, 5);
        let first = enqueue(&queue, b"x");
        // The driver has not run yet: let the oldest operation's delay pass first.
        tokio::time::advance(Duration::from_millis(3)).await;
        first.await.unwrap();
    });
    assert_eq!(seen.flushes, [(FlushCause::Timer, 1)]);
}

#[test]
fn a_small_batch_is_signed_inline() {
    let seen = with_queue(settings(8, 3), |queue| async move {
        let _busy = handshakes(&queue, 2);
        let pending: Vec<_> = (0..2).map(|_| enqueue(&queue, b"s")).collect();
        for p in pending {
            assert_eq!(p.await.unwrap(), b"s/inline");
        }
    });
    assert_eq!(seen.flushes, [(FlushCause::Small, 2)]);
    assert!(seen.batches.is_empty());
    assert!(seen.batched.is_empty());
    assert_eq!(seen.inline, 2);
}

#[test]
fn an_engine_error_is_redone_inline() {
    let seen = with_queue(settings(2, 1), |queue| async move {
        let _busy = handshakes(&queue, 4);
        let bad = enqueue(&queue, b"fail");
        let good = enqueue(&queue, b"ok");
        assert_eq!(bad.await.unwrap(), b"fail/inline");
        assert_eq!(good.await.unwrap(), b"ok/batch");
    });
    assert_eq!(seen.batches, [2]);
    assert_eq!((seen.engine_errors, seen.inline), (1, 1));
    // The failed one counts once, as inline: only the good one as batched.
    assert_eq!(seen.batched, [RSA2048]);
}

#[test]
fn a_batch_of_mixed_key_sizes_counts_each_operation_by_its_own_key() {
    let larger = rsa_key(3072);
    let seen = with_queue(settings(3, 1), |queue| async move {
        let _busy = handshakes(&queue, 5);
        let pending = [
            enqueue(&queue, b"a"),
            enqueue_with(&queue, &larger, b"b"),
            enqueue(&queue, b"c"),
        ];
        for p in pending {
            p.await.unwrap();
        }
    });
    assert_eq!(seen.batches, [3]);
    assert_eq!(
        seen.batched,
        [RSA2048, KeyKind::Rsa { bits: 3072 }, RSA2048]
    );
}

#[test]
fn inline_mode_and_ecdsa_are_never_queued() {
    let mut inline = settings(4, 1);
    inline.mode = EngineMode::Inline;
    with_queue(inline, |queue| async move {
        let scheme = Scheme::RsaPss(super::super::HashAlg::Sha256);
        assert!(queue.enqueue(&key(), scheme, b"x").is_none());
    });
    with_queue(settings(4, 1), |queue| async move {
        let scheme = Scheme::Ecdsa(super::super::HashAlg::Sha256);
        assert!(queue.enqueue(&key(), scheme, b"x").is_none());
    });
}

fn share(queue: &Rc<WorkerQueue>, tag: u8) -> PendingShare {
    queue.enqueue_share([tag; 32], None).expect("queued")
}

/// An X25519MLKEM768 share: its X25519 half tagged `tag`, its ML-KEM key `[key; 4]`.
fn hybrid_share(queue: &Rc<WorkerQueue>, tag: u8, key: u8) -> PendingShare {
    queue
        .enqueue_share([tag; 32], Some(&[key; 4]))
        .expect("queued")
}

/// The tag a fake share's public value carries: b'B' batch, b'S' single.
async fn computed_by(pending: PendingShare) -> Option<(u8, KeySharePath)> {
    let (halves, path) = pending.await?;
    assert!(halves.mlkem.is_none(), "an X25519 share has no ML-KEM half");
    Some((halves.x25519.public[0], path))
}

/// The tags of a hybrid share's halves: (X25519, ML-KEM).
async fn halves_computed_by(pending: PendingShare) -> Option<(u8, u8)> {
    let (halves, _) = pending.await?;
    let mlkem = halves.mlkem.expect("an ML-KEM half");
    Some((halves.x25519.public[0], mlkem.ciphertext[0]))
}

#[test]
fn the_mlkem_halves_of_a_batch_run_in_one_pass_from_their_threshold() {
    let mut at_two = settings(4, 1);
    at_two.mlkem_small_batch_threshold = 2;
    let seen = with_queue(at_two, |queue| async move {
        let _busy = handshakes(&queue, 4);
        let plain = share(&queue, 9);
        let hybrids: Vec<_> = (1..=3).map(|i| hybrid_share(&queue, i, i)).collect();
        for pending in hybrids {
            assert_eq!(halves_computed_by(pending).await, Some((b'B', b'B')));
        }
        assert_eq!(computed_by(plain).await, Some((b'B', KeySharePath::Batch)));
    });
    assert_eq!(seen.share_batches, [4]);
    assert_eq!(
        seen.mlkem_batches,
        [3],
        "the X25519-only share has no ML-KEM lane"
    );
    assert_eq!(seen.encapsulations, [(true, 3)]);
}

#[test]
fn too_few_mlkem_halves_are_encapsulated_one_by_one() {
    let mut at_three = settings(4, 1);
    at_three.mlkem_small_batch_threshold = 3;
    let seen = with_queue(at_three, |queue| async move {
        let _busy = handshakes(&queue, 3);
        let plain = share(&queue, 9);
        let hybrids = [hybrid_share(&queue, 1, 1), hybrid_share(&queue, 2, 2)];
        for pending in hybrids {
            assert_eq!(halves_computed_by(pending).await, Some((b'B', b'S')));
        }
        computed_by(plain).await.expect("computed");
    });
    assert!(seen.mlkem_batches.is_empty());
    assert_eq!(seen.encapsulations, [(false, 2)]);
}

#[test]
fn a_refused_mlkem_key_refuses_its_share_alone() {
    let mut at_two = settings(4, 1);
    at_two.mlkem_small_batch_threshold = 2;
    with_queue(at_two, |queue| async move {
        let _busy = handshakes(&queue, 2);
        let bad = hybrid_share(&queue, 1, 0);
        let good = hybrid_share(&queue, 2, 2);
        assert_eq!(halves_computed_by(bad).await, None);
        assert_eq!(halves_computed_by(good).await, Some((b'B', b'B')));
    });
}

#[test]
fn eight_key_shares_run_at_once_and_leave_signatures_waiting() {
    let seen = with_queue(settings(4, 1), |queue| async move {
        let _busy = handshakes(&queue, 20);
        let signature = enqueue(&queue, b"a");
        let shares: Vec<_> = (1..=8).map(|i| share(&queue, i)).collect();
        assert_eq!(queue.shares.borrow().len(), 0, "flushed as the 8th joined");
        assert_eq!(queue.ops.borrow().len(), 1, "the signature still waits");
        for pending in shares {
            assert_eq!(
                computed_by(pending).await,
                Some((b'B', KeySharePath::Batch))
            );
        }
        signature.await.unwrap();
    });
    assert_eq!(seen.share_batches, [8]);
    assert_eq!(seen.share_flushes[0], (FlushCause::Full, 8));
    assert_eq!(seen.flushes, [(FlushCause::Idle, 1)]);
}

#[test]
fn every_kind_runs_when_every_handshake_waits() {
    let seen = with_queue(settings(4, 1), |queue| async move {
        let _busy = handshakes(&queue, 3);
        let signature = enqueue(&queue, b"a");
        let first = share(&queue, 1);
        let second = share(&queue, 2);
        assert_eq!(computed_by(first).await, Some((b'B', KeySharePath::Batch)));
        assert_eq!(computed_by(second).await, Some((b'B', KeySharePath::Batch)));
        assert_eq!(signature.await.unwrap(), b"a/batch");
    });
    assert_eq!(seen.flushes, [(FlushCause::AllWaiting, 1)]);
    assert_eq!(seen.share_flushes, [(FlushCause::AllWaiting, 2)]);
}

#[test]
fn a_small_batch_of_key_shares_is_computed_one_by_one() {
    let seen = with_queue(settings(4, 3), |queue| async move {
        let _busy = handshakes(&queue, 2);
        let pending = [share(&queue, 1), share(&queue, 2)];
        for p in pending {
            assert_eq!(computed_by(p).await, Some((b'S', KeySharePath::AwsLc)));
        }
    });
    assert_eq!(seen.share_flushes, [(FlushCause::Small, 2)]);
    assert!(seen.share_batches.is_empty());
}

#[test]
fn a_refused_lane_is_tried_alone_and_refused_again() {
    with_queue(settings(4, 1), |queue| async move {
        let _busy = handshakes(&queue, 2);
        let bad = share(&queue, 0);
        let good = share(&queue, 7);
        assert_eq!(computed_by(bad).await, None);
        assert_eq!(computed_by(good).await, Some((b'B', KeySharePath::Batch)));
    });
}

#[test]
fn key_shares_join_the_queue_only_when_batched() {
    let mut aws_lc = settings(4, 1);
    aws_lc.key_shares = KeySharePath::AwsLc;
    with_queue(aws_lc, |queue| async move {
        assert!(queue.enqueue_share([1; 32], None).is_none());
    });
}

fn p256_key() -> Arc<SigningKey> {
    static KEY: OnceLock<Arc<SigningKey>> = OnceLock::new();
    KEY.get_or_init(|| {
        let group = boring::ec::EcGroup::from_curve_name(boring::nid::Nid::X9_62_PRIME256V1)
            .expect("group");
        let ec = boring::ec::EcKey::generate(&group).expect("key");
        let pkey = boring::pkey::PKey::from_ec_key(ec).expect("pkey");
        Arc::new(SigningKey::new(pkey).expect("signing key"))
    })
    .clone()
}

#[test]
fn ecdsa_p256_signatures_fill_the_curve_kernels_lanes() {
    let seen = with_queue(settings(4, 1), |queue| async move {
        let _busy = handshakes(&queue, 20);
        let scheme = Scheme::Ecdsa(super::super::HashAlg::Sha256);
        let rsa = enqueue(&queue, b"a");
        let mut pending = Vec::new();
        for i in 0..7u8 {
            pending.push(queue.enqueue(&p256_key(), scheme, &[i]).expect("queued"));
        }
        // Past the RSA batch size, short of the kernel's 8 lanes: nothing ran.
        assert_eq!(
            (queue.ecdsa.borrow().len(), queue.ops.borrow().len()),
            (7, 1)
        );
        pending.push(queue.enqueue(&p256_key(), scheme, b"8").expect("queued"));
        assert_eq!(queue.ecdsa.borrow().len(), 0, "flushed as the 8th joined");
        assert_eq!(queue.ops.borrow().len(), 1, "the RSA signature still waits");
        for p in pending {
            p.await.expect("signed");
        }
        rsa.await.expect("signed");
    });
    // Then the RSA signature alone, for whichever cause came first.
    assert_eq!(seen.flushes[0], (FlushCause::Full, 8));
    assert_eq!(seen.flushes[1].1, 1);
    assert_eq!(seen.batches, [8, 1]);
}

fn ecdsa_scheme() -> Scheme {
    Scheme::Ecdsa(super::super::HashAlg::Sha256)
}

#[test]
fn ecdsa_and_rsa_are_batched_or_not_each_by_its_own_mode() {
    let mut ecdsa_inline = settings(4, 1);
    ecdsa_inline.ecdsa = EngineMode::Inline;
    with_queue(ecdsa_inline, |queue| async move {
        let _busy = handshakes(&queue, 4);
        assert!(queue.enqueue(&p256_key(), ecdsa_scheme(), b"e").is_none());
        enqueue(&queue, b"r").await.expect("RSA still batched");
    });
    let mut rsa_inline = settings(4, 1);
    rsa_inline.mode = EngineMode::Inline;
    with_queue(rsa_inline, |queue| async move {
        let _busy = handshakes(&queue, 4);
        let scheme = Scheme::RsaPss(super::super::HashAlg::Sha256);
        assert!(queue.enqueue(&key(), scheme, b"r").is_none());
        let pending = queue.enqueue(&p256_key(), ecdsa_scheme(), b"e");
        pending.expect("ECDSA still batched").await.expect("signed");
    });
}

#[test]
fn a_small_ecdsa_batch_follows_the_ecdsa_threshold_not_rsas() {
    let mut settings = settings(8, 1);
    settings.ecdsa_small_batch_threshold = 4;
    let seen = with_queue(settings, |queue| async move {
        let _busy = handshakes(&queue, 4);
        let ecdsa: Vec<_> = (0..3u8)
            .map(|i| {
                let pending = queue.enqueue(&p256_key(), ecdsa_scheme(), &[i]);
                pending.expect("queued")
            })
            .collect();
        // The fourth handshake's RSA signature: every handshake now waits.
        let rsa = enqueue(&queue, b"r");
        assert_eq!(rsa.await.unwrap(), b"r/batch");
        for (i, pending) in ecdsa.into_iter().enumerate() {
            assert_eq!(
                pending.await.unwrap(),
                [&[i as u8][..], b"/inline"].concat()
            );
        }
    });
    // RSA's threshold of 1 batches its lone signature; 3 ECDSA ones are below 4.
    assert_eq!(
        seen.flushes,
        [(FlushCause::AllWaiting, 1), (FlushCause::Small, 3)]
    );
    assert_eq!(seen.batches, [1]);
    assert_eq!(seen.inline, 3);
}
