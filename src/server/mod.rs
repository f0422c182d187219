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
mod worker;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;

use crate::config::{Config, ListenerConfig, ProcessSettings, BUILTIN_BACKEND};
use crate::offload::OffloadSettings;
use crate::proxy::pool::BackendPool;
use crate::session::Sessions;
use crate::tls::{CertifiedKey, ServerTls};

/// Everything a connection of one listener needs.
pub struct ListenerState {
    pub config: ListenerConfig,
    pub tls: ServerTls,
    /// The certificates read from files (or the embedded pair), kept so that an ACME
    /// certificate can be installed without reading them again.
    pub file_certificates: Vec<CertifiedKey>,
    /// Backend pools by `ServerTls::profile_index`: 0 is the listener's, then one per
    /// `[[listener.server_name]]` (sharing the listener's when it names no backends).
    pub pools: Vec<Arc<BackendPool>>,
    pub metrics: metrics::ListenerMetrics,
}

impl ListenerState {
    pub fn pool_for(&self, sni: Option<&str>) -> &BackendPool {
        &self.pools[self.tls.profile_index(sni)]
    }
}

/// One configured listener: its state, replaced on reload, and whether it was removed
/// from the configuration (its accept loops then end).
pub struct Listener {
    pub address: SocketAddr,
    /// Its per-worker connection limit, fixed when it opened.
    pub max_connections: usize,
    pub state: ArcSwap<ListenerState>,
    pub closed: watch::Sender<bool>,
}

impl Listener {
    fn new(state: Arc<ListenerState>) -> Arc<Listener> {
        Arc::new(Listener {
            address: state.config.address(),
            max_connections: state.config.max_connections,
            state: ArcSwap::new(state),
            closed: watch::Sender::new(false),
        })
    }
}

/// What the workers share.
pub struct ProcessWide {
    pub log_connections: std::sync::atomic::AtomicBool,
    /// `max_connections` for the whole process (fixed at start).
    pub connection_limit: Arc<tokio::sync::Semaphore>,
}

fn load_certificates(listener: &ListenerConfig) -> anyhow::Result<Vec<CertifiedKey>> {
    if listener.certificates.is_empty() {
        tracing::info!(address = %listener.address(), "no certificate configured: using self-signed RSA-2048 and ECDSA P-256 certificates for localhost");
        return CertifiedKey::self_signed_pair();
    }
    listener
        .certificates
        .iter()
        .map(|c| {
            let read = |path: &PathBuf| {
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
            };
            let mut certified = CertifiedKey::from_pem(
                &read(c.cert.get_ref())?,
                &read(c.key.get_ref())?,
                &c.names,
                c.default,
            )
            .with_context(|| format!("certificate {}", c.cert.get_ref().display()))?;
            certified.ocsp = c
                .ocsp
                .as_ref()
                .map(|path| read(path.get_ref()))
                .transpose()?;
            if c.ocsp_fetch {
                let slot = crate::tls::ocsp_fetch::register(
                    &certified.chain,
                    certified.ocsp.as_deref(),
                    &certified.names,
                )
                .with_context(|| {
                    format!(
                        "certificate {}: key `ocsp_fetch`",
                        c.cert.get_ref().display()
                    )
                })?;
                certified.ocsp_fetch = Some(slot);
            }
            Ok(certified)
        })
        .collect()
}

fn resolve_backends(
    backends: &[String],
    builtin: Option<SocketAddr>,
) -> anyhow::Result<Vec<SocketAddr>> {
    backends
        .iter()
        .map(|backend| {
            if backend == BUILTIN_BACKEND {
                return builtin.context("built-in backend not running");
            }
            backend
                .to_socket_addrs()
                .with_context(|| format!("cannot resolve backend {backend}"))?
                .next()
                .with_context(|| format!("backend {backend} resolves to no address"))
        })
        .collect()
}

/// The certificates ACME provides for a listener (none in a build without ACME).
#[cfg(feature = "acme")]
type AcmeCertificates<'a> = Option<&'a crate::acme::Acme>;
#[cfg(not(feature = "acme"))]
type AcmeCertificates<'a> = Option<&'a std::convert::Infallible>;

fn acme_certificates(acme: AcmeCertificates<'_>, listener: &ListenerConfig) -> Vec<CertifiedKey> {
    #[cfg(feature = "acme")]
    return acme.map_or_else(Vec::new, |acme| {
        acme.certificates(&listener.acme_certificates)
    });
    #[cfg(not(feature = "acme"))]
    {
        let _ = (acme, listener);
        Vec::new()
    }
}

/// A listener's TLS from its file certificates and the ACME ones it has now.
fn build_tls(
    listener: &ListenerConfig,
    file_certificates: &[CertifiedKey],
    acme: AcmeCertificates<'_>,
    sessions: &Sessions,
    session_config: &crate::config::SessionConfig,
) -> anyhow::Result<ServerTls> {
    let mut certs = file_certificates.to_vec();
    certs.extend(acme_certificates(acme, listener));
    ServerTls::build(listener, certs, sessions, session_config)
        .with_context(|| format!("listener {}", listener.address()))
}

#[cfg(not(feature = "acme"))]
fn no_acme_in_this_build(config: &Config) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.acme.is_none(),
        "this build has no ACME (feature acme): remove [acme]"
    );
    Ok(())
}

/// Publishes the expiry of every certificate the listeners serve.
fn publish_expiry(states: &[Arc<ListenerState>], acme: AcmeCertificates<'_>) {
    let acme: Vec<CertifiedKey> = states
        .iter()
        .flat_map(|s| acme_certificates(acme, &s.config))
        .collect();
    crate::tls::expiry::publish(
        states
            .iter()
            .flat_map(|s| &s.file_certificates)
            .chain(&acme),
    );
}

/// Builds every listener's state; fails as a whole so a broken reload changes nothing.
pub fn build_states(
    config: &Config,
    builtin: Option<SocketAddr>,
    sessions: &Sessions,
    acme: AcmeCertificates<'_>,
) -> anyhow::Result<Vec<Arc<ListenerState>>> {
    let states = config
        .listeners
        .iter()
        .map(|listener| {
            let file_certificates = load_certificates(listener)?;
            let tls = build_tls(
                listener,
                &file_certificates,
                acme,
                sessions,
                &config.session,
            )?;
            let pool = |backends: &[String]| -> anyhow::Result<Arc<BackendPool>> {
                Ok(Arc::new(BackendPool::new(
                    resolve_backends(backends, builtin)?,
                    listener.connect_timeout,
                    listener.backend_retry,
                )))
            };
            let listener_pool = pool(listener.backends.get_ref())?;
            let mut pools = vec![listener_pool.clone()];
            for server_name in &listener.server_names {
                pools.push(match &server_name.backends {
                    Some(backends) => pool(backends.get_ref())?,
                    None => listener_pool.clone(),
                });
            }
            Ok(Arc::new(ListenerState {
                config: listener.clone(),
                tls,
                file_certificates,
                pools,
                metrics: metrics::ListenerMetrics::new(listener.address()),
            }))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    publish_expiry(&states, acme);
    Ok(states)
}

fn uses_builtin(config: &Config) -> bool {
    config
        .listeners
        .iter()
        .flat_map(|l| {
            let per_name = l.server_names.iter().filter_map(|n| n.backends.as_ref());
            std::iter::once(&l.backends).chain(per_name)
        })
        .any(|backends| backends.get_ref().iter().any(|b| b == BUILTIN_BACKEND))
}

/// A listening socket with SO_REUSEPORT, so every worker can have its own.
fn bind_reuseport(address: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket
        .bind(&address.into())
        .with_context(|| format!("cannot bind {address}"))?;
    socket.listen(1024)?;
    Ok(socket.into())
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
    #[cfg(feature = "acme")]
    let (mut acme, mut acme_installed) = crate::acme::Acme::new();
    #[cfg(feature = "acme")]
    let acme_plan = acme.prepare(&config)?;
    #[cfg(feature = "acme")]
    let states = build_states(&config, builtin, &sessions, Some(&acme))?;
    #[cfg(not(feature = "acme"))]
    let states = {
        no_acme_in_this_build(&config)?;
        build_states(&config, builtin, &sessions, None)?
    };
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
        .map(|l| bind_per_worker(l.address, workers))
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
    #[cfg(feature = "acme")]
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
        #[cfg(feature = "acme")]
        acme,
    };
    runtime.block_on(async {
        // Connection bursts leave their buffers in glibc's arenas; hand the free pages
        // back now and then so the resident size follows the load down again.
        let mut trim = tokio::time::interval(std::time::Duration::from_secs(10));
        loop {
            #[cfg(feature = "acme")]
            let installed = acme_installed.recv();
            #[cfg(not(feature = "acme"))]
            let installed = std::future::pending::<Option<std::convert::Infallible>>();
            tokio::select! {
                _ = hangup.recv() => running.reload(),
                Some(announced) = installed => running.install_acme_certificates(announced),
                _ = terminate.recv() => break,
                _ = interrupt.recv() => break,
                _ = trim.tick() => crate::sys::release_freed_memory(),
            }
        }
        tracing::info!(drain_timeout = ?config.drain_timeout, "stopping: no new connections, draining open ones");
        crate::metrics::admin::set_stopping();
        let _ = shutdown_tx.send(true);
        anyhow::Ok(())
    })?;
    for handle in handles {
        let _ = handle.join();
    }
    tracing::info!("stopped");
    Ok(())
}

/// One listening socket for each worker.
fn bind_per_worker(
    address: SocketAddr,
    workers: usize,
) -> anyhow::Result<Vec<std::net::TcpListener>> {
    (0..workers).map(|_| bind_reuseport(address)).collect()
}

/// Hands each worker its socket of `listener`; each starts accepting on it.
fn open(
    listener: &Arc<Listener>,
    sockets: Vec<std::net::TcpListener>,
    workers: &[UnboundedSender<worker::Command>],
) {
    for (worker, socket) in workers.iter().zip(sockets) {
        // A worker that has ended (only while stopping) needs no socket.
        let _ = worker.send(worker::Command::Open {
            listener: listener.clone(),
            socket,
        });
    }
}

/// What the main thread keeps while serving, to apply reloads.
struct Serving {
    source: ConfigSource,
    started_with: ProcessSettings,
    listeners: Vec<Arc<Listener>>,
    /// Each worker's command channel.
    workers: Vec<UnboundedSender<worker::Command>>,
    shared: Arc<ProcessWide>,
    builtin: Option<SocketAddr>,
    sessions: Sessions,
    /// The `[session]` settings in force (ACME installs build contexts with them).
    session_config: crate::config::SessionConfig,
    settings: watch::Sender<OffloadSettings>,
    #[cfg(feature = "acme")]
    acme: crate::acme::Acme,
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
    fn install_acme_certificates(&mut self, announced: crate::acme::Announcement) {
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
    fn install_acme_certificates(&mut self, never: std::convert::Infallible) {
        match never {}
    }

    /// SIGHUP: re-read configuration and certificates, open new listeners and close
    /// removed ones; on any error keep serving the old ones.
    fn reload(&mut self) {
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
        // `[session]` part is committed last of those.
        #[cfg(feature = "acme")]
        let acme_plan = self.acme.prepare(&new)?;
        #[cfg(not(feature = "acme"))]
        no_acme_in_this_build(&new)?;
        let fresh = build_states(&new, self.builtin, &self.sessions, self.acme())?;
        let mut opened = Vec::new();
        for state in &fresh {
            let address = state.config.address();
            if !self.listeners.iter().any(|l| l.address == address) {
                let sockets = bind_per_worker(address, self.workers.len())?;
                opened.push((Listener::new(state.clone()), sockets));
            }
        }
        crate::tls::ocsp_fetch::configure(&new.ocsp);
        self.sessions.reload(&new.session)?;
        self.session_config = new.session.clone();

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
