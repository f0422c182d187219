//! The Redis session store: serialized TLS 1.2 sessions by ID, 0-RTT claims and, with
//! `redis_ticket_keys`, the ticket keys, shared by a fleet.
//!
//! Every Redis operation runs on a dedicated thread ("session-redis") with its own tokio
//! runtime, never on a worker: a worker hands the operation over (`Handle::spawn`, which does
//! not block) and, for lookups, waits on the task's `JoinHandle` inside the handshake future,
//! so a slow or dead Redis delays only the handshakes that asked it, and at most by
//! `redis_timeout`, after which they go on as full handshakes.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use redis::aio::ConnectionManager;
use tokio::runtime::Handle;
use tokio::task::AbortHandle;
use zeroize::Zeroizing;

use super::redis_client::runtime;
pub use super::redis_client::{client, connect, redacted};
use super::shared_store::{PendingClaim, PendingGet, SharedSessionStore};
use super::ticket_key::{hex, TicketKey, KEY_FILE_ENTRY_LEN};
use super::tickets::{shared_epochs, unix_now, SharedKey};
use crate::config::redis_uses_tls;
use crate::seal::{Entry, FleetKey};

/// Operations in flight at once; beyond this, lookups miss and stores are dropped.
const MAX_IN_FLIGHT: usize = 4096;

/// What a lookup or store came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisReply<T> {
    Done(T),
    Timeout,
    Error,
    /// Too many operations in flight: not even sent.
    Overload,
}

impl<T> RedisReply<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> RedisReply<U> {
        match self {
            RedisReply::Done(value) => RedisReply::Done(f(value)),
            RedisReply::Timeout => RedisReply::Timeout,
            RedisReply::Error => RedisReply::Error,
            RedisReply::Overload => RedisReply::Overload,
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            RedisReply::Done(_) => "ok",
            RedisReply::Timeout => "timeout",
            RedisReply::Error => "error",
            RedisReply::Overload => "overload",
        }
    }
}

/// SET `key` NX with a lifetime of `ttl`: a 0-RTT claim.
fn claim_command(key: &str, ttl: Duration) -> redis::Cmd {
    let millis = ttl.as_millis().clamp(1, u64::MAX as u128) as u64;
    let mut command = redis::cmd("SET");
    command.arg(key).arg(1).arg("NX").arg("PX").arg(millis);
    command
}

/// What a 0-RTT claim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The first claim of this key across every process sharing this Redis.
    First,
    /// Claimed before.
    Taken,
    /// Redis lost its claims less than a window ago (flushed, or restarted without
    /// persistence): a ClientHello accepted before may have been forgotten.
    StateLost,
}

/// Claims `KEYS[1]` (SET NX for `ARGV[1]` ms) and reports, on Redis's own clock, how long
/// ago the claims began to be kept: `KEYS[2]` holds that time, written when missing.
/// Redis that lost its claims (FLUSHALL, a restart without persistence) lost that marker
/// with them, so a process that finds it younger than a window knows that a ClientHello
/// accepted before may be claimed nowhere any more. Replies `{claimed, age in ms,
/// whether the marker was written now}`.
const CLAIM: &str = r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = redis.call("GET", KEYS[2])
local written = 0
if not since then
  redis.call("SET", KEYS[2], now)
  since = now
  written = 1
end
local claimed = redis.call("SET", KEYS[1], 1, "NX", "PX", ARGV[1])
return {claimed and 1 or 0, now - tonumber(since), written}
"#;

/// The key holding when this Redis began keeping 0-RTT claims (see [`CLAIM`]).
const CLAIMS_SINCE: &str = "0rtt_claims_since";

pub struct RedisStore {
    client: redis::Client,
    prefix: String,
    timeout: Duration,
    handle: Handle,
    connection: ConnectionManager,
    in_flight: Arc<AtomicUsize>,
    health: Arc<Health>,
    /// Seals what is stored and opens what is read; replaced by a reload that re-read
    /// the key file, also in the ticket key task already running.
    key: Arc<ArcSwap<FleetKey>>,
}

/// Whether the last request failed: the log says when Redis starts failing and when it
/// answers again, once each, not once per request.
#[derive(Default)]
struct Health {
    failing: AtomicBool,
}

impl Health {
    /// The outcome of `request`, given at most `timeout`.
    async fn answer<T>(
        &self,
        op: &str,
        timeout: Duration,
        request: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> RedisReply<T> {
        let outcome = match tokio::time::timeout(timeout, request).await {
            Ok(Ok(value)) => RedisReply::Done(value),
            Ok(Err(err)) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(op, error = %err, "Redis requests fail (sessions and 0-RTT claims go on without Redis until it answers)");
                }
                return RedisReply::Error;
            }
            Err(_) => RedisReply::Timeout,
        };
        if matches!(outcome, RedisReply::Done(_)) && self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!(op, "Redis answers again");
        }
        outcome
    }
}

struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RedisStore {
    /// Connects lazily: a Redis that is down at start is not an error, only misses. With
    /// a "rediss://" URL, `ca` (PEM) holds the roots its certificate must chain to (else
    /// the system's roots).
    pub fn new(
        url: &str,
        ca: Option<&Path>,
        prefix: &str,
        timeout: Duration,
        key: Arc<FleetKey>,
    ) -> anyhow::Result<RedisStore> {
        let client = client(url, ca)?;
        let handle = runtime()?;
        let connection = connect(&handle, &client, timeout)
            .with_context(|| format!("cannot set up Redis at `{}`", redacted(url)))?;
        Ok(RedisStore {
            client,
            prefix: prefix.to_string(),
            timeout,
            handle,
            connection,
            in_flight: Arc::new(AtomicUsize::new(0)),
            health: Arc::default(),
            key: Arc::new(ArcSwap::new(key)),
        })
    }

    /// Seals and opens with `key` from now on.
    pub fn set_key(&self, key: Arc<FleetKey>) {
        self.key.store(key);
    }

    /// Whether the connection is TLS (rediss://).
    pub fn uses_tls(&self) -> bool {
        redis_uses_tls(&self.client)
    }

    pub fn key(&self, id: &[u8]) -> String {
        format!("{}{}", self.prefix, hex(id))
    }

    fn admit(&self) -> Option<InFlight> {
        if self.in_flight.fetch_add(1, Ordering::Relaxed) >= MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(InFlight(self.in_flight.clone()))
    }

    /// Keeps the fleet's ticket keys until aborted: now and then (a quarter of `rotation`,
    /// at most a minute; sooner after a failure) creates the keys of the current and next
    /// epochs unless a process already has (SET NX, with random bytes), reads the keys of
    /// every epoch that may still decrypt, and reports them.
    pub fn sync_ticket_keys(
        &self,
        rotation: Duration,
        grace: Duration,
        mut report: impl FnMut(RedisReply<Vec<SharedKey>>) + Send + 'static,
    ) -> AbortHandle {
        // Not `ticket_key:`, where versions before sealing kept plain keys: those would not
        // open, and SET NX would not replace them until they expire.
        let prefix = format!(
            "{}sealed_ticket_key:{}:",
            self.prefix,
            rotation.as_secs().max(1)
        );
        let fleet = self.key.clone();
        // Its own connection: handshakes' requests must fail after `redis_timeout`, this
        // one (off the handshake path, reading up to a thousand keys) may take longer.
        let timeout = self.timeout.max(Duration::from_secs(1));
        let mut connection = match connect(&self.handle, &self.client, timeout) {
            Ok(connection) => connection,
            Err(err) => {
                tracing::warn!(error = %err, "cannot set up the Redis connection for ticket keys");
                report(RedisReply::Error);
                return self.handle.spawn(async {}).abort_handle();
            }
        };
        let refresh = (rotation / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let task = self.handle.spawn(async move {
            // Whether Redis refused the last sync's writes: said once when it starts, once
            // when it stops, not at every sync.
            let mut writes_refused = false;
            loop {
                let wall_clock = unix_now();
                let epochs = shared_epochs(wall_clock, rotation, grace);
                let pipe = ticket_key_pipeline(&prefix, &fleet.load(), &epochs, rotation, grace, wall_clock);
                type Replies = (
                    redis::RedisResult<redis::Value>,
                    redis::RedisResult<redis::Value>,
                    redis::RedisResult<Vec<Option<Vec<u8>>>>,
                );
                let request = pipe.query_async::<Replies>(&mut connection);
                let replies = tokio::time::timeout(timeout, request).await;
                let read = replies.map(|replies| {
                    let (current, following, read) = replies?;
                    // A server error names neither the keys nor the URL, only the reason
                    // (e.g. NOREPLICAS, OOM, READONLY).
                    match current.and(following) {
                        Err(err) if !writes_refused => {
                            writes_refused = true;
                            tracing::warn!(error = %err, "Redis refuses to store new shared session ticket keys: the keys it holds are still read, but past the last of them each process encrypts tickets with keys of its own");
                        }
                        Ok(_) if writes_refused => {
                            writes_refused = false;
                            tracing::info!("Redis stores shared session ticket keys again");
                        }
                        _ => {}
                    }
                    read
                });
                let outcome = match read {
                    Ok(Ok(values)) => {
                        RedisReply::Done(open_ticket_keys(&prefix, &fleet.load(), epochs, &values))
                    }
                    Ok(Err(err)) => {
                        tracing::debug!(error = %err, "redis ticket key sync failed");
                        RedisReply::Error
                    }
                    Err(_) => RedisReply::Timeout,
                };
                let pause = match outcome {
                    RedisReply::Done(_) => refresh,
                    _ => refresh.min(Duration::from_secs(5)),
                };
                report(outcome);
                tokio::time::sleep(pause).await;
            }
        });
        task.abort_handle()
    }
}

/// Redis as the fleet's shared store: every operation runs on the Redis thread, within
/// `redis_timeout`; claims are SET NX, which Redis runs one at a time, so exactly one
/// claim of a key succeeds.
impl SharedSessionStore for RedisStore {
    /// Looks a session up; the answer comes within `redis_timeout`. An entry that does
    /// not open with the fleet key is a miss (and counted).
    fn get(&self, id: &[u8]) -> Result<PendingGet, RedisReply<()>> {
        let guard = self.admit().ok_or(RedisReply::Overload)?;
        let key = self.key(id);
        let mut connection = self.connection.clone();
        let (timeout, health, fleet) = (self.timeout, self.health.clone(), self.key.clone());
        let task = self.handle.spawn(async move {
            let _guard = guard;
            let mut command = redis::cmd("GET");
            command.arg(&key);
            let request = command.query_async::<Option<Vec<u8>>>(&mut connection);
            let answer = health.answer("get", timeout, request).await;
            answer.map(|found| {
                let sealed = found?;
                let mut der = fleet.load().open(Entry::Session, key.as_bytes(), &sealed)?;
                // Moved out, not copied: the caller keeps it in a buffer wiped on drop.
                Some(std::mem::take(&mut *der))
            })
        });
        Ok(Box::pin(
            async move { task.await.unwrap_or(RedisReply::Error) },
        ))
    }

    /// Claims `key` for `ttl` (the replay window) unless it exists (SET NX): the first
    /// claim across every process sharing this Redis, or one made before; or, whatever
    /// the claim, [`Claim::StateLost`] while Redis has kept claims for less than `ttl`.
    fn claim(&self, key: String, ttl: Duration) -> Result<PendingClaim, RedisReply<()>> {
        let guard = self.admit().ok_or(RedisReply::Overload)?;
        let key = format!("{}{key}", self.prefix);
        let since = format!("{}{CLAIMS_SINCE}", self.prefix);
        let mut connection = self.connection.clone();
        let (timeout, health) = (self.timeout, self.health.clone());
        let millis = ttl.as_millis().clamp(1, u64::MAX as u128) as u64;
        let task = self.handle.spawn(async move {
            let _guard = guard;
            let mut command = redis::cmd("EVAL");
            command.arg(CLAIM).arg(2).arg(&key).arg(&since).arg(millis);
            let request = command.query_async::<(i64, i64, i64)>(&mut connection);
            let answer = health.answer("claim", timeout, request).await;
            answer.map(|(claimed, age, written)| {
                if written == 1 {
                    tracing::warn!(window = ?ttl, "Redis kept no 0-RTT claims (a new Redis, or one flushed or restarted without persistence): 0-RTT is refused across the fleet for one replay window, since a ClientHello accepted before may be claimed nowhere any more");
                }
                match (u64::try_from(age).map_or(true, |age| age < millis), claimed) {
                    (true, _) => Claim::StateLost,
                    (false, 1) => Claim::First,
                    (false, _) => Claim::Taken,
                }
            })
        });
        Ok(Box::pin(
            async move { task.await.unwrap_or(RedisReply::Error) },
        ))
    }

    /// Claims `key` in the background, for `ttl` from now, retrying until Redis has
    /// answered or `ttl` has passed: for a ClientHello refused 0-RTT without its claim
    /// having been made, so that no process sharing this Redis accepts a copy. `done` gets
    /// the outcome of each attempt (`Overload` once, if too many operations are in flight
    /// to start).
    fn claim_in_background(
        &self,
        key: String,
        ttl: Duration,
        mut done: Box<dyn FnMut(RedisReply<()>) + Send>,
    ) {
        let Some(guard) = self.admit() else {
            done(RedisReply::Overload);
            return;
        };
        let key = format!("{}{key}", self.prefix);
        let mut connection = self.connection.clone();
        let (timeout, health) = (self.timeout, self.health.clone());
        let until = tokio::time::Instant::now() + ttl;
        self.handle.spawn(async move {
            let _guard = guard;
            let mut pause = Duration::from_millis(50);
            loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return;
                }
                let command = claim_command(&key, left);
                let request = command.query_async::<Option<String>>(&mut connection);
                let answer = health.answer("claim", timeout, request).await.map(|_| ());
                let answered = matches!(answer, RedisReply::Done(()));
                done(answer);
                if answered {
                    return;
                }
                tokio::time::sleep(pause.min(left)).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        });
    }

    /// Stores a session for `ttl` in the background; `done` gets the outcome.
    fn put(
        &self,
        id: &[u8],
        der: super::cache::SessionDer,
        ttl: Duration,
        done: Box<dyn FnOnce(RedisReply<()>) + Send>,
    ) {
        let Some(guard) = self.admit() else {
            done(RedisReply::Overload);
            return;
        };
        let key = self.key(id);
        let mut connection = self.connection.clone();
        let (timeout, health, fleet) = (self.timeout, self.health.clone(), self.key.clone());
        let millis = ttl.as_millis().clamp(1, u64::MAX as u128) as u64;
        self.handle.spawn(async move {
            let _guard = guard;
            // Sealed here, on the Redis thread, not on the worker that made the session.
            let Ok(sealed) = fleet.load().seal(key.as_bytes(), &der[..]) else {
                done(RedisReply::Error);
                return;
            };
            drop(der);
            let mut command = redis::cmd("SET");
            command.arg(&key).arg(sealed).arg("PX").arg(millis);
            let request = command.query_async::<()>(&mut connection);
            done(health.answer("set", timeout, request).await);
        });
    }
}

/// One sync's requests: SET NX a fresh sealed key for the current and next epochs (each
/// living until it no longer decrypts, plus a rotation of margin), then MGET every epoch
/// in `epochs`.
fn ticket_key_pipeline(
    prefix: &str,
    fleet: &FleetKey,
    epochs: &std::ops::RangeInclusive<u64>,
    rotation: Duration,
    grace: Duration,
    wall_clock: Duration,
) -> redis::Pipeline {
    let (next, r) = (*epochs.end(), rotation.as_secs().max(1));
    let mut pipe = redis::pipe();
    // A refused write (maxmemory with noeviction, a read-only replica,
    // min-replicas-to-write not met) must not cost the read: with the keys Redis already
    // holds, the fleet still resumes each other's tickets. Each command's reply comes back
    // on its own instead of failing the pipeline.
    pipe.ignore_errors();
    for epoch in [next - 1, next] {
        let expires = Duration::from_secs((epoch + 2) * r) + grace;
        let ttl = expires.saturating_sub(wall_clock).as_millis().max(1) as u64;
        let mut fresh = Zeroizing::new([0u8; KEY_FILE_ENTRY_LEN]);
        boring::rand::rand_bytes(&mut fresh[..]).expect("the RNG works");
        let name = format!("{prefix}{epoch}");
        let sealed = fleet
            .seal(name.as_bytes(), &fresh[..])
            .expect("sealing with the fleet key works");
        let mut set = redis::cmd("SET");
        set.arg(name).arg(sealed).arg("NX").arg("PX").arg(ttl);
        pipe.add_command(set);
    }
    let names: Vec<String> = epochs.clone().map(|e| format!("{prefix}{e}")).collect();
    pipe.cmd("MGET").arg(names);
    pipe
}

/// The ticket keys Redis holds for `epochs` (`values`, in order) that open with the fleet
/// key. One that does not open is counted and left: its epoch then has no shared key, and
/// each process uses its own.
fn open_ticket_keys(
    prefix: &str,
    fleet: &FleetKey,
    epochs: std::ops::RangeInclusive<u64>,
    values: &[Option<Vec<u8>>],
) -> Vec<SharedKey> {
    let mut keys = Vec::new();
    for (epoch, value) in epochs.zip(values.iter()) {
        let Some(sealed) = value else { continue };
        let name = format!("{prefix}{epoch}");
        let Some(opened) = fleet.open(Entry::TicketKey, name.as_bytes(), sealed) else {
            continue;
        };
        match <&[u8; KEY_FILE_ENTRY_LEN]>::try_from(opened.as_slice()) {
            Ok(bytes) => keys.push(SharedKey {
                epoch,
                key: TicketKey::from_bytes(bytes),
            }),
            Err(_) => {
                tracing::warn!(key = %name, "Redis holds a ticket key that is not 80 bytes: ignored")
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests;
