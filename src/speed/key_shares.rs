//! `tlsterm speed x25519 x25519mlkem768 p256ecdh`: the server's half of a TLS 1.3 key
//! exchange (key generation and agreement, or ML-KEM encapsulation), per second on the
//! calling thread: BoringSSL (what it computes inline in a handshake), aws-lc (what
//! `serve` hands BoringSSL as a hint), and each multi-buffer kernel that has the group.

use anyhow::bail;
use boring::derive::Deriver;
use boring::ec::{EcGroup, EcKey, PointConversionForm};
use boring::mlkem::{Algorithm as MlKem, MlKemPublicKey};
use boring::nid::Nid;
use boring::pkey::{Id, PKey, Private};

use super::{measure, median, paired_ratio, progress, SpeedArgs};
use crate::offload::key_share::{compute, Group};

/// The key-share algorithms `tlsterm speed` knows.
pub(super) const NAMES: [&str; 3] = ["x25519", "x25519mlkem768", "p256ecdh"];

fn group(name: &str) -> Option<Group> {
    match name {
        "x25519" => Some(Group::X25519),
        "x25519mlkem768" => Some(Group::X25519MlKem768),
        "p256ecdh" => Some(Group::P256),
        _ => None,
    }
}

/// A client of `group`: its share as sent, and the same keys for BoringSSL's API.
struct Client {
    share: Vec<u8>,
    x25519: PKey<Private>,
    p256: PKey<Private>,
    mlkem: Option<MlKemPublicKey>,
}

impl Client {
    fn new(group: Group) -> anyhow::Result<Client> {
        let x25519 = PKey::generate(Id::X25519)?;
        let p256 = PKey::from_ec_key(EcKey::generate(&*p256_group()?)?)?;
        let mut raw = [0u8; 32];
        let x25519_share = x25519.raw_public_key(&mut raw)?.to_vec();
        let (share, mlkem) = match group {
            Group::X25519 => (x25519_share, None),
            Group::P256 => (point_bytes(&p256)?, None),
            Group::X25519MlKem768 => {
                let (public, _private) = boring::mlkem::MlKemPrivateKey::generate(MlKem::MlKem768)?;
                let mut share = public.as_bytes().to_vec();
                share.extend_from_slice(&x25519_share);
                (share, Some(public))
            }
        };
        Ok(Client {
            share,
            x25519,
            p256,
            mlkem,
        })
    }
}

fn p256_group() -> anyhow::Result<EcGroup> {
    Ok(EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?)
}

fn point_bytes(key: &PKey<Private>) -> anyhow::Result<Vec<u8>> {
    let ec = key.ec_key()?;
    let mut ctx = boring::bn::BigNumContext::new()?;
    Ok(ec
        .public_key()
        .to_bytes(ec.group(), PointConversionForm::UNCOMPRESSED, &mut ctx)?)
}

/// BoringSSL's server share through its public API: a fresh key pair, its public value,
/// and the agreement (plus, for the hybrid, the ML-KEM encapsulation).
fn boringssl_share(group: Group, client: &Client) -> anyhow::Result<usize> {
    let x25519 = || -> anyhow::Result<usize> {
        let key = PKey::generate(Id::X25519)?;
        let mut public = [0u8; 32];
        key.raw_public_key(&mut public)?;
        let mut deriver = Deriver::new(&key)?;
        deriver.set_peer(&client.x25519)?;
        Ok(deriver.derive_to_vec()?.len())
    };
    Ok(match group {
        Group::X25519 => x25519()?,
        Group::P256 => {
            let key = PKey::from_ec_key(EcKey::generate(&*p256_group()?)?)?;
            let public = point_bytes(&key)?;
            let mut deriver = Deriver::new(&key)?;
            deriver.set_peer(&client.p256)?;
            public.len() + deriver.derive_to_vec()?.len()
        }
        Group::X25519MlKem768 => {
            let parsed = MlKemPublicKey::from_slice(
                MlKem::MlKem768,
                client.mlkem.as_ref().expect("an ML-KEM client").as_bytes(),
            )?;
            let (ciphertext, _secret) = parsed.encapsulate()?;
            ciphertext.len() + x25519()?
        }
    })
}

/// Measures every key-share algorithm in `names` and prints their table.
pub(super) fn run(args: &SpeedArgs, names: &[&str]) -> anyhow::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let mut rows = Vec::new();
    for &name in names {
        let Some(group) = group(name) else {
            bail!("unknown key-share algorithm {name:?}");
        };
        let client = Client::new(group)?;
        let (mut boringssl, mut aws_lc) = (Vec::new(), Vec::new());
        for round in 1..=args.rounds {
            progress(&format!("{name}: round {round}: BoringSSL"));
            boringssl.push(
                measure(args.seconds, args.elapsed, 1, || {
                    boringssl_share(group, &client).expect("BoringSSL key share");
                })
                .0,
            );
            progress(&format!("{name}: round {round}: aws-lc-rs"));
            aws_lc.push(
                measure(args.seconds, args.elapsed, 1, || {
                    compute(group, &client.share).expect("aws-lc key share");
                })
                .0,
            );
        }
        rows.push((name, boringssl, aws_lc));
    }
    progress("");
    println!(
        "{:<15} {:>13} {:>9} {:>13} {:>9} {:>7}",
        "key share", "BoringSSL/s", "us", "aws-lc-rs/s", "us", "ratio"
    );
    for (name, boringssl, aws_lc) in rows {
        let (b, a) = (
            median(&boringssl).unwrap_or(0.0),
            median(&aws_lc).unwrap_or(0.0),
        );
        let ratio = paired_ratio(&boringssl, &aws_lc).map_or(0.0, |r| r.median);
        println!(
            "{name:<15} {b:>13.0} {:>9.1} {a:>13.0} {:>9.1} {ratio:>7.2}",
            1e6 / b,
            1e6 / a
        );
    }
    println!(
        "key share: the server's half (key generation and agreement; for X25519MLKEM768 \
         also ML-KEM-768 encapsulation); ratio: aws-lc-rs over BoringSSL"
    );
    Ok(())
}
