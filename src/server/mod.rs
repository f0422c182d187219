//! `tlsterm serve`: the workers, their listeners, reload and shutdown.
//!
//! One worker per core, each a thread with its own single-threaded runtime and its own
//! SO_REUSEPORT socket per listener: the kernel spreads connections over the workers and
//! a connection lives its whole life on one core. What workers share is read-mostly and
//! swapped whole on reload (`arc_swap`): a connection keeps the state it started with, so
//! a reload never touches established connections. A reload also opens listeners new to
//! the configuration (sockets bound first, so a taken port refuses the reload) and closes
//! removed ones: they stop accepting, and their connections go on.

mod conn;
mod failure;
mod metrics;
mod read_ahead;
mod worker;

mod listener;
mod notify;
mod serving;
mod state;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use crate::offload::OffloadSettings;
use crate::session::Sessions;
use listener::{bind_per_worker, open, Listener};
use serving::Serving;
pub use state::{build_states, ListenerState};
use state::{publish_expiry, uses_builtin};

/// What the workers share.
pub struct ProcessWide {
    pub log_connections: std::sync::atomic::AtomicBool,
    /// `max_connections` for the whole process (fixed at start).
    pub connection_limit: Arc<tokio::sync::Semaphore>,
}

/// Where `serve` gets its configuration from, for start and reload.
pub enum ConfigSource {
    File(PathBuf),
    Embedded,
}

impl ConfigSource {
    pub fn load(&self) -> anyhow::Result<Config> {
        match self {
            ConfigSource::File(path) => Ok(Config::load(path)?),
            ConfigSource::Embedded => Ok(Config::embedded_default()),
        }
    }
}

/// Runs the server until SIGTERM/SIGINT and the drain that follows.
pub fn run(source: ConfigSource) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Signal handlers first: a SIGHUP sent as soon as the process exists (say, while thousands
    // of certificates load) must reload, not kill it; it is acted on once serving.
    let (mut hangup, mut terminate, mut interrupt) = {
        use tokio::signal::unix::{signal, SignalKind};
        let _runtime = runtime.enter();
        (
            signal(SignalKind::hangup())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        )
    };
    let config = source.load()?;
    let builtin = if uses_builtin(&config) {
        Some(crate::proxy::builtin_backend::spawn_builtin()?)
    } else {
        None
    };
    let sessions = Sessions::new(&config.session)?;
    sessions.start_background();
    crate::tls::ocsp_fetch::configure(&config.ocsp);
    let (mut acme, mut acme_installed) = crate::acme::Acme::new();
    let acme_plan = acme.prepare(&config)?;
    let states = build_states(&config, builtin, &sessions, Some(&acme))?;
    publish_expiry(&states, Some(&acme));
    let early_data = config.listeners.iter().any(|l| *l.early_data.get_ref());
    if early_data && config.session.ticket_key_file.is_some() && config.session.redis_url.is_none()
    {
        // Shared ticket keys let other processes resume these tickets, but the anti-replay
        // memory is this process's own.
        tracing::warn!("early_data with a ticket_key_file but no redis_url: a 0-RTT ClientHello is refused as a replay only by the process that saw it (max_early_data bounds what a copy sent to another process delivers); 0-RTT stays off for the first {} s after start", crate::session::replay::WINDOW.as_secs());
    }
    let workers = config.worker_count();
    let listeners: Vec<Arc<Listener>> = states.into_iter().map(Listener::new).collect();
    let shared = Arc::new(ProcessWide {
        log_connections: config.log.connections.into(),
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
    let (settings_tx, settings_rx) = watch::channel(offload);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let sockets = listeners
        .iter()
        .map(|l| bind_per_worker(&l.state.load().config, workers, config.accept))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut handles = Vec::new();
    let mut commands = Vec::new();
    for index in 0..workers {
        let (command_tx, command_rx) = tokio::sync::mpsc::unbounded_channel();
        commands.push(command_tx);
        let worker = worker::Worker {
            index,
            commands: command_rx,
            shared: shared.clone(),
            settings: settings_rx.clone(),
            shutdown: shutdown_rx.clone(),
            drain_timeout: config.drain_timeout,
            pin: config.pin_workers,
        };
        handles.push(
            std::thread::Builder::new()
                .name(format!("worker-{index}"))
                .spawn(move || worker.run())?,
        );
    }
    for (listener, sockets) in listeners.iter().zip(sockets) {
        open(listener, sockets, &commands);
    }
    let addresses: Vec<String> = config
        .listeners
        .iter()
        .map(|l| l.address().to_string())
        .collect();
    if let Some(admin) = admin {
        admin.start()?;
    }
    {
        let _runtime = runtime.enter();
        acme.apply(acme_plan)?;
    }
    let admin_address = config.admin.enabled.then_some(config.admin.address);
    tracing::info!(workers, listeners = ?addresses, admin = ?admin_address, signing = offload.signing(), kernel = offload.kernel_name(), "tlsterm serving");

    let mut running = Serving {
        source,
        started_with: config.process_settings(),
        listeners,
        workers: commands,
        shared,
        builtin,
        sessions,
        session_config: config.session.clone(),
        settings: settings_tx,
        acme,
    };
    notify::ready(&running.status());
    runtime.block_on(async {
        // Connection bursts leave their buffers in glibc's arenas; hand the free pages
        // back now and then so the resident size follows the load down again.
        let mut trim = tokio::time::interval(std::time::Duration::from_secs(10));
        loop {
            let installed = acme_installed.recv();
            tokio::select! {
                _ = hangup.recv() => {
                    notify::reloading();
                    running.reload();
                    notify::ready(&running.status());
                }
                Some(announced) = installed => running.install_acme_certificates(announced),
                _ = terminate.recv() => break,
                _ = interrupt.recv() => break,
                _ = trim.tick() => crate::sys::release_freed_memory(),
            }
        }
        // /healthz says so before the log does: whoever reads the line finds it answering 503.
        crate::metrics::admin::set_stopping();
        notify::stopping();
        tracing::info!(drain_timeout = ?config.drain_timeout, "stopping: no new connections, draining open ones");
        let _ = shutdown_tx.send(true);
        anyhow::Ok(())
    })?;
    for handle in handles {
        let _ = handle.join();
    }
    tracing::info!("stopped");
    Ok(())
}
