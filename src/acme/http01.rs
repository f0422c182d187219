//! The plain-HTTP listener of `[acme] http_address`: answers HTTP-01 challenges
//! (`/.well-known/acme-challenge/<token>`) and redirects every other request to https.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{header, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::fleet::Fleet;
use crate::tls::acme_challenge;

const CHALLENGE_PATH: &str = "/.well-known/acme-challenge/";
/// Connections served at once; more wait in the kernel's accept queue.
const MAX_CONNECTIONS: usize = 256;
/// Connections one client address (an IPv4 address, an IPv6 /64) may hold at once; more
/// are closed when accepted. The CA fetches a token with one or two, and without this one
/// address could hold every slot and keep the CA's fetch waiting in the accept queue.
const MAX_PER_ADDRESS: usize = 8;
/// A request's headers must arrive within this, idle keep-alive included: the CA sends
/// its short request at once, and a connection that sends nothing gives its slot back.
const HEADER_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest one connection may hold a slot, whatever it does: a client that sends
/// requests and never reads the answers would otherwise keep it for good.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Open connections by client network (see [`MAX_PER_ADDRESS`]).
static PER_ADDRESS: LazyLock<std::sync::Mutex<HashMap<IpAddr, usize>>> =
    LazyLock::new(Default::default);

/// The network a client address counts for: IPv4 as it is (an IPv4-mapped IPv6 address
/// too), IPv6 by its /64, which one host usually holds whole.
fn client_network(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => {
            let mut octets = v6.octets();
            octets[8..].fill(0);
            IpAddr::V6(octets.into())
        }
        v4 => v4,
    }
}

/// One open connection of a client network, counted until dropped.
struct AddressSlot(IpAddr);

impl AddressSlot {
    fn take(client: IpAddr) -> Option<AddressSlot> {
        let network = client_network(client);
        let mut open = PER_ADDRESS.lock().expect("per-address connections");
        let count = open.entry(network).or_default();
        if *count >= MAX_PER_ADDRESS {
            return None;
        }
        *count += 1;
        Some(AddressSlot(network))
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = PER_ADDRESS.lock().expect("per-address connections");
        if let Some(count) = open.get_mut(&self.0) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.0);
            }
        }
    }
}

/// Pending challenges: token → (name, key authorization).
static PENDING: LazyLock<RwLock<HashMap<String, (String, String)>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

pub fn set(name: &str, token: String, key_authorization: String) {
    PENDING
        .write()
        .expect("challenge table")
        .insert(token, (name.to_ascii_lowercase(), key_authorization));
}

/// The fleet whose members' answers this listener serves too (HTTP-01 with Redis).
static FLEET: LazyLock<RwLock<Option<Arc<Fleet>>>> = LazyLock::new(RwLock::default);

/// Answers the challenges other members of `fleet` publish as well (none: only this
/// process's own).
pub fn set_fleet(fleet: Option<Arc<Fleet>>) {
    *FLEET.write().expect("fleet") = fleet;
}

/// The challenge with `token` is over. By token, not by name: another order's challenge
/// for the same name (another key type) has a token of its own and stays answered.
pub fn clear(token: &str) {
    PENDING.write().expect("challenge table").remove(token);
}

/// The key authorization for `token` if its challenge is `host`'s: this process's own, else
/// one another member of the fleet published (a load balancer in front of the fleet sends
/// the CA's request to any of them).
async fn answer(token: &str, host: &str) -> Option<String> {
    let own = PENDING
        .read()
        .expect("challenge table")
        .get(token)
        .filter(|(name, _)| name.eq_ignore_ascii_case(host))
        .map(|(_, key_authorization)| key_authorization.clone());
    if own.is_some() {
        return own;
    }
    let fleet = FLEET.read().expect("fleet").clone()?;
    // Any client may send this request: Redis is asked only for a token of the ACME form
    // (base64url) and a name the fleet orders.
    let well_formed = !token.is_empty()
        && token.len() <= 128
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !well_formed || !acme_challenge::is_ordered(host) {
        return None;
    }
    let (name, key_authorization) = fleet.http01(token).await.ok().flatten()?;
    name.eq_ignore_ascii_case(host).then_some(key_authorization)
}

async fn respond(request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name))
        .unwrap_or("");
    if let Some(token) = path.strip_prefix(CHALLENGE_PATH) {
        return match answer(token, host).await {
            Some(key_authorization) => Response::builder()
                .header(header::CONTENT_TYPE, "application/octet-stream")
                .body(Full::new(Bytes::from(key_authorization))),
            None => Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Full::new(Bytes::from_static(b"no such challenge\n"))),
        }
        .expect("response");
    }
    let valid_host = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    if !valid_host {
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Full::new(Bytes::from_static(b"missing or invalid Host\n")))
            .expect("response");
    }
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
    Response::builder()
        .status(StatusCode::MOVED_PERMANENTLY)
        .header(header::LOCATION, format!("https://{host}{target}"))
        .body(Full::new(Bytes::new()))
        .expect("response")
}

/// Binds `address` (an error now, not later) and serves it on the current runtime.
pub fn start(address: SocketAddr) -> anyhow::Result<()> {
    let listener = std::net::TcpListener::bind(address)
        .with_context(|| format!("acme.http_address: cannot bind {address}"))?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    tracing::info!(%address, "plain-HTTP listener: ACME challenges, redirects to https");
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let (stream, client) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(address_slot) = AddressSlot::take(client.ip()) else {
                super::metrics::http_refused("per_address");
                continue;
            };
            tokio::spawn(async move {
                let _address_slot = address_slot;
                let service = hyper::service::service_fn(|request| async move {
                    Ok::<_, Infallible>(respond(&request).await)
                });
                let serving = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                let _ = tokio::time::timeout(CONNECTION_TIMEOUT, serving).await;
                drop(permit);
            });
        }
    });
    Ok(())
}
