//! OCSP stapling from a file: a DER-encoded OCSP response per certificate, checked before
//! it is stapled. A response that is not for this certificate, not "good", or outside its
//! validity window is not stapled (stapling a bad response makes strict clients fail);
//! the reason is logged and counted.

use std::time::{Duration, SystemTime};

use boring::x509::X509Ref;
use der::Decode;
use x509_ocsp::{BasicOcspResponse, CertStatus, OcspResponse, OcspResponseStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OcspProblem {
    Unparsable,
    NotSuccessful,
    /// No single response names this certificate's serial number.
    WrongCertificate,
    /// The certificate is revoked or unknown to the responder.
    NotGood,
    /// `nextUpdate` has passed.
    Stale,
    /// `thisUpdate` is in the future.
    NotYetValid,
}

impl OcspProblem {
    pub fn label(self) -> &'static str {
        match self {
            OcspProblem::Unparsable => "unparsable",
            OcspProblem::NotSuccessful => "not_successful",
            OcspProblem::WrongCertificate => "wrong_certificate",
            OcspProblem::NotGood => "not_good",
            OcspProblem::Stale => "stale",
            OcspProblem::NotYetValid => "not_yet_valid",
        }
    }
}

fn trim_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

/// Whether `response` may be stapled for `leaf` at time `now`.
/// (The responder's signature is the client's to check, as with any stapled response.)
pub fn check(response: &[u8], leaf: &X509Ref, now: SystemTime) -> Result<(), OcspProblem> {
    let response = OcspResponse::from_der(response).map_err(|_| OcspProblem::Unparsable)?;
    if response.response_status != OcspResponseStatus::Successful {
        return Err(OcspProblem::NotSuccessful);
    }
    let bytes = response.response_bytes.ok_or(OcspProblem::NotSuccessful)?;
    let basic = BasicOcspResponse::from_der(bytes.response.as_bytes())
        .map_err(|_| OcspProblem::Unparsable)?;
    let serial = leaf
        .serial_number()
        .to_bn()
        .map(|bn| bn.to_vec())
        .map_err(|_| OcspProblem::Unparsable)?;
    let single = basic
        .tbs_response_data
        .responses
        .iter()
        .find(|r| trim_zeros(r.cert_id.serial_number.as_bytes()) == trim_zeros(&serial))
        .ok_or(OcspProblem::WrongCertificate)?;
    if !matches!(single.cert_status, CertStatus::Good(_)) {
        return Err(OcspProblem::NotGood);
    }
    let since_epoch = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    if single.this_update.0.to_unix_duration() > since_epoch + Duration::from_secs(300) {
        return Err(OcspProblem::NotYetValid);
    }
    if let Some(next) = &single.next_update {
        if next.0.to_unix_duration() <= since_epoch {
            return Err(OcspProblem::Stale);
        }
    }
    Ok(())
}
