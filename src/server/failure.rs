//! Why a handshake failed: the classes counted in `handshake_failures_total` and logged.

/// Why a handshake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    Timeout,
    /// The client sent a fatal alert.
    ClientAlert,
    NoSharedCipher,
    ProtocolVersion,
    /// Not TLS at all (plain HTTP, garbage).
    NotTls,
    /// The client closed the connection mid-handshake.
    ClientClosed,
    /// The private-key operation failed.
    Signing,
    /// SNI named no certificate and `unknown_sni = "refuse"`.
    UnknownSni,
    /// A required client certificate was missing or did not verify.
    ClientCertificate,
    /// The client certificate is on a `client_crl` list.
    ClientCertRevoked,
    /// The `client_crl` that covers the client certificate is past its nextUpdate.
    ClientCrlExpired,
    Other,
}

impl HandshakeFailure {
    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::ClientAlert => "client_alert",
            HandshakeFailure::NoSharedCipher => "no_shared_cipher",
            HandshakeFailure::ProtocolVersion => "protocol_version",
            HandshakeFailure::NotTls => "not_tls",
            HandshakeFailure::ClientClosed => "client_closed",
            HandshakeFailure::Signing => "signing",
            HandshakeFailure::UnknownSni => "unknown_sni",
            HandshakeFailure::ClientCertificate => "client_certificate",
            HandshakeFailure::ClientCertRevoked => "client_cert_revoked",
            HandshakeFailure::ClientCrlExpired => "client_crl_expired",
            HandshakeFailure::Other => "other",
        }
    }

    /// Classifies BoringSSL's error text (its reason codes are stable identifiers).
    pub fn classify(error: &str) -> HandshakeFailure {
        let has = |needle: &str| error.contains(needle);
        if has("CONNECTION_REJECTED") {
            // The certificate-selection callback refuses only unknown names.
            HandshakeFailure::UnknownSni
        } else if has("certificate revoked") {
            // The verify result, which `boring` adds to the handshake error's text.
            HandshakeFailure::ClientCertRevoked
        } else if has("CRL has expired") {
            HandshakeFailure::ClientCrlExpired
        } else if has("PEER_DID_NOT_RETURN_A_CERTIFICATE") || has("CERTIFICATE_VERIFY_FAILED") {
            HandshakeFailure::ClientCertificate
        } else if has("NO_SHARED_CIPHER")
            || has("NO_SHARED_GROUP")
            || has("NO_COMMON_SIGNATURE_ALGORITHMS")
        {
            HandshakeFailure::NoSharedCipher
        } else if has("UNSUPPORTED_PROTOCOL") || has("PROTOCOL_VERSION") {
            HandshakeFailure::ProtocolVersion
        } else if has("HTTP_REQUEST")
            || has("WRONG_VERSION_NUMBER")
            || has("UNKNOWN_PROTOCOL")
            || has("HTTPS_PROXY_REQUEST")
        {
            HandshakeFailure::NotTls
        } else if has("PRIVATE_KEY_OPERATION_FAILED") {
            HandshakeFailure::Signing
        } else if has("ALERT") {
            HandshakeFailure::ClientAlert
        } else if has("unexpected EOF")
            || has("UNEXPECTED_EOF")
            || has("Connection reset")
            || has("Broken pipe")
            || has("syscall")
        {
            HandshakeFailure::ClientClosed
        } else {
            HandshakeFailure::Other
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_reasons_are_classified() {
        for (error, reason) in [
            (
                "error:...:NO_SHARED_CIPHER",
                HandshakeFailure::NoSharedCipher,
            ),
            (
                "ssl:UNSUPPORTED_PROTOCOL",
                HandshakeFailure::ProtocolVersion,
            ),
            ("SSL_R_HTTP_REQUEST", HandshakeFailure::NotTls),
            ("TLSV1_ALERT_UNKNOWN_CA", HandshakeFailure::ClientAlert),
            ("CONNECTION_REJECTED", HandshakeFailure::UnknownSni),
            (
                "PEER_DID_NOT_RETURN_A_CERTIFICATE",
                HandshakeFailure::ClientCertificate,
            ),
            (
                "TLS handshake failed: cert verification failed - certificate revoked CERTIFICATE_VERIFY_FAILED",
                HandshakeFailure::ClientCertRevoked,
            ),
            ("something new", HandshakeFailure::Other),
        ] {
            assert_eq!(HandshakeFailure::classify(error), reason, "{error}");
        }
    }
}
