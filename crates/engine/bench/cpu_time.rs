//! The benchmarks' clock: the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`),
//! not wall time, so that other processes on a shared machine do not count.

pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Runs `f` (which computes `per_call` operations) for about `secs` of CPU
/// time in 5 rounds and returns the best round's microseconds per operation.
pub fn per_op(secs: f64, per_call: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = cpu_seconds();
        let mut calls = 0u64;
        while cpu_seconds() - start < secs / 5.0 {
            f();
            calls += 1;
        }
        best = best.min((cpu_seconds() - start) * 1e6 / (calls as f64 * per_call as f64));
    }
    best
}

/// The benchmark's first argument: seconds of CPU time per figure (default 2).
pub fn seconds_arg() -> f64 {
    std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("seconds"))
        .unwrap_or(2.0)
}
