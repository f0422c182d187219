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
    let local = socket.local_addr().expect("a bound socket has an address");
    let total = limit.available_permits() as u32;
    let routes: Routes = Rc::default();
    let (draining_tx, draining) = watch::channel(false);
    let mut backends: Option<(Arc<QuicService>, Rc<Backends>)> = None;
    let mut buf = vec![0u8; MAX_UDP_PAYLOAD];
    loop {
        let draining_now = *draining.borrow();
        let (len, from) = tokio::select! {
            received = socket.recv_from(&mut buf) => match received {
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
            _ = limit.acquire_many(total), if draining_now => return,
        };
        let packet = &mut buf[..len];
        let header = match quiche::Header::from_slice(packet, CID_LEN) {
            Ok(header) => header,
            Err(_) => {
                metrics::record_dropped(Dropped::BadHeader);
                continue;
            }
        };
        if let Some(queue) = routes.borrow().get(header.dcid.as_ref()) {
            let datagram = Datagram {
                data: packet.to_vec(),
                from,
            };
            if let Err(mpsc::error::TrySendError::Full(_)) = queue.try_send(datagram) {
                metrics::record_dropped(Dropped::QueueFull);
            }
            continue;
        }
        if header.ty != quiche::Type::Initial {
            metrics::record_dropped(Dropped::UnknownConnection);
            continue;
        }
        if !quiche::version_is_supported(header.version) {
            let mut out = [0u8; 256];
            if let Ok(len) = quiche::negotiate_version(&header.scid, &header.dcid, &mut out) {
                let _ = socket.send_to(&out[..len], from).await;
            }
            continue;
        }
        let service = match (*draining.borrow(), current()) {
            (false, Some(service)) => service,
            _ => {
                metrics::record_dropped(Dropped::NotAccepting);
                continue;
            }
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            metrics::record_dropped(Dropped::MaxConnections);
            continue;
        };
        // Backend connections are kept per state: a reload's new pools get new ones.
        let backends = match &backends {
            Some((of, kept)) if Arc::ptr_eq(of, &service) => kept.clone(),
            _ => {
                let fresh = Rc::new(Backends::default());
                backends = Some((service.clone(), fresh.clone()));
                fresh
            }
        };
        let scid = cid::generate(worker);
        let conn = match service.accept(&quiche::ConnectionId::from_ref(&scid), local, from) {
            Ok(conn) => conn,
            Err(err) => {
                tracing::debug!(error = %err, client = %from, "QUIC connection refused");
                metrics::record_dropped(Dropped::AcceptFailed);
                continue;
            }
        };
        let (queue, inbox) = mpsc::channel(INBOX);
        let client_chosen = header.dcid.to_vec();
        let _ = queue.try_send(Datagram {
            data: packet.to_vec(),
            from,
        });
        {
            let mut routes = routes.borrow_mut();
            routes.insert(scid.to_vec(), queue.clone());
            // The client's retransmitted Initials still carry the ID it chose.
            routes.insert(client_chosen.clone(), queue);
        }
        let context = ConnectionContext {
            socket: socket.clone(),
            local,
            client: from,
            service,
            backends,
            routes: routes.clone(),
            ids: vec![scid.to_vec(), client_chosen],
            draining: draining.clone(),
            permit,
        };
        tokio::task::spawn_local(connection::run(conn, inbox, context));
    }
}
