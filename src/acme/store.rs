//! Certificates and keys on disk: `<storage>/<id>/cert.pem` (the chain) and `key.pem`
//! (mode 0600), written whole (temporary file, then rename) so a crash never leaves half
//! a key; and what tlsterm needs to know about a certificate it holds.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context as _;
use der::oid::AssociatedOid as _;
use der::Decode as _;
use zeroize::Zeroizing;

use crate::config::AcmeCertificate;

/// A certificate chain and its private key, as PEM.
#[derive(Clone)]
pub struct Material {
    pub chain_pem: String,
    pub key_pem: Zeroizing<String>,
}

/// What the renewal schedule needs to know of a certificate.
#[derive(Clone, Debug)]
pub struct Facts {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// RFC 9773 identifier (base64url AKI "." base64url serial), when the certificate has
    /// an Authority Key Identifier.
    pub ari_id: Option<instant_acme::CertificateIdentifier<'static>>,
    pub names: Vec<String>,
}

impl Facts {
    pub fn lifetime(&self) -> std::time::Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or_default()
    }

    /// Whether it can be served now for every name of `cert`.
    pub fn serves(&self, cert: &AcmeCertificate, now: SystemTime) -> bool {
        now < self.not_after && cert.names.iter().all(|n| self.names.contains(n))
    }
}

impl Material {
    /// Reads the leaf: validity, names and the renewal-information identifier.
    pub fn facts(&self) -> anyhow::Result<Facts> {
        let chain = boring::x509::X509::stack_from_pem(self.chain_pem.as_bytes())
            .context("cannot parse the certificate chain")?;
        let leaf = chain.first().context("empty certificate chain")?;
        let der = leaf.to_der()?;
        let cert =
            x509_cert::Certificate::from_der(&der).context("cannot decode the certificate")?;
        let tbs = &cert.tbs_certificate;
        let aki = tbs.extensions.iter().flatten().find_map(|ext| {
            (ext.extn_id == x509_cert::ext::pkix::AuthorityKeyIdentifier::OID)
                .then(|| {
                    x509_cert::ext::pkix::AuthorityKeyIdentifier::from_der(
                        ext.extn_value.as_bytes(),
                    )
                    .ok()?
                    .key_identifier
                })
                .flatten()
        });
        let ari_id = aki.map(|aki| {
            instant_acme::CertificateIdentifier::new(
                rustls_pki_types::Der::from_slice(aki.as_bytes()),
                rustls_pki_types::Der::from_slice(tbs.serial_number.as_bytes()),
            )
            .into_owned()
        });
        let names = leaf
            .subject_alt_names()
            .into_iter()
            .flatten()
            .filter_map(|n| n.dnsname().map(str::to_ascii_lowercase))
            .collect();
        Ok(Facts {
            not_before: tbs.validity.not_before.to_date_time().to_system_time(),
            not_after: tbs.validity.not_after.to_date_time().to_system_time(),
            ari_id,
            names,
        })
    }
}

/// Where the certificates and the account live.
pub struct Storage {
    dir: PathBuf,
}

impl Storage {
    pub fn new(dir: &Path) -> Storage {
        Storage {
            dir: dir.to_path_buf(),
        }
    }

    fn cert_dir(&self, cert: &AcmeCertificate) -> PathBuf {
        self.dir.join(cert.id())
    }

    pub fn account_file(&self) -> PathBuf {
        self.dir.join("account.json")
    }

    /// The stored certificates for `cert`, to try in this order: the pair on disk; then,
    /// if a save was cut short between its two renames (the new key beside the old
    /// certificate), the new key with the new certificate still under its temporary name.
    pub fn load(&self, cert: &AcmeCertificate) -> Vec<Material> {
        let dir = self.cert_dir(cert);
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let Some(key_pem) = read("key.pem").map(Zeroizing::new) else {
            return Vec::new();
        };
        ["cert.pem", "cert.tmp"]
            .into_iter()
            .filter_map(read)
            .map(|chain_pem| Material {
                chain_pem,
                key_pem: key_pem.clone(),
            })
            .collect()
    }

    /// Both files are written in full before either is renamed into place, the key first:
    /// whenever a crash comes, `load` finds a key with its own certificate.
    pub fn save(&self, cert: &AcmeCertificate, material: &Material) -> anyhow::Result<()> {
        let dir = self.cert_dir(cert);
        create_private_dir(&dir)?;
        let (key, chain) = (dir.join("key.pem"), dir.join("cert.pem"));
        let key_written = write_temporary(&key, material.key_pem.as_bytes())?;
        let chain_written = write_temporary(&chain, material.chain_pem.as_bytes())?;
        rename_into_place(&key_written, &key)?;
        rename_into_place(&chain_written, &chain)
    }

    pub fn save_account(&self, json: &[u8]) -> anyhow::Result<()> {
        create_private_dir(&self.dir)?;
        write_private(&self.account_file(), json)
    }
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

/// Writes `path` (mode 0600) through a temporary file and a rename.
fn write_private(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let temporary = write_temporary(path, data)?;
    rename_into_place(&temporary, path)
}

/// Writes `data` (mode 0600, synced) beside `path`, under the extension `tmp`; returns
/// where.
fn write_temporary(path: &Path, data: &[u8]) -> anyhow::Result<PathBuf> {
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    file.write_all(data)?;
    file.sync_all()?;
    Ok(temporary)
}

fn rename_into_place(temporary: &Path, path: &Path) -> anyhow::Result<()> {
    std::fs::rename(temporary, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AcmeKeyType;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn stored_key_is_private_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::new(&dir.path().join("acme"));
        let cert = AcmeCertificate {
            names: vec!["a.example".into()],
            key_type: AcmeKeyType::EcdsaP256,
        };
        assert!(storage.load(&cert).is_empty());
        let material = Material {
            chain_pem: "chain".into(),
            key_pem: Zeroizing::new("key".into()),
        };
        storage.save(&cert, &material).unwrap();
        let [back] = &storage.load(&cert)[..] else {
            panic!("one stored pair")
        };
        assert_eq!(back.chain_pem, "chain");
        assert_eq!(back.key_pem.as_str(), "key");
        let mode = std::fs::metadata(dir.path().join("acme/a.example_ecdsa-p256/key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// A save cut short between its two renames leaves the new key beside the old
    /// certificate: the pair that is served at the next start is the new key with the new
    /// certificate, not nothing.
    #[test]
    fn a_save_cut_short_between_its_renames_still_loads_a_matching_pair() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::new(&dir.path().join("acme"));
        let cert = AcmeCertificate {
            names: vec!["localhost".into()],
            key_type: AcmeKeyType::EcdsaP256,
        };
        let material = || {
            let (chain, key) =
                crate::tls::selfsigned::generate(crate::tls::selfsigned::SelfSignedKey::EcdsaP256)
                    .unwrap();
            Material {
                chain_pem: String::from_utf8(chain.to_pem().unwrap()).unwrap(),
                key_pem: Zeroizing::new(
                    String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap(),
                ),
            }
        };
        let (old, new) = (material(), material());
        storage.save(&cert, &old).unwrap();
        // What `save(new)` leaves when it stops after renaming the key.
        let stored = dir.path().join("acme").join(cert.id());
        std::fs::write(stored.join("key.pem"), new.key_pem.as_bytes()).unwrap();
        std::fs::write(stored.join("cert.tmp"), new.chain_pem.as_bytes()).unwrap();

        let now = std::time::SystemTime::now();
        let candidates = storage.load(&cert);
        assert_eq!(candidates.len(), 2);
        assert!(super::super::task::usable(&cert, &candidates[0], now).is_err());
        let (_, facts) = super::super::task::usable(&cert, &candidates[1], now).unwrap();
        assert_eq!(facts.not_after, new.facts().unwrap().not_after);
        assert_eq!(candidates[1].chain_pem, new.chain_pem);
    }
}
