//! The settings that shape the process itself (`workers`, `[log]`, `[admin]`...): applied
//! at start only, so a reload reports which of them it could not apply.

use std::net::SocketAddr;
use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use tracing_subscriber::filter::Directive;

use super::Config;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter, e.g. "info" or "tlsterm=debug". RUST_LOG overrides it.
    #[serde(default = "default_log_level", deserialize_with = "log_filter")]
    pub level: String,
    /// One line per closed connection (client, SNI, ALPN, version, cipher, bytes, reason).
    #[serde(default)]
    pub connections: bool,
    /// One line per request of a `mode = "http"` listener or over HTTP/3, once its answer
    /// has ended (client, HTTP version, method, host, path without its query, status, who
    /// answered, time to the head and to the end, body bytes to the client, whether the body
    /// was whole, whether the request came in early data).
    #[serde(default)]
    pub requests: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: default_log_level(),
            connections: false,
            requests: false,
        }
    }
}

/// The admin listener: `/metrics` and `/healthz` over plain HTTP.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default = "default_admin_address")]
    pub address: SocketAddr,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            address: default_admin_address(),
        }
    }
}

fn default_true() -> bool {
    true
}

pub fn default_admin_address() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8444))
}

fn default_log_level() -> String {
    "info".into()
}

/// The levels a filter may name without a target.
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// `log.level`, checked while parsing so that the error names its line.
fn log_filter<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let filter = String::deserialize(deserializer)?;
    check_log_filter(&filter)
        .map_err(|problem| D::Error::custom(format!("key `log.level`: {problem}")))?;
    Ok(filter)
}

/// Whether `filter` is a `tracing` filter that means what it says. The filter reads a lone
/// word that is not a level ("warning", "information") as the name of a target, and
/// tlsterm's own messages would then be left out of the log; such a word is refused, as
/// is an empty filter (which logs nothing: that is "off").
fn check_log_filter(filter: &str) -> Result<(), String> {
    if filter.trim().is_empty() {
        return Err("must not be empty (\"off\" turns logging off)".into());
    }
    // Directive by directive, the way the filter itself reads them.
    for directive in filter.split(',').filter(|d| !d.is_empty()) {
        if let Err(err) = directive.parse::<Directive>() {
            return Err(format!(
                "`{directive}` is not a log filter directive: {err}"
            ));
        }
        let word = directive.trim();
        let bare = !word.is_empty() && !word.contains(['=', '[']);
        if bare
            && !LOG_LEVELS
                .iter()
                .any(|level| level.eq_ignore_ascii_case(word))
        {
            return Err(format!(
                "`{word}` is not a level ({}); for a target, write `{word}=LEVEL`",
                LOG_LEVELS.join(", ")
            ));
        }
    }
    Ok(())
}

/// How new connections are spread over the workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AcceptMode {
    /// Each worker has its own SO_REUSEPORT socket per listener: the kernel hashes every
    /// connection to one of them, whether that worker is busy or not.
    PerWorker,
    /// Every worker waits on the same socket and the first to ask takes the connection:
    /// a busy worker leaves new connections to idle ones (each connection wakes every
    /// waiting worker, which costs a little when they are idle). The default: with 4 and 8
    /// workers it did 2-18% more handshakes per CPU-second than `PerWorker` in every
    /// scenario measured, where workers that the kernel's hash leaves short of connections
    /// wait while others queue (docs/BENCHMARKS.md, "Many cores").
    #[default]
    Shared,
}

/// The settings that shape the process itself: applied at start only.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSettings {
    workers: Option<usize>,
    pin_workers: bool,
    accept: AcceptMode,
    max_connections: usize,
    drain_timeout: Duration,
    log_level: String,
    admin: AdminConfig,
}

impl ProcessSettings {
    /// How connections reach the workers (listeners opened by a reload follow it too).
    pub fn accept(&self) -> AcceptMode {
        self.accept
    }

    /// The keys whose values differ in `new` (a reload cannot apply them).
    pub fn changed_keys(&self, new: &ProcessSettings) -> Vec<&'static str> {
        let changed = [
            ("workers", self.workers != new.workers),
            ("pin_workers", self.pin_workers != new.pin_workers),
            ("accept", self.accept != new.accept),
            (
                "max_connections",
                self.max_connections != new.max_connections,
            ),
            ("drain_timeout", self.drain_timeout != new.drain_timeout),
            ("log.level", self.log_level != new.log_level),
            ("[admin]", self.admin != new.admin),
        ];
        changed
            .into_iter()
            .filter_map(|(key, changed)| changed.then_some(key))
            .collect()
    }
}

impl Config {
    /// The process-shaping part of this configuration, to compare at reload.
    pub fn process_settings(&self) -> ProcessSettings {
        ProcessSettings {
            workers: self.workers,
            pin_workers: self.pin_workers,
            accept: self.accept,
            max_connections: self.max_connections,
            drain_timeout: self.drain_timeout,
            log_level: self.log.level.clone(),
            admin: self.admin.clone(),
        }
    }
}
