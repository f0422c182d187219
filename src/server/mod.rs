//! `tlsterm serve`: the workers, their listeners, reload and shutdown.
//!
//! One worker per core, each a thread with its own single-threaded runtime and its own
//! SO_REUSEPORT socket per listener: the kernel spreads connections over the workers and
//! a connection lives its whole life on one core. What workers share is read-mostly and
//! swapped whole on reload (`arc_swap`): a connection keeps the state it started with, so
//! a reload never touches established connections. A reload also opens listeners new to
//! the configuration (sockets bound first, so a taken port refuses the reload) and closes
//! removed ones: they stop accepting, and their connections go on.
//!
//! Serving comes in two steps. [`bind`] does everything that can fail at start (the
//! configuration read and checked, certificates loaded, sockets bound) and returns the
//! error, having served nothing; [`serve`] then starts the workers and serves until told
//! to stop. It is told through a channel of [`Event`]s: `tlsterm serve` sends them on
//! SIGHUP, SIGTERM and SIGINT; a test or an embedding program sends them itself.

mod conn;
mod failure;
mod http;
mod metrics;
mod read_ahead;
mod worker;

mod listener;
mod notify;
mod serving;
mod start;
mod state;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::config::Config;
use listener::{open, Listener};
pub use serving::ReloadRefusal;
use serving::Serving;
pub use start::{bind, Bound};
pub use state::{build_states, ListenerState};

/// What the workers share.
pub struct ProcessWide {
    pub log_connections: std::sync::atomic::AtomicBool,
    pub log_requests: std::sync::atomic::AtomicBool,
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

/// What a running server is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Re-read the configuration and certificates; a refused reload leaves the running
    /// state serving (`tlsterm serve`: SIGHUP).
    Reload,
    /// Stop accepting, let open connections finish within `drain_timeout`, then return
    /// (`tlsterm serve`: SIGTERM, SIGINT).
    Stop,
}

/// The reloads [`serve`] has done, published as each ends (see [`Bound::reloads`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reloads {
    /// How many, applied or refused.
    pub done: u64,
    /// The last one's outcome: applied, or refused and why.
    pub last: Option<Result<(), ReloadRefusal>>,
}

/// Serves what [`bind`] prepared until [`Event::Stop`] (or until every sender of `events`
/// is gone), then drains: returns once the workers' connections have closed or their
/// `drain_timeout` has passed. Runs on the caller's runtime (a current-thread one is
/// enough: the workers have their own); ACME's tasks are spawned on it.
pub async fn serve(bound: Bound, mut events: mpsc::Receiver<Event>) -> anyhow::Result<()> {
    let Bound {
        mut serving,
        workers,
        sockets,
        admin,
        admin_address,
        acme_plan,
        mut acme_installed,
        shutdown,
        reloads,
        drain_timeout,
    } = bound;
    let mut handles = Vec::new();
    for worker in workers {
        handles.push(
            std::thread::Builder::new()
                .name(format!("worker-{}", worker.index))
                .spawn(move || worker.run())?,
        );
    }
    for (listener, sockets) in serving.listeners.iter().zip(sockets) {
        open(listener, sockets, &serving.workers);
    }
    if let Some(admin) = admin {
        admin.start()?;
    }
    serving.acme.apply(acme_plan)?;
    let addresses: Vec<String> = serving
        .listeners
        .iter()
        .map(|l| l.address.to_string())
        .collect();
    let offload = *serving.settings.borrow();
    tracing::info!(workers = handles.len(), listeners = ?addresses, admin = ?admin_address, signing = offload.signing(), kernel = offload.kernel_name(), "tlsterm serving");
    notify::ready(&serving.status());

    serve_until_stopped(&mut serving, &mut events, &mut acme_installed, &reloads).await;
    // /healthz and the workers are told before the log says so: whoever reads the line
    // finds /healthz answering 503 and every connection's task able to see the stop.
    crate::metrics::admin::set_stopping();
    notify::stopping();
    let _ = shutdown.send(true);
    tracing::info!(drain_timeout = ?drain_timeout, "stopping: no new connections, draining open ones");
    // The workers end once drained; wait for them off this runtime, which goes on running
    // whatever else the caller has on it.
    tokio::task::spawn_blocking(move || {
        for handle in handles {
            let _ = handle.join();
        }
    })
    .await?;
    tracing::info!("stopped");
    Ok(())
}

/// The main loop: reloads and stop as `events` ask, ACME certificates as they are
/// installed. Returns when asked to stop.
async fn serve_until_stopped(
    serving: &mut Serving,
    events: &mut mpsc::Receiver<Event>,
    acme_installed: &mut mpsc::UnboundedReceiver<crate::acme::Announcement>,
    reloads: &watch::Sender<Reloads>,
) {
    // Connection bursts leave their buffers in glibc's arenas; hand the free pages back
    // now and then so the resident size follows the load down again.
    let mut trim = tokio::time::interval(std::time::Duration::from_secs(10));
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(Event::Reload) => {
                    notify::reloading();
                    let outcome = serving.reload();
                    notify::ready(&serving.status());
                    reloads.send_modify(|reloads| {
                        reloads.done += 1;
                        reloads.last = Some(outcome);
                    });
                }
                Some(Event::Stop) | None => return,
            },
            Some(announced) = acme_installed.recv() => serving.install_acme_certificates(announced),
            _ = trim.tick() => crate::sys::release_freed_memory(),
        }
    }
}
