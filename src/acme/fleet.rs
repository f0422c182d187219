//! A fleet orders once: processes that share `[session] redis_url` take a lock in Redis
//! before ordering a certificate, and share the result there, encrypted (AES-256-GCM with
//! the `[acme] fleet_key_file` key; Redis is not a secret store), so the others install it
//! instead of ordering their own.

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context as _;
use boring::symm::{decrypt_aead, encrypt_aead, Cipher};
use redis::aio::ConnectionManager;
use zeroize::Zeroizing;

use super::store::Material;
use crate::config::AcmeCertificate;

const NONCE: usize = 12;
const TAG: usize = 16;
const PREFIX: &str = "tlsterm:acme:";

pub struct Fleet {
    client: redis::Client,
    /// One connection for all requests (made at the first, remade after failures): a
    /// validation connection's lookup must not cost Redis a new connection each time.
    connection: Mutex<Option<ConnectionManager>>,
    key: Zeroizing<[u8; 32]>,
    /// Bounds every request: a Redis that does not answer fails the attempt (retried later).
    timeout: Duration,
}

/// Releases the lock only if it is still ours (it may have expired and been taken).
const UNLOCK: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;

impl Fleet {
    pub fn new(client: redis::Client, key: Zeroizing<[u8; 32]>) -> Fleet {
        Fleet {
            client,
            connection: Mutex::new(None),
            key,
            timeout: Duration::from_secs(5),
        }
    }

    /// The shared connection; its I/O runs on the runtime of the first caller (the ACME
    /// tasks' runtime: the lookups of validation connections are sent there too).
    fn connection(&self) -> anyhow::Result<ConnectionManager> {
        let mut connection = self.connection.lock().expect("fleet connection");
        if let Some(connection) = &*connection {
            return Ok(connection.clone());
        }
        let runtime = tokio::runtime::Handle::try_current()?;
        let made = crate::session::redis::connect(&runtime, &self.client, self.timeout)?;
        *connection = Some(made.clone());
        Ok(made)
    }

    async fn run<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> anyhow::Result<T> {
        let mut connection = self.connection()?;
        let request = command.query_async(&mut connection);
        Ok(tokio::time::timeout(self.timeout, request)
            .await
            .context("Redis did not answer")??)
    }

    /// Takes the order lock for `cert` for `ttl`; the token releases it.
    pub async fn lock(
        &self,
        cert: &AcmeCertificate,
        ttl: Duration,
    ) -> anyhow::Result<Option<String>> {
        let mut token = [0u8; 16];
        boring::rand::rand_bytes(&mut token)?;
        let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
        let mut command = redis::cmd("SET");
        command
            .arg(format!("{PREFIX}lock:{}", cert.id()))
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64);
        let set: Option<String> = self.run(&command).await?;
        Ok(set.map(|_| token))
    }

    pub async fn unlock(&self, cert: &AcmeCertificate, token: &str) -> anyhow::Result<()> {
        let mut command = redis::cmd("EVAL");
        command
            .arg(UNLOCK)
            .arg(1)
            .arg(format!("{PREFIX}lock:{}", cert.id()))
            .arg(token);
        let _: i64 = self.run(&command).await?;
        Ok(())
    }

    /// Whether some process holds the order lock for `cert`.
    pub async fn locked(&self, cert: &AcmeCertificate) -> anyhow::Result<bool> {
        let mut command = redis::cmd("EXISTS");
        command.arg(format!("{PREFIX}lock:{}", cert.id()));
        Ok(self.run::<i64>(&command).await? == 1)
    }

    /// Tells the fleet the TLS-ALPN-01 answer for `name` (the CA may reach any process).
    pub async fn publish_challenge(
        &self,
        name: &str,
        digest: &[u8; 32],
        ttl: Duration,
    ) -> anyhow::Result<()> {
        let mut command = redis::cmd("SET");
        command
            .arg(format!("{PREFIX}challenge:{name}"))
            .arg(&digest[..])
            .arg("PX")
            .arg(ttl.as_millis() as u64);
        let _: () = self.run(&command).await?;
        Ok(())
    }

    /// The answer another process published for `name`.
    pub async fn challenge(&self, name: &str) -> anyhow::Result<Option<[u8; 32]>> {
        let mut command = redis::cmd("GET");
        command.arg(format!("{PREFIX}challenge:{name}"));
        let found: Option<Vec<u8>> = self.run(&command).await?;
        Ok(found.and_then(|digest| digest.try_into().ok()))
    }

    /// Tells the fleet the HTTP-01 answer to `name`'s challenge `token` (the CA may reach
    /// any process). Not sealed: it is what the CA is served, in the clear.
    pub async fn publish_http01(
        &self,
        name: &str,
        token: &str,
        key_authorization: &str,
        ttl: Duration,
    ) -> anyhow::Result<()> {
        let mut command = redis::cmd("SET");
        command
            .arg(format!("{PREFIX}http01:{token}"))
            .arg(serde_json::to_vec(&(name, key_authorization))?)
            .arg("PX")
            .arg(ttl.as_millis() as u64);
        let _: () = self.run(&command).await?;
        Ok(())
    }

    /// The name and key authorization another process published for the HTTP-01 `token`.
    pub async fn http01(&self, token: &str) -> anyhow::Result<Option<(String, String)>> {
        let mut command = redis::cmd("GET");
        command.arg(format!("{PREFIX}http01:{token}"));
        let found: Option<Vec<u8>> = self.run(&command).await?;
        Ok(found.and_then(|answer| serde_json::from_slice(&answer).ok()))
    }

    /// The certificate the fleet holds for `cert`, if any.
    pub async fn get(&self, cert: &AcmeCertificate) -> anyhow::Result<Option<Material>> {
        let mut command = redis::cmd("GET");
        command.arg(format!("{PREFIX}cert:{}", cert.id()));
        let Some(sealed): Option<Vec<u8>> = self.run(&command).await? else {
            return Ok(None);
        };
        Ok(Some(self.open(cert, &sealed)?))
    }

    /// Shares `material` for `cert` until `expires_in`.
    pub async fn put(
        &self,
        cert: &AcmeCertificate,
        material: &Material,
        expires_in: Duration,
    ) -> anyhow::Result<()> {
        let sealed = self.seal(cert, material)?;
        let mut command = redis::cmd("SET");
        command
            .arg(format!("{PREFIX}cert:{}", cert.id()))
            .arg(sealed)
            .arg("PX")
            .arg(expires_in.as_millis().max(1) as u64);
        let _: () = self.run(&command).await?;
        Ok(())
    }

    fn seal(&self, cert: &AcmeCertificate, material: &Material) -> anyhow::Result<Vec<u8>> {
        let plain = Zeroizing::new(serde_json::to_vec(&(
            material.chain_pem.as_str(),
            material.key_pem.as_str(),
        ))?);
        let mut nonce = [0u8; NONCE];
        boring::rand::rand_bytes(&mut nonce)?;
        let mut tag = [0u8; TAG];
        let aad = cert.id();
        let sealed = encrypt_aead(
            Cipher::aes_256_gcm(),
            self.key.as_slice(),
            Some(&nonce),
            aad.as_bytes(),
            &plain,
            &mut tag,
        )?;
        Ok([&nonce[..], &tag[..], &sealed[..]].concat())
    }

    fn open(&self, cert: &AcmeCertificate, sealed: &[u8]) -> anyhow::Result<Material> {
        anyhow::ensure!(
            sealed.len() > NONCE + TAG,
            "shared certificate is truncated"
        );
        let (nonce, rest) = sealed.split_at(NONCE);
        let (tag, data) = rest.split_at(TAG);
        let plain = Zeroizing::new(
            decrypt_aead(
                Cipher::aes_256_gcm(),
                self.key.as_slice(),
                Some(nonce),
                cert.id().as_bytes(),
                data,
                tag,
            )
            .context(
                "shared certificate does not decrypt: is fleet_key_file the same everywhere?",
            )?,
        );
        let (chain_pem, key_pem): (String, String) = serde_json::from_slice(&plain)?;
        Ok(Material {
            chain_pem,
            key_pem: Zeroizing::new(key_pem),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AcmeKeyType;

    #[test]
    fn sealed_material_opens_only_with_the_key_and_for_its_certificate() {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let fleet = Fleet::new(client.clone(), Zeroizing::new([7u8; 32]));
        let cert = AcmeCertificate {
            names: vec!["a.example".into()],
            key_type: AcmeKeyType::EcdsaP256,
        };
        let material = Material {
            chain_pem: "CHAIN".into(),
            key_pem: Zeroizing::new("SECRET KEY".into()),
        };
        let sealed = fleet.seal(&cert, &material).unwrap();
        assert!(
            !sealed.windows(6).any(|w| w == b"SECRET"),
            "key is not in the clear"
        );
        assert_eq!(
            fleet.open(&cert, &sealed).unwrap().key_pem.as_str(),
            "SECRET KEY"
        );
        let other = Fleet::new(client, Zeroizing::new([8u8; 32]));
        assert!(other.open(&cert, &sealed).is_err());
        let rsa = AcmeCertificate {
            key_type: AcmeKeyType::Rsa2048,
            ..cert
        };
        assert!(fleet.open(&rsa, &sealed).is_err());
    }
}
