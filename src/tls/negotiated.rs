//! The record of what a handshake negotiated (version, suite, group, names, client
//! certificate, early data, ECH), built once per connection.

use boring::ssl::SslRef;

use super::early_data::early_data_outcome;
use super::ech::ech_outcome;
use crate::config::normal_name;
use crate::proxy::proxy_protocol::{ClientIdentity, TlsDetails};

/// What a completed handshake negotiated: read from the connection once, then used by
/// the log line, the metrics and the PROXY v2 TLVs alike.
pub struct Negotiated {
    pub sni: Option<String>,
    pub alpn: Option<Vec<u8>>,
    pub version: &'static str,
    /// The suite's standard (IANA) name, or BoringSSL's where it has none (both static
    /// strings of BoringSSL's: nothing is copied per connection).
    pub cipher: &'static str,
    /// The key-exchange group (e.g. X25519MLKEM768); none on a TLS 1.2 resumption.
    pub group: Option<&'static str>,
    pub resumed: bool,
    /// Encrypted Client Hello: accepted, rejected or not_offered; none without ech_keys.
    pub ech: Option<&'static str>,
    /// Boxed: most connections present none, and every connection keeps its `Negotiated`
    /// until it closes (for the close record), so the fields are paid only when present.
    pub client_cert: Option<Box<ClientIdentity>>,
    /// What became of early data: `None` if none was offered, else "accepted" or
    /// BoringSSL's reason for refusing it (see [`early_data_outcome`]).
    pub early_data_outcome: Option<&'static str>,
    /// 0-RTT data was accepted: the first bytes may be a replay.
    pub early_data: bool,
}

/// The verified client certificate, if the client presented one.
fn client_identity(ssl: &SslRef) -> Option<ClientIdentity> {
    let cert = ssl.peer_certificate()?;
    let text = |data: &boring::asn1::Asn1StringRef| {
        data.as_utf8().map(|s| s.to_string()).unwrap_or_default()
    };
    // RFC 4514 (2253): special characters in values escaped, bytes beyond ASCII as \XX,
    // so a value cannot pass for more attributes; empty if BoringSSL cannot print it.
    let subject = cert
        .subject_name()
        .print_ex(boring_sys::XN_FLAG_RFC2253)
        .unwrap_or_default();
    let common_name = cert
        .subject_name()
        .entries_by_nid(boring::nid::Nid::COMMONNAME)
        .next()
        .map(|e| text(e.data()));
    let san = cert
        .subject_alt_names()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| {
                    n.dnsname()
                        .map(|d| format!("DNS:{d}"))
                        .or_else(|| n.email().map(|e| format!("email:{e}")))
                        .or_else(|| n.uri().map(|u| format!("URI:{u}")))
                        .or_else(|| n.ipaddress().and_then(ip_text).map(|ip| format!("IP:{ip}")))
                })
                .collect()
        })
        .unwrap_or_default();
    let sha256_hex = cert
        .digest(boring::hash::MessageDigest::sha256())
        .map(|d| hex(&d))
        .unwrap_or_default();
    Some(ClientIdentity {
        common_name,
        subject,
        san,
        sha256_hex,
    })
}

fn ip_text(raw: &[u8]) -> Option<std::net::IpAddr> {
    match raw.len() {
        4 => Some(<[u8; 4]>::try_from(raw).ok()?.into()),
        16 => Some(<[u8; 16]>::try_from(raw).ok()?.into()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Negotiated {
    /// Reads the record of a completed handshake; `ech_configured`: the listener has ECH
    /// keys (without them, ECH is not reported at all).
    pub fn from_ssl(ssl: &SslRef, ech_configured: bool) -> Negotiated {
        let early_data_outcome = early_data_outcome(ssl);
        Negotiated {
            sni: ssl
                .servername(boring::ssl::NameType::HOST_NAME)
                .map(str::to_string),
            alpn: ssl.selected_alpn_protocol().map(<[u8]>::to_vec),
            version: ssl.version_str(),
            cipher: ssl
                .current_cipher()
                .map_or("", |c| c.standard_name().unwrap_or(c.name())),
            group: ssl.curve_name(),
            resumed: ssl.session_reused(),
            ech: ech_configured.then(|| ech_outcome(ssl)),
            client_cert: client_identity(ssl).map(Box::new),
            early_data_outcome,
            early_data: early_data_outcome == Some("accepted"),
        }
    }

    /// The TLS fields of a PROXY v2 header; `client_policy` names the client-certificate
    /// policy the connection was verified under ([`PP2_TYPE_TLSTERM_CLIENT_POLICY`]).
    ///
    /// [`PP2_TYPE_TLSTERM_CLIENT_POLICY`]: crate::proxy::proxy_protocol::PP2_TYPE_TLSTERM_CLIENT_POLICY
    pub fn tls_details(&self, client_policy: String) -> TlsDetails {
        TlsDetails {
            alpn: self.alpn.clone(),
            // The name as it selected the settings: `ADMIN.test.` is `admin.test`, so that
            // a backend comparing it with its names sees what tlsterm saw.
            sni: self.sni.as_deref().map(normal_name),
            version: self.version.to_string(),
            cipher: self.cipher.to_string(),
            key_alg: None,
            client_cert: self.client_cert.as_deref().cloned(),
            early_data: self.early_data,
            resumed: self.resumed,
            client_policy: Some(client_policy),
        }
    }
}
