//! What a listener serves with, built from the configuration: its certificates (files,
//! the embedded pair, ACME), its TLS contexts and its backend pools. Built whole for
//! every listener, so that a broken reload changes nothing.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use zeroize::Zeroizing;

use super::metrics;
use crate::config::{normal_name, Config, ListenerConfig, BUILTIN_BACKEND};
use crate::proxy::pool::{BackendAddress, BackendPool};
use crate::session::Sessions;
use crate::tls::{CertifiedKey, ServerTls};

/// Everything a connection of one listener needs.
pub struct ListenerState {
    pub config: ListenerConfig,
    pub tls: ServerTls,
    /// The certificates read from files (or the embedded pair), kept so that an ACME
    /// certificate can be installed without reading them again.
    pub file_certificates: Vec<CertifiedKey>,
    /// Backend pools by `ServerTls::profile_index`: 0 is the listener's, then one per
    /// `[[listener.server_name]]` (sharing the listener's when it names no backends).
    pub pools: Vec<Arc<BackendPool>>,
    pub metrics: metrics::ListenerMetrics,
    /// HTTP/3, when the listener has `quic = true`.
    pub quic: Option<Arc<crate::quic::QuicService>>,
}

impl ListenerState {
    pub fn pool_for(&self, sni: Option<&str>) -> &Arc<BackendPool> {
        &self.pools[self.tls.profile_index(sni)]
    }

    /// The client-certificate policy a connection with this SNI is verified under, as
    /// PROXY v2 names it: the first name of the `[[listener.server_name]]` with a policy of
    /// its own, or "" for the listener's.
    pub fn client_policy(&self, sni: Option<&str>) -> String {
        let index = self.tls.profile_index(sni);
        let Some(block) = index.checked_sub(1).map(|i| &self.config.server_names[i]) else {
            return String::new();
        };
        match block.has_own_client_policy() {
            true => block
                .names
                .get_ref()
                .first()
                .map_or_else(String::new, |n| normal_name(n)),
            false => String::new(),
        }
    }
}

pub(super) fn load_certificates(listener: &ListenerConfig) -> anyhow::Result<Vec<CertifiedKey>> {
    if listener.certificates.is_empty() {
        tracing::info!(address = %listener.address(), "no certificate configured: using self-signed RSA-2048 and ECDSA P-256 certificates for localhost");
        return CertifiedKey::self_signed_pair();
    }
    listener
        .certificates
        .iter()
        .map(|c| {
            let read = |path: &PathBuf| {
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
            };
            // The key's PEM is wiped once parsed, at start and at every reload alike.
            let key_pem = Zeroizing::new(read(c.key.get_ref())?);
            let mut certified =
                CertifiedKey::from_pem(&read(c.cert.get_ref())?, &key_pem, &c.names, c.default)
                    .with_context(|| format!("certificate {}", c.cert.get_ref().display()))?;
            certified.ocsp = c
                .ocsp
                .as_ref()
                .map(|path| read(path.get_ref()))
                .transpose()?;
            if c.ocsp_fetch {
                let slot = crate::tls::ocsp_fetch::register(
                    &certified.chain,
                    certified.ocsp.as_deref(),
                    &certified.names,
                )
                .with_context(|| {
                    format!(
                        "certificate {}: key `ocsp_fetch`",
                        c.cert.get_ref().display()
                    )
                })?;
                certified.ocsp_fetch = Some(slot);
            }
            Ok(certified)
        })
        .collect()
}

/// The pool's addresses: every address a backend's name resolves to, in resolution order.
/// A name such as `localhost` often resolves to `::1` before `127.0.0.1`, and a backend
/// may listen on only one of them: the pool tries the others when one refuses.
pub(super) fn resolve_backends(
    backends: &[String],
    builtin: Option<SocketAddr>,
) -> anyhow::Result<Vec<BackendAddress>> {
    resolve_backends_with(backends, builtin, |backend| {
        Ok(backend.to_socket_addrs()?.collect())
    })
}

fn resolve_backends_with(
    backends: &[String],
    builtin: Option<SocketAddr>,
    resolve: impl Fn(&str) -> std::io::Result<Vec<SocketAddr>>,
) -> anyhow::Result<Vec<BackendAddress>> {
    let mut addresses = Vec::new();
    for backend in backends {
        if backend == BUILTIN_BACKEND {
            addresses.push(builtin.context("built-in backend not running")?.into());
            continue;
        }
        // A unix-domain socket is looked for at each connection, as a TCP backend is
        // connected to: it may appear after tlsterm starts.
        if let Some(path) = backend.strip_prefix(BackendAddress::UNIX_PREFIX) {
            anyhow::ensure!(
                path.starts_with('/'),
                "backend {backend}: a unix-domain socket is named by its absolute path (unix:/run/backend.sock)"
            );
            addresses.push(BackendAddress::Unix(path.into()));
            continue;
        }
        let mut resolved =
            resolve(backend).with_context(|| format!("cannot resolve backend {backend}"))?;
        anyhow::ensure!(
            !resolved.is_empty(),
            "backend {backend} resolves to no address"
        );
        // Once each: a hosts file may list an address twice, and the pool would then try
        // a refusing address twice.
        let mut seen = std::collections::HashSet::new();
        resolved.retain(|address| seen.insert(*address));
        addresses.extend(resolved.into_iter().map(BackendAddress::from));
    }
    Ok(addresses)
}

/// The certificates ACME provides for a listener (none in a build without ACME).
pub(super) type AcmeCertificates<'a> = Option<&'a crate::acme::Acme>;

pub(super) fn acme_certificates(
    acme: AcmeCertificates<'_>,
    listener: &ListenerConfig,
) -> Vec<CertifiedKey> {
    acme.map_or_else(Vec::new, |acme| {
        acme.certificates(&listener.acme_certificates)
    })
}

/// A listener's TLS from its file certificates and the ACME ones it has now.
pub(super) fn build_tls(
    listener: &ListenerConfig,
    file_certificates: &[CertifiedKey],
    acme: AcmeCertificates<'_>,
    sessions: &Sessions,
    session_config: &crate::config::SessionConfig,
) -> anyhow::Result<ServerTls> {
    let mut certs = file_certificates.to_vec();
    certs.extend(acme_certificates(acme, listener));
    ServerTls::build(listener, certs, sessions, session_config)
        .with_context(|| format!("listener {}", listener.address()))
}

/// Publishes the expiry of every certificate the listeners serve. Only for states in
/// service: at start, after a reload that succeeded, after an ACME install.
pub(super) fn publish_expiry(states: &[Arc<ListenerState>], acme: AcmeCertificates<'_>) {
    let acme: Vec<CertifiedKey> = states
        .iter()
        .flat_map(|s| acme_certificates(acme, &s.config))
        .collect();
    crate::tls::expiry::publish(
        states
            .iter()
            .flat_map(|s| &s.file_certificates)
            .chain(&acme),
    );
}

/// Builds every listener's state; fails as a whole so a broken reload changes nothing.
/// Publishes nothing: a reload can still be refused after this (a new listener's port
/// taken, say), and then the certificate-expiry gauge must go on describing the
/// certificates that serve. The caller publishes once the states are in service.
pub fn build_states(
    config: &Config,
    builtin: Option<SocketAddr>,
    sessions: &Sessions,
    acme: AcmeCertificates<'_>,
) -> anyhow::Result<Vec<Arc<ListenerState>>> {
    config
        .listeners
        .iter()
        .map(|listener| {
            let file_certificates = load_certificates(listener)?;
            let tls = build_tls(
                listener,
                &file_certificates,
                acme,
                sessions,
                &config.session,
            )?;
            // Each backend resolved once: the pools connect to these addresses, and the
            // check that no backend serves two client-certificate policies compares them.
            let mut resolved: HashMap<&str, Vec<BackendAddress>> = HashMap::new();
            let per_name = listener
                .server_names
                .iter()
                .filter_map(|n| n.backends.as_ref());
            for backend in std::iter::once(&listener.backends)
                .chain(per_name)
                .flat_map(|backends| backends.get_ref())
            {
                if !resolved.contains_key(backend.as_str()) {
                    let addresses = resolve_backends(std::slice::from_ref(backend), builtin)?;
                    resolved.insert(backend, addresses);
                }
            }
            // Unix-domain sockets take no part in the address comparison: their paths
            // are compared as written by the configuration's own check.
            let tcp = |backend: &str| -> Vec<SocketAddr> {
                resolved[backend]
                    .iter()
                    .filter_map(|address| match address {
                        BackendAddress::Tcp(address) => Some(*address),
                        BackendAddress::Unix(_) => None,
                    })
                    .collect()
            };
            listener
                .check_backend_addresses(tcp)
                .with_context(|| format!("listener {}", listener.address()))?;
            let pool = |backends: &[String]| -> anyhow::Result<Arc<BackendPool>> {
                Ok(Arc::new(
                    BackendPool::new(
                        backends
                            .iter()
                            .flat_map(|backend| resolved[backend.as_str()].iter().cloned())
                            .collect(),
                        listener.connect_timeout,
                        listener.backend_retry,
                    )
                    .with_keepalive(listener.backend_keepalive)
                    .with_max_connections(listener.backend_max_connections.map(|n| n.get())),
                ))
            };
            let listener_pool = pool(listener.backends.get_ref())?;
            let mut pools = vec![listener_pool.clone()];
            for server_name in &listener.server_names {
                pools.push(match &server_name.backends {
                    Some(backends) => pool(backends.get_ref())?,
                    None => listener_pool.clone(),
                });
            }
            let quic = build_quic(listener, &file_certificates, acme, sessions, config, &pools)?;
            Ok(Arc::new(ListenerState {
                quic,
                config: listener.clone(),
                tls,
                file_certificates,
                pools,
                metrics: metrics::ListenerMetrics::new(listener.address()),
            }))
        })
        .collect::<anyhow::Result<Vec<_>>>()
}

/// A listener's QUIC service, with the same certificates and backends as its TCP side.
fn build_quic(
    listener: &ListenerConfig,
    file_certificates: &[CertifiedKey],
    acme: AcmeCertificates<'_>,
    sessions: &Sessions,
    config: &Config,
    pools: &[Arc<BackendPool>],
) -> anyhow::Result<Option<Arc<crate::quic::QuicService>>> {
    if listener.quic_address().is_none() {
        return Ok(None);
    }
    let mut certs = file_certificates.to_vec();
    certs.extend(acme_certificates(acme, listener));
    let service = crate::quic::QuicService::build(
        listener,
        certs,
        sessions,
        &config.session,
        pools.to_vec(),
        config.log.requests,
    )
    .with_context(|| format!("listener {}: QUIC", listener.address()))?;
    Ok(Some(Arc::new(service)))
}

pub(super) fn uses_builtin(config: &Config) -> bool {
    config
        .listeners
        .iter()
        .flat_map(|l| {
            let per_name = l.server_names.iter().filter_map(|n| n.backends.as_ref());
            std::iter::once(&l.backends).chain(per_name)
        })
        .any(|backends| backends.get_ref().iter().any(|b| b == BUILTIN_BACKEND))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name that resolves to an address nothing listens on before the backend's own
    /// (as `localhost` gives `::1` before `127.0.0.1` on many systems): every connection
    /// reaches the backend, over real sockets. The resolver is the test's, so that this
    /// holds on a machine whose `localhost` has one address.
    #[tokio::test]
    async fn a_name_with_several_addresses_puts_them_all_in_the_pool() {
        let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        // Bound but not listening: connections to it are refused.
        let refusing = tokio::net::TcpSocket::new_v4().unwrap();
        refusing.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let (refused, listening) = (
            refusing.local_addr().unwrap(),
            backend.local_addr().unwrap(),
        );
        let several = ["several.test:80".to_string()];
        let resolve = |name: &str| {
            assert_eq!(name, "several.test:80");
            Ok(vec![refused, listening, refused])
        };
        let pool = BackendPool::new(
            resolve_backends_with(&several, None, resolve).unwrap(),
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(60),
        );
        for _ in 0..3 {
            let (_stream, address) = pool.connect().await.expect("the backend is reachable");
            assert_eq!(*address, listening);
            backend.accept().await.unwrap();
        }

        // In resolution order, once each, beside the other backends.
        let builtin: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let names = [several[0].clone(), "builtin".to_string()];
        let addresses = resolve_backends_with(&names, Some(builtin), resolve).unwrap();
        assert_eq!(addresses, [refused, listening, builtin]);

        let none = resolve_backends_with(&names, None, |_| Ok(Vec::new())).unwrap_err();
        assert_eq!(
            none.to_string(),
            "backend several.test:80 resolves to no address"
        );
    }

    /// `unix:/path` names a unix-domain socket, resolved by nobody; a relative path is
    /// refused (tlsterm's working directory is no place to look for a backend).
    #[test]
    fn unix_socket_backends_by_absolute_path() {
        let names = [
            "unix:/run/backend.sock".to_string(),
            "127.0.0.1:80".to_string(),
        ];
        let addresses = resolve_backends_with(&names, None, |name| {
            assert_eq!(name, "127.0.0.1:80", "only the TCP backend is resolved");
            Ok(vec!["127.0.0.1:80".parse().unwrap()])
        })
        .unwrap();
        assert_eq!(
            addresses,
            [
                BackendAddress::Unix("/run/backend.sock".into()),
                BackendAddress::Tcp("127.0.0.1:80".parse().unwrap()),
            ]
        );
        assert_eq!(addresses[0].to_string(), "unix:/run/backend.sock");
        let relative = ["unix:backend.sock".to_string()];
        let refused = resolve_backends_with(&relative, None, |_| unreachable!()).unwrap_err();
        assert!(refused.to_string().contains("absolute path"), "{refused}");
    }
}
