//! What the main thread keeps while serving, and what it does with it: reload on SIGHUP
//! (new contexts, listeners opened and closed; on any error the old state keeps
//! serving) and installing renewed ACME certificates into running listeners.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use super::listener::{bind_per_worker, open, Listener};
use super::metrics;
use super::state::{build_states, build_tls, publish_expiry, AcmeCertificates, ListenerState};
use super::{worker, ConfigSource, ProcessWide};
use crate::config::ProcessSettings;
use crate::offload::OffloadSettings;
use crate::session::Sessions;

/// What the main thread keeps while serving, to apply reloads.
pub(super) struct Serving {
    pub(super) source: ConfigSource,
    pub(super) started_with: ProcessSettings,
    pub(super) listeners: Vec<Arc<Listener>>,
    /// Each worker's command channel.
    pub(super) workers: Vec<UnboundedSender<worker::Command>>,
    pub(super) shared: Arc<ProcessWide>,
    pub(super) builtin: Option<SocketAddr>,
    pub(super) sessions: Sessions,
    /// The `[session]` settings in force (ACME installs build contexts with them).
    pub(super) session_config: crate::config::SessionConfig,
    pub(super) settings: watch::Sender<OffloadSettings>,
    pub(super) acme: crate::acme::Acme,
}

impl Serving {
    fn acme(&self) -> AcmeCertificates<'_> {
        Some(&self.acme)
    }

    /// An ACME certificate was installed: each listener that serves ACME names gets new
    /// contexts with it; connections keep the state they started with.
    pub(super) fn install_acme_certificates(&mut self, announced: crate::acme::Announcement) {
        let mut states = Vec::new();
        for listener in &self.listeners {
            let state = listener.state.load_full();
            if state.config.acme_certificates.is_empty() {
                states.push(state);
                continue;
            }
            match build_tls(
                &state.config,
                &state.file_certificates,
                self.acme(),
                &self.sessions,
                &self.session_config,
            ) {
                Ok(tls) => {
                    let fresh = Arc::new(ListenerState {
                        config: state.config.clone(),
                        tls,
                        file_certificates: state.file_certificates.clone(),
                        pools: state.pools.clone(),
                        quic: state.quic.clone(),
                        metrics: metrics::ListenerMetrics::new(listener.address),
                    });
                    listener.state.store(fresh.clone());
                    states.push(fresh);
                }
                Err(err) => {
                    tracing::error!(address = %listener.address, error = format!("{err:#}"), "cannot install the new ACME certificate; the previous ones keep serving");
                    states.push(state);
                }
            }
        }
        publish_expiry(&states, self.acme());
        tracing::info!(certificate = %announced.certificate, source = announced.source, not_after = %humantime::format_rfc3339_seconds(announced.not_after), "ACME certificate installed");
    }

    /// One line for the service manager: what is being served.
    pub(super) fn status(&self) -> String {
        let addresses: Vec<String> = self
            .listeners
            .iter()
            .map(|l| l.address.to_string())
            .collect();
        format!(
            "serving {} on {} workers",
            addresses.join(", "),
            self.workers.len()
        )
    }

    /// SIGHUP: re-read configuration and certificates, open new listeners and close
    /// removed ones; on any error keep serving the old ones. Counted in `reloads_total`
    /// by outcome, which is returned.
    pub(super) fn reload(&mut self) -> Result<(), ReloadRefusal> {
        match self.try_reload() {
            Ok(()) => {
                crate::sys::release_freed_memory();
                metrics::record_reload("applied");
                tracing::info!("reloaded configuration and certificates");
                Ok(())
            }
            Err(ReloadRefused { reason, error }) => {
                metrics::record_reload(reason.label());
                tracing::error!(
                    reason = reason.label(),
                    error = format!("{error:#}"),
                    "reload refused; the previous configuration keeps serving"
                );
                Err(reason)
            }
        }
    }

    fn try_reload(&mut self) -> Result<(), ReloadRefused> {
        use ReloadRefusal::*;
        let new = self.source.load().refused_for(Config)?;
        // Everything that can fail is done first (contexts built, new sockets bound); the
        // `[session]` part is committed last of those. What the new configuration shows
        // outside (the certificate-expiry gauge, OCSP fetch timing) follows only once it
        // serves: a refused reload leaves the old configuration's in place.
        let acme_plan = self.acme.prepare(&new).refused_for(Acme)?;
        let fresh =
            build_states(&new, self.builtin, &self.sessions, self.acme()).refused_for(Listeners)?;
        let mut opened = Vec::new();
        for state in &fresh {
            let address = state.config.address();
            if !self.listeners.iter().any(|l| l.address == address) {
                let sockets = bind_per_worker(
                    &state.config,
                    self.workers.len(),
                    self.started_with.accept(),
                )
                .refused_for(Bind)?;
                opened.push((Listener::new(state.clone()), sockets));
            }
        }
        self.sessions.reload(&new.session).refused_for(Sessions)?;
        self.session_config = new.session.clone();
        crate::tls::ocsp_fetch::configure(&new.ocsp);

        let mut unapplied = self.started_with.changed_keys(&new.process_settings());
        if let Err(err) = self.acme.apply(acme_plan) {
            tracing::warn!(
                error = format!("{err:#}"),
                "ACME: part of the new configuration is not applied"
            );
        }
        self.listeners.retain(|listener| {
            match fresh.iter().find(|s| s.config.address() == listener.address) {
                Some(state) => {
                    let limit = "[[listener]] max_connections";
                    if state.config.max_connections != listener.max_connections
                        && !unapplied.contains(&limit)
                    {
                        unapplied.push(limit);
                    }
                    listener.state.store(state.clone());
                    true
                }
                None => {
                    listener.closed.send_replace(true);
                    tracing::info!(address = %listener.address, "listener closed: it accepts no more connections; open ones go on");
                    false
                }
            }
        });
        for (listener, sockets) in opened {
            open(&listener, sockets, &self.workers);
            tracing::info!(address = %listener.address, "listener opened");
            self.listeners.push(listener);
        }
        // `fresh` is now what every listener serves.
        publish_expiry(&fresh, self.acme());
        self.shared
            .log_connections
            .store(new.log.connections, std::sync::atomic::Ordering::Relaxed);
        self.shared
            .log_requests
            .store(new.log.requests, std::sync::atomic::Ordering::Relaxed);
        let offload = OffloadSettings::from_config(&new.engine);
        offload.publish();
        let _ = self.settings.send(offload);
        if !unapplied.is_empty() {
            tracing::warn!(keys = ?unapplied, "changed keys take effect at the next restart");
        }
        Ok(())
    }
}

/// Why a reload was refused: the step that failed. Tests and the `reloads_total` series
/// go by it, not by the log's wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadRefusal {
    /// The configuration file could not be read or is not valid.
    Config,
    /// ACME could not prepare the certificates the new configuration asks for.
    Acme,
    /// A listener could not be built: its certificates, TLS settings or backends.
    Listeners,
    /// A new listener's address could not be bound.
    Bind,
    /// `[session]` could not be applied (e.g. a ticket or fleet key file).
    Sessions,
}

impl ReloadRefusal {
    pub fn label(self) -> &'static str {
        match self {
            ReloadRefusal::Config => "config",
            ReloadRefusal::Acme => "acme",
            ReloadRefusal::Listeners => "listeners",
            ReloadRefusal::Bind => "bind",
            ReloadRefusal::Sessions => "sessions",
        }
    }
}

/// A refused reload: why, and the error to log.
#[derive(Debug)]
pub struct ReloadRefused {
    pub reason: ReloadRefusal,
    pub error: anyhow::Error,
}

/// Tags the error of one reload step with its [`ReloadRefusal`].
trait RefusedFor<T> {
    fn refused_for(self, reason: ReloadRefusal) -> Result<T, ReloadRefused>;
}

impl<T, E: Into<anyhow::Error>> RefusedFor<T> for Result<T, E> {
    fn refused_for(self, reason: ReloadRefusal) -> Result<T, ReloadRefused> {
        self.map_err(|error| ReloadRefused {
            reason,
            error: error.into(),
        })
    }
}
