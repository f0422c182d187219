//! Encrypted Client Hello key files (`ech_keys`): reading, writing, generating.
//!
//! A key file holds an X25519 HPKE private key (PKCS#8, "PRIVATE KEY") and the ECHConfig
//! made for it ("ECHCONFIG", an ECHConfigList of that one config, base64 as in a DNS
//! HTTPS record's `ech=` parameter), the PEM layout other ECH servers read too. The first
//! file of a listener's `ech_keys` is the one offered to clients in retry configs; the
//! others still decrypt ClientHellos made with their configs (rotation).

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use boring::hpke::HpkeKey;
use boring::ssl::SslEchKeys;
use zeroize::Zeroizing;

/// PKCS#8 (RFC 8410) wrapping of a 32-byte X25519 private key: this prefix, then the key.
const X25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x04, 0x22, 0x04, 0x20,
];

/// One ECH key: its ECHConfig and HPKE private key.
pub struct EchKey {
    /// The serialized ECHConfig (not a list).
    pub config: Vec<u8>,
    private: Zeroizing<[u8; 32]>,
}

/// An ECHConfigList of `configs`, as published in DNS (`ech=`) and sent in retry configs.
pub fn config_list<'a>(configs: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let body: Vec<u8> = configs.into_iter().flatten().copied().collect();
    let mut list = (body.len() as u16).to_be_bytes().to_vec();
    list.extend(body);
    list
}

fn pem_block(label: &str, der: &[u8]) -> String {
    let text = boring::base64::encode_block(der);
    let lines: Vec<&str> = text
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

fn pem_find(text: &str, label: &str) -> anyhow::Result<Vec<u8>> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text
        .find(&begin)
        .with_context(|| format!("no {label} block"))?
        + begin.len();
    let stop = text[start..]
        .find(&end)
        .with_context(|| format!("unterminated {label} block"))?;
    let body: String = text[start..start + stop].split_whitespace().collect();
    boring::base64::decode_block(&body).with_context(|| format!("bad base64 in {label}"))
}

impl EchKey {
    /// A new key for clients to encrypt to, naming `public_name` (the name in the outer,
    /// visible ClientHello: a certificate for it must be served).
    pub fn generate(public_name: &str) -> anyhow::Result<EchKey> {
        anyhow::ensure!(
            !public_name.is_empty() && public_name.len() <= 255 && !public_name.ends_with('.'),
            "the public name must be a DNS name"
        );
        let mut private = Zeroizing::new([0u8; 32]);
        boring::rand::rand_bytes(&mut private[..])?;
        let key = crate::sys::hpke_x25519_key(&private[..])?;
        let mut config_id = [0u8; 1];
        boring::rand::rand_bytes(&mut config_id)?;
        let config =
            crate::sys::marshal_ech_config(&key, config_id[0], &public_name.to_ascii_lowercase())?;
        Ok(EchKey { config, private })
    }

    /// The key file text: the private key, then the ECHConfigList of its config.
    pub fn to_pem(&self) -> Zeroizing<String> {
        let mut pkcs8 = Zeroizing::new(X25519_PKCS8_PREFIX.to_vec());
        pkcs8.extend_from_slice(&self.private[..]);
        Zeroizing::new(format!(
            "{}{}",
            pem_block("PRIVATE KEY", &pkcs8),
            pem_block("ECHCONFIG", &config_list([&self.config[..]]))
        ))
    }

    pub fn from_pem(text: &str) -> anyhow::Result<EchKey> {
        let pkcs8 = Zeroizing::new(pem_find(text, "PRIVATE KEY")?);
        let private = pkcs8
            .strip_prefix(&X25519_PKCS8_PREFIX[..])
            .filter(|key| key.len() == 32)
            .context("the PRIVATE KEY is not an X25519 key")?;
        let list = pem_find(text, "ECHCONFIG")?;
        // One config: u16 list length, then u16 version, u16 length, contents.
        let config = list
            .get(2..6)
            .map(|head| 4 + u16::from_be_bytes([head[2], head[3]]) as usize)
            .and_then(|len| list.get(2..2 + len))
            .filter(|config| config.len() + 2 == list.len())
            .context("ECHCONFIG is not a list of one ECHConfig")?;
        let key = EchKey {
            config: config.to_vec(),
            private: Zeroizing::new(private.try_into().expect("32 bytes")),
        };
        // Refused here, with the file named, rather than at the first handshake.
        SslEchKeys::builder()?
            .add_key(true, &key.config, key.hpke_key()?)
            .context("the ECHConfig does not match the private key")?;
        Ok(key)
    }

    /// The HPKE key that decrypts ClientHellos made with this key's config.
    pub fn hpke_key(&self) -> anyhow::Result<HpkeKey> {
        crate::sys::hpke_x25519_key(&self.private[..])
    }

    pub fn load(path: &Path) -> anyhow::Result<EchKey> {
        let text = Zeroizing::new(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        );
        EchKey::from_pem(&text).with_context(|| format!("ECH key file {}", path.display()))
    }

    /// Writes a new key file readable by its owner only; an existing file is kept.
    pub fn write_new(&self, path: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        file.write_all(self.to_pem().as_bytes())?;
        file.sync_all()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_reads_back() {
        let key = EchKey::generate("public.test").unwrap();
        let pem = key.to_pem();
        let back = EchKey::from_pem(&pem).unwrap();
        assert_eq!(back.config, key.config);
        assert!(pem.contains("-----BEGIN ECHCONFIG-----"));
        // Another key's config does not pass with this private key.
        let other = EchKey::generate("public.test").unwrap();
        let mixed = format!(
            "{}{}",
            &pem[..pem.find("-----BEGIN ECHCONFIG").unwrap()],
            &other.to_pem()[other.to_pem().find("-----BEGIN ECHCONFIG").unwrap()..]
        );
        assert!(EchKey::from_pem(&mixed).is_err());
    }
}
