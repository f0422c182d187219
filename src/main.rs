use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use tlsterm::config::Config;
use tokio::sync::mpsc;

use tlsterm::server::{self, ConfigSource, Event};

/// Measured against the C library's malloc (docs/BENCHMARKS.md, "The allocator"): idle
/// `mode = "http"` connections cost a quarter less memory, handshakes no more CPU.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read once when it starts: a background thread gives pages that
/// have been free for a second back to the system (its default waits ten, and only on
/// later allocations), directly rather than first as lazily freed pages, which would
/// still count as the process's memory.
#[cfg(feature = "jemalloc")]
#[allow(unsafe_code)]
// SAFETY: jemalloc reads this symbol as a `const char *` to a NUL-terminated option string
// when it initialises: a reference to a byte array is that pointer (unlike a slice's, no
// length beside it). Nothing else names the symbol, and it is never written.
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_SETTINGS: &[u8; 85] =
    b"background_thread:true,max_background_threads:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

#[derive(Parser)]
#[command(
    name = "tlsterm",
    version,
    about = "TLS termination proxy with batched (multi-buffer) private-key operations"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Terminate TLS and forward plaintext to backends (default: 127.0.0.1:8443, self-signed
    /// certificates, built-in backend).
    Serve {
        /// TOML configuration file (see tlsterm.example.toml).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Validate the configuration and certificates, then exit.
        #[arg(long)]
        check: bool,
    },
    /// Run the built-in HTTP/1.1 responder alone (a backend for tests and benchmarks).
    Backend {
        /// address:port, or unix:/path for a unix-domain socket.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: String,
        /// Threads answering requests, each accepting on its own socket: one is plenty
        /// for tests; benchmarks of many workers need more, so that the backend is not
        /// what they measure.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        threads: u16,
    },
    /// Load generator: full or resumed handshakes, bulk transfers.
    #[cfg(feature = "bench")]
    Bench(Box<tlsterm_bench::BenchArgs>),
    /// Private-key operations per second: BoringSSL inline vs the batch engine.
    Speed(tlsterm::speed::SpeedArgs),
    /// Live metrics of a running server: handshake and engine latency histograms, rates.
    Stats(tlsterm::stats::StatsArgs),
    /// Encrypted Client Hello keys.
    Ech {
        #[command(subcommand)]
        command: EchCommand,
    },
}

#[derive(Subcommand)]
enum EchCommand {
    /// Write a new ECH key file (mode 0600) for a listener's `ech_keys`, and print its
    /// ECHConfigList in base64: the `ech=` value of the DNS HTTPS record.
    Keygen {
        /// The name clients show in the clear (a certificate for it must be served).
        #[arg(long)]
        public_name: String,
        /// The key file to create (an existing file is not overwritten).
        #[arg(long)]
        out: PathBuf,
    },
}

/// `tlsterm backend`: the built-in responder alone, on a unix-domain socket (one thread)
/// or on a TCP address with `threads` threads.
fn backend(listen: &str, threads: usize) -> anyhow::Result<()> {
    let Some(path) = listen.strip_prefix("unix:") else {
        let address: SocketAddr = listen
            .parse()
            .map_err(|_| anyhow::anyhow!("--listen {listen}: not an address:port or unix:/path"))?;
        return tlsterm::proxy::builtin_backend::serve_threaded(address, threads);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::UnixListener::bind(path)?;
        tracing::info!(path, "backend listening");
        tlsterm::proxy::builtin_backend::serve_unix(listener).await;
        anyhow::Ok(())
    })
}

fn ech_keygen(public_name: &str, out: &std::path::Path) -> anyhow::Result<()> {
    let key = tlsterm::tls::ech::EchKey::generate(public_name)?;
    key.write_new(out)?;
    let list = tlsterm::tls::ech::config_list([&key.config[..]]);
    println!("{}", boring::base64::encode_block(&list));
    eprintln!(
        "wrote {}; publish the line above as the ech= parameter of the names' HTTPS records, e.g.\n  \
         example.com. 3600 IN HTTPS 1 . alpn=h2,http/1.1 ech=<it>",
        out.display()
    );
    Ok(())
}

fn init_logging(level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn serve(config: Option<PathBuf>, check: bool) -> anyhow::Result<()> {
    let source = match config {
        Some(path) => ConfigSource::File(path),
        None => ConfigSource::Embedded,
    };
    let loaded: Config = source.load()?;
    init_logging(&loaded.log.level);
    if check {
        // Builds every TLS context (loading certificates and keys) without binding anything.
        let sessions = tlsterm::session::Sessions::new(&loaded.session)?;
        server::build_states(
            &loaded,
            Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            &sessions,
            None,
        )?;
        println!("configuration OK");
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Signal handlers first: a SIGHUP sent as soon as the process exists (say, while thousands
    // of certificates load) must reload, not kill it; it is acted on once serving.
    let events = signal_events(&runtime)?;
    let bound = server::bind(source)?;
    runtime.block_on(server::serve(bound, events))
}

/// Installs the handlers of SIGHUP (a reload) and SIGTERM and SIGINT (a stop and drain),
/// and turns the signals into `serve`'s events on `runtime`. A signal that arrives before
/// `serve` runs is kept until it does.
fn signal_events(runtime: &tokio::runtime::Runtime) -> std::io::Result<mpsc::Receiver<Event>> {
    use tokio::signal::unix::{signal, SignalKind};
    let _runtime = runtime.enter();
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let (events, received) = mpsc::channel(1);
    runtime.spawn(async move {
        loop {
            let event = tokio::select! {
                _ = hangup.recv() => Event::Reload,
                _ = terminate.recv() => Event::Stop,
                _ = interrupt.recv() => Event::Stop,
            };
            // Once `serve` has stopped reading, a signal goes nowhere: the handlers stay
            // installed, so another SIGTERM or SIGINT during the drain does not end the process.
            let _ = events.send(event).await;
        }
    });
    Ok(received)
}

/// `tlsterm --version`: the release, the commit it was built from, and the engine's
/// kernels: those built into this binary, and those this CPU runs.
fn long_version() -> String {
    use tlsterm_engine::{Kernel, X25519Kernel};
    // The SIMD kernels are built on x86-64 only; elsewhere only the portable ones.
    let built = |name: &str| cfg!(target_arch = "x86_64") || name == "portable";
    format!(
        "{} (commit {})\nengine kernels built in: RSA {}; X25519 {}\nthis CPU runs: RSA {}; X25519 {}",
        env!("CARGO_PKG_VERSION"),
        env!("TLSTERM_COMMIT"),
        kernel_names(&Kernel::ALL, Kernel::name, |k| built(k.name())),
        kernel_names(&X25519Kernel::ALL, X25519Kernel::name, |k| built(k.name())),
        kernel_names(&Kernel::ALL, Kernel::name, Kernel::is_available),
        kernel_names(&X25519Kernel::ALL, X25519Kernel::name, X25519Kernel::is_available),
    )
}

/// The names of the kernels of `all` that `pick` keeps, fastest first.
fn kernel_names<K: Copy>(
    all: &[K],
    name: fn(K) -> &'static str,
    pick: impl Fn(K) -> bool,
) -> String {
    let names: Vec<&str> = all.iter().copied().filter(|&k| pick(k)).map(name).collect();
    names.join(" ")
}

fn main() -> ExitCode {
    let version: &'static str = Box::leak(long_version().into_boxed_str());
    let matches = Cli::command().long_version(version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    let result = match cli.command.unwrap_or(Command::Serve {
        config: None,
        check: false,
    }) {
        Command::Serve { config, check } => serve(config, check),
        Command::Backend { listen, threads } => {
            init_logging("info");
            backend(&listen, threads.into())
        }
        #[cfg(feature = "bench")]
        Command::Bench(args) => tlsterm_bench::run(&args),
        Command::Speed(args) => tlsterm::speed::run(&args),
        Command::Stats(args) => tlsterm::stats::run(&args),
        Command::Ech {
            command: EchCommand::Keygen { public_name, out },
        } => ech_keygen(&public_name, &out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tlsterm: {err:#}");
            ExitCode::FAILURE
        }
    }
}
