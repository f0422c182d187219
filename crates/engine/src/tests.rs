//! Kernel tests against a simple reference (num-bigint), and each SIMD kernel
//! the CPU has (IFMA, AVX-512F, AVX2) against portable (bit-identical by construction:
//! the Montgomery quotient below R is unique, whatever the radix). A kernel
//! the CPU lacks is reported as skipped by name.

use crate::bn::{self, Lanes, LANES, LIMB_BITS, MASK52};
use crate::kernel::{get_lane, set_lane, MontKernel, Portable, TABLE};
use num_bigint::BigUint;
use proptest::prelude::*;

/// Runs `$body` with `$k` bound to each SIMD kernel this CPU supports (for
/// `lanes` lanes); prints the ones it lacks.
macro_rules! each_simd_kernel {
    ($lanes:expr, |$k:ident| $body:block) => {{
        #[cfg(target_arch = "x86_64")]
        {
            match crate::ifma::Ifma::new($lanes) {
                Some($k) => $body,
                None => skipped("avx512ifma"),
            }
        }
        each_mul32_kernel!($lanes, |$k| $body);
    }};
}

/// Runs `$body` with `$k` bound to each `vpmuludq` kernel (AVX-512F, AVX2)
/// this CPU supports, for `lanes` lanes; prints the ones it lacks.
macro_rules! each_mul32_kernel {
    ($lanes:expr, |$k:ident| $body:block) => {{
        #[cfg(target_arch = "x86_64")]
        {
            match crate::mul32::Avx512::new($lanes) {
                Some($k) => $body,
                None => skipped("avx512f"),
            }
            match crate::mul32::Avx2::new($lanes) {
                Some($k) => $body,
                None => skipped("avx2"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        skipped("avx512ifma, avx512f and avx2 (not x86_64)");
    }};
}

/// Says once per kernel that its tests did not run here.
fn skipped(kernel: &'static str) {
    static SAID: std::sync::Mutex<Vec<&str>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.contains(&kernel) {
        said.push(kernel);
        eprintln!("note: kernel {kernel} skipped: this CPU lacks it");
    }
}

fn to_big(x: &[u64]) -> BigUint {
    x.iter()
        .rev()
        .fold(BigUint::default(), |acc, &l| (acc << LIMB_BITS) + l)
}

/// Random modulus per lane with 4m < R (top limb below 2^(52-3)), odd, plus
/// operands a, b < 2m and k0.
fn operands<const N: usize>(seed: &[u64]) -> ([Lanes; N], [Lanes; N], [Lanes; N], Lanes) {
    let mut s = seed.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &x| {
        (h ^ x).wrapping_mul(0x100_0000_01b3)
    });
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (mut m, mut a, mut b, mut k0) = (
        [Lanes::default(); N],
        [Lanes::default(); N],
        [Lanes::default(); N],
        Lanes::default(),
    );
    for lane in 0..LANES {
        let mut ml = [0u64; N];
        for l in ml.iter_mut() {
            *l = next() & MASK52;
        }
        ml[N - 1] = (ml[N - 1] >> 4) | (1 << 47);
        ml[0] |= 1;
        // a, b: random below 2m (draw below m's bit size + 1, then reduce by
        // subtracting m while >= 2m, variable time is fine in a test).
        let mbig = to_big(&ml);
        let mut draw = || {
            let mut v = [0u64; N];
            for l in v.iter_mut() {
                *l = next() & MASK52;
            }
            v[N - 1] &= (1 << 49) - 1;
            let x = to_big(&v) % (&mbig * 2u32);
            let mut out = [0u64; N];
            out.copy_from_slice(&bn::from_be_bytes(&x.to_bytes_be(), N));
            out
        };
        let (al, bl) = (draw(), draw());
        set_lane(&mut m, lane, &ml);
        set_lane(&mut a, lane, &al);
        set_lane(&mut b, lane, &bl);
        k0.0[lane] = bn::mont_k0(ml[0]);
    }
    (m, a, b, k0)
}

fn check_mul<const N: usize>(seed: &[u64]) {
    let (m, a, b, k0) = operands::<N>(seed);
    let portable = Portable { lanes: LANES };
    let r = portable.mul(&a, &b, &m, &k0);
    let s = portable.sqr(&a, &m, &k0);
    let rr = BigUint::from(1u32) << (LIMB_BITS * N);
    for lane in 0..LANES {
        let mut v = [0u64; N];
        get_lane(&m, lane, &mut v);
        let mb = to_big(&v);
        let rinv = rr.modinv(&mb).expect("odd modulus");
        get_lane(&a, lane, &mut v);
        let ab = to_big(&v);
        get_lane(&b, lane, &mut v);
        let bb = to_big(&v);
        get_lane(&r, lane, &mut v);
        assert!(v.iter().all(|&l| l <= MASK52), "normalized");
        let got = to_big(&v);
        assert!(got < &mb * 2u32, "result below 2m");
        assert_eq!(&got % &mb, (&ab * &bb * &rinv) % &mb, "a*b/R mod m");
        get_lane(&s, lane, &mut v);
        assert_eq!(&to_big(&v) % &mb, (&ab * &ab * &rinv) % &mb, "a^2/R mod m");
    }
    let aa = portable.mul(&a, &a, &m, &k0);
    each_simd_kernel!(LANES, |k| {
        assert_eq!(k.mul(&a, &b, &m, &k0), r, "SIMD mul == portable mul");
        assert_eq!(k.sqr(&a, &m, &k0), aa, "SIMD sqr == a*a");
        let mut x = a;
        k.sqr_assign(&mut x, &m, &k0);
        assert_eq!(x, aa, "SIMD sqr in place == a*a");
        let mut y = a;
        k.mul_assign(&mut y, &b, &m, &k0);
        assert_eq!(y, r, "SIMD mul in place == portable mul");
    });
    // Fewer lanes: the lanes in use agree.
    #[cfg(target_arch = "x86_64")]
    for lanes in 1..LANES {
        each_simd_kernel!(lanes, |k| {
            let got = k.mul(&a, &b, &m, &k0);
            let mut x = a;
            k.sqr_assign(&mut x, &m, &k0);
            let mut y = a;
            k.mul_assign(&mut y, &b, &m, &k0);
            assert_first_lanes_agree(&got, &r, lanes, "mul");
            assert_first_lanes_agree(&x, &aa, lanes, "sqr in place");
            assert_first_lanes_agree(&y, &r, lanes, "mul in place");
        });
    }
}

/// The IFMA kernel's narrow pass (lanes 0..4 at ymm width) leaves lanes 4..8 of every
/// result zero, also where it writes over an operand whose lanes 4..8 were not: it
/// writes its results into uninitialized memory, which must end up fully written.
#[cfg(target_arch = "x86_64")]
#[test]
fn narrow_ifma_results_have_zero_upper_lanes() {
    const N: usize = 20;
    let Some(k) = crate::ifma::Ifma::new(LANES / 2) else {
        return skipped("avx512ifma");
    };
    let (m, a, b, k0) = operands::<N>(&[1, 2, 3]);
    let table = Box::new([a; TABLE]);
    let idx = Lanes([1; LANES]);
    let (mut x, mut y) = (a, a);
    k.sqr_assign(&mut x, &m, &k0);
    k.mul_assign(&mut y, &b, &m, &k0);
    let results = [
        ("mul", k.mul(&a, &b, &m, &k0)),
        ("sqr", k.sqr(&a, &m, &k0)),
        ("select", k.select(&table, &idx)),
        ("sqr in place", x),
        ("mul in place", y),
    ];
    assert!(a.iter().any(|l| l.0[LANES / 2..].iter().any(|&v| v != 0)));
    for (what, r) in results {
        for limb in &r {
            assert_eq!(limb.0[LANES / 2..], [0; LANES / 2], "{what}: lanes 4..8");
        }
    }
}

/// Lanes `0..lanes` of `got` equal those of `want` (a kernel made for that many lanes
/// leaves the others as it likes).
#[cfg(target_arch = "x86_64")]
fn assert_first_lanes_agree<const N: usize>(
    got: &[Lanes; N],
    want: &[Lanes; N],
    lanes: usize,
    what: &str,
) {
    for lane in 0..lanes {
        for j in 0..N {
            assert_eq!(
                got[j].0[lane], want[j].0[lane],
                "{what}, {lanes} lanes, lane {lane}"
            );
        }
    }
}

fn check_select<const N: usize>(seed: u64) {
    let mut table = Box::new([[Lanes::default(); N]; TABLE]);
    for (k, e) in table.iter_mut().enumerate() {
        for (j, l) in e.iter_mut().enumerate() {
            for lane in 0..LANES {
                l.0[lane] = (k as u64) << 32 | (j as u64) << 8 | lane as u64 | seed << 48;
            }
        }
    }
    let mut idx = Lanes::default();
    for lane in 0..LANES {
        idx.0[lane] = (seed.wrapping_mul(lane as u64 + 7) >> 3) % TABLE as u64;
    }
    let want: [Lanes; N] = core::array::from_fn(|j| {
        Lanes(core::array::from_fn(|lane| {
            table[idx.0[lane] as usize][j].0[lane]
        }))
    });
    assert_eq!(Portable { lanes: LANES }.select(&table, &idx), want);
    each_simd_kernel!(LANES, |k| {
        assert_eq!(k.select(&table, &idx), want);
    });
    #[cfg(target_arch = "x86_64")]
    for lanes in 1..LANES {
        each_simd_kernel!(lanes, |k| {
            let got = k.select(&table, &idx);
            assert_first_lanes_agree(&got, &want, lanes, "select");
        });
    }
}

/// A kernel's own `mod_exp` (the AVX2 kernel keeps its numbers in its own
/// limbs throughout) against the shared sequence run by the portable kernel:
/// the same bits, for every lane count. `exp_bits` is a multiple of the
/// window or not, as the key sizes give it.
fn check_exp<const N: usize>(seed: &[u64], exp_bits: usize) {
    let (m, a, b, k0) = operands::<N>(seed);
    // The exponent: b's limbs, cut to exp_bits (the top window may be short).
    let mut e = b;
    for (j, limb) in e.iter_mut().enumerate() {
        for lane in 0..LANES {
            let keep = exp_bits.saturating_sub(j * LIMB_BITS).min(LIMB_BITS);
            limb.0[lane] &= if keep == LIMB_BITS {
                MASK52
            } else {
                (1 << keep) - 1
            };
        }
    }
    let job = crate::exp::ExpJob {
        base: &a,
        exp: &e,
        exp_bits,
        m: &m,
        k0: &k0,
        one: &b,
    };
    let want: [Lanes; N] = Portable { lanes: LANES }.mod_exp(&job);
    each_simd_kernel!(LANES, |k| {
        assert_eq!(k.mod_exp::<N>(&job), want, "mod_exp == portable");
    });
    #[cfg(target_arch = "x86_64")]
    for lanes in 1..LANES {
        each_simd_kernel!(lanes, |k| {
            let got = k.mod_exp::<N>(&job);
            assert_first_lanes_agree(&got, &want, lanes, "mod_exp");
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4))]
    #[test]
    fn mod_exp_20(seed in proptest::collection::vec(any::<u64>(), 4)) { check_exp::<20>(&seed, 1024); }
    #[test]
    fn mod_exp_30(seed in proptest::collection::vec(any::<u64>(), 4)) { check_exp::<30>(&seed, 1536); }
    #[test]
    fn mod_exp_40(seed in proptest::collection::vec(any::<u64>(), 4)) { check_exp::<40>(&seed, 2048); }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn mont_mul_20(seed in proptest::collection::vec(any::<u64>(), 4)) { check_mul::<20>(&seed); }
    #[test]
    fn mont_mul_30(seed in proptest::collection::vec(any::<u64>(), 4)) { check_mul::<30>(&seed); }
    #[test]
    fn mont_mul_40(seed in proptest::collection::vec(any::<u64>(), 4)) { check_mul::<40>(&seed); }
    #[test]
    fn mont_mul_60(seed in proptest::collection::vec(any::<u64>(), 4)) { check_mul::<60>(&seed); }
    #[test]
    fn mont_mul_80(seed in proptest::collection::vec(any::<u64>(), 4)) { check_mul::<80>(&seed); }
    #[test]
    fn select_picks_the_indexed_entry(seed in any::<u64>()) {
        check_select::<20>(seed);
        check_select::<40>(seed);
    }
}

#[test]
fn extreme_operands() {
    // a = b = 2m - 1 (the largest allowed), m with all limbs maximal.
    const N: usize = 20;
    let mut ml = [MASK52; N];
    ml[N - 1] = (1 << 49) - 1;
    let mut two_m_minus_1 = [0u64; N];
    bn::add(&mut two_m_minus_1, &ml, &ml);
    two_m_minus_1[0] -= 1;
    let (mut m, mut a) = ([Lanes::default(); N], [Lanes::default(); N]);
    let mut k0 = Lanes::default();
    for lane in 0..LANES {
        set_lane(&mut m, lane, &ml);
        set_lane(&mut a, lane, &two_m_minus_1);
        k0.0[lane] = bn::mont_k0(ml[0]);
    }
    let p = Portable { lanes: LANES };
    let r = p.mul(&a, &a, &m, &k0);
    let mb = to_big(&ml);
    let mut v = [0u64; N];
    get_lane(&r, 0, &mut v);
    let rinv = (BigUint::from(1u32) << (LIMB_BITS * N))
        .modinv(&mb)
        .unwrap();
    let ab = to_big(&two_m_minus_1);
    assert_eq!(to_big(&v) % &mb, (&ab * &ab * rinv) % &mb);
    each_simd_kernel!(LANES, |k| {
        assert_eq!(k.mul(&a, &a, &m, &k0), r);
        assert_eq!(k.sqr(&a, &m, &k0), r);
        let mut x = a;
        k.sqr_assign(&mut x, &m, &k0);
        assert_eq!(x, r);
    });
    // Half the lanes (the IFMA kernel's ymm width).
    #[cfg(target_arch = "x86_64")]
    each_simd_kernel!(LANES / 2, |k| {
        assert_first_lanes_agree(&k.mul(&a, &a, &m, &k0), &r, LANES / 2, "mul");
        assert_first_lanes_agree(&k.sqr(&a, &m, &k0), &r, LANES / 2, "sqr");
    });
}
