//! A private key as the offload layer sees it: the BoringSSL key for inline signing and,
//! for RSA and ECDSA P-256, the same key converted for the multi-buffer engine; for ECDSA
//! P-384, which has no kernel, the same key for aws-lc, whose P-384 signs about 4x as fast
//! as BoringSSL's; for RSA, made when first asked for, the key for aws-lc too, which signs
//! a lone signature faster than a multi-buffer pass of one where both have IFMA.

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{EcdsaKeyPair, RsaKeyPair, ECDSA_P384_SHA384_ASN1_SIGNING};
use std::sync::OnceLock;

use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{Id, PKey, Private};
use boring::rsa::Padding;
use boring::sign::{RsaPssSaltlen, Signer};
use boring::ssl::SslSignatureAlgorithm;

use super::OffloadError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Rsa { bits: u32 },
    Ecdsa { curve: Nid },
}

impl KeyKind {
    pub fn label(self) -> &'static str {
        match self {
            KeyKind::Rsa { bits: 2048 } => "rsa2048",
            KeyKind::Rsa { bits: 3072 } => "rsa3072",
            KeyKind::Rsa { bits: 4096 } => "rsa4096",
            KeyKind::Rsa { .. } => "rsa",
            KeyKind::Ecdsa { curve } if curve == Nid::X9_62_PRIME256V1 => "ecdsap256",
            KeyKind::Ecdsa { curve } if curve == Nid::SECP384R1 => "ecdsap384",
            KeyKind::Ecdsa { .. } => "ecdsa",
        }
    }
}

/// How a TLS signature algorithm is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    RsaPkcs1(HashAlg),
    RsaPss(HashAlg),
    Ecdsa(HashAlg),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashAlg {
    Sha256,
    Sha384,
    Sha512,
}

impl HashAlg {
    fn digest(self) -> MessageDigest {
        match self {
            HashAlg::Sha256 => MessageDigest::sha256(),
            HashAlg::Sha384 => MessageDigest::sha384(),
            HashAlg::Sha512 => MessageDigest::sha512(),
        }
    }

    pub fn engine(self) -> tlsterm_engine::Hash {
        match self {
            HashAlg::Sha256 => tlsterm_engine::Hash::Sha256,
            HashAlg::Sha384 => tlsterm_engine::Hash::Sha384,
            HashAlg::Sha512 => tlsterm_engine::Hash::Sha512,
        }
    }
}

impl Scheme {
    /// The signature schemes tlsterm signs with; anything else (SHA-1, MD5) is refused.
    pub fn from_tls(alg: SslSignatureAlgorithm) -> Option<Scheme> {
        use SslSignatureAlgorithm as A;
        Some(match alg {
            a if a == A::RSA_PKCS1_SHA256 => Scheme::RsaPkcs1(HashAlg::Sha256),
            a if a == A::RSA_PKCS1_SHA384 => Scheme::RsaPkcs1(HashAlg::Sha384),
            a if a == A::RSA_PKCS1_SHA512 => Scheme::RsaPkcs1(HashAlg::Sha512),
            a if a == A::RSA_PSS_RSAE_SHA256 => Scheme::RsaPss(HashAlg::Sha256),
            a if a == A::RSA_PSS_RSAE_SHA384 => Scheme::RsaPss(HashAlg::Sha384),
            a if a == A::RSA_PSS_RSAE_SHA512 => Scheme::RsaPss(HashAlg::Sha512),
            a if a == A::ECDSA_SECP256R1_SHA256 => Scheme::Ecdsa(HashAlg::Sha256),
            a if a == A::ECDSA_SECP384R1_SHA384 => Scheme::Ecdsa(HashAlg::Sha384),
            a if a == A::ECDSA_SECP521R1_SHA512 => Scheme::Ecdsa(HashAlg::Sha512),
            _ => return None,
        })
    }
}

/// A certificate's private key. Never logged: `Debug` shows only the kind.
pub struct SigningKey {
    pkey: PKey<Private>,
    kind: KeyKind,
    /// The key in the engine's form (RSA sizes the engine supports only).
    engine_key: Option<tlsterm_engine::RsaPrivateKey>,
    /// The key in the engine's form, for P-256 keys.
    p256_key: Option<tlsterm_engine::EcdsaP256Key>,
    /// The key as aws-lc's, for P-384 keys (its SHA-384 signatures: the only ones TLS 1.3
    /// lets a P-384 key make).
    p384_key: Option<EcdsaKeyPair>,
    /// RSA only: aws-lc's copy, made at the first lone signature (most keys of a large
    /// certificate set never sign alone, and parsing one costs about 0.4 ms); `None` inside
    /// when aws-lc refused the key.
    rsa_aws_lc: OnceLock<Option<RsaKeyPair>>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({})", self.kind.label())
    }
}

impl SigningKey {
    pub fn new(pkey: PKey<Private>) -> anyhow::Result<SigningKey> {
        let (mut p256_key, mut p384_key) = (None, None);
        let (kind, engine_key) = match pkey.id() {
            Id::RSA => {
                let bits = pkey.bits();
                anyhow::ensure!(
                    matches!(bits, 2048 | 3072 | 4096),
                    "RSA keys of 2048, 3072 or 4096 bits are supported, not {bits}"
                );
                // The engine takes balanced keys (p and q of half the modulus size each);
                // any other key is signed by BoringSSL alone.
                let engine = engine_key(&pkey)
                    .map_err(|err| tracing::warn!(error = %err, "RSA key not usable by the engine: signing it inline"))
                    .ok();
                (KeyKind::Rsa { bits }, engine)
            }
            Id::EC => {
                let ec = pkey.ec_key()?;
                let curve = ec.group().curve_name().unwrap_or(Nid::UNDEF);
                anyhow::ensure!(
                    curve == Nid::X9_62_PRIME256V1 || curve == Nid::SECP384R1,
                    "ECDSA keys on P-256 or P-384 are supported"
                );
                if curve == Nid::X9_62_PRIME256V1 {
                    p256_key = p256_engine_key(&ec)
                        .map_err(|err| tracing::warn!(error = %err, "P-256 key not usable by the engine: signing it inline"))
                        .ok();
                } else {
                    p384_key = aws_lc_key(&pkey)
                        .map_err(|err| tracing::warn!(error = %err, "P-384 key not usable by aws-lc: signing it with BoringSSL"))
                        .ok();
                }
                (KeyKind::Ecdsa { curve }, None)
            }
            _ => anyhow::bail!("unsupported private key type (RSA or ECDSA expected)"),
        };
        Ok(SigningKey {
            pkey,
            kind,
            engine_key,
            p256_key,
            p384_key,
            rsa_aws_lc: OnceLock::new(),
        })
    }

    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    pub fn engine_key(&self) -> Option<&tlsterm_engine::RsaPrivateKey> {
        self.engine_key.as_ref()
    }

    pub fn p256_key(&self) -> Option<&tlsterm_engine::EcdsaP256Key> {
        self.p256_key.as_ref()
    }

    /// Whether the engine can make this key's signatures of `scheme` (else BoringSSL
    /// signs them inline).
    pub fn batchable(&self, scheme: Scheme) -> bool {
        match scheme {
            Scheme::RsaPkcs1(_) | Scheme::RsaPss(_) => self.engine_key.is_some(),
            Scheme::Ecdsa(_) => self.p256_key.is_some(),
        }
    }

    /// Signs with aws-lc on the calling thread where it is faster than BoringSSL: ECDSA
    /// P-384 with SHA-384. `None` for every other key and scheme. aws-lc draws each nonce
    /// from its random generator with the key and the digest mixed in, as BoringSSL does.
    pub fn sign_aws_lc(
        &self,
        scheme: Scheme,
        message: &[u8],
    ) -> Option<Result<Vec<u8>, OffloadError>> {
        let key = self.p384_key.as_ref()?;
        if scheme != Scheme::Ecdsa(HashAlg::Sha384) {
            return None;
        }
        let signature = key.sign(&SystemRandom::new(), message);
        Some(
            signature
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| OffloadError::Signing),
        )
    }

    /// Signs an RSA signature with aws-lc on the calling thread; `None` for an ECDSA key
    /// or scheme, or an RSA key aws-lc refused. aws-lc checks every RSA result with the
    /// public exponent before returning it (a fault in the private operation gives an
    /// error, never a signature that leaks a factor), as BoringSSL does.
    pub fn sign_rsa_aws_lc(
        &self,
        scheme: Scheme,
        message: &[u8],
    ) -> Option<Result<Vec<u8>, OffloadError>> {
        use aws_lc_rs::signature as alg;
        let encoding: &'static dyn alg::RsaEncoding = match scheme {
            Scheme::RsaPkcs1(HashAlg::Sha256) => &alg::RSA_PKCS1_SHA256,
            Scheme::RsaPkcs1(HashAlg::Sha384) => &alg::RSA_PKCS1_SHA384,
            Scheme::RsaPkcs1(HashAlg::Sha512) => &alg::RSA_PKCS1_SHA512,
            Scheme::RsaPss(HashAlg::Sha256) => &alg::RSA_PSS_SHA256,
            Scheme::RsaPss(HashAlg::Sha384) => &alg::RSA_PSS_SHA384,
            Scheme::RsaPss(HashAlg::Sha512) => &alg::RSA_PSS_SHA512,
            Scheme::Ecdsa(_) => return None,
        };
        let KeyKind::Rsa { .. } = self.kind else {
            return None;
        };
        let key = self
            .rsa_aws_lc
            .get_or_init(|| {
                aws_lc_rsa_key(&self.pkey)
                    .map_err(|err| tracing::warn!(error = %err, "RSA key not usable by aws-lc: lone signatures by BoringSSL"))
                    .ok()
            })
            .as_ref()?;
        let mut signature = vec![0; key.public_modulus_len()];
        Some(
            key.sign(encoding, &SystemRandom::new(), message, &mut signature)
                .map(|()| signature)
                .map_err(|_| OffloadError::Signing),
        )
    }

    /// Signs with BoringSSL on the calling thread.
    pub fn sign_inline(&self, scheme: Scheme, message: &[u8]) -> Result<Vec<u8>, OffloadError> {
        let result = (|| {
            let (hash, pss) = match (scheme, self.kind) {
                (Scheme::RsaPkcs1(h), KeyKind::Rsa { .. }) => (h, false),
                (Scheme::RsaPss(h), KeyKind::Rsa { .. }) => (h, true),
                (Scheme::Ecdsa(h), KeyKind::Ecdsa { .. }) => (h, false),
                _ => return Ok(Err(OffloadError::WrongKeyType)),
            };
            let mut signer = Signer::new(hash.digest(), &self.pkey)?;
            if pss {
                signer.set_rsa_padding(Padding::PKCS1_PSS)?;
                signer.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH)?;
                signer.set_rsa_mgf1_md(hash.digest())?;
            }
            signer.update(message)?;
            Ok::<_, boring::error::ErrorStack>(Ok(signer.sign_to_vec()?))
        })();
        result.unwrap_or(Err(OffloadError::Signing))
    }
}

/// The key as aws-lc's, through its PKCS#8 encoding (wiped once parsed).
fn aws_lc_key(pkey: &PKey<Private>) -> anyhow::Result<EcdsaKeyPair> {
    let pkcs8 = zeroize::Zeroizing::new(pkey.private_key_to_der_pkcs8()?);
    EcdsaKeyPair::from_pkcs8(&ECDSA_P384_SHA384_ASN1_SIGNING, &pkcs8)
        .map_err(|err| anyhow::anyhow!("aws-lc refused the key: {err}"))
}

/// The RSA key as aws-lc's, through its PKCS#8 encoding (wiped once parsed).
fn aws_lc_rsa_key(pkey: &PKey<Private>) -> anyhow::Result<RsaKeyPair> {
    let pkcs8 = zeroize::Zeroizing::new(pkey.private_key_to_der_pkcs8()?);
    RsaKeyPair::from_pkcs8(&pkcs8).map_err(|err| anyhow::anyhow!("aws-lc refused the key: {err}"))
}

/// Copies the RSA components out of BoringSSL into the engine's key type.
fn engine_key(pkey: &PKey<Private>) -> anyhow::Result<tlsterm_engine::RsaPrivateKey> {
    let rsa = pkey.rsa()?;
    let missing = || anyhow::anyhow!("RSA key lacks CRT parameters");
    // BN_bn2bin output is secret for d, p, q...: every copy lives in `parts`, which is
    // zeroized when dropped, also when a missing component ends this early (each copy
    // joins it as soon as it is made, so none is dropped unzeroized).
    let mut parts: zeroize::Zeroizing<Vec<Vec<u8>>> =
        zeroize::Zeroizing::new(Vec::with_capacity(8));
    for component in [
        Some(rsa.n()),
        Some(rsa.e()),
        Some(rsa.d()),
        rsa.p(),
        rsa.q(),
        rsa.dmp1(),
        rsa.dmq1(),
        rsa.iqmp(),
    ] {
        parts.push(component.ok_or_else(missing)?.to_vec());
    }
    let [n, e, d, p, q, dp, dq, qinv] = &parts[..] else {
        unreachable!("eight components")
    };
    tlsterm_engine::RsaPrivateKey::from_components(&tlsterm_engine::RsaComponents {
        n,
        e,
        d,
        p,
        q,
        dp,
        dq,
        qinv,
    })
    .map_err(|err| anyhow::anyhow!("engine rejected the RSA key: {err}"))
}

/// Copies the P-256 private scalar out of BoringSSL into the engine's key type.
fn p256_engine_key(
    ec: &boring::ec::EcKeyRef<Private>,
) -> anyhow::Result<tlsterm_engine::EcdsaP256Key> {
    // The copy of the scalar is zeroized when dropped, also on error.
    let scalar = zeroize::Zeroizing::new(ec.private_key().to_vec_padded(32)?);
    tlsterm_engine::EcdsaP256Key::from_private_scalar(&scalar)
        .map_err(|err| anyhow::anyhow!("engine rejected the P-256 key: {err}"))
}
