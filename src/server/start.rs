//! The first half of `serve`: everything that can fail before a connection is taken. The
//! configuration is read and checked, every listener's state built (certificates, TLS
//! contexts, backends), the sockets bound, the admin listener bound and the workers made
//! ready. An error is returned and nothing has been served; [`super::serve`] then starts
//! what [`Bound`] holds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;

use super::listener::{bind_per_worker, Listener, WorkerSockets};
use super::serving::Serving;
use super::state::{build_states, publish_expiry, uses_builtin};
use super::{metrics, worker, ConfigSource, ProcessWide, Reloads};
use crate::config::Config;
use crate::offload::OffloadSettings;
use crate::session::Sessions;

/// A server ready to serve: its listeners' sockets bound (connections wait in their
/// queues), its workers' state built; nothing accepted yet. [`super::serve`] runs it.
pub struct Bound {
    pub(super) serving: Serving,
    /// The workers, not started yet, in the order of `serving.workers`.
    pub(super) workers: Vec<worker::Worker>,
    /// Each listener's sockets, one per worker, in the order of `serving.listeners`.
    pub(super) sockets: Vec<Vec<WorkerSockets>>,
    pub(super) admin: Option<crate::metrics::admin::Admin>,
    pub(super) admin_address: Option<SocketAddr>,
    pub(super) acme_plan: crate::acme::Plan,
    /// ACME certificates installed while serving, to be put into the listeners.
    pub(super) acme_installed: UnboundedReceiver<crate::acme::Announcement>,
    pub(super) shutdown: watch::Sender<bool>,
    pub(super) reloads: watch::Sender<Reloads>,
    pub(super) drain_timeout: Duration,
}

impl Bound {
    /// The address of each listener, in the configuration's order. A listener configured
    /// on port 0 has the port the kernel gave it; a reload keeps the listener only if its
    /// configuration names that port (port 0 again opens a new listener elsewhere).
    pub fn listener_addresses(&self) -> Vec<SocketAddr> {
        self.serving.listeners.iter().map(|l| l.address).collect()
    }

    /// The reloads `serve` has done, applied or refused: a caller that asks for one with
    /// [`super::Event::Reload`] waits here for its outcome.
    pub fn reloads(&self) -> watch::Receiver<Reloads> {
        self.reloads.subscribe()
    }
}

/// Reads the configuration from `source` and prepares everything it asks for (see the
/// module's description); serves nothing.
pub fn bind(source: ConfigSource) -> anyhow::Result<Bound> {
    let mut config = source.load()?;
    let workers = config.worker_count();
    let resolved = bind_port_zero(&mut config, workers)?;
    let builtin = if uses_builtin(&config) {
        Some(crate::proxy::builtin_backend::spawn_builtin()?)
    } else {
        None
    };
    let sessions = Sessions::new(&config.session)?;
    sessions.start_background();
    crate::tls::ocsp_fetch::configure(&config.ocsp);
    let (acme, acme_installed) = crate::acme::Acme::new();
    let acme_plan = acme.prepare(&config)?;
    let states = build_states(&config, builtin, &sessions, Some(&acme))?;
    publish_expiry(&states, Some(&acme));
    warn_of_unshared_replay_memory(&config);
    let listeners: Vec<Arc<Listener>> = states.into_iter().map(Listener::new).collect();
    let shared = Arc::new(ProcessWide {
        log_connections: config.log.connections.into(),
        log_requests: config.log.requests.into(),
        connection_limit: Arc::new(tokio::sync::Semaphore::new(config.max_connections)),
    });
    crate::metrics::set_enabled(config.admin.enabled);
    metrics::register_all();
    let admin = match config.admin.enabled {
        true => Some(crate::metrics::admin::bind(config.admin.address)?),
        false => None,
    };
    let offload = OffloadSettings::from_config(&config.engine);
    offload.publish();
    let (settings, settings_rx) = watch::channel(offload);
    let (shutdown, shutdown_rx) = watch::channel(false);

    let sockets = listeners
        .iter()
        .zip(resolved)
        .map(|(listener, bound)| match bound {
            Some(sockets) => Ok(sockets),
            None => bind_per_worker(&listener.state.load().config, workers, config.accept),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (commands, workers) = prepare_workers(&config, workers, &shared, settings_rx, shutdown_rx);
    Ok(Bound {
        serving: Serving {
            source,
            started_with: config.process_settings(),
            listeners,
            workers: commands,
            shared,
            builtin,
            sessions,
            session_config: config.session.clone(),
            settings,
            acme,
        },
        workers,
        sockets,
        admin,
        admin_address: config.admin.enabled.then_some(config.admin.address),
        acme_plan,
        acme_installed,
        shutdown,
        reloads: watch::Sender::new(Reloads::default()),
        drain_timeout: config.drain_timeout,
    })
}

/// `count` workers, not started, and the channel to each that hands it its sockets.
fn prepare_workers(
    config: &Config,
    count: usize,
    shared: &Arc<ProcessWide>,
    settings: watch::Receiver<OffloadSettings>,
    shutdown: watch::Receiver<bool>,
) -> (Vec<UnboundedSender<worker::Command>>, Vec<worker::Worker>) {
    (0..count)
        .map(|index| {
            let (command_tx, commands) = unbounded_channel();
            let worker = worker::Worker {
                index,
                commands,
                shared: shared.clone(),
                settings: settings.clone(),
                shutdown: shutdown.clone(),
                drain_timeout: config.drain_timeout,
                pin: config.pin_workers,
            };
            (command_tx, worker)
        })
        .unzip()
}

/// Binds the listeners configured on port 0 now, before their state is built, and writes
/// the port the kernel gave each into the configuration: the state, its metrics, the log
/// and a reload's comparison of listeners all name the port served on. The others are
/// bound once their state is built (`None`), as at every start.
fn bind_port_zero(
    config: &mut Config,
    workers: usize,
) -> anyhow::Result<Vec<Option<Vec<WorkerSockets>>>> {
    let accept = config.accept;
    config
        .listeners
        .iter_mut()
        .map(|listener| {
            if listener.address().port() != 0 {
                return Ok(None);
            }
            if listener.quic_address().is_some_and(|quic| quic.port() == 0) {
                // Each worker's UDP socket would get a port of its own.
                anyhow::bail!(
                    "listener {}: HTTP/3 needs a port: set its address or quic_address",
                    listener.address()
                );
            }
            let sockets = bind_per_worker(listener, workers, accept)?;
            *listener.address_spanned.get_mut() = sockets[0].address()?;
            Ok(Some(sockets))
        })
        .collect()
}

/// Shared ticket keys let other processes resume this one's tickets, but the anti-replay
/// memory is this process's own unless Redis shares it: say so at start.
fn warn_of_unshared_replay_memory(config: &Config) {
    let early_data = config.listeners.iter().any(|l| *l.early_data.get_ref());
    if early_data && config.session.ticket_key_file.is_some() && config.session.redis_url.is_none()
    {
        tracing::warn!("early_data with a ticket_key_file but no redis_url: a 0-RTT ClientHello is refused as a replay only by the process that saw it (max_early_data bounds what a copy sent to another process delivers); 0-RTT stays off for the first {} s after start", crate::session::replay::WINDOW.as_secs());
    }
}
