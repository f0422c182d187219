//! One worker's QUIC endpoint of a listener: its UDP socket, the table that routes each
//! datagram to its connection's task by destination connection ID, and new connections
//! made of clients' first Initial packets.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch, Semaphore};

use super::backend::Backends;
use super::cid::{self, CID_LEN};
use super::connection::{self, ConnectionContext};
use super::metrics::{self, Dropped};
use super::service::QuicService;

/// A datagram for a connection, as received.
pub(super) struct Datagram {
    pub data: Vec<u8>,
    pub from: SocketAddr,
}

/// Connection IDs to their connection's queue.
pub(super) type Routes = Rc<RefCell<HashMap<Vec<u8>, mpsc::Sender<Datagram>>>>;

/// Datagrams queued for one connection before the endpoint drops more of them.
const INBOX: usize = 256;
/// The largest UDP payload read.
const MAX_UDP_PAYLOAD: usize = 65_535;

/// What the worker gives its endpoint of a listener.
pub struct Endpoint<S> {
    pub worker: usize,
    pub socket: std::net::UdpSocket,
    /// The listener's QUIC service now (`None`: the listener no longer serves QUIC).
    pub current: S,
    /// One permit per open connection (`quic_max_connections` in all); the worker waits
    /// for them all when it drains.
    pub limit: Arc<Semaphore>,
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
        mut stop,
    } = endpoint;
    let socket = match UdpSocket::from_std(socket) {
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
        limit,
        routes: Rc::default(),
        draining,
        backends: None,
    };
    let mut buf = vec![0u8; MAX_UDP_PAYLOAD];
    loop {
        let draining_now = *state.draining.borrow();
        let (len, from) = tokio::select! {
            received = state.socket.recv_from(&mut buf) => match received {
                Ok(received) => received,
                Err(err) => {
                    tracing::debug!(error = %err, "UDP receive failed");
                    continue;
                }
            },
            _ = stop.wait_for(|stop| *stop), if !draining_now => {
                let _ = draining_tx.send(true);
                continue;
            }
            // Every connection has ended: the socket closes.
            _ = state.limit.acquire_many(total), if draining_now => return,
        };
        state.receive(&mut buf[..len], from).await;
    }
}

/// An endpoint's state between datagrams.
struct State<S> {
    worker: usize,
    socket: Rc<UdpSocket>,
    local: SocketAddr,
    current: S,
    limit: Arc<Semaphore>,
    routes: Routes,
    draining: watch::Receiver<bool>,
    /// The worker's backend connections, for the service they were made for: a reload's
    /// new pools get new ones.
    backends: Option<(Arc<QuicService>, Rc<Backends>)>,
}

impl<S> State<S>
where
    S: Fn() -> Option<Arc<QuicService>>,
{
    /// Routes a datagram to its connection, or makes a connection of a client's first
    /// Initial packet.
    async fn receive(&mut self, packet: &mut [u8], from: SocketAddr) {
        let header = match quiche::Header::from_slice(packet, CID_LEN) {
            Ok(header) => header,
            Err(_) => return metrics::record_dropped(Dropped::BadHeader),
        };
        if let Some(queue) = self.routes.borrow().get(header.dcid.as_ref()) {
            let datagram = Datagram {
                data: packet.to_vec(),
                from,
            };
            if let Err(mpsc::error::TrySendError::Full(_)) = queue.try_send(datagram) {
                metrics::record_dropped(Dropped::QueueFull);
            }
            return;
        }
        if header.ty != quiche::Type::Initial {
            return metrics::record_dropped(Dropped::UnknownConnection);
        }
        if !quiche::version_is_supported(header.version) {
            let mut out = [0u8; 256];
            if let Ok(len) = quiche::negotiate_version(&header.scid, &header.dcid, &mut out) {
                let _ = self.socket.send_to(&out[..len], from).await;
            }
            return;
        }
        if let Err(why) = self.accept(header.dcid.to_vec(), packet, from) {
            metrics::record_dropped(why);
        }
    }

    /// Makes a connection of a client's first Initial packet (whose destination connection
    /// ID, chosen by the client, is `client_chosen`) and starts its task.
    fn accept(
        &mut self,
        client_chosen: Vec<u8>,
        packet: &[u8],
        from: SocketAddr,
    ) -> Result<(), Dropped> {
        let service = match (*self.draining.borrow(), (self.current)()) {
            (false, Some(service)) => service,
            _ => return Err(Dropped::NotAccepting),
        };
        let permit =
            (self.limit.clone().try_acquire_owned()).map_err(|_| Dropped::MaxConnections)?;
        let scid = cid::generate(self.worker);
        let conn = service
            .accept(&quiche::ConnectionId::from_ref(&scid), self.local, from)
            .map_err(|err| {
                tracing::debug!(error = %err, client = %from, "QUIC connection refused");
                Dropped::AcceptFailed
            })?;
        let (queue, inbox) = mpsc::channel(INBOX);
        let _ = queue.try_send(Datagram {
            data: packet.to_vec(),
            from,
        });
        {
            let mut routes = self.routes.borrow_mut();
            routes.insert(scid.to_vec(), queue.clone());
            // The client's retransmitted Initials still carry the ID it chose.
            routes.insert(client_chosen.clone(), queue);
        }
        let context = ConnectionContext {
            socket: self.socket.clone(),
            local: self.local,
            client: from,
            backends: self.backends_for(&service),
            service,
            routes: self.routes.clone(),
            ids: vec![scid.to_vec(), client_chosen],
            draining: self.draining.clone(),
            permit,
        };
        tokio::task::spawn_local(connection::run(conn, inbox, context));
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
