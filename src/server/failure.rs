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

    /// Classifies a failed handshake by BoringSSL's codes, never by the error's text.
    pub fn classify(facts: &FailureFacts) -> HandshakeFailure {
        use boring_sys as ffi;
        let reason = facts.reason.unwrap_or(0);
        let is = |codes: &[i32]| codes.contains(&reason);
        if reason == ffi::SSL_R_CONNECTION_REJECTED {
            // The certificate-selection callback refuses only unknown names.
            HandshakeFailure::UnknownSni
        } else if facts.verify == Some(ffi::X509_V_ERR_CERT_REVOKED) {
            HandshakeFailure::ClientCertRevoked
        } else if facts.verify == Some(ffi::X509_V_ERR_CRL_HAS_EXPIRED) {
            HandshakeFailure::ClientCrlExpired
        } else if is(&[
            ffi::SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE,
            ffi::SSL_R_CERTIFICATE_VERIFY_FAILED,
        ]) {
            HandshakeFailure::ClientCertificate
        } else if is(&[
            ffi::SSL_R_NO_SHARED_CIPHER,
            ffi::SSL_R_NO_SHARED_GROUP,
            ffi::SSL_R_NO_COMMON_SIGNATURE_ALGORITHMS,
        ]) {
            HandshakeFailure::NoSharedCipher
        } else if is(&[
            ffi::SSL_R_UNSUPPORTED_PROTOCOL,
            ffi::SSL_R_TLSV1_ALERT_PROTOCOL_VERSION,
        ]) {
            HandshakeFailure::ProtocolVersion
        } else if is(&[
            ffi::SSL_R_HTTP_REQUEST,
            ffi::SSL_R_WRONG_VERSION_NUMBER,
            ffi::SSL_R_UNKNOWN_PROTOCOL,
            ffi::SSL_R_HTTPS_PROXY_REQUEST,
        ]) {
            HandshakeFailure::NotTls
        } else if reason == ffi::SSL_R_PRIVATE_KEY_OPERATION_FAILED {
            HandshakeFailure::Signing
        } else if reason >= ffi::SSL_AD_REASON_OFFSET {
            // BoringSSL reports an alert from the peer as this offset plus the alert.
            HandshakeFailure::ClientAlert
        } else if facts.closed {
            HandshakeFailure::ClientClosed
        } else {
            HandshakeFailure::Other
        }
    }
}

/// What BoringSSL and the socket say about a failed handshake.
#[derive(Debug, Default, Clone, Copy)]
pub struct FailureFacts {
    /// The reason code (`SSL_R_*`) of the failed step, if BoringSSL gave one.
    pub reason: Option<i32>,
    /// The client certificate's verification error (`X509_V_ERR_*`), if it failed.
    pub verify: Option<i32>,
    /// The connection ended under the handshake: end of stream, reset, broken pipe.
    pub closed: bool,
}

impl FailureFacts {
    pub fn of<S: std::fmt::Debug>(error: &tokio_boring::HandshakeError<S>) -> FailureFacts {
        let ssl = error.ssl();
        let closed = match error.as_io_error() {
            Some(io) => matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
            ),
            // A system-call error without an I/O error: the peer closed the connection.
            None => error.code() == Some(boring::ssl::ErrorCode::SYSCALL),
        };
        FailureFacts {
            reason: ssl_reason(error),
            verify: ssl.and_then(|ssl| ssl.verify_result().err().map(|e| e.as_raw())),
            closed,
        }
    }
}

/// The reason code (`SSL_R_*`) of the failed step: the newest error on the stack that
/// BoringSSL left and the handshake's error took with it, if the SSL library set it.
fn ssl_reason<S: std::fmt::Debug>(error: &tokio_boring::HandshakeError<S>) -> Option<i32> {
    let ssl_error = std::error::Error::source(error)?.downcast_ref::<boring::ssl::Error>()?;
    let newest = ssl_error.ssl_error()?.errors().last()?;
    newest.library_reason(boring_sys::ERR_LIB_SSL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_reasons_are_classified() {
        use boring_sys as ffi;
        let reason = |code: i32| FailureFacts {
            reason: Some(code),
            ..FailureFacts::default()
        };
        for (facts, class) in [
            (
                reason(ffi::SSL_R_NO_SHARED_CIPHER),
                HandshakeFailure::NoSharedCipher,
            ),
            (
                reason(ffi::SSL_R_UNSUPPORTED_PROTOCOL),
                HandshakeFailure::ProtocolVersion,
            ),
            (reason(ffi::SSL_R_HTTP_REQUEST), HandshakeFailure::NotTls),
            // TLSV1_ALERT_UNKNOWN_CA: the client refused our certificate.
            (
                reason(ffi::SSL_AD_REASON_OFFSET + 48),
                HandshakeFailure::ClientAlert,
            ),
            (
                reason(ffi::SSL_R_CONNECTION_REJECTED),
                HandshakeFailure::UnknownSni,
            ),
            (
                reason(ffi::SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE),
                HandshakeFailure::ClientCertificate,
            ),
            (
                FailureFacts {
                    reason: Some(ffi::SSL_R_CERTIFICATE_VERIFY_FAILED),
                    verify: Some(ffi::X509_V_ERR_CERT_REVOKED),
                    closed: false,
                },
                HandshakeFailure::ClientCertRevoked,
            ),
            (
                FailureFacts {
                    closed: true,
                    ..FailureFacts::default()
                },
                HandshakeFailure::ClientClosed,
            ),
            (FailureFacts::default(), HandshakeFailure::Other),
        ] {
            assert_eq!(HandshakeFailure::classify(&facts), class, "{facts:?}");
        }
    }
}
