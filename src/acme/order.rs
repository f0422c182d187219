//! One ACME order (RFC 8555) through instant-acme: the account, the challenges answered
//! by this process, a fresh key and its CSR, and the issued chain.

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

/// Removes the answers to this order's challenges however the order ends.
struct Answers {
    names: Vec<String>,
    kind: ChallengeKind,
}

impl Drop for Answers {
    fn drop(&mut self) {
        for name in &self.names {
            match self.kind {
                ChallengeKind::TlsAlpn01 => acme_challenge::clear(name),
                ChallengeKind::Http01 => http01::clear(name),
            }
        }
    }
}

/// Orders `cert` and waits for it; `replaces` names the certificate it renews (RFC 9773).
pub async fn order(
    account: &Account,
    config: &AcmeConfig,
    cert: &AcmeCertificate,
    replaces: Option<instant_acme::CertificateIdentifier<'static>>,
    fleet: Option<&Fleet>,
) -> anyhow::Result<Material> {
    let identifiers: Vec<Identifier> = cert.names.iter().cloned().map(Identifier::Dns).collect();
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
    let mut answers = Answers {
        names: Vec::new(),
        kind: config.challenge,
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
        match config.challenge {
            ChallengeKind::TlsAlpn01 => {
                let digest: [u8; 32] = key_authorization
                    .digest()
                    .as_ref()
                    .try_into()
                    .context("key authorization digest")?;
                acme_challenge::set(&name, &digest)?;
                answers.names.push(name.clone());
                if let Some(fleet) = fleet {
                    // Shared so that the members a validation connection may reach answer it
                    // too. Without Redis this process still answers its own: the order goes
                    // on (it may then fail validation, which is retried), rather than failing
                    // here every time while the certificate runs out.
                    if let Err(err) = fleet
                        .publish_challenge(&name, &digest, config.order_timeout)
                        .await
                    {
                        tracing::warn!(%name, error = format!("{err:#}"), "cannot share the ACME challenge answer through Redis; only this process answers it");
                    }
                }
            }
            ChallengeKind::Http01 => {
                http01::set(
                    &name,
                    challenge.token.clone(),
                    key_authorization.as_str().to_string(),
                );
                answers.names.push(name);
            }
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
