//! The address-validation tokens of stateless Retry (RFC 9000, 8.1.2).
//!
//! A Retry hands the client a token that it must echo in its next Initial packet: only a
//! client that receives packets at its address can, so a token proves the address, and
//! the token carries what tlsterm would otherwise have had to remember (the connection ID
//! the client first chose). Tokens are sealed like the fleet's shared entries (`seal`):
//! AES-256-GCM, under a key of this process's own, made at start and never written
//! anywhere. The associated data binds a token to the client's address and port and to
//! the connection ID the Retry gave it, so a token taken elsewhere, or used with another
//! connection ID, does not open; the sealed time makes it expire.
//!
//! A token is `1 ‖ nonce (12) ‖ tag (16) ‖ ciphertext` of `issued (8, Unix seconds) ‖
//! original destination connection ID`. Nonces count up from a random start: the key
//! lives only as long as the process and the counter never repeats within it, so no
//! nonce is used twice under it, however many Retries a flood draws.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

use boring::symm::{decrypt_aead, encrypt_aead, Cipher};
use zeroize::Zeroizing;

const VERSION: u8 = 1;
const NONCE: usize = 12;
const TAG: usize = 16;
const ISSUED: usize = 8;
const HEADER: usize = 1 + NONCE + TAG;
/// Binds the tokens to this use of the key.
const LABEL: &[u8] = b"tlsterm quic retry token v1\0";
/// QUIC's longest connection ID (RFC 9000, 17.2).
const MAX_CID: usize = 20;

/// How long a token is accepted after its Retry: a client answers a Retry at once, so a
/// few round trips of the slowest path are enough, and a captured token is soon useless.
pub const LIFETIME_SECS: u64 = 10;

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not one of this process's tokens, or not for this address and connection ID:
    /// forged, altered, issued to another address, or by a process since restarted.
    Invalid,
    /// A genuine token older than [`LIFETIME_SECS`].
    Expired,
}

struct TokenKey {
    key: Zeroizing<[u8; 32]>,
    next_nonce: AtomicU64,
}

static KEY: LazyLock<TokenKey> = LazyLock::new(|| {
    let mut key = Zeroizing::new([0u8; 32]);
    boring::rand::rand_bytes(key.as_mut_slice()).expect("BoringSSL's random generator");
    let mut start = [0u8; 8];
    boring::rand::rand_bytes(&mut start).expect("BoringSSL's random generator");
    // The top bit clear: 2^63 tokens before the counter could wrap.
    let start = u64::from_be_bytes(start) >> 1;
    TokenKey {
        key,
        next_nonce: AtomicU64::new(start),
    }
});

/// What a token is bound to besides its content: the client's address and port, and the
/// connection ID the Retry told it to use.
fn associated_data(client: SocketAddr, retry_cid: &[u8]) -> Vec<u8> {
    let ip = match client.ip() {
        std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped(),
        std::net::IpAddr::V6(ip) => ip,
    };
    [
        LABEL,
        &ip.octets(),
        &client.port().to_be_bytes(),
        &[retry_cid.len() as u8],
        retry_cid,
    ]
    .concat()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A token for a client at `client` whose first Initial went to `original_cid`, told by
/// the Retry to use `retry_cid`.
pub(super) fn issue(client: SocketAddr, original_cid: &[u8], retry_cid: &[u8]) -> Vec<u8> {
    issue_at(client, original_cid, retry_cid, unix_now())
}

fn issue_at(client: SocketAddr, original_cid: &[u8], retry_cid: &[u8], now: u64) -> Vec<u8> {
    let key = &*KEY;
    let counter = key.next_nonce.fetch_add(1, Ordering::Relaxed);
    let mut nonce = [0u8; NONCE];
    nonce[NONCE - 8..].copy_from_slice(&counter.to_be_bytes());
    let plain = [&now.to_be_bytes()[..], original_cid].concat();
    let mut tag = [0u8; TAG];
    let sealed = encrypt_aead(
        Cipher::aes_256_gcm(),
        key.key.as_slice(),
        Some(&nonce),
        &associated_data(client, retry_cid),
        &plain,
        &mut tag,
    )
    .expect("AES-256-GCM with a key and nonce of the right sizes");
    [&[VERSION][..], &nonce, &tag, &sealed].concat()
}

/// The original destination connection ID a token was issued for, if `token` is a live
/// token of this process for a client at `client` now using connection ID `dcid`.
pub fn check(token: &[u8], client: SocketAddr, dcid: &[u8]) -> Result<Vec<u8>, Refused> {
    check_at(token, client, dcid, unix_now())
}

fn check_at(token: &[u8], client: SocketAddr, dcid: &[u8], now: u64) -> Result<Vec<u8>, Refused> {
    if token.len() < HEADER + ISSUED || token.len() > HEADER + ISSUED + MAX_CID {
        return Err(Refused::Invalid);
    }
    if token[0] != VERSION {
        return Err(Refused::Invalid);
    }
    let (nonce, rest) = token[1..].split_at(NONCE);
    let (tag, sealed) = rest.split_at(TAG);
    let plain = decrypt_aead(
        Cipher::aes_256_gcm(),
        KEY.key.as_slice(),
        Some(nonce),
        &associated_data(client, dcid),
        sealed,
        tag,
    )
    .map_err(|_| Refused::Invalid)?;
    let (issued, original_cid) = plain.split_at(ISSUED);
    let issued = u64::from_be_bytes(issued.try_into().expect("split at its length"));
    // A token from the future (the clock stepped back) is as suspect as an old one.
    if now.saturating_sub(issued) > LIFETIME_SECS || issued > now + 1 {
        return Err(Refused::Expired);
    }
    Ok(original_cid.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> SocketAddr {
        "192.0.2.1:4433".parse().unwrap()
    }

    const ORIGINAL: &[u8] = b"client-chosen-id";
    const RETRY: &[u8] = b"retry-cid-16-byt";

    #[test]
    fn a_token_opens_for_its_address_and_connection_id_and_yields_the_original_id() {
        let token = issue(client(), ORIGINAL, RETRY);
        assert_eq!(check(&token, client(), RETRY), Ok(ORIGINAL.to_vec()));
        assert!(
            !token.windows(ORIGINAL.len()).any(|w| w == ORIGINAL),
            "sealed, not in the clear"
        );
        let other_port: SocketAddr = "192.0.2.1:4434".parse().unwrap();
        let other_ip: SocketAddr = "192.0.2.2:4433".parse().unwrap();
        assert_eq!(check(&token, other_port, RETRY), Err(Refused::Invalid));
        assert_eq!(check(&token, other_ip, RETRY), Err(Refused::Invalid));
        assert_eq!(
            check(&token, client(), b"another-cid-16by"),
            Err(Refused::Invalid)
        );
    }

    #[test]
    fn an_altered_truncated_or_made_up_token_is_invalid() {
        let token = issue(client(), ORIGINAL, RETRY);
        for at in [0, 1, HEADER - 1, HEADER, token.len() - 1] {
            let mut altered = token.clone();
            altered[at] ^= 1;
            assert_eq!(
                check(&altered, client(), RETRY),
                Err(Refused::Invalid),
                "byte {at} altered"
            );
        }
        assert_eq!(
            check(&token[..token.len() - 1], client(), RETRY),
            Err(Refused::Invalid)
        );
        for made_up in [&[][..], &[1u8; 10], &[1u8; 60], &[0u8; HEADER + ISSUED + 4]] {
            assert_eq!(check(made_up, client(), RETRY), Err(Refused::Invalid));
        }
    }

    #[test]
    fn a_token_expires() {
        let now = unix_now();
        let old = issue_at(client(), ORIGINAL, RETRY, now - LIFETIME_SECS - 1);
        assert_eq!(check_at(&old, client(), RETRY, now), Err(Refused::Expired));
        let just = issue_at(client(), ORIGINAL, RETRY, now - LIFETIME_SECS);
        assert!(check_at(&just, client(), RETRY, now).is_ok());
        let future = issue_at(client(), ORIGINAL, RETRY, now + 60);
        assert_eq!(
            check_at(&future, client(), RETRY, now),
            Err(Refused::Expired)
        );
    }

    #[test]
    fn every_token_has_its_own_nonce() {
        let a = issue(client(), ORIGINAL, RETRY);
        let b = issue(client(), ORIGINAL, RETRY);
        assert_ne!(a[1..1 + NONCE], b[1..1 + NONCE]);
    }
}
