//! TLS setup: BoringSSL contexts built from a listener's configuration.
//!
//! Each certificate gets its own `SslContext` carrying the listener's settings, the
//! certificate chain and an asynchronous private-key method (no private key is given to
//! BoringSSL: every signature goes through the offload layer). A base context creates the
//! connections; its certificate-selection callback looks at the ClientHello (SNI and the
//! client's signature algorithms) and switches the connection to the right certificate's
//! context — ECDSA when the client can verify it, RSA otherwise. It then applies the
//! per-name settings, a fetched OCSP staple, and the verdict of the 0-RTT anti-replay
//! check; that check may ask Redis, so the callback is BoringSSL's asynchronous one (the
//! handshake waits, the worker does not).

pub mod compress;
pub mod crl;
pub mod early_data;
pub mod ech;
mod keymethod;
pub mod ocsp;
pub mod ocsp_fetch;
pub mod selfsigned;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use anyhow::Context as _;
use boring::ex_data::Index;
use boring::nid::Nid;
use boring::pkey::PKey;
use boring::ssl::{
    AlpnError, AsyncSelectCertError, BoxSelectCertFinish, ClientHello, ExtensionType, NameType,
    SelectCertError, Ssl, SslContext, SslContextBuilder, SslMethod, SslRef, SslVerifyMode,
    SslVersion,
};
use boring::x509::{X509Name, X509};

use crate::config::{
    CertCompression, ClientAuth, ListenerConfig, SessionConfig, TlsVersion, UnknownSni,
};
use crate::offload::{KeyKind, SigningKey};
use crate::session::replay::Verdict;
use crate::session::{EarlyDataCheck, Sessions};
use crl::ClientStore;
use keymethod::OffloadKeyMethod;

/// A certificate chain with its key, as loaded from PEM files or generated.
pub struct CertifiedKey {
    pub chain: Vec<X509>,
    pub key: Arc<SigningKey>,
    /// Lower-case SNI names, possibly "*.suffix".
    pub names: Vec<String>,
    pub default: bool,
    /// A DER OCSP response to staple, if configured.
    pub ocsp: Option<Vec<u8>>,
    /// Set with `ocsp_fetch`: the response fetched in the background, stapled per
    /// connection (`ocsp`, if any, is only its starting value).
    pub ocsp_fetch: Option<Arc<ocsp_fetch::Slot>>,
}

impl CertifiedKey {
    pub fn from_pem(
        cert_pem: &[u8],
        key_pem: &[u8],
        names: &[String],
        default: bool,
    ) -> anyhow::Result<CertifiedKey> {
        let chain = X509::stack_from_pem(cert_pem).context("cannot parse certificate PEM")?;
        let leaf = chain.first().context("no certificate in the PEM file")?;
        let pkey = PKey::private_key_from_pem(key_pem).context("cannot parse private key PEM")?;
        anyhow::ensure!(
            leaf.public_key()?.public_eq(&pkey),
            "the private key does not match the certificate"
        );
        let names = if names.is_empty() {
            certificate_names(leaf)
        } else {
            let covered = certificate_names(leaf);
            let names: Vec<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
            // Served anyway (the operator may know better), but clients will reject it.
            for name in names.iter().filter(|n| !name_covered(n, &covered)) {
                tracing::warn!(name = %name, certificate = ?covered, "configured name is not in the certificate: clients that check it will refuse the connection");
            }
            names
        };
        Ok(CertifiedKey {
            key: Arc::new(SigningKey::new(pkey)?),
            chain,
            names,
            default,
            ocsp: None,
            ocsp_fetch: None,
        })
    }

    /// The embedded default: an RSA-2048 and an ECDSA P-256 certificate for localhost.
    pub fn self_signed_pair() -> anyhow::Result<Vec<CertifiedKey>> {
        use selfsigned::SelfSignedKey::{EcdsaP256, Rsa2048};
        [Rsa2048, EcdsaP256]
            .into_iter()
            .map(|kind| {
                let (cert, pkey) = selfsigned::generate(kind)?;
                Ok(CertifiedKey {
                    names: certificate_names(&cert),
                    chain: vec![cert],
                    key: Arc::new(SigningKey::new(pkey)?),
                    default: true,
                    ocsp: None,
                    ocsp_fetch: None,
                })
            })
            .collect()
    }
}

/// Whether a certificate for `covered` names (possibly "*.suffix") is valid for `name`.
fn name_covered(name: &str, covered: &[String]) -> bool {
    covered.iter().any(|c| {
        c == name
            || c.strip_prefix("*.").is_some_and(|suffix| {
                name.split_once('.')
                    .is_some_and(|(label, parent)| parent == suffix && label != "*")
            })
    })
}

/// DNS names of the certificate's SAN, or its common name when it has none.
fn certificate_names(cert: &X509) -> Vec<String> {
    let mut names: Vec<String> = cert
        .subject_alt_names()
        .map(|sans| {
            sans.iter()
                .filter_map(|name| name.dnsname().map(|n| n.to_ascii_lowercase()))
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        if let Some(cn) = cert.subject_name().entries_by_nid(Nid::COMMONNAME).next() {
            if let Ok(cn) = cn.data().as_utf8() {
                names.push(cn.to_string().to_ascii_lowercase());
            }
        }
    }
    names
}

/// One certificate's context, ready to be switched to.
struct CertContext {
    ctx: SslContext,
    kind: KeyKind,
    fetched_ocsp: Option<Arc<ocsp_fetch::Slot>>,
    file_ocsp: Option<FileStaple>,
}

/// An OCSP response from a file that passed its checks at load: stapled per connection
/// until its nextUpdate (then no more, until a reload brings a fresh file).
struct FileStaple {
    der: Vec<u8>,
    expires: Option<std::time::SystemTime>,
}

/// SNI names mapped to values: exact names and "*.suffix" wildcards (one label deep).
struct NameTable<T> {
    exact: HashMap<String, T>,
    /// Keyed by the suffix after "*.".
    wildcard: HashMap<String, T>,
}

impl<T: Default> NameTable<T> {
    fn new() -> Self {
        NameTable {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
        }
    }

    fn entry(&mut self, name: &str) -> &mut T {
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        match name.strip_prefix("*.") {
            Some(suffix) => self.wildcard.entry(suffix.to_string()).or_default(),
            None => self.exact.entry(name).or_default(),
        }
    }

    /// The value for `sni`; a fully qualified name ("example.com.") is the same name.
    fn lookup(&self, sni: &str) -> Option<&T> {
        let sni = sni.strip_suffix('.').unwrap_or(sni).to_ascii_lowercase();
        self.exact.get(&sni).or_else(|| {
            let (_, parent) = sni.split_once('.')?;
            self.wildcard.get(parent)
        })
    }
}

/// Maps SNI names to certificate contexts.
struct CertSelector {
    certs: Vec<CertContext>,
    names: NameTable<Vec<usize>>,
    default: Vec<usize>,
    tls13_enabled: bool,
    unknown_sni: UnknownSni,
}

impl CertSelector {
    /// The certificates for `sni`; `None` when the name is unknown and refused.
    fn candidates(&self, sni: Option<&str>) -> Option<&[usize]> {
        let Some(sni) = sni else {
            return Some(&self.default);
        };
        match (self.names.lookup(sni), self.unknown_sni) {
            (Some(found), _) => Some(found),
            (None, UnknownSni::Default) => Some(&self.default),
            (None, UnknownSni::Refuse) => None,
        }
    }

    /// Picks ECDSA among the candidates when the client can verify it, else RSA.
    fn select(&self, hello: &ClientHello<'_>) -> Option<&CertContext> {
        let candidates = self.candidates(hello.servername(NameType::HOST_NAME))?;
        let ecdsa = candidates.iter().map(|&i| &self.certs[i]).find(|cert| {
            matches!(cert.kind, KeyKind::Ecdsa { curve } if client_accepts_ecdsa(hello, curve, self.tls13_enabled))
        });
        let rsa = candidates
            .iter()
            .map(|&i| &self.certs[i])
            .find(|cert| matches!(cert.kind, KeyKind::Rsa { .. }));
        Some(ecdsa.or(rsa).unwrap_or(&self.certs[candidates[0]]))
    }
}

/// TLS settings that depend on the SNI name (`[[listener.server_name]]`); profile 0 is
/// the listener's own. They are applied to each connection once its SNI is known.
struct Profile {
    alpn: Vec<Vec<u8>>,
    min_version: Option<SslVersion>,
    /// Client-certificate policy overriding the listener's (set on the connection).
    verify: Option<(SslVerifyMode, Option<ClientStore>)>,
    /// The session ID context of its connections: a digest of the names and the effective
    /// client-certificate policy (mode, CA and CRL files). BoringSSL resumes a session only
    /// under the context it was made in, and resumption skips client-certificate checks, so
    /// a session must not carry over to a name or a reload with a different policy.
    sid_ctx: [u8; 32],
}

/// See `Profile::sid_ctx`.
fn session_context(names: &[String], mode: SslVerifyMode, store: Option<&ClientStore>) -> [u8; 32] {
    let mut digest = boring::sha::Sha256::new();
    digest.update(b"tlsterm session context 1\0");
    for name in names {
        digest.update(name.to_ascii_lowercase().as_bytes());
        digest.update(b"\0");
    }
    digest.update(&mode.bits().to_be_bytes());
    digest.update(store.map_or(&[0u8; 32], |store| &store.digest));
    digest.finish()
}

pub struct Profiles {
    names: NameTable<usize>,
    list: Vec<Profile>,
    /// The listener's client-certificate store, loaded once for all its contexts.
    client_store: Option<ClientStore>,
}

impl Profiles {
    fn build(listener: &ListenerConfig) -> anyhow::Result<Profiles> {
        let wire = |alpn: &[String]| alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        let client_store = match (&listener.client_ca, listener.client_auth) {
            (Some(ca), ClientAuth::Optional | ClientAuth::Required) => Some(ClientStore::load(
                ca.get_ref(),
                listener.client_crl.as_ref(),
                listener.client_crl_check,
            )?),
            _ => None,
        };
        let listener_mode = verify_mode(listener.client_auth);
        let mut profiles = Profiles {
            names: NameTable::new(),
            list: vec![Profile {
                alpn: wire(&listener.alpn),
                min_version: None,
                verify: None,
                sid_ctx: session_context(&[], listener_mode, client_store.as_ref()),
            }],
            client_store,
        };
        for (index, server_name) in listener.server_names.iter().enumerate() {
            // A name with its own CA or CRL settings but no client_auth follows the listener's.
            let own_trust = server_name.client_ca.is_some()
                || server_name.client_crl.is_some()
                || server_name.client_crl_check.is_some();
            let auth = server_name
                .client_auth
                .or(own_trust.then_some(listener.client_auth));
            let verify = match auth {
                None => None,
                Some(ClientAuth::None) => Some((SslVerifyMode::NONE, None)),
                Some(auth) => {
                    let ca = server_name
                        .client_ca
                        .as_ref()
                        .or(listener.client_ca.as_ref());
                    let ca = ca.context("client_auth needs client_ca")?;
                    let crl = server_name
                        .client_crl
                        .as_ref()
                        .or(listener.client_crl.as_ref());
                    let check = server_name
                        .client_crl_check
                        .unwrap_or(listener.client_crl_check);
                    Some((
                        verify_mode(auth),
                        Some(ClientStore::load(ca.get_ref(), crl, check)?),
                    ))
                }
            };
            let sid_ctx = match &verify {
                Some((mode, store)) => {
                    session_context(server_name.names.get_ref(), *mode, store.as_ref())
                }
                None => session_context(
                    server_name.names.get_ref(),
                    listener_mode,
                    profiles.client_store.as_ref(),
                ),
            };
            profiles.list.push(Profile {
                alpn: wire(server_name.alpn.as_deref().unwrap_or(&listener.alpn)),
                min_version: server_name.min_version.map(ssl_version),
                verify,
                sid_ctx,
            });
            for name in server_name.names.get_ref() {
                *profiles.names.entry(name) = index + 1;
            }
        }
        Ok(profiles)
    }

    /// The profile of a connection with this SNI (0: the listener's).
    pub fn index(&self, sni: Option<&str>) -> usize {
        sni.and_then(|sni| self.names.lookup(sni))
            .copied()
            .unwrap_or(0)
    }

    fn for_ssl(&self, ssl: &SslRef) -> &Profile {
        &self.list[self.index(ssl.servername(NameType::HOST_NAME))]
    }
}

/// Reads a list of big-endian u16 values behind a length prefix of `prefix` bytes.
fn u16_list(data: &[u8], prefix: usize) -> impl Iterator<Item = u16> + '_ {
    data.get(prefix..)
        .unwrap_or_default()
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
}

/// Whether the client can verify an ECDSA signature made with a key on `curve`.
fn client_accepts_ecdsa(hello: &ClientHello<'_>, curve: Nid, tls13_enabled: bool) -> bool {
    const TLS13: u16 = 0x0304;
    // TLS 1.3 binds curve and hash: ecdsa_secp256r1_sha256 / ecdsa_secp384r1_sha384.
    let scheme = if curve == Nid::SECP384R1 {
        0x0503
    } else {
        0x0403
    };
    let Some(sigalgs) = hello.get_extension(ExtensionType::SIGNATURE_ALGORITHMS) else {
        return false;
    };
    if !u16_list(sigalgs, 2).any(|s| s == scheme) {
        return false;
    }
    let offers_tls13 = hello
        .get_extension(ExtensionType::SUPPORTED_VERSIONS)
        .is_some_and(|versions| u16_list(versions, 1).any(|v| v == TLS13));
    // In TLS 1.2 the cipher suite names the certificate type: ECDHE-ECDSA-*.
    const ECDHE_ECDSA_SUITES: [u16; 3] = [0xC02B, 0xC02C, 0xCCA9];
    let offers_ecdsa_suite = u16_list(hello.ciphers(), 0).any(|c| ECDHE_ECDSA_SUITES.contains(&c));
    (offers_tls13 && tls13_enabled) || offers_ecdsa_suite
}

fn ssl_version(version: TlsVersion) -> SslVersion {
    match version {
        TlsVersion::Tls12 => SslVersion::TLS1_2,
        TlsVersion::Tls13 => SslVersion::TLS1_3,
    }
}

/// Applies the listener's protocol settings; every context of a listener gets them, because
/// switching context on SNI also switches callbacks such as ALPN selection.
fn configure(
    builder: &mut SslContextBuilder,
    listener: &ListenerConfig,
    profiles: &Arc<Profiles>,
) -> anyhow::Result<()> {
    builder.set_min_proto_version(Some(ssl_version(listener.min_version)))?;
    builder.set_max_proto_version(Some(ssl_version(listener.max_version)))?;
    builder
        .set_strict_cipher_list(listener.ciphers.get_ref())
        .with_context(|| format!("invalid cipher list `{}`", listener.ciphers.get_ref()))?;
    let groups: Vec<&str> = listener
        .groups
        .get_ref()
        .iter()
        .filter_map(|g| crate::config::group_name(g))
        .collect();
    builder.set_curves_list(&groups.join(":"))?;
    Tls13Order::parse(listener.tls13_ciphers.get_ref())?.apply_to_context(builder)?;
    builder.set_session_id_context(b"tlsterm")?;
    if *listener.early_data.get_ref() {
        crate::sys::enable_early_data(builder);
    }
    if profiles.list.iter().any(|p| !p.alpn.is_empty()) {
        let profiles = profiles.clone();
        builder.set_alpn_select_callback(move |ssl, client| {
            select_alpn(&profiles.for_ssl(ssl).alpn, client).ok_or(AlpnError::NOACK)
        });
    }
    if let (Some(ca), Some(client)) = (&listener.client_ca, &profiles.client_store) {
        builder.set_verify_cert_store(client.store.clone())?;
        // The CA names sent in CertificateRequest, so clients pick the right certificate.
        builder.set_client_ca_list(X509Name::load_client_ca_file(ca.get_ref())?);
        builder.set_verify(verify_mode(listener.client_auth));
    }
    Ok(())
}

const CHACHA20_POLY1305_SHA256: u16 = 0x1303;

/// The TLS 1.3 suite order in BoringSSL's form: protocol IDs, and flags marking "equal
/// preference with the next" ("A|B" in the configuration: the client's order decides).
#[derive(Clone)]
struct Tls13Order {
    ids: Vec<u16>,
    flags: Vec<u32>,
}

impl Tls13Order {
    fn parse(entries: &[String]) -> anyhow::Result<Tls13Order> {
        let mut order = Tls13Order {
            ids: Vec::new(),
            flags: Vec::new(),
        };
        for entry in entries {
            let group: Vec<&str> = entry.split('|').map(str::trim).collect();
            for (position, name) in group.iter().enumerate() {
                let id = crate::config::tls13_cipher_id(name).context("unknown TLS 1.3 suite")?;
                order.ids.push(id);
                let equal_with_next = position + 1 < group.len();
                order.flags.push(if equal_with_next {
                    boring_sys::SSL_CIPHER_FLAG_EQUAL_PREFERENCE_WITH_NEXT as u32
                } else {
                    0
                });
            }
        }
        Ok(order)
    }

    /// The same order with ChaCha20 first, if it is configured at all.
    fn chacha_first(&self) -> Option<Tls13Order> {
        let at = self
            .ids
            .iter()
            .position(|&id| id == CHACHA20_POLY1305_SHA256)?;
        let mut order = self.clone();
        order.ids.remove(at);
        let ended_group = order.flags.remove(at) == 0;
        // If ChaCha20 closed its group, its predecessor now closes it.
        if ended_group && at > 0 {
            order.flags[at - 1] = 0;
        }
        order.ids.insert(0, CHACHA20_POLY1305_SHA256);
        order.flags.insert(0, 0);
        Some(order)
    }

    fn apply_to_context(&self, builder: &mut SslContextBuilder) -> anyhow::Result<()> {
        let ok = crate::sys::set_tls13_ciphers(builder, &self.ids, &self.flags);
        anyhow::ensure!(ok, "BoringSSL refused the TLS 1.3 suites");
        Ok(())
    }

    fn apply_to_connection(&self, ssl: &mut SslRef) -> bool {
        crate::sys::set_connection_tls13_ciphers(ssl, &self.ids, &self.flags)
    }
}

/// Whether the client's first TLS 1.3 suite is ChaCha20: clients without AES hardware
/// order it first, and for them it is the faster cipher.
fn client_prefers_chacha(hello: &ClientHello<'_>) -> bool {
    u16_list(hello.ciphers(), 0)
        .find(|id| (0x1301..=0x1305).contains(id))
        .is_some_and(|id| id == CHACHA20_POLY1305_SHA256)
}

/// The client's address on each connection (set by [`ServerTls::new_ssl`]).
static CLIENT_ADDRESS: LazyLock<Index<Ssl, IpAddr>> =
    LazyLock::new(|| Ssl::new_ex_index().expect("an SSL ex_data index"));

/// Set on connections whose ClientHello carried an ECH extension (decrypted or not).
static ECH_OFFERED: LazyLock<Index<Ssl, bool>> =
    LazyLock::new(|| Ssl::new_ex_index().expect("an SSL ex_data index"));

/// What became of a connection's Encrypted Client Hello, once its ClientHello is read:
/// "accepted" (decrypted: the inner ClientHello is used), "rejected" (offered but not
/// decrypted, GREASE from browsers included: the client gets the public name's
/// certificate and the retry configs), or "not_offered".
pub fn ech_outcome(ssl: &SslRef) -> &'static str {
    if ssl.ech_accepted() {
        "accepted"
    } else if ssl.ex_data(*ECH_OFFERED).is_some() {
        "rejected"
    } else {
        "not_offered"
    }
}

/// The anti-replay check for a ClientHello that offers 0-RTT with a PSK (without a PSK
/// there is no resumption, and BoringSSL refuses the early data itself).
fn early_data_check(hello: &ClientHello<'_>, sessions: &Sessions) -> Option<EarlyDataCheck> {
    hello.get_extension(ExtensionType::EARLY_DATA)?;
    let pre_shared_key = hello.get_extension(ExtensionType::PRE_SHARED_KEY)?;
    let client = hello.ssl().ex_data(*CLIENT_ADDRESS).copied();
    let client = client.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    Some(sessions.check_early_data(pre_shared_key, client))
}

/// Whether the verdict refuses 0-RTT: seen before (a replay), the memory or the client's
/// share of it full, Redis silent, or a process too young to know what its predecessor
/// saw. Counted here, as a replayed handshake may never complete.
fn early_data_refused(verdict: Verdict) -> bool {
    if verdict == Verdict::Fresh {
        return false;
    }
    tracing::debug!(result = verdict.label(), "0-RTT refused");
    crate::metrics::record_early_data(verdict.label());
    true
}

/// What became of the early data of a completed handshake: `None` if the client offered
/// none (or the listener allows none), else "accepted" or BoringSSL's reason for refusing
/// it (e.g. "ticket_age_skew", "alpn_mismatch"). Refusals for replay are counted earlier.
pub fn early_data_outcome(ssl: &SslRef) -> Option<&'static str> {
    use boring_sys::ssl_early_data_reason_t as Reason;
    let (reason, text) = crate::sys::early_data_reason(ssl);
    match reason {
        Reason::ssl_early_data_accepted => Some("accepted"),
        Reason::ssl_early_data_unknown
        | Reason::ssl_early_data_disabled
        | Reason::ssl_early_data_peer_declined
        | Reason::ssl_early_data_no_session_offered => None,
        _ => Some(text.unwrap_or("other")),
    }
}

/// Client certificates: verified against the CA bundle; "required" fails the handshake
/// without one.
fn verify_mode(auth: ClientAuth) -> SslVerifyMode {
    match auth {
        ClientAuth::None => SslVerifyMode::NONE,
        ClientAuth::Optional => SslVerifyMode::PEER,
        ClientAuth::Required => SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT,
    }
}

/// The first server-preferred protocol the client offers, as a slice of the client's list.
fn select_alpn<'a>(preferences: &[Vec<u8>], client: &'a [u8]) -> Option<&'a [u8]> {
    preferences.iter().find_map(|wanted| {
        let mut rest = client;
        while let Some((&len, tail)) = rest.split_first() {
            let (proto, next) = tail.split_at_checked(len as usize)?;
            if proto == wanted.as_slice() {
                return Some(proto);
            }
            rest = next;
        }
        None
    })
}

/// The file response to staple, if it checks out (logged and counted either way). The
/// issuer, when the chain has it next to the leaf, checks the response's signature.
fn file_staple(response: &[u8], chain: &[X509], names: &[String]) -> Option<FileStaple> {
    let leaf = &chain[0];
    let issuer = chain
        .get(1)
        .filter(|issuer| issuer.issued(leaf).is_ok())
        .map(|issuer| &**issuer);
    match ocsp::validity(response, leaf, issuer, std::time::SystemTime::now()) {
        Ok(validity) => {
            crate::metrics::record_ocsp("stapled");
            Some(FileStaple {
                der: response.to_vec(),
                expires: validity.next_update,
            })
        }
        Err(problem) => {
            tracing::warn!(certificate = ?names, problem = problem.label(), "OCSP response not stapled");
            crate::metrics::record_ocsp(problem.label());
            None
        }
    }
}

/// Everything TLS of one listener; shared by all workers, replaced whole on reload.
pub struct ServerTls {
    base: SslContext,
    profiles: Arc<Profiles>,
}

impl ServerTls {
    pub fn build(
        listener: &ListenerConfig,
        certs: Vec<CertifiedKey>,
        sessions: &Sessions,
        session_config: &SessionConfig,
    ) -> anyhow::Result<ServerTls> {
        anyhow::ensure!(!certs.is_empty(), "no certificate configured");
        let profiles = Arc::new(Profiles::build(listener)?);
        let mut selector = CertSelector {
            certs: Vec::new(),
            names: NameTable::new(),
            default: Vec::new(),
            tls13_enabled: listener.max_version >= TlsVersion::Tls13,
            unknown_sni: listener.unknown_sni,
        };
        let compression: Vec<CertCompression> = listener
            .cert_compression
            .get_ref()
            .iter()
            .filter_map(|name| CertCompression::parse(name))
            .collect();
        let ech_keys = match &listener.ech_keys {
            Some(files) => {
                let keys: Vec<ech::EchKey> = files
                    .get_ref()
                    .iter()
                    .map(|file| ech::EchKey::load(file))
                    .collect::<anyhow::Result<_>>()?;
                Some(ech::server_keys(&keys)?)
            }
            None => None,
        };
        let first_names = certs[0].names.clone();
        let any_default = certs.iter().any(|c| c.default);
        for (index, cert) in certs.into_iter().enumerate() {
            let mut builder = SslContextBuilder::new(SslMethod::tls())?;
            configure(&mut builder, listener, &profiles)?;
            let (leaf, intermediates) = cert.chain.split_first().expect("chain is not empty");
            builder.set_certificate(leaf)?;
            for intermediate in intermediates {
                builder.add_extra_chain_cert(intermediate.clone())?;
            }
            let file_ocsp = match (&cert.ocsp, &cert.ocsp_fetch) {
                (Some(response), None) => file_staple(response, &cert.chain, &cert.names),
                _ => None,
            };
            // On the certificate's context: each keeps its own compressed chain.
            compress::install(&mut builder, &compression)?;
            if let Some(keys) = &ech_keys {
                // Each context: the retry configs come from the one a connection ends on.
                builder.set_ech_keys(keys)?;
            }
            builder.set_async_private_key_method(OffloadKeyMethod {
                key: cert.key.clone(),
            });
            selector.certs.push(CertContext {
                ctx: builder.build(),
                kind: cert.key.kind(),
                fetched_ocsp: cert.ocsp_fetch.clone(),
                file_ocsp,
            });
            for name in &cert.names {
                selector.names.entry(name).push(index);
            }
            // Without an explicit default, the first certificate's names (all its key types) are it.
            if cert.default || (!any_default && cert.names == first_names) {
                selector.default.push(index);
            }
        }

        let mut base = SslContextBuilder::new(SslMethod::tls())?;
        configure(&mut base, listener, &profiles)?;
        sessions.install(&mut base, session_config)?;
        if let Some(keys) = &ech_keys {
            // ClientHellos are decrypted on the base context, before certificate selection.
            base.set_ech_keys(keys)?;
        }
        let replay_check = (*listener.early_data.get_ref()).then(|| sessions.clone());
        let selector = Arc::new(selector);
        let per_name = profiles.clone();
        let chacha_first = Tls13Order::parse(listener.tls13_ciphers.get_ref())?.chacha_first();
        let has_ech_keys = ech_keys.is_some();
        // Runs once the anti-replay verdict is known (at once unless Redis is asked).
        let select = move |hello: &mut ClientHello<'_>, early_data_refused: bool| {
            let chosen = selector.select(hello).ok_or(SelectCertError::ERROR)?;
            let prefers_chacha = client_prefers_chacha(hello);
            let wants_ocsp = hello.get_extension(ExtensionType::STATUS_REQUEST).is_some();
            let offers_ech = hello
                .get_extension(ExtensionType::ENCRYPTED_CLIENT_HELLO)
                .is_some();
            let ssl = hello.ssl_mut();
            if offers_ech {
                ssl.set_ex_data(*ECH_OFFERED, true);
            }
            if has_ech_keys {
                // Here, as a client whose ECH was refused may abort after the handshake.
                crate::metrics::record_ech(ech_outcome(ssl));
            }
            if let (true, Some(order)) = (prefers_chacha, &chacha_first) {
                if !order.apply_to_connection(ssl) {
                    return Err(SelectCertError::ERROR);
                }
            }
            ssl.set_ssl_context(&chosen.ctx)
                .map_err(|_| SelectCertError::ERROR)?;
            // After the switch, which gives the connection the context's certificate settings.
            if wants_ocsp {
                if let Some(slot) = &chosen.fetched_ocsp {
                    slot.staple(ssl);
                } else if let Some(file) = &chosen.file_ocsp {
                    ocsp::staple_until(ssl, &file.der, file.expires);
                }
            }
            if early_data_refused {
                // After the context switch, which resets the flag from the new context.
                crate::sys::disable_early_data(ssl);
            }
            // BoringSSL fixes the version range and the client-certificate request after
            // this callback, so per-name settings still apply here.
            let profile = per_name.for_ssl(ssl);
            let sid_set = crate::sys::set_connection_session_id_context(ssl, &profile.sid_ctx);
            if !sid_set {
                return Err(SelectCertError::ERROR);
            }
            if let Some(min) = profile.min_version {
                ssl.set_min_proto_version(Some(min))
                    .map_err(|_| SelectCertError::ERROR)?;
            }
            if let Some((mode, store)) = &profile.verify {
                ssl.set_verify(*mode);
                if let Some(client) = store {
                    ssl.set_verify_cert_store(client.store.clone())
                        .map_err(|_| SelectCertError::ERROR)?;
                }
            }
            Ok(())
        };
        let select = Arc::new(select);
        base.set_async_select_certificate_callback(move |hello| {
            let check = replay_check
                .as_ref()
                .and_then(|sessions| early_data_check(hello, sessions));
            let select = select.clone();
            Ok(Box::pin(async move {
                let refused = match check {
                    Some(check) => early_data_refused(check.verdict().await),
                    None => false,
                };
                let finish: BoxSelectCertFinish = Box::new(move |mut hello| {
                    select(&mut hello, refused).map_err(|_| AsyncSelectCertError)
                });
                Ok(finish)
            }))
        });
        Ok(ServerTls {
            base: base.build(),
            profiles,
        })
    }

    /// Which `[[listener.server_name]]` a connection with this SNI follows (0: none).
    pub fn profile_index(&self, sni: Option<&str>) -> usize {
        self.profiles.index(sni)
    }

    /// A connection object for a client at `client`.
    pub fn new_ssl(&self, client: IpAddr) -> anyhow::Result<Ssl> {
        let mut ssl = Ssl::new(&self.base)?;
        ssl.set_ex_data(*CLIENT_ADDRESS, client);
        Ok(ssl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpn_follows_server_preference() {
        let prefs = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let client = b"\x08http/1.1\x02h2";
        assert_eq!(select_alpn(&prefs, client), Some(&b"h2"[..]));
        assert_eq!(select_alpn(&prefs, b"\x03foo"), None);
        // A truncated list is not read past its end.
        assert_eq!(select_alpn(&prefs, b"\x09http/1.1"), None);
    }

    #[test]
    fn chacha_first_keeps_the_other_groups() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let flag = boring_sys::SSL_CIPHER_FLAG_EQUAL_PREFERENCE_WITH_NEXT as u32;
        let order = Tls13Order::parse(&names(&[
            "TLS_AES_128_GCM_SHA256|TLS_CHACHA20_POLY1305_SHA256",
            "TLS_AES_256_GCM_SHA384",
        ]))
        .unwrap();
        assert_eq!(order.ids, [0x1301, 0x1303, 0x1302]);
        assert_eq!(order.flags, [flag, 0, 0]);
        let chacha = order.chacha_first().unwrap();
        assert_eq!(chacha.ids, [0x1303, 0x1301, 0x1302]);
        assert_eq!(chacha.flags, [0, 0, 0]);
        let grouped = Tls13Order::parse(&names(&[
            "TLS_CHACHA20_POLY1305_SHA256|TLS_AES_128_GCM_SHA256|TLS_AES_256_GCM_SHA384",
        ]))
        .unwrap()
        .chacha_first()
        .unwrap();
        assert_eq!(grouped.flags, [0, flag, 0]);
        let without = Tls13Order::parse(&names(&["TLS_AES_128_GCM_SHA256"])).unwrap();
        assert!(without.chacha_first().is_none());
    }

    #[test]
    fn configured_names_are_checked_against_the_certificate() {
        let covered = ["a.test".to_string(), "*.w.test".to_string()];
        assert!(name_covered("a.test", &covered));
        assert!(name_covered("x.w.test", &covered));
        assert!(name_covered("*.w.test", &covered));
        assert!(!name_covered("w.test", &covered));
        assert!(!name_covered("y.x.w.test", &covered));
        assert!(!name_covered("b.test", &covered));
    }

    #[test]
    fn a_trailing_dot_names_the_same_host() {
        let mut table = NameTable::<usize>::new();
        *table.entry("Admin.Test") = 1;
        *table.entry("*.api.test.") = 2;
        assert_eq!(table.lookup("admin.test."), Some(&1));
        assert_eq!(table.lookup("ADMIN.TEST"), Some(&1));
        assert_eq!(table.lookup("x.api.test."), Some(&2));
        assert_eq!(table.lookup("x.api.test"), Some(&2));
        assert_eq!(table.lookup("admin.test.."), None);
        assert_eq!(table.lookup("."), None);
    }
}
