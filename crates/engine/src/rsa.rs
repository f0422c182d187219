//! RSA private keys and the batched CRT private operation.
//!
//! Lanes are exponentiations, not signatures: a signature contributes two
//! jobs (mod p and mod q) and jobs are packed 8 to a pass, so 1..4 signatures
//! need one pass and 5..8 need two. A pass of at most 4 jobs fills lanes 0..4
//! only, which a kernel made for that lane count (`make`) may compute at half
//! the width. The public-key check of up to 8
//! signatures then runs as one more (cheap, e = 65537) pass over the full
//! modulus.
//!
//! No blinding: blinding defends variable-time code whose timing or memory
//! access pattern depends on the base or exponent. Here every step (input
//! reduction, exponentiation with a fixed 4-bit window and masked table
//! selection, CRT recombination, final subtractions, the public-key check and
//! its comparison) executes the same instructions and touches the same
//! addresses whatever the key, message and intermediate values are; only the
//! public key size and lane count choose the code path. `ct/run.sh` checks
//! this under valgrind for the portable kernel, and the IFMA kernel has the
//! same straight-line structure (see `ifma.rs`). Fault attacks on CRT (Bellcore)
//! are covered by the public-key check, which never lets a wrong result out.

use crate::bn::{self, limbs_for_bits, Lanes, LANES, LIMB_BITS};
use crate::exp::ExpJob;
use crate::kernel::{get_lane, set_lane, MontKernel};
use crate::EngineError;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Precomputed data for one CRT half (modulus p or q).
#[derive(Zeroize, ZeroizeOnDrop)]
pub(crate) struct Half {
    /// The prime, radix 2^52.
    m: Vec<u64>,
    /// `-m^-1 mod 2^52`.
    k0: u64,
    /// `R^3 mod m` with `R = 2^(52*H)`: converts `c*R^-1` to Montgomery form.
    r3: Vec<u64>,
    /// `R mod m`: Montgomery one.
    one: Vec<u64>,
    /// The CRT exponent (dp or dq).
    exp: Vec<u64>,
}

impl Half {
    fn new(m: Vec<u64>, exp: Vec<u64>) -> Self {
        let h = m.len();
        let k0 = bn::mont_k0(m[0]);
        let mut r2 = bn::pow2_mod(2 * LIMB_BITS * h, &m);
        let mut r3 = vec![0u64; h];
        bn::amm(&mut r3, &r2, &r2, &m, k0);
        bn::cond_sub(&mut r3, &m);
        let mut unit = vec![0u64; h];
        unit[0] = 1;
        let mut one = vec![0u64; h];
        bn::amm(&mut one, &r2, &unit, &m, k0);
        bn::cond_sub(&mut one, &m);
        r2.zeroize();
        Half {
            m,
            k0,
            r3,
            one,
            exp,
        }
    }

    #[cfg(feature = "test-hooks")]
    fn mark_secret(&self) {
        crate::ct::mark_secret(&self.m);
        crate::ct::mark_secret(core::slice::from_ref(&self.k0));
        crate::ct::mark_secret(&self.r3);
        crate::ct::mark_secret(&self.one);
        crate::ct::mark_secret(&self.exp);
    }
}

/// An RSA private key in the form the engine computes with (CRT, radix 2^52,
/// Montgomery constants precomputed). All fields are zeroized on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct RsaPrivateKey {
    bits: usize,
    /// Modulus, `2*H` limbs (public).
    n: Vec<u64>,
    n_k0: u64,
    /// `R_n^2 mod n` with `R_n = 2^(52*2H)` (public).
    n_r2: Vec<u64>,
    e: u64,
    p: Half,
    q: Half,
    /// `qinv * R mod p`.
    qinv_r: Vec<u64>,
}

impl core::fmt::Debug for RsaPrivateKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RsaPrivateKey")
            .field("bits", &self.bits)
            .field("e", &self.e)
            .finish_non_exhaustive()
    }
}

/// Strips leading zero bytes (variable time in their count: used on key load
/// only, where lengths are the public key size anyway).
fn strip(x: &[u8]) -> &[u8] {
    let z = x.iter().take_while(|&&b| b == 0).count();
    &x[z..]
}

fn byte_bits(x: &[u8]) -> usize {
    let x = strip(x);
    if x.is_empty() {
        0
    } else {
        x.len() * 8 - x[0].leading_zeros() as usize
    }
}

/// The components of an RSA private key, each a big-endian unsigned integer
/// (as `BN_bn2bin` or a PKCS#1 `RSAPrivateKey` gives them; leading zero bytes
/// are allowed). Named fields, so that two components cannot be swapped by
/// position.
#[derive(Clone, Copy)]
pub struct RsaComponents<'a> {
    /// The modulus `n = p * q`.
    pub n: &'a [u8],
    /// The public exponent `e` (odd, at least 3, below 2^64).
    pub e: &'a [u8],
    /// The private exponent `d` (only its length is checked: the engine
    /// computes with the CRT exponents).
    pub d: &'a [u8],
    /// The first prime `p`.
    pub p: &'a [u8],
    /// The second prime `q`.
    pub q: &'a [u8],
    /// `dp = d mod (p - 1)`.
    pub dp: &'a [u8],
    /// `dq = d mod (q - 1)`.
    pub dq: &'a [u8],
    /// `qinv = q^-1 mod p`.
    pub qinv: &'a [u8],
}

impl core::fmt::Debug for RsaComponents<'_> {
    // The components are secret: only the modulus size is shown.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RsaComponents")
            .field("n_bits", &byte_bits(self.n))
            .finish_non_exhaustive()
    }
}

impl RsaPrivateKey {
    /// Builds a key from its components. Supports 2048, 3072 and 4096-bit
    /// moduli with primes of exactly half the modulus size and a public
    /// exponent below 2^64; the components are checked for consistency
    /// (`p * q = n`, `dp < p`, `dq < q`, `qinv < p`, odd primes of the right
    /// size) without branching on their values.
    pub fn from_components(c: &RsaComponents<'_>) -> Result<Self, EngineError> {
        let RsaComponents {
            n,
            e,
            d,
            p,
            q,
            dp,
            dq,
            qinv,
        } = *c;
        let bits = byte_bits(n);
        if !matches!(bits, 2048 | 3072 | 4096) {
            return Err(EngineError::UnsupportedKeySize(bits));
        }
        let half_bits = bits / 2;
        let h = limbs_for_bits(half_bits);
        let f = 2 * h;
        if byte_bits(e) > 64 {
            return Err(EngineError::InvalidKey("e too large"));
        }
        let e = strip(e).iter().fold(0u64, |acc, &b| (acc << 8) | b as u64);
        if e < 3 || e & 1 == 0 {
            return Err(EngineError::InvalidKey(
                "public exponent must be odd and >= 3",
            ));
        }
        // The secret components are only measured by their byte length (public: the
        // encoder's output length); their values are checked below without branches.
        let half_bytes = half_bits.div_ceil(8);
        if [p, q, dp, dq, qinv].iter().any(|x| x.len() > half_bytes) || d.len() > bits / 8 {
            return Err(EngineError::InvalidKey("component too large"));
        }
        let nl = bn::from_be_bytes(strip(n), f);
        let pl = bn::from_be_bytes(p, h);
        let ql = bn::from_be_bytes(q, h);
        let dpl = bn::from_be_bytes(dp, h);
        let dql = bn::from_be_bytes(dq, h);
        let mut qinvl = bn::from_be_bytes(qinv, h);

        // Consistency, computed without secret-dependent branches; only the
        // final verdict is branched on.
        let mut pq = vec![0u64; f];
        bn::mul(&mut pq, &pl, &ql);
        let mut ok = bn::ct_eq_mask(&pq, &nl);
        pq.zeroize();
        let mut t = vec![0u64; h];
        for (x, m) in [(&dpl, &pl), (&dql, &ql), (&qinvl, &pl)] {
            ok &= bn::sub(&mut t, x, m).wrapping_neg(); // x < m
        }
        ok &= (pl[0] & ql[0] & 1).wrapping_neg(); // both odd
                                                  // p and q have exactly half the modulus bits: the top bit set, none above.
        let (top_limb, top_bit) = ((half_bits - 1) / LIMB_BITS, (half_bits - 1) % LIMB_BITS);
        for x in [&pl, &ql] {
            ok &= ((x[top_limb] >> top_bit) ^ 1).wrapping_sub(1);
        }
        t.zeroize();
        // Whether the key is valid is public (the caller learns it anyway).
        crate::ct::declassify(core::slice::from_ref(&ok));
        if ok == 0 {
            qinvl.zeroize();
            let (mut a, mut b, mut c, mut d) = (pl, ql, dpl, dql);
            for v in [&mut a, &mut b, &mut c, &mut d] {
                v.zeroize();
            }
            return Err(EngineError::InvalidKey("inconsistent RSA components"));
        }

        let n_k0 = bn::mont_k0(nl[0]);
        let n_r2 = bn::pow2_mod(2 * LIMB_BITS * f, &nl);
        let p = Half::new(pl, dpl);
        let q = Half::new(ql, dql);
        let mut r2 = bn::pow2_mod(2 * LIMB_BITS * h, &p.m);
        let mut qinv_r = vec![0u64; h];
        bn::amm(&mut qinv_r, &qinvl, &r2, &p.m, p.k0);
        bn::cond_sub(&mut qinv_r, &p.m);
        r2.zeroize();
        qinvl.zeroize();
        Ok(RsaPrivateKey {
            bits,
            n: nl,
            n_k0,
            n_r2,
            e,
            p,
            q,
            qinv_r,
        })
    }

    /// Modulus size in bits (2048, 3072 or 4096).
    pub fn modulus_bits(&self) -> usize {
        self.bits
    }

    /// Modulus size in bytes.
    pub fn modulus_len(&self) -> usize {
        self.bits.div_ceil(8)
    }

    /// Public exponent.
    pub fn public_exponent(&self) -> u64 {
        self.e
    }

    /// Modulus as big-endian bytes.
    pub fn modulus_be(&self) -> Vec<u8> {
        bn::to_be_bytes(&self.n, self.modulus_len())
    }

    /// Test hook (feature `test-hooks`) for the constant-time harness: marks
    /// every secret-derived field as undefined for valgrind memcheck (no-op
    /// without the `ct-valgrind` feature or outside valgrind).
    #[cfg(feature = "test-hooks")]
    pub fn ct_mark_secret(&self) {
        self.p.mark_secret();
        self.q.mark_secret();
        crate::ct::mark_secret(&self.qinv_r);
    }

    /// Parses a raw input (big-endian, at most the modulus length) as an
    /// integer below n. Input values are public.
    pub(crate) fn parse_input(&self, input: &[u8]) -> Result<Vec<u64>, EngineError> {
        if input.len() > self.modulus_len() {
            return Err(EngineError::InputOutOfRange);
        }
        let c = bn::from_be_bytes(input, self.n.len());
        let mut t = vec![0u64; c.len()];
        if bn::sub(&mut t, &c, &self.n) == 0 {
            return Err(EngineError::InputOutOfRange);
        }
        Ok(c)
    }
}

/// One exponentiation job: `c^exp mod m` for one CRT half.
struct Job<'a> {
    half: &'a Half,
    c: &'a [u64],
}

/// Runs per-lane scalar code on the first `lanes` lanes of a vertical number.
fn per_lane<const N: usize>(
    x: &mut [Lanes; N],
    lanes: usize,
    mut f: impl FnMut(usize, &mut [u64]),
) {
    let mut v = [0u64; N];
    for lane in 0..lanes {
        get_lane(x, lane, &mut v);
        f(lane, &mut v);
        set_lane(x, lane, &v);
    }
    v.zeroize();
}

/// One multi-buffer pass of up to 8 exponentiation jobs; returns each job's
/// `c^exp mod m`, fully reduced, `H` limbs.
fn exp_pass<K: MontKernel, const H: usize>(
    k: &K,
    jobs: &[Job<'_>],
    exp_bits: usize,
) -> Vec<Vec<u64>> {
    debug_assert!(!jobs.is_empty() && jobs.len() <= LANES);
    let z = [Lanes::default(); H];
    let (mut m, mut r3, mut one, mut exp, mut c_lo, mut c_hi) = (z, z, z, z, z, z);
    let mut unit = z;
    let mut k0 = Lanes::default();
    // Idle lanes repeat job 0 so that every lane holds valid operands.
    for lane in 0..LANES {
        let j = &jobs[lane.min(jobs.len() - 1)];
        set_lane(&mut m, lane, &j.half.m);
        set_lane(&mut r3, lane, &j.half.r3);
        set_lane(&mut one, lane, &j.half.one);
        set_lane(&mut exp, lane, &j.half.exp);
        set_lane(&mut c_lo, lane, &j.c[..H]);
        set_lane(&mut c_hi, lane, &j.c[H..]);
        k0.0[lane] = j.half.k0;
        unit[0].0[lane] = 1;
    }
    // c mod m in Montgomery form. With c = c_hi*R + c_lo: c*R^-1 = c_hi +
    // c_lo*R^-1 (mod m), and c_hi < 2^(bits-52H) < m, so x < 3m; then
    // x*R^3*R^-1 = c*R. AMM bounds hold since 6m < R.
    let mut x = k.mul(&c_lo, &unit, &m, &k0);
    let mut hi = [0u64; H];
    // x*R^-1 mod p factors n: every copy of it is zeroized.
    let mut t = [0u64; H];
    per_lane(&mut x, jobs.len(), |lane, v| {
        get_lane(&c_hi, lane, &mut hi);
        t.copy_from_slice(v);
        bn::add(v, &t, &hi);
    });
    t.zeroize();
    let base = k.mul(&x, &r3, &m, &k0);
    let acc = k.mod_exp::<H>(&ExpJob {
        base: &base,
        exp: &exp,
        exp_bits,
        m: &m,
        k0: &k0,
        one: &one,
    });
    let mut out = k.mul(&acc, &unit, &m, &k0);
    let mut res = Vec::with_capacity(jobs.len());
    let mut ml = [0u64; H];
    per_lane(&mut out, jobs.len(), |lane, v| {
        get_lane(&m, lane, &mut ml);
        bn::cond_sub(v, &ml);
        res.push(v.to_vec());
    });
    for t in [
        &mut m, &mut r3, &mut one, &mut exp, &mut c_lo, &mut c_hi, &mut x,
    ] {
        t.zeroize();
    }
    // k0 = -p^-1 mod 2^52 gives away the low bits of p.
    ml.zeroize();
    k0.zeroize();
    let (mut base, mut acc) = (base, acc);
    base.zeroize();
    acc.zeroize();
    out.zeroize();
    hi.zeroize();
    res
}

/// Garner: `s = m2 + q * ((m1 - m2) * qinv mod p)`, constant time.
fn recombine(key: &RsaPrivateKey, m1: &[u64], m2: &[u64]) -> Vec<u64> {
    let h = m1.len();
    let p = &key.p.m;
    // m1 < p and m2 < q < 2p (same bit length), so 0 < m1 + 2p - m2 < 3p.
    let mut two_p = vec![0u64; h];
    bn::add(&mut two_p, p, p);
    let mut t = vec![0u64; h];
    bn::add(&mut t, m1, &two_p);
    let mut diff = vec![0u64; h];
    bn::sub(&mut diff, &t, m2);
    // AMM(diff, qinv*R) = diff*qinv mod p, < 2p since 3p*p < p*R.
    let mut hh = vec![0u64; h];
    bn::amm(&mut hh, &diff, &key.qinv_r, p, key.p.k0);
    bn::cond_sub(&mut hh, p);
    let mut s = vec![0u64; 2 * h];
    bn::mul(&mut s, &hh, &key.q.m);
    let mut m2x = vec![0u64; 2 * h];
    m2x[..h].copy_from_slice(m2);
    let prod = s.clone();
    bn::add(&mut s, &prod, &m2x);
    for v in [&mut two_p, &mut t, &mut diff, &mut hh, &mut m2x] {
        v.zeroize();
    }
    let mut prod = prod;
    prod.zeroize();
    s
}

/// Checks `s^e mod n == c` for up to 8 signatures in one pass; returns an
/// all-ones mask per signature that passed. `e` is public, so its bits may
/// steer the code; `s` and the comparison are handled without branches.
fn public_check<K: MontKernel, const F: usize>(
    k: &K,
    keys: &[&RsaPrivateKey],
    sigs: &[Vec<u64>],
    inputs: &[&[u64]],
) -> Vec<u64> {
    let z = [Lanes::default(); F];
    let (mut n, mut r2, mut s, mut unit) = (z, z, z, z);
    let mut k0 = Lanes::default();
    for lane in 0..LANES {
        let i = lane.min(keys.len() - 1);
        set_lane(&mut n, lane, &keys[i].n);
        set_lane(&mut r2, lane, &keys[i].n_r2);
        set_lane(&mut s, lane, &sigs[i]);
        k0.0[lane] = keys[i].n_k0;
        unit[0].0[lane] = 1;
    }
    let mut sm = k.mul(&s, &r2, &n, &k0);
    let mut x = k.mul(&r2, &unit, &n, &k0); // R mod n: Montgomery one
    let ebits = keys
        .iter()
        .map(|key| 64 - key.e.leading_zeros() as usize)
        .max()
        .unwrap_or(0);
    for bit in (0..ebits).rev() {
        k.sqr_assign(&mut x, &n, &k0);
        let lane_mask: Vec<bool> = (0..LANES)
            .map(|l| (keys[l.min(keys.len() - 1)].e >> bit) & 1 == 1)
            .collect();
        if lane_mask.iter().any(|&b| b) {
            let mut y = k.mul(&x, &sm, &n, &k0);
            for j in 0..F {
                for (l, &b) in lane_mask.iter().enumerate() {
                    if b {
                        x[j].0[l] = y[j].0[l];
                    }
                }
            }
            y.zeroize();
        }
    }
    let mut out = k.mul(&x, &unit, &n, &k0);
    let mut masks = Vec::with_capacity(keys.len());
    let mut nl = [0u64; F];
    per_lane(&mut out, keys.len(), |lane, v| {
        get_lane(&n, lane, &mut nl);
        bn::cond_sub(v, &nl);
        masks.push(bn::ct_eq_mask(v, inputs[lane]));
    });
    // Until it has passed, a signature is secret: one computed wrong (a fault) reveals a
    // prime factor through gcd(s^e - c, n). Every vertical copy of it goes.
    for t in [&mut s, &mut sm, &mut x, &mut out] {
        t.zeroize();
    }
    masks
}

/// The batched private operation for one key size (`H` limbs per CRT half,
/// `F = 2H` for the modulus). `make` gives a kernel for a lane count.
pub(crate) fn private_batch<K: MontKernel, const H: usize, const F: usize>(
    make: &dyn Fn(usize) -> K,
    keys: &[&RsaPrivateKey],
    inputs: &[Vec<u64>],
    fault: Option<usize>,
) -> Vec<Result<Vec<u8>, EngineError>> {
    let mut out = Vec::with_capacity(keys.len());
    for (chunk_idx, (keys, inputs)) in keys.chunks(LANES).zip(inputs.chunks(LANES)).enumerate() {
        let exp_bits = keys[0].bits / 2;
        let jobs: Vec<Job<'_>> = keys
            .iter()
            .zip(inputs)
            .flat_map(|(key, c)| [Job { half: &key.p, c }, Job { half: &key.q, c }])
            .collect();
        let mut halves = Vec::with_capacity(jobs.len());
        for pass in jobs.chunks(LANES) {
            halves.extend(exp_pass::<K, H>(&make(pass.len()), pass, exp_bits));
        }
        let mut sigs: Vec<Vec<u64>> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| recombine(key, &halves[2 * i], &halves[2 * i + 1]))
            .collect();
        halves.zeroize();
        if let Some(f) = fault {
            if f / LANES == chunk_idx {
                sigs[f % LANES][0] ^= 1; // test hook: a corrupted lane
            }
        }
        let ins: Vec<&[u64]> = inputs.iter().map(|v| v.as_slice()).collect();
        let masks = public_check::<K, F>(&make(keys.len()), keys, &sigs, &ins);
        for ((key, s), mask) in keys.iter().zip(&sigs).zip(masks) {
            // The checked signature is public from here on.
            crate::ct::declassify(s);
            crate::ct::declassify(core::slice::from_ref(&mask));
            out.push(if mask == u64::MAX {
                Ok(bn::to_be_bytes(s, key.modulus_len()))
            } else {
                Err(EngineError::FaultDetected)
            });
        }
        sigs.zeroize();
    }
    out
}
