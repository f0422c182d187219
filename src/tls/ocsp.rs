//! OCSP responses, from a file or fetched (`ocsp_fetch`), are checked before they are
//! stapled. A response that is not for this certificate, not "good", outside its
//! validity window, or (when the issuer is known) not signed by the issuer or a responder
//! it delegated to is not stapled (stapling a bad response makes strict clients fail); the
//! reason is logged and counted. The request for a fetch is built here too.

use std::time::{Duration, SystemTime};

use boring::asn1::Asn1Time;
use boring::hash::MessageDigest;
use boring::sign::Verifier;
use boring::ssl::SslRef;
use boring::x509::{X509Ref, X509};
use der::{Decode, Encode};
use x509_cert::ext::pkix::ExtendedKeyUsage;
use x509_cert::spki::ObjectIdentifier;
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
    /// Not signed by the certificate's issuer or a responder it delegated to.
    BadSignature,
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
            OcspProblem::BadSignature => "bad_signature",
        }
    }
}

fn trim_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

/// Staples a checked response on a connection, unless `expires` has passed. Setting it
/// fails only if BoringSSL cannot allocate the copy: the handshake then goes on without a
/// staple, as it would without a response.
pub fn staple_until(ssl: &mut SslRef, der: &[u8], expires: Option<SystemTime>) {
    if expires.is_none_or(|expires| SystemTime::now() < expires) {
        let _ = ssl.set_ocsp_status(der);
    }
}

/// The validity window of a response that may be stapled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub this_update: SystemTime,
    /// `None`: the responder always has newer information (RFC 6960 4.2.2.1).
    pub next_update: Option<SystemTime>,
}

/// The DER of the BasicOCSPResponse inside a successful OCSPResponse.
fn basic_response_der(response: &[u8]) -> Result<Vec<u8>, OcspProblem> {
    let response = OcspResponse::from_der(response).map_err(|_| OcspProblem::Unparsable)?;
    if response.response_status != OcspResponseStatus::Successful {
        return Err(OcspProblem::NotSuccessful);
    }
    let bytes = response.response_bytes.ok_or(OcspProblem::NotSuccessful)?;
    Ok(bytes.response.as_bytes().to_vec())
}

/// The bytes of tbsResponseData as the responder sent them (what it signed): re-encoding
/// the parsed value could differ, e.g. where the responder encoded a DEFAULT value.
fn signed_bytes(basic_der: &[u8]) -> Result<&[u8], OcspProblem> {
    let mut reader = der::SliceReader::new(basic_der).map_err(|_| OcspProblem::Unparsable)?;
    der::Header::decode(&mut reader).map_err(|_| OcspProblem::Unparsable)?;
    der::Reader::tlv_bytes(&mut reader).map_err(|_| OcspProblem::Unparsable)
}

/// The digest of a signature algorithm OCSP responders use (RSA PKCS#1 v1.5 or ECDSA).
fn signature_digest(oid: &ObjectIdentifier) -> Option<MessageDigest> {
    Some(match oid.to_string().as_str() {
        "1.2.840.113549.1.1.5" | "1.2.840.10045.4.1" => MessageDigest::sha1(),
        "1.2.840.113549.1.1.11" | "1.2.840.10045.4.3.2" => MessageDigest::sha256(),
        "1.2.840.113549.1.1.12" | "1.2.840.10045.4.3.3" => MessageDigest::sha384(),
        "1.2.840.113549.1.1.13" | "1.2.840.10045.4.3.4" => MessageDigest::sha512(),
        _ => return None,
    })
}

/// The extended key usage extension (RFC 5280 4.2.1.12).
const EXTENDED_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
/// id-kp-OCSPSigning (RFC 6960 4.2.2.2): what a delegated responder certificate must have.
const OCSP_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.9");

/// A certificate in the response that `issuer` signed, for OCSP signing, valid now.
fn delegated_responder(cert: &x509_cert::Certificate, issuer: &X509Ref) -> Option<X509> {
    let ocsp_signing = cert
        .tbs_certificate
        .extensions
        .iter()
        .flatten()
        .filter(|ext| ext.extn_id == EXTENDED_KEY_USAGE)
        .filter_map(|ext| ExtendedKeyUsage::from_der(ext.extn_value.as_bytes()).ok())
        .any(|eku| eku.0.contains(&OCSP_SIGNING));
    let cert = X509::from_der(&cert.to_der().ok()?).ok()?;
    let now = Asn1Time::days_from_now(0).ok()?;
    let current = cert.not_before() <= now && now <= cert.not_after();
    let signed = cert.verify(&*issuer.public_key().ok()?).unwrap_or(false);
    (ocsp_signing && current && signed).then_some(cert)
}

/// Whether a response (`basic`, parsed from `der`) is signed by `issuer`, or by a responder
/// certificate (carried in the response) to which `issuer` delegated OCSP signing. A
/// client checks this too: stapling a response it cannot verify only makes strict clients
/// fail.
fn verify_signature(
    der: &[u8],
    basic: &BasicOcspResponse,
    issuer: &X509Ref,
) -> Result<(), OcspProblem> {
    let signed = signed_bytes(der)?;
    let digest =
        signature_digest(&basic.signature_algorithm.oid).ok_or(OcspProblem::BadSignature)?;
    let signature = basic
        .signature
        .as_bytes()
        .ok_or(OcspProblem::BadSignature)?;
    let verifies = |signer: &X509Ref| -> bool {
        let check = || -> Result<bool, boring::error::ErrorStack> {
            let key = signer.public_key()?;
            let mut verifier = Verifier::new(digest, &key)?;
            verifier.update(signed)?;
            verifier.verify(signature)
        };
        check().unwrap_or(false)
    };
    if verifies(issuer) {
        return Ok(());
    }
    let delegated = basic.certs.iter().flatten();
    if delegated
        .filter_map(|cert| delegated_responder(cert, issuer))
        .any(|cert| verifies(&cert))
    {
        return Ok(());
    }
    Err(OcspProblem::BadSignature)
}

/// Whether `response` may be stapled for `leaf` at time `now`: signed by `issuer` (or a
/// responder it delegated to) when the issuer is known, for this certificate, "good", and
/// current.
pub fn check(
    response: &[u8],
    leaf: &X509Ref,
    issuer: Option<&X509Ref>,
    now: SystemTime,
) -> Result<(), OcspProblem> {
    validity(response, leaf, issuer, now).map(|_| ())
}

/// As `check`, returning the response's validity window.
pub fn validity(
    response: &[u8],
    leaf: &X509Ref,
    issuer: Option<&X509Ref>,
    now: SystemTime,
) -> Result<Validity, OcspProblem> {
    let der = basic_response_der(response)?;
    let basic = BasicOcspResponse::from_der(&der).map_err(|_| OcspProblem::Unparsable)?;
    if let Some(issuer) = issuer {
        verify_signature(&der, &basic, issuer)?;
    }
    let serial = leaf
        .serial_number()
        .to_bn()
        .map(|bn| bn.to_vec())
        .map_err(|_| OcspProblem::Unparsable)?;
    // With the issuer known, the CertID must name it too: a serial alone is unique only
    // per issuer.
    let single = basic
        .tbs_response_data
        .responses
        .iter()
        .filter(|r| issuer.is_none_or(|issuer| names_issuer(&r.cert_id, issuer)))
        .find(|r| trim_zeros(r.cert_id.serial_number.as_bytes()) == trim_zeros(&serial))
        .ok_or(OcspProblem::WrongCertificate)?;
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
    // After the time checks: an old "revoked" or "unknown" must not withdraw a current
    // good staple (the fetcher withdraws it on NotGood).
    if !matches!(single.cert_status, CertStatus::Good(_)) {
        return Err(OcspProblem::NotGood);
    }
    Ok(validity)
}

/// SHA-1: the CertID hash every responder understands (RFC 6960 4.3, RFC 5019 2.1.1).
const SHA1: x509_cert::spki::ObjectIdentifier =
    x509_cert::spki::ObjectIdentifier::new_unwrap("1.3.14.3.2.26");

/// SHA-256, which responders may use in CertIDs too.
const SHA256: x509_cert::spki::ObjectIdentifier =
    x509_cert::spki::ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");

fn parse_certificate(cert: &X509Ref) -> anyhow::Result<x509_cert::Certificate> {
    Ok(x509_cert::Certificate::from_der(&cert.to_der()?)?)
}

/// The CertID hashes of `issuer` with `digest`: of its name, and of its public key.
fn issuer_hashes(issuer: &X509Ref, digest: MessageDigest) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let issuer = parse_certificate(issuer)?;
    let tbs = &issuer.tbs_certificate;
    let name = boring::hash::hash(digest, &tbs.subject.to_der()?)?;
    let key = tbs.subject_public_key_info.subject_public_key.raw_bytes();
    let key = boring::hash::hash(digest, key)?;
    Ok((name.to_vec(), key.to_vec()))
}

/// Whether a CertID names `issuer` (SHA-1 or SHA-256 hashes of its name and key).
fn names_issuer(id: &CertId, issuer: &X509Ref) -> bool {
    let digest = match id.hash_algorithm.oid {
        oid if oid == SHA1 => MessageDigest::sha1(),
        oid if oid == SHA256 => MessageDigest::sha256(),
        _ => return false,
    };
    issuer_hashes(issuer, digest).is_ok_and(|(name, key)| {
        id.issuer_name_hash.as_bytes() == name && id.issuer_key_hash.as_bytes() == key
    })
}

/// A DER OCSP request for `leaf`, issued by `issuer`: unsigned and without a nonce (RFC 5019),
/// so responders may answer from their cache.
pub fn request(leaf: &X509Ref, issuer: &X509Ref) -> anyhow::Result<Vec<u8>> {
    use der::asn1::{Null, OctetString};
    let (name_hash, key_hash) = issuer_hashes(issuer, MessageDigest::sha1())?;
    let cert_id = CertId {
        hash_algorithm: x509_cert::spki::AlgorithmIdentifierOwned {
            oid: SHA1,
            parameters: Some(Null.into()),
        },
        issuer_name_hash: OctetString::new(name_hash)?,
        issuer_key_hash: OctetString::new(key_hash)?,
        serial_number: parse_certificate(leaf)?.tbs_certificate.serial_number,
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
