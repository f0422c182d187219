//! One worker: a thread, a single-threaded runtime, one listening socket per listener,
//! handed to it by the main thread at start and when a reload opens a listener.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::LocalSet;

use super::{conn, Listener, ProcessWide};
use crate::offload::{self, OffloadSettings};

/// What the main thread asks of a worker.
pub enum Command {
    /// Accept connections for `listener` on `socket` (this worker's SO_REUSEPORT socket),
    /// until the listener is closed or the server stops.
    Open {
        listener: Arc<Listener>,
        socket: std::net::TcpListener,
        /// Its UDP socket for HTTP/3, when the listener has one.
        quic: Option<std::net::UdpSocket>,
    },
}

pub struct Worker {
    pub index: usize,
    pub commands: mpsc::UnboundedReceiver<Command>,
    pub shared: Arc<ProcessWide>,
    pub settings: watch::Receiver<OffloadSettings>,
    pub shutdown: watch::Receiver<bool>,
    pub drain_timeout: Duration,
    pub pin: bool,
}

impl Worker {
    pub fn run(self) {
        if self.pin {
            let cores = core_affinity::get_core_ids().unwrap_or_default();
            if let Some(core) = cores.get(self.index % cores.len().max(1)) {
                core_affinity::set_for_current(*core);
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("worker runtime");
        let local = LocalSet::new();
        local.block_on(&runtime, self.serve());
    }

    async fn serve(mut self) {
        super::metrics::register_worker(self.index);
        tokio::task::spawn_local(async {
            let mut every_second = tokio::time::interval(Duration::from_secs(1));
            loop {
                every_second.tick().await;
                super::metrics::sample_worker_cpu();
            }
        });
        let mut settings = self.settings.clone();
        offload::install_worker_queue(*settings.borrow_and_update());
        tokio::task::spawn_local(async move {
            while settings.changed().await.is_ok() {
                offload::install_worker_queue(*settings.borrow_and_update());
            }
        });

        // Per listener (closed ones included: their connections go on until they end).
        let mut limits = Vec::new();
        let mut shutdown = self.shutdown.clone();
        loop {
            let command = tokio::select! {
                command = self.commands.recv() => command,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            let Some(Command::Open {
                listener,
                socket,
                quic,
            }) = command
            else {
                // The main thread is gone: it only returns after stopping us.
                let _ = shutdown.wait_for(|stop| *stop).await;
                break;
            };
            if let Some(socket) = quic {
                limits.push(serve_quic(
                    self.index,
                    &listener,
                    socket,
                    &self.shared,
                    &self.shutdown,
                ));
            }
            let max_connections = listener.max_connections;
            let limit = Arc::new(Semaphore::new(max_connections));
            limits.push((limit.clone(), max_connections));
            match TcpListener::from_std(socket) {
                Ok(socket) => {
                    tokio::task::spawn_local(accept_loop(
                        listener,
                        socket,
                        limit,
                        self.shared.clone(),
                        self.shutdown.clone(),
                    ));
                }
                Err(err) => {
                    tracing::error!(worker = self.index, address = %listener.address, error = %err, "cannot accept on listener")
                }
            }
        }
        // Accept loops have stopped; wait until every permit is back (all connections closed).
        let drained = async {
            for (limit, total) in &limits {
                let _ = limit.acquire_many(*total as u32).await;
            }
        };
        if tokio::time::timeout(self.drain_timeout, drained)
            .await
            .is_err()
        {
            tracing::warn!(
                worker = self.index,
                "drain deadline reached; closing remaining connections"
            );
        }
    }
}

/// Starts the worker's QUIC endpoint of `listener`; its connections' permits, for drain.
fn serve_quic(
    worker: usize,
    listener: &Arc<Listener>,
    socket: std::net::UdpSocket,
    shared: &ProcessWide,
    shutdown: &watch::Receiver<bool>,
) -> (Arc<Semaphore>, usize) {
    let total = *listener.state.load().config.quic_max_connections.get_ref();
    let limit = Arc::new(Semaphore::new(total));
    // Stops on SIGTERM or when a reload removes the listener.
    let (stop_tx, stop) = watch::channel(false);
    let (mut closed, mut shutdown) = (listener.closed.subscribe(), shutdown.clone());
    tokio::task::spawn_local(async move {
        tokio::select! {
            _ = closed.wait_for(|closed| *closed) => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
        let _ = stop_tx.send(true);
    });
    let state = listener.clone();
    tokio::task::spawn_local(crate::quic::serve(crate::quic::Endpoint {
        worker,
        socket,
        current: move || state.state.load().quic.clone(),
        limit: limit.clone(),
        process_limit: shared.connection_limit.clone(),
        stop,
    }));
    (limit, total)
}

/// Why an accept loop ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    Shutdown,
    /// A reload removed the listener.
    Closed,
}

/// Accepts connections for `listener` until it is closed or the server stops; dropping
/// `socket` then closes this worker's listening socket. A closed listener first serves the
/// connections already waiting in its accept queue: for their clients they are connected.
async fn accept_loop(
    listener: Arc<Listener>,
    socket: TcpListener,
    limit: Arc<Semaphore>,
    shared: Arc<ProcessWide>,
    shutdown: watch::Receiver<bool>,
) {
    let mut closed = listener.closed.subscribe();
    let mut on_shutdown = shutdown.clone();
    let mut stop = async || {
        tokio::select! {
            _ = on_shutdown.wait_for(|stop| *stop) => Stop::Shutdown,
            _ = closed.wait_for(|closed| *closed) => Stop::Closed,
        }
    };
    let why = loop {
        // At the limit, stop accepting (the kernel's backlog holds new clients) until a
        // connection closes, rather than accepting and failing.
        let permit = tokio::select! {
            permit = limit.clone().acquire_owned() => permit.expect("semaphore never closed"),
            why = stop() => break why,
        };
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            why = stop() => break why,
        };
        match accepted {
            Ok((stream, client)) => {
                let Some(global) = global_permit(&shared, shutdown.clone()).await else {
                    return;
                };
                start(
                    &listener,
                    &shared,
                    stream,
                    client,
                    (permit, global),
                    shutdown.clone(),
                );
            }
            Err(err) => {
                let exhausted = matches!(
                    err.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                );
                if exhausted {
                    // Out of descriptors: back off instead of spinning on a ready listener.
                    tracing::warn!(error = %err, "accept failed, backing off");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                } else {
                    tracing::debug!(error = %err, "accept failed");
                }
            }
        }
    };
    if why == Stop::Closed {
        let queue = serve_accept_queue(&listener, socket, &limit, &shared, shutdown);
        // Waiting for permits must not keep a removed listener's socket open for long:
        // while it is open the kernel queues new clients on it, to be reset at its close.
        let _ = tokio::time::timeout(ACCEPT_QUEUE_DEADLINE, queue).await;
    }
}

/// The process-wide connection limit, shared by every worker and listener. It is taken
/// after accept: a worker waiting in accept() on its own SO_REUSEPORT socket must not hold
/// a permit that a worker with a pending connection needs. At the limit each worker holds
/// at most one accepted connection, untouched, until a permit frees; only the server
/// stopping (`None`) drops it.
async fn global_permit(
    shared: &ProcessWide,
    mut shutdown: watch::Receiver<bool>,
) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        permit = shared.connection_limit.clone().acquire_owned() => Some(permit.expect("semaphore never closed")),
        _ = shutdown.wait_for(|stop| *stop) => None,
    }
}

/// Serves an accepted connection; `permits` (listener, process) are held until it ends;
/// `stop` turns true when the process drains.
fn start(
    listener: &Listener,
    shared: &ProcessWide,
    stream: TcpStream,
    client: SocketAddr,
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    stop: watch::Receiver<bool>,
) {
    let state = listener.state.load_full();
    let log = conn::Logging {
        connections: shared.log_connections.load(Ordering::Relaxed),
        requests: shared.log_requests.load(Ordering::Relaxed),
    };
    let connection = conn::handle(stream, client, state, log, stop, permits);
    tokio::task::spawn_local(connection);
}

/// The longest a removed listener's socket stays open to serve its accept queue.
const ACCEPT_QUEUE_DEADLINE: Duration = Duration::from_secs(5);

/// A removed listener's socket: serves the connections the kernel had completed when the
/// listener closed (those that arrive while this runs are reset when the socket closes).
async fn serve_accept_queue(
    listener: &Listener,
    socket: TcpListener,
    limit: &Arc<Semaphore>,
    shared: &ProcessWide,
    mut shutdown: watch::Receiver<bool>,
) {
    let waiting = crate::sys::accept_queue_len(&socket);
    if waiting == 0 {
        return;
    }
    tracing::info!(address = %listener.address, waiting, "listener closed: serving the connections waiting in its accept queue");
    // Accepted directly, not through tokio: its readiness may be stale (and its task
    // budget may run out), and that would read as an empty queue.
    let Ok(socket) = socket.into_std() else {
        return;
    };
    for _ in 0..waiting {
        let permit = tokio::select! {
            permit = limit.clone().acquire_owned() => permit.expect("semaphore never closed"),
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        // The socket is non-blocking: an empty queue (a client gave up) ends the loop.
        let (stream, client) = match socket.accept() {
            Ok(accepted) => accepted,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(err) => {
                tracing::debug!(error = %err, "accept failed");
                continue;
            }
        };
        let stream = match stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(stream))
        {
            Ok(stream) => stream,
            Err(err) => {
                tracing::debug!(error = %err, "accepted connection unusable");
                continue;
            }
        };
        let Some(global) = global_permit(shared, shutdown.clone()).await else {
            return;
        };
        start(
            listener,
            shared,
            stream,
            client,
            (permit, global),
            shutdown.clone(),
        );
    }
}
