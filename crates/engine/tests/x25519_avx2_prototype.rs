//! The AVX2 X25519 prototype (`bench/x25519_avx2.rs`, timed by the
//! `x25519_speed` example to decide whether CPUs without IFMA get a curve
//! kernel) still computes X25519: its figures mean nothing otherwise.

#[cfg(target_arch = "x86_64")]
#[path = "../bench/x25519_avx2.rs"]
mod x25519_avx2;

#[test]
fn avx2_prototype_agrees_with_aws_lc_rs() {
    #[cfg(target_arch = "x86_64")]
    {
        if !x25519_avx2::available() {
            eprintln!("avx2 prototype skipped: this CPU lacks AVX2");
            return;
        }
        x25519_avx2::check_against_aws_lc();
    }
}
