//! Unit tests: ticket key rings: rotation, grace, key files, shared keys.

use std::path::Path;

use super::*;
use crate::session::ticket_key::{parse_key_file, KEY_FILE_ENTRY_LEN};

fn line(bytes: &[u8]) -> String {
    boring::base64::encode_block(bytes)
}

#[test]
fn key_file_last_line_encrypts() {
    let a = [1u8; 80];
    let mut b = [2u8; 80];
    b[..16].copy_from_slice(&[9u8; 16]);
    let text = format!("# comment\n{}\n\n{}\n", line(&a), line(&b));
    let keys = parse_key_file(Path::new("k"), &text).unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].name, [1u8; 16]);
    assert_eq!(*keys[0].hmac, [1u8; 32]);
    assert_eq!(*keys[1].aes, [2u8; 32]);
    let ring = KeyRing::from_file_keys(keys);
    let now = Instant::now();
    assert_eq!(ring.encrypting().key.name, [9u8; 16]);
    assert!(matches!(ring.lookup(&[9u8; 16], now), Lookup::Current(_)));
    assert!(matches!(ring.lookup(&[1u8; 16], now), Lookup::Old(_)));
    assert_eq!(ring.lookup(&[3u8; 16], now), Lookup::Unknown);
}

#[test]
fn key_file_errors_name_the_line() {
    let err = parse_key_file(Path::new("keys"), "\n!!!\n").unwrap_err();
    assert!(err.to_string().starts_with("keys:2:"), "{err}");
    let err = parse_key_file(Path::new("keys"), &line(&[0u8; 48])).unwrap_err();
    assert!(err.to_string().contains("48 bytes"), "{err}");
    let err = parse_key_file(Path::new("keys"), "# only a comment\n").unwrap_err();
    assert!(err.to_string().contains("no ticket key"), "{err}");
    let dup = format!("{}\n{}\n", line(&[1u8; 80]), line(&[1u8; 80]));
    assert!(parse_key_file(Path::new("keys"), &dup).is_err());
}

#[test]
fn memory_keys_rotate_and_expire_after_grace() {
    let start = Instant::now();
    let rotation = Duration::from_secs(10);
    let grace = Duration::from_secs(5);
    let keys = TicketKeys::new(KeySource::Memory { rotation, grace }, start).unwrap();
    let first = keys.ring_for_encrypt(start).encrypting().key.name;
    // Before the rotation is due, the same key encrypts.
    let t = start + Duration::from_secs(9);
    assert_eq!(keys.ring_for_encrypt(t).encrypting().key.name, first);
    // Due: a new key encrypts; the old one still decrypts (renewing the ticket).
    let t = start + Duration::from_secs(11);
    let ring = keys.ring_for_encrypt(t);
    let second = ring.encrypting().key.name;
    assert_ne!(first, second);
    assert!(matches!(ring.lookup(&first, t), Lookup::Old(_)));
    assert!(matches!(ring.lookup(&second, t), Lookup::Current(_)));
    // After rotation + grace the old key is refused, even before anything rotates again.
    let t = start + Duration::from_secs(15);
    assert_eq!(keys.ring().lookup(&first, t), Lookup::Unknown);
    // A later rotation forgets it.
    let t = start + Duration::from_secs(22);
    let ring = keys.ring_for_encrypt(t);
    assert!(ring.keys.iter().all(|k| k.key.name != first));
    assert_eq!(ring.keys.len(), 2);
}

fn shared(epoch: u64, tag: u8) -> SharedKey {
    SharedKey {
        epoch,
        key: TicketKey::from_bytes(&[tag; KEY_FILE_ENTRY_LEN]),
    }
}

#[test]
fn shared_epochs_cover_the_grace_and_the_next_epoch() {
    let hour = Duration::from_secs(3600);
    let at = Duration::from_secs(10 * 3600 + 5);
    assert_eq!(shared_epochs(at, hour, hour), 9..=11);
    assert_eq!(shared_epochs(at, hour, hour / 2), 9..=11);
    assert_eq!(shared_epochs(at, hour, Duration::ZERO), 10..=11);
    assert_eq!(shared_epochs(Duration::ZERO, hour, 3 * hour), 0..=1);
}

#[test]
fn shared_keys_encrypt_in_their_epoch_and_the_next_one_takes_over() {
    let rotation = Duration::from_secs(100);
    let grace = Duration::from_secs(50);
    let start = Instant::now();
    let keys = TicketKeys::new(KeySource::Redis { rotation, grace }, start).unwrap();
    let own = keys.ring().encrypting().key.name;
    // The wall clock is 20 s into epoch 10 (1000..1100 s).
    let unix = Duration::from_secs(1020);
    let batch = vec![shared(11, 2), shared(9, 1), shared(10, 3)];
    keys.install_shared(batch, (rotation, grace), start, unix)
        .unwrap();
    // A batch fetched for other settings (a reload raced the fetch) is refused.
    let stale = vec![shared(1020, 7)];
    assert!(keys
        .install_shared(stale, (Duration::from_secs(1), grace), start, unix)
        .is_err());
    let ring = keys.ring_for_encrypt(start);
    assert_eq!(ring.encrypting().key.name, [3; 16], "epoch 10 encrypts");
    assert!(
        matches!(ring.lookup(&[1; 16], start), Lookup::Old(_)),
        "epoch 9 decrypts"
    );
    assert!(
        matches!(ring.lookup(&[2; 16], start), Lookup::Old(_)),
        "epoch 11 is known early"
    );
    assert!(
        matches!(ring.lookup(&own, start), Lookup::Old(_)),
        "the process's own key decrypts"
    );

    // 30 s later (0:50 past epoch 9's end): epoch 9 and the own key (retired with the
    // grace) are past their grace.
    let t = start + Duration::from_secs(30);
    assert_eq!(keys.ring().lookup(&[1; 16], t), Lookup::Unknown);
    assert_eq!(
        keys.ring().lookup(&own, t + Duration::from_secs(20)),
        Lookup::Unknown
    );

    // At 1100 s epoch 11 encrypts, without asking Redis.
    let t = start + Duration::from_secs(80);
    let ring = keys.ring_for_encrypt(t);
    assert_eq!(ring.encrypting().key.name, [2; 16]);
    assert!(matches!(ring.lookup(&[3; 16], t), Lookup::Old(_)));

    // At 1200 s nothing newer came: the process encrypts with a key of its own, and
    // epoch 11's key still decrypts for its grace.
    let t = start + Duration::from_secs(180);
    let ring = keys.ring_for_encrypt(t);
    let fresh = ring.encrypting().key.name;
    assert!(![[1; 16], [2; 16], [3; 16], own].contains(&fresh));
    assert!(matches!(ring.lookup(&[2; 16], t), Lookup::Old(_)));

    // When Redis answers again, the shared key encrypts and the own one retires.
    let unix = Duration::from_secs(1200);
    keys.install_shared(
        vec![shared(12, 4), shared(11, 2)],
        (rotation, grace),
        t,
        unix,
    )
    .unwrap();
    let ring = keys.ring_for_encrypt(t);
    assert_eq!(ring.encrypting().key.name, [4; 16]);
    assert!(matches!(ring.lookup(&fresh, t), Lookup::Old(_)));
}

#[test]
fn shared_keys_are_refused_unless_the_source_is_redis() {
    let now = Instant::now();
    let (rotation, grace) = (Duration::from_secs(10), Duration::from_secs(10));
    let keys = TicketKeys::new(KeySource::Memory { rotation, grace }, now).unwrap();
    let before = keys.ring().encrypting().key.name;
    assert!(keys
        .install_shared(
            vec![shared(1, 1)],
            (rotation, grace),
            now,
            Duration::from_secs(15)
        )
        .is_err());
    assert_eq!(keys.ring().encrypting().key.name, before);
}

#[test]
fn keys_in_use_keep_decrypting_when_a_key_file_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, line(&[7u8; 80])).unwrap();
    let now = Instant::now();
    let (rotation, grace) = (Duration::from_secs(10), Duration::from_secs(5));
    let keys = TicketKeys::new(KeySource::Memory { rotation, grace }, now).unwrap();
    let own = keys.ring().encrypting().key.name;
    keys.reconfigure(KeySource::File(path), now).unwrap();
    let ring = keys.ring_for_encrypt(now);
    assert_eq!(ring.encrypting().key.name, [7u8; 16]);
    assert!(matches!(ring.lookup(&own, now), Lookup::Old(_)));
    assert_eq!(ring.lookup(&own, now + grace), Lookup::Unknown);
}

#[test]
fn a_key_file_stops_encrypting_when_redis_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, line(&[7u8; 80])).unwrap();
    let now = Instant::now();
    let (rotation, grace) = (Duration::from_secs(600), Duration::from_secs(300));
    let keys = TicketKeys::new(KeySource::File(path), now).unwrap();
    keys.reconfigure(KeySource::Redis { rotation, grace }, now)
        .unwrap();
    // Before Redis answers: a key of this process encrypts, and rotates...
    let ring = keys.ring_for_encrypt(now);
    let own = ring.encrypting().key.name;
    assert_ne!(own, [7u8; 16]);
    assert!(matches!(ring.lookup(&[7u8; 16], now), Lookup::Old(_)));
    let later = now + Duration::from_secs(3600);
    let ring = keys.ring_for_encrypt(later);
    assert_ne!(ring.encrypting().key.name, [7u8; 16]);
    assert_ne!(ring.encrypting().key.name, own);
    // ...and the file's key decrypts for the grace period only.
    assert_eq!(ring.lookup(&[7u8; 16], now + grace), Lookup::Unknown);
}

#[test]
fn key_file_reload_error_keeps_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, line(&[7u8; 80])).unwrap();
    let now = Instant::now();
    let keys = TicketKeys::new(KeySource::File(path.clone()), now).unwrap();
    std::fs::write(&path, "garbage").unwrap();
    assert!(keys
        .reconfigure(KeySource::File(path.clone()), now)
        .is_err());
    assert_eq!(keys.ring().encrypting().key.name, [7u8; 16]);
    std::fs::write(&path, format!("{}\n{}", line(&[7u8; 80]), line(&[8u8; 80]))).unwrap();
    keys.reconfigure(KeySource::File(path), now).unwrap();
    assert_eq!(keys.ring().encrypting().key.name, [8u8; 16]);
    assert!(matches!(
        keys.ring().lookup(&[7u8; 16], now),
        Lookup::Old(_)
    ));
}
