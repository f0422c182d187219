//! The TOML configuration: its types, defaults, and errors that name the key and the line.
//!
//! Parsing is done by `toml` + `serde`; values whose validity can only be judged after
//! parsing (files that must exist, lists that must not be empty) are kept `Spanned` so
//! that the error can still point at the line they came from.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

mod acme;
pub mod crls;
pub mod ech_key;
mod session;
pub use acme::{
    read_fleet_key, AcmeCertificate, AcmeConfig, AcmeKeyType, AcmeNames, ChallengeKind,
    ExternalAccount,
};

pub use session::{redis_uses_tls, SessionConfig};

/// Address of the built-in HTTP responder, usable in `backends` (the embedded default uses it).
pub const BUILTIN_BACKEND: &str = "builtin";

/// Mozilla "intermediate" TLS 1.2 suites: ECDHE only, AES-GCM and ChaCha20-Poly1305.
pub const DEFAULT_TLS12_CIPHERS: &str =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:\
ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Worker threads, each with its own runtime and SO_REUSEPORT listeners. Default: one per core.
    pub workers: Option<usize>,
    /// Pin worker i to core i (off by default so `taskset` on the whole process is respected).
    #[serde(default)]
    pub pin_workers: bool,
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

/// `[ocsp]`: how fetched OCSP responses are refreshed (as HAProxy's ocsp-update delays).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OcspConfig {
    /// The longest one fetch may take, connecting included.
    #[serde(default = "default_ocsp_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// A response is refreshed halfway through its validity, but no sooner than this...
    #[serde(default = "default_ocsp_min_refresh", with = "humantime_serde")]
    pub min_refresh: Duration,
    /// ...and no later than this (also how long a response without nextUpdate is stapled).
    #[serde(default = "default_ocsp_max_refresh", with = "humantime_serde")]
    pub max_refresh: Duration,
    /// First retry after a failed fetch or an answer that cannot be stapled; doubles with
    /// each failure up to `min_refresh`.
    #[serde(default = "default_ocsp_retry", with = "humantime_serde")]
    pub retry: Duration,
}

impl Default for OcspConfig {
    fn default() -> Self {
        Self {
            timeout: default_ocsp_timeout(),
            min_refresh: default_ocsp_min_refresh(),
            max_refresh: default_ocsp_max_refresh(),
            retry: default_ocsp_retry(),
        }
    }
}

fn default_ocsp_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_ocsp_min_refresh() -> Duration {
    Duration::from_secs(300)
}
fn default_ocsp_max_refresh() -> Duration {
    Duration::from_secs(3600)
}
fn default_ocsp_retry() -> Duration {
    Duration::from_secs(10)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineMode {
    /// Every private-key operation is computed by BoringSSL as soon as it is asked for.
    Inline,
    /// RSA operations are queued per worker and computed in multi-buffer batches.
    Batch,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    #[serde(default = "default_engine_mode")]
    pub mode: EngineMode,
    /// Flush as soon as this many operations are queued (at most the engine's lane capacity).
    pub batch_size: Option<usize>,
    /// The longest an operation waits for companions before the batch runs anyway.
    #[serde(default = "default_poll_delay", with = "humantime_serde")]
    pub poll_delay: Duration,
    /// Batches smaller than this are computed one operation at a time (default: the
    /// measured break-even of the kernel in use).
    pub small_batch_threshold: Option<usize>,
    /// Which multi-buffer kernel computes batches.
    #[serde(default)]
    pub kernel: EngineKernel,
}

/// The multi-buffer kernel `[engine] kernel` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKernel {
    /// The fastest the CPU has: AVX-512 IFMA, else AVX2, else none (inline signing).
    #[default]
    Auto,
    /// AVX-512 IFMA (8 lanes per register).
    Avx512ifma,
    /// AVX2 (4 lanes per register).
    Avx2,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            mode: default_engine_mode(),
            batch_size: None,
            poll_delay: default_poll_delay(),
            small_batch_threshold: None,
            kernel: EngineKernel::Auto,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    None,
    V1,
    V2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Read through [`ListenerConfig::address`]; spanned to name its line in errors.
    #[serde(rename = "address")]
    pub address_spanned: Spanned<SocketAddr>,
    /// `host:port` of plaintext backends, tried round robin; "builtin" is the internal responder.
    pub backends: Spanned<Vec<String>>,
    #[serde(default = "default_proxy_protocol")]
    pub proxy_protocol: ProxyProtocol,
    /// ALPN protocols offered, in server preference order. Empty: no ALPN.
    #[serde(default)]
    pub alpn: Vec<String>,
    #[serde(default = "default_min_version")]
    pub min_version: TlsVersion,
    #[serde(default = "default_max_version")]
    pub max_version: TlsVersion,
    /// TLS 1.2 cipher suites (OpenSSL names). TLS 1.3 suites are fixed by BoringSSL.
    #[serde(default = "default_ciphers")]
    pub ciphers: Spanned<String>,
    /// TLS 1.3 suites in server preference order; "A|B" leaves the choice between A and B
    /// to the client. A client that lists ChaCha20 first (a sign of no AES hardware) gets
    /// ChaCha20 if it is configured. The default prefers AES-128-GCM: its SHA-256 key
    /// schedule has hardware support where AES-256-GCM's SHA-384 has none.
    #[serde(default = "default_tls13_ciphers")]
    pub tls13_ciphers: Spanned<Vec<String>>,
    /// Key-exchange groups in preference order: X25519MLKEM768 (post-quantum hybrid),
    /// X25519, P-256, P-384.
    #[serde(default = "default_groups")]
    pub groups: Spanned<Vec<String>>,
    /// Certificate compression (RFC 8879, TLS 1.3) offered to clients that ask for it, in
    /// preference order: "brotli", "zlib". Empty: certificates are always sent plain.
    #[serde(default = "default_cert_compression")]
    pub cert_compression: Spanned<Vec<String>>,
    #[serde(default = "default_handshake_timeout", with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// A connection with no traffic either way for this long is closed.
    #[serde(default = "default_idle_timeout", with = "humantime_serde")]
    pub idle_timeout: Duration,
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// A backend that refused a connection is skipped for this long.
    #[serde(default = "default_backend_retry", with = "humantime_serde")]
    pub backend_retry: Duration,
    /// Per worker; when reached the worker stops accepting until a connection closes.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Relay buffer per direction (bytes): bounds memory per connection.
    #[serde(default = "default_buffer_size")]
    pub buffer_size: usize,
    #[serde(default, rename = "certificate")]
    pub certificates: Vec<CertificateConfig>,
    /// A client whose SNI names no certificate: served the default one, or refused.
    /// (A client without SNI always gets the default.)
    #[serde(default = "default_unknown_sni")]
    pub unknown_sni: UnknownSni,
    /// Client certificates (mTLS): "none", "optional" or "required".
    #[serde(default = "default_client_auth")]
    pub client_auth: ClientAuth,
    /// PEM bundle of the CAs that client certificates must chain to.
    pub client_ca: Option<Spanned<PathBuf>>,
    /// CRLs (PEM, one or more; or one DER) that client certificates are checked against;
    /// re-read on reload. A CRL past its nextUpdate makes its CA's clients fail.
    pub client_crl: Option<CrlFile>,
    /// Which certificates the CRLs are checked for: the client's own ("leaf"), or every
    /// certificate of its chain ("chain": each issuer then needs a CRL, roots included).
    #[serde(default = "default_crl_check")]
    pub client_crl_check: CrlCheck,
    /// TLS 1.3 0-RTT: resumed clients may send up to 14,336 bytes (BoringSSL's fixed
    /// max_early_data_size) before the handshake completes. Off by default: early data can
    /// be replayed by an attacker; tlsterm refuses a ClientHello it has seen (see
    /// `[session] early_data_replay_entries`) and marks such connections to the backend
    /// (PROXY v2 TLV 0xE3).
    #[serde(default = "default_off")]
    pub early_data: Spanned<bool>,
    /// Of a connection's early data, how many bytes reach the backend before the handshake
    /// is confirmed; the rest waits for the client's Finished (and is dropped if it never
    /// comes). At most 14,336, all BoringSSL accepts, which is the default.
    #[serde(default = "default_max_early_data")]
    pub max_early_data: Spanned<usize>,
    /// Encrypted Client Hello key files (`tlsterm ech keygen`), re-read on reload. The
    /// first is offered in retry configs to clients whose ECH could not be decrypted;
    /// the others still decrypt (rotation). Certificates, per-name settings and
    /// client-certificate policy follow the encrypted (inner) SNI.
    pub ech_keys: Option<Spanned<Vec<PathBuf>>>,
    /// Settings for particular SNI names, overriding the listener's.
    #[serde(default, rename = "server_name")]
    pub server_names: Vec<ServerNameConfig>,
    /// Names to obtain certificates for from the `[acme]` CA.
    pub acme: Option<AcmeNames>,
    /// Filled at validation: every certificate to obtain for this listener (its own
    /// `acme` and its server names').
    #[serde(skip)]
    pub acme_certificates: Vec<AcmeCertificate>,
}

/// A `client_crl` file: its path, and its CRLs as read when the configuration was
/// validated (so a reload reads and parses a large CRL file once).
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "Spanned<PathBuf>")]
pub struct CrlFile {
    pub path: Spanned<PathBuf>,
    crls: Option<Arc<crls::Crls>>,
}

impl From<Spanned<PathBuf>> for CrlFile {
    fn from(path: Spanned<PathBuf>) -> CrlFile {
        CrlFile { path, crls: None }
    }
}

impl CrlFile {
    /// The CRLs read when the configuration was validated.
    pub fn crls(&self) -> anyhow::Result<&crls::Crls> {
        self.crls.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "client_crl {} was not read (configuration not validated)",
                self.path.get_ref().display()
            )
        })
    }
}

impl ListenerConfig {
    pub fn address(&self) -> SocketAddr {
        *self.address_spanned.get_ref()
    }
}

/// `[[listener.server_name]]`: what differs for connections whose SNI matches `names`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerNameConfig {
    /// Exact names or "*.suffix" wildcards.
    pub names: Spanned<Vec<String>>,
    pub backends: Option<Spanned<Vec<String>>>,
    pub alpn: Option<Vec<String>>,
    pub min_version: Option<TlsVersion>,
    pub client_auth: Option<ClientAuth>,
    pub client_ca: Option<Spanned<PathBuf>>,
    pub client_crl: Option<CrlFile>,
    pub client_crl_check: Option<CrlCheck>,
    /// `[[listener.server_name.certificate]]`: certificates kept with the rest of this
    /// name's settings. Their `names` default to this block's names (not their SAN). At
    /// load they join the listener's certificates.
    #[serde(default, rename = "certificate")]
    pub certificates: Vec<CertificateConfig>,
    /// Obtain a certificate for these names (default: the block's `names`) from `[acme]`.
    pub acme: Option<AcmeNames>,
}

impl ServerNameConfig {
    /// Whether its connections are checked for client certificates otherwise than the
    /// listener's (`listener_auth`): another `client_auth`, or its own CA or CRL settings
    /// while certificates are asked for.
    fn client_policy_differs(&self, listener_auth: ClientAuth) -> bool {
        let auth = self.client_auth.unwrap_or(listener_auth);
        let own_trust = self.client_ca.is_some()
            || self.client_crl.is_some()
            || self.client_crl_check.is_some();
        auth != listener_auth || (auth != ClientAuth::None && own_trust)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownSni {
    Default,
    Refuse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    None,
    Optional,
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CrlCheck {
    Leaf,
    Chain,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// PEM file: the certificate followed by its chain.
    pub cert: Spanned<PathBuf>,
    /// PEM private key (RSA 2048/3072/4096 or ECDSA P-256/P-384).
    pub key: Spanned<PathBuf>,
    /// SNI names served by it ("*.example.com" allowed). Default: the certificate's DNS names.
    #[serde(default)]
    pub names: Vec<String>,
    /// Served to clients whose SNI matches nothing (and to clients without SNI).
    #[serde(default)]
    pub default: bool,
    /// A DER OCSP response to staple (re-read on reload; not stapled if stale or not
    /// for this certificate).
    pub ocsp: Option<Spanned<PathBuf>>,
    /// Fetch the OCSP response from the responder named in the certificate (its Authority
    /// Information Access) and keep it fresh in the background; `ocsp`, if set, is the
    /// starting value. Needs the issuer as the second certificate of `cert`.
    #[serde(default)]
    pub ocsp_fetch: bool,
}

/// The most early data BoringSSL accepts on a connection (kMaxEarlyDataAccepted).
pub const BORINGSSL_MAX_EARLY_DATA: usize = 14_336;

fn default_max_early_data() -> Spanned<usize> {
    Spanned::new(0..0, BORINGSSL_MAX_EARLY_DATA)
}
fn default_off() -> Spanned<bool> {
    Spanned::new(0..0, false)
}
fn default_unknown_sni() -> UnknownSni {
    UnknownSni::Default
}
fn default_client_auth() -> ClientAuth {
    ClientAuth::None
}
fn default_crl_check() -> CrlCheck {
    CrlCheck::Leaf
}
fn default_global_max_connections() -> usize {
    100_000
}
fn default_drain_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_log_level() -> String {
    "info".into()
}
fn default_engine_mode() -> EngineMode {
    EngineMode::Batch
}
fn default_poll_delay() -> Duration {
    Duration::from_micros(200)
}
fn default_proxy_protocol() -> ProxyProtocol {
    ProxyProtocol::None
}
fn default_min_version() -> TlsVersion {
    TlsVersion::Tls12
}
fn default_max_version() -> TlsVersion {
    TlsVersion::Tls13
}
fn default_ciphers() -> Spanned<String> {
    Spanned::new(0..0, DEFAULT_TLS12_CIPHERS.to_string())
}
fn default_tls13_ciphers() -> Spanned<Vec<String>> {
    Spanned::new(
        0..0,
        vec![
            "TLS_AES_128_GCM_SHA256".into(),
            "TLS_AES_256_GCM_SHA384".into(),
            "TLS_CHACHA20_POLY1305_SHA256".into(),
        ],
    )
}

/// The protocol ID of a TLS 1.3 cipher suite name.
pub fn tls13_cipher_id(name: &str) -> Option<u16> {
    match name {
        "TLS_AES_128_GCM_SHA256" => Some(0x1301),
        "TLS_AES_256_GCM_SHA384" => Some(0x1302),
        "TLS_CHACHA20_POLY1305_SHA256" => Some(0x1303),
        _ => None,
    }
}

/// BoringSSL's name for a configured group, or `None` if unknown.
pub fn group_name(name: &str) -> Option<&'static str> {
    match name.to_ascii_lowercase().as_str() {
        // The hybrid post-quantum group (ML-KEM-768 with X25519) of current browsers.
        "x25519mlkem768" => Some("X25519MLKEM768"),
        "x25519" => Some("X25519"),
        "p-256" | "p256" | "prime256v1" | "secp256r1" => Some("P-256"),
        "p-384" | "p384" | "secp384r1" => Some("P-384"),
        _ => None,
    }
}

/// A certificate compression algorithm tlsterm offers (`cert_compression`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertCompression {
    Brotli,
    Zlib,
}

impl CertCompression {
    /// The algorithm of a configured name.
    pub fn parse(name: &str) -> Option<CertCompression> {
        match name.to_ascii_lowercase().as_str() {
            "brotli" => Some(CertCompression::Brotli),
            "zlib" => Some(CertCompression::Zlib),
            _ => None,
        }
    }
}

fn default_groups() -> Spanned<Vec<String>> {
    Spanned::new(
        0..0,
        vec![
            "X25519MLKEM768".into(),
            "X25519".into(),
            "P-256".into(),
            "P-384".into(),
        ],
    )
}
fn default_cert_compression() -> Spanned<Vec<String>> {
    Spanned::new(0..0, vec!["brotli".into(), "zlib".into()])
}
fn default_handshake_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(300)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_backend_retry() -> Duration {
    Duration::from_secs(5)
}
fn default_max_connections() -> usize {
    10_000
}
fn default_buffer_size() -> usize {
    16 * 1024
}

/// A configuration error that points at the place it comes from.
#[derive(Debug)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Turns byte offsets into line numbers for errors found after parsing.
pub struct SourceMap<'a> {
    file: &'a str,
    text: &'a str,
}

impl SourceMap<'_> {
    pub fn error<T>(&self, span: &Spanned<T>, message: impl Into<String>) -> ConfigError {
        let range = span.span();
        // Defaults carry an empty span at 0: they have no line.
        let line = (range.end > 0).then(|| self.text[..range.start].matches('\n').count() + 1);
        ConfigError {
            file: self.file.to_string(),
            line,
            message: message.into(),
        }
    }

    /// An error about a `[table]` as a whole: it names the table's header line.
    pub fn table_error(&self, table: &str, message: impl Into<String>) -> ConfigError {
        let header = format!("[{table}]");
        let line = self
            .text
            .lines()
            .position(|line| line.trim() == header)
            .map(|index| index + 1);
        ConfigError {
            file: self.file.to_string(),
            line,
            message: message.into(),
        }
    }

    pub fn plain(&self, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line: None,
            message: message.into(),
        }
    }

    /// Resolves a path from the config relative to the config file's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            return path.to_path_buf();
        }
        Path::new(self.file)
            .parent()
            .map(|dir| dir.join(path))
            .unwrap_or_else(|| path.to_path_buf())
    }
}

/// Resolves a configured path against the config file's directory; it must be a file.
fn resolve_file(
    map: &SourceMap<'_>,
    path: &mut Spanned<PathBuf>,
    key: &str,
) -> Result<(), ConfigError> {
    let resolved = map.resolve(path.get_ref());
    if !resolved.is_file() {
        return Err(map.error(
            path,
            format!("key `{key}`: no such file {}", resolved.display()),
        ));
    }
    *path.get_mut() = resolved;
    Ok(())
}

/// Resolves `client_crl` and parses it, so that a broken CRL is an error with a line.
/// Checks a `client_crl` and reads its CRLs (errors name its line).
fn check_crl(
    map: &SourceMap<'_>,
    crl: &mut Option<CrlFile>,
    has_ca: bool,
) -> Result<(), ConfigError> {
    let Some(crl) = crl else { return Ok(()) };
    if !has_ca {
        return Err(map.error(&crl.path, "key `client_crl` needs `client_ca`"));
    }
    resolve_file(map, &mut crl.path, "client_crl")?;
    let crls = crls::Crls::load(crl.path.get_ref())
        .map_err(|e| map.error(&crl.path, format!("key `client_crl`: {e:#}")))?;
    crl.crls = Some(Arc::new(crls));
    Ok(())
}

fn check_backends(map: &SourceMap<'_>, backends: &Spanned<Vec<String>>) -> Result<(), ConfigError> {
    if backends.get_ref().is_empty() {
        return Err(map.error(backends, "key `backends`: must not be empty"));
    }
    for backend in backends.get_ref() {
        if backend != BUILTIN_BACKEND && !backend.contains(':') {
            return Err(map.error(
                backends,
                format!("key `backends`: `{backend}` is not host:port or \"builtin\""),
            ));
        }
    }
    Ok(())
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
        let map = SourceMap { file, text };
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
        if let Some(acme) = &mut self.acme {
            acme.validate(map, redis)?;
        }
        if let Some(0) = self.engine.batch_size {
            return Err(map.plain("key `engine.batch_size`: must be at least 1"));
        }
        if let Some(0) = self.engine.small_batch_threshold {
            return Err(map.plain("key `engine.small_batch_threshold`: must be at least 1"));
        }
        let ocsp = &self.ocsp;
        if [ocsp.timeout, ocsp.min_refresh, ocsp.retry].contains(&Duration::ZERO)
            || ocsp.min_refresh > ocsp.max_refresh
        {
            return Err(map.plain(
                "keys `ocsp.*`: durations must be above zero and `min_refresh` <= `max_refresh`",
            ));
        }
        for listener in &mut self.listeners {
            check_backends(map, &listener.backends)?;
            let listener_ca = listener.client_ca.is_some();
            for name in &mut listener.server_names {
                if name.names.get_ref().is_empty() {
                    return Err(map.error(&name.names, "key `names`: must not be empty"));
                }
                if let Some(backends) = &name.backends {
                    check_backends(map, backends)?;
                }
                if let Some(ca) = &mut name.client_ca {
                    resolve_file(map, ca, "client_ca")?;
                }
                let has_ca = listener_ca || name.client_ca.is_some();
                check_crl(map, &mut name.client_crl, has_ca)?;
                let needs_ca = matches!(
                    name.client_auth,
                    Some(ClientAuth::Optional | ClientAuth::Required)
                );
                if needs_ca && name.client_ca.is_none() && !listener_ca {
                    return Err(map.error(
                        &name.names,
                        "key `client_auth` needs `client_ca` (here or on the listener)",
                    ));
                }
                if name.backends.is_none() && name.client_policy_differs(listener.client_auth) {
                    return Err(map.error(
                        &name.names,
                        "key `backends` is needed here: this name's client-certificate policy differs from the listener's, and a backend both used would be reached under the weaker of the two (by a client sending the other name, or none)",
                    ));
                }
            }
            if listener.min_version > listener.max_version {
                return Err(map.plain(format!(
                    "listener {}: key `min_version` is above `max_version`",
                    listener.address()
                )));
            }
            if listener.max_connections == 0 || listener.buffer_size < 1024 {
                return Err(map.plain(format!(
                    "listener {}: `max_connections` must be >= 1 and `buffer_size` >= 1024",
                    listener.address()
                )));
            }
            if *listener.early_data.get_ref() && listener.max_version < TlsVersion::Tls13 {
                return Err(map.error(
                    &listener.early_data,
                    "key `early_data`: 0-RTT exists only in TLS 1.3, but `max_version` is 1.2",
                ));
            }
            if *listener.max_early_data.get_ref() > BORINGSSL_MAX_EARLY_DATA {
                return Err(map.error(
                    &listener.max_early_data,
                    "key `max_early_data`: at most 14336 (all the early data BoringSSL accepts)",
                ));
            }
            let tls13 = listener.tls13_ciphers.get_ref();
            let names = tls13.iter().flat_map(|entry| entry.split('|'));
            if tls13.is_empty() || names.clone().any(|n| tls13_cipher_id(n.trim()).is_none()) {
                return Err(map.error(
                    &listener.tls13_ciphers,
                    "key `tls13_ciphers`: a non-empty list of TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256 (\"A|B\": client's choice)",
                ));
            }
            if listener.groups.get_ref().is_empty() {
                return Err(map.error(&listener.groups, "key `groups`: must not be empty"));
            }
            for group in listener.groups.get_ref() {
                if group_name(group).is_none() {
                    return Err(map.error(
                        &listener.groups,
                        format!("key `groups`: unknown group `{group}` (X25519MLKEM768, X25519, P-256, P-384)"),
                    ));
                }
            }
            if let Some(files) = &mut listener.ech_keys {
                if files.get_ref().is_empty() || listener.max_version < TlsVersion::Tls13 {
                    return Err(map.error(
                        files,
                        "key `ech_keys`: needs at least one file, and TLS 1.3 (`max_version`)",
                    ));
                }
                let resolved: Vec<PathBuf> =
                    files.get_ref().iter().map(|f| map.resolve(f)).collect();
                for file in &resolved {
                    if let Err(err) = ech_key::EchKey::load(file) {
                        return Err(map.error(files, format!("key `ech_keys`: {err:#}")));
                    }
                }
                *files.get_mut() = resolved;
            }
            let algorithms = listener.cert_compression.get_ref();
            for (i, name) in algorithms.iter().enumerate() {
                let message = if CertCompression::parse(name).is_none() {
                    format!("unknown algorithm `{name}` (brotli, zlib)")
                } else if algorithms[..i].iter().any(|n| n.eq_ignore_ascii_case(name)) {
                    format!("`{name}` is listed twice")
                } else {
                    continue;
                };
                return Err(map.error(
                    &listener.cert_compression,
                    format!("key `cert_compression`: {message}"),
                ));
            }
            match (&mut listener.client_ca, listener.client_auth) {
                (None, ClientAuth::Optional | ClientAuth::Required) => {
                    return Err(map.plain(format!(
                        "listener {}: key `client_auth` needs `client_ca`",
                        listener.address()
                    )))
                }
                (Some(ca), _) => {
                    let resolved = map.resolve(ca.get_ref());
                    if !resolved.is_file() {
                        return Err(map.error(
                            ca,
                            format!("key `client_ca`: no such file {}", resolved.display()),
                        ));
                    }
                    *ca.get_mut() = resolved;
                }
                (None, ClientAuth::None) => {}
            }
            check_crl(map, &mut listener.client_crl, listener_ca)?;
            let has_acme = self.acme.is_some();
            let mut acme_certificates = match &listener.acme {
                Some(acme) => acme.resolve(map, None, has_acme)?,
                None => Vec::new(),
            };
            for name in &listener.server_names {
                if let Some(acme) = &name.acme {
                    acme_certificates.extend(acme.resolve(map, Some(&name.names), has_acme)?);
                }
            }
            listener.acme_certificates = acme_certificates;
            for name in &mut listener.server_names {
                for mut cert in std::mem::take(&mut name.certificates) {
                    if cert.names.is_empty() {
                        cert.names = name.names.get_ref().clone();
                    }
                    listener.certificates.push(cert);
                }
            }
            for cert in &mut listener.certificates {
                resolve_file(map, &mut cert.cert, "cert")?;
                resolve_file(map, &mut cert.key, "key")?;
                if let Some(ocsp) = &mut cert.ocsp {
                    resolve_file(map, ocsp, "ocsp")?;
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names() {
        assert_eq!(group_name("x25519"), Some("X25519"));
        assert_eq!(group_name("X25519MLKEM768"), Some("X25519MLKEM768"));
        assert_eq!(group_name("prime256v1"), Some("P-256"));
        assert_eq!(group_name("X448"), None);
    }

    #[test]
    fn a_bad_session_table_names_its_line() {
        let text = "workers = 1\n\n[session]\nticket_rotation = \"0s\"\n\n[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
        let err = Config::parse("t.toml", text).unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(
            err.message.contains("ticket_rotation must be more than 0"),
            "{err}"
        );
    }

    #[test]
    fn embedded_default_parses() {
        let config = Config::embedded_default();
        assert_eq!(config.listeners.len(), 1);
        assert_eq!(
            config.listeners[0].handshake_timeout,
            Duration::from_secs(10)
        );
        assert_eq!(config.engine.mode, EngineMode::Batch);
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = "workers = 1\n\n[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nfrobnicate = 3\n";
        let err = Config::parse("t.toml", text).unwrap_err();
        assert_eq!(err.line, Some(6), "{err}");
        assert!(err.message.contains("frobnicate"), "{err}");
    }

    #[test]
    fn a_listener_address_twice_names_the_second() {
        let listener = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
        let err = Config::parse("t.toml", &listener.repeat(2)).unwrap_err();
        assert_eq!(err.line, Some(5), "{err}");
        assert!(err.message.contains("key `address`"), "{err}");
    }

    #[test]
    fn bad_value_names_line() {
        let text = "[[listener]]\naddress = \"not an address\"\nbackends = [\"builtin\"]\n";
        let err = Config::parse("t.toml", text).unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
    }

    #[test]
    fn missing_certificate_file_names_key_and_line() {
        let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n[[listener.certificate]]\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\"\n";
        let err = Config::parse("t.toml", text).unwrap_err();
        assert_eq!(err.line, Some(5), "{err}");
        assert!(err.message.contains("key `cert`"), "{err}");
    }

    #[test]
    fn early_data_needs_tls13() {
        let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nmax_version = \"1.2\"\nearly_data = true\n";
        let err = Config::parse("t.toml", text).unwrap_err();
        assert_eq!(err.line, Some(5), "{err}");
        assert!(err.message.contains("key `early_data`"), "{err}");
        let on = text.replace("max_version = \"1.2\"\n", "");
        assert!(*Config::parse("t.toml", &on).unwrap().listeners[0]
            .early_data
            .get_ref());
        let err = Config::parse("t.toml", &format!("{on}max_early_data = 20000\n")).unwrap_err();
        assert_eq!(err.line, Some(5), "{err}");
        assert!(err.message.contains("key `max_early_data`"), "{err}");
    }

    #[test]
    fn server_name_certificates_default_to_the_block_names() {
        let dir = tempfile::tempdir().unwrap();
        for file in ["a.pem", "a.key"] {
            std::fs::write(dir.path().join(file), "").unwrap();
        }
        let text = format!(
            "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n\
             [[listener.server_name]]\nnames = [\"a.test\", \"*.a.test\"]\n\
             [[listener.server_name.certificate]]\ncert = \"{0}/a.pem\"\nkey = \"{0}/a.key\"\n\
             [[listener.server_name.certificate]]\ncert = \"{0}/a.pem\"\nkey = \"{0}/a.key\"\nnames = [\"x.test\"]\n",
            dir.path().display()
        );
        let config = Config::parse("t.toml", &text).unwrap();
        let certs = &config.listeners[0].certificates;
        assert_eq!(certs.len(), 2);
        assert_eq!(certs[0].names, ["a.test", "*.a.test"]);
        assert_eq!(certs[1].names, ["x.test"]);
        assert!(config.listeners[0].server_names[0].certificates.is_empty());
    }

    #[test]
    fn client_crl_needs_client_ca() {
        let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nclient_crl = \"crl.pem\"\n";
        let err = Config::parse("t.toml", text).unwrap_err();
        assert_eq!(err.line, Some(4), "{err}");
        assert!(
            err.message.contains("key `client_crl` needs `client_ca`"),
            "{err}"
        );
    }

    #[test]
    fn a_name_with_its_own_client_certificate_policy_needs_its_own_backends() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), "").unwrap();
        let ca = format!("client_ca = \"{}/ca.pem\"\n", dir.path().display());
        let listener = |auth: &str| {
            format!(
                "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n{ca}\
                 client_auth = \"{auth}\"\n[[listener.server_name]]\nnames = [\"admin.test\"]\n"
            )
        };
        for (auth, name) in [
            ("none", "client_auth = \"required\"\n"),
            ("none", "client_auth = \"optional\"\n"),
            ("required", "client_auth = \"none\"\n"),
            ("required", "client_crl_check = \"chain\"\n"),
            ("optional", ca.as_str()),
        ] {
            let text = format!("{}{name}", listener(auth));
            let err = Config::parse("t.toml", &text).unwrap_err();
            assert_eq!(err.line, Some(7), "{auth} / {name}: {err}");
            assert!(err.message.contains("key `backends`"), "{err}");
            let own = format!("{text}backends = [\"127.0.0.1:2\"]\n");
            assert!(Config::parse("t.toml", &own).is_ok(), "{auth} / {name}");
        }
        // The listener's policy again, or none asked for at all: the listener's backends.
        for (auth, name) in [
            ("required", "client_auth = \"required\"\n"),
            ("none", "client_auth = \"none\"\n"),
            ("none", "client_crl_check = \"chain\"\n"),
            ("optional", "alpn = [\"h2\"]\n"),
        ] {
            let text = format!("{}{name}", listener(auth));
            assert!(Config::parse("t.toml", &text).is_ok(), "{auth} / {name}");
        }
    }

    #[test]
    fn cert_compression_is_checked() {
        let base = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
        let config = Config::parse("t.toml", base).unwrap();
        assert_eq!(
            config.listeners[0].cert_compression.get_ref(),
            &["brotli", "zlib"]
        );
        for bad in ["[\"zstd\"]", "[\"zlib\", \"ZLIB\"]"] {
            let text = format!("{base}cert_compression = {bad}\n");
            let err = Config::parse("t.toml", &text).unwrap_err();
            assert_eq!(err.line, Some(4), "{err}");
            assert!(err.message.contains("key `cert_compression`"), "{err}");
        }
        let off = format!("{base}cert_compression = []\n");
        assert!(Config::parse("t.toml", &off).unwrap().listeners[0]
            .cert_compression
            .get_ref()
            .is_empty());
    }

    #[test]
    fn post_quantum_group_is_first_by_default() {
        let base = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
        let config = Config::parse("t.toml", base).unwrap();
        assert_eq!(config.listeners[0].groups.get_ref()[0], "X25519MLKEM768");
        let text = format!("{base}groups = [\"x25519mlkem768\", \"x25519\"]\n");
        assert!(Config::parse("t.toml", &text).is_ok());
        let err = Config::parse("t.toml", &format!("{base}groups = []\n")).unwrap_err();
        assert_eq!(err.line, Some(4), "{err}");
    }

    #[test]
    fn unknown_group_is_refused() {
        let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\ngroups = [\"X448\"]\n";
        let err = Config::parse("t.toml", text).unwrap_err();
        assert_eq!(err.line, Some(4), "{err}");
    }

    #[test]
    fn acme_names_come_from_the_listener_or_the_server_name() {
        let text = r#"
[acme]
directory = "https://ca.example/dir"
storage = "/tmp/acme"

[[listener]]
address = "127.0.0.1:1"
backends = ["builtin"]
acme = { names = ["A.example", "b.example."] }

[[listener.server_name]]
names = ["api.example"]
acme = { key_types = ["rsa-2048", "ecdsa-p256"] }
"#;
        let config = Config::parse("t.toml", text).unwrap();
        let got: Vec<(Vec<String>, AcmeKeyType)> = config.listeners[0]
            .acme_certificates
            .iter()
            .map(|c| (c.names.clone(), c.key_type))
            .collect();
        let ab = vec!["a.example".to_string(), "b.example".to_string()];
        let api = vec!["api.example".to_string()];
        assert_eq!(
            got,
            [
                (ab, AcmeKeyType::EcdsaP256),
                (api.clone(), AcmeKeyType::Rsa2048),
                (api, AcmeKeyType::EcdsaP256)
            ]
        );
    }

    #[test]
    fn acme_names_without_acme_section_name_their_line() {
        let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nacme = { names = [\"a.example\"] }\n";
        let err = Config::parse("t.toml", text).unwrap_err().to_string();
        assert!(
            err.starts_with("t.toml:4:") && err.contains("[acme]"),
            "{err}"
        );
        let with_redis = "[session]\nredis_url = \"redis://127.0.0.1\"\n[acme]\ndirectory = \"https://ca.example/dir\"\nstorage = \"s\"\n".to_string() + text;
        let err = Config::parse("t.toml", &with_redis)
            .unwrap_err()
            .to_string();
        assert!(err.contains("fleet_key_file"), "{err}");
    }
}
