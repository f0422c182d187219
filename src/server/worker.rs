//! One worker: a thread, a single-threaded runtime, one listening socket per listener,
//! handed to it by the main thread at start and when a reload opens a listener.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::LocalSet;

use super::{conn, Listener, Shared};
use crate::offload::{self, OffloadSettings};

/// What the main thread asks of a worker.
pub enum Command {
    /// Accept connections for `listener` on `socket` (this worker's SO_REUSEPORT socket),
    /// until the listener is closed or the server stops.
    Open {
        listener: Arc<Listener>,
        socket: std::net::TcpListener,
    },
}

pub struct Worker {
    pub index: usize,
    pub commands: mpsc::UnboundedReceiver<Command>,
    pub shared: Arc<Shared>,
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
        crate::metrics::register_worker(self.index);
        tokio::task::spawn_local(async {
            let mut every_second = tokio::time::interval(Duration::from_secs(1));
            loop {
                every_second.tick().await;
                crate::metrics::sample_worker_cpu();
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
            let Some(Command::Open { listener, socket }) = command else {
                // The main thread is gone: it only returns after stopping us.
                let _ = shutdown.wait_for(|stop| *stop).await;
                break;
            };
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

/// Accepts connections for `listener` until it is closed or the server stops; dropping
/// `socket` then closes this worker's listening socket.
async fn accept_loop(
    listener: Arc<Listener>,
    socket: TcpListener,
    limit: Arc<Semaphore>,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut closed = listener.closed.subscribe();
    let mut stop = async move || {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => (),
            _ = closed.wait_for(|closed| *closed) => (),
        }
    };
    loop {
        // At the limit, stop accepting (the kernel's backlog holds new clients) until a
        // connection closes, rather than accepting and failing.
        let permit = tokio::select! {
            permit = limit.clone().acquire_owned() => permit.expect("semaphore never closed"),
            _ = stop() => return,
        };
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = stop() => return,
        };
        // The process-wide limit, shared by every worker and listener. It is taken after
        // accept: a worker waiting in accept() on its own SO_REUSEPORT socket must not hold
        // a permit that a worker with a pending connection needs. At the limit each worker
        // holds at most this one accepted connection, untouched, until a permit frees.
        let global = tokio::select! {
            permit = shared.connection_limit.clone().acquire_owned() => permit.expect("semaphore never closed"),
            _ = stop() => return,
        };
        match accepted {
            Ok((stream, client)) => {
                let state = listener.state.load_full();
                let log = shared.log_connections.load(Ordering::Relaxed);
                crate::metrics::record_accept();
                tokio::task::spawn_local(async move {
                    conn::handle(stream, client, state, log).await;
                    crate::metrics::record_connection_end();
                    drop((permit, global));
                });
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
    }
}
