//! A fleet orders once: processes that share `[session] redis_url` take a lock in Redis
//! before ordering a certificate, and share the result there, so the others install it
//! instead of ordering their own. Redis may be read and written by others: certificates
//! and challenge answers are sealed with the fleet key (`crate::seal`, the entry's Redis
//! key as associated data), and one that does not open is ignored. Otherwise whoever can
//! write to Redis could make a member answer the CA's challenge with their own key
//! authorization, and so obtain certificates for the fleet's names.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use redis::aio::ConnectionManager;
use zeroize::Zeroizing;

use super::store::Material;
use crate::config::AcmeCertificate;
use crate::seal::{Entry, FleetKey};

pub struct Fleet {
    client: redis::Client,
    /// `<[session] redis_prefix>acme:`: two fleets sharing a Redis, each with its own
    /// prefix, take their own locks and share their own answers.
    prefix: String,
    /// One connection for all requests (made at the first, remade after failures): a
    /// validation connection's lookup must not cost Redis a new connection each time.
    connection: Mutex<Option<ConnectionManager>>,
    /// Replaced on reload (a rotated key file applies without restarting the orders).
    key: ArcSwap<FleetKey>,
    /// Bounds every request: a Redis that does not answer fails the attempt (retried later).
    timeout: Duration,
}

/// Releases the lock only if it is still ours (it may have expired and been taken).
const UNLOCK: &str = r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;

impl Fleet {
    pub fn new(client: redis::Client, redis_prefix: &str, key: Arc<FleetKey>) -> Fleet {
        Fleet {
            client,
            prefix: format!("{redis_prefix}acme:"),
            connection: Mutex::new(None),
            key: ArcSwap::new(key),
            timeout: Duration::from_secs(5),
        }
    }

    pub fn key(&self) -> Arc<FleetKey> {
        self.key.load_full()
    }

    /// Seals and opens with `key` from now on (a reload re-read the key file).
    pub fn set_key(&self, key: Arc<FleetKey>) {
        self.key.store(key);
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

    /// The Redis key of the fleet's entry of `kind` (`lock`, `cert`, ...) for `id`.
    fn entry(&self, kind: &str, id: &str) -> String {
        format!("{}{kind}:{id}", self.prefix)
    }

    /// Seals `plain` under `entry` (its name as associated data) and stores it for `ttl`.
    async fn put_sealed(&self, entry: &str, plain: &[u8], ttl: Duration) -> anyhow::Result<()> {
        let sealed = self.key.load().seal(entry.as_bytes(), plain)?;
        self.put_raw(entry, sealed, ttl).await
    }

    async fn put_raw(&self, entry: &str, sealed: Vec<u8>, ttl: Duration) -> anyhow::Result<()> {
        let mut command = redis::cmd("SET");
        command
            .arg(entry)
            .arg(sealed)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64);
        let _: () = self.run(&command).await?;
        Ok(())
    }

    /// What is stored under `entry`, still sealed.
    async fn get_sealed(&self, entry: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let mut command = redis::cmd("GET");
        command.arg(entry);
        self.run(&command).await
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
            .arg(self.entry("lock", &cert.id()))
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
            .arg(self.entry("lock", &cert.id()))
            .arg(token);
        let _: i64 = self.run(&command).await?;
        Ok(())
    }

    /// Whether some process holds the order lock for `cert`.
    pub async fn locked(&self, cert: &AcmeCertificate) -> anyhow::Result<bool> {
        let mut command = redis::cmd("EXISTS");
        command.arg(self.entry("lock", &cert.id()));
        Ok(self.run::<i64>(&command).await? == 1)
    }

    /// Tells the fleet the TLS-ALPN-01 answer for `name` (the CA may reach any process).
    pub async fn publish_challenge(
        &self,
        name: &str,
        digest: &[u8; 32],
        ttl: Duration,
    ) -> anyhow::Result<()> {
        self.put_sealed(&self.entry("challenge", name), &digest[..], ttl)
            .await
    }

    /// The answer another process published for `name`; one that does not open with the
    /// fleet key is ignored (and counted).
    pub async fn challenge(&self, name: &str) -> anyhow::Result<Option<[u8; 32]>> {
        let entry = self.entry("challenge", name);
        let found = self.get_sealed(&entry).await?;
        Ok(found.and_then(|sealed| {
            let digest = self
                .key
                .load()
                .open(Entry::AcmeChallenge, entry.as_bytes(), &sealed)?;
            <[u8; 32]>::try_from(digest.as_slice()).ok()
        }))
    }

    /// Tells the fleet the HTTP-01 answer to `name`'s challenge `token` (the CA may reach
    /// any process). Sealed although the CA is served it in the clear: what matters is
    /// that nobody else can publish an answer for the fleet to serve.
    pub async fn publish_http01(
        &self,
        name: &str,
        token: &str,
        key_authorization: &str,
        ttl: Duration,
    ) -> anyhow::Result<()> {
        let plain = Zeroizing::new(serde_json::to_vec(&(name, key_authorization))?);
        self.put_sealed(&self.entry("http01", token), &plain, ttl)
            .await
    }

    /// The name and key authorization another process published for the HTTP-01 `token`
    /// (the name is sealed with it, and the token is in the associated data); one that
    /// does not open with the fleet key is ignored (and counted).
    pub async fn http01(&self, token: &str) -> anyhow::Result<Option<(String, String)>> {
        let entry = self.entry("http01", token);
        let found = self.get_sealed(&entry).await?;
        Ok(found.and_then(|sealed| {
            let answer = self
                .key
                .load()
                .open(Entry::AcmeHttp01, entry.as_bytes(), &sealed)?;
            serde_json::from_slice(&answer).ok()
        }))
    }

    /// The certificate the fleet holds for `cert`, if any.
    pub async fn get(&self, cert: &AcmeCertificate) -> anyhow::Result<Option<Material>> {
        let Some(sealed) = self.get_sealed(&self.entry("cert", &cert.id())).await? else {
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
        self.put_raw(&self.entry("cert", &cert.id()), sealed, expires_in)
            .await
    }

    /// The material as `chain length (4 bytes) ‖ chain ‖ key`, in one buffer sized up
    /// front and wiped when dropped: nothing of the key is left in a buffer that grew or
    /// in a parser's scratch space.
    fn seal(&self, cert: &AcmeCertificate, material: &Material) -> anyhow::Result<Vec<u8>> {
        let (chain, key) = (material.chain_pem.as_bytes(), material.key_pem.as_bytes());
        let mut plain = Zeroizing::new(Vec::with_capacity(4 + chain.len() + key.len()));
        plain.extend_from_slice(&u32::try_from(chain.len())?.to_be_bytes());
        plain.extend_from_slice(chain);
        plain.extend_from_slice(key);
        let entry = self.entry("cert", &cert.id());
        self.key.load().seal(entry.as_bytes(), &plain)
    }

    fn open(&self, cert: &AcmeCertificate, sealed: &[u8]) -> anyhow::Result<Material> {
        let entry = self.entry("cert", &cert.id());
        let plain = self
            .key
            .load()
            .open(Entry::AcmeCertificate, entry.as_bytes(), sealed)
            .context("the fleet's certificate does not open with the fleet key: is fleet_key_file the same everywhere?")?;
        let (length, rest) = plain
            .split_first_chunk::<4>()
            .context("the fleet's certificate is truncated")?;
        let length = u32::from_be_bytes(*length) as usize;
        anyhow::ensure!(length <= rest.len(), "the fleet's certificate is truncated");
        let (chain, key) = rest.split_at(length);
        let chain_pem = String::from_utf8(chain.to_vec())?;
        let key_pem =
            Zeroizing::new(String::from_utf8(key.to_vec()).context("the fleet's key is not text")?);
        Ok(Material { chain_pem, key_pem })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AcmeKeyType;

    #[test]
    fn sealed_material_opens_only_with_the_key_and_for_its_certificate() {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let key = |byte| Arc::new(FleetKey::from_keys(vec![Zeroizing::new([byte; 32])]));
        let fleet = Fleet::new(client.clone(), "tlsterm:session:", key(7));
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
        let other = Fleet::new(client, "tlsterm:session:", key(8));
        assert!(other.open(&cert, &sealed).is_err());
        let rsa = AcmeCertificate {
            key_type: AcmeKeyType::Rsa2048,
            ..cert
        };
        assert!(fleet.open(&rsa, &sealed).is_err());
    }
}
