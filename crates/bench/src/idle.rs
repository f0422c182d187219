//! `--mode idle`: what idle connections cost the server. Opens N connections, completes
//! each handshake, sends one keep-alive request and reads its response, then holds them
//! all open without a byte moving, and reads the server's resident memory and CPU time
//! from /proc: before the first connection, and over `--duration` of idleness. Half the
//! connections are opened first and held idle for `--duration` too, so that what one more
//! connection costs can be told from what the server pays once, whatever the number (code
//! and allocator pools touched by its first connections, a pool of backend connections). With
//! `--http3` the connections are QUIC connections with one HTTP/3 request each (keep
//! `--duration` under the server's idle timeout, 30 s in tlsterm by default); with
//! `--alpn h2` (and a server that chooses it), TLS connections with one HTTP/2 request each.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rustls::pki_types::ServerName;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::http;
use crate::quic::{self, H3Conn};
use crate::BenchArgs;

/// Connections each client thread has in handshakes at once while opening.
const OPENING_AT_ONCE: usize = 64;

/// What the server's process looked like.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProcessSample {
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// User plus system CPU time, seconds.
    pub cpu_s: f64,
}

#[derive(Debug, Serialize)]
pub struct IdleReport {
    pub url: String,
    pub server_pid: u32,
    /// Connections asked for, and how many were open and idle while measured.
    pub connections: usize,
    pub open: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub open_s: f64,
    pub idle_s: f64,
    pub before: ProcessSample,
    /// After `--duration` with the first half of the connections open and idle.
    pub half_idle: ProcessSample,
    pub idle: ProcessSample,
    /// (RSS while idle - RSS before) / open connections, KiB.
    pub rss_kib_per_connection: f64,
    /// (RSS while idle - RSS while half were idle) / the second half's open connections,
    /// KiB: what each connection adds once the server has served some.
    pub rss_kib_per_added_connection: f64,
    /// The server's CPU time while idle, as a share of one core.
    pub idle_cpu_util: f64,
    /// The server's CPU time while idle per connection and second, microseconds.
    pub idle_cpu_us_per_connection_s: f64,
}

impl IdleReport {
    pub fn text(&self) -> String {
        let mut out = format!(
            "idle connections to {} (server pid {})\n  open        {} of {} ({} errors{}), opened in {:.1}s\n",
            self.url,
            self.server_pid,
            self.open,
            self.connections,
            self.errors,
            self.first_error
                .as_deref()
                .map(|e| format!(", first: {e}"))
                .unwrap_or_default(),
            self.open_s,
        );
        out += &format!(
            "  server RSS  {} KiB before, {} KiB with half idle, {} KiB idle: {:.2} KiB per \
             connection, {:.2} KiB per connection of the second half\n",
            self.before.rss_kib,
            self.half_idle.rss_kib,
            self.idle.rss_kib,
            self.rss_kib_per_connection,
            self.rss_kib_per_added_connection
        );
        out += &format!(
            "  server CPU  {:.3}% of a core over {:.1}s idle ({:.3} us per connection-second)\n",
            self.idle_cpu_util * 100.0,
            self.idle_s,
            self.idle_cpu_us_per_connection_s
        );
        out
    }
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    crate::print_report(&run_idle(args)?, IdleReport::text, args.json)
}

/// Opens the connections, measures, closes them, and returns the report.
pub fn run_idle(args: &BenchArgs) -> anyhow::Result<IdleReport> {
    let crate::Destination {
        url,
        addr,
        server_name,
        path,
        host_header,
    } = crate::destination(args)?;
    if args.concurrency == 0 || args.threads == 0 {
        bail!("--concurrency and --threads must be at least 1");
    }
    if args.threads > args.concurrency {
        bail!("--threads cannot exceed --concurrency (the connections to open)");
    }
    if args.http3 {
        crate::refuse_for_http3(args)?;
    }
    let pid = match args.server_pid {
        Some(pid) => pid,
        None => listening_pid(addr.port())?,
    };
    let mut tls = crate::client_config(args)?;
    crate::tls::offer_cert_compression(&mut tls, &args.cert_compression)?;
    let http3 = crate::http3_request(args, &server_name, &path, &host_header)?;
    let target = Arc::new(Target {
        addr,
        server_name,
        request: http::request(&path, &host_header, false),
        uri: format!("https://{host_header}{path}")
            .parse()
            .context("the URL as an HTTP/2 request's")?,
        connector: TlsConnector::from(Arc::new(tls)),
        timeout: args.timeout,
        http3,
    });

    let before = sample(pid)?;
    let started = Instant::now();
    // Every thread opens half its share and waits at `stage` (holding its connections, its
    // runtime not polled: nothing moves) while the server is measured, then the other
    // half, then waits again until the measurement is done.
    let stage = Arc::new(Barrier::new(args.threads + 1));
    let mut threads = Vec::new();
    for t in 0..args.threads {
        let count =
            args.concurrency / args.threads + usize::from(t < args.concurrency % args.threads);
        let (target, stage) = (target.clone(), stage.clone());
        threads.push(std::thread::spawn(move || {
            open_and_hold(target, count, &stage)
        }));
    }
    stage.wait();
    let mut open_s = started.elapsed().as_secs_f64();
    let half = settle_and_idle(pid, args.duration)?;
    stage.wait();
    let second_half = Instant::now();
    stage.wait();
    open_s += second_half.elapsed().as_secs_f64();
    let whole = settle_and_idle(pid, args.duration)?;
    stage.wait();
    let (mut open, mut open_first, mut errors, mut first_error) = (0, 0, 0, None);
    for thread in threads {
        let outcome = thread.join().expect("client thread panicked");
        open += outcome.open;
        open_first += outcome.open_first;
        errors += outcome.errors;
        first_error = first_error.or(outcome.first_error);
    }
    let (idle, idle_s) = (whole.to, whole.seconds);
    let cpu = idle.cpu_s - whole.from.cpu_s;
    Ok(IdleReport {
        url,
        server_pid: pid,
        connections: args.concurrency,
        open,
        errors,
        first_error,
        open_s,
        idle_s,
        before,
        half_idle: half.to,
        idle,
        rss_kib_per_connection: kib_per(before, idle, open),
        rss_kib_per_added_connection: kib_per(half.to, idle, open - open_first),
        idle_cpu_util: cpu / idle_s.max(1e-9),
        idle_cpu_us_per_connection_s: if open > 0 {
            cpu * 1e6 / idle_s.max(1e-9) / open as f64
        } else {
            0.0
        },
    })
}

/// RSS grown from `from` to `to`, per connection, KiB.
fn kib_per(from: ProcessSample, to: ProcessSample, connections: usize) -> f64 {
    if connections == 0 {
        return 0.0;
    }
    (to.rss_kib as f64 - from.rss_kib as f64) / connections as f64
}

/// The server over a time in which nothing moved.
struct Idled {
    from: ProcessSample,
    to: ProcessSample,
    seconds: f64,
}

/// Lets the server finish what the last responses started (closing nothing, logging),
/// then holds everything idle for `duration`.
fn settle_and_idle(pid: u32, duration: Duration) -> anyhow::Result<Idled> {
    std::thread::sleep(Duration::from_millis(500));
    let from = sample(pid)?;
    let start = Instant::now();
    std::thread::sleep(duration);
    Ok(Idled {
        from,
        to: sample(pid)?,
        seconds: start.elapsed().as_secs_f64(),
    })
}

struct Target {
    addr: SocketAddr,
    server_name: ServerName<'static>,
    request: Vec<u8>,
    /// The same request as HTTP/2 sends it, for a server that chooses `h2`.
    uri: hyper::Uri,
    connector: TlsConnector,
    timeout: Duration,
    /// With `--http3`: the QUIC client's options and the request's header fields.
    http3: Option<(quic::QuicOptions, Vec<quiche::h3::Header>)>,
}

/// A connection held open: TLS over TCP or QUIC, only ever dropped.
type Held = Box<dyn std::any::Any>;

#[derive(Default)]
struct Outcome {
    open: usize,
    /// Open after the first half.
    open_first: usize,
    errors: usize,
    first_error: Option<String>,
}

/// Opens `count` connections on a runtime of this thread in two halves, each followed by
/// two waits at `stage` (opened; measured), then closes them.
fn open_and_hold(target: Arc<Target>, count: usize, stage: &Barrier) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let local = tokio::task::LocalSet::new();
    // quiche's client configuration is the thread's own.
    let quic_client = target.http3.as_ref().map(|(opts, _)| {
        Rc::new(quic::Client::new(opts).expect("options checked before the threads"))
    });
    let mut held = Vec::with_capacity(count);
    let mut outcome = Outcome::default();
    for (first, half) in [(true, count / 2), (false, count - count / 2)] {
        local.block_on(
            &rt,
            open_some(&target, quic_client.as_ref(), half, &mut held, &mut outcome),
        );
        if first {
            outcome.open_first = held.len();
        }
        stage.wait();
        stage.wait();
    }
    outcome.open = held.len();
    drop(held);
    outcome
}

/// Opens `count` connections into `held`, counting the failures in `outcome`.
async fn open_some(
    target: &Arc<Target>,
    quic_client: Option<&Rc<quic::Client>>,
    count: usize,
    held: &mut Vec<Held>,
    outcome: &mut Outcome,
) {
    let mut pending = tokio::task::JoinSet::new();
    let mut started = 0;
    loop {
        // A few at a time: the server's accept queue is not what is measured.
        while started < count && pending.len() < OPENING_AT_ONCE {
            let target = target.clone();
            match quic_client.cloned() {
                Some(client) => pending.spawn_local(async move {
                    open_one_quic(&client, &target)
                        .await
                        .map(|conn| conn as Held)
                }),
                None => pending.spawn_local(async move { open_one(target).await }),
            };
            started += 1;
        }
        match pending.join_next().await {
            None => break,
            Some(Ok(Ok(conn))) => held.push(conn),
            Some(Ok(Err(err))) => {
                outcome.errors += 1;
                outcome.first_error.get_or_insert(err);
            }
            Some(Err(err)) => std::panic::resume_unwind(err.into_panic()),
        }
    }
}

/// One connection: handshake, one keep-alive request (HTTP/2 where the server chose it),
/// its whole response.
async fn open_one(target: Arc<Target>) -> Result<Held, String> {
    let work = async {
        let tcp = TcpStream::connect(target.addr)
            .await
            .map_err(|e| format!("connect: {}", e.kind()))?;
        let _ = tcp.set_nodelay(true);
        let mut conn = target
            .connector
            .connect(target.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        if conn.get_ref().1.alpn_protocol() == Some(b"h2") {
            return open_http2(conn, &target.uri).await;
        }
        conn.write_all(&target.request)
            .await
            .map_err(|e| format!("write: {}", e.kind()))?;
        let response = http::Reader::default()
            .read_response(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if !(200..300).contains(&response.status) {
            return Err(format!("http status {}", response.status));
        }
        if response.close {
            return Err("the server closed the connection after its response".to_string());
        }
        Ok(Box::new(conn) as Held)
    };
    tokio::time::timeout(target.timeout, work)
        .await
        .unwrap_or_else(|_| Err("timeout".to_string()))
}

/// An HTTP/2 connection (hyper's client) over `conn`: one request, its whole response; held
/// with the task that drives the connection, which then has nothing to do.
async fn open_http2(conn: TlsStream<TcpStream>, uri: &hyper::Uri) -> Result<Held, String> {
    use http_body_util::{BodyExt, Empty};
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(OnThisThread)
        .handshake(hyper_util::rt::TokioIo::new(conn))
        .await
        .map_err(|e| format!("HTTP/2: {e}"))?;
    let driver = tokio::task::spawn_local(connection);
    let request = hyper::Request::get(uri.clone())
        .body(Empty::<bytes::Bytes>::new())
        .expect("a GET of a parsed URI");
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("HTTP/2 request: {e}"))?;
    let status = response.status();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("HTTP/2 response body: {e}"))?;
    if !status.is_success() {
        return Err(format!("http status {}", status.as_u16()));
    }
    Ok(Box::new((sender, driver)))
}

/// Runs hyper's HTTP/2 tasks on the opening thread's runtime (the connection is not `Send`
/// there).
#[derive(Clone, Copy)]
struct OnThisThread;

impl<F: std::future::Future + 'static> hyper::rt::Executor<F> for OnThisThread {
    fn execute(&self, task: F) {
        tokio::task::spawn_local(task);
    }
}

/// One QUIC connection: handshake, one HTTP/3 request, its whole response.
async fn open_one_quic(client: &quic::Client, target: &Target) -> Result<Box<H3Conn>, String> {
    let (_, headers) = target.http3.as_ref().expect("an HTTP/3 target");
    let work = async {
        let mut conn = H3Conn::connect(client, target.addr, None).await?;
        let response = conn.get(headers).await?;
        if !(200..300).contains(&response.status) {
            return Err(format!("http status {}", response.status));
        }
        Ok(Box::new(conn))
    };
    tokio::time::timeout(target.timeout, work)
        .await
        .unwrap_or_else(|_| Err("timeout".to_string()))
}

/// Resident memory and CPU time of process `pid`, from /proc.
pub fn sample(pid: u32) -> anyhow::Result<ProcessSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS in /proc/PID/status")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name, in parentheses, may hold spaces: fields are counted after it.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("unreadable /proc/PID/stat")?
        .1
        .split_whitespace()
        .collect();
    // utime and stime: fields 14 and 15 of stat(5), 12 and 13 after the name.
    let ticks: u64 = fields
        .get(11..13)
        .context("short /proc/PID/stat")?
        .iter()
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum();
    // SAFETY: sysconf only reads a system constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ProcessSample {
        rss_kib,
        cpu_s: ticks as f64 / per_second,
    })
}

/// The process listening on TCP `port` (on any address): the socket's inode from
/// /proc/net/tcp{,6}, then the process holding a descriptor of it.
pub fn listening_pid(port: u16) -> anyhow::Result<u32> {
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if local_port == Some(port) && f.get(3) == Some(&LISTEN) {
                if let Some(inode) = f.get(9) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
    }
    if inodes.is_empty() {
        bail!("nothing listens on port {port}: give --server-pid");
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|link| inodes.iter().any(|i| link.as_os_str() == i.as_str()))
        });
        if holds {
            found.push(pid);
        }
    }
    match found.as_slice() {
        [pid] => Ok(*pid),
        [] => {
            bail!("no process of ours holds the socket listening on port {port}: give --server-pid")
        }
        pids => {
            bail!("processes {pids:?} hold the socket listening on port {port}: give --server-pid")
        }
    }
}
