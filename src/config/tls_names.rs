//! The TLS vocabulary of the configuration: protocol versions, cipher suite and group
//! names, certificate compression algorithms, and BoringSSL's fixed early-data limit.

use serde::Deserialize;

/// Mozilla "intermediate" TLS 1.2 suites: ECDHE only, AES-GCM and ChaCha20-Poly1305.
pub const DEFAULT_TLS12_CIPHERS: &str =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:\
ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

/// The most early data BoringSSL accepts on a connection (kMaxEarlyDataAccepted).
pub const BORINGSSL_MAX_EARLY_DATA: usize = 14_336;

/// The protocol ID of a TLS 1.3 cipher suite name.
pub fn tls13_cipher_id(name: &str) -> Option<u16> {
    match name {
        "TLS_AES_128_GCM_SHA256" => Some(0x1301),
        "TLS_AES_256_GCM_SHA384" => Some(0x1302),
        "TLS_CHACHA20_POLY1305_SHA256" => Some(0x1303),
        _ => None,
    }
}

/// BoringSSL's name for a configured group, or `None` if unknown.
pub fn group_name(name: &str) -> Option<&'static str> {
    match name.to_ascii_lowercase().as_str() {
        // The hybrid post-quantum group (ML-KEM-768 with X25519) of current browsers.
        "x25519mlkem768" => Some("X25519MLKEM768"),
        "x25519" => Some("X25519"),
        "p-256" | "p256" | "prime256v1" | "secp256r1" => Some("P-256"),
        "p-384" | "p384" | "secp384r1" => Some("P-384"),
        _ => None,
    }
}

/// The TLS `NamedGroup` code point of a `groups` entry.
pub fn group_id(name: &str) -> Option<u16> {
    match group_name(name)? {
        "X25519MLKEM768" => Some(0x11ec),
        "X25519" => Some(0x001d),
        "P-256" => Some(0x0017),
        "P-384" => Some(0x0018),
        _ => None,
    }
}

/// A certificate compression algorithm tlsterm offers (`cert_compression`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertCompression {
    Brotli,
    Zlib,
}

impl CertCompression {
    /// The algorithm of a configured name.
    pub fn parse(name: &str) -> Option<CertCompression> {
        match name.to_ascii_lowercase().as_str() {
            "brotli" => Some(CertCompression::Brotli),
            "zlib" => Some(CertCompression::Zlib),
            _ => None,
        }
    }
}
