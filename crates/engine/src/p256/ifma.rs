//! Placeholder until the IFMA kernel lands: the portable computation.
use super::mont::U256;
use super::NoncePoint;
pub(super) fn nonce_points(ks: &[U256], out: &mut [NoncePoint]) {
    for (o, k) in out.iter_mut().zip(ks) {
        let (x, y, k_inv) = super::point::nonce_point(k);
        *o = NoncePoint { x, y, k_inv };
    }
}
#[cfg(feature = "ct-planted")]
pub fn planted_select_p256() {}
