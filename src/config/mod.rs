//! The TOML configuration: its types, defaults, and errors that name the key and the line.
//!
//! Parsing is done by `toml` + `serde`; values whose validity can only be judged after
//! parsing (files that must exist, lists that must not be empty) are kept `Spanned` so
//! that the error can still point at the line they came from.
//!
//! One file per section, each with its types, defaults and checks: `listener`
//! (`[[listener]]`), `server_name` (`[[listener.server_name]]`), `client_trust` (mTLS:
//! `client_auth`, CAs, CRL files), `engine`, `ocsp`, `session`, `acme`, `process` (what
//! only a restart applies: workers, `[log]`, `[admin]`), `tls_names` (versions, suites,
//! groups, compression: the vocabulary shared with `tls`), `source` (errors with lines).
//! `crls` and `ech_key` read the files those settings name. This module is the bottom
//! layer: it imports nothing else from the crate but `sys`.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

mod acme;
mod client_trust;
pub mod crls;
pub mod ech_key;
mod engine;
mod listener;
mod ocsp;
mod process;
mod quic;
mod server_name;
mod session;
mod source;
#[cfg(test)]
mod tests;
mod tls_names;

pub use acme::{
    AcmeCertificate, AcmeConfig, AcmeKeyType, AcmeNames, ChallengeKind, ExternalAccount,
};
pub use client_trust::{ClientAuth, CrlCheck, CrlFile};
pub use engine::{EcdsaMode, EngineConfig, EngineKernel, EngineMode, KeyShares};
pub use listener::{
    BackendPolicies, CertificateConfig, ListenerConfig, ListenerMode, ProxyProtocol, UnknownSni,
    BUILTIN_BACKEND, DEFAULT_BACKEND_KEEPALIVE,
};
pub use ocsp::OcspConfig;
pub use process::{default_admin_address, AcceptMode, AdminConfig, LogConfig, ProcessSettings};
pub use quic::QuicRetry;
pub use server_name::{is_dns_label, normal_name, ServerNameConfig};
pub use session::{redis_uses_tls, SessionConfig, TicketCount};
pub use source::{ConfigError, SourceMap};
pub use tls_names::{
    group_id, group_name, tls13_cipher_id, CertCompression, TlsVersion, BORINGSSL_MAX_EARLY_DATA,
    DEFAULT_TLS12_CIPHERS,
};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Worker threads, each with its own runtime and SO_REUSEPORT listeners. Default: one per core.
    pub workers: Option<usize>,
    /// Pin worker i to core i (off by default so `taskset` on the whole process is respected).
    #[serde(default)]
    pub pin_workers: bool,
    /// How connections reach the workers: one SO_REUSEPORT socket each, or one shared socket.
    #[serde(default)]
    pub accept: AcceptMode,
    /// Connections open at once in the whole process (all workers and listeners); at the
    /// limit, accepting pauses. Each listener also has a per-worker `max_connections`.
    #[serde(default = "default_global_max_connections")]
    pub max_connections: usize,
    /// How long SIGTERM/SIGINT wait for open connections to finish.
    #[serde(default = "default_drain_timeout", with = "humantime_serde")]
    pub drain_timeout: Duration,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub engine: EngineConfig,
    #[serde(default)]
    pub session: SessionConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    /// Timing of the OCSP responses tlsterm fetches (`ocsp_fetch = true` on a certificate).
    #[serde(default)]
    pub ocsp: OcspConfig,
    /// Certificates obtained and renewed from an ACME CA (names in each listener's `acme`).
    pub acme: Option<AcmeConfig>,
    #[serde(default, rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
}
fn default_global_max_connections() -> usize {
    100_000
}
fn default_drain_timeout() -> Duration {
    Duration::from_secs(30)
}

impl Config {
    /// Parses and checks a configuration text; `file` is only used in messages.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|span| text[..span.start].matches('\n').count() + 1);
            ConfigError {
                file: file.to_string(),
                line,
                message: e.message().to_string(),
            }
        })?;
        let map = SourceMap::new(file, text);
        config.validate(&map)?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(&file, &text)
    }

    fn validate(&mut self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        if self.max_connections == 0 || self.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
            return Err(map.plain("key `max_connections`: must be between 1 and 2^61"));
        }
        if self.workers == Some(0) {
            return Err(map.plain("key `workers`: must be at least 1"));
        }
        if self.listeners.is_empty() {
            return Err(map.plain("no [[listener]] configured"));
        }
        for (i, listener) in self.listeners.iter().enumerate() {
            if self.listeners[..i]
                .iter()
                .any(|l| l.address() == listener.address())
            {
                return Err(map.error(
                    &listener.address_spanned,
                    "key `address`: another listener has the same address",
                ));
            }
        }
        if let Err(err) = self.session.validate() {
            return Err(map.table_error("session", err.to_string()));
        }
        // `[session]` files, like every other path, are relative to this file.
        let session = &mut self.session;
        for path in [&mut session.ticket_key_file, &mut session.redis_ca_file]
            .into_iter()
            .flatten()
        {
            *path = map.resolve(path);
        }
        let redis = self.session.redis_url.is_some();
        if let Some(file) = &mut self.session.fleet_key_file {
            *file.get_mut() = map.resolve(file.get_ref());
            if let Err(err) = crate::seal::FleetKey::load(file.get_ref()) {
                return Err(map.error(file, format!("key `fleet_key_file`: {err:#}")));
            }
        } else if redis {
            return Err(map.table_error(
                "session",
                "key `fleet_key_file` is needed with `redis_url`: what the fleet shares through Redis (sessions, ticket keys, ACME answers and certificates) is sealed with it, since whoever can read or write Redis must not be able to use or forge them. Make one with `(umask 077; openssl rand -hex 32 > fleet.key)`, the same on every process",
            ));
        }
        if let Some(acme) = &mut self.acme {
            acme.validate(map)?;
        }
        self.engine.validate(map)?;
        self.ocsp.validate(map)?;
        let has_acme = self.acme.is_some();
        for listener in &mut self.listeners {
            listener.validate(map, has_acme)?;
        }
        Ok(())
    }

    /// The embedded default: 127.0.0.1:8443, self-signed certificates, the built-in backend.
    pub fn embedded_default() -> Config {
        let text = r#"
            [[listener]]
            address = "127.0.0.1:8443"
            backends = ["builtin"]
            alpn = ["http/1.1"]
        "#;
        Config::parse("<embedded default>", text).expect("embedded default config is valid")
    }

    pub fn worker_count(&self) -> usize {
        self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
    }
}
