//! No limb of p or q is left in freed heap memory after a key is built or a batch is
//! signed: a global allocator scans every block as it is freed, while armed, for the
//! radix-2^52 limbs of the key's primes (the engine's own representation of them).
//! A negative control frees an unzeroized copy and must be caught.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use common::*;
use tlsterm_engine::*;

const MAX_NEEDLES: usize = 160;

struct Scanning;

static ARMED: AtomicBool = AtomicBool::new(false);
static NEEDLE_COUNT: AtomicUsize = AtomicUsize::new(0);
static NEEDLES: [AtomicU64; MAX_NEEDLES] = [const { AtomicU64::new(0) }; MAX_NEEDLES];
static HITS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator with the same arguments;
// `dealloc` only reads the block it is given (live until it is forwarded), word by word.
unsafe impl GlobalAlloc for Scanning {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ARMED.load(Ordering::Relaxed) {
            let count = NEEDLE_COUNT.load(Ordering::Relaxed);
            for w in 0..layout.size() / 8 {
                // SAFETY: inside the block being freed; unaligned reads allowed.
                let word = unsafe { ptr.add(w * 8).cast::<u64>().read_unaligned() };
                if NEEDLES[..count]
                    .iter()
                    .any(|n| n.load(Ordering::Relaxed) == word)
                {
                    HITS.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Scanning = Scanning;

/// Little-endian 52-bit limbs of a big-endian number (allocated once, at full size:
/// a grown vector would leave copies in freed blocks that later allocations reuse).
fn limbs52(be: &[u8]) -> Vec<u64> {
    let mut out = Vec::with_capacity(MAX_NEEDLES);
    let (mut acc, mut bits) = (0u128, 0);
    for &b in be.iter().rev() {
        acc |= (b as u128) << bits;
        bits += 8;
        while bits >= 52 {
            out.push((acc as u64) & ((1 << 52) - 1));
            acc >>= 52;
            bits -= 52;
        }
    }
    out.push(acc as u64);
    out
}

/// Zeroes a vector so that the store is not dropped as dead before it is freed.
fn wipe(v: &mut [u64]) {
    for x in v.iter_mut() {
        // SAFETY: a valid, aligned, exclusive reference.
        unsafe { std::ptr::write_volatile(x, 0) };
    }
}

/// Arms the scanner for the limbs of `key`'s p and q, runs `f`, returns the hits.
fn scan(key: &boring::rsa::Rsa<boring::pkey::Private>, f: impl FnOnce()) -> usize {
    let mut needles = limbs52(&key.p().unwrap().to_vec());
    let mut q = limbs52(&key.q().unwrap().to_vec());
    needles.extend_from_slice(&q);
    wipe(&mut q);
    // Only limbs too large to occur by chance (all but a top limb, in practice).
    needles.retain(|&l| l > 1 << 40);
    assert!(needles.len() <= MAX_NEEDLES);
    for (slot, &n) in NEEDLES.iter().zip(&needles) {
        slot.store(n, Ordering::Relaxed);
    }
    NEEDLE_COUNT.store(needles.len(), Ordering::Relaxed);
    // The test's own copies must not be found later in reused blocks.
    wipe(&mut needles);
    HITS.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::SeqCst);
    f();
    ARMED.store(false, Ordering::SeqCst);
    HITS.load(Ordering::Relaxed)
}

#[test]
fn no_limb_of_p_or_q_is_left_in_freed_memory() {
    for bits in [2048u32, 3072, 4096] {
        let boring = boring::rsa::Rsa::generate(bits).unwrap();
        let mut key = None;
        let hits = scan(&boring, || key = Some(convert(&boring)));
        assert_eq!(
            hits, 0,
            "{bits}: key setup left limbs of p or q in freed memory"
        );
        let key = key.unwrap();
        for kernel in kernels() {
            for count in [1, 4, 5] {
                let hits = scan(&boring, || {
                    let reqs: Vec<SignRequest<'_>> = (0..count)
                        .map(|_| SignRequest {
                            key: &key,
                            padding: RsaPadding::Pss(Hash::Sha256),
                            message: b"freed memory",
                        })
                        .collect();
                    for r in sign_batch(kernel, &reqs) {
                        r.unwrap();
                    }
                });
                assert_eq!(
                    hits,
                    0,
                    "{bits}, {}, batch of {count}: sign_batch left limbs of p or q in freed memory",
                    kernel.name()
                );
            }
        }
    }
    // Negative control, last (its stale copy would be found again in reused blocks):
    // an unzeroized copy of p's limbs, freed while armed.
    let boring = boring::rsa::Rsa::generate(2048).unwrap();
    let hits = scan(&boring, || {
        drop(std::hint::black_box(limbs52(&boring.p().unwrap().to_vec())));
    });
    assert!(hits > 0, "the scanner must see a freed copy of p");
}
