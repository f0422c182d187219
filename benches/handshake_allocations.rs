//! Heap allocations per TLS 1.3 handshake on tlsterm's server path, counted.
//!
//! `cargo bench --bench handshake_allocations [-- FULL_HANDSHAKES]`
//!
//! The server (`tlsterm::server::bind`, then `serve`: one worker, an ECDSA P-256
//! certificate) runs in this process under a counting global allocator; the client (`tlsterm bench`, rustls) and the
//! backend (`tlsterm backend`) are processes of their own, so every allocation counted is
//! the server's: accepting, the handshake (BoringSSL's included), the backend connection,
//! one request relayed, closing. Counters are read before and after a batch of
//! connections, after a warm-up that fills the lazily built state; the other threads of
//! the process (the server's main loop) are idle meanwhile.
//!
//! Full handshakes: `--mode full`, one request per connection. Resumed ones: `--mode
//! resume` (the first connection of each session full, the others resumed by ticket); the
//! full ones' share, known from the first batch, is taken out.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TLSTERM: &str = env!("CARGO_BIN_EXE_tlsterm");
/// Connections of a resumed batch per TLS session: one full handshake, then resumed ones.
const PER_SESSION: u64 = 10;

/// The system allocator, counting what it is asked for.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on unchanged to the system allocator; the counters are
// plain atomics and allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's layout contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from the system's, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A reallocation is counted as an allocation of the new size: what it costs.
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as for `dealloc`; the caller guarantees `new_size` is valid for `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations and bytes so far.
fn counters() -> (u64, u64) {
    (
        ALLOCATIONS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    while TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process of the bench (the backend), ended with it.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_config(dir: &Path, port: u16, backend: u16) -> std::path::PathBuf {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "2", "-newkey", "ec"])
        .args([
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-subj",
            "/CN=localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(made.success(), "openssl req failed");
    let config = format!(
        "workers = 1\n[admin]\nenabled = false\n\
         [[listener]]\naddress = \"127.0.0.1:{port}\"\nbackends = [\"127.0.0.1:{backend}\"]\n\
         [[listener.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let path = dir.join("tlsterm.toml");
    std::fs::write(&path, config).unwrap();
    path
}

/// Runs `tlsterm bench` against the server; returns (connections, resumed ones).
fn client(port: u16, mode: &str, connections: u64) -> (u64, u64) {
    let out = Command::new(TLSTERM)
        .args([
            "bench",
            &format!("https://localhost:{port}/"),
            "--mode",
            mode,
        ])
        .args([
            "-n",
            &connections.to_string(),
            "-c",
            "1",
            "--tls-version",
            "1.3",
        ])
        .args(["--per-session", &PER_SESSION.to_string()])
        .args(["--insecure", "--quiet", "--json"])
        .output()
        .expect("tlsterm bench runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors_total"], 0, "{report}");
    let count = |key: &str| report[key].as_u64().unwrap();
    (count("handshakes"), count("resumed"))
}

fn main() {
    let full_connections: u64 = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .map(|arg| arg.parse().expect("FULL_HANDSHAKES is a number"))
        .unwrap_or(500);
    let dir = tempfile::tempdir().unwrap();
    let (port, backend_port) = (free_port(), free_port());
    let _backend = KillOnDrop(
        Command::new(TLSTERM)
            .args(["backend", "--listen", &format!("127.0.0.1:{backend_port}")])
            .stdout(Stdio::null())
            .spawn()
            .expect("tlsterm backend runs"),
    );
    let config = write_config(dir.path(), port, backend_port);
    std::thread::spawn(move || {
        use tlsterm::server;
        let bound = server::bind(server::ConfigSource::File(config)).expect("server starts");
        // Never told to stop: the server ends with the process.
        let (_events, received) = tokio::sync::mpsc::channel(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime
            .block_on(server::serve(bound, received))
            .expect("server runs")
    });
    wait_for_port(port);
    wait_for_port(backend_port);
    // Warm-up: worker-local pools, lazily built metrics and tables, the session ticket key.
    client(port, "full", 50);
    client(port, "resume", 50);

    let before = counters();
    let (full, resumed) = client(port, "full", full_connections);
    assert_eq!(resumed, 0);
    let after = counters();
    let per_full = (
        (after.0 - before.0) as f64 / full as f64,
        (after.1 - before.1) as f64 / full as f64,
    );

    let before = counters();
    let (connections, resumed) = client(port, "resume", full_connections);
    let after = counters();
    let fresh = (connections - resumed) as f64;
    let per_resumed = (
        ((after.0 - before.0) as f64 - fresh * per_full.0) / resumed as f64,
        ((after.1 - before.1) as f64 - fresh * per_full.1) / resumed as f64,
    );

    println!("tlsterm server path, TLS 1.3, ECDSA P-256, one request relayed per connection");
    println!(
        "full handshake:    {:8.1} allocations {:10.0} bytes  ({full} connections)",
        per_full.0, per_full.1
    );
    println!(
        "resumed handshake: {:8.1} allocations {:10.0} bytes  ({resumed} of {connections} connections resumed)",
        per_resumed.0, per_resumed.1
    );
}
