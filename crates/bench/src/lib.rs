//! `tlsterm bench`: a TLS load generator (full handshakes, resumed sessions, bulk
//! keep-alive transfers, open-loop latency), over TCP or, with `--http3`, over QUIC; and
//! an in-memory record-layer benchmark.

pub mod http;
pub mod idle;
pub mod load;
pub mod quic;
pub mod record;
pub mod stats;
pub mod tls;

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rustls::pki_types::ServerName;

use crate::load::{LoadConfig, Mode};
use crate::stats::{Latency, Live, Report};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchMode {
    /// A new TLS connection for every request, no session offered (like `wrk -H 'Connection: close'`
    /// without its silent resumption).
    Full,
    /// N requests per TLS session, one per connection: the first a full handshake, then resumed.
    Resume,
    /// Keep-alive connections; large responses via the URL (e.g. /bytes/1048576). Reports MB/s.
    Bulk,
    /// In-memory BoringSSL record-layer throughput per cipher (no server; URL ignored).
    Record,
    /// Open --concurrency connections (handshake and one keep-alive request each), hold
    /// them idle for --duration, and report the server's RSS per connection and its CPU
    /// while idle (from /proc of --server-pid, or of the process listening on the port).
    /// Half are opened and held idle first: the RSS per connection of the second half is
    /// what one more costs, without what the server pays once.
    Idle,
}

/// Benchmark a TLS server (or, with `--mode record`, the local TLS record layer).
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Target URL, e.g. https://127.0.0.1:8443/ (not needed for --mode record).
    pub url: Option<String>,
    /// What to measure.
    #[arg(short, long, value_enum, default_value = "full")]
    pub mode: BenchMode,
    /// Concurrent connections (open loop: the most units of work in flight at once).
    #[arg(short, long, default_value_t = 50)]
    pub concurrency: usize,
    /// How long to run, e.g. 10, 10s, 500ms, 1m (ignored when --requests is given).
    #[arg(short, long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop after this many requests instead of after --duration.
    #[arg(short = 'n', long)]
    pub requests: Option<u64>,
    /// Resume mode: requests (connections) per TLS session.
    #[arg(long, default_value_t = 4)]
    pub per_session: u32,
    /// Resume mode: send each resumed connection's request as TLS 1.3 early data (0-RTT),
    /// if the server's ticket allows it.
    #[arg(long)]
    pub early_data: bool,
    /// Offer only this TLS version: 1.2 or 1.3 (default: both).
    #[arg(long)]
    pub tls_version: Option<String>,
    /// Cipher suites to offer, comma-separated (OpenSSL, IANA or rustls names,
    /// e.g. ECDHE-RSA-AES128-GCM-SHA256 or TLS_AES_128_GCM_SHA256).
    #[arg(long)]
    pub cipher: Option<String>,
    /// Key exchange group to offer: x25519mlkem768 (post-quantum hybrid), x25519, p256 or
    /// p384.
    #[arg(long, default_value = "x25519")]
    pub group: String,
    /// Certificate compression to offer (RFC 8879), in preference order: brotli, zlib, or
    /// none. The report says how many certificates arrived compressed.
    #[arg(long, value_delimiter = ',', default_value = "brotli,zlib")]
    pub cert_compression: Vec<String>,
    /// Encrypt the ClientHello (ECH, TLS 1.3 only) with this ECHConfigList, base64 as in
    /// a DNS HTTPS record's ech= (or as `tlsterm ech keygen` prints it). The SNI (URL host
    /// or --sni) goes inside; the config's public name outside. The report counts the
    /// handshakes whose ECH the server accepted; a rejection is an error.
    #[arg(long)]
    pub ech_config: Option<String>,
    /// ALPN protocols to offer, comma-separated (requests are HTTP/1.1, but for idle mode,
    /// whose request goes over HTTP/2 where the server chose `h2`).
    #[arg(long, value_delimiter = ',')]
    pub alpn: Vec<String>,
    /// Server name to send (default: the URL's host, if it is a name).
    #[arg(long)]
    pub sni: Option<String>,
    /// Skip certificate AND signature verification. For benchmarking only: it
    /// removes the client's verification cost and trusts any server.
    #[arg(long)]
    pub insecure: bool,
    /// PEM file of trusted CA certificates (when not --insecure).
    #[arg(long)]
    pub cacert: Option<String>,
    /// Open-loop mode: start this many units of work per second (connections in
    /// full/resume mode, requests in bulk mode); latency counts from the scheduled start.
    #[arg(long)]
    pub rate: Option<f64>,
    /// HTTP/3 over QUIC (UDP to the URL's port) instead of HTTP/1.1 over TLS, with the
    /// full, resume, bulk and idle modes. TLS 1.3 only; no 0-RTT, ECH or certificate
    /// compression.
    #[arg(long)]
    pub http3: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Client threads (each a single-threaded runtime). Pin the client with taskset.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Per-unit timeout (connect + handshake + request).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Record mode: bytes to push through each cipher, per direction.
    #[arg(long, default_value_t = 1 << 30)]
    pub record_bytes: u64,
    /// Record mode: plaintext bytes per write (16384 = full TLS records).
    #[arg(long, default_value_t = 16384)]
    pub record_size: usize,
    /// Idle mode: the server's process ID (default: the process listening on the URL's port).
    #[arg(long)]
    pub server_pid: Option<u32>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("bad duration {s:?}"));
    }
    Duration::try_from_secs_f64(v * scale).map_err(|_| format!("duration {s:?} is too long"))
}

/// Host, port and path of an https:// URL.
fn parse_url(url: &str) -> anyhow::Result<(String, u16, String)> {
    let rest = url
        .strip_prefix("https://")
        .context("the URL must start with https://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if let Some(h) = authority.strip_prefix('[') {
        let (h, p) = h.split_once(']').context("bad IPv6 literal")?;
        (h.to_string(), p.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse().context("bad port")?,
        None => 443,
    };
    Ok((host, port, path.to_string()))
}

/// Where a benchmark's connections go, from its URL and `--sni`.
struct Destination {
    /// The URL as given, for the report.
    url: String,
    addr: SocketAddr,
    server_name: ServerName<'static>,
    path: String,
    /// The Host header (HTTP/3's `:authority`): the port only when it is not 443, an IPv6
    /// address in brackets.
    host_header: String,
}

fn destination(args: &BenchArgs) -> anyhow::Result<Destination> {
    let url = args.url.as_deref().context("a URL is required")?;
    let (host, port, path) = parse_url(url)?;
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .context("no address")?;
    let sni = args.sni.clone().unwrap_or_else(|| host.clone());
    let server_name = ServerName::try_from(sni).context("bad server name")?;
    let host_header = if port == 443 {
        host
    } else if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    Ok(Destination {
        url: url.to_string(),
        addr,
        server_name,
        path,
        host_header,
    })
}

/// The TLS client configuration that the benchmark's options ask for.
fn client_config(args: &BenchArgs) -> anyhow::Result<rustls::ClientConfig> {
    tls::client_config(&tls::TlsOptions {
        version: args.tls_version.clone(),
        ciphers: args.cipher.clone(),
        group: args.group.clone(),
        alpn: args.alpn.clone(),
        insecure: args.insecure,
        cacert: args.cacert.clone(),
        ech_config: args.ech_config.clone(),
    })
}

/// Run the benchmark described by `args` and print its report.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match args.mode {
        BenchMode::Record => return record::run(args),
        BenchMode::Idle => return idle::run(args),
        _ => {}
    }
    let report = run_load(args)?;
    print_report(&report, Report::text, args.json)
}

/// Prints a report: as JSON with `--json`, else as `text` draws it.
fn print_report<R: serde::Serialize>(
    report: &R,
    text: fn(&R) -> String,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", text(report));
    }
    Ok(())
}

/// Run a load (full/resume/bulk) and return its report.
pub fn run_load(args: &BenchArgs) -> anyhow::Result<Report> {
    let Destination {
        url,
        addr,
        server_name,
        path,
        host_header,
    } = destination(args)?;
    let mode = match args.mode {
        BenchMode::Full => Mode::Full,
        BenchMode::Resume => Mode::Resume,
        BenchMode::Bulk => Mode::Bulk,
        BenchMode::Record | BenchMode::Idle => bail!("--mode {:?} is not a load", args.mode),
    };
    if args.early_data && mode != Mode::Resume {
        bail!("--early-data needs --mode resume");
    }
    if args.http3 {
        refuse_for_http3(args)?;
    }
    if args.concurrency == 0 || args.threads == 0 || args.per_session == 0 {
        bail!("--concurrency, --threads and --per-session must be at least 1");
    }
    // Every thread runs at least one connection: more threads than connections would
    // run more connections than the report says.
    if args.threads > args.concurrency {
        bail!(
            "--threads ({}) cannot exceed --concurrency ({}): each thread runs at least one connection",
            args.threads,
            args.concurrency
        );
    }
    if let Some(r) = args.rate {
        if !(r > 0.0 && r.is_finite()) {
            bail!("--rate must be positive");
        }
        // Each thread schedules its share of the rate at intervals of whole nanoseconds.
        let per_thread = r / args.threads as f64;
        if load::open_loop_interval(per_thread).is_none() {
            if per_thread >= 1.0 {
                bail!(
                    "--rate {r} is too high: each thread starts at most 1e9 units per second \
                     (at most {} with --threads {})",
                    1e9 * args.threads as f64,
                    args.threads
                );
            }
            bail!("--rate {r} is too low to schedule");
        }
    }
    // The deadline (and the grace second after it) must be a representable time.
    if args.requests.is_none()
        && std::time::Instant::now()
            .checked_add(args.duration)
            .and_then(|d| d.checked_add(Duration::from_secs(2)))
            .is_none()
    {
        bail!("--duration {:?} is too long", args.duration);
    }
    let mut tls = client_config(args)?;
    let decompressors = if args.http3 {
        Vec::new()
    } else {
        tls::offer_cert_compression(&mut tls, &args.cert_compression)?
    };
    let http3 = http3_request(args, &server_name, &path, &host_header)?;
    let cfg = LoadConfig {
        mode,
        addr,
        server_name,
        request_close: http::request(&path, &host_header, true),
        request_keepalive: http::request(&path, &host_header, false),
        concurrency: args.concurrency,
        threads: args.threads,
        duration: if args.requests.is_some() {
            None
        } else {
            Some(args.duration)
        },
        requests: args.requests,
        per_session: args.per_session,
        early_data: args.early_data,
        rate: args.rate,
        timeout: args.timeout,
        tls: Arc::new(tls),
        http3,
    };

    let live = Arc::new(Live::default());
    let cpu0 = stats::process_cpu_seconds();
    let quiet = args.quiet;
    let tick_live = live.clone();
    let mut last = [0u64; 5];
    let last_cell = std::cell::Cell::new(0.0f64);
    let (stats, elapsed) = load::run(cfg, live, move |t| {
        if quiet {
            return;
        }
        let now = tick_live.snapshot();
        let dt = (t - last_cell.replace(t)).max(1e-9);
        let d = |i: usize| (now[i] - last[i]) as f64 / dt;
        let cpu = stats::process_cpu_seconds() - cpu0;
        eprintln!(
            "[{t:5.0}s] {:8.0} hs/s {:8.0} req/s {:9.2} MB/s  resumed {:>8}  errors {:>6}  client cpu {:4.0}%",
            d(0),
            d(1),
            d(2) / 1e6,
            now[4],
            now[3],
            cpu / t * 100.0
        );
        last = now;
        let _ = std::io::stderr().flush();
    });
    let cpu = stats::process_cpu_seconds() - cpu0;
    let e = elapsed.max(1e-9);
    Ok(Report {
        url,
        mode: format!("{:?}", args.mode).to_lowercase(),
        http3: args.http3,
        concurrency: args.concurrency,
        threads: args.threads,
        rate: args.rate,
        elapsed_s: elapsed,
        handshakes: stats.handshakes,
        resumed: stats.resumed,
        early_data_accepted: stats.early_data_accepted,
        ech_accepted: stats.ech_accepted,
        requests: stats.requests,
        body_bytes: stats.body_bytes,
        wire_bytes: stats.wire_bytes,
        handshakes_per_s: stats.handshakes as f64 / e,
        requests_per_s: stats.requests as f64 / e,
        mb_per_s: stats.wire_bytes as f64 / e / 1e6,
        errors_total: stats.errors.values().sum(),
        errors: stats.errors.clone(),
        status: stats.status.clone(),
        negotiated: stats.negotiated.clone(),
        certificates_compressed: decompressors
            .iter()
            .map(|d| (d.name(), d.count()))
            .collect(),
        handshake_latency: Latency::of(&stats.handshake),
        request_latency: Latency::of(&stats.request),
        total_latency: Latency::of(&stats.total),
        start_lag: Latency::of(&stats.start_lag),
        latencies_clamped: stats.clamped,
        client_cpu_s: cpu,
        client_cpu_util: cpu / e / args.threads as f64,
        handshakes_per_client_cpu_s: if cpu > 0.0 {
            stats.handshakes as f64 / cpu
        } else {
            0.0
        },
    })
}

/// With `--http3`: the QUIC client's options from the command line and the header fields
/// of the request for `path`; `None` without. The client is built once here so that bad
/// options fail before the run, not in its threads.
fn http3_request(
    args: &BenchArgs,
    server_name: &ServerName<'_>,
    path: &str,
    host_header: &str,
) -> anyhow::Result<Option<(quic::QuicOptions, Vec<quiche::h3::Header>)>> {
    if !args.http3 {
        return Ok(None);
    }
    let opts = quic::QuicOptions {
        group: args.group.clone(),
        insecure: args.insecure,
        cacert: args.cacert.clone(),
        // An address is no server name: nothing is sent, as rustls does.
        server_name: match server_name {
            ServerName::DnsName(name) => Some(name.as_ref().to_string()),
            _ => None,
        },
    };
    quic::Client::new(&opts)?;
    Ok(Some((opts, http::h3_request(path, host_header))))
}

/// Refuses the options that mean nothing over QUIC, rather than ignoring them.
fn refuse_for_http3(args: &BenchArgs) -> anyhow::Result<()> {
    let refused = [
        (args.early_data, "--early-data"),
        (args.ech_config.is_some(), "--ech-config"),
        (args.cipher.is_some(), "--cipher"),
        (!args.alpn.is_empty(), "--alpn (HTTP/3 is always h3)"),
        (
            args.tls_version.as_deref().is_some_and(|v| v != "1.3"),
            "--tls-version other than 1.3",
        ),
    ];
    for (given, option) in refused {
        if given {
            bail!("--http3 does not take {option}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_durations() {
        assert_eq!(
            parse_url("https://127.0.0.1:8443/bytes/10").unwrap(),
            ("127.0.0.1".into(), 8443, "/bytes/10".into())
        );
        assert_eq!(
            parse_url("https://example.com").unwrap(),
            ("example.com".into(), 443, "/".into())
        );
        assert_eq!(
            parse_url("https://[::1]:9/").unwrap(),
            ("::1".into(), 9, "/".into())
        );
        assert!(parse_url("http://x/").is_err());
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        // Too long for a Duration: refused, not a panic.
        assert!(parse_duration("1e20").is_err());
        assert!(parse_duration("1e300m").is_err());
    }
}
