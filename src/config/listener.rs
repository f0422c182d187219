//! `[[listener]]`: an address, its certificates, TLS settings, backends and limits,
//! and the checks that tie them together (errors name the key and line).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::acme::{AcmeCertificate, AcmeNames};
use super::client_trust::{check_crl, ClientAuth, CrlCheck, CrlFile};
use super::ech_key;
use super::server_name::{
    normal_name, normal_policy, ClientPolicy, ListenerFacts, ServerNameConfig,
};
use super::source::{resolve_file, ConfigError, SourceMap};
use super::tls_names::{
    group_name, tls13_cipher_id, CertCompression, TlsVersion, BORINGSSL_MAX_EARLY_DATA,
    DEFAULT_TLS12_CIPHERS,
};

/// Address of the built-in HTTP responder, usable in `backends` (the embedded default uses it).
pub const BUILTIN_BACKEND: &str = "builtin";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    None,
    V1,
    V2,
}

/// What a listener hands its backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerMode {
    /// Each client connection's plaintext bytes, relayed over a backend connection of its
    /// own: any protocol, and the PROXY header if asked.
    Tcp,
    /// Each HTTP/1.1 request, forwarded over the worker's keep-alive connections to the
    /// backend (no connection opened per client), with the client's address and
    /// certificate as headers.
    Http,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Read through [`ListenerConfig::address`]; spanned to name its line in errors.
    #[serde(rename = "address")]
    pub address_spanned: Spanned<SocketAddr>,
    /// `host:port` of plaintext backends, tried round robin; "builtin" is the internal responder.
    pub backends: Spanned<Vec<String>>,
    /// "tcp": relay bytes; "http": forward HTTP/1.1 and HTTP/2 requests as HTTP/1.1 over
    /// pooled connections.
    #[serde(default = "default_mode")]
    pub mode: Spanned<ListenerMode>,
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
    /// A worker's keep-alive connection to a backend (`mode = "http"`, HTTP/3) unused for
    /// this long is closed.
    #[serde(default = "default_backend_keepalive", with = "humantime_serde")]
    pub backend_keepalive: Duration,
    /// With `mode = "http"` and over HTTP/3: the most connections a worker has open to the
    /// listener's backends (to a `server_name`'s own backends, to those) at once, busy or
    /// idle; a request that finds all of them busy waits for one (up to `idle_timeout`, then
    /// 504). None by default.
    #[serde(default)]
    pub backend_max_connections: Option<std::num::NonZeroUsize>,
    /// Per worker; when reached the worker stops accepting until a connection closes.
    #[serde(
        default = "default_max_connections",
        deserialize_with = "connection_limit"
    )]
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
    /// `[session] early_data_replay_entries`) and marks what may be a replay to the backend:
    /// the connection with `mode = "tcp"` (PROXY v2 TLV 0xE3), each request forwarded before
    /// the handshake is confirmed with `mode = "http"` and over QUIC (`Early-Data: 1`).
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
    /// HTTP/3 over QUIC (UDP) beside TCP: see docs/http3.md and `config/quic.rs`.
    #[serde(default = "super::quic::default_quic")]
    pub quic: Spanned<bool>,
    /// The UDP address for HTTP/3, when not the listener's own `address`.
    pub quic_address: Option<Spanned<SocketAddr>>,
    /// A QUIC connection with no packets either way for this long is closed.
    #[serde(
        default = "super::quic::default_quic_idle_timeout",
        with = "humantime_serde"
    )]
    pub quic_idle_timeout: Duration,
    /// QUIC connections open at once per worker; new ones are refused beyond it.
    #[serde(default = "super::quic::default_quic_max_connections")]
    pub quic_max_connections: Spanned<usize>,
    /// The longest an HTTP/3 request waits for the backend's response head (then 504).
    #[serde(
        default = "super::quic::default_quic_backend_timeout",
        with = "humantime_serde"
    )]
    pub quic_backend_timeout: Duration,
    /// Which new QUIC connections get a stateless Retry first: "auto", "always", "never".
    #[serde(default = "super::quic::default_quic_retry")]
    pub quic_retry: super::quic::QuicRetry,
    /// With `quic_retry = "auto"`: handshakes in progress per worker from which new
    /// connections get a Retry.
    #[serde(default = "super::quic::default_quic_retry_threshold")]
    pub quic_retry_threshold: Spanned<usize>,
    /// HTTP/3 requests carry the verified client certificate as `X-Client-Cert-*` headers.
    #[serde(default = "super::quic::default_quic_client_cert_headers")]
    pub quic_client_cert_headers: bool,
    /// Filled at validation: every certificate to obtain for this listener (its own
    /// `acme` and its server names').
    #[serde(skip)]
    pub acme_certificates: Vec<AcmeCertificate>,
    /// Filled at validation without PROXY v2: the backends of each client-certificate
    /// policy, compared again by address when the backends are resolved.
    #[serde(skip)]
    pub backend_policies: Option<BackendPolicies>,
}

impl ListenerConfig {
    pub fn address(&self) -> SocketAddr {
        *self.address_spanned.get_ref()
    }

    /// Checks this listener and its server names concern by concern (the first problem
    /// found is the error), resolves its files against the configuration's directory,
    /// collects the certificates it must obtain from `[acme]` (`has_acme`: whether that
    /// section exists) and moves its server names' certificates into its own list.
    pub(super) fn validate(
        &mut self,
        map: &SourceMap<'_>,
        has_acme: bool,
    ) -> Result<(), ConfigError> {
        check_backends(map, &self.backends)?;
        self.check_mode(map)?;
        self.check_quic(map)?;
        let facts = ListenerFacts {
            has_ca: self.client_ca.is_some(),
            auth: self.client_auth,
            max_version: self.max_version,
        };
        for name in &mut self.server_names {
            name.validate(map, &facts)?;
        }
        check_distinct_names(map, &self.server_names)?;
        self.check_versions_and_buffers(map)?;
        self.check_suites_and_groups(map)?;
        self.resolve_ech_keys(map)?;
        self.check_cert_compression(map)?;
        self.resolve_client_trust(map)?;
        // After the files are resolved: policies compare their paths.
        if self.proxy_protocol != ProxyProtocol::V2 {
            self.backend_policies = Some(self.policy_backends(map)?);
        }
        self.collect_acme_certificates(map, has_acme)?;
        self.collect_certificates(map)
    }

    /// `mode = "http"`: what a forwarded request cannot carry. A PROXY header describes one
    /// client, but a pooled backend connection carries many clients' requests (the client's
    /// address and certificate go as headers instead); HTTP/1.1 and HTTP/2 are the
    /// protocols spoken to clients.
    fn check_mode(&self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        if *self.mode.get_ref() != ListenerMode::Http {
            return Ok(());
        }
        let refuse =
            |what: &str| Err(map.error(&self.mode, format!("key `mode`: \"http\" {what}")));
        if self.proxy_protocol != ProxyProtocol::None {
            return refuse("sends the client's address as X-Forwarded-For, not as a PROXY header (one backend connection carries many clients' requests): remove `proxy_protocol`, or use mode = \"tcp\"");
        }
        let offered = self
            .server_names
            .iter()
            .flat_map(|name| name.alpn.iter().flatten());
        if let Some(other) = self
            .alpn
            .iter()
            .chain(offered)
            .find(|p| !matches!(p.as_str(), "h2" | "http/1.1"))
        {
            return refuse(&format!("speaks HTTP/1.1 and HTTP/2 to clients, so `alpn` may offer only \"h2\" and \"http/1.1\", not \"{other}\""));
        }
        Ok(())
    }

    /// The version range, 0-RTT (which needs TLS 1.3) and the buffer size.
    fn check_versions_and_buffers(&self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        if self.min_version > self.max_version {
            return Err(map.plain(format!(
                "listener {}: key `min_version` is above `max_version`",
                self.address()
            )));
        }
        if self.buffer_size < 1024 {
            return Err(map.plain(format!(
                "listener {}: `buffer_size` must be >= 1024",
                self.address()
            )));
        }
        if *self.early_data.get_ref() && self.max_version < TlsVersion::Tls13 {
            return Err(map.error(
                &self.early_data,
                "key `early_data`: 0-RTT exists only in TLS 1.3, but `max_version` is 1.2",
            ));
        }
        if *self.max_early_data.get_ref() > BORINGSSL_MAX_EARLY_DATA {
            return Err(map.error(
                &self.max_early_data,
                "key `max_early_data`: at most 14336 (all the early data BoringSSL accepts)",
            ));
        }
        Ok(())
    }

    /// `tls13_ciphers` and `groups`: known names, and at least one of each.
    fn check_suites_and_groups(&self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        let tls13 = self.tls13_ciphers.get_ref();
        let names = tls13.iter().flat_map(|entry| entry.split('|'));
        if tls13.is_empty() || names.clone().any(|n| tls13_cipher_id(n.trim()).is_none()) {
            return Err(map.error(
                &self.tls13_ciphers,
                "key `tls13_ciphers`: a non-empty list of TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256 (\"A|B\": client's choice)",
            ));
        }
        if self.groups.get_ref().is_empty() {
            return Err(map.error(&self.groups, "key `groups`: must not be empty"));
        }
        for group in self.groups.get_ref() {
            if group_name(group).is_none() {
                return Err(map.error(
                    &self.groups,
                    format!("key `groups`: unknown group `{group}` (X25519MLKEM768, X25519, P-256, P-384)"),
                ));
            }
        }
        Ok(())
    }

    /// `ech_keys`: TLS 1.3, and files that hold keys (resolved against the config's folder).
    fn resolve_ech_keys(&mut self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        let Some(files) = &mut self.ech_keys else {
            return Ok(());
        };
        if files.get_ref().is_empty() || self.max_version < TlsVersion::Tls13 {
            return Err(map.error(
                files,
                "key `ech_keys`: needs at least one file, and TLS 1.3 (`max_version`)",
            ));
        }
        let resolved: Vec<PathBuf> = files.get_ref().iter().map(|f| map.resolve(f)).collect();
        for file in &resolved {
            if let Err(err) = ech_key::EchKey::load(file) {
                return Err(map.error(files, format!("key `ech_keys`: {err:#}")));
            }
        }
        *files.get_mut() = resolved;
        Ok(())
    }

    /// `cert_compression`: known algorithms, each once.
    fn check_cert_compression(&self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        let algorithms = self.cert_compression.get_ref();
        for (i, name) in algorithms.iter().enumerate() {
            let message = if CertCompression::parse(name).is_none() {
                format!("unknown algorithm `{name}` (brotli, zlib)")
            } else if algorithms[..i].iter().any(|n| n.eq_ignore_ascii_case(name)) {
                format!("`{name}` is listed twice")
            } else {
                continue;
            };
            return Err(map.error(
                &self.cert_compression,
                format!("key `cert_compression`: {message}"),
            ));
        }
        Ok(())
    }

    /// Client certificates: `client_auth` needs `client_ca`; the CA and CRL files resolved.
    fn resolve_client_trust(&mut self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        let listener_ca = self.client_ca.is_some();
        match (&mut self.client_ca, self.client_auth) {
            (None, ClientAuth::Optional | ClientAuth::Required) => {
                return Err(map.plain(format!(
                    "listener {}: key `client_auth` needs `client_ca`",
                    self.address()
                )))
            }
            (Some(ca), _) => resolve_file(map, ca, "client_ca")?,
            (None, ClientAuth::None) => {}
        }
        check_crl(map, &mut self.client_crl, listener_ca)
    }

    /// The backends of each client-certificate policy (see `check_backends_per_policy`).
    fn policy_backends(&self, map: &SourceMap<'_>) -> Result<BackendPolicies, ConfigError> {
        let listener_policy = normal_policy((
            self.client_auth,
            self.client_ca.as_ref().map(|ca| ca.get_ref().clone()),
            self.client_crl
                .as_ref()
                .map(|crl| crl.path.get_ref().clone()),
            Some(self.client_crl_check),
        ));
        check_backends_per_policy(
            map,
            &self.server_names,
            (&self.backends, self.client_auth),
            &listener_policy,
        )
    }

    /// The certificates ACME keeps: the listener's `[listener.acme]` and each name's.
    fn collect_acme_certificates(
        &mut self,
        map: &SourceMap<'_>,
        has_acme: bool,
    ) -> Result<(), ConfigError> {
        let mut acme_certificates = match &self.acme {
            Some(acme) => acme.resolve(map, None, has_acme)?,
            None => Vec::new(),
        };
        for name in &self.server_names {
            if let Some(acme) = &name.acme {
                acme_certificates.extend(acme.resolve(map, Some(&name.names), has_acme)?);
            }
        }
        self.acme_certificates = acme_certificates;
        Ok(())
    }

    /// Moves each name's certificates into the listener's list (named after the name
    /// unless they say otherwise) and resolves every certificate's files.
    fn collect_certificates(&mut self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        for name in &mut self.server_names {
            for mut cert in std::mem::take(&mut name.certificates) {
                if cert.names.is_empty() {
                    cert.names = name.names.get_ref().clone();
                }
                self.certificates.push(cert);
            }
        }
        for cert in &mut self.certificates {
            resolve_file(map, &mut cert.cert, "cert")?;
            resolve_file(map, &mut cert.key, "key")?;
            if let Some(ocsp) = &mut cert.ocsp {
                resolve_file(map, ocsp, "ocsp")?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownSni {
    Default,
    Refuse,
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

fn default_max_early_data() -> Spanned<usize> {
    Spanned::new(0..0, BORINGSSL_MAX_EARLY_DATA)
}
fn default_off() -> Spanned<bool> {
    Spanned::new(0..0, false)
}
fn default_client_auth() -> ClientAuth {
    ClientAuth::None
}
fn default_crl_check() -> CrlCheck {
    CrlCheck::Leaf
}
fn default_unknown_sni() -> UnknownSni {
    UnknownSni::Default
}
fn default_mode() -> Spanned<ListenerMode> {
    Spanned::new(0..0, ListenerMode::Tcp)
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
/// How long a worker keeps a keep-alive backend connection unused: as long as Node.js's
/// HTTP server keeps one (a common backend), and as long as HAProxy waits before it starts
/// closing unused server connections.
pub const DEFAULT_BACKEND_KEEPALIVE: Duration = Duration::from_secs(5);
fn default_backend_keepalive() -> Duration {
    DEFAULT_BACKEND_KEEPALIVE
}
fn default_max_connections() -> usize {
    10_000
}
/// A listener's `max_connections`, checked while parsing so that the error names its line.
/// Each worker holds that many permits of a semaphore, which cannot hold more than
/// `Semaphore::MAX_PERMITS`: the bound of the process-wide `max_connections` too.
fn connection_limit<'de, D: Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let limit = usize::deserialize(deserializer)?;
    if limit == 0 || limit > tokio::sync::Semaphore::MAX_PERMITS {
        return Err(D::Error::custom(
            "key `max_connections`: must be between 1 and 2^61",
        ));
    }
    Ok(limit)
}
fn default_buffer_size() -> usize {
    16 * 1024
}

/// A name may appear in one `[[listener.server_name]]` block only: connections follow one
/// block's settings, and which one would otherwise depend on the order of the blocks. Names
/// are compared the way SNI is matched: without case, and without a trailing dot.
fn check_distinct_names(
    map: &SourceMap<'_>,
    server_names: &[ServerNameConfig],
) -> Result<(), ConfigError> {
    let mut earlier = HashSet::new();
    for block in server_names {
        let names = block.names.get_ref();
        if let Some(name) = names
            .iter()
            .find(|name| earlier.contains(&normal_name(name)))
        {
            return Err(map.error(
                &block.names,
                format!("key `names`: `{name}` is already in an earlier [[listener.server_name]] of this listener"),
            ));
        }
        earlier.extend(names.iter().map(|name| normal_name(name)));
    }
    Ok(())
}

/// One `backends` list of a listener and the client-certificate policy its connections
/// get: the listener's own (first) or a `[[listener.server_name]]`'s. Kept from validation
/// so that the check can be made again on the addresses the names resolve to.
#[derive(Debug, Clone)]
struct PolicyBackends {
    /// How messages name it: "the listener" or "[[listener.server_name]] [\"admin.test\"]".
    owner: String,
    line: Option<usize>,
    backends: Vec<String>,
    policy: ClientPolicy,
    /// A server name whose policy differs from its listener's (never the listener's own).
    differs_from_listener: bool,
}

/// Every `backends` list of a listener without PROXY v2 that serves a client-certificate
/// policy, for [`ListenerConfig::check_backend_addresses`].
#[derive(Debug, Clone)]
pub struct BackendPolicies {
    file: String,
    /// The listener's first, then its server names that have backends of their own.
    entries: Vec<PolicyBackends>,
}

impl ListenerConfig {
    /// The check that no backend serves two client-certificate policies (see
    /// `check_backends_per_policy`), on addresses rather than spellings: `localhost:9001`,
    /// `127.1:9001`, `127.0.0.1:09001` and `[::ffff:127.0.0.1]:9001` are all the backend
    /// `127.0.0.1:9001`, and a client that may reach it under the weaker policy gets past
    /// the stricter one. `addresses` gives what a backend of the list resolves to (what
    /// the backend pools connect to). The error names the lines of both lists.
    pub fn check_backend_addresses(
        &self,
        addresses: impl Fn(&str) -> Vec<SocketAddr>,
    ) -> Result<(), ConfigError> {
        let Some(policies) = &self.backend_policies else {
            return Ok(());
        };
        let shared = |ours: &[String], theirs: &[String]| {
            let theirs: Vec<(&String, SocketAddr)> = theirs
                .iter()
                .flat_map(|b| addresses(b).into_iter().map(move |address| (b, address)))
                .collect();
            ours.iter().find_map(|backend| {
                addresses(backend).into_iter().find_map(|address| {
                    theirs
                        .iter()
                        .find(|(_, other)| same_backend(*other) == same_backend(address))
                        .map(|(other, other_address)| {
                            format!("`{backend}` ({address}) is the same backend as `{other}` ({other_address}) of {{owner}}")
                        })
                })
            })
        };
        find_shared_backend(&policies.entries, shared).map_err(|(line, message)| ConfigError {
            file: policies.file.clone(),
            line,
            message,
        })
    }
}

/// Where a connection to `address` ends up, for comparing backends: an IPv4-mapped IPv6
/// address is its IPv4 address, and every loopback or unspecified address (`None`) is
/// this host, since a backend listening on `0.0.0.0` or `::` is reached through any of
/// them.
fn same_backend(address: SocketAddr) -> (Option<IpAddr>, u16) {
    let ip = address.ip().to_canonical();
    let host = (!(ip.is_loopback() || ip.is_unspecified())).then_some(ip);
    (host, address.port())
}

/// The first server name whose backends are also those of a list serving another
/// client-certificate policy: its line and the message. `shared(ours, theirs)` says which
/// backend of `ours` is one of `theirs`, as a sentence in which `{owner}` stands for the
/// other list's owner.
fn find_shared_backend(
    entries: &[PolicyBackends],
    shared: impl Fn(&[String], &[String]) -> Option<String>,
) -> Result<(), (Option<usize>, String)> {
    let Some((listener, names)) = entries.split_first() else {
        return Ok(());
    };
    let at = |line: Option<usize>| line.map_or(String::new(), |line| format!(" (line {line})"));
    for (index, entry) in names.iter().enumerate() {
        if entry.differs_from_listener {
            if let Some(sentence) = shared(&entry.backends, &listener.backends) {
                let sentence =
                    sentence.replace("{owner}", &format!("the listener{}", at(listener.line)));
                return Err((entry.line, format!("key `backends`: {sentence}, and this name's client-certificate policy differs from the listener's: a client sending another name, or none, would reach it under the listener's policy. Give this name backends of its own, or set the listener's proxy_protocol = \"v2\" so that the backend sees each connection's name and client certificate")));
            }
        }
        for earlier in &names[..index] {
            if earlier.policy == entry.policy {
                continue;
            }
            if let Some(sentence) = shared(&entry.backends, &earlier.backends) {
                let sentence =
                    sentence.replace("{owner}", &format!("{}{}", earlier.owner, at(earlier.line)));
                return Err((entry.line, format!("key `backends`: {sentence}, whose client-certificate policy differs: a client could reach it under the weaker one. Give each its own backends, or set the listener's proxy_protocol = \"v2\" so that the backend sees each connection's name and client certificate")));
            }
        }
    }
    Ok(())
}

/// A backend must not serve two client-certificate policies (a server name's and its
/// listener's, or two server names') unless PROXY v2 tells it each connection's name and
/// certificate: a client could reach it through the weaker one by sending that name (or
/// none, for the listener's), and the other in `Host`. Called without PROXY v2 only.
/// Compares the backends as written; state building compares the addresses they resolve
/// to again ([`ListenerConfig::check_backend_addresses`]), with the lists this returns.
fn check_backends_per_policy(
    map: &SourceMap<'_>,
    server_names: &[ServerNameConfig],
    (listener_backends, listener_auth): (&Spanned<Vec<String>>, ClientAuth),
    listener_policy: &ClientPolicy,
) -> Result<BackendPolicies, ConfigError> {
    let mut entries = vec![PolicyBackends {
        owner: "the listener".into(),
        line: map.line(listener_backends),
        backends: listener_backends.get_ref().clone(),
        policy: listener_policy.clone(),
        differs_from_listener: false,
    }];
    for block in server_names {
        let Some(backends) = &block.backends else {
            continue;
        };
        entries.push(PolicyBackends {
            owner: format!("[[listener.server_name]] {:?}", block.names.get_ref()),
            line: map.line(backends),
            backends: backends.get_ref().clone(),
            policy: block.client_policy(listener_policy),
            differs_from_listener: block.client_policy_differs(listener_auth),
        });
    }
    let same_spelling = |ours: &[String], theirs: &[String]| {
        ours.iter()
            .find(|backend| theirs.contains(backend))
            .map(|backend| format!("`{backend}` is also a backend of {{owner}}"))
    };
    find_shared_backend(&entries, same_spelling).map_err(|(line, message)| ConfigError {
        file: map.file().to_string(),
        line,
        message,
    })?;
    Ok(BackendPolicies {
        file: map.file().to_string(),
        entries,
    })
}

pub(super) fn check_backends(
    map: &SourceMap<'_>,
    backends: &Spanned<Vec<String>>,
) -> Result<(), ConfigError> {
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
