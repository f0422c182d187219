//! Stateless resets (RFC 9000, 10.3): how a client learns at once that tlsterm no longer
//! has its connection (it timed out or was closed here while the client's notice of it
//! was lost), instead of retransmitting into silence until its own idle timeout.
//!
//! Every connection ID tlsterm issues comes with a reset token, derived from the ID under
//! a key of this process (HMAC-SHA256, the first 16 bytes), so no table of tokens is kept:
//! a packet whose destination ID no connection has is answered with the token that ID
//! was issued with, which only tlsterm (this process) could compute. The key is made at
//! start and never written anywhere: it is not shared with other processes or machines,
//! which could otherwise reset a live connection whose packet strayed to them (10.3.2).
//! After a restart, clients of the old process time out as before.

use std::sync::LazyLock;

use aws_lc_rs::hmac;

/// A stateless reset is at least this long: a short header and the token, with enough
/// unpredictable bytes between that it cannot be told from a short-header packet.
pub const MIN_RESET: usize = 21;
/// Nor longer than this: an answer to a larger packet need not be larger.
const MAX_RESET: usize = 43;
const TOKEN: usize = 16;

static KEY: LazyLock<hmac::Key> = LazyLock::new(|| {
    let mut key = zeroize::Zeroizing::new([0u8; 32]);
    boring::rand::rand_bytes(key.as_mut_slice()).expect("BoringSSL's random generator");
    hmac::Key::new(hmac::HMAC_SHA256, key.as_slice())
});

/// The reset token of connection ID `cid`.
pub fn token(cid: &[u8]) -> u128 {
    let tag = hmac::sign(&KEY, cid);
    let mut token = [0u8; TOKEN];
    token.copy_from_slice(&tag.as_ref()[..TOKEN]);
    u128::from_be_bytes(token)
}

/// The stateless reset answering a short-header packet of `trigger_len` bytes to the
/// unknown connection ID `dcid`: a first byte with the short-header form, random bytes
/// and the ID's token. Always shorter than the packet it answers, so two endpoints can
/// never answer each other's resets forever, nor can one be used to amplify traffic;
/// `None` when the packet is too short for a shorter reset.
pub fn packet(dcid: &[u8], trigger_len: usize) -> Option<Vec<u8>> {
    let len = trigger_len.checked_sub(1)?.min(MAX_RESET);
    if len < MIN_RESET {
        return None;
    }
    let mut out = vec![0u8; len];
    boring::rand::rand_bytes(&mut out[..len - TOKEN]).expect("BoringSSL's random generator");
    // Short header (form bit clear), fixed bit set; the other bits stay random.
    out[0] = (out[0] & 0x3f) | 0x40;
    out[len - TOKEN..].copy_from_slice(&token(dcid).to_be_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_the_ids_own_and_stable() {
        let (a, b) = (b"connection id a".as_slice(), b"connection id b".as_slice());
        assert_eq!(token(a), token(a));
        assert_ne!(token(a), token(b));
    }

    #[test]
    fn a_reset_ends_with_the_token_and_looks_like_a_short_header() {
        let dcid = [7u8; 16];
        for trigger in [22, 30, 44, 1200] {
            let reset = packet(&dcid, trigger).unwrap();
            assert!(reset.len() < trigger && reset.len() >= MIN_RESET);
            assert_eq!(reset[0] & 0xc0, 0x40, "short header, fixed bit");
            assert_eq!(reset[reset.len() - TOKEN..], token(&dcid).to_be_bytes());
        }
        assert_eq!(packet(&dcid, 1200).unwrap().len(), MAX_RESET);
    }

    #[test]
    fn a_packet_too_short_for_a_shorter_reset_gets_none() {
        assert_eq!(packet(&[1; 16], MIN_RESET), None);
        assert_eq!(packet(&[1; 16], 0), None);
        assert!(packet(&[1; 16], MIN_RESET + 1).is_some());
    }
}
