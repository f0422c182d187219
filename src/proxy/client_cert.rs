//! A connection's verified client certificate as request headers toward the backend: what
//! the PROXY v2 TLVs carry on a relayed connection (`proxy_protocol`), which forwarded HTTP
//! requests cannot use (one backend connection carries the requests of many clients). A
//! client's own `X-Client-Cert-*` fields never reach the backend (`forwarding` drops them),
//! so a backend can trust these.

use std::rc::Rc;

use hyper::header::{HeaderName, HeaderValue};

use super::proxy_protocol::ClientIdentity;

/// The prefix of the fields this module sets: request fields starting with it are the
/// client's and are dropped.
pub const PREFIX: &str = "x-client-cert-";

/// The RFC 4514 subject, e.g. `CN=alice,O=Example`.
const SUBJECT: &str = "x-client-cert-subject";
/// One field per subject alternative name, `DNS:`, `IP:`, `email:` or `URI:` prefixed.
const SAN: &str = "x-client-cert-san";
/// The SHA-256 fingerprint of the certificate (DER), in lower-case hex.
const SHA256: &str = "x-client-cert-sha256";

/// The most bytes of certificate fields added to one request, as the PROXY v2 header
/// bounds them: a field that would go beyond is left out whole, never cut.
const MAX_BYTES: usize = 4096;

/// The fields of a connection's verified client certificate, made once per connection.
pub type CertFields = Rc<[(HeaderName, HeaderValue)]>;

/// The fields for a verified client certificate; empty without one (a certificate is only
/// there once BoringSSL has verified it against `client_ca`).
pub fn of(identity: Option<&ClientIdentity>) -> CertFields {
    identity.map_or_else(|| Vec::new().into(), |identity| fields(identity).into())
}

fn fields(identity: &ClientIdentity) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    let mut budget = MAX_BYTES;
    let mut add = |name: &'static str, value: &str| {
        // RFC 4514 escapes what is not printable ASCII in a subject; names are encoded.
        let Ok(value) = HeaderValue::from_str(value) else {
            return;
        };
        if value.len() <= budget {
            budget -= value.len();
            out.push((HeaderName::from_static(name), value));
        }
    };
    add(SHA256, &identity.sha256_hex);
    add(SUBJECT, &identity.subject);
    for name in &identity.san {
        add(SAN, &encode_name(name));
    }
    out
}

/// A subject alternative name as a field value: `%`, `,` and what is not visible ASCII
/// percent-encoded, so that a comma in a name cannot pass for two names when a backend
/// joins the fields into one list.
fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        match byte {
            b'%' | b',' => out.push_str(&format!("%{byte:02X}")),
            0x21..=0x7e => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_becomes_fingerprint_subject_and_one_field_per_name() {
        let identity = ClientIdentity {
            common_name: Some("alice".into()),
            subject: "CN=alice,O=Example".into(),
            san: vec!["DNS:alice.test".into(), "URI:https://a.test/x,y z".into()],
            sha256_hex: "ab".repeat(32),
        };
        let fields = fields(&identity);
        let text: Vec<(&str, &str)> = fields
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            text,
            [
                (SHA256, &*"ab".repeat(32)),
                (SUBJECT, "CN=alice,O=Example"),
                (SAN, "DNS:alice.test"),
                (SAN, "URI:https://a.test/x%2Cy%20z"),
            ]
        );
        assert!(fields.iter().all(|(n, _)| n.as_str().starts_with(PREFIX)));
    }

    #[test]
    fn fields_beyond_the_bound_are_left_out_whole() {
        let identity = ClientIdentity {
            common_name: None,
            subject: format!("CN={}", "a".repeat(MAX_BYTES)),
            san: (0..200)
                .map(|i| format!("DNS:host{i:03}.example.test"))
                .collect(),
            sha256_hex: "cd".repeat(32),
        };
        let fields = fields(&identity);
        assert!(fields.iter().all(|(n, _)| n.as_str() != SUBJECT));
        let total: usize = fields.iter().map(|(_, v)| v.len()).sum();
        assert!(total <= MAX_BYTES);
        let names = fields.iter().filter(|(n, _)| n.as_str() == SAN).count();
        assert!(names > 100 && names < 200, "{names}");
        for (_, value) in &fields[1..] {
            assert_eq!(value.len(), "DNS:host000.example.test".len(), "never cut");
        }
    }
}
