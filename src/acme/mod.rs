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
//! once (`fleet.rs`). A reload starts and ends tasks as names are added and removed; a
//! certificate whose names change keeps serving the names it had until the new one comes.

mod fleet;
pub mod http01;
mod metrics;
mod order;
mod store;
mod task;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::config::{AcmeCertificate, AcmeConfig, Config};
use crate::tls::CertifiedKey;
use fleet::Fleet;
use store::{Facts, Material, Storage};
use task::{usable, CertificateTask};

/// A certificate that is ready to serve: the server puts it into its contexts and logs it.
pub struct Announcement {
    pub certificate: String,
    /// "order" or "fleet".
    pub source: &'static str,
    pub not_after: SystemTime,
}

/// The certificates ACME currently provides, by what they were ordered for.
pub(super) type Installed = Arc<Mutex<HashMap<AcmeCertificate, CertifiedKey>>>;

/// ACME in a running server: the installed certificates and one task per certificate.
/// A reload adds and removes tasks as names come and go; a changed `[acme]` (or Redis)
/// restarts them all from what is stored.
pub struct Acme {
    installed: Installed,
    /// Certificates that no longer match the configuration (a name was added, say) but keep
    /// serving their names until the one ordered for the new names is installed: a
    /// certificate change is not an outage of the names that stay, however long the CA
    /// takes. Keyed by the new certificate.
    standing_in: Mutex<HashMap<AcmeCertificate, CertifiedKey>>,
    /// Tells the server that a certificate was installed (it rebuilds the contexts).
    announce: UnboundedSender<Announcement>,
    ca: Option<CaSetup>,
    tasks: HashMap<AcmeCertificate, tokio::task::AbortHandle>,
    http_address: Option<SocketAddr>,
}

/// The CA and what the tasks share, for one `[acme]` configuration.
struct CaSetup {
    config: AcmeConfig,
    /// `[session]`'s `redis_url`, `redis_ca_file` and `redis_prefix`.
    redis: Option<(String, Option<PathBuf>, String)>,
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
            standing_in: Mutex::default(),
            announce,
            ca: None,
            tasks: HashMap::new(),
            http_address: None,
        };
        (acme, installed)
    }

    /// Reads what `config` needs: stored certificates of names not yet managed (served
    /// from the first connection: they are installed at once), the fleet's Redis client.
    /// Over 80 lines on purpose: the steps of a plan in order (which certificates, whether
    /// the CA setup changed, the fleet client, each stored certificate tried), each using
    /// what the one before found.
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
        let redis = config.session.redis_url.clone().map(|url| {
            let session = &config.session;
            (
                url,
                session.redis_ca_file.clone(),
                session.redis_prefix.clone(),
            )
        });
        let restart = self
            .ca
            .as_ref()
            .is_none_or(|r| r.config != *acme || r.redis != redis);
        let fleet = match (&redis, &config.session.fleet_key_file) {
            (Some((url, ca, prefix)), Some(key)) => {
                let client = crate::session::redis::client(url, ca.as_deref())?;
                let key = crate::seal::FleetKey::load(key.get_ref())?;
                Some(Arc::new(Fleet::new(client, prefix, Arc::new(key))))
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
            let candidates = storage.load(cert);
            if candidates.is_empty() {
                continue;
            }
            // A save cut short leaves a second candidate: the first that serves wins; the
            // first one's error is the one told.
            let mut refused = None;
            let found =
                candidates
                    .into_iter()
                    .find_map(|material| match usable(cert, &material, now) {
                        Ok(usable) => Some((material, usable)),
                        Err(err) => {
                            refused.get_or_insert(err);
                            None
                        }
                    });
            match found.ok_or_else(|| refused.expect("a candidate was refused")) {
                Ok((material, (certified, facts))) => {
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
        self.stand_in_for_new(&wanted);
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

    /// For each certificate of `wanted` that has none yet, the installed one it replaces (the
    /// same key type, a name in common, and no longer wanted itself), which serves meanwhile.
    /// Before the contexts of `wanted` are built, so that they have it from the start.
    fn stand_in_for_new(&self, wanted: &[AcmeCertificate]) {
        let installed = self.installed.lock().expect("acme certificates");
        let mut standing_in = self.standing_in.lock().expect("acme stand-ins");
        for cert in wanted {
            if installed.contains_key(cert) || standing_in.contains_key(cert) {
                continue;
            }
            let predecessor = installed.iter().find(|(old, _)| {
                !wanted.contains(old)
                    && old.key_type == cert.key_type
                    && old.names.iter().any(|name| cert.names.contains(name))
            });
            if let Some((old, key)) = predecessor {
                tracing::info!(certificate = %cert.id(), serving = %old.id(), "until the ACME certificate for the new names is issued, the previous one serves its names");
                standing_in.insert(cert.clone(), key.clone());
            }
        }
    }

    /// Commits to a prepared configuration: starts the HTTP listener (once), ends the
    /// tasks of certificates no longer wanted, starts those of new ones. On the runtime
    /// the tasks are to run on. Over 80 lines on purpose: the counterpart of `prepare`,
    /// what the plan changes in one place, in the order it is made.
    pub fn apply(&mut self, plan: Plan) -> anyhow::Result<()> {
        let Plan {
            wanted,
            ca,
            restart,
            mut loaded,
        } = plan;
        let fleet_of = |ca: Option<&CaSetup>| ca.and_then(|ca| ca.fleet.clone());
        if let (false, Some(current), Some(new)) =
            (restart, fleet_of(self.ca.as_ref()), fleet_of(ca.as_ref()))
        {
            // A rotated fleet key applies at once, without restarting the orders.
            current.set_key(new.key());
        }
        if restart {
            for (_, task) in self.tasks.drain() {
                task.abort();
            }
            self.ca = ca;
            crate::tls::acme_challenge::set_fleet_lookup(self.fleet_lookup());
            http01::set_fleet(
                self.ca
                    .as_ref()
                    .filter(|ca| ca.config.challenge == crate::config::ChallengeKind::Http01)
                    .and_then(|ca| ca.fleet.clone()),
            );
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
        let mut installed = self.installed.lock().expect("acme certificates");
        installed.retain(|cert, _| wanted.contains(cert));
        self.standing_in
            .lock()
            .expect("acme stand-ins")
            .retain(|cert, _| wanted.contains(cert) && !installed.contains_key(cert));
        drop(installed);
        // Validation connections for other names are refused without asking the fleet.
        crate::tls::acme_challenge::set_ordered_names(
            wanted
                .iter()
                .flat_map(|cert| &cert.names)
                .map(String::as_str),
        );
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

    /// How validation connections reaching this process learn another one's answer (the
    /// fleet shares TLS-ALPN-01 answers only).
    fn fleet_lookup(&self) -> Option<crate::tls::acme_challenge::FleetLookup> {
        let ca = self.ca.as_ref()?;
        if ca.config.challenge != crate::config::ChallengeKind::TlsAlpn01 {
            return None;
        }
        let fleet = ca.fleet.clone()?;
        // Asked on this runtime (the ACME tasks'), where the fleet's one Redis connection
        // lives, whichever worker's handshake waits for the answer.
        let runtime = tokio::runtime::Handle::try_current().ok();
        Some(Arc::new(move |name| {
            let fleet = fleet.clone();
            let asking = async move { fleet.challenge(&name).await.ok().flatten() };
            match &runtime {
                Some(runtime) => {
                    let asked = runtime.spawn(asking);
                    Box::pin(async move { asked.await.ok().flatten() })
                }
                None => Box::pin(asking),
            }
        }))
    }

    /// The installed certificates among `wanted` (a listener's), or for one not issued yet
    /// the certificate it replaces.
    pub fn certificates(&self, wanted: &[AcmeCertificate]) -> Vec<CertifiedKey> {
        let installed = self.installed.lock().expect("acme certificates");
        let standing_in = self.standing_in.lock().expect("acme stand-ins");
        wanted
            .iter()
            .filter_map(|cert| {
                installed
                    .get(cert)
                    .or_else(|| standing_in.get(cert))
                    .cloned()
            })
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
