//! The client TLS configuration: rustls with the aws-lc-rs provider, the cheapest
//! correct client path on this machine (its X25519 is about 3x cheaper than BoringSSL's).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::{bail, Context};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientSessionMemoryCache, EchConfig, EchMode, Resumption};
use rustls::compress::{CertDecompressor, DecompressionFailed};
use rustls::crypto::{aws_lc_rs, CryptoProvider, SupportedKxGroup};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, EchConfigListBytes, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// TLS options as given on the command line.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// "1.2" or "1.3"; `None` offers both.
    pub version: Option<String>,
    /// Comma-separated cipher suites (rustls, IANA or OpenSSL names).
    pub ciphers: Option<String>,
    /// "x25519mlkem768", "x25519", "p256" or "p384".
    pub group: String,
    pub alpn: Vec<String>,
    pub insecure: bool,
    /// PEM file with trust anchors (used unless `insecure`).
    pub cacert: Option<String>,
    /// ECHConfigList (base64) to encrypt the ClientHello to.
    pub ech_config: Option<String>,
}

/// Build the base client configuration. Resumption is disabled here: the caller
/// installs a session store where a mode wants one.
pub fn client_config(opts: &TlsOptions) -> anyhow::Result<ClientConfig> {
    let base = aws_lc_rs::default_provider();
    let kx_groups: Vec<&'static dyn SupportedKxGroup> = vec![match opts.group.as_str() {
        "x25519mlkem768" | "X25519MLKEM768" => aws_lc_rs::kx_group::X25519MLKEM768,
        "x25519" | "X25519" => aws_lc_rs::kx_group::X25519,
        "p256" | "P-256" | "secp256r1" | "prime256v1" => aws_lc_rs::kx_group::SECP256R1,
        "p384" | "P-384" | "secp384r1" => aws_lc_rs::kx_group::SECP384R1,
        g => bail!("unknown group {g:?} (x25519mlkem768, x25519, p256, p384)"),
    }];
    let cipher_suites = match &opts.ciphers {
        None => base.cipher_suites.clone(),
        Some(list) => {
            let mut out = Vec::new();
            for name in list.split([',', ':']).filter(|s| !s.is_empty()) {
                let want = canonical_suite_name(name);
                let suite = aws_lc_rs::ALL_CIPHER_SUITES
                    .iter()
                    .find(|s| s.suite().as_str() == Some(want.as_str()))
                    .with_context(|| format!("unknown cipher suite {name:?}"))?;
                out.push(*suite);
            }
            out
        }
    };
    let provider = CryptoProvider {
        cipher_suites,
        kx_groups,
        ..base
    };
    let versions: &[&'static rustls::SupportedProtocolVersion] = match opts.version.as_deref() {
        None => rustls::ALL_VERSIONS,
        Some("1.2") => &[&rustls::version::TLS12],
        Some("1.3") => &[&rustls::version::TLS13],
        Some(v) => bail!("unknown TLS version {v:?} (1.2 or 1.3)"),
    };
    let provider = Arc::new(provider);
    let builder = ClientConfig::builder_with_provider(provider.clone());
    let builder = match &opts.ech_config {
        None => builder
            .with_protocol_versions(versions)
            .context("no cipher suite matches the TLS version")?,
        Some(list) => {
            if opts.version.as_deref() == Some("1.2") {
                bail!("ECH needs TLS 1.3");
            }
            let list = boring::base64::decode_block(list.trim())
                .context("the ECH config list is not base64")?;
            let config = EchConfig::new(
                EchConfigListBytes::from(list),
                aws_lc_rs::hpke::ALL_SUPPORTED_SUITES,
            )
            .context("unusable ECH config list")?;
            builder
                .with_ech(EchMode::from(config))
                .context("ECH with these cipher suites")?
        }
    };
    let mut config = if opts.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        let path = opts
            .cacert
            .as_deref()
            .context("certificate verification needs --cacert FILE (or --insecure)")?;
        for cert in
            CertificateDer::pem_file_iter(path).with_context(|| format!("reading {path}"))?
        {
            roots.add(cert?)?;
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = opts.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    config.resumption = Resumption::disabled();
    Ok(config)
}

/// Counts the server certificates that arrived compressed with one algorithm (RFC 8879)
/// and were decompressed; one per algorithm and client configuration.
#[derive(Debug)]
pub struct CountingDecompressor {
    inner: &'static dyn CertDecompressor,
    count: AtomicU64,
}

impl CountingDecompressor {
    /// The algorithm's name, as on the command line.
    pub fn name(&self) -> String {
        format!("{:?}", self.inner.algorithm()).to_ascii_lowercase()
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }
}

impl CertDecompressor for CountingDecompressor {
    fn decompress(&self, input: &[u8], output: &mut [u8]) -> Result<(), DecompressionFailed> {
        self.inner.decompress(input, output)?;
        self.count.fetch_add(1, Relaxed);
        Ok(())
    }

    fn algorithm(&self) -> rustls::CertificateCompressionAlgorithm {
        self.inner.algorithm()
    }
}

/// Offers certificate compression with `algorithms` ("brotli", "zlib"; in this order of
/// preference; "none" or nothing: no compression) and returns the counters of the
/// certificates that arrived compressed. The counters live as long as the process (rustls
/// wants `'static` decompressors): one small allocation per algorithm and run.
pub fn offer_cert_compression(
    config: &mut ClientConfig,
    algorithms: &[String],
) -> anyhow::Result<Vec<&'static CountingDecompressor>> {
    let mut counters = Vec::new();
    for name in algorithms {
        let inner = match name.to_ascii_lowercase().as_str() {
            "none" => continue,
            "brotli" => rustls::compress::BROTLI_DECOMPRESSOR,
            "zlib" => rustls::compress::ZLIB_DECOMPRESSOR,
            other => bail!("unknown certificate compression {other:?} (brotli, zlib, none)"),
        };
        let counter: &'static CountingDecompressor = Box::leak(Box::new(CountingDecompressor {
            inner,
            count: AtomicU64::new(0),
        }));
        counters.push(counter);
    }
    config.cert_decompressors = counters
        .iter()
        .map(|&c| c as &'static dyn CertDecompressor)
        .collect();
    Ok(counters)
}

/// A copy of `base` with a fresh session store of its own: one per connection
/// chain in resume mode, so sessions are never shared between chains.
pub fn with_fresh_session_store(base: &ClientConfig, early_data: bool) -> Arc<ClientConfig> {
    let mut config = base.clone();
    config.resumption = Resumption::store(Arc::new(ClientSessionMemoryCache::new(4)));
    config.enable_early_data = early_data;
    Arc::new(config)
}

/// Map OpenSSL and IANA spellings to rustls' suite names.
fn canonical_suite_name(name: &str) -> String {
    let n = name.trim().to_ascii_uppercase();
    let mapped = match n.as_str() {
        "TLS_AES_128_GCM_SHA256" => "TLS13_AES_128_GCM_SHA256",
        "TLS_AES_256_GCM_SHA384" => "TLS13_AES_256_GCM_SHA384",
        "TLS_CHACHA20_POLY1305_SHA256" => "TLS13_CHACHA20_POLY1305_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256" => "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-RSA-AES256-GCM-SHA384" => "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-RSA-CHACHA20-POLY1305" => "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-ECDSA-AES128-GCM-SHA256" => "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384" => "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305" => "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        other => other,
    };
    mapped.to_string()
}

/// Accepts any certificate and any signature. Benchmarking only: this also skips
/// the client's signature verification, so the client spends no CPU on it.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_names() {
        let opts = TlsOptions {
            version: Some("1.2".into()),
            ciphers: Some("ECDHE-RSA-AES128-GCM-SHA256".into()),
            group: "p256".into(),
            insecure: true,
            ..Default::default()
        };
        let config = client_config(&opts).unwrap();
        assert_eq!(config.crypto_provider().cipher_suites.len(), 1);
        let bad = TlsOptions {
            ciphers: Some("NOPE".into()),
            group: "x25519".into(),
            insecure: true,
            ..Default::default()
        };
        assert!(client_config(&bad).is_err());
    }
}
