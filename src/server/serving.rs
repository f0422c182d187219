//! What the main thread keeps while serving, and what it does with it: reload on SIGHUP
//! (new contexts, listeners opened and closed; on any error the old state keeps
//! serving) and installing renewed ACME certificates into running listeners.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use super::listener::{bind_per_worker, open, Listener};
#[cfg(feature = "acme")]
use super::metrics;
#[cfg(not(feature = "acme"))]
use super::state::no_acme_in_this_build;
use super::state::{build_states, publish_expiry, AcmeCertificates};
#[cfg(feature = "acme")]
use super::state::{build_tls, ListenerState};
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
    #[cfg(feature = "acme")]
    pub(super) acme: crate::acme::Acme,
}

impl Serving {
    fn acme(&self) -> AcmeCertificates<'_> {
        #[cfg(feature = "acme")]
        return Some(&self.acme);
        #[cfg(not(feature = "acme"))]
        None
    }

    /// An ACME certificate was installed: each listener that serves ACME names gets new
    /// contexts with it; connections keep the state they started with.
    #[cfg(feature = "acme")]
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

    #[cfg(not(feature = "acme"))]
    pub(super) fn install_acme_certificates(&mut self, never: std::convert::Infallible) {
        match never {}
    }

    /// SIGHUP: re-read configuration and certificates, open new listeners and close
    /// removed ones; on any error keep serving the old ones.
    pub(super) fn reload(&mut self) {
        match self.try_reload() {
            Ok(()) => {
                crate::sys::release_freed_memory();
                tracing::info!("reloaded configuration and certificates");
            }
            Err(err) => tracing::error!(
                error = format!("{err:#}"),
                "reload refused; the previous configuration keeps serving"
            ),
        }
    }

    fn try_reload(&mut self) -> anyhow::Result<()> {
        let new = self.source.load()?;
        // Everything that can fail is done first (contexts built, new sockets bound); the
        // `[session]` part is committed last of those. What the new configuration shows
        // outside (the certificate-expiry gauge, OCSP fetch timing) follows only once it
        // serves: a refused reload leaves the old configuration's in place.
        #[cfg(feature = "acme")]
        let acme_plan = self.acme.prepare(&new)?;
        #[cfg(not(feature = "acme"))]
        no_acme_in_this_build(&new)?;
        let fresh = build_states(&new, self.builtin, &self.sessions, self.acme())?;
        let mut opened = Vec::new();
        for state in &fresh {
            let address = state.config.address();
            if !self.listeners.iter().any(|l| l.address == address) {
                let sockets = bind_per_worker(&state.config, self.workers.len())?;
                opened.push((Listener::new(state.clone()), sockets));
            }
        }
        self.sessions.reload(&new.session)?;
        self.session_config = new.session.clone();
        crate::tls::ocsp_fetch::configure(&new.ocsp);

        let mut unapplied = self.started_with.changed_keys(&new.process_settings());
        #[cfg(feature = "acme")]
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
        let offload = OffloadSettings::from_config(&new.engine);
        offload.publish();
        let _ = self.settings.send(offload);
        if !unapplied.is_empty() {
            tracing::warn!(keys = ?unapplied, "changed keys take effect at the next restart");
        }
        Ok(())
    }
}
