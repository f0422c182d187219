//! OCSP responses, from a file or fetched (`ocsp_fetch`), are checked before they are
//! stapled. A response that is not for this certificate, not "good", or outside its
//! validity window is not stapled (stapling a bad response makes strict clients fail);
//! the reason is logged and counted. The request for a fetch is built here too.

use std::time::{Duration, SystemTime};

use boring::x509::X509Ref;
use der::Decode;
use x509_ocsp::{
    BasicOcspResponse, CertId, CertStatus, OcspRequest, OcspResponse, OcspResponseStatus, Request,
    TbsRequest,
};

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

/// The validity window of a response that may be stapled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub this_update: SystemTime,
    /// `None`: the responder always has newer information (RFC 6960 4.2.2.1).
    pub next_update: Option<SystemTime>,
}

/// Whether `response` may be stapled for `leaf` at time `now`.
/// (The responder's signature is the client's to check, as with any stapled response.)
pub fn check(response: &[u8], leaf: &X509Ref, now: SystemTime) -> Result<(), OcspProblem> {
    validity(response, leaf, now).map(|_| ())
}

/// As `check`, returning the response's validity window.
pub fn validity(response: &[u8], leaf: &X509Ref, now: SystemTime) -> Result<Validity, OcspProblem> {
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
    let at =
        |time: &x509_ocsp::OcspGeneralizedTime| SystemTime::UNIX_EPOCH + time.0.to_unix_duration();
    let validity = Validity {
        this_update: at(&single.this_update),
        next_update: single.next_update.as_ref().map(at),
    };
    if validity.this_update > now + Duration::from_secs(300) {
        return Err(OcspProblem::NotYetValid);
    }
    if validity.next_update.is_some_and(|next| next <= now) {
        return Err(OcspProblem::Stale);
    }
    Ok(validity)
}

/// SHA-1: the CertID hash every responder understands (RFC 6960 4.3, RFC 5019 2.1.1).
const SHA1: x509_cert::spki::ObjectIdentifier =
    x509_cert::spki::ObjectIdentifier::new_unwrap("1.3.14.3.2.26");

/// A DER OCSP request for `leaf`, issued by `issuer`: unsigned and without a nonce (RFC 5019),
/// so responders may answer from their cache.
pub fn request(leaf: &X509Ref, issuer: &X509Ref) -> anyhow::Result<Vec<u8>> {
    use der::asn1::{Null, OctetString};
    use der::Encode;
    let parse = |cert: &X509Ref| -> anyhow::Result<x509_cert::Certificate> {
        Ok(x509_cert::Certificate::from_der(&cert.to_der()?)?)
    };
    let sha1 = |bytes: &[u8]| -> anyhow::Result<OctetString> {
        let digest = boring::hash::hash(boring::hash::MessageDigest::sha1(), bytes)?;
        Ok(OctetString::new(digest.to_vec())?)
    };
    let (leaf, issuer) = (parse(leaf)?, parse(issuer)?);
    let issuer = &issuer.tbs_certificate;
    let cert_id = CertId {
        hash_algorithm: x509_cert::spki::AlgorithmIdentifierOwned {
            oid: SHA1,
            parameters: Some(Null.into()),
        },
        issuer_name_hash: sha1(&issuer.subject.to_der()?)?,
        issuer_key_hash: sha1(
            issuer
                .subject_public_key_info
                .subject_public_key
                .raw_bytes(),
        )?,
        serial_number: leaf.tbs_certificate.serial_number,
    };
    let request = OcspRequest {
        tbs_request: TbsRequest {
            request_list: vec![Request {
                req_cert: cert_id,
                single_request_extensions: None,
            }],
            ..TbsRequest::default()
        },
        optional_signature: None,
    };
    Ok(request.to_der()?)
}
