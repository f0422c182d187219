//! One worker: a thread, a single-threaded runtime, one listening socket per listener.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::LocalSet;

use super::{conn, Shared};
use crate::offload::{self, OffloadSettings};

pub struct Worker {
    pub index: usize,
    pub sockets: Vec<std::net::TcpListener>,
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

    async fn serve(self) {
        let mut settings = self.settings.clone();
        offload::install_worker_queue(*settings.borrow_and_update());
        tokio::task::spawn_local(async move {
            while settings.changed().await.is_ok() {
                offload::install_worker_queue(*settings.borrow_and_update());
            }
        });

        let listeners = self.shared.listeners.load();
        let mut limits = Vec::new();
        for (slot, socket) in self.sockets.into_iter().enumerate() {
            let listener = TcpListener::from_std(socket).expect("listener socket");
            let limit = Arc::new(Semaphore::new(listeners[slot].config.max_connections));
            limits.push((limit.clone(), listeners[slot].config.max_connections));
            tokio::task::spawn_local(accept_loop(
                slot,
                listener,
                limit,
                self.shared.clone(),
                self.shutdown.clone(),
            ));
        }

        let mut shutdown = self.shutdown.clone();
        let _ = shutdown.wait_for(|stop| *stop).await;
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

async fn accept_loop(
    slot: usize,
    listener: TcpListener,
    limit: Arc<Semaphore>,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        // At the limit, stop accepting (the kernel's backlog holds new clients) until a
        // connection closes, rather than accepting and failing.
        let permit = tokio::select! {
            permit = limit.clone().acquire_owned() => permit.expect("semaphore never closed"),
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        // The process-wide limit, shared by every worker and listener. It is taken after
        // accept: a worker waiting in accept() on its own SO_REUSEPORT socket must not hold
        // a permit that a worker with a pending connection needs. At the limit each worker
        // holds at most this one accepted connection, untouched, until a permit frees.
        let global = tokio::select! {
            permit = shared.connection_limit.clone().acquire_owned() => permit.expect("semaphore never closed"),
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        match accepted {
            Ok((stream, client)) => {
                let state = shared.listeners.load()[slot].clone();
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
