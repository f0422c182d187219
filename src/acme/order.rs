//! One ACME order (RFC 8555) through instant-acme: the account, the challenges answered
//! by this process, a fresh key and its CSR, and the issued chain.
//!
//! Orders of this process whose names overlap (a listener's ECDSA and RSA certificates
//! for the same names) take turns: a CA's validation connection carries only the name,
//! so two answers pending for one name would make one of the orders fail.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use anyhow::Context as _;
use boring::hash::MessageDigest;
use boring::pkey::{PKey, Private};
use boring::stack::Stack;
use boring::x509::extension::SubjectAlternativeName;
use boring::x509::X509Req;
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, ExternalAccountKey,
    Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use tokio::sync::OwnedMutexGuard;
use zeroize::Zeroizing;

use super::fleet::Fleet;
use super::http01;
use super::store::{Material, Storage};
use crate::config::{AcmeCertificate, AcmeConfig, AcmeKeyType, ChallengeKind};
use crate::tls::acme_challenge;
use crate::tls::selfsigned::{self, SelfSignedKey};

/// The account: restored from storage, else registered (and stored, 0600).
pub async fn account(config: &AcmeConfig, storage: &Storage) -> anyhow::Result<Account> {
    // rustls (inside instant-acme) needs a process-wide provider; an error means one is
    // installed already.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let builder = || match &config.ca_file {
        Some(ca) => Account::builder_with_root(ca.get_ref()),
        None => Account::builder(),
    };
    let file = storage.account_file();
    if let Ok(json) = std::fs::read(&file).map(Zeroizing::new) {
        let credentials: AccountCredentials = serde_json::from_slice(&json)
            .with_context(|| format!("cannot parse {}", file.display()))?;
        return Ok(builder()?.from_credentials(credentials).await?);
    }
    let contact: Vec<&str> = config.contact.iter().map(String::as_str).collect();
    let external = match &config.external_account {
        Some(eab) => {
            let text = Zeroizing::new(std::fs::read_to_string(eab.hmac_key_file.get_ref())?);
            let key =
                decode_hmac_key(&text).context("external_account.hmac_key_file: not base64url")?;
            Some(ExternalAccountKey::new(eab.key_id.clone(), &key))
        }
        None => None,
    };
    let (account, credentials) = builder()?
        .create(
            &NewAccount {
                contact: &contact,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            config.directory.get_ref().clone(),
            external.as_ref(),
        )
        .await?;
    let json = Zeroizing::new(serde_json::to_vec(&credentials)?);
    storage.save_account(&json)?;
    tracing::info!(directory = %config.directory.get_ref(), "ACME account registered");
    Ok(account)
}

/// The HMAC key of an external account binding: base64url as CAs hand it out (padding
/// and the standard alphabet tolerated).
fn decode_hmac_key(text: &str) -> Option<Zeroizing<Vec<u8>>> {
    use base64::Engine as _;
    let text = text
        .trim()
        .trim_end_matches('=')
        .replace('+', "-")
        .replace('/', "_");
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()
        .map(Zeroizing::new)
}

/// One turn per lower-case name, shared by the orders in progress that name it.
static TURNS: LazyLock<Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Mutex::default);

fn turn_for(name: &str) -> Arc<tokio::sync::Mutex<()>> {
    let mut turns = TURNS.lock().expect("order turns");
    // Names no order holds or waits for any more (removed by a reload, say) go.
    turns.retain(|_, turn| turn.strong_count() > 0);
    if let Some(turn) = turns.get(name).and_then(Weak::upgrade) {
        return turn;
    }
    let turn = Arc::default();
    turns.insert(name.to_string(), Arc::downgrade(&turn));
    turn
}

/// Waits until no other order of this process has challenges pending for any of `names`,
/// and keeps it so while the guards live. The turns are taken in the names' sorted order,
/// so that orders for overlapping sets of names cannot each hold what the other waits for.
async fn take_turns(names: &[String]) -> Vec<OwnedMutexGuard<()>> {
    let mut names: Vec<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
    names.sort();
    names.dedup();
    let mut held = Vec::with_capacity(names.len());
    for name in names {
        held.push(turn_for(&name).lock_owned().await);
    }
    held
}

/// An answer this order set, to remove when it ends.
enum Answer {
    TlsAlpn01(String, acme_challenge::AnswerId),
    Http01 { token: String },
}

/// Removes the answers to this order's challenges however the order ends, then lets the
/// next order for its names answer theirs.
struct Answers {
    set: Vec<Answer>,
    /// Dropped after `drop` has removed the answers (fields drop after `Drop::drop`).
    _turns: Vec<OwnedMutexGuard<()>>,
}

impl Drop for Answers {
    fn drop(&mut self) {
        for answer in &self.set {
            match answer {
                Answer::TlsAlpn01(name, id) => acme_challenge::clear(name, *id),
                Answer::Http01 { token } => http01::clear(token),
            }
        }
    }
}

/// Orders `cert` and waits for it; `replaces` names the certificate it renews (RFC 9773).
/// Over 80 lines on purpose: the RFC 8555 steps in order (place, answer each
/// authorization, wait, finalize, download), with the challenge answers it sets living
/// until it returns; split, their lifetime would cross functions.
pub async fn order(
    account: &Account,
    config: &AcmeConfig,
    cert: &AcmeCertificate,
    replaces: Option<instant_acme::CertificateIdentifier<'static>>,
    fleet: Option<&Fleet>,
) -> anyhow::Result<Material> {
    let identifiers: Vec<Identifier> = cert.names.iter().cloned().map(Identifier::Dns).collect();
    // Before the order is placed: the CA may then find the names already validated by the
    // order that had the turn (authorization reuse), with no challenge left to answer.
    let mut answers = Answers {
        set: Vec::new(),
        _turns: take_turns(&cert.names).await,
    };
    let mut order = match replaces {
        Some(replaces) => match account
            .new_order(&NewOrder::new(&identifiers).replaces(replaces))
            .await
        {
            Ok(order) => order,
            // The CA may not know the certificate (another CA issued it, or it forgot):
            // an order without `replaces` is still a renewal.
            Err(instant_acme::Error::Api(problem)) => {
                tracing::debug!(%problem, "the CA refused `replaces`; ordering without it");
                account.new_order(&NewOrder::new(&identifiers)).await?
            }
            Err(err) => return Err(err.into()),
        },
        None => account.new_order(&NewOrder::new(&identifiers)).await?,
    };
    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization = authorization?;
        match authorization.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            status => anyhow::bail!("authorization is {status:?}"),
        }
        let kind = match config.challenge {
            ChallengeKind::TlsAlpn01 => ChallengeType::TlsAlpn01,
            ChallengeKind::Http01 => ChallengeType::Http01,
        };
        let mut challenge = authorization
            .challenge(kind.clone())
            .with_context(|| format!("the CA offers no {kind:?} challenge"))?;
        let name = challenge.identifier().to_string();
        let key_authorization = challenge.key_authorization();
        // Each answer is also shared through the fleet, so that a member the CA's request
        // reaches answers it too.
        let shared = match config.challenge {
            ChallengeKind::TlsAlpn01 => {
                let digest: [u8; 32] = key_authorization
                    .digest()
                    .as_ref()
                    .try_into()
                    .context("key authorization digest")?;
                let id = acme_challenge::set(&name, &digest)?;
                answers.set.push(Answer::TlsAlpn01(name.clone(), id));
                match fleet {
                    Some(fleet) => Some(
                        fleet
                            .publish_challenge(&name, &digest, config.order_timeout)
                            .await,
                    ),
                    None => None,
                }
            }
            ChallengeKind::Http01 => {
                http01::set(
                    &name,
                    challenge.token.clone(),
                    key_authorization.as_str().to_string(),
                );
                answers.set.push(Answer::Http01 {
                    token: challenge.token.clone(),
                });
                match fleet {
                    Some(fleet) => Some(
                        fleet
                            .publish_http01(
                                &name,
                                &challenge.token,
                                key_authorization.as_str(),
                                config.order_timeout,
                            )
                            .await,
                    ),
                    None => None,
                }
            }
        };
        // Without Redis this process still answers its own: the order goes on (it may then
        // fail validation, which is retried), rather than failing here every time while the
        // certificate runs out.
        if let Some(Err(err)) = shared {
            tracing::warn!(%name, error = format!("{err:#}"), "cannot share the ACME challenge answer through Redis; only this process answers it");
        }
        challenge.set_ready().await?;
    }
    let retries = RetryPolicy::new()
        .initial_delay(Duration::from_millis(250))
        .backoff(1.5)
        .timeout(config.order_timeout);
    let status = order.poll_ready(&retries).await?;
    if status != OrderStatus::Ready {
        let problem = order.state().error.as_ref().map(|p| p.to_string());
        anyhow::bail!(
            "order is {status:?}: {}",
            problem.as_deref().unwrap_or("no detail")
        );
    }
    // The challenges are over: the next order for these names may answer its own.
    drop(answers);
    let key = generate_key(cert.key_type)?;
    let csr = csr(&key, &cert.names)?;
    order.finalize_csr(&csr).await?;
    let chain_pem = order.poll_certificate(&retries).await?;
    let key_pem = Zeroizing::new(String::from_utf8(key.private_key_to_pem_pkcs8()?)?);
    Ok(Material { chain_pem, key_pem })
}

fn generate_key(key_type: AcmeKeyType) -> anyhow::Result<PKey<Private>> {
    selfsigned::new_key(match key_type {
        AcmeKeyType::EcdsaP256 => SelfSignedKey::EcdsaP256,
        AcmeKeyType::Rsa2048 => SelfSignedKey::Rsa2048,
    })
}

/// A PKCS#10 request for `names` (all in the SAN; the first also as CN when it fits), DER.
fn csr(key: &PKey<Private>, names: &[String]) -> anyhow::Result<Vec<u8>> {
    let mut request = X509Req::builder()?;
    request.set_version(0)?;
    let subject = selfsigned::subject_for(&names[0])?;
    request.set_subject_name(&subject)?;
    request.set_pubkey(key)?;
    let mut san = SubjectAlternativeName::new();
    for name in names {
        san.dns(name);
    }
    let mut extensions = Stack::new()?;
    extensions.push(san.build(&request.x509v3_context(None))?)?;
    request.add_extensions(&extensions)?;
    request.sign(key, MessageDigest::sha256())?;
    Ok(request.build().to_der()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `future` is ready at its first poll.
    fn ready_now<F: std::future::Future>(future: F) -> Option<F::Output> {
        let mut future = std::pin::pin!(future);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut context) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        }
    }

    #[test]
    fn orders_sharing_a_name_take_turns() {
        let first = ready_now(take_turns(&["b.turn".into(), "A.turn".into()])).unwrap();
        assert!(
            ready_now(take_turns(&["c.turn".into(), "a.turn".into()])).is_none(),
            "a.turn is the first order's"
        );
        assert!(ready_now(take_turns(&["c.turn".into()])).is_some());
        drop(first);
        assert!(ready_now(take_turns(&["c.turn".into(), "a.turn".into()])).is_some());
    }

    #[test]
    fn csr_names_every_name() {
        let key = generate_key(AcmeKeyType::EcdsaP256).unwrap();
        let der = csr(&key, &["a.example".into(), "b.example".into()]).unwrap();
        let request = X509Req::from_der(&der).unwrap();
        assert!(request.verify(&key).unwrap());
        let text = String::from_utf8_lossy(&der).to_string();
        assert!(text.contains("a.example") && text.contains("b.example"));
    }

    #[test]
    fn external_account_keys_decode() {
        assert_eq!(
            decode_hmac_key("zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W")
                .unwrap()
                .len(),
            48
        );
        assert_eq!(decode_hmac_key("_-8").unwrap().as_slice(), &[0xff, 0xef]);
        assert_eq!(decode_hmac_key("/+8=").unwrap().as_slice(), &[0xff, 0xef]);
        assert!(decode_hmac_key("a*").is_none());
    }
}
