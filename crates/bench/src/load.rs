//! The load generator: `threads` OS threads, each a tokio current-thread runtime
//! driving its share of the connections (closed loop) or of the rate (open loop).

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, HandshakeKind};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::{JoinSet, LocalSet};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::http::{self, Response};
use crate::quic::{self, H3Conn, QuicOptions};
use crate::stats::{micros, Hist, Live, Stats};
use crate::tls;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A new connection (full handshake, no session offered) per request.
    Full,
    /// Chains of `per_session` connections sharing a session: one full, then resumed.
    Resume,
    /// Keep-alive connections, many requests each.
    Bulk,
}

/// Everything a run needs, resolved from the command line.
pub struct LoadConfig {
    pub mode: Mode,
    pub addr: SocketAddr,
    pub server_name: ServerName<'static>,
    pub request_close: Vec<u8>,
    pub request_keepalive: Vec<u8>,
    pub concurrency: usize,
    pub threads: usize,
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    pub per_session: u32,
    /// Resume mode: requests of resumed connections go as 0-RTT early data.
    pub early_data: bool,
    /// Open-loop rate in units of work per second (connections in full/resume mode,
    /// requests in bulk mode).
    pub rate: Option<f64>,
    pub timeout: Duration,
    /// Base TLS config with resumption disabled.
    pub tls: Arc<ClientConfig>,
    /// HTTP/3 over QUIC instead of HTTP/1.1 over TLS: the client's options and the
    /// request's header fields.
    pub http3: Option<(QuicOptions, Vec<quiche::h3::Header>)>,
}

/// How much work is left: a deadline, a count, or both.
struct Budget {
    deadline: Option<Instant>,
    remaining: Option<AtomicI64>,
}

impl Budget {
    /// Claim one unit of work scheduled at `at`.
    fn take(&self, at: Instant) -> bool {
        if self.deadline.is_some_and(|d| at >= d) {
            return false;
        }
        match &self.remaining {
            Some(r) => r.fetch_sub(1, Relaxed) > 0,
            None => true,
        }
    }
}

/// Per-thread context shared by that thread's tasks.
struct Ctx {
    cfg: Arc<LoadConfig>,
    live: Arc<Live>,
    budget: Arc<Budget>,
    stats: RefCell<Stats>,
    /// (protocol version, cipher suite, key-exchange group) codes seen.
    negotiated: RefCell<HashMap<(u16, u16, u16), u64>>,
    /// The thread's HTTP/3 client, with `--http3`.
    quic: Option<quic::Client>,
}

/// The state a unit of work carries from one unit to the next.
struct Slot {
    /// Resume mode: the chain's config (own session store) and connections made in it.
    chain: Option<(Arc<ClientConfig>, u32)>,
    /// Bulk mode: the kept-alive connection.
    conn: Option<TlsStream<TcpStream>>,
    reader: http::Reader,
    /// HTTP/3, resume mode: the newest ticket of the chain and connections made in it.
    quic_chain: Option<(Option<Vec<u8>>, u32)>,
    /// HTTP/3, bulk mode: the kept-alive connection.
    h3: Option<H3Conn>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            chain: None,
            conn: None,
            reader: http::Reader::default(),
            quic_chain: None,
            h3: None,
        }
    }

    /// Restart the session chain, after a failure.
    fn drop_chain(&mut self) {
        self.chain = None;
        self.quic_chain = None;
    }

    /// The run is over: a kept-alive HTTP/3 connection is closed, so that the server
    /// forgets it now rather than at its idle timeout.
    async fn finish(&mut self) {
        if let Some(conn) = self.h3.take() {
            conn.close().await;
        }
    }

    /// Drop the kept-alive connection, if any, with whatever the reader still holds of
    /// it: bytes of a response that failed to parse (or that ended mid-header) belong to
    /// that connection, and read as the start of the next one's response would fail it too.
    fn drop_conn(&mut self) {
        self.conn = None;
        self.h3 = None;
        self.reader.reset();
    }
}

/// The time between scheduled starts for an open-loop rate (per thread), or `None`
/// when no interval of whole nanoseconds expresses it: a rate above 1e9 per second
/// would round to a zero interval, which schedules every unit at the start so the
/// schedule never reaches the deadline; zero, negative, NaN or vanishingly small rates
/// have no interval a `Duration` holds.
pub fn open_loop_interval(rate: f64) -> Option<Duration> {
    let secs = 1.0 / rate;
    if secs.is_nan() || secs < 1e-9 {
        return None;
    }
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
}

/// Run the load and return the merged stats and the wall time it took.
pub fn run(cfg: LoadConfig, live: Arc<Live>, mut on_tick: impl FnMut(f64)) -> (Stats, f64) {
    let cfg = Arc::new(cfg);
    let start = Instant::now();
    let budget = Arc::new(Budget {
        // A duration past what the clock can represent has no deadline: it would never
        // be reached. `run_load` refuses such durations before getting here.
        deadline: cfg.duration.and_then(|d| start.checked_add(d)),
        remaining: cfg.requests.map(|n| AtomicI64::new(n as i64)),
    });
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // More threads than connections would give each thread a connection of its own
    // (each runs at least one), running more than `concurrency`: cap them so the
    // connections run are the ones asked for and reported. `run_load` refuses this.
    let threads = cfg.threads.clamp(1, cfg.concurrency.max(1));
    let mut handles = Vec::new();
    for t in 0..threads {
        // Split connections and rate evenly; the first threads take the remainder.
        let conns = cfg.concurrency / threads + usize::from(t < cfg.concurrency % threads);
        let rate = cfg.rate.map(|r| r / threads as f64);
        let (cfg, live, budget, done) =
            (cfg.clone(), live.clone(), budget.clone(), done_tx.clone());
        handles.push(std::thread::spawn(move || {
            let stats = thread_main(cfg, live, budget, conns.max(1), rate);
            let _ = done.send(());
            stats
        }));
    }
    drop(done_tx);
    // Progress ticks once a second until every thread has reported.
    let mut finished = 0;
    let mut next_tick = start + Duration::from_secs(1);
    while finished < threads {
        let wait = next_tick.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(wait) {
            Ok(()) => finished += 1,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                on_tick(start.elapsed().as_secs_f64());
                next_tick += Duration::from_secs(1);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut total = Stats::default();
    for h in handles {
        total.merge(h.join().expect("worker thread panicked"));
    }
    (total, elapsed)
}

fn thread_main(
    cfg: Arc<LoadConfig>,
    live: Arc<Live>,
    budget: Arc<Budget>,
    conns: usize,
    rate: Option<f64>,
) -> Stats {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // `run_load` has built a client from the same options before the run.
    let quic = cfg.http3.as_ref().map(|(opts, _)| {
        quic::Client::new(opts).expect("the QUIC client was built before the run")
    });
    let ctx = Rc::new(Ctx {
        cfg,
        live,
        budget,
        stats: RefCell::new(Stats::default()),
        negotiated: RefCell::new(HashMap::new()),
        quic,
    });
    let local = LocalSet::new();
    local.block_on(&rt, async {
        match rate {
            None => closed_loop(&ctx, conns).await,
            Some(r) => open_loop(&ctx, conns, r).await,
        }
    });
    drop(local);
    let ctx = Rc::try_unwrap(ctx).unwrap_or_else(|_| panic!("tasks still hold the context"));
    let mut stats = ctx.stats.into_inner();
    for ((v, s, g), n) in ctx.negotiated.into_inner() {
        let group = match g {
            0 => "-".to_string(),
            g => format!("{:?}", rustls::NamedGroup::from(g)),
        };
        let name = format!(
            "{:?} {:?} {group}",
            rustls::ProtocolVersion::from(v),
            rustls::CipherSuite::from(s)
        );
        *stats.negotiated.entry(name).or_default() += n;
    }
    stats
}

/// `conns` tasks, each starting its next unit as soon as the last one ends.
async fn closed_loop(ctx: &Rc<Ctx>, conns: usize) {
    let mut set = JoinSet::new();
    for _ in 0..conns {
        let ctx = ctx.clone();
        set.spawn_local(async move {
            let mut slot = Slot::new();
            loop {
                let now = Instant::now();
                if !ctx.budget.take(now) {
                    break;
                }
                unit(&ctx, &mut slot, now).await;
            }
            slot.finish().await;
        });
    }
    while set.join_next().await.is_some() {}
}

/// Units start at fixed times (rate per second) whether or not earlier ones have
/// finished; at most `conns` run at once, the rest queue. Latencies are measured
/// from the scheduled start, so queueing shows (no coordinated omission).
async fn open_loop(ctx: &Rc<Ctx>, conns: usize, rate: f64) {
    // `run_load` refuses rates without an interval; the fallback only keeps the
    // schedule advancing.
    let interval = open_loop_interval(rate).unwrap_or(Duration::from_nanos(1));
    let sem = Rc::new(Semaphore::new(conns));
    let slots = Rc::new(RefCell::new(
        (0..conns).map(|_| Slot::new()).collect::<Vec<_>>(),
    ));
    let start = Instant::now();
    let mut set = JoinSet::new();
    for i in 0u64.. {
        let sched = start + interval.mul_f64(i as f64);
        if !ctx.budget.take(sched) {
            break;
        }
        // A schedule faster than this thread can start units falls behind the wall
        // clock: stop at the deadline all the same rather than queueing units without
        // bound until the schedule catches up.
        if ctx.budget.deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        tokio::time::sleep_until(sched.into()).await;
        while set.try_join_next().is_some() {}
        let (ctx, sem, slots) = (ctx.clone(), sem.clone(), slots.clone());
        set.spawn_local(async move {
            let _permit = sem.acquire().await.expect("semaphore open");
            let mut slot = slots.borrow_mut().pop().expect("a slot per permit");
            let lag = micros(sched.elapsed());
            ctx.stats.borrow_mut().record(Hist::StartLag, lag);
            unit(&ctx, &mut slot, sched).await;
            slots.borrow_mut().push(slot);
        });
    }
    while set.join_next().await.is_some() {}
    let mut idle = std::mem::take(&mut *slots.borrow_mut());
    for slot in &mut idle {
        slot.finish().await;
    }
}

/// One unit of work, bounded by the timeout. Work cut short because the run is
/// over (past the deadline plus a grace second) is not counted as an error.
async fn unit(ctx: &Ctx, slot: &mut Slot, sched: Instant) {
    let mut limit = ctx.cfg.timeout;
    let mut at_end = false;
    if let Some(d) = ctx.budget.deadline {
        let grace_end = d.checked_add(Duration::from_secs(1)).unwrap_or(d);
        let left = grace_end.saturating_duration_since(Instant::now());
        if left < limit {
            limit = left;
            at_end = true;
        }
    }
    let result = tokio::time::timeout(limit, unit_inner(ctx, slot, sched)).await;
    let err = match result {
        Ok(Ok(())) => return,
        Ok(Err(kind)) => kind,
        Err(_) if at_end => {
            slot.drop_conn();
            return;
        }
        Err(_) => "timeout".to_string(),
    };
    // Any failure drops the connection and restarts the session chain.
    slot.drop_conn();
    slot.drop_chain();
    ctx.stats.borrow_mut().error(&err);
    ctx.live.errors.fetch_add(1, Relaxed);
}

/// A connected TLS stream; with 0-RTT it is returned before the handshake completes (the
/// request then goes as early data), and the handshake is recorded once it has.
async fn connect(
    ctx: &Ctx,
    config: Arc<ClientConfig>,
    start: Instant,
) -> Result<TlsStream<TcpStream>, String> {
    let tcp = TcpStream::connect(ctx.cfg.addr)
        .await
        .map_err(|e| format!("connect: {}", e.kind()))?;
    // Requests and responses are small in full mode: never wait for Nagle.
    let _ = tcp.set_nodelay(true);
    let tls = TlsConnector::from(config)
        .early_data(ctx.cfg.early_data)
        .connect(ctx.cfg.server_name.clone(), tcp)
        .await
        .map_err(|e| match e.get_ref() {
            Some(inner) => format!("handshake: {inner}"),
            None => format!("handshake: {}", e.kind()),
        })?;
    if !tls.get_ref().1.is_handshaking() {
        record_handshake(ctx, tls.get_ref().1, start);
    }
    Ok(tls)
}

fn record_handshake(ctx: &Ctx, conn: &ClientConnection, start: Instant) {
    let resumed = conn.handshake_kind() == Some(HandshakeKind::Resumed);
    let key = (
        conn.protocol_version().map(u16::from).unwrap_or(0),
        conn.negotiated_cipher_suite()
            .map(|s| u16::from(s.suite()))
            .unwrap_or(0),
        conn.negotiated_key_exchange_group()
            .map(|g| u16::from(g.name()))
            .unwrap_or(0),
    );
    *ctx.negotiated.borrow_mut().entry(key).or_default() += 1;
    let mut stats = ctx.stats.borrow_mut();
    stats.record(Hist::Handshake, micros(start.elapsed()));
    stats.handshakes += 1;
    ctx.live.handshakes.fetch_add(1, Relaxed);
    if resumed {
        stats.resumed += 1;
        ctx.live.resumed.fetch_add(1, Relaxed);
    }
    if conn.is_early_data_accepted() {
        stats.early_data_accepted += 1;
    }
    if conn.ech_status() == rustls::client::EchStatus::Accepted {
        stats.ech_accepted += 1;
    }
}

async fn unit_inner(ctx: &Ctx, slot: &mut Slot, sched: Instant) -> Result<(), String> {
    if let (Some(client), Some((_, request))) = (&ctx.quic, &ctx.cfg.http3) {
        return unit_h3(ctx, client, request, slot, sched).await;
    }
    let cfg = &ctx.cfg;
    let keepalive = cfg.mode == Mode::Bulk;
    let mut handshaking = false;
    let mut conn = match slot.conn.take() {
        Some(c) => c,
        None => {
            let config = match cfg.mode {
                Mode::Full | Mode::Bulk => cfg.tls.clone(),
                Mode::Resume => {
                    if slot.chain.as_ref().is_none_or(|c| c.1 >= cfg.per_session) {
                        let config = tls::with_fresh_session_store(&cfg.tls, cfg.early_data);
                        slot.chain = Some((config, 0));
                    }
                    let chain = slot.chain.as_mut().expect("chain set above");
                    chain.1 += 1;
                    chain.0.clone()
                }
            };
            // A new connection starts with an empty reader: nothing left of an
            // earlier connection's bytes may be read as this one's response.
            slot.reader.reset();
            let conn = connect(ctx, config, sched).await?;
            handshaking = conn.get_ref().1.is_handshaking();
            conn
        }
    };
    let req = if keepalive {
        &cfg.request_keepalive
    } else {
        &cfg.request_close
    };
    let t0 = Instant::now();
    conn.write_all(req)
        .await
        .map_err(|e| format!("write: {}", e.kind()))?;
    if handshaking {
        // The request went as early data; flushing completes the handshake (and resends
        // the request if the server refused the early data).
        conn.flush()
            .await
            .map_err(|e| format!("handshake: {}", e.kind()))?;
        record_handshake(ctx, conn.get_ref().1, sched);
    }
    let resp = slot
        .reader
        .read_response(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    record_response(ctx, &resp, t0, sched)?;
    if keepalive && !resp.close {
        slot.conn = Some(conn);
    } else {
        // The connection is dropped: the server has closed (Connection: close).
        slot.drop_conn();
    }
    Ok(())
}

/// Counts a response read completely (sent at `t0`, its unit scheduled at `sched`); a
/// status other than 2xx is an error.
fn record_response(ctx: &Ctx, resp: &Response, t0: Instant, sched: Instant) -> Result<(), String> {
    let now = Instant::now();
    {
        let mut stats = ctx.stats.borrow_mut();
        stats.record(Hist::Request, micros(now - t0));
        stats.record(Hist::Total, micros(now - sched));
        stats.requests += 1;
        stats.body_bytes += resp.body_len;
        stats.wire_bytes += resp.wire_len;
        *stats.status.entry(resp.status).or_default() += 1;
    }
    ctx.live.requests.fetch_add(1, Relaxed);
    ctx.live.bytes.fetch_add(resp.wire_len, Relaxed);
    if !(200..300).contains(&resp.status) {
        return Err(format!("http status {}", resp.status));
    }
    Ok(())
}

/// One unit of work over HTTP/3: as for TCP, a new connection per request (full), chains
/// of `per_session` connections resuming with the newest ticket (resume), or requests on
/// a kept-alive connection (bulk).
async fn unit_h3(
    ctx: &Ctx,
    client: &quic::Client,
    request: &[quiche::h3::Header],
    slot: &mut Slot,
    sched: Instant,
) -> Result<(), String> {
    let cfg = &ctx.cfg;
    let mut conn = match slot.h3.take() {
        Some(conn) => conn,
        None => {
            let mut session = None;
            if cfg.mode == Mode::Resume {
                if slot
                    .quic_chain
                    .as_ref()
                    .is_none_or(|c| c.1 >= cfg.per_session)
                {
                    slot.quic_chain = Some((None, 0));
                }
                let chain = slot.quic_chain.as_mut().expect("chain set above");
                chain.1 += 1;
                session = chain.0.clone();
            }
            let conn = H3Conn::connect(client, cfg.addr, session.as_deref()).await?;
            record_h3_handshake(ctx, &conn, sched);
            conn
        }
    };
    let t0 = Instant::now();
    let resp = conn.get(request).await?;
    if let Some(chain) = slot.quic_chain.as_mut() {
        if let Some(ticket) = conn.session() {
            chain.0 = Some(ticket);
        }
    }
    let counted = record_response(ctx, &resp, t0, sched);
    if counted.is_ok() && cfg.mode == Mode::Bulk && conn.reusable() {
        slot.h3 = Some(conn);
    } else {
        conn.close().await;
    }
    counted
}

fn record_h3_handshake(ctx: &Ctx, conn: &H3Conn, start: Instant) {
    let mut stats = ctx.stats.borrow_mut();
    stats.record(Hist::Handshake, micros(start.elapsed()));
    stats.handshakes += 1;
    ctx.live.handshakes.fetch_add(1, Relaxed);
    if conn.is_resumed() {
        stats.resumed += 1;
        ctx.live.resumed.fetch_add(1, Relaxed);
    }
    if let Some((opts, _)) = &ctx.cfg.http3 {
        *stats.negotiated.entry(opts.negotiated()).or_default() += 1;
    }
}
