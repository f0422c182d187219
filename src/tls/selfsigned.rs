//! In-memory self-signed certificates for the embedded default configuration.

use boring::asn1::Asn1Time;
use boring::bn::{BigNum, MsbOption};
use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::rsa::Rsa;
use boring::x509::extension::{BasicConstraints, SubjectAlternativeName};
use boring::x509::{X509Builder, X509Name, X509NameBuilder, X509NameRef, X509};

pub enum SelfSignedKey {
    Rsa2048,
    EcdsaP256,
}

/// A fresh key of `kind`.
pub fn new_key(kind: SelfSignedKey) -> anyhow::Result<PKey<Private>> {
    Ok(match kind {
        SelfSignedKey::Rsa2048 => PKey::from_rsa(Rsa::generate(2048)?)?,
        SelfSignedKey::EcdsaP256 => {
            let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
            PKey::from_ec_key(EcKey::generate(&group)?)?
        }
    })
}

/// The subject of a certificate for the DNS name `name`: the name as its Common Name when it
/// fits the 64 characters X.509 allows there (RFC 5280, ub-common-name), else empty. CAs and
/// clients go by the subjectAltName, which always holds the name, so a longer one loses
/// nothing; BoringSSL refuses to write a longer Common Name at all.
pub fn subject_for(name: &str) -> anyhow::Result<X509Name> {
    let mut subject = X509NameBuilder::new()?;
    if name.len() <= 64 {
        subject.append_entry_by_nid(Nid::COMMONNAME, name)?;
    }
    Ok(subject.build())
}

/// A certificate for `key` signed by itself: `subject` as subject and issuer, a random
/// serial, valid for `days` from now, with the extensions `extend` appends (it gets the
/// builder, so a subjectAltName can be built against it).
pub fn sign_self(
    key: &PKey<Private>,
    subject: &X509NameRef,
    days: u32,
    extend: impl FnOnce(&mut X509Builder) -> anyhow::Result<()>,
) -> anyhow::Result<X509> {
    let mut serial = BigNum::new()?;
    serial.rand(120, MsbOption::MAYBE_ZERO, false)?;
    let mut builder = X509::builder()?;
    builder.set_version(2)?;
    let serial = serial.to_asn1_integer()?;
    builder.set_serial_number(&serial)?;
    builder.set_subject_name(subject)?;
    builder.set_issuer_name(subject)?;
    builder.set_pubkey(key)?;
    let (not_before, not_after) = (Asn1Time::days_from_now(0)?, Asn1Time::days_from_now(days)?);
    builder.set_not_before(&not_before)?;
    builder.set_not_after(&not_after)?;
    extend(&mut builder)?;
    builder.sign(key, MessageDigest::sha256())?;
    Ok(builder.build())
}

/// A certificate for `localhost` and 127.0.0.1, valid for a year, with a fresh key.
pub fn generate(kind: SelfSignedKey) -> anyhow::Result<(X509, PKey<Private>)> {
    let key = new_key(kind)?;
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_nid(Nid::COMMONNAME, "localhost")?;
    name.append_entry_by_nid(Nid::ORGANIZATIONNAME, "tlsterm self-signed")?;
    let name = name.build();
    let cert = sign_self(&key, &name, 365, |builder| {
        let constraints = BasicConstraints::new().build()?;
        builder.append_extension(&constraints)?;
        let san = SubjectAlternativeName::new()
            .dns("localhost")
            .ip("127.0.0.1")
            .ip("::1")
            .build(&builder.x509v3_context(None, None))?;
        builder.append_extension(&san)?;
        Ok(())
    })?;
    Ok((cert, key))
}
