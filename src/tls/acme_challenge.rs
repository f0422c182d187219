//! TLS-ALPN-01 (RFC 8737): the answer to an ACME CA's validation connection.
//!
//! While an order for a name is pending, the CA connects to the listener that serves the
//! name with SNI = the name and ALPN = `acme-tls/1` only. Such a ClientHello gets a
//! self-signed certificate for the name carrying the critical acmeIdentifier extension
//! (the SHA-256 of the key authorization); the connection is closed after the handshake.
//! A ClientHello without `acme-tls/1` never sees a challenge certificate, and one with
//! `acme-tls/1` for a name without a pending challenge is refused.
//!
//! In a fleet the CA's connection may reach a process other than the one that ordered:
//! a name without a local answer is then looked up through the fleet (`set_fleet_lookup`)
//! while the handshake waits, for the names this process orders certificates for only
//! (`set_ordered_names`): any client may send such a ClientHello, with any name.
//!
//! Any client can send such a ClientHello, as often as it likes: the lookups of one name
//! are shared (a ClientHello waits for the next lookup that starts after it arrived, and
//! a name is looked up at most once per [`LOOKUP_INTERVAL`]), and at most
//! [`MAX_WAITING`] ClientHellos wait for lookups at once; beyond that they are refused.
//! No answer is remembered as missing: a ClientHello always gets the result of a lookup
//! made after it arrived, so an answer another member just published is never hidden.
//!
//! A validation connection carries only the name, so one name has one answer at a time:
//! the orders of this process that share a name take turns (the ACME side sees to it),
//! and an order's `clear` removes its own answer only, never a later order's.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

use boring::ssl::{
    AlpnError, ClientHello, ExtensionType, SslContext, SslContextBuilder, SslMethod, SslOptions,
    SslVersion,
};
use boring::x509::extension::SubjectAlternativeName;
use boring::x509::X509Extension;

use super::selfsigned::{self, SelfSignedKey};
use crate::config::normal_name;

/// The ALPN protocol of validation connections.
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// id-pe-acmeIdentifier.
const ACME_IDENTIFIER_OID: &str = "1.3.6.1.5.5.7.1.31";

/// Pending challenges by lower-case name.
static PENDING: LazyLock<RwLock<HashMap<String, Answer>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// The context that answers a name's validation connections.
struct Answer {
    context: SslContext,
    /// Until when: answers learnt from the fleet are forgotten by themselves.
    until: Option<Instant>,
    /// Who set it: `clear` removes an answer only for the order that set it.
    id: AnswerId,
}

/// Names an answer set by `set`, for its `clear`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnswerId(u64);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> AnswerId {
    AnswerId(NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

/// The names this process orders certificates for (lower case): the only ones looked up
/// through the fleet.
static ORDERED: LazyLock<RwLock<HashSet<String>>> = LazyLock::new(RwLock::default);

/// How long an answer learnt from the fleet is kept.
const FLEET_ANSWER_TTL: Duration = Duration::from_secs(120);

/// The least time between two fleet lookups of one name: what one name can cost Redis.
pub const LOOKUP_INTERVAL: Duration = Duration::from_millis(250);

/// ClientHellos waiting for fleet lookups at once, all names together; more are refused.
/// The lookups themselves are bounded by the sharing (one at a time per name, and only
/// for names this process orders): this bounds what the waiting handshakes hold, high
/// enough that a flood of them does not easily crowd out the CA's own.
pub const MAX_WAITING: usize = 1024;

/// One name's lookups: when the last one started. Held while a lookup runs, so that the
/// ClientHellos arriving meanwhile share the next one.
type NameLookups = Arc<tokio::sync::Mutex<Option<Instant>>>;

static LOOKUPS: LazyLock<std::sync::Mutex<HashMap<String, NameLookups>>> =
    LazyLock::new(Default::default);

static WAITING: AtomicUsize = AtomicUsize::new(0);

/// What became of validation ClientHellos that asked the fleet.
static LOOKUP_RESULTS: LazyLock<prometheus::IntCounterVec> = LazyLock::new(|| {
    let counter = crate::metrics::counter_vec(
        "acme_fleet_challenge_lookups_total",
        "TLS-ALPN-01 ClientHellos for a name without an answer here, by what the fleet lookup gave: answered, none, or refused (too many waiting for lookups)",
        &["result"],
    );
    for result in ["answered", "none", "refused"] {
        counter.with_label_values(&[result]);
    }
    counter
});

/// A place among the ClientHellos waiting for a lookup, given back when dropped.
struct Waiting;

impl Waiting {
    fn take() -> Option<Waiting> {
        if WAITING.fetch_add(1, Ordering::Relaxed) >= MAX_WAITING {
            WAITING.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Waiting)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Finds the digest another process of the fleet answers with for a name.
pub type FleetLookup =
    Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = Option<[u8; 32]>> + Send>> + Send + Sync>;

static FLEET: RwLock<Option<FleetLookup>> = RwLock::new(None);

/// Lets validation connections for names this process has no answer for be answered with
/// the fleet's (`None`: no fleet).
pub fn set_fleet_lookup(lookup: Option<FleetLookup>) {
    *FLEET.write().expect("fleet lookup") = lookup;
}

/// The names this process orders certificates for: a validation connection for another
/// name is refused without asking the fleet.
pub fn set_ordered_names<'a>(names: impl IntoIterator<Item = &'a str>) {
    let names = names.into_iter().map(normal_name).collect();
    *ORDERED.write().expect("ordered names") = names;
}

/// Whether this process orders certificates for `name` (so the fleet may hold an answer
/// for it).
pub fn is_ordered(name: &str) -> bool {
    ORDERED
        .read()
        .expect("ordered names")
        .contains(&normal_name(name))
}

/// Answers validation connections for `name` with the digest of the key authorization,
/// in place of any answer before; the id removes it (`clear`).
pub fn set(name: &str, key_authorization_sha256: &[u8; 32]) -> anyhow::Result<AnswerId> {
    let answer = Answer {
        context: challenge_context(name, key_authorization_sha256)?,
        until: None,
        id: next_id(),
    };
    let id = answer.id;
    PENDING
        .write()
        .expect("challenge table")
        .insert(name.to_ascii_lowercase(), answer);
    Ok(id)
}

/// Keeps an answer learnt from the fleet for a while, unless this process has an answer
/// of its own for the name by now (set while the fleet was asked): that one stays.
fn learn(name: &str, digest: &[u8; 32]) -> anyhow::Result<()> {
    let answer = Answer {
        context: challenge_context(name, digest)?,
        until: Some(Instant::now() + FLEET_ANSWER_TTL),
        id: next_id(),
    };
    let mut pending = PENDING.write().expect("challenge table");
    let own = pending
        .get(name)
        .is_some_and(|answer| answer.until.is_none());
    if !own {
        pending.insert(name.to_string(), answer);
    }
    Ok(())
}

/// For a validation ClientHello whose name has no answer here: a lookup through the
/// fleet that installs the answer it finds (the handshake resumes after it).
pub fn fleet_answer(hello: &ClientHello<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
    if !offered(hello) {
        return None;
    }
    let lookup = FLEET.read().expect("fleet lookup").clone()?;
    let name = normal_name(hello.servername(boring::ssl::NameType::HOST_NAME)?);
    // A name this process does not order for has no answer anywhere in the fleet (its
    // members share the configuration): refused at once, without a Redis request.
    if !is_ordered(&name) {
        return None;
    }
    if context_for(Some(&name)).is_some() {
        return None;
    }
    let Some(waiting) = Waiting::take() else {
        LOOKUP_RESULTS.with_label_values(&["refused"]).inc();
        return None;
    };
    let arrived = Instant::now();
    let lookups = LOOKUPS
        .lock()
        .expect("fleet lookups")
        .entry(name.clone())
        .or_default()
        .clone();
    Some(async move {
        let _waiting = waiting;
        let mut last = lookups.lock().await;
        // A lookup that started after this ClientHello arrived has answered it already, and
        // an answer learnt meanwhile needs none.
        let answered = last.is_some_and(|started| started >= arrived);
        if !answered && context_for(Some(&name)).is_none() {
            if let Some(started) = *last {
                tokio::time::sleep_until((started + LOOKUP_INTERVAL).into()).await;
            }
            *last = Some(Instant::now());
            if let Some(digest) = lookup(name.clone()).await {
                if let Err(err) = learn(&name, &digest) {
                    tracing::warn!(name, error = %err, "cannot build the challenge certificate");
                }
            }
        }
        drop(last);
        let result = match context_for(Some(&name)) {
            Some(_) => "answered",
            None => "none",
        };
        LOOKUP_RESULTS.with_label_values(&[result]).inc();
    })
}

/// The challenge for `name` that `set` answered with `id` is over (validated or failed).
/// A later answer for the name (another order's) stays.
pub fn clear(name: &str, id: AnswerId) {
    let mut pending = PENDING.write().expect("challenge table");
    let name = name.to_ascii_lowercase();
    if pending.get(&name).is_some_and(|answer| answer.id == id) {
        pending.remove(&name);
    }
}

/// Whether the ClientHello is a validation connection: its ALPN offers `acme-tls/1` and
/// nothing else, as RFC 8737 has the CA do (a client that lists it among others is served
/// normally).
pub fn offered(hello: &ClientHello<'_>) -> bool {
    hello
        .get_extension(ExtensionType::APPLICATION_LAYER_PROTOCOL_NEGOTIATION)
        .is_some_and(only_acme_tls)
}

/// `extension`: the ALPN extension's body (u16 length, then u8-length-prefixed names).
/// A list of that one name is its length byte and the name, with nothing after: compared
/// as such, with no copy (every ClientHello that offers ALPN comes here, as all browsers'
/// do).
fn only_acme_tls(extension: &[u8]) -> bool {
    let list = extension.get(2..).unwrap_or_default();
    list.split_first() == Some((&(ACME_TLS_ALPN.len() as u8), ACME_TLS_ALPN))
}

/// The context answering the pending challenge for `sni`, if any.
pub fn context_for(sni: Option<&str>) -> Option<SslContext> {
    let sni = normal_name(sni?);
    let pending = PENDING.read().expect("challenge table");
    let answer = pending.get(&sni)?;
    answer
        .until
        .is_none_or(|until| Instant::now() < until)
        .then(|| answer.context.clone())
}

fn challenge_context(name: &str, digest: &[u8; 32]) -> anyhow::Result<SslContext> {
    // A throwaway key: the certificate proves control of the listener, not of a key.
    let key = selfsigned::new_key(SelfSignedKey::EcdsaP256)?;
    let subject = selfsigned::subject_for(name)?;
    let cert = selfsigned::sign_self(&key, &subject, 7, |builder| {
        let san = SubjectAlternativeName::new()
            .dns(name)
            .build(&builder.x509v3_context(None, None))?;
        builder.append_extension(&san)?;
        // The extension's value is an OCTET STRING holding the 32-byte digest.
        let hex: Vec<String> = digest.iter().map(|b| format!("{b:02X}")).collect();
        let value = format!("critical,DER:04:20:{}", hex.join(":"));
        let identifier = X509Extension::new(None, None, ACME_IDENTIFIER_OID, &value)?;
        builder.append_extension(&identifier)?;
        Ok(())
    })?;

    let mut ctx = SslContextBuilder::new(SslMethod::tls())?;
    ctx.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    ctx.set_options(SslOptions::NO_TICKET);
    ctx.set_certificate(&cert)?;
    ctx.set_private_key(&key)?;
    ctx.set_alpn_select_callback(|_, client| {
        let mut rest = client;
        while let Some((&len, tail)) = rest.split_first() {
            let protocol = tail.get(..len as usize).ok_or(AlpnError::ALERT_FATAL)?;
            if protocol == ACME_TLS_ALPN {
                return Ok(protocol);
            }
            rest = &tail[len as usize..];
        }
        Err(AlpnError::ALERT_FATAL)
    });
    Ok(ctx.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_hello_offering_just_acme_tls_is_a_validation() {
        let list = |protocols: &[&[u8]]| {
            let mut body = Vec::new();
            for p in protocols {
                body.push(p.len() as u8);
                body.extend_from_slice(p);
            }
            [&(body.len() as u16).to_be_bytes()[..], &body].concat()
        };
        assert!(only_acme_tls(&list(&[ACME_TLS_ALPN])));
        assert!(!only_acme_tls(&list(&[b"h2", ACME_TLS_ALPN])));
        assert!(!only_acme_tls(&list(&[ACME_TLS_ALPN, b"h2"])));
        assert!(!only_acme_tls(
            &[&list(&[ACME_TLS_ALPN])[..], &[0]].concat()
        ));
        assert!(!only_acme_tls(&list(&[b"http/1.1"])));
        assert!(!only_acme_tls(&list(&[])));
        assert!(!only_acme_tls(&[0, 5, 10, b'a']), "truncated");
    }

    #[test]
    fn challenge_certificate_carries_the_digest() {
        let digest = [0xA5u8; 32];
        let id = set("chal.example", &digest).unwrap();
        let ctx = context_for(Some("CHAL.example.")).expect("pending");
        let cert = ctx.certificate().expect("certificate");
        let der = cert.to_der().unwrap();
        // OID 1.3.6.1.5.5.7.1.31, critical, OCTET STRING { OCTET STRING(32) digest }.
        let oid = [0x06, 0x08, 0x2B, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x1F];
        let at = der
            .windows(oid.len())
            .position(|w| w == oid)
            .expect("acmeIdentifier extension");
        let rest = &der[at + oid.len()..];
        assert_eq!(&rest[..3], &[0x01, 0x01, 0xFF], "critical");
        assert_eq!(&rest[3..7], &[0x04, 0x22, 0x04, 0x20]);
        assert_eq!(&rest[7..39], &digest);
        clear("chal.example", id);
        assert!(context_for(Some("chal.example")).is_none());
    }

    #[test]
    fn a_clear_removes_only_the_answer_it_set() {
        let first = set("turns.example", &[1u8; 32]).unwrap();
        let second = set("Turns.example", &[2u8; 32]).unwrap();
        clear("turns.example", first);
        assert!(
            context_for(Some("turns.example")).is_some(),
            "the later answer stays"
        );
        clear("turns.example", second);
        assert!(context_for(Some("turns.example")).is_none());
    }

    #[test]
    fn an_answer_learnt_from_the_fleet_does_not_replace_our_own() {
        let own = set("learnt.example", &[3u8; 32]).unwrap();
        let mine = context_for(Some("learnt.example")).unwrap();
        learn("learnt.example", &[4u8; 32]).unwrap();
        let now = context_for(Some("learnt.example")).unwrap();
        assert_eq!(
            mine.certificate().unwrap().to_der().unwrap(),
            now.certificate().unwrap().to_der().unwrap()
        );
        clear("learnt.example", own);
        learn("learnt.example", &[4u8; 32]).unwrap();
        assert!(context_for(Some("learnt.example")).is_some());
    }
}
