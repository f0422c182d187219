//! Certificates that obtain and renew themselves from an ACME CA (RFC 8555).
//!
//! Each certificate of the configuration (its names and key type) has a task on the main
//! thread's runtime. At start a stored certificate is served at once; a missing or expired
//! one is ordered in the background while the others serve. A certificate is renewed
//! inside the CA's renewal window (ACME Renewal Information, RFC 9773) when the CA offers
//! one, else when a third of its lifetime is left; failures back off (`retry_min` doubling
//! up to `retry_max`) while the old certificate keeps serving. A new certificate is stored
//! (key 0600) and installed into the running listeners the way a reload swaps contexts:
//! new handshakes get it, established connections keep theirs. With Redis, a fleet orders
//! once (`fleet.rs`). A reload starts and ends tasks as names are added and removed.

mod fleet;
pub mod http01;
mod metrics;
mod order;
mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::config::{read_fleet_key, AcmeCertificate, AcmeConfig, Config};
use crate::tls::CertifiedKey;
use fleet::Fleet;
use store::{Facts, Material, Storage};

/// A certificate that is ready to serve: the server puts it into its contexts and logs it.
pub struct Announcement {
    pub certificate: String,
    /// "order" or "fleet".
    pub source: &'static str,
    pub not_after: SystemTime,
}

/// The certificates ACME currently provides, by what they were ordered for.
type Installed = Arc<Mutex<HashMap<AcmeCertificate, CertifiedKey>>>;

/// ACME in a running server: the installed certificates and one task per certificate.
/// A reload adds and removes tasks as names come and go; a changed `[acme]` (or Redis)
/// restarts them all from what is stored.
pub struct Acme {
    installed: Installed,
    /// Tells the server that a certificate was installed (it rebuilds the contexts).
    announce: UnboundedSender<Announcement>,
    ca: Option<CaSetup>,
    tasks: HashMap<AcmeCertificate, tokio::task::AbortHandle>,
    http_address: Option<SocketAddr>,
}

/// The CA and what the tasks share, for one `[acme]` configuration.
struct CaSetup {
    config: AcmeConfig,
    redis: Option<(String, Option<PathBuf>)>,
    storage: Arc<Storage>,
    fleet: Option<Arc<Fleet>>,
    account: Arc<tokio::sync::Mutex<Option<instant_acme::Account>>>,
}

/// A configuration's ACME, prepared (storage read, Redis client made) before a start or
/// reload commits to it.
pub struct Plan {
    wanted: Vec<AcmeCertificate>,
    ca: Option<CaSetup>,
    restart: bool,
    loaded: HashMap<AcmeCertificate, (Material, Facts)>,
}

impl Acme {
    pub fn new() -> (Acme, UnboundedReceiver<Announcement>) {
        let (announce, installed) = unbounded_channel();
        let acme = Acme {
            installed: Arc::default(),
            announce,
            ca: None,
            tasks: HashMap::new(),
            http_address: None,
        };
        (acme, installed)
    }

    /// Reads what `config` needs: stored certificates of names not yet managed (served
    /// from the first connection: they are installed at once), the fleet's Redis client.
    pub fn prepare(&self, config: &Config) -> anyhow::Result<Plan> {
        let mut wanted: Vec<AcmeCertificate> = Vec::new();
        for cert in config.listeners.iter().flat_map(|l| &l.acme_certificates) {
            if !wanted.contains(cert) {
                wanted.push(cert.clone());
            }
        }
        let Some(acme) = &config.acme else {
            return Ok(Plan {
                wanted: Vec::new(),
                ca: None,
                restart: self.ca.is_some(),
                loaded: HashMap::new(),
            });
        };
        let redis = config
            .session
            .redis_url
            .clone()
            .map(|url| (url, config.session.redis_ca_file.clone()));
        let restart = self
            .ca
            .as_ref()
            .is_none_or(|r| r.config != *acme || r.redis != redis);
        let fleet = match (&redis, &acme.fleet_key_file) {
            (Some((url, ca)), Some(key)) => {
                let client = crate::session::redis::client(url, ca.as_deref())?;
                Some(Arc::new(Fleet::new(client, read_fleet_key(key.get_ref())?)))
            }
            _ => None,
        };
        let storage = Arc::new(Storage::new(acme.storage.get_ref()));
        let now = SystemTime::now();
        let mut loaded = HashMap::new();
        for cert in &wanted {
            if !restart && self.tasks.contains_key(cert) {
                continue;
            }
            let Some(material) = storage.load(cert) else {
                continue;
            };
            match usable(cert, &material, now) {
                Ok((certified, facts)) => {
                    tracing::info!(certificate = %cert.id(), not_after = %humantime::format_rfc3339_seconds(facts.not_after), "ACME certificate loaded from storage");
                    metrics::installed("storage");
                    self.installed
                        .lock()
                        .expect("acme certificates")
                        .insert(cert.clone(), certified);
                    loaded.insert(cert.clone(), (material, facts));
                }
                Err(err) => {
                    tracing::warn!(certificate = %cert.id(), error = format!("{err:#}"), "stored ACME certificate not used; a new one is ordered")
                }
            }
        }
        Ok(Plan {
            wanted,
            ca: Some(CaSetup {
                config: acme.clone(),
                redis,
                storage,
                fleet,
                account: Arc::default(),
            }),
            restart,
            loaded,
        })
    }

    /// Commits to a prepared configuration: starts the HTTP listener (once), ends the
    /// tasks of certificates no longer wanted, starts those of new ones. On the runtime
    /// the tasks are to run on.
    pub fn apply(&mut self, plan: Plan) -> anyhow::Result<()> {
        let Plan {
            wanted,
            ca,
            restart,
            mut loaded,
        } = plan;
        if restart {
            for (_, task) in self.tasks.drain() {
                task.abort();
            }
            self.ca = ca;
            crate::tls::acme_challenge::set_fleet_lookup(self.fleet_lookup());
        }
        self.tasks.retain(|cert, task| {
            let keep = wanted.contains(cert);
            if !keep {
                task.abort();
                metrics::forget(cert);
                tracing::info!(certificate = %cert.id(), "ACME certificate no longer configured: not renewed any more");
            }
            keep
        });
        self.installed
            .lock()
            .expect("acme certificates")
            .retain(|cert, _| wanted.contains(cert));
        let Some(ca) = &self.ca else {
            return Ok(());
        };
        let http = ca.config.http_address.as_ref().map(|a| *a.get_ref());
        match (http, self.http_address) {
            (Some(address), None) => {
                http01::start(address)?;
                self.http_address = Some(address);
            }
            (Some(address), Some(open)) if address != open => {
                tracing::warn!(%open, "acme.http_address changes at the next restart");
            }
            _ => {}
        }
        for cert in wanted {
            if self.tasks.contains_key(&cert) {
                continue;
            }
            let task = CertificateTask {
                current: loaded.remove(&cert),
                cert: cert.clone(),
                config: ca.config.clone(),
                storage: ca.storage.clone(),
                fleet: ca.fleet.clone(),
                account: ca.account.clone(),
                installed: self.installed.clone(),
                announce: self.announce.clone(),
                ari: None,
                failures: 0,
                last_attempt: None,
            };
            self.tasks
                .insert(cert, tokio::spawn(task.run()).abort_handle());
        }
        Ok(())
    }

    /// How validation connections reaching this process learn another one's answer.
    fn fleet_lookup(&self) -> Option<crate::tls::acme_challenge::FleetLookup> {
        let fleet = self.ca.as_ref()?.fleet.clone()?;
        Some(Arc::new(move |name| {
            let fleet = fleet.clone();
            Box::pin(async move { fleet.challenge(&name).await.ok().flatten() })
        }))
    }

    /// The installed certificates among `wanted` (a listener's).
    pub fn certificates(&self, wanted: &[AcmeCertificate]) -> Vec<CertifiedKey> {
        let installed = self.installed.lock().expect("acme certificates");
        wanted
            .iter()
            .filter_map(|cert| installed.get(cert).cloned())
            .collect()
    }
}

impl Drop for Acme {
    fn drop(&mut self) {
        for task in self.tasks.values() {
            task.abort();
        }
    }
}

/// A stored or shared certificate, checked and ready to serve for `cert`.
fn usable(
    cert: &AcmeCertificate,
    material: &Material,
    now: SystemTime,
) -> anyhow::Result<(CertifiedKey, Facts)> {
    let facts = material.facts()?;
    anyhow::ensure!(
        facts.serves(cert, now),
        "expired, or not for every name ({:?})",
        facts.names
    );
    let certified = CertifiedKey::from_pem(
        material.chain_pem.as_bytes(),
        material.key_pem.as_bytes(),
        &cert.names,
        false,
    )?;
    Ok((certified, facts))
}

/// The CA's renewal window for the current certificate and our point in it.
struct AriWindow {
    renew_at: SystemTime,
    /// When to ask again (the CA's Retry-After).
    ask_again: Instant,
}

struct CertificateTask {
    cert: AcmeCertificate,
    config: AcmeConfig,
    storage: Arc<Storage>,
    fleet: Option<Arc<Fleet>>,
    account: Arc<tokio::sync::Mutex<Option<instant_acme::Account>>>,
    installed: Installed,
    announce: UnboundedSender<Announcement>,
    current: Option<(Material, Facts)>,
    ari: Option<AriWindow>,
    failures: u32,
    last_attempt: Option<Instant>,
}

/// How often a fleet member looks in Redis for a certificate another one ordered.
const FLEET_POLL: Duration = Duration::from_secs(5);
/// How often a lone process re-checks its schedule while nothing is due.
const IDLE_CHECK: Duration = Duration::from_secs(3600);

impl CertificateTask {
    async fn run(mut self) {
        loop {
            if let Some(fleet) = self.fleet.clone() {
                match fleet.get(&self.cert).await {
                    Ok(Some(material)) => self.adopt(material, "fleet"),
                    Ok(None) => {}
                    Err(err) => {
                        tracing::debug!(certificate = %self.cert.id(), error = format!("{err:#}"), "cannot look up the fleet's certificate")
                    }
                }
            }
            let due = self.renewal_time().await;
            metrics::next_renewal(&self.cert, due);
            let now = SystemTime::now();
            if let Ok(wait) = due.duration_since(now) {
                if !wait.is_zero() {
                    let poll = if self.fleet.is_some() {
                        FLEET_POLL
                    } else {
                        IDLE_CHECK
                    };
                    tokio::time::sleep(wait.min(poll)).await;
                    continue;
                }
            }
            // Never more than one attempt per `retry_min`, whatever the schedule says.
            if let Some(last) = self.last_attempt {
                let next = last + self.config.retry_min;
                tokio::time::sleep_until(next.into()).await;
            }
            self.last_attempt = Some(Instant::now());
            match self.renew().await {
                Ok(()) => self.failures = 0,
                Err(err) => {
                    self.failures += 1;
                    metrics::order("failed");
                    let backoff = self
                        .config
                        .retry_min
                        .saturating_mul(1 << self.failures.min(20).saturating_sub(1))
                        .min(self.config.retry_max);
                    let error = format!("{err:#}");
                    if self.expiry_near() {
                        tracing::error!(certificate = %self.cert.id(), error, retry_in = ?backoff, "ACME order failed and the certificate expires soon (or there is none)");
                    } else {
                        tracing::warn!(certificate = %self.cert.id(), error, retry_in = ?backoff, "ACME order failed; the current certificate keeps serving");
                    }
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// No certificate, or less than a tenth of its lifetime left.
    fn expiry_near(&self) -> bool {
        match &self.current {
            None => true,
            Some((_, facts)) => facts
                .not_after
                .duration_since(SystemTime::now())
                .map_or(true, |left| left < facts.lifetime() / 10),
        }
    }

    async fn account(&self) -> anyhow::Result<instant_acme::Account> {
        let mut account = self.account.lock().await;
        if let Some(account) = &*account {
            return Ok(account.clone());
        }
        let created = order::account(&self.config, &self.storage).await?;
        *account = Some(created.clone());
        Ok(created)
    }

    /// When the current certificate should be renewed: now if there is none; inside the
    /// CA's ARI window if it offers one; else when a third of its lifetime is left.
    async fn renewal_time(&mut self) -> SystemTime {
        let Some((_, facts)) = &self.current else {
            return SystemTime::now();
        };
        let fallback = facts.not_after - facts.lifetime() / 3;
        let Some(id) = facts.ari_id.clone() else {
            return fallback;
        };
        if let Some(window) = &self.ari {
            if Instant::now() < window.ask_again {
                return window.renew_at;
            }
        }
        let asked = async {
            let account = self.account().await?;
            Ok::<_, anyhow::Error>(account.renewal_info(&id).await?)
        };
        match asked.await {
            Ok((info, retry_after)) => {
                let start = SystemTime::from(info.suggested_window.start);
                let end = SystemTime::from(info.suggested_window.end).max(start);
                // A point drawn once per window (RFC 9773 4.2): a fleet's members spread
                // their checks, and asking again does not pull the point earlier.
                let fraction = match &self.ari {
                    Some(previous) if previous.renew_at >= start && previous.renew_at <= end => {
                        return self.keep_window(previous.renew_at, retry_after)
                    }
                    _ => random_fraction(),
                };
                let span = end.duration_since(start).unwrap_or_default();
                let renew_at = start + span.mul_f64(fraction);
                self.keep_window(renew_at, retry_after)
            }
            Err(err) => {
                tracing::debug!(certificate = %self.cert.id(), error = format!("{err:#}"), "no renewal information; renewing when a third of the lifetime is left");
                fallback
            }
        }
    }

    fn keep_window(&mut self, renew_at: SystemTime, retry_after: Duration) -> SystemTime {
        let retry_after = retry_after.clamp(Duration::from_secs(60), Duration::from_secs(6 * 3600));
        self.ari = Some(AriWindow {
            renew_at,
            ask_again: Instant::now() + retry_after,
        });
        renew_at
    }

    /// Orders a certificate, or, in a fleet, takes the one another process ordered.
    async fn renew(&mut self) -> anyhow::Result<()> {
        let Some(fleet) = self.fleet.clone() else {
            let material = self.order().await?;
            return self.install(material, "order");
        };
        let hold = self.config.order_timeout + Duration::from_secs(30);
        let give_up = Instant::now() + hold;
        loop {
            let token = match fleet.lock(&self.cert, hold).await {
                Ok(token) => token,
                Err(err) => {
                    // Better a second order than an expired certificate.
                    tracing::warn!(certificate = %self.cert.id(), error = format!("{err:#}"), "Redis unavailable: ordering without the fleet lock");
                    let material = self.order().await?;
                    return self.install(material, "order");
                }
            };
            if let Some(token) = token {
                let result = self.order_for_fleet(&fleet).await;
                if let Err(err) = fleet.unlock(&self.cert, &token).await {
                    tracing::debug!(
                        error = format!("{err:#}"),
                        "cannot release the ACME order lock (it expires)"
                    );
                }
                return result;
            }
            // Another process is ordering: wait for its certificate or for its lock to go.
            while Instant::now() < give_up {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Ok(Some(material)) = fleet.get(&self.cert).await {
                    if self.is_newer(&material) {
                        return self.install(material, "fleet");
                    }
                }
                if !fleet.locked(&self.cert).await.unwrap_or(true) {
                    break;
                }
            }
            anyhow::ensure!(
                Instant::now() < give_up,
                "another process holds the order lock and shared no certificate"
            );
        }
    }

    async fn order_for_fleet(&mut self, fleet: &Fleet) -> anyhow::Result<()> {
        // It may have finished just before we took the lock.
        if let Ok(Some(material)) = fleet.get(&self.cert).await {
            if self.is_newer(&material) {
                return self.install(material, "fleet");
            }
        }
        let material = self.order().await?;
        let facts = material.facts()?;
        let until = facts
            .not_after
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        if let Err(err) = fleet.put(&self.cert, &material, until).await {
            tracing::warn!(certificate = %self.cert.id(), error = format!("{err:#}"), "cannot share the new certificate through Redis");
        }
        self.install(material, "order")
    }

    async fn order(&mut self) -> anyhow::Result<Material> {
        let account = self.account().await?;
        let replaces = self.current.as_ref().and_then(|(_, f)| f.ari_id.clone());
        let ordering = order::order(
            &account,
            &self.config,
            &self.cert,
            replaces,
            self.fleet.as_deref(),
        );
        let material = tokio::time::timeout(self.config.order_timeout, ordering)
            .await
            .map_err(|_| {
                anyhow::anyhow!("order timed out after {:?}", self.config.order_timeout)
            })?;
        let material = match material {
            Ok(material) => material,
            Err(err) => {
                if account_gone(&err) {
                    // The CA forgot the account (a test CA restarted, an account purged):
                    // register a new one at the next attempt.
                    tracing::warn!(certificate = %self.cert.id(), "the CA no longer knows the ACME account; registering a new one");
                    *self.account.lock().await = None;
                    let _ = std::fs::remove_file(self.storage.account_file());
                }
                return Err(err);
            }
        };
        metrics::order("issued");
        Ok(material)
    }

    fn is_newer(&self, material: &Material) -> bool {
        let Ok(facts) = material.facts() else {
            return false;
        };
        match &self.current {
            None => true,
            Some((_, current)) => facts.not_after > current.not_after,
        }
    }

    /// Takes a certificate found in Redis if it is newer than ours.
    fn adopt(&mut self, material: Material, source: &'static str) {
        if self.is_newer(&material) {
            if let Err(err) = self.install(material, source) {
                tracing::warn!(certificate = %self.cert.id(), error = format!("{err:#}"), "shared ACME certificate not used");
            }
        }
    }

    /// Stores, installs and announces a certificate.
    fn install(&mut self, material: Material, source: &'static str) -> anyhow::Result<()> {
        let (certified, facts) = usable(&self.cert, &material, SystemTime::now())?;
        self.storage.save(&self.cert, &material)?;
        self.installed
            .lock()
            .expect("acme certificates")
            .insert(self.cert.clone(), certified);
        metrics::installed(source);
        let _ = self.announce.send(Announcement {
            certificate: self.cert.id(),
            source,
            not_after: facts.not_after,
        });
        self.current = Some((material, facts));
        self.ari = None;
        Ok(())
    }
}

/// Whether the CA answered that the account does not exist.
fn account_gone(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<instant_acme::Error>(),
            Some(instant_acme::Error::Api(problem))
                if problem.r#type.as_deref() == Some("urn:ietf:params:acme:error:accountDoesNotExist")
        )
    })
}

fn random_fraction() -> f64 {
    let mut bytes = [0u8; 8];
    boring::rand::rand_bytes(&mut bytes).expect("random bytes");
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}
