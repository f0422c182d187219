//! The fleet key, and the sealing of what the processes of a fleet share through Redis.
//!
//! Redis is storage that others may read and write (whoever reaches its port, its
//! replicas and backups, an administrator of another application sharing it). Whatever
//! tlsterm puts there that could grant access — TLS sessions with their master secrets,
//! session ticket keys, ACME challenge answers, ACME certificates with their keys — is
//! sealed with the fleet key (`[session] fleet_key_file`): AES-256-GCM, with the entry's
//! name as associated data, so that a sealed entry cannot be moved to another name (a
//! session to another session ID, a ticket key to another epoch, an answer to another
//! name). An entry that does not open is ignored, never used, and counted in
//! `tlsterm_fleet_entries_refused_total`.
//!
//! A sealed entry is `1 ‖ salt (16) ‖ nonce (12) ‖ tag (16) ‖ ciphertext`. Each entry is
//! encrypted under its own key, HMAC-SHA256(fleet key, label ‖ salt): a fleet seals one
//! entry per TLS 1.2 full handshake, far more than the 2^32 messages one AES-GCM key may
//! seal with random nonces.
//!
//! The key file holds one key per line (64 hex digits, `openssl rand -hex 32`); the first
//! seals, every one opens, so a fleet rotates by adding the new key as a second line
//! everywhere, then moving it first, then removing the old one (each step a reload).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;

use anyhow::Context as _;
use boring::symm::{decrypt_aead, encrypt_aead, Cipher};
use prometheus::{register_int_counter_vec_with_registry, IntCounterVec};
use zeroize::Zeroizing;

const VERSION: u8 = 1;
const SALT: usize = 16;
const NONCE: usize = 12;
const TAG: usize = 16;
const KEY: usize = 32;
const HEADER: usize = 1 + SALT + NONCE + TAG;
/// Enough for a rotation (the next key, the current one, the one before) and then some.
const MAX_KEYS: usize = 8;
/// Binds the derived keys to this use of the fleet key.
const LABEL: &[u8] = b"tlsterm fleet seal v1\0";

/// The kinds of entries sealed, as the refusal counter labels them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Session,
    TicketKey,
    AcmeCertificate,
    AcmeChallenge,
    AcmeHttp01,
}

impl Entry {
    fn label(self) -> &'static str {
        match self {
            Entry::Session => "session",
            Entry::TicketKey => "ticket_key",
            Entry::AcmeCertificate => "acme_certificate",
            Entry::AcmeChallenge => "acme_challenge",
            Entry::AcmeHttp01 => "acme_http01",
        }
    }

    const ALL: [Entry; 5] = [
        Entry::Session,
        Entry::TicketKey,
        Entry::AcmeCertificate,
        Entry::AcmeChallenge,
        Entry::AcmeHttp01,
    ];
}

static REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let counter = register_int_counter_vec_with_registry!(
        "fleet_entries_refused_total",
        "Entries read from Redis that did not open with the fleet key (altered, forged, moved to another name, or sealed under a key this process does not have): ignored",
        &["entry"],
        crate::metrics::registry()
    )
    .expect("metric registers");
    // Every kind at zero from the start: an alert on an increase sees the first one.
    for entry in Entry::ALL {
        counter.with_label_values(&[entry.label()]);
    }
    counter
});

/// Whether a refusal was logged at warn yet: the first is, the next ones only counted
/// (whoever writes to Redis could otherwise fill the log).
static WARNED: AtomicBool = AtomicBool::new(false);

/// The fleet's keys: the first seals, all open.
pub struct FleetKey {
    keys: Vec<Zeroizing<[u8; KEY]>>,
}

impl std::fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FleetKey({} keys)", self.keys.len())
    }
}

impl FleetKey {
    /// Reads a key file. Refused when its mode lets group or others read or write it: the
    /// key opens every session the fleet shares.
    pub fn load(path: &Path) -> anyhow::Result<FleetKey> {
        let metadata =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mode = metadata.permissions().mode() & 0o7777;
        anyhow::ensure!(
            mode & 0o077 == 0,
            "{} has mode {mode:04o}: group and others must have no access to the fleet key (`chmod 600`)",
            path.display()
        );
        let text = Zeroizing::new(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        );
        FleetKey::parse(&text).with_context(|| path.display().to_string())
    }

    /// Keys from the text of a key file (one per line; blank lines and `#` comments
    /// allowed). Errors name the line, never its content.
    pub fn parse(text: &str) -> anyhow::Result<FleetKey> {
        let mut keys: Vec<Zeroizing<[u8; KEY]>> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            anyhow::ensure!(
                line.len() == 2 * KEY && line.bytes().all(|b| b.is_ascii_hexdigit()),
                "line {}: a key is 32 bytes as 64 hex digits (`openssl rand -hex 32`)",
                index + 1
            );
            let mut key = Zeroizing::new([0u8; KEY]);
            for (i, byte) in key.iter_mut().enumerate() {
                *byte = u8::from_str_radix(&line[2 * i..2 * i + 2], 16)?;
            }
            anyhow::ensure!(
                !keys.iter().any(|k| **k == *key),
                "line {}: the same key as an earlier line",
                index + 1
            );
            keys.push(key);
        }
        anyhow::ensure!(
            !keys.is_empty(),
            "no key (one line of 64 hex digits: `openssl rand -hex 32`)"
        );
        anyhow::ensure!(keys.len() <= MAX_KEYS, "at most {MAX_KEYS} keys");
        Ok(FleetKey { keys })
    }

    /// A fleet key of these keys (the first seals).
    pub fn from_keys(keys: Vec<Zeroizing<[u8; KEY]>>) -> FleetKey {
        assert!(!keys.is_empty(), "a fleet key has at least one key");
        FleetKey { keys }
    }

    /// Whether both hold the same keys in the same order.
    pub fn same_keys(&self, other: &FleetKey) -> bool {
        self.keys.len() == other.keys.len()
            && self.keys.iter().zip(&other.keys).all(|(a, b)| **a == **b)
    }

    /// The key one entry is encrypted under.
    fn entry_key(key: &[u8; KEY], salt: &[u8]) -> anyhow::Result<Zeroizing<[u8; KEY]>> {
        let input = [LABEL, salt].concat();
        Ok(Zeroizing::new(boring::hash::hmac_sha256(key, &input)?))
    }

    /// `plain` sealed for the entry named `name`.
    pub fn seal(&self, name: &[u8], plain: &[u8]) -> anyhow::Result<Vec<u8>> {
        let mut salt = [0u8; SALT];
        boring::rand::rand_bytes(&mut salt)?;
        let mut nonce = [0u8; NONCE];
        boring::rand::rand_bytes(&mut nonce)?;
        let key = FleetKey::entry_key(&self.keys[0], &salt)?;
        let mut tag = [0u8; TAG];
        let sealed = encrypt_aead(
            Cipher::aes_256_gcm(),
            key.as_slice(),
            Some(&nonce),
            name,
            plain,
            &mut tag,
        )?;
        Ok([&[VERSION][..], &salt, &nonce, &tag, &sealed].concat())
    }

    /// What `sealed` holds, if it was sealed for the entry named `name` with one of the
    /// fleet's keys; otherwise `None`, counted as a refused `entry`.
    pub fn open(&self, entry: Entry, name: &[u8], sealed: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        let opened = self.try_open(name, sealed);
        if opened.is_none() {
            REFUSED.with_label_values(&[entry.label()]).inc();
            let name = String::from_utf8_lossy(name);
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(entry = entry.label(), %name, "an entry read from Redis does not open with the fleet key: ignored (altered, forged, or sealed under another fleet_key_file; further ones are counted in tlsterm_fleet_entries_refused_total)");
            } else {
                tracing::debug!(entry = entry.label(), %name, "an entry read from Redis does not open with the fleet key: ignored");
            }
        }
        opened
    }

    fn try_open(&self, name: &[u8], sealed: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        if sealed.len() < HEADER || sealed[0] != VERSION {
            return None;
        }
        let (salt, rest) = sealed[1..].split_at(SALT);
        let (nonce, rest) = rest.split_at(NONCE);
        let (tag, data) = rest.split_at(TAG);
        self.keys.iter().find_map(|key| {
            let key = FleetKey::entry_key(key, salt).ok()?;
            decrypt_aead(
                Cipher::aes_256_gcm(),
                key.as_slice(),
                Some(nonce),
                name,
                data,
                tag,
            )
            .ok()
            .map(Zeroizing::new)
        })
    }
}

/// The refusals counted for `entry` so far (for tests).
pub fn refused(entry: Entry) -> u64 {
    REFUSED.with_label_values(&[entry.label()]).get()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> Zeroizing<[u8; KEY]> {
        Zeroizing::new([byte; KEY])
    }

    #[test]
    fn an_entry_opens_only_with_a_fleet_key_and_under_its_name() {
        let fleet = FleetKey::from_keys(vec![key(1)]);
        let sealed = fleet.seal(b"tlsterm:session:ab", b"MASTER SECRET").unwrap();
        assert!(
            !sealed.windows(6).any(|w| w == b"MASTER"),
            "not in the clear"
        );
        let opened = fleet.open(Entry::Session, b"tlsterm:session:ab", &sealed);
        assert_eq!(opened.unwrap().as_slice(), b"MASTER SECRET");

        let before = refused(Entry::Session);
        // Another name (a session moved to another ID), another key, any altered byte.
        assert!(fleet
            .open(Entry::Session, b"tlsterm:session:cd", &sealed)
            .is_none());
        let other = FleetKey::from_keys(vec![key(2)]);
        assert!(other
            .open(Entry::Session, b"tlsterm:session:ab", &sealed)
            .is_none());
        for at in [0, 1, 20, HEADER - 1, sealed.len() - 1] {
            let mut altered = sealed.clone();
            altered[at] ^= 1;
            assert!(
                fleet
                    .open(Entry::Session, b"tlsterm:session:ab", &altered)
                    .is_none(),
                "byte {at} altered"
            );
        }
        assert!(fleet
            .open(Entry::Session, b"tlsterm:session:ab", &sealed[..HEADER])
            .is_none());
        assert!(refused(Entry::Session) >= before + 8);
    }

    /// Rotation: a key file with the new key second still seals with the old one and opens
    /// both; with the new key first it seals with the new one.
    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let old = FleetKey::from_keys(vec![key(1)]);
        let adding = FleetKey::from_keys(vec![key(1), key(2)]);
        let switched = FleetKey::from_keys(vec![key(2), key(1)]);
        let new = FleetKey::from_keys(vec![key(2)]);
        let by_old = old.seal(b"n", b"x").unwrap();
        let by_adding = adding.seal(b"n", b"x").unwrap();
        let by_switched = switched.seal(b"n", b"x").unwrap();
        for fleet in [&old, &adding, &switched] {
            assert!(fleet.open(Entry::TicketKey, b"n", &by_old).is_some());
            assert!(fleet.open(Entry::TicketKey, b"n", &by_adding).is_some());
        }
        for fleet in [&adding, &switched, &new] {
            assert!(fleet.open(Entry::TicketKey, b"n", &by_switched).is_some());
        }
        assert!(old.open(Entry::TicketKey, b"n", &by_switched).is_none());
        assert!(new.open(Entry::TicketKey, b"n", &by_old).is_none());
    }

    #[test]
    fn key_files_are_checked_and_name_the_line() {
        let a = "ab".repeat(32);
        let b = "cd".repeat(32);
        let parsed = FleetKey::parse(&format!("# fleet\n{a}\n\n  {b}  \n")).unwrap();
        assert_eq!(parsed.keys.len(), 2);
        assert_eq!(parsed.keys[0][0], 0xab);
        for (text, message) in [
            ("", "no key"),
            ("# only a comment\n", "no key"),
            (&format!("{a}\nnot hex\n") as &str, "line 2"),
            (&format!("{a}\n{}\n", &a[..62]), "line 2: a key is 32 bytes"),
            (&format!("{a}\n{a}\n"), "line 2: the same key"),
        ] {
            let err = FleetKey::parse(text).unwrap_err().to_string();
            assert!(err.contains(message), "{text:?}: {err}");
            assert!(!err.contains(&a), "the key is not in the message: {err}");
        }
    }

    #[test]
    fn a_key_file_open_to_group_or_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.key");
        std::fs::write(&path, "ab".repeat(32)).unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = FleetKey::load(&path).unwrap_err().to_string();
            assert!(err.contains(&format!("mode {mode:04o}")), "{err}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            FleetKey::load(&path).unwrap();
        }
    }
}
