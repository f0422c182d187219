//! One worker's QUIC endpoint of a listener: its UDP socket, the table that routes each
//! datagram to its connection's task by destination connection ID, and new connections
//! made of clients' first Initial packets (after a stateless Retry when the listener's
//! `quic_retry` asks for one).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::offload::HandshakeGuard;

use super::cid;
use super::connection::{self, ConnectionContext};
use super::inbox::{Datagram, Inbox};
use super::metrics::{self, Dropped};
use super::packet::{self, Arrival, MIN_INITIAL_DATAGRAM};
use super::request_body::Backends;
use super::reset;
use super::service::QuicService;
use super::token;
use super::udp::{Inbound, QuicSocket};

/// Connection IDs to their connection's queue.
pub(super) type Routes = Rc<RefCell<HashMap<Vec<u8>, Rc<Inbox>>>>;

/// A handshake in progress on the worker: counted from a connection's first packet until
/// its handshake completes or it ends, which is what `quic_retry = "auto"` weighs. The
/// worker's engine queue counts it too, as it counts TCP handshakes: the queue waits for
/// more signatures while other handshakes are still running, instead of signing each
/// alone (a batch of one costs the kernel as much as a full one).
pub(super) struct Handshaking {
    count: Rc<Cell<usize>>,
    _engine: HandshakeGuard,
}

impl Handshaking {
    fn start(count: &Rc<Cell<usize>>) -> Handshaking {
        count.set(count.get() + 1);
        metrics::handshaking(true);
        Handshaking {
            count: count.clone(),
            _engine: HandshakeGuard::enter(),
        }
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.count.set(self.count.get() - 1);
        metrics::handshaking(false);
    }
}

/// The limits a new connection must fit under: the listener's `quic_max_connections` on
/// this worker and the process-wide `max_connections` (which TCP connections take from
/// too). A client's first packet beyond either is dropped (it retransmits, or goes
/// elsewhere), as a TCP client waits in the backlog.
struct Limits {
    listener: Arc<Semaphore>,
    process: Arc<Semaphore>,
}

impl Limits {
    /// No place left under one of them.
    fn full(&self) -> bool {
        self.listener.available_permits() == 0 || self.process.available_permits() == 0
    }

    /// A place under both, or under neither.
    fn take(&self) -> Result<Places, Dropped> {
        let full = |_| Dropped::MaxConnections;
        Ok(Places {
            _listener: self.listener.clone().try_acquire_owned().map_err(full)?,
            _process: self.process.clone().try_acquire_owned().map_err(full)?,
        })
    }
}

/// A connection's places under its [`Limits`], held until it ends.
pub(super) struct Places {
    _listener: OwnedSemaphorePermit,
    _process: OwnedSemaphorePermit,
}

/// What the worker gives its endpoint of a listener.
pub struct Endpoint<S> {
    pub worker: usize,
    pub socket: std::net::UdpSocket,
    /// The listener's QUIC service now (`None`: the listener no longer serves QUIC).
    pub current: S,
    /// One permit per open connection (`quic_max_connections` in all); the worker waits
    /// for them all when it drains.
    pub limit: Arc<Semaphore>,
    /// The process-wide `max_connections`, which TCP connections take from too.
    pub process_limit: Arc<Semaphore>,
    /// Turns true when the listener stops taking connections (SIGTERM, or removed).
    pub stop: watch::Receiver<bool>,
}

/// Serves QUIC on the worker's socket until the listener stops and its connections end.
pub async fn serve<S>(endpoint: Endpoint<S>)
where
    S: Fn() -> Option<Arc<QuicService>>,
{
    let Endpoint {
        worker,
        socket,
        current,
        limit,
        process_limit,
        mut stop,
    } = endpoint;
    let socket = match QuicSocket::new(socket) {
        Ok(socket) => Rc::new(socket),
        Err(err) => {
            tracing::error!(worker, error = %err, "cannot serve QUIC on this socket");
            return;
        }
    };
    let total = limit.available_permits() as u32;
    let (draining_tx, draining) = watch::channel(false);
    let mut state = State {
        worker,
        local: socket.local_addr().expect("a bound socket has an address"),
        socket,
        current,
        limits: Limits {
            listener: limit,
            process: process_limit,
        },
        routes: Rc::default(),
        draining,
        backends: None,
        handshaking: Rc::default(),
    };
    let mut inbound = Inbound::new(&state.socket);
    loop {
        let draining_now = *state.draining.borrow();
        tokio::select! {
            received = state.socket.recv(&mut inbound) => {
                if let Err(err) = received {
                    tracing::debug!(error = %err, "UDP receive failed");
                    continue;
                }
            },
            _ = stop.wait_for(|stop| *stop), if !draining_now => {
                let _ = draining_tx.send(true);
                continue;
            }
            // Every connection has ended: the socket closes.
            _ = state.limits.listener.acquire_many(total), if draining_now => return,
        };
        for (from, datagrams) in inbound.received() {
            for datagram in datagrams {
                state.receive(datagram, from).await;
            }
        }
    }
}

/// An endpoint's state between datagrams.
struct State<S> {
    worker: usize,
    socket: Rc<QuicSocket>,
    local: SocketAddr,
    current: S,
    limits: Limits,
    routes: Routes,
    draining: watch::Receiver<bool>,
    /// The worker's backend connections, for the service they were made for: a reload's
    /// new pools get new ones.
    backends: Option<(Arc<QuicService>, Rc<Backends>)>,
    /// Handshakes in progress (see [`Handshaking`]).
    handshaking: Rc<Cell<usize>>,
}

impl<S> State<S>
where
    S: Fn() -> Option<Arc<QuicService>>,
{
    /// Hands `packet` to the connection `dcid` names, if it is one of this worker's; false if
    /// it is not.
    fn route(&self, dcid: &[u8], packet: &[u8], from: SocketAddr) -> bool {
        let routes = self.routes.borrow();
        let Some(queue) = routes.get(dcid) else {
            return false;
        };
        let datagram = Datagram {
            data: packet.to_vec(),
            from,
        };
        if !queue.push(datagram) {
            metrics::record_dropped(Dropped::QueueFull);
        }
        true
    }

    /// Routes a datagram to its connection, answers a version tlsterm does not speak, or
    /// takes a client's first Initial packet.
    async fn receive(&mut self, packet: &mut [u8], from: SocketAddr) {
        let header = match packet::arrival(packet) {
            Arrival::OtherVersion(answer) => {
                let _ = self.socket.send_to(&answer, from).await;
                return;
            }
            // Established connections' packets: routed without quiche's parser.
            Arrival::Established(dcid) => {
                if !self.route(&dcid, packet, from) {
                    self.send_reset(&dcid, packet.len(), from).await;
                    metrics::record_dropped(Dropped::UnknownConnection);
                }
                return;
            }
            Arrival::Unreadable => return metrics::record_dropped(Dropped::BadHeader),
            Arrival::Parsed(header) => header,
        };
        if self.route(&header.dcid, packet, from) {
            return;
        }
        if header.ty != quiche::Type::Initial {
            return metrics::record_dropped(Dropped::UnknownConnection);
        }
        if packet.len() < MIN_INITIAL_DATAGRAM {
            return metrics::record_dropped(Dropped::ShortInitial);
        }
        if let Err(why) = self.admit(&header, packet, from).await {
            metrics::record_dropped(why);
        }
    }

    /// A client's first Initial packet: a Retry when the listener wants the address
    /// validated first, a connection when it does not or the token proves the address,
    /// nothing when the token is not one tlsterm issued for this client (RFC 9000, 8.1.3
    /// allows dropping it; the client then times out).
    async fn admit(
        &mut self,
        header: &quiche::Header<'_>,
        packet: &[u8],
        from: SocketAddr,
    ) -> Result<(), Dropped> {
        let service = match (*self.draining.borrow(), (self.current)()) {
            (false, Some(service)) => service,
            _ => return Err(Dropped::NotAccepting),
        };
        // Before a Retry: a client asked to come back would only be dropped then.
        if self.limits.full() {
            return Err(Dropped::MaxConnections);
        }
        let token = header.token.as_deref().unwrap_or_default();
        let original_dcid = if token.is_empty() {
            if service.wants_retry(self.handshaking.get()) {
                return self.send_retry(header, from).await;
            }
            None
        } else {
            match token::check(token, from, &header.dcid) {
                Ok(original) => Some(original),
                Err(refused) => {
                    metrics::record_token_refused(refused);
                    return Ok(());
                }
            }
        };
        self.accept(service, header.dcid.to_vec(), original_dcid, packet, from)
    }

    async fn send_retry(
        &self,
        header: &quiche::Header<'_>,
        from: SocketAddr,
    ) -> Result<(), Dropped> {
        let answer = packet::retry(header, from, self.worker).map_err(|err| {
            tracing::debug!(error = %err, client = %from, "no Retry for this Initial");
            Dropped::BadHeader
        })?;
        if let Err(err) = self.socket.send_to(&answer, from).await {
            tracing::debug!(error = %err, to = %from, "UDP send failed");
        }
        metrics::record_retry();
        Ok(())
    }

    /// Tells the client that a connection it still sends to is gone here: for IDs this
    /// worker issued only (the reuseport program brings it no other worker's), so a packet
    /// that strays can never reset a connection that lives elsewhere.
    async fn send_reset(&self, dcid: &[u8], trigger_len: usize, to: SocketAddr) {
        if cid::worker_of(dcid, cid::MAX_WORKERS) != Some(self.worker) {
            return;
        }
        let Some(reset) = reset::packet(dcid, trigger_len) else {
            return;
        };
        if let Err(err) = self.socket.send_to(&reset, to).await {
            tracing::debug!(error = %err, to = %to, "UDP send failed");
        }
        metrics::record_stateless_reset();
    }

    /// Makes a connection of a client's first Initial packet (whose destination connection
    /// ID is `client_chosen`) and starts its task. `original_dcid`: the client answered a
    /// Retry, and `client_chosen` is the ID the Retry gave it (the token vouches for it).
    fn accept(
        &mut self,
        service: Arc<QuicService>,
        client_chosen: Vec<u8>,
        original_dcid: Option<Vec<u8>>,
        packet: &[u8],
        from: SocketAddr,
    ) -> Result<(), Dropped> {
        let places = self.limits.take()?;
        let scid = match original_dcid {
            Some(_) => client_chosen.clone(),
            None => cid::generate(self.worker).to_vec(),
        };
        let original = original_dcid.as_deref().map(quiche::ConnectionId::from_ref);
        let conn = service
            .accept(
                &quiche::ConnectionId::from_ref(&scid),
                original.as_ref(),
                self.local,
                from,
            )
            .map_err(|err| {
                tracing::debug!(error = %err, client = %from, "QUIC connection refused");
                Dropped::AcceptFailed
            })?;
        let queue = Inbox::new();
        queue.push(Datagram {
            data: packet.to_vec(),
            from,
        });
        // The client's retransmitted Initials still carry the ID it chose.
        let mut ids = vec![scid];
        if client_chosen != ids[0] {
            ids.push(client_chosen);
        }
        {
            let mut routes = self.routes.borrow_mut();
            for id in &ids {
                routes.insert(id.clone(), queue.clone());
            }
        }
        let context = ConnectionContext {
            worker: self.worker,
            queue,
            socket: self.socket.clone(),
            local: self.local,
            client: from,
            backends: self.backends_for(&service),
            service,
            routes: self.routes.clone(),
            ids,
            draining: self.draining.clone(),
            places,
            handshaking: Some(Handshaking::start(&self.handshaking)),
        };
        tokio::task::spawn_local(connection::run(Box::new(conn), context));
        Ok(())
    }

    fn backends_for(&mut self, service: &Arc<QuicService>) -> Rc<Backends> {
        match &self.backends {
            Some((of, kept)) if Arc::ptr_eq(of, service) => kept.clone(),
            _ => {
                let fresh = Rc::new(Backends::default());
                self.backends = Some((service.clone(), fresh.clone()));
                fresh
            }
        }
    }
}
