//! The settings that shape the process itself (`workers`, `[log]`, `[admin]`...): applied
//! at start only, so a reload reports which of them it could not apply.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::Config;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter, e.g. "info" or "tlsterm=debug". RUST_LOG overrides it.
    #[serde(default = "default_log_level")]
    pub level: String,
    /// One line per closed connection (client, SNI, ALPN, version, cipher, bytes, reason).
    #[serde(default)]
    pub connections: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: default_log_level(),
            connections: false,
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

/// The settings that shape the process itself: applied at start only.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSettings {
    workers: Option<usize>,
    pin_workers: bool,
    max_connections: usize,
    drain_timeout: Duration,
    log_level: String,
    admin: AdminConfig,
}

impl ProcessSettings {
    /// The keys whose values differ in `new` (a reload cannot apply them).
    pub fn changed_keys(&self, new: &ProcessSettings) -> Vec<&'static str> {
        let changed = [
            ("workers", self.workers != new.workers),
            ("pin_workers", self.pin_workers != new.pin_workers),
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
            max_connections: self.max_connections,
            drain_timeout: self.drain_timeout,
            log_level: self.log.level.clone(),
            admin: self.admin.clone(),
        }
    }
}
