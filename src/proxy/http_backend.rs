//! HTTP/1.1 to a listener's backends: one worker's keep-alive connections, per backend
//! pool, through hyper's HTTP/1 client, for requests that came as HTTP/3 or as HTTP/1.1 over
//! TLS (`mode = "http"`). A connection is borrowed for one request and its response, and
//! given back once the response body has been read whole; one unused for its pool's
//! `keepalive` is closed, so that a burst of requests does not leave the worker holding
//! as many connections (and the backend as many) long after it. A pool may cap what a worker
//! opens to it (`backend_max_connections`): a request that finds every connection busy at
//! the cap waits for one to be given back or to close.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::pool::BackendPool;

/// A connection to a backend, borrowed for one request.
pub type Borrowed<B> = SendRequest<B>;

/// Why a request got no response from the backend.
#[derive(Debug)]
pub enum BackendError {
    Connect(super::pool::ConnectError),
    Http(hyper::Error),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Connect(err) => write!(f, "cannot connect to a backend: {err}"),
            BackendError::Http(err) => write!(f, "backend: {err}"),
        }
    }
}

/// One worker's idle backend connections, by pool, for request bodies of type `B`. Each
/// pool is held with its connections, so that its address is never another's; a pool no
/// one else holds any more (its listener was reloaded away) is dropped with them.
pub struct Backends<B> {
    idle: RefCell<Vec<IdleOfPool<B>>>,
    /// Whether a task of the worker's is waiting to close connections unused too long.
    sweeping: Cell<bool>,
}

/// A pool, and its connections waiting for a request.
type IdleOfPool<B> = (Arc<BackendPool>, Vec<Waiting<B>>);

/// A connection waiting for a request, and since when.
struct Waiting<B> {
    sender: Borrowed<B>,
    since: Instant,
}

/// A pool's connections open in this worker, busy or idle, and the wake-up of the requests
/// waiting for one at the pool's cap.
#[derive(Default)]
struct Slots {
    open: Cell<usize>,
    freed: Notify,
}

thread_local! {
    /// This worker's [`Slots`], by pool: shared by the worker's HTTP/3 and `mode = "http"`
    /// connections, so that the cap counts both. Each pool is held while it has an entry,
    /// so that its address is never another's.
    static SLOTS: RefCell<Vec<(Arc<BackendPool>, Rc<Slots>)>> = const { RefCell::new(Vec::new()) };
}

impl Slots {
    /// This worker's count for `pool`. Entries of pools with no connection left that no
    /// one else holds (reloaded away) go.
    fn of(pool: &Arc<BackendPool>) -> Rc<Slots> {
        SLOTS.with(|slots| {
            let mut slots = slots.borrow_mut();
            slots.retain(|(kept, slots)| {
                Arc::ptr_eq(kept, pool) || slots.open.get() > 0 || Arc::strong_count(kept) > 1
            });
            if let Some((_, slots)) = slots.iter().find(|(kept, _)| Arc::ptr_eq(kept, pool)) {
                return slots.clone();
            }
            let made = Rc::new(Slots::default());
            slots.push((pool.clone(), made.clone()));
            made
        })
    }

    /// A place for one more connection, unless the pool's cap is reached.
    fn take(self: &Rc<Self>, cap: Option<usize>) -> Option<Slot> {
        if cap.is_some_and(|cap| self.open.get() >= cap) {
            return None;
        }
        self.open.set(self.open.get() + 1);
        super::metrics::record_pooled_connection(1);
        Some(Slot(self.clone()))
    }
}

/// One open connection's place under its pool's cap, given up when the connection closes.
struct Slot(Rc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.set(self.0.open.get() - 1);
        super::metrics::record_pooled_connection(-1);
        self.0.freed.notify_waiters();
    }
}

impl<B> Default for Backends<B> {
    fn default() -> Self {
        Backends {
            idle: RefCell::new(Vec::new()),
            sweeping: Cell::new(false),
        }
    }
}

/// Idle connections kept per pool and worker. Above the requests a worker has in flight at
/// once in steady traffic, or every burst closes what it gives back and opens it again: a
/// few HTTP/2 clients with their streams open are hundreds (with 128 in flight and 64 kept,
/// opening and closing backend connections took a sixth of the server's CPU). Unused ones
/// still close after the pool's `keepalive`.
const MAX_IDLE: usize = 256;

impl<B> Backends<B>
where
    B: Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Sends `request` on an idle connection of `pool`, or a new one; an idle connection
    /// the backend closed meanwhile is discarded and the request sent on another (hyper
    /// hands a request back that it did not start to send). At the pool's cap with every
    /// connection busy, waits for one to be given back or to close (the caller bounds the
    /// wait).
    pub async fn send(
        &self,
        pool: &Arc<BackendPool>,
        mut request: Request<B>,
    ) -> Result<(Response<Incoming>, Borrowed<B>), BackendError> {
        let slots = Slots::of(pool);
        let mut waited = false;
        loop {
            let (mut sender, fresh) = match self.take_idle(pool) {
                Some(sender) => (sender, false),
                None => match slots.take(pool.max_connections()) {
                    Some(slot) => (connect(pool, slot).await?, true),
                    None => {
                        if !std::mem::replace(&mut waited, true) {
                            super::metrics::record_backend_wait();
                        }
                        // A connection given back whose task has yet to take the end of its
                        // last response is as good as free: waited for, it is this
                        // request's (no other wake-up would come for it).
                        if let Some(mut settling) = self.take_settling(pool) {
                            if settling.ready().await.is_err() {
                                continue;
                            }
                            (settling, false)
                        } else {
                            // Registered at its first poll, right here: nothing runs
                            // between the count above and it, so no wake-up is missed.
                            slots.freed.notified().await;
                            continue;
                        }
                    }
                },
            };
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, sender)),
                Err(mut failed) => match failed.take_message() {
                    // Only an idle connection is tried again: a new one that fails before
                    // sending anything is the backend's answer.
                    Some(unsent) if !fresh => request = unsent,
                    _ => return Err(BackendError::Http(failed.into_error())),
                },
            }
        }
    }

    /// Gives a connection back once its response has been read whole.
    pub fn give_back(self: &Rc<Self>, pool: &Arc<BackendPool>, sender: Borrowed<B>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        idle.retain(|(kept, _)| Arc::ptr_eq(kept, pool) || Arc::strong_count(kept) > 1);
        let at = match idle.iter().position(|(kept, _)| Arc::ptr_eq(kept, pool)) {
            Some(at) => at,
            None => {
                idle.push((pool.clone(), Vec::new()));
                idle.len() - 1
            }
        };
        let list = &mut idle[at].1;
        if list.len() < MAX_IDLE {
            list.push(Waiting {
                sender,
                since: Instant::now(),
            });
            // A request waiting at the pool's cap takes it.
            if pool.max_connections().is_some() {
                Slots::of(pool).freed.notify_waiters();
            }
        }
        if !self.sweeping.replace(true) {
            tokio::task::spawn_local(Rc::clone(self).sweep());
        }
    }

    /// Closes connections as they pass their pool's keepalive unused, until none waits.
    /// (One given back meanwhile to a pool with a shorter keepalive than the others' may
    /// wait until the next of theirs is due: closed late, never early.)
    async fn sweep(self: Rc<Self>) {
        while let Some(next) = self.close_unused(Instant::now()) {
            tokio::time::sleep_until(next).await;
        }
        self.sweeping.set(false);
    }

    /// Drops the connections that have waited for their pool's keepalive (and those the
    /// backend closed); when the next of the others is due, if any is left.
    fn close_unused(&self, now: Instant) -> Option<Instant> {
        let mut idle = self.idle.borrow_mut();
        let mut next: Option<Instant> = None;
        for (pool, list) in idle.iter_mut() {
            let keepalive = pool.keepalive();
            list.retain(|waiting| waiting.since + keepalive > now && !waiting.sender.is_closed());
            for waiting in list.iter() {
                let due = waiting.since + keepalive;
                next = Some(next.map_or(due, |next| next.min(due)));
            }
        }
        idle.retain(|(_, list)| !list.is_empty());
        next
    }

    /// An idle connection ready for a request; one the backend closed is dropped, one not
    /// ready yet (its last response just read, its task not yet run) stays for later.
    fn take_idle(&self, pool: &Arc<BackendPool>) -> Option<Borrowed<B>> {
        self.take_idle_where(pool, SendRequest::is_ready)
    }

    /// The idle connection given back last, ready or not (see [`Self::take_idle`]).
    fn take_settling(&self, pool: &Arc<BackendPool>) -> Option<Borrowed<B>> {
        self.take_idle_where(pool, |_| true)
    }

    fn take_idle_where(
        &self,
        pool: &Arc<BackendPool>,
        usable: impl Fn(&Borrowed<B>) -> bool,
    ) -> Option<Borrowed<B>> {
        let mut idle = self.idle.borrow_mut();
        let (_, list) = idle.iter_mut().find(|(kept, _)| Arc::ptr_eq(kept, pool))?;
        list.retain(|waiting| !waiting.sender.is_closed());
        // The most recently given back: the others then stay unused and are closed.
        let at = list.iter().rposition(|waiting| usable(&waiting.sender))?;
        Some(list.remove(at).sender)
    }
}

/// A new connection to one of `pool`'s backends, in the place `slot` under its cap, which
/// it keeps until it closes (or is switched to another protocol: a relayed WebSocket no
/// longer counts).
async fn connect<B>(pool: &Arc<BackendPool>, slot: Slot) -> Result<Borrowed<B>, BackendError>
where
    B: Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (stream, _address) = pool.connect().await.map_err(BackendError::Connect)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(BackendError::Http)?;
    tokio::task::spawn_local(async move {
        let _slot = slot;
        // With upgrades: a 101 answer hands the connection over (`hyper::upgrade::on`).
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(error = %err, "backend connection ended with an error");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::*;

    #[derive(Debug, PartialEq)]
    enum Seen {
        Accepted,
        Closed,
    }

    /// A backend on loopback that answers each request head with an empty 200 and tells
    /// what happens to its connections.
    async fn backend() -> (Arc<BackendPool>, mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (seen, events) = mpsc::unbounded_channel();
        tokio::task::spawn_local(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                seen.send(Seen::Accepted).unwrap();
                let seen = seen.clone();
                tokio::task::spawn_local(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                        if head.windows(4).any(|w| w == b"\r\n\r\n") {
                            head.clear();
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                            stream.write_all(answer).await.unwrap();
                        }
                    }
                    let _ = seen.send(Seen::Closed);
                });
            }
        });
        let pool = BackendPool::new(vec![address], Duration::from_secs(5), Duration::ZERO);
        (Arc::new(pool), events)
    }

    /// One request, its response read whole, its connection given back.
    async fn request(backends: &Rc<Backends<Empty<Bytes>>>, pool: &Arc<BackendPool>) {
        let request = Request::get("/")
            .header("host", "backend.test")
            .body(Empty::new())
            .unwrap();
        let (response, connection) = backends.send(pool, request).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
        backends.give_back(pool, connection);
    }

    /// The next thing the backend saw; a test that waits past 10 s fails.
    async fn next(events: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
        tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("the backend saw nothing for 10 s")
            .unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_unused_for_the_keepalive_is_closed() {
        tokio::task::LocalSet::new()
            .run_until(async {
                let (pool, mut events) = backend().await;
                let pool = Arc::new(
                    Arc::into_inner(pool)
                        .unwrap()
                        .with_keepalive(Duration::from_millis(50)),
                );
                let backends = Rc::new(Backends::default());
                request(&backends, &pool).await;
                assert_eq!(next(&mut events).await, Seen::Accepted);
                assert_eq!(next(&mut events).await, Seen::Closed);
                assert!(backends.idle.borrow().is_empty());
                // The worker's sweeping task ends with nothing left to close, and comes
                // back for the next connection given back.
                tokio::task::yield_now().await;
                assert!(!backends.sweeping.get());
                request(&backends, &pool).await;
                assert_eq!(next(&mut events).await, Seen::Accepted);
                assert_eq!(next(&mut events).await, Seen::Closed);
            })
            .await;
    }

    /// At a pool's cap, a request waits for the busy connection: it takes it when it is
    /// given back, or opens its own once it closes.
    #[tokio::test(flavor = "current_thread")]
    async fn at_the_cap_a_request_waits_for_a_connection_to_be_free() {
        tokio::task::LocalSet::new()
            .run_until(async {
                let (pool, mut events) = backend().await;
                let pool = Arc::into_inner(pool).unwrap();
                let pool = Arc::new(pool.with_max_connections(Some(1)));
                let backends = Rc::new(Backends::default());
                let get = || {
                    Request::get("/")
                        .header("host", "b.test")
                        .body(Empty::new())
                };
                for give_back in [true, false] {
                    let (response, busy) = backends.send(&pool, get().unwrap()).await.unwrap();
                    let (second, second_backends) = (pool.clone(), backends.clone());
                    let waiting = tokio::task::spawn_local(async move {
                        request(&second_backends, &second).await;
                    });
                    for _ in 0..10 {
                        tokio::task::yield_now().await;
                    }
                    assert!(!waiting.is_finished(), "the second request waits");
                    // Given back as soon as its response is read, maybe before the
                    // connection's task has taken the response's end: the waiting request
                    // takes it all the same.
                    response.into_body().collect().await.unwrap();
                    match give_back {
                        true => backends.give_back(&pool, busy),
                        false => drop(busy),
                    }
                    tokio::time::timeout(Duration::from_secs(10), waiting)
                        .await
                        .expect("the waiting request got a connection")
                        .unwrap();
                    // One connection for both when given back; a second once the first closed.
                    assert_eq!(next(&mut events).await, Seen::Accepted);
                    if !give_back {
                        // The close and the new connection, in the order the backend's
                        // tasks happen to run.
                        let seen = [next(&mut events).await, next(&mut events).await];
                        assert!(seen.contains(&Seen::Closed), "{seen:?}");
                        assert!(seen.contains(&Seen::Accepted), "{seen:?}");
                    }
                    assert!(events.try_recv().is_err());
                    // The connection left idle closes: the next round starts at none.
                    drop(backends.take_idle(&pool));
                    assert_eq!(next(&mut events).await, Seen::Closed);
                }
            })
            .await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_used_within_the_keepalive_serves_the_next_request() {
        tokio::task::LocalSet::new()
            .run_until(async {
                let (pool, mut events) = backend().await;
                let backends = Rc::new(Backends::default());
                for _ in 0..3 {
                    request(&backends, &pool).await;
                }
                assert_eq!(next(&mut events).await, Seen::Accepted);
                assert!(
                    events.try_recv().is_err(),
                    "one connection for three requests"
                );
                assert_eq!(backends.idle.borrow()[0].1.len(), 1);
            })
            .await;
    }
}
