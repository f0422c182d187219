//! OCSP responses fetched by tlsterm itself (`ocsp_fetch = true` on a certificate).
//!
//! A background thread asks each certificate's responder (from its Authority Information
//! Access), up to 8 fetches at a time, and refreshes the answer halfway through its
//! validity, retrying failures with back-off. Handshakes never wait for it: the select-certificate callback puts whatever
//! response is current on the connection (`Slot::staple`), never on the certificate's
//! context, which other handshakes read at the same time.
//!
//! Slots are keyed by responder URL and request (issuer and serial) in a process-wide
//! registry that holds them weakly: a reload that keeps a certificate finds its slot, with
//! the fetched response and the schedule; a slot that no context uses any more is dropped.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, Once, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use arc_swap::{ArcSwap, ArcSwapOption};
use boring::ssl::SslRef;
use boring::x509::{X509Ref, X509};

use super::ocsp::{self, OcspProblem, Validity};
use crate::config::OcspConfig;

/// The most a responder may send; real responses are a few KiB.
const MAX_RESPONSE: u64 = 64 * 1024;

/// Fetches in flight at once: thousands of certificates due together (at start) are not
/// fetched one after another, and one hanging responder holds up at most one of them.
const PARALLEL_FETCHES: usize = 8;

/// Locks even a mutex poisoned by a panic elsewhere: what it guards (a schedule, the
/// registry) stays consistent at every step, and the fetcher must go on.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The response being stapled.
struct Current {
    der: Vec<u8>,
    this_update: SystemTime,
    /// nextUpdate; for a response without one, `max_refresh` after it was taken.
    expires: SystemTime,
}

/// When the next fetch is due, and how many attempts in a row failed.
struct Schedule {
    due: Instant,
    failures: u32,
}

/// One certificate's fetched OCSP response.
pub struct Slot {
    leaf: X509,
    /// Checks the responder's signature.
    issuer: X509,
    url: String,
    request: Vec<u8>,
    names: Vec<String>,
    current: ArcSwapOption<Current>,
    /// Also serialises changes to `current` (fetches, expiry, a reload's file response).
    schedule: Mutex<Schedule>,
}

impl Slot {
    /// Staples the current response, if still valid, on a connection. Called after the
    /// connection switched to this certificate's context, since the switch replaces the
    /// connection's certificate settings (BoringSSL copies them from the context).
    pub fn staple(&self, ssl: &mut SslRef) {
        if let Some(current) = &*self.current.load() {
            ocsp::staple_until(ssl, &current.der, Some(current.expires));
        }
    }

    /// Makes `response` current if it may be stapled and is not older than the current
    /// one; a revoked or unknown status removes the current one. Logs and counts what
    /// happened. The caller holds `schedule`.
    fn take(
        &self,
        response: Vec<u8>,
        max_refresh: Duration,
        source: &str,
    ) -> Result<Validity, OcspProblem> {
        let now = SystemTime::now();
        let checked = ocsp::validity(&response, &self.leaf, Some(&self.issuer), now);
        match checked {
            Ok(validity) => {
                let previous = self.current.load_full();
                if previous
                    .as_ref()
                    .is_some_and(|p| p.this_update > validity.this_update)
                {
                    tracing::debug!(certificate = ?self.names, source, "OCSP response older than the stapled one: ignored");
                    return checked;
                }
                self.current.store(Some(Arc::new(Current {
                    der: response,
                    this_update: validity.this_update,
                    expires: validity.next_update.unwrap_or(now + max_refresh),
                })));
                if previous.is_none() {
                    tracing::info!(certificate = ?self.names, source, "OCSP response stapled");
                }
                super::metrics::record_ocsp("stapled");
            }
            Err(problem) => {
                // The responder's latest word is not "good": what it said before no longer holds.
                if problem == OcspProblem::NotGood {
                    self.current.store(None);
                }
                tracing::warn!(certificate = ?self.names, source, problem = problem.label(), "OCSP response not stapled");
                super::metrics::record_ocsp(problem.label());
            }
        }
        checked
    }

    /// Asks the responder and schedules the next fetch.
    fn refresh(&self, settings: &OcspConfig) {
        let fetched = fetch(&self.url, &self.request, settings.timeout);
        super::metrics::record_ocsp_fetch(if fetched.is_ok() { "ok" } else { "failed" });
        let mut schedule = lock(&self.schedule);
        let taken = match fetched {
            Ok(response) => self
                .take(response, settings.max_refresh, &self.url)
                .map_err(|_| ()),
            Err(err) => {
                tracing::warn!(certificate = ?self.names, url = %self.url, error = format!("{err:#}"), "OCSP fetch failed");
                Err(())
            }
        };
        let delay = match taken {
            Ok(validity) => {
                schedule.failures = 0;
                refresh_delay(validity, SystemTime::now(), settings)
            }
            Err(()) => {
                schedule.failures = schedule.failures.saturating_add(1);
                retry_delay(schedule.failures, settings)
            }
        };
        schedule.due = Instant::now() + delay;
    }

    /// Stops stapling a response whose nextUpdate passed before a refresh succeeded.
    fn expire_if_stale(&self) {
        let _schedule = lock(&self.schedule);
        let current = self.current.load();
        if current
            .as_ref()
            .is_some_and(|c| c.expires <= SystemTime::now())
        {
            self.current.store(None);
            tracing::warn!(certificate = ?self.names, url = %self.url, "OCSP response expired before a refresh succeeded: no longer stapled");
            super::metrics::record_ocsp(OcspProblem::Stale.label());
        }
    }

    /// The next time the fetcher has something to do for this slot.
    fn next_event(&self) -> Instant {
        let due = lock(&self.schedule).due;
        let expiry = self.current.load().as_ref().map(|c| {
            let left = c.expires.duration_since(SystemTime::now());
            Instant::now() + left.unwrap_or_default()
        });
        expiry.map_or(due, |expiry| due.min(expiry))
    }
}

/// Until the next refresh of a good response: halfway through its validity, within
/// `min_refresh..=max_refresh` from now.
fn refresh_delay(validity: Validity, now: SystemTime, settings: &OcspConfig) -> Duration {
    let expires = validity.next_update.unwrap_or(now + settings.max_refresh);
    let span = expires
        .duration_since(validity.this_update)
        .unwrap_or_default();
    let halfway = validity.this_update + span / 2;
    halfway
        .duration_since(now)
        .unwrap_or_default()
        .clamp(settings.min_refresh, settings.max_refresh)
}

/// After `failures` failed attempts in a row: `retry`, doubling, at most `min_refresh`.
fn retry_delay(failures: u32, settings: &OcspConfig) -> Duration {
    let doubled = settings
        .retry
        .saturating_mul(1 << failures.saturating_sub(1).min(20));
    doubled.min(settings.min_refresh.max(settings.retry))
}

/// POSTs the request (RFC 6960 appendix A.1) and returns the response body.
fn fetch(url: &str, request: &[u8], timeout: Duration) -> anyhow::Result<Vec<u8>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .build()
        .into();
    let mut response = agent
        .post(url)
        .content_type("application/ocsp-request")
        .send(request)?;
    Ok(response
        .body_mut()
        .with_config()
        .limit(MAX_RESPONSE)
        .read_to_vec()?)
}

/// The first http:// OCSP responder in the certificate's Authority Information Access.
fn responder_url(leaf: &X509Ref) -> anyhow::Result<String> {
    let urls: Vec<String> = leaf
        .ocsp_responders()
        .map(|stack| stack.iter().map(|url| url.to_string()).collect())
        .unwrap_or_default();
    let http = urls
        .iter()
        .find(|url| url.to_ascii_lowercase().starts_with("http://"));
    match http {
        Some(url) => Ok(url.clone()),
        None if urls.is_empty() => {
            anyhow::bail!("the certificate names no OCSP responder (Authority Information Access)")
        }
        None => anyhow::bail!("no http:// OCSP responder among {urls:?}"),
    }
}

struct Registry {
    state: Mutex<RegistryState>,
    /// Signalled when a slot is added or the settings change.
    changed: Condvar,
    settings: ArcSwap<OcspConfig>,
}

struct RegistryState {
    slots: HashMap<(String, Vec<u8>), Weak<Slot>>,
    news: bool,
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    state: Mutex::new(RegistryState {
        slots: HashMap::new(),
        news: false,
    }),
    changed: Condvar::new(),
    settings: ArcSwap::from_pointee(OcspConfig::default()),
});

impl Registry {
    fn wake(&self, state: &mut RegistryState) {
        state.news = true;
        self.changed.notify_one();
    }
}

/// Applies `[ocsp]` (at start and on reload); it counts from each slot's next fetch.
pub fn configure(settings: &OcspConfig) {
    REGISTRY.settings.store(Arc::new(settings.clone()));
    REGISTRY.wake(&mut lock(&REGISTRY.state));
}

/// The slot for the certificate `chain[0]`, issued by `chain[1]`. An unknown certificate
/// is fetched at once; `file` (its `ocsp` response, if configured) is the starting value.
pub fn register(
    chain: &[X509],
    file: Option<&[u8]>,
    names: &[String],
) -> anyhow::Result<Arc<Slot>> {
    let (leaf, rest) = chain.split_first().context("no certificate")?;
    let issuer = rest.first().context(
        "no issuer certificate after the certificate in its file (the OCSP request names it)",
    )?;
    anyhow::ensure!(
        issuer.issued(leaf).is_ok(),
        "the second certificate in the file did not issue the first"
    );
    let url = responder_url(leaf)?;
    let request = ocsp::request(leaf, issuer)?;
    let slot = {
        let mut state = lock(&REGISTRY.state);
        let key = (url, request);
        match state.slots.get(&key).and_then(Weak::upgrade) {
            Some(slot) => slot,
            None => {
                let slot = Arc::new(Slot {
                    leaf: leaf.clone(),
                    issuer: issuer.clone(),
                    url: key.0.clone(),
                    request: key.1.clone(),
                    names: names.to_vec(),
                    current: ArcSwapOption::empty(),
                    schedule: Mutex::new(Schedule {
                        due: Instant::now(),
                        failures: 0,
                    }),
                });
                state.slots.insert(key, Arc::downgrade(&slot));
                REGISTRY.wake(&mut state);
                slot
            }
        }
    };
    if let Some(response) = file {
        let _schedule = lock(&slot.schedule);
        let max_refresh = REGISTRY.settings.load().max_refresh;
        let _ = slot.take(response.to_vec(), max_refresh, "file");
    }
    static FETCHER: Once = Once::new();
    FETCHER.call_once(|| {
        if let Err(err) = std::thread::Builder::new()
            .name("ocsp-fetch".into())
            .spawn(run)
        {
            tracing::error!(error = %err, "cannot start the OCSP fetcher: nothing will be fetched");
        }
    });
    Ok(slot)
}

/// The fetcher thread: does what is due, then sleeps until the next thing is.
fn run() {
    loop {
        let settings = REGISTRY.settings.load_full();
        let slots: Vec<Arc<Slot>> = {
            let mut state = lock(&REGISTRY.state);
            state.news = false;
            state.slots.retain(|_, slot| slot.strong_count() > 0);
            state.slots.values().filter_map(Weak::upgrade).collect()
        };
        let now = Instant::now();
        let due: Vec<&Arc<Slot>> = slots
            .iter()
            .filter(|slot| {
                slot.expire_if_stale();
                lock(&slot.schedule).due <= now
            })
            .collect();
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..PARALLEL_FETCHES.min(due.len()) {
                scope.spawn(|| {
                    while let Some(slot) = due.get(next.fetch_add(1, Ordering::Relaxed)) {
                        // A panic must not end fetching for every certificate.
                        let refresh = AssertUnwindSafe(|| slot.refresh(&settings));
                        if std::panic::catch_unwind(refresh).is_err() {
                            tracing::error!(url = %slot.url, "OCSP refresh panicked; retried later");
                            lock(&slot.schedule).due = Instant::now() + settings.min_refresh;
                        }
                    }
                });
            }
        });
        let mut wake = Instant::now() + settings.max_refresh;
        for slot in &slots {
            wake = wake.min(slot.next_event());
        }
        // Not held while asleep, so that slots a reload let go of can be dropped.
        drop(slots);
        let state = lock(&REGISTRY.state);
        let timeout = wake.saturating_duration_since(Instant::now());
        let _ = REGISTRY
            .changed
            .wait_timeout_while(state, timeout, |state| !state.news)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

#[cfg(test)]
mod tests;
