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

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::ticket_key::{hex, read_key_file, TicketKey};

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
mod tests;
