//! Test support: certificates made with the openssl CLI, a tlsterm child process whose log
//! is watched for readiness, a raw backend that records what it receives, and an
//! in-process TLS client. Everything runs on 127.0.0.1 and ends by itself.
#![allow(dead_code)]

pub mod client_pki;
pub mod config;
pub mod echo;
pub mod pebble;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use boring::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const TLSTERM: &str = env!("CARGO_BIN_EXE_tlsterm");
/// Upper bound for anything a test waits for; reaching it means the test failed.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A port for a tlsterm child to listen on. Taken below the kernel's ephemeral range, so
/// that no outgoing connection or `bind(0)` listener of a parallel test can take it
/// between this check and the child's bind (which made CI fail once), and handed out once
/// per test process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let span = 10_000.min(ephemeral_low.saturating_sub(1024));
    if span < 1000 {
        // No room below the ephemeral range: take one from the kernel.
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        return listener.local_addr().unwrap().port();
    }
    let low = ephemeral_low - span;
    // Test processes run one after another; a start that depends on the process keeps a
    // port the previous one just closed out of the way, and scattering it (rather than
    // pid % span) keeps processes with neighbouring pids apart.
    let start = (std::process::id().wrapping_mul(7919)) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (low + (start + n) % span) as u16;
        if StdListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{ephemeral_low}");
}

pub fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `tlsterm serve --check` on `config`, which must refuse it; returns what it printed on
/// stderr (the line and key it names).
pub fn check_refuses(config: &Path) -> String {
    let out = Command::new(TLSTERM)
        .args(["serve", "--check", "-c"])
        .arg(config)
        .output()
        .expect("tlsterm runs");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{config:?} was accepted: {stderr}");
    stderr
}

#[derive(Clone, Copy, Debug)]
pub enum KeyType {
    Rsa2048,
    Rsa4096,
    EcdsaP256,
    EcdsaP384,
}

/// A self-signed certificate for `cn` (also its SAN) written as `<stem>.pem`/`<stem>.key`.
pub fn make_cert(dir: &Path, stem: &str, cn: &str, key: KeyType) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{stem}.pem"));
    let keyfile = dir.join(format!("{stem}.key"));
    let newkey = match key {
        KeyType::Rsa2048 => vec!["-newkey", "rsa:2048"],
        KeyType::Rsa4096 => vec!["-newkey", "rsa:4096"],
        KeyType::EcdsaP256 => vec!["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
        KeyType::EcdsaP384 => vec!["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"],
    };
    run(Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "2"])
        .args(newkey)
        .arg("-keyout")
        .arg(&keyfile)
        .arg("-out")
        .arg(&cert)
        .args(["-subj", &format!("/CN={cn}")])
        .args(["-addext", &format!("subjectAltName=DNS:{cn}")]));
    (cert, keyfile)
}

/// The lines a child process wrote to stderr, with a way to wait for one.
#[derive(Clone, Default)]
pub struct Log {
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
}

impl Log {
    /// Collects the lines `reader` (a child's output) writes, on a thread of its own.
    pub fn follow(reader: impl std::io::Read + Send + 'static) -> Log {
        let log = Log::default();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                let (lines, changed) = &*sink.lines;
                lines.lock().unwrap().push(line);
                changed.notify_all();
            }
        });
        log
    }

    /// How many lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.lines_with(needle).len()
    }

    /// The lines that contain `needle`, in order.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.lines
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }

    /// Waits until at least `times` lines contain `needle`.
    pub fn wait_for_count(&self, needle: &str, times: usize) {
        let (lines, changed) = &*self.lines;
        let guard = lines.lock().unwrap();
        let (guard, timeout) = changed
            .wait_timeout_while(guard, DEADLINE, |lines| {
                lines.iter().filter(|l| l.contains(needle)).count() < times
            })
            .unwrap();
        assert!(
            !timeout.timed_out(),
            "fewer than {times} log lines containing {needle:?}; log:\n{}",
            guard.join("\n")
        );
    }

    /// Waits until a line containing `needle` appears after the first `skip` lines.
    pub fn wait_for(&self, needle: &str, skip: usize) -> String {
        let (lines, changed) = &*self.lines;
        let guard = lines.lock().unwrap();
        let (guard, timeout) = changed
            .wait_timeout_while(guard, DEADLINE, |lines| {
                !lines.iter().skip(skip).any(|l| l.contains(needle))
            })
            .unwrap();
        assert!(
            !timeout.timed_out(),
            "no log line containing {needle:?}; log:\n{}",
            guard.join("\n")
        );
        guard
            .iter()
            .skip(skip)
            .find(|l| l.contains(needle))
            .unwrap()
            .clone()
    }

    pub fn len(&self) -> usize {
        self.lines.0.lock().unwrap().len()
    }

    pub fn contains(&self, needle: &str) -> bool {
        self.lines
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    pub fn text(&self) -> String {
        self.lines.0.lock().unwrap().join("\n")
    }
}

/// A running `tlsterm serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    pub log: Log,
    pub config: PathBuf,
}

impl Server {
    /// Starts `tlsterm serve -c <config>` and waits until it says it is serving.
    pub fn start(config: &Path) -> Server {
        let mut child = Command::new(TLSTERM)
            .args(["serve", "-c"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tlsterm starts");
        let log = Log::follow(child.stderr.take().unwrap());
        log.wait_for("tlsterm serving", 0);
        Server {
            child,
            log,
            config: config.to_path_buf(),
        }
    }

    pub fn signal(&self, signal: &str) {
        run(Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string()));
    }

    /// Sends SIGHUP and waits for the reload's verdict line; returns it.
    pub fn reload(&self) -> String {
        let before = self.log.len();
        self.signal("HUP");
        let (lines, changed) = &*self.log.lines;
        let guard = lines.lock().unwrap();
        let (guard, timeout) = changed
            .wait_timeout_while(guard, DEADLINE, |lines| {
                !lines
                    .iter()
                    .skip(before)
                    .any(|l| l.contains("reloaded") || l.contains("reload refused"))
            })
            .unwrap();
        assert!(!timeout.timed_out(), "no reload verdict");
        guard
            .iter()
            .skip(before)
            .find(|l| l.contains("reloaded") || l.contains("reload refused"))
            .unwrap()
            .clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `openssl s_client` with `args`, sending `input`; returns stdout and stderr together.
pub fn s_client(port: u16, args: &[&str], input: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("timeout")
        .args(["20", "openssl", "s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub const GET_CLOSE: &str = "GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

/// A TLS client stream from the in-process client.
pub type TlsClient = tokio_boring::SslStream<TcpStream>;

/// Connects with BoringSSL. Certificates are not verified (they are self-signed), but the
/// handshake signature still is: a wrong signature fails the handshake.
pub async fn tls_connect(
    port: u16,
    sni: &str,
    max_version: SslVersion,
    alpn: &[&str],
) -> anyhow::Result<TlsClient> {
    let mut builder = SslConnector::builder(SslMethod::tls())?;
    builder.set_verify(SslVerifyMode::NONE);
    builder.set_max_proto_version(Some(max_version))?;
    if !alpn.is_empty() {
        let mut wire = Vec::new();
        for proto in alpn {
            wire.push(proto.len() as u8);
            wire.extend_from_slice(proto.as_bytes());
        }
        builder.set_alpn_protos(&wire)?;
    }
    let config = builder.build().configure()?;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    Ok(tokio_boring::connect(config, sni, tcp).await?)
}

/// Sends one keep-alive request for `path` and reads the response body (Content-Length).
pub async fn http_get(stream: &mut TlsClient, path: &str) -> anyhow::Result<Vec<u8>> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        anyhow::ensure!(
            stream.read(&mut byte).await? == 1,
            "connection closed in headers"
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head)?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "bad response: {head}");
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length").then_some(value)
        })
        .ok_or_else(|| anyhow::anyhow!("no Content-Length"))?
        .trim()
        .parse()?;
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await?;
    Ok(body)
}

/// A backend that accepts connections and hands each to the test.
pub struct RawBackend {
    pub listener: tokio::net::TcpListener,
    pub address: SocketAddr,
}

impl RawBackend {
    pub async fn bind() -> RawBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        RawBackend { listener, address }
    }

    pub async fn accept(&self) -> TcpStream {
        tokio::time::timeout(DEADLINE, self.listener.accept())
            .await
            .expect("tlsterm connects to the backend")
            .unwrap()
            .0
    }
}

/// Writes a config file with one listener per `listeners` entry (TOML body of the listener).
pub fn write_config(dir: &Path, header: &str, listeners: &[String]) -> PathBuf {
    let mut text = format!("workers = 2\n{header}\n");
    for listener in listeners {
        text.push_str("\n[[listener]]\n");
        text.push_str(listener);
        text.push('\n');
    }
    if !header.contains("[admin]") {
        // Every test server gets its own admin port, so tests can run in parallel.
        text.push_str(&format!(
            "\n[admin]\naddress = \"127.0.0.1:{}\"\n",
            free_port()
        ));
    }
    let path = dir.join("tlsterm.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The `[admin] address` of a config file written by `write_config`.
pub fn admin_address(config: &Path) -> Option<SocketAddr> {
    let text = std::fs::read_to_string(config).ok()?;
    let admin = text.split("[admin]").nth(1)?;
    let line = admin
        .lines()
        .find(|l| l.trim_start().starts_with("address"))?;
    line.split('"').nth(1)?.parse().ok()
}

/// Polls `probe` until it gives a value; fails the test after `DEADLINE`. For state that
/// has no event to wait on: a counter the server bumps after the client has seen the
/// outcome, a process's sockets, a file another process writes.
pub fn eventually<T>(what: &str, probe: impl FnMut() -> Option<T>) -> T {
    poll(probe, || format!("timed out waiting until {what}"))
}

/// Polls `probe` until it gives a value; after `DEADLINE` fails the test with `failure()`.
fn poll<T>(mut probe: impl FnMut() -> Option<T>, failure: impl FnOnce() -> String) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return value;
        }
        if start.elapsed() >= DEADLINE {
            panic!("{}", failure());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`eventually`] for a condition.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    eventually(what, || condition().then_some(()))
}

/// Waits until the admin listener's `/metrics` holds `line` (a series and its value);
/// returns the body. The server counts a refused handshake after sending its alert, so a
/// client can see the refusal before the counter moves.
pub fn wait_for_metric(admin: SocketAddr, line: &str) -> String {
    let last = std::cell::RefCell::new(String::new());
    poll(
        || {
            let body = admin_get(admin, "/metrics").1;
            let found = body.contains(line).then(|| body.clone());
            *last.borrow_mut() = body;
            found
        },
        || format!("`{line}` never appeared in /metrics:\n{}", last.borrow()),
    )
}

/// GET `path` from the admin listener; returns (status code, body).
pub fn admin_get(address: SocketAddr, path: &str) -> (u16, String) {
    raw_http(
        address,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
}

/// Sends `request` bytes as they are; returns the response's status code and body.
pub fn raw_http(address: SocketAddr, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A running tlsterm with one listener on a free port forwarding to `backend`, plus the
/// listener keys in `extra`. Returns the temporary directory (keep it alive), the server
/// and the port.
pub fn start_listener(backend: &str, extra: &str) -> (tempfile::TempDir, Server, u16) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listener = format!("address = \"127.0.0.1:{port}\"\nbackends = [\"{backend}\"]\n{extra}");
    let config = write_config(dir.path(), "", &[listener]);
    let server = Server::start(&config);
    (dir, server, port)
}

/// A loopback address that refuses connections (its socket is bound, never listening),
/// and the socket, which keeps it so (and from anyone else) while it is held.
pub fn refusing_address() -> (tokio::net::TcpSocket, String) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = socket.local_addr().unwrap().to_string();
    (socket, address)
}

/// An ECDSA P-256 CA (`ca.pem`, `ca.key`) in `dir`.
pub fn make_ca(dir: &Path, common_name: &str) {
    let p = |name: &str| dir.join(name).display().to_string();
    run(Command::new("openssl").args([
        "req",
        "-x509",
        "-nodes",
        "-days",
        "5",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-subj",
        &format!("/CN={common_name}"),
        "-keyout",
        &p("ca.key"),
        "-out",
        &p("ca.pem"),
    ]));
}

/// A leaf `<stem>.pem`/`<stem>.key` signed by the CA in `dir`, with extensions `ext`.
pub fn make_leaf(dir: &Path, stem: &str, subject: &str, ext: &str) {
    let p = |name: &str| dir.join(name).display().to_string();
    run(Command::new("openssl").args([
        "req",
        "-new",
        "-nodes",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-subj",
        subject,
        "-keyout",
        &p(&format!("{stem}.key")),
        "-out",
        &p(&format!("{stem}.csr")),
    ]));
    std::fs::write(dir.join(format!("{stem}.ext")), format!("{ext}\n")).unwrap();
    run(Command::new("openssl").args([
        "x509",
        "-req",
        "-days",
        "2",
        "-in",
        &p(&format!("{stem}.csr")),
        "-CA",
        &p("ca.pem"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-extfile",
        &p(&format!("{stem}.ext")),
        "-out",
        &p(&format!("{stem}.pem")),
    ]));
}

/// Sum of the samples of metric `name` on the admin listener whose labels contain
/// `labels` (e.g. `result="accepted"`; "" for all).
pub fn metric(admin: SocketAddr, name: &str, labels: &str) -> f64 {
    let (status, text) = admin_get(admin, "/metrics");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|l| {
            l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(labels)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An 80-byte ticket key, base64, with `tag` in its name.
pub fn key_line(tag: u8) -> String {
    let mut bytes = [0u8; 80];
    boring::rand::rand_bytes(&mut bytes).unwrap();
    bytes[0] = tag;
    boring::base64::encode_block(&bytes)
}

/// A random fleet key, as a line of a `fleet_key_file`.
pub fn fleet_key_line() -> String {
    let mut key = [0u8; 32];
    boring::rand::rand_bytes(&mut key).unwrap();
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `lines` (keys, `fleet_key_line`) as a fleet key file of mode 0600 at `path`.
pub fn write_fleet_key(path: &Path, lines: &[&str]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A fleet key file with one random key in `dir`, named `name`; returns its path.
pub fn fleet_key_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    write_fleet_key(&path, &[&fleet_key_line()]);
    path
}

/// A redis-server on a free loopback port, without persistence; killed when dropped.
pub struct Redis {
    child: Child,
    pub port: u16,
    /// Serves TLS only (`rediss://`), with a certificate issued by `<dir>/ca.pem`.
    tls: bool,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_on(free_port())
    }

    /// A Redis on `port` (e.g. again where one was killed).
    pub fn start_on(port: u16) -> Redis {
        Redis::spawn(port, &["--port", &port.to_string()], false)
    }

    /// A Redis on 127.0.0.1 that speaks TLS only, with a certificate for the IP address
    /// `named` issued by the CA in `dir` (`<dir>/ca.pem`, made if missing).
    pub fn start_tls(dir: &Path, named: &str) -> Redis {
        if !dir.join("ca.pem").exists() {
            make_ca(dir, "Test Redis CA");
        }
        let stem = format!("redis-{named}");
        make_leaf(
            dir,
            &stem,
            "/CN=redis",
            &format!("subjectAltName=IP:{named}"),
        );
        let p = |name: String| dir.join(name).display().to_string();
        let port = free_port();
        let tls = [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &p(format!("{stem}.pem")),
            "--tls-key-file",
            &p(format!("{stem}.key")),
            "--tls-auth-clients",
            "no",
        ];
        Redis::spawn(port, &tls, true)
    }

    fn spawn(port: u16, listen: &[&str], tls: bool) -> Redis {
        let child = Command::new("redis-server")
            .args(listen)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs (apt-get install redis-server; scripts/setup.sh)");
        let mut redis = Redis { child, port, tls };
        // Ready when it answers PING.
        let deadline = Instant::now() + DEADLINE;
        loop {
            assert!(
                redis.child.try_wait().unwrap().is_none(),
                "redis-server exited at start"
            );
            // Over TLS, listening is enough (the test's client does not know the test CA).
            let ready = match tls {
                true => std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
                false => redis.ping(),
            };
            if ready {
                return redis;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            std::thread::yield_now();
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }

    pub fn ping(&self) -> bool {
        self.connection()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok_and(|pong| pong == "PONG")
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes `bytes` in pieces of `piece` bytes, each its own send on a TCP_NODELAY socket
/// (so its own segment), with a millisecond between them so that the reader gets them
/// apart: how a large ClientHello (post-quantum key shares) may arrive.
pub async fn write_in_pieces(stream: &mut TcpStream, bytes: &[u8], piece: usize) {
    stream.set_nodelay(true).unwrap();
    for chunk in bytes.chunks(piece) {
        stream.write_all(chunk).await.unwrap();
        stream.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The Go crypto/tls test client (tests/goclient), built once per test process with a Go
/// new enough for X25519MLKEM768 and `ConnectionState().CurveID` (1.25): `go` on PATH or
/// /usr/local/go/bin/go (scripts/setup.sh installs one). Without one the test fails.
pub fn go_client() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| go_build("goclient")).clone()
}

/// Builds the Go program of tests/`name` into the target's temporary directory.
pub fn go_build(name: &str) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name);
    run(Command::new(go())
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(source)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod"));
    out
}

/// A Go of at least 1.25: `go` on PATH or /usr/local/go/bin/go (scripts/setup.sh installs
/// one). Without one the test fails.
pub fn go() -> &'static str {
    ["go", "/usr/local/go/bin/go"]
        .into_iter()
        .find(|go| {
            Command::new(go)
                .args(["env", "GOVERSION"])
                .env("GOTOOLCHAIN", "local")
                .output()
                .ok()
                .and_then(|out| go_version_at_least(&out.stdout, (1, 25)))
                .unwrap_or(false)
        })
        .unwrap_or_else(|| {
            panic!(
                "these tests need Go >= 1.25 (`go` on PATH or /usr/local/go/bin/go); \
                 Debian 12's golang-go (1.19) is too old: run scripts/setup.sh"
            )
        })
}

/// Whether `go env GOVERSION` output (e.g. "go1.26.8") is at least `want`.
fn go_version_at_least(output: &[u8], want: (u32, u32)) -> Option<bool> {
    let text = std::str::from_utf8(output).ok()?.trim();
    let mut parts = text.strip_prefix("go")?.split(['.', 'r', 'b']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) >= want)
}

/// Runs the Go client against 127.0.0.1:`port` with `args`; returns its JSON report.
pub fn go_connect(port: u16, args: &[&str]) -> serde_json::Value {
    let out = run(Command::new(go_client())
        .arg("-addr")
        .arg(format!("127.0.0.1:{port}"))
        .args(args));
    serde_json::from_slice(&out.stdout).expect("the Go client prints JSON")
}
