//! Session ticket keys shared by every worker of the process.
//!
//! A [`KeyRing`] is an immutable list of keys: one encrypts new tickets, all of them decrypt.
//! [`TicketKeys`] holds the current ring in an `ArcSwap`, so the ticket callback (which runs on
//! every worker thread) reads it without taking a lock; rotation and reloads publish a new
//! ring.
//!
//! Three sources of keys:
//! * a key file (`ticket_key_file`): base64 lines of 80 bytes each, the last line encrypts and
//!   every line decrypts; re-read on SIGHUP. Several machines with the same file resume each
//!   other's tickets.
//! * none: keys are generated in memory; the encrypting key is replaced every
//!   `ticket_rotation` and a replaced key still decrypts for `ticket_grace`.
//! * Redis (`redis_ticket_keys`): one key per epoch of `ticket_rotation` on the wall clock,
//!   created by whichever process of the fleet comes first and read by all (see
//!   `Sessions`); the key of epoch e encrypts during [e, e+1) and decrypts until e+1 plus
//!   `ticket_grace`. Until the first keys arrive, and whenever the next epoch's key has not,
//!   the process rotates in-memory keys of its own.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use zeroize::Zeroize;

/// Bytes of one key in the key file: name (16), HMAC-SHA256 key (32), AES-256 key (32).
pub const KEY_FILE_ENTRY_LEN: usize = 80;

/// One ticket key. Tickets are AES-256-CBC encrypted and HMAC-SHA256 authenticated (the
/// format BoringSSL writes: name, IV, ciphertext, MAC); the name tells which key made them.
/// The secret halves are boxed: key rings are rebuilt and their vectors grow, and moving a
/// key then copies only pointers, so no unzeroized copy of a secret is left behind.
#[derive(Clone)]
pub struct TicketKey {
    pub name: [u8; 16],
    pub hmac: Box<[u8; 32]>,
    pub aes: Box<[u8; 32]>,
}

impl TicketKey {
    pub fn generate() -> TicketKey {
        let mut bytes = [0u8; KEY_FILE_ENTRY_LEN];
        boring::rand::rand_bytes(&mut bytes).expect("the RNG works");
        let key = TicketKey::from_bytes(&bytes);
        bytes.zeroize();
        key
    }

    /// Name, HMAC key, AES key: the layout of one key-file entry.
    pub fn from_bytes(bytes: &[u8; KEY_FILE_ENTRY_LEN]) -> TicketKey {
        let mut key = TicketKey {
            name: [0; 16],
            hmac: Box::new([0; 32]),
            aes: Box::new([0; 32]),
        };
        key.name.copy_from_slice(&bytes[..16]);
        key.hmac.copy_from_slice(&bytes[16..48]);
        key.aes.copy_from_slice(&bytes[48..]);
        key
    }
}

impl Drop for TicketKey {
    fn drop(&mut self) {
        self.hmac[..].zeroize();
        self.aes[..].zeroize();
    }
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TicketKey({})", hex(&self.name))
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone)]
pub struct RingKey {
    pub key: TicketKey,
    /// After this instant the key no longer encrypts (none: keys from a file).
    pub encrypt_until: Option<Instant>,
    /// After this instant the key no longer decrypts (none: keys from a file).
    pub decrypt_until: Option<Instant>,
}

/// What a ticket's key name maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// The encrypting key: resume.
    Current(&'a TicketKey),
    /// An older key that still decrypts: resume and issue a fresh ticket.
    Old(&'a TicketKey),
    /// Unknown or expired: full handshake.
    Unknown,
}

impl PartialEq for TicketKey {
    fn eq(&self, other: &TicketKey) -> bool {
        self.name == other.name
    }
}
impl Eq for TicketKey {}

/// An immutable set of keys; `keys[encrypt]` encrypts.
#[derive(Debug)]
pub struct KeyRing {
    pub keys: Vec<RingKey>,
    pub encrypt: usize,
}

impl KeyRing {
    pub fn encrypting(&self) -> &RingKey {
        &self.keys[self.encrypt]
    }

    pub fn lookup(&self, name: &[u8], now: Instant) -> Lookup<'_> {
        for (index, entry) in self.keys.iter().enumerate() {
            if entry.key.name != name {
                continue;
            }
            if entry.decrypt_until.is_some_and(|until| now >= until) {
                return Lookup::Unknown;
            }
            let current =
                index == self.encrypt && entry.encrypt_until.is_none_or(|until| now < until);
            return if current {
                Lookup::Current(&entry.key)
            } else {
                Lookup::Old(&entry.key)
            };
        }
        Lookup::Unknown
    }

    /// Keys from a key file: all decrypt, the last encrypts, none expires.
    pub fn from_file_keys(keys: Vec<TicketKey>) -> KeyRing {
        let encrypt = keys.len() - 1;
        KeyRing {
            keys: keys
                .into_iter()
                .map(|key| RingKey {
                    key,
                    encrypt_until: None,
                    decrypt_until: None,
                })
                .collect(),
            encrypt,
        }
    }
}

/// Where the keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    File(PathBuf),
    Memory { rotation: Duration, grace: Duration },
    Redis { rotation: Duration, grace: Duration },
}

/// A key shared through Redis and the epoch (unix time / rotation) it encrypts in.
pub struct SharedKey {
    pub epoch: u64,
    pub key: TicketKey,
}

/// The wall clock as time since the unix epoch: what shared-key epochs count in.
pub fn unix_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// The epochs whose shared keys a process needs at `unix_now`: those that may still
/// decrypt (the current one, and older ones within `grace` of their end), and the next
/// one, fetched early so that every process has it when it starts encrypting.
pub fn shared_epochs(
    unix_now: Duration,
    rotation: Duration,
    grace: Duration,
) -> std::ops::RangeInclusive<u64> {
    let rotation = rotation.as_secs().max(1);
    let current = unix_now.as_secs() / rotation;
    let back = grace.as_secs().div_ceil(rotation);
    current.saturating_sub(back)..=current + 1
}

/// Parses a key file: one base64 key of 80 bytes per line; blank lines and lines starting with
/// `#` are skipped. Errors name the file and the line.
pub fn parse_key_file(path: &Path, text: &str) -> anyhow::Result<Vec<TicketKey>> {
    let mut keys: Vec<TicketKey> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("{}:{}", path.display(), number + 1);
        let mut bytes = boring::base64::decode_block(line)
            .map_err(|_| anyhow::anyhow!("{}: ticket key is not valid base64", at()))?;
        anyhow::ensure!(
            bytes.len() == KEY_FILE_ENTRY_LEN,
            "{}: ticket key has {} bytes, expected {KEY_FILE_ENTRY_LEN} (16-byte name, 32-byte HMAC key, 32-byte AES key; e.g. `openssl rand 80 | base64 -w0`)",
            at(),
            bytes.len()
        );
        let key = TicketKey::from_bytes(bytes.as_slice().try_into().expect("80 bytes"));
        bytes.zeroize();
        anyhow::ensure!(
            !keys.iter().any(|k| k.name == key.name),
            "{}: two ticket keys have the same name (first 16 bytes)",
            at()
        );
        keys.push(key);
    }
    anyhow::ensure!(
        !keys.is_empty(),
        "{}: no ticket key in the file",
        path.display()
    );
    Ok(keys)
}

pub fn read_key_file(path: &Path) -> anyhow::Result<Vec<TicketKey>> {
    let mut text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read ticket key file {}", path.display()))?;
    let keys = parse_key_file(path, &text);
    text.zeroize();
    keys
}

/// The process's ticket keys: read lock-free by the ticket callback on every worker.
pub struct TicketKeys {
    ring: ArcSwap<KeyRing>,
    source: Mutex<KeySource>,
}

impl TicketKeys {
    pub fn new(source: KeySource, now: Instant) -> anyhow::Result<TicketKeys> {
        let ring = match &source {
            KeySource::File(path) => KeyRing::from_file_keys(read_key_file(path)?),
            KeySource::Memory { rotation, grace } | KeySource::Redis { rotation, grace } => {
                KeyRing {
                    keys: vec![fresh_key(now, *rotation, *grace)],
                    encrypt: 0,
                }
            }
        };
        Ok(TicketKeys {
            ring: ArcSwap::from_pointee(ring),
            source: Mutex::new(source),
        })
    }

    /// The ring for decrypting (no rotation check: that is the encrypting side's business).
    pub fn ring(&self) -> arc_swap::Guard<Arc<KeyRing>> {
        self.ring.load()
    }

    /// The ring for encrypting: rotates first if the in-memory encrypting key is due.
    pub fn ring_for_encrypt(&self, now: Instant) -> Arc<KeyRing> {
        let ring = self.ring.load_full();
        match ring.encrypting().encrypt_until {
            Some(until) if now >= until => self.rotate(now),
            _ => ring,
        }
    }

    /// Replaces the encrypting key (if due): with the next shared key when there is one,
    /// else with a fresh in-memory key; forgets keys past their grace.
    fn rotate(&self, now: Instant) -> Arc<KeyRing> {
        let source = self.source.lock().unwrap_or_else(|e| e.into_inner());
        let ring = self.ring.load_full();
        let (KeySource::Memory { rotation, grace } | KeySource::Redis { rotation, grace }) =
            *source
        else {
            return ring;
        };
        // Another thread may have rotated while this one waited for the lock.
        if ring
            .encrypting()
            .encrypt_until
            .is_none_or(|until| now < until)
        {
            return ring;
        }
        // Shared keys are in epoch order: the next epoch's key, fetched early, follows.
        if let Some(next) = ring.keys.get(ring.encrypt + 1) {
            if next.encrypt_until.is_some_and(|until| now < until) {
                let next = Arc::new(KeyRing {
                    keys: ring.keys.clone(),
                    encrypt: ring.encrypt + 1,
                });
                self.ring.store(next.clone());
                return next;
            }
        }
        if matches!(*source, KeySource::Redis { .. }) {
            tracing::warn!("no shared session ticket key from Redis for this epoch yet: tickets are encrypted with a key of this process only until it arrives");
        }
        let mut keys: Vec<RingKey> = ring
            .keys
            .iter()
            .filter(|k| k.decrypt_until.is_none_or(|until| now < until))
            .cloned()
            .collect();
        keys.push(fresh_key(now, rotation, grace));
        let next = Arc::new(KeyRing {
            encrypt: keys.len() - 1,
            keys,
        });
        self.ring.store(next.clone());
        tracing::debug!(name = %hex(&next.encrypting().key.name), "session ticket key rotated");
        next
    }

    /// Applies a (re)loaded configuration: re-reads the key file, or switches to in-memory
    /// keys (keeping the current ones until their grace ends). Errors leave everything as is.
    pub fn reconfigure(&self, source: KeySource, now: Instant) -> anyhow::Result<()> {
        let mut current = self.source.lock().unwrap_or_else(|e| e.into_inner());
        match &source {
            KeySource::File(path) => {
                let keys = read_key_file(path)?;
                let count = keys.len();
                let mut ring = KeyRing::from_file_keys(keys);
                if let KeySource::Memory { grace, .. } | KeySource::Redis { grace, .. } = *current {
                    // Coming to a key file: the keys used so far decrypt for the grace
                    // period. (Lines removed from a file are dropped at once: that is how
                    // an operator withdraws a key.)
                    let in_use = self.ring.load();
                    let not_in_file = in_use
                        .keys
                        .iter()
                        .filter(|k| ring.keys.iter().all(|f| f.key.name != k.key.name));
                    let mut keys = retired(not_in_file, now, grace);
                    keys.append(&mut ring.keys);
                    ring = KeyRing {
                        encrypt: keys.len() - 1,
                        keys,
                    };
                }
                self.ring.store(Arc::new(ring));
                tracing::info!(file = %path.display(), keys = count, "session ticket keys loaded");
            }
            KeySource::Memory { rotation, grace } | KeySource::Redis { rotation, grace } => {
                // Leaving a key file (for in-memory keys, a key file or Redis): those keys
                // keep decrypting for the grace period, and a key of this process encrypts,
                // rotated as in-memory keys are; with Redis, until the shared keys arrive
                // (`install_shared`). Otherwise new rotation/grace apply from the next
                // rotation on.
                let leaving = match (&source, &*current) {
                    (KeySource::Memory { .. }, KeySource::Memory { .. }) => false,
                    (KeySource::Memory { .. }, _) => true,
                    (_, from) => matches!(from, KeySource::File(_)),
                };
                if leaving {
                    let mut keys = retired(&self.ring.load().keys, now, *grace);
                    keys.push(fresh_key(now, *rotation, *grace));
                    self.ring.store(Arc::new(KeyRing {
                        encrypt: keys.len() - 1,
                        keys,
                    }));
                }
            }
        }
        *current = source;
        Ok(())
    }

    /// Installs the keys fetched from Redis (`shared`, any order) for epochs of
    /// `(rotation, grace)`. Keys of the ring that are not among them (this process's own, a
    /// key file's, shared ones gone from Redis) stop encrypting and keep decrypting for at
    /// most `grace`. `unix_now` is the wall clock at `now`: epochs are wall-clock times,
    /// common to the fleet. A batch fetched for other settings (a reload raced it) is
    /// refused.
    pub fn install_shared(
        &self,
        mut shared: Vec<SharedKey>,
        fetched_for: (Duration, Duration),
        now: Instant,
        unix_now: Duration,
    ) -> anyhow::Result<()> {
        let source = self.source.lock().unwrap_or_else(|e| e.into_inner());
        let KeySource::Redis { rotation, grace } = *source else {
            anyhow::bail!("ticket keys are not taken from Redis now");
        };
        anyhow::ensure!(
            fetched_for == (rotation, grace),
            "keys fetched for another rotation or grace"
        );
        anyhow::ensure!(!shared.is_empty(), "no shared ticket key");
        shared.sort_by_key(|k| k.epoch);
        let r = rotation.as_secs().max(1);
        // The instant of a wall-clock time (in seconds since the epoch).
        let at = |unix: u64| {
            let unix = Duration::from_secs(unix);
            match unix.checked_sub(unix_now) {
                Some(ahead) => now + ahead,
                None => now.checked_sub(unix_now - unix).unwrap_or(now),
            }
        };
        let current = self.ring.load();
        let names: Vec<[u8; 16]> = shared.iter().map(|k| k.key.name).collect();
        let own = current.keys.iter().filter(|k| !names.contains(&k.key.name));
        let mut keys = retired(own, now, grace);
        // `retired` keeps only keys that still decrypt; so must the shared ones.
        let shared_from = keys.len();
        keys.extend(
            shared
                .into_iter()
                .map(|k| RingKey {
                    key: k.key.clone(),
                    encrypt_until: Some(at((k.epoch + 1) * r)),
                    decrypt_until: Some(at((k.epoch + 1) * r) + grace),
                })
                .filter(|k| k.decrypt_until.is_some_and(|until| now < until)),
        );
        // The key of the current epoch encrypts; failing that, the newest key that still
        // may (an epoch missing in Redis), else this process's own (a fresh one comes with
        // the next ticket).
        let encrypt = (shared_from..keys.len())
            .find(|&i| {
                let until = keys[i].encrypt_until.expect("shared keys have an end");
                now < until && now + rotation >= until
            })
            .or_else(|| {
                keys.iter()
                    .rposition(|k| k.encrypt_until.is_none_or(|u| now < u))
            })
            .unwrap_or(keys.len().saturating_sub(1));
        anyhow::ensure!(!keys.is_empty(), "every shared ticket key has expired");
        self.ring.store(Arc::new(KeyRing { keys, encrypt }));
        Ok(())
    }

    pub fn source(&self) -> KeySource {
        self.source
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// `keys`, retired: they encrypt no more, and decrypt for at most `grace`.
fn retired<'a>(
    keys: impl IntoIterator<Item = &'a RingKey>,
    now: Instant,
    grace: Duration,
) -> Vec<RingKey> {
    keys.into_iter()
        .map(|k| RingKey {
            key: k.key.clone(),
            encrypt_until: Some(k.encrypt_until.map_or(now, |until| until.min(now))),
            decrypt_until: Some(
                k.decrypt_until
                    .map_or(now + grace, |until| until.min(now + grace)),
            ),
        })
        .filter(|k| k.decrypt_until.is_some_and(|until| now < until))
        .collect()
}

fn fresh_key(now: Instant, rotation: Duration, grace: Duration) -> RingKey {
    RingKey {
        key: TicketKey::generate(),
        encrypt_until: Some(now + rotation),
        decrypt_until: Some(now + rotation + grace),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
