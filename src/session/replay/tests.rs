//! Unit tests: the anti-replay memory: windows, bounds, claims.

use super::*;

const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A client address not used before (so no client share is reached).
fn anyone() -> IpAddr {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(1);
    IpAddr::V4((0x0a00_0000 + NEXT.fetch_add(1, Ordering::Relaxed)).into())
}

#[test]
fn a_client_hello_is_fresh_once_within_the_window() {
    let start = Instant::now();
    let guard = ReplayGuard::new(100, 1.0, start);
    assert_eq!(
        guard.check(&digest(b"binder-a"), anyone(), start),
        Verdict::Fresh
    );
    assert_eq!(
        guard.check(&digest(b"binder-b"), anyone(), start),
        Verdict::Fresh
    );
    assert_eq!(
        guard.check(&digest(b"binder-a"), anyone(), start),
        Verdict::Replayed
    );
    // Still remembered one window later (now in the previous generation)...
    let later = start + WINDOW;
    assert_eq!(
        guard.check(&digest(b"binder-a"), anyone(), later),
        Verdict::Replayed
    );
    // ...and forgotten after two, when BoringSSL's age check refuses such a copy.
    let much_later = later + WINDOW;
    assert_eq!(
        guard.check(&digest(b"binder-a"), anyone(), much_later),
        Verdict::Fresh
    );
    assert_eq!(guard.len(), 1);
}

/// A pre_shared_key extension with the given identities and binders.
fn psk(identities: &[&[u8]], binders: &[&[u8]]) -> Vec<u8> {
    let mut ids = Vec::new();
    for id in identities {
        ids.extend_from_slice(&(id.len() as u16).to_be_bytes());
        ids.extend_from_slice(id);
        ids.extend_from_slice(&[0, 0, 0, 7]); // obfuscated ticket age
    }
    let mut bs = Vec::new();
    for b in binders {
        bs.push(b.len() as u8);
        bs.extend_from_slice(b);
    }
    let mut ext = (ids.len() as u16).to_be_bytes().to_vec();
    ext.extend_from_slice(&ids);
    ext.extend_from_slice(&(bs.len() as u16).to_be_bytes());
    ext.extend_from_slice(&bs);
    ext
}

#[test]
fn only_the_first_identity_and_binder_identify_a_client_hello() {
    let (ticket, other) = (&[1u8; 40][..], &[2u8; 40][..]);
    let (binder, binder2, forged) = (&[3u8; 32][..], &[4u8; 32][..], &[5u8; 32][..]);
    let original = digest(&psk(&[ticket, other], &[binder, binder2]));
    // A copy whose second binder (which BoringSSL never checks) was changed is the same.
    assert_eq!(original, digest(&psk(&[ticket, other], &[binder, forged])));
    // Another first binder (another ClientHello) or ticket is not.
    assert_ne!(original, digest(&psk(&[ticket, other], &[forged, binder2])));
    assert_ne!(original, digest(&psk(&[other, ticket], &[binder, binder2])));
    // Unparsable: digested whole, still deterministic.
    assert_eq!(digest(b"\x00"), digest(b"\x00"));
    assert_ne!(digest(b"\x00"), digest(b"\x01"));
}

#[test]
fn one_client_network_fills_at_most_its_share() {
    let start = Instant::now();
    let guard = ReplayGuard::new(200, 0.01, start);
    let site = |last: u16| IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, last));
    assert_eq!(guard.check(&digest(b"1"), site(1), start), Verdict::Fresh);
    assert_eq!(guard.check(&digest(b"2"), site(2), start), Verdict::Fresh);
    // A third from the same /56, though from another address: refused, and not in the
    // set...
    assert_eq!(
        guard.check(&digest(b"3"), site(3), start),
        Verdict::ClientQuota
    );
    assert_eq!(guard.len(), 2);
    // ...but remembered: the same ClientHello sent from another network is a replay.
    assert_eq!(guard.check(&digest(b"3"), HOME, start), Verdict::Replayed);
    assert_eq!(
        guard.check(&digest(b"3"), HOME, start + WINDOW),
        Verdict::Replayed
    );
    // Another network still gets in.
    assert_eq!(guard.check(&digest(b"3b"), HOME, start), Verdict::Fresh);
    let other_site = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 0x100, 0, 0, 0, 1));
    assert_eq!(
        guard.check(&digest(b"4"), other_site, start),
        Verdict::Fresh
    );
    // A replay is still a replay, quota or not.
    assert_eq!(
        guard.check(&digest(b"1"), site(1), start),
        Verdict::Replayed
    );
    // The share is per generation.
    assert_eq!(
        guard.check(&digest(b"5"), site(5), start + WINDOW),
        Verdict::Fresh
    );
}

#[test]
fn a_full_memory_refuses_instead_of_forgetting() {
    let start = Instant::now();
    let guard = ReplayGuard::new(2, 1.0, start);
    assert_eq!(guard.check(&digest(b"1"), anyone(), start), Verdict::Fresh);
    assert_eq!(guard.check(&digest(b"2"), anyone(), start), Verdict::Fresh);
    assert_eq!(guard.check(&digest(b"3"), anyone(), start), Verdict::Full);
    assert_eq!(
        guard.check(&digest(b"1"), anyone(), start),
        Verdict::Replayed
    );
    // A turned generation keeps the old digests: still full.
    assert_eq!(
        guard.check(&digest(b"4"), anyone(), start + WINDOW),
        Verdict::Full
    );
    guard.set_capacity(3, 1.0);
    assert_eq!(
        guard.check(&digest(b"5"), anyone(), start + WINDOW),
        Verdict::Fresh
    );
    // Refused while full is not forgotten once there is room.
    for refused in [b"3", b"4"] {
        assert_eq!(
            guard.check(&digest(refused), anyone(), start + WINDOW),
            Verdict::Replayed
        );
    }
    assert_eq!(
        guard.check(&digest(b"2"), anyone(), start + WINDOW),
        Verdict::Replayed
    );
}

#[test]
fn one_wide_network_cannot_fill_the_memory() {
    let start = Instant::now();
    let guard = ReplayGuard::new(1000, 0.01, start);
    // Every /56 of one /48, each within its own share: the /48 fills 8 shares at most.
    let mut fresh = 0;
    for subnet in 0..=255u16 {
        for host in 0..10u16 {
            let client = std::net::Ipv6Addr::new(0x2001, 0xdb8, 7, subnet << 8, 0, 0, 0, host);
            let d = digest(format!("flood {subnet} {host}").as_bytes());
            if guard.check(&d, IpAddr::V6(client), start) == Verdict::Fresh {
                fresh += 1;
            }
        }
    }
    assert_eq!(fresh, WIDER_NETWORK_SHARES * 10);
    // The same from the addresses of one IPv4 /24.
    for host in 0..=255u8 {
        let client = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, host));
        guard.check(&digest(&[host; 3]), client, start);
    }
    assert_eq!(guard.len(), 2 * WIDER_NETWORK_SHARES * 10);
    // Everyone else still gets 0-RTT.
    for other in 0..20u8 {
        let d = digest(format!("other {other}").as_bytes());
        assert_eq!(guard.check(&d, anyone(), start), Verdict::Fresh, "{other}");
    }
}

#[test]
fn a_new_memory_covers_a_full_window_only_after_one() {
    let start = Instant::now();
    let guard = ReplayGuard::new(10, 1.0, start);
    assert!(!guard.remembers_a_full_window(start));
    assert!(!guard.remembers_a_full_window(start + WINDOW - Duration::from_millis(1)));
    assert!(guard.remembers_a_full_window(start + WINDOW));
}

#[test]
fn after_a_long_pause_everything_is_forgotten() {
    let start = Instant::now();
    let guard = ReplayGuard::new(10, 1.0, start);
    guard.check(&digest(b"old"), anyone(), start);
    guard.check(
        &digest(b"new"),
        anyone(),
        start + WINDOW + Duration::from_secs(1),
    );
    assert_eq!(guard.len(), 2);
    guard.check(&digest(b"x"), anyone(), start + 4 * WINDOW);
    assert_eq!(guard.len(), 1);
}
