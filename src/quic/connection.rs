//! One QUIC connection's task: quiche's state, its HTTP/3 layer, and the streams of its
//! requests. It reads the datagrams the endpoint routes to it, runs quiche's timers, runs
//! its requests (each a future of its own, polled by this task), moves request bodies to
//! them and responses back, and sends what quiche has to send. Signatures of its
//! handshake go through the worker's engine queue: the private-key method's future wakes
//! this task when one is ready.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use quiche::h3;
use tokio::sync::{mpsc, watch, Notify};

use super::cid;
use super::endpoint::{Handshaking, Places, Routes};
use super::inbox::{Datagram, Inbox};
use super::metrics;
use super::request::{self, Reply, RequestContext, REPLY_QUEUE};
use super::request_body::{Backends, BodyAborted, RequestBody};
use super::reset;
use super::service::QuicService;
use super::udp::{Outbox, QuicSocket};
use crate::proxy::client_cert::{self, CertFields};
use crate::proxy::forwarding::ClientAddress;
use crate::tls::Negotiated;

/// QUIC's code for a close without an error (RFC 9000, 20.1).
const QUIC_NO_ERROR: u64 = 0x0;
const QUIC_INTERNAL_ERROR: u64 = 0x1;
/// HTTP/3's error codes (RFC 9114, 8.1) that tlsterm sends.
const H3_NO_ERROR: u64 = 0x100;
const H3_INTERNAL_ERROR: u64 = 0x102;
const H3_REQUEST_CANCELLED: u64 = 0x10c;

/// Request-body chunks waiting for the backend, per request: with QUIC's stream window,
/// what bounds a request's memory.
const BODY_QUEUE: usize = 4;
/// The most body read from QUIC at once.
const BODY_CHUNK: usize = 16 * 1024;
/// How long the acknowledgement of a datagram that brought new requests may wait for their
/// responses, so that a backend answering within it (a cache hit) costs the connection one
/// packet per request instead of two: an acknowledgement alone, then the response. Far
/// below the acknowledgement delay quiche announces (`max_ack_delay`, 25 ms), so the
/// client never retransmits for want of it.
const ACK_HOLD: std::time::Duration = std::time::Duration::from_millis(1);

/// What a connection's task is given besides its connection.
pub(super) struct ConnectionContext {
    pub worker: usize,
    /// This connection's queue, for the routes of the spare IDs it issues.
    pub queue: Rc<Inbox>,
    pub socket: Rc<QuicSocket>,
    pub local: SocketAddr,
    pub client: SocketAddr,
    pub service: Arc<QuicService>,
    pub backends: Rc<Backends>,
    pub routes: Routes,
    /// The connection IDs the endpoint routes to this connection, removed at its end.
    pub ids: Vec<Vec<u8>>,
    /// True once the listener drains (SIGTERM, or the listener removed).
    pub draining: watch::Receiver<bool>,
    /// Its places under the connection limits, given back at the end.
    pub places: Places,
    /// Counts this connection among the worker's handshakes in progress until it is
    /// established.
    pub handshaking: Option<Handshaking>,
}

/// Wakes the connection's task through its `Notify`: the waker BoringSSL's asynchronous
/// callbacks use (they run inside quiche, outside any future of this task).
struct NotifyWaker(Arc<Notify>);

impl Wake for NotifyWaker {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

/// A request stream.
struct Stream {
    /// Toward the backend; `None` once the request body has ended.
    body: Option<mpsc::Sender<Result<Bytes, BodyAborted>>>,
    replies: mpsc::Receiver<Reply>,
    /// A reply taken from the channel that quiche had no room for yet.
    unsent: Option<Reply>,
    /// The response has ended (or the stream was reset).
    done: bool,
}

/// The connection's task. Longer than most functions here because its one loop is the
/// order each turn must follow (read datagrams, with 0-RTT requests taken between them;
/// note the handshake's end; serve HTTP/3; send; wait), and its steps share the
/// connection's state; each step that stands alone is a function below.
pub(super) async fn run(
    // Boxed: quiche's connection is 8 KB, which the task's future would otherwise hold
    // twice (as its argument and as the local it becomes).
    mut conn: Box<quiche::Connection>,
    mut context: ConnectionContext,
) {
    let wake = open(&mut conn);
    let mut established = false;
    // Turns true when the handshake completes: requests that came in 0-RTT data wait on it.
    let (confirmed, confirmed_rx) = watch::channel(false);
    // The HTTP/3 layer once started (`Some(None)`: its setup failed).
    let mut http: Option<Option<Requests>> = None;
    let mut received: Vec<Datagram> = Vec::new();
    // Until the handshake completes or has been given up.
    let mut handshake_deadline =
        Some(std::time::Instant::now() + context.service.handshake_timeout);
    let mut ack_hold = AckHold::default();
    // One sleep for every deadline of the connection (quiche's timer for loss detection,
    // acknowledgements and idleness; the acknowledgement hold; the handshake's), set each
    // turn to the earliest: moved rather than made anew, as most turns only push quiche's
    // idle deadline later, which tokio does without touching its timer wheel.
    let timer = tokio::time::sleep(std::time::Duration::ZERO);
    tokio::pin!(timer);
    // Likewise the wait for a wake-up (a reply, a handshake's asynchronous step): kept
    // from turn to turn until it fires, not registered and dropped again each turn.
    let woken = wake.notified();
    tokio::pin!(woken);
    // The listener's drain, waited for once for the connection's life (a new wait each turn
    // would register and drop a waiter every time). It ends at the drain, or should the
    // listener's signal go away; either way it is not waited for again.
    let mut drain_signal = context.draining.clone();
    let drain = async move {
        let _ = drain_signal.wait_for(|draining| *draining).await;
    };
    tokio::pin!(drain);
    let mut drain_seen = false;
    // The endpoint queued the client's first datagram before starting the task: the first
    // turn only takes it.
    let mut turn = Turn::Start;
    loop {
        let took_datagrams = !received.is_empty();
        for mut datagram in received.drain(..) {
            let info = quiche::RecvInfo {
                from: datagram.from,
                to: context.local,
            };
            if let Err(err) = conn.recv(&mut datagram.data, info) {
                tracing::trace!(error = %err, "QUIC packet not processed");
            }
            // Requests in 0-RTT data are taken before a later datagram of the batch
            // completes the handshake: they reach the backend as the early data they were.
            if conn.is_in_early_data() {
                if let Some(requests) = requests_of(&mut http, &mut conn, &context, &confirmed_rx) {
                    requests.serve(&mut conn, &context, &wake);
                }
            }
        }
        if !established && conn.is_established() {
            established = true;
            handshake_deadline = None;
            handshake_done(&mut conn, &mut context, &confirmed);
        }
        if established {
            follow_paths(&mut conn, &mut context);
        }
        // HTTP/3 starts with the connection established, or before, in 0-RTT data.
        let requests = match established || conn.is_in_early_data() {
            true => requests_of(&mut http, &mut conn, &context, &confirmed_rx),
            false => None,
        };
        let served = match requests {
            Some(requests) => requests.serve(&mut conn, &context, &wake),
            None if *context.draining.borrow() => {
                let _ = conn.close(true, H3_NO_ERROR, b"");
                Served::default()
            }
            None => Served::default(),
        };
        let new_requests = established
            && took_datagrams
            && served.started
            && !served.replied
            && !*context.draining.borrow();
        if sends_after(turn, &mut conn) && !ack_hold.holds(new_requests, std::time::Instant::now())
        {
            flush(&mut conn, &context.socket).await;
        }
        if conn.is_closed() {
            break;
        }
        // Sending drove the handshake on (the ClientHello's certificate selection had
        // finished asynchronously), and quiche then read the 0-RTT packets it had kept for
        // want of keys: their requests are taken now, not when the next datagram comes.
        if http.is_none() && conn.is_in_early_data() {
            turn = Turn::Other;
            continue;
        }
        let quiche_deadline = conn.timeout_instant();
        let deadline = [quiche_deadline, ack_hold.until, handshake_deadline]
            .into_iter()
            .flatten()
            .min();
        if let Some(deadline) = deadline {
            timer.as_mut().reset(deadline.into());
        }
        turn = Turn::Other;
        tokio::select! {
            _ = context.queue.take_all(&mut received) => turn = Turn::Datagrams,
            _ = &mut woken => {
                woken.set(wake.notified());
                turn = Turn::Woken;
            }
            _ = progress(&mut http) => turn = Turn::Woken,
            _ = &mut drain, if !drain_seen => drain_seen = true,
            // The acknowledgement hold needs nothing here: the next turn sends.
            _ = &mut timer, if deadline.is_some() => {
                let now = std::time::Instant::now();
                if quiche_deadline.is_some_and(|due| due <= now) {
                    conn.on_timeout();
                }
                if handshake_deadline.is_some_and(|due| due <= now) {
                    tracing::debug!(client = %context.client, "QUIC handshake timed out");
                    handshake_deadline = None;
                    let _ = conn.close(false, QUIC_NO_ERROR, b"");
                }
            }
        }
    }
    let mut routes = context.routes.borrow_mut();
    for id in &context.ids {
        routes.remove(id);
    }
    metrics::connection_closed(established);
    drop(context.places);
}

/// What started a turn of the connection's loop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Turn {
    /// The task's first: the client's first datagram is still to be taken.
    Start,
    /// Datagrams came, and nothing else.
    Datagrams,
    /// A wake-up: an asynchronous step of the handshake is done, a reply came, or a
    /// request body's channel has room.
    Woken,
    /// A timer, the drain, or a turn the loop repeats at once.
    Other,
}

/// Whether a turn ends by sending what quiche has ready. Not the first turn, which has read
/// nothing; nor any turn while the handshake waits for the worker's engine (a key share, a
/// signature) or another asynchronous step, unless a timer or the drain started it.
/// quiche would send what it already has: while the key share is computed, an
/// acknowledgement alone, in a datagram padded to 1,200 bytes since it carries an Initial
/// packet; while the signature is, the ServerHello alone, padded likewise, and the rest of
/// the flight in another datagram. Waiting sends the whole flight, ServerHello to
/// Finished, in one. The step's end wakes the task (well within the client's first
/// retransmission timeout), and a server computing the step inline would not answer
/// sooner. The wake-up's turn first lets the handshake take the step's result, which may
/// lead it to its next step (the signature after the key share).
fn sends_after(turn: Turn, conn: &mut quiche::Connection) -> bool {
    match turn {
        Turn::Start => false,
        Turn::Datagrams => !waits_for_callback(conn),
        Turn::Woken => {
            if waits_for_callback(conn) {
                drive_handshake(conn);
            }
            !waits_for_callback(conn)
        }
        Turn::Other => true,
    }
}

/// Whether the handshake waits for an asynchronous step, and nothing else is to be said: a
/// connection that is closing (a protocol error, a drain) sends its close at once.
fn waits_for_callback(conn: &mut quiche::Connection) -> bool {
    conn.local_error().is_none()
        && crate::sys::handshake_waits_for_callback(AsMut::<boring::ssl::SslRef>::as_mut(conn))
}

/// Runs the handshake on without sending anything. quiche has no call for it: its `send`
/// runs the handshake first and then writes packets, so a `send` into a buffer too short
/// for any packet runs the handshake and writes none (what the handshake produced is sent
/// by the next `send` with room). The suite's test of a flight that waits for a key share
/// and a signature fails should a quiche upgrade change this.
fn drive_handshake(conn: &mut quiche::Connection) {
    let mut no_room = [0u8; 1];
    match conn.send(&mut no_room) {
        Err(quiche::Error::Done | quiche::Error::BufferTooShort) => {}
        // The turn's flush (which this does not skip: the handshake no longer waits)
        // meets the error again and closes the connection.
        Err(err) => tracing::debug!(error = %err, "QUIC handshake failed"),
        Ok((len, _)) => tracing::debug!(len, "quiche wrote a packet into no room"),
    }
}

/// Readies a new connection for its task: BoringSSL's asynchronous callbacks wake the task
/// through the `Notify` returned.
fn open(conn: &mut quiche::Connection) -> Arc<Notify> {
    let wake = Arc::new(Notify::new());
    let waker = Waker::from(Arc::new(NotifyWaker(wake.clone())));
    let ssl = AsMut::<boring::ssl::SslRef>::as_mut(conn);
    ssl.set_task_waker(Some(waker));
    // As over TCP: the listener's settings are of no use once the handshake is done (the
    // tickets and the 0-RTT answer are part of it), and BoringSSL then frees its copy.
    crate::sys::shed_handshake_config(ssl);
    metrics::connection_opened();
    wake
}

/// The handshake has completed: it no longer counts as one in progress, requests that came
/// in 0-RTT data may go on, and it is counted by kind, its key share by who computed it.
fn handshake_done(
    conn: &mut quiche::Connection,
    context: &mut ConnectionContext,
    confirmed: &watch::Sender<bool>,
) {
    context.handshaking = None;
    confirmed.send_replace(true);
    let ssl = AsMut::<boring::ssl::SslRef>::as_mut(conn);
    let early_data = crate::tls::early_data_outcome(ssl) == Some("accepted");
    crate::tls::record_key_share(ssl);
    metrics::record_handshake(conn.is_resumed(), early_data);
}

/// Holds back sending after a turn that read new requests and had no reply yet, for at most
/// [`ACK_HOLD`] from the first such turn, so that the requests' acknowledgement leaves with
/// their responses.
#[derive(Default)]
struct AckHold {
    /// When the hold runs out; `None` when nothing is held.
    until: Option<std::time::Instant>,
}

impl AckHold {
    /// Whether this turn's sending waits: it read `new_requests` (and has no reply for
    /// them) and the hold has not run out at `now`. Otherwise the hold ends.
    fn holds(&mut self, new_requests: bool, now: std::time::Instant) -> bool {
        let holds = new_requests && *self.until.get_or_insert(now + ACK_HOLD) > now;
        if !holds {
            self.until = None;
        }
        holds
    }
}

/// The connection's HTTP/3 layer, started on the first call; `None` when its setup failed
/// (the connection is then closing).
fn requests_of<'a>(
    http: &'a mut Option<Option<Requests>>,
    conn: &mut quiche::Connection,
    context: &ConnectionContext,
    confirmed: &watch::Receiver<bool>,
) -> Option<&'a mut Requests> {
    http.get_or_insert_with(|| Requests::start(conn, context, confirmed.clone()))
        .as_mut()
}

/// Keeps the client supplied with spare connection IDs, each with its reset token (so it
/// can move to another address with an ID an observer cannot link to the old one), stops
/// routing the IDs it retired, and counts its moves.
fn follow_paths(conn: &mut quiche::Connection, context: &mut ConnectionContext) {
    while let Some(retired) = conn.retired_scid_next() {
        context.routes.borrow_mut().remove(retired.as_ref());
        context.ids.retain(|id| id.as_slice() != retired.as_ref());
    }
    while conn.scids_left() > 0 {
        let id = cid::generate(context.worker);
        let scid = quiche::ConnectionId::from_ref(&id);
        if let Err(err) = conn.new_scid(&scid, reset::token(&id), false) {
            tracing::debug!(error = %err, "no spare connection ID issued");
            break;
        }
        context
            .routes
            .borrow_mut()
            .insert(id.to_vec(), context.queue.clone());
        context.ids.push(id.to_vec());
    }
    while let Some(event) = conn.path_event_next() {
        if let quiche::PathEvent::PeerMigrated(_, to) = event {
            tracing::debug!(from = %context.client, %to, "QUIC client moved");
            context.client = to;
            metrics::record_migration();
        }
    }
}

/// The requests of a connection in progress: each forwards one request to a backend.
type Running = FuturesUnordered<Pin<Box<dyn Future<Output = ()>>>>;

/// The HTTP/3 layer of an established connection, and its request streams.
struct Requests {
    h3: h3::Connection,
    streams: HashMap<u64, Stream>,
    running: Running,
    /// Set by a running request when it queued a reply.
    replied: Rc<Cell<bool>>,
    /// Streams answered whose last bytes quiche may still have to send or resend.
    unacknowledged: Vec<u64>,
    goaway_sent: bool,
    /// The client's address as its requests tell the backend; follows the client when it
    /// moves.
    client: ClientAddress,
    /// The client certificate's fields for every request of the connection.
    client_cert: CertFields,
    /// True once the handshake is confirmed.
    confirmed: watch::Receiver<bool>,
}

impl Requests {
    /// The HTTP/3 layer of a connection just established, or whose 0-RTT data has come.
    fn start(
        conn: &mut quiche::Connection,
        context: &ConnectionContext,
        confirmed: watch::Receiver<bool>,
    ) -> Option<Requests> {
        // With `quic_client_cert_headers`, its requests carry the verified client
        // certificate (in 0-RTT data: the one of the session it resumes).
        let client_cert: CertFields = match context.service.client_cert_headers {
            true => {
                let ssl = AsMut::<boring::ssl::SslRef>::as_mut(conn);
                client_cert::of(Negotiated::from_ssl(ssl, false).client_cert.as_deref())
            }
            false => client_cert::of(None),
        };
        match h3::Config::new().and_then(|c| h3::Connection::with_transport(conn, &c)) {
            Ok(h3) => Some(Requests {
                h3,
                streams: HashMap::new(),
                running: FuturesUnordered::new(),
                replied: Rc::new(Cell::new(false)),
                unacknowledged: Vec::new(),
                goaway_sent: false,
                client: ClientAddress::new(context.client.ip()),
                client_cert,
                confirmed,
            }),
            Err(err) => {
                tracing::debug!(error = %err, "HTTP/3 setup failed");
                let _ = conn.close(true, H3_INTERNAL_ERROR, b"");
                None
            }
        }
    }

    /// Takes new requests, moves bodies both ways, and while draining sends GOAWAY and
    /// closes the connection once every request is answered.
    fn serve(
        &mut self,
        conn: &mut quiche::Connection,
        context: &ConnectionContext,
        wake: &Arc<Notify>,
    ) -> Served {
        if self.client.ip() != context.client.ip() {
            self.client = ClientAddress::new(context.client.ip());
        }
        let (h3, streams, running) = (&mut self.h3, &mut self.streams, &mut self.running);
        let requests = RequestsContext {
            connection: context,
            client: &self.client,
            client_cert: &self.client_cert,
            confirmed: &self.confirmed,
            wake,
            replied: &self.replied,
        };
        let mut started = poll_requests(h3, conn, streams, running, &requests);
        move_bodies(h3, conn, streams);
        // Reading a body's last bytes queues its Finished event.
        started |= poll_requests(h3, conn, streams, running, &requests);
        let replied = send_replies(h3, conn, streams, &mut self.unacknowledged);
        // quiche forgets a stream once both sides are done and acknowledged.
        self.unacknowledged
            .retain(|id| conn.stream_capacity(*id).is_ok());
        let served = Served { started, replied };
        if !*context.draining.borrow() {
            return served;
        }
        if !self.goaway_sent {
            // Requests already received are answered; none after.
            let next = self.streams.keys().max().map_or(0, |id| id + 4);
            let _ = self.h3.send_goaway(conn, next);
            self.goaway_sent = true;
        }
        // Once every answer has been acknowledged: quiche drops what is unsent when the
        // connection closes.
        if self.streams.is_empty() && self.unacknowledged.is_empty() {
            let _ = conn.close(true, H3_NO_ERROR, b"");
        }
        served
    }
}

/// What one turn of [`Requests::serve`] did.
#[derive(Default, Clone, Copy)]
struct Served {
    /// New requests were started.
    started: bool,
    /// Replies were written to their streams (quiche has something to send).
    replied: bool,
}

/// Runs the connection's requests until one of them has queued a reply; never ends before
/// HTTP/3 has started.
fn progress(http: &mut Option<Option<Requests>>) -> impl Future<Output = ()> + '_ {
    std::future::poll_fn(move |cx| {
        let Some(Some(requests)) = http.as_mut() else {
            return Poll::Pending;
        };
        // Until nothing is ready: a request that is not woken again unless polled to its
        // pending state would stall.
        while let Poll::Ready(Some(())) = requests.running.poll_next_unpin(cx) {}
        match requests.replied.take() {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    })
}

/// Sends every packet quiche has ready, several in one system call where the kernel
/// segments them (see [`Outbox`]).
async fn flush(conn: &mut quiche::Connection, socket: &QuicSocket) {
    let mut outbox = Outbox::new(socket);
    loop {
        let (len, info) = match conn.send(outbox.room()) {
            Ok(sent) => sent,
            Err(quiche::Error::Done) => break,
            Err(err) => {
                tracing::debug!(error = %err, "QUIC send failed");
                let _ = conn.close(false, QUIC_INTERNAL_ERROR, b"");
                break;
            }
        };
        outbox.push(len, info.to).await;
    }
    outbox.finish().await;
}

/// What a new request's task is made with besides its own fields.
struct RequestsContext<'a> {
    connection: &'a ConnectionContext,
    client: &'a ClientAddress,
    client_cert: &'a CertFields,
    confirmed: &'a watch::Receiver<bool>,
    wake: &'a Arc<Notify>,
    replied: &'a Rc<Cell<bool>>,
}

/// Takes HTTP/3's events: new requests join `running`; a reset aborts one. True when a
/// request was started.
fn poll_requests(
    h3: &mut h3::Connection,
    conn: &mut quiche::Connection,
    streams: &mut HashMap<u64, Stream>,
    running: &mut Running,
    context: &RequestsContext<'_>,
) -> bool {
    let mut started = false;
    loop {
        match h3.poll(conn) {
            Ok((id, h3::Event::Headers { list, more_frames })) => {
                if streams.contains_key(&id) {
                    // Trailers of a request: HTTP/1.1 gets them as nothing (the body ends).
                    continue;
                }
                metrics::record_stream();
                let (stream, request) = start_request(list, more_frames, context, conn);
                streams.insert(id, stream);
                running.push(request);
                started = true;
            }
            Ok((id, h3::Event::Finished)) => {
                if let Some(stream) = streams.get_mut(&id) {
                    stream.body = None;
                }
            }
            Ok((id, h3::Event::Reset(_))) => {
                if let Some(stream) = streams.remove(&id) {
                    if let Some(body) = stream.body {
                        let _ = body.try_send(Err(BodyAborted));
                    }
                }
            }
            // Body data is read by `move_bodies`, as fast as each backend takes it.
            Ok((_, h3::Event::Data | h3::Event::PriorityUpdate | h3::Event::GoAway)) => {}
            Err(h3::Error::Done) => return started,
            Err(err) => {
                tracing::debug!(error = %err, "HTTP/3 error");
                // quiche has closed the connection itself on a protocol error; this covers the rest.
                let _ = conn.close(true, H3_INTERNAL_ERROR, b"");
                return started;
            }
        }
    }
}

/// A request's stream, and the future that forwards it.
fn start_request(
    fields: Vec<h3::Header>,
    has_body: bool,
    context: &RequestsContext<'_>,
    conn: &quiche::Connection,
) -> (Stream, Pin<Box<dyn Future<Output = ()>>>) {
    let wake = context.wake;
    let (body_tx, body) = if has_body {
        let (tx, rx) = mpsc::channel(BODY_QUEUE);
        (Some(tx), RequestBody::streamed(rx, wake.clone()))
    } else {
        (None, RequestBody::empty())
    };
    let (replies_tx, replies) = mpsc::channel(REPLY_QUEUE);
    let request_context = RequestContext {
        service: context.connection.service.clone(),
        backends: context.connection.backends.clone(),
        pool: context
            .connection
            .service
            .pool_for(conn.server_name())
            .clone(),
        client: context.client.clone(),
        client_cert: context.client_cert.clone(),
        replied: context.replied.clone(),
        early: (!conn.is_established()).then(|| context.confirmed.clone()),
    };
    let request = Box::pin(request::forward(fields, body, request_context, replies_tx));
    let stream = Stream {
        body: body_tx,
        replies,
        unsent: None,
        done: false,
    };
    (stream, request)
}

/// Moves request-body data from QUIC to the running requests while their channels have room;
/// what stays unread holds QUIC's flow-control window shut.
fn move_bodies(
    h3: &mut h3::Connection,
    conn: &mut quiche::Connection,
    streams: &mut HashMap<u64, Stream>,
) {
    // Most requests have no body: no buffer to clear for them on every turn of the loop.
    if streams.values().all(|stream| stream.body.is_none()) {
        return;
    }
    let mut chunk = [0u8; BODY_CHUNK];
    for (id, stream) in streams.iter_mut() {
        let Some(body) = stream.body.as_ref() else {
            continue;
        };
        while let Ok(room) = body.try_reserve() {
            match h3.recv_body(conn, *id, &mut chunk) {
                Ok(read) => room.send(Ok(Bytes::copy_from_slice(&chunk[..read]))),
                Err(_) => break,
            }
        }
    }
}

/// Writes the running requests' replies to their streams while quiche has room, and forgets
/// a stream whose response has ended (adding it to `answered`). True when a reply was
/// taken.
fn send_replies(
    h3: &mut h3::Connection,
    conn: &mut quiche::Connection,
    streams: &mut HashMap<u64, Stream>,
    answered: &mut Vec<u64>,
) -> bool {
    let mut replied = false;
    for (id, stream) in streams.iter_mut() {
        while !stream.done {
            let reply = match stream.unsent.take() {
                Some(reply) => reply,
                None => match stream.replies.try_recv() {
                    Ok(reply) => reply,
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    // The request ended without a last reply.
                    Err(mpsc::error::TryRecvError::Disconnected) => Reply::Abort,
                },
            };
            replied = true;
            match write_reply(h3, conn, *id, reply) {
                Ok(ended) => stream.done = ended,
                Err(rest) => {
                    stream.unsent = Some(rest);
                    break;
                }
            }
        }
    }
    streams.retain(|id, stream| {
        if !stream.done {
            return true;
        }
        answered.push(*id);
        if stream.body.is_some() {
            // Answered before the whole request body came: the rest is not wanted.
            let _ = conn.stream_shutdown(*id, quiche::Shutdown::Read, H3_NO_ERROR);
        }
        false
    });
    replied
}

/// Writes one reply: `Ok(true)` when it ended the response, `Err` with what is left of it
/// when the stream has no room now.
fn write_reply(
    h3: &mut h3::Connection,
    conn: &mut quiche::Connection,
    id: u64,
    reply: Reply,
) -> Result<bool, Reply> {
    match reply {
        Reply::Head { fields, fin } => match h3.send_response(conn, id, &fields.fields(), fin) {
            Ok(()) => Ok(fin),
            Err(h3::Error::StreamBlocked) => Err(Reply::Head { fields, fin }),
            Err(_) => Ok(true),
        },
        Reply::Data(mut data) => match h3.send_body(conn, id, &data, false) {
            Ok(written) if written == data.len() => Ok(false),
            Ok(written) => Err(Reply::Data(data.split_off(written))),
            Err(h3::Error::Done) => Err(Reply::Data(data)),
            Err(_) => Ok(true),
        },
        Reply::Trailers(fields) => {
            match h3.send_additional_headers(conn, id, &fields.fields(), true, true) {
                Ok(()) => Ok(true),
                Err(h3::Error::StreamBlocked) => Err(Reply::Trailers(fields)),
                Err(_) => Ok(true),
            }
        }
        Reply::End => match h3.send_body(conn, id, &[], true) {
            Ok(_) => Ok(true),
            Err(h3::Error::Done) => Err(Reply::End),
            Err(_) => Ok(true),
        },
        Reply::Abort => {
            let _ = conn.stream_shutdown(id, quiche::Shutdown::Write, H3_INTERNAL_ERROR);
            let _ = conn.stream_shutdown(id, quiche::Shutdown::Read, H3_REQUEST_CANCELLED);
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sending_waits_for_new_requests_at_most_the_hold() {
        let start = std::time::Instant::now();
        let mut hold = AckHold::default();
        assert!(!hold.holds(false, start), "nothing new: send");
        assert!(hold.until.is_none());
        assert!(hold.holds(true, start));
        assert_eq!(hold.until, Some(start + ACK_HOLD));
        // More requests in a later turn do not push the end back.
        assert!(hold.holds(true, start + ACK_HOLD / 2));
        assert_eq!(hold.until, Some(start + ACK_HOLD));
        assert!(!hold.holds(true, start + ACK_HOLD), "the hold has run out");
        assert!(hold.until.is_none());
        // A reply (or anything but new requests) sends at once and ends the hold.
        assert!(hold.holds(true, start + ACK_HOLD * 2));
        assert!(!hold.holds(false, start + ACK_HOLD * 2));
        assert!(hold.until.is_none());
    }
}
