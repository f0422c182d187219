//! A Redis client from the configuration (`redis_url`, `redis_ca_file`), its connection
//! settings, the thread its I/O runs on, and the URL as it may be logged (never with its
//! password).

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context as _;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::runtime::Handle;

use crate::config::redis_uses_tls;

/// The runtime all Redis I/O of the process runs on (started on first use).
pub(super) fn runtime() -> anyhow::Result<Handle> {
    static HANDLE: OnceLock<Handle> = OnceLock::new();
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the Redis runtime")?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("session-redis".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .context("cannot start the Redis thread")?;
    // Two racing first calls would each start a thread; the loser's idles. Only the main
    // thread calls this (start and reload), so it does not happen.
    Ok(HANDLE.get_or_init(|| handle).clone())
}

/// A connection (made on first use, remade after failures) whose requests fail after
/// `timeout`. Connecting may take longer (a second at least: TCP, TLS and, for rediss://,
/// loading the system's roots); requests never wait for it past their own timeout.
pub fn connect(
    handle: &Handle,
    client: &redis::Client,
    timeout: Duration,
) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_secs(1))))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_secs(1));
    let _entered = handle.enter();
    ConnectionManager::new_lazy_with_config(client.clone(), config)
}

const PEM_CERTIFICATE: &[u8] = b"-----BEGIN CERTIFICATE-----";

/// `url` fit for a log line: its user and password, and a `pass`/`password` query value
/// (unix-socket URLs), replaced by `***`; something that is not a URL at all is not shown.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a URL)".into();
    };
    // Up to the last '@': a password holding '@', '/' or '?' is hidden whole.
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((_, rest)) => ("***@", rest),
        None => ("", rest),
    };
    let rest = match rest.split_once('?') {
        Some((path, query)) => {
            let pairs = query.split('&').map(|pair| match pair.split_once('=') {
                Some((key, _))
                    if ["pass", "password"].contains(&key.to_ascii_lowercase().as_str()) =>
                {
                    format!("{key}=***")
                }
                _ => pair.to_string(),
            });
            format!("{path}?{}", pairs.collect::<Vec<_>>().join("&"))
        }
        None => rest.to_string(),
    };
    format!("{scheme}://{userinfo}{rest}")
}

/// rustls needs a crypto provider for the process; aws-lc-rs, as the bench client uses.
#[cfg(feature = "redis-tls")]
fn install_tls_provider() -> anyhow::Result<()> {
    // An error means one is installed already, which is as good.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    Ok(())
}

/// A rediss:// client whose server certificate must chain to `roots` (PEM).
#[cfg(feature = "redis-tls")]
fn client_with_roots(url: &str, roots: Vec<u8>) -> anyhow::Result<redis::Client> {
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(roots),
    };
    Ok(redis::Client::build_with_tls(url, certificates)?)
}

#[cfg(not(feature = "redis-tls"))]
const NO_TLS: &str = "this build has no TLS for Redis (feature redis-tls): use a redis:// URL";

#[cfg(not(feature = "redis-tls"))]
fn install_tls_provider() -> anyhow::Result<()> {
    anyhow::bail!(NO_TLS)
}

#[cfg(not(feature = "redis-tls"))]
fn client_with_roots(_url: &str, _roots: Vec<u8>) -> anyhow::Result<redis::Client> {
    anyhow::bail!(NO_TLS)
}

/// A Redis client for `url`; with a "rediss://" URL, `ca` (PEM) holds the roots its
/// certificate must chain to (else the system's roots). Connects nothing yet.
pub fn client(url: &str, ca: Option<&Path>) -> anyhow::Result<redis::Client> {
    let client = match ca {
        Some(ca) => {
            let roots = std::fs::read(ca)
                .with_context(|| format!("cannot read redis_ca_file {}", ca.display()))?;
            anyhow::ensure!(
                roots
                    .windows(PEM_CERTIFICATE.len())
                    .any(|w| w == PEM_CERTIFICATE),
                "redis_ca_file {} holds no PEM certificate",
                ca.display()
            );
            client_with_roots(url, roots)
        }
        None => redis::Client::open(url).map_err(anyhow::Error::from),
    };
    let client = client.with_context(|| format!("invalid redis_url `{}`", redacted(url)))?;
    if redis_uses_tls(&client) {
        install_tls_provider()?;
    }
    Ok(client)
}
