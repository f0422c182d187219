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

use tlsterm_engine::{x25519_server_shares, X25519Kernel};

use super::{batch_size_table, measure, median, paired_ratio, progress, SpeedArgs};
use crate::offload::key_share::{compute, encapsulate, hybrid, split_hybrid, Group};

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

/// The multi-buffer X25519 kernels to measure: those this CPU has, but not the portable
/// reference (slower than aws-lc; `serve` never batches with it).
fn kernels() -> Vec<X25519Kernel> {
    X25519Kernel::ALL
        .into_iter()
        .filter(|k| *k != X25519Kernel::Portable && k.is_available())
        .collect()
}

/// `n` server shares for the same client share through `kernel`, as `serve` computes a
/// batch of them: the X25519 part in the kernel, ML-KEM-768 one by one by aws-lc.
fn engine_shares(kernel: X25519Kernel, group: Group, client: &Client, n: usize) {
    match group {
        Group::X25519 => {
            let peer: [u8; 32] = client.share.as_slice().try_into().expect("32 bytes");
            for share in x25519_server_shares(kernel, &vec![peer; n]) {
                share.expect("engine key share");
            }
        }
        Group::X25519MlKem768 => {
            let (mlkem, peer) = split_hybrid(&client.share).expect("a hybrid share");
            let encapsulations: Vec<_> = (0..n)
                .map(|_| encapsulate(mlkem).expect("ML-KEM"))
                .collect();
            let shares = x25519_server_shares(kernel, &vec![peer; n]);
            for (encapsulation, share) in encapsulations.into_iter().zip(shares) {
                let share = share.expect("engine key share");
                hybrid(encapsulation, &share.public, &*share.shared);
            }
        }
        // No kernel: aws-lc's figure stands.
        Group::P256 => {
            for _ in 0..n {
                compute(group, &client.share).expect("aws-lc key share");
            }
        }
    }
}

/// One row of the table: a group's operations per second of each round, per column.
struct Row {
    name: &'static str,
    boringssl: Vec<f64>,
    aws_lc: Vec<f64>,
    kernels: Vec<Vec<f64>>,
}

/// Measures every key-share algorithm in `names` and prints their table.
pub(super) fn run(args: &SpeedArgs, names: &[&str]) -> anyhow::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let kernels = kernels();
    let lanes = tlsterm_engine::LANES;
    if args.batch_sizes {
        return batch_sizes(args, names, &kernels);
    }
    let mut rows = Vec::new();
    for &name in NAMES.iter().filter(|n| names.contains(n)) {
        let group = group(name).expect("a known name");
        let client = Client::new(group)?;
        let mut row = Row {
            name,
            boringssl: Vec::new(),
            aws_lc: Vec::new(),
            kernels: vec![Vec::new(); kernels.len()],
        };
        for round in 1..=args.rounds {
            progress(&format!("{name}: round {round}: BoringSSL"));
            row.boringssl.push(
                measure(args.seconds, args.elapsed, 1, || {
                    boringssl_share(group, &client).expect("BoringSSL key share");
                })
                .0,
            );
            progress(&format!("{name}: round {round}: aws-lc-rs"));
            row.aws_lc.push(
                measure(args.seconds, args.elapsed, 1, || {
                    compute(group, &client.share).expect("aws-lc key share");
                })
                .0,
            );
            for (runs, &kernel) in row.kernels.iter_mut().zip(&kernels) {
                progress(&format!(
                    "{name}: round {round}: batch of {lanes} ({})",
                    kernel.name()
                ));
                runs.push(
                    measure(args.seconds, args.elapsed, lanes, || {
                        engine_shares(kernel, group, &client, lanes)
                    })
                    .0,
                );
            }
        }
        rows.push(row);
    }
    if let Some(unknown) = names.iter().find(|n| group(n).is_none()) {
        bail!("unknown key-share algorithm {unknown:?}");
    }
    progress("");
    print_table(&rows, &kernels);
    Ok(())
}

fn print_table(rows: &[Row], kernels: &[X25519Kernel]) {
    let mut header = format!(
        "{:<15} {:>12} {:>7} {:>12} {:>7} {:>6}",
        "key share", "BoringSSL/s", "us", "aws-lc-rs/s", "us", "ratio"
    );
    for kernel in kernels {
        header += &format!(
            " {:>14} {:>7} {:>6}",
            format!("{}/s", kernel.name()),
            "us",
            "ratio"
        );
    }
    println!("{header}");
    for row in rows {
        let boringssl = median(&row.boringssl).unwrap_or(0.0);
        let mut line = format!(
            "{:<15} {boringssl:>12.0} {:>7.1}",
            row.name,
            1e6 / boringssl
        );
        for runs in std::iter::once(&row.aws_lc).chain(&row.kernels) {
            let ops = median(runs).unwrap_or(0.0);
            let ratio = paired_ratio(&row.boringssl, runs).map_or(0.0, |r| r.median);
            line += &format!(" {ops:>12.0} {:>7.1} {ratio:>6.2}", 1e6 / ops);
        }
        println!("{line}");
    }
    println!(
        "key share: the server's half (key generation and agreement; for X25519MLKEM768 \
         also ML-KEM-768 encapsulation, by aws-lc in every tlsterm column); ratio: over \
         BoringSSL; kernel columns: batches of {} (P-256 has no kernel: aws-lc)",
        tlsterm_engine::LANES
    );
}

/// X25519 batches of 1..=8 through each kernel against aws-lc one by one: where batching
/// starts to pay (`[engine] x25519_small_batch_threshold`).
fn batch_sizes(args: &SpeedArgs, names: &[&str], kernels: &[X25519Kernel]) -> anyhow::Result<()> {
    if !names.contains(&"x25519") {
        return Ok(());
    }
    let client = Client::new(Group::X25519)?;
    progress("x25519: aws-lc-rs");
    let single = measure(args.seconds, args.elapsed, 1, || {
        compute(Group::X25519, &client.share).expect("aws-lc key share");
    });
    for &kernel in kernels {
        batch_size_table(
            args,
            &format!("x25519, kernel {}", kernel.name()),
            "aws-lc-rs",
            single,
            |n| engine_shares(kernel, Group::X25519, &client, n),
        );
    }
    Ok(())
}
