//! One certificate's life: served from storage or the fleet, renewed inside the CA's
//! window (or at a third of its lifetime left), failures backed off while the old
//! certificate keeps serving, each new one stored and announced to the server.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc::UnboundedSender;

use super::fleet::Fleet;
use super::store::{Facts, Material, Storage};
use super::{metrics, order};
use super::{Announcement, Installed};
use crate::config::{AcmeCertificate, AcmeConfig};
use crate::tls::CertifiedKey;

/// A stored or shared certificate, checked and ready to serve for `cert`.
pub(super) fn usable(
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
pub(super) struct AriWindow {
    renew_at: SystemTime,
    /// When to ask again (the CA's Retry-After).
    ask_again: Instant,
}

pub(super) struct CertificateTask {
    pub(super) cert: AcmeCertificate,
    pub(super) config: AcmeConfig,
    pub(super) storage: Arc<Storage>,
    pub(super) fleet: Option<Arc<Fleet>>,
    pub(super) account: Arc<tokio::sync::Mutex<Option<instant_acme::Account>>>,
    pub(super) installed: Installed,
    pub(super) announce: UnboundedSender<Announcement>,
    pub(super) current: Option<(Material, Facts)>,
    pub(super) ari: Option<AriWindow>,
    pub(super) failures: u32,
    pub(super) last_attempt: Option<Instant>,
}

/// How often a fleet member looks in Redis for a certificate another one ordered.
const FLEET_POLL: Duration = Duration::from_secs(5);
/// How often a lone process re-checks its schedule while nothing is due.
const IDLE_CHECK: Duration = Duration::from_secs(3600);

impl CertificateTask {
    pub(super) async fn run(mut self) {
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
        // The ACME client waits for an answer without limit: a CA that accepts the
        // connection and never answers would otherwise stop this certificate's renewals.
        let asked = tokio::time::timeout(self.config.order_timeout, asked)
            .await
            .unwrap_or_else(|_| {
                Err(anyhow::anyhow!(
                    "no answer within {:?}",
                    self.config.order_timeout
                ))
            });
        match asked {
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
        let replaces = self.current.as_ref().and_then(|(_, f)| f.ari_id.clone());
        // The account (registered at the first order) is inside the time limit: the ACME
        // client itself waits for answers without one.
        let ordering = async {
            let account = self.account().await?;
            order::order(
                &account,
                &self.config,
                &self.cert,
                replaces,
                self.fleet.as_deref(),
            )
            .await
        };
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
        // Which certificate this one renews (its RFC 9773 identifier): in a fleet, two
        // orders naming the same one mean a member missed the certificate another shared.
        let replaced = self.current.as_ref().and_then(|(_, f)| f.ari_id.as_ref());
        tracing::info!(certificate = %self.cert.id(), replaces = %replaced.map_or("none".to_string(), |id| id.to_string()), "ACME certificate ordered");
        Ok(material)
    }

    /// Whether `material` (from Redis) is usable for this certificate and replaces ours: it
    /// lasts longer, or as long but is another certificate. Certificate times count whole
    /// seconds, so a renewal issued within a second of the certificate it renews ends in
    /// the same second; only the order holding the fleet lock puts a certificate in Redis,
    /// so a different one that ends no earlier is the fleet's newer one.
    /// A certificate whose names changed keeps its storage name, so Redis may still hold
    /// one for the old names: that counts as none, and a new one is ordered.
    /// Only the certificate is read here (the key is checked by `install`, once): this
    /// runs every second while another process orders.
    fn is_newer(&self, material: &Material) -> bool {
        let Ok(facts) = material.facts() else {
            return false;
        };
        if !facts.serves(&self.cert, SystemTime::now()) {
            return false;
        }
        match &self.current {
            None => true,
            Some((ours, current)) => {
                facts.not_after > current.not_after
                    || (facts.not_after == current.not_after
                        && material.chain_pem != ours.chain_pem)
            }
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

    /// Installs, announces and stores a certificate. It is served even when it cannot be
    /// stored (a full or read-only disk): ordering it again would only run into the CA's
    /// rate limits, and the next start orders or takes it from the fleet.
    fn install(&mut self, material: Material, source: &'static str) -> anyhow::Result<()> {
        let (certified, facts) = usable(&self.cert, &material, SystemTime::now())?;
        if let Err(err) = self.storage.save(&self.cert, &material) {
            tracing::error!(certificate = %self.cert.id(), error = format!("{err:#}"), "cannot store the ACME certificate; serving it from memory");
        }
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
