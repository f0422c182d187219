//! `tlsterm speed x25519 x25519mlkem768 p256ecdh p384ecdh ecdsap384`: the operations that
//! `serve` takes from BoringSSL to aws-lc or a curve kernel, per second on the calling
//! thread, against BoringSSL: the server's half of a TLS 1.3 key exchange (key generation
//! and agreement, or ML-KEM encapsulation; aws-lc's is handed to BoringSSL as a hint), and
//! ECDSA P-384 signatures (which have no kernel: aws-lc signs them one at a time). Each
//! multi-buffer kernel that has the group adds a column.

use anyhow::bail;
use boring::derive::Deriver;
use boring::ec::{EcGroup, EcKey, PointConversionForm};
use boring::mlkem::{Algorithm as MlKem, MlKemPublicKey};
use boring::nid::Nid;
use boring::pkey::{Id, PKey, Private};

use tlsterm_engine::{mlkem768_encapsulate_batch, x25519_server_shares, MlKemKernel, X25519Kernel};

use super::{batch_size_table, measure, median, paired_ratio, progress, SpeedArgs, SpeedKernel};
use crate::config::EngineConfig;
use crate::offload::key_share::{compute, encapsulate, hybrid, split_hybrid, Encapsulation, Group};
use crate::offload::{HashAlg, OffloadSettings, Scheme, SigningKey};

/// The algorithms of this table.
pub(super) const NAMES: [&str; 5] = [
    "x25519",
    "x25519mlkem768",
    "p256ecdh",
    "p384ecdh",
    "ecdsap384",
];

/// What ECDSA P-384 signs in `tlsterm speed`, as its RSA and P-256 rows do.
const P384_MESSAGE: &[u8] = &[0x5a; 100];

fn group(name: &str) -> Option<Group> {
    match name {
        "x25519" => Some(Group::X25519),
        "x25519mlkem768" => Some(Group::X25519MlKem768),
        "p256ecdh" => Some(Group::P256),
        "p384ecdh" => Some(Group::P384),
        _ => None,
    }
}

/// A client of `group`: its share as sent, and the same keys for BoringSSL's API.
struct Client {
    share: Vec<u8>,
    x25519: PKey<Private>,
    /// The client's key of a NIST curve group (P-256 for the others, unused).
    nist: PKey<Private>,
    mlkem: Option<MlKemPublicKey>,
}

impl Client {
    fn new(group: Group) -> anyhow::Result<Client> {
        let x25519 = PKey::generate(Id::X25519)?;
        let nist = PKey::from_ec_key(EcKey::generate(&*nist_group(group)?)?)?;
        let mut raw = [0u8; 32];
        let x25519_share = x25519.raw_public_key(&mut raw)?.to_vec();
        let (share, mlkem) = match group {
            Group::X25519 => (x25519_share, None),
            Group::P256 | Group::P384 => (point_bytes(&nist)?, None),
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
            nist,
            mlkem,
        })
    }
}

/// The curve of a NIST group (P-256 for the groups that have none).
fn nist_group(group: Group) -> anyhow::Result<EcGroup> {
    let curve = match group {
        Group::P384 => Nid::SECP384R1,
        _ => Nid::X9_62_PRIME256V1,
    };
    Ok(EcGroup::from_curve_name(curve)?)
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
        Group::P256 | Group::P384 => {
            let key = PKey::from_ec_key(EcKey::generate(&*nist_group(group)?)?)?;
            let public = point_bytes(&key)?;
            let mut deriver = Deriver::new(&key)?;
            deriver.set_peer(&client.nist)?;
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

/// The X25519 kernels to measure: those `--kernel` names, or else the multi-buffer ones this
/// CPU has, but not the portable reference (slower than aws-lc; `serve` never batches with
/// it).
fn kernels(asked: &[SpeedKernel]) -> Vec<X25519Kernel> {
    X25519Kernel::ALL
        .into_iter()
        .filter(|k| match asked.is_empty() {
            true => *k != X25519Kernel::Portable,
            false => asked.iter().any(|a| x25519_kernel(*a) == Some(*k)),
        })
        .filter(|k| k.is_available())
        .collect()
}

/// The X25519 kernel of a `--kernel` name, if it has one.
fn x25519_kernel(kernel: SpeedKernel) -> Option<X25519Kernel> {
    match kernel {
        SpeedKernel::Ifma => Some(X25519Kernel::Ifma),
        SpeedKernel::Portable => Some(X25519Kernel::Portable),
        SpeedKernel::Avx512 | SpeedKernel::Avx2 => None,
    }
}

/// The ML-KEM kernel in which `serve`, with its default settings on this CPU, encapsulates
/// the ML-KEM halves of a full batch of key shares; `None`: aws-lc, one by one.
fn batched_mlkem() -> Option<MlKemKernel> {
    let settings = OffloadSettings::from_config(&EngineConfig::default());
    (settings.mlkem_small_batch_threshold <= tlsterm_engine::LANES).then_some(settings.mlkem_kernel)
}

/// `n` server shares for the same client share through `kernel`, as `serve` computes a
/// full batch of them: the X25519 part in the kernel, ML-KEM-768 in `mlkem` (see
/// [`batched_mlkem`]), or one by one by aws-lc.
fn engine_shares(
    kernel: X25519Kernel,
    mlkem_kernel: Option<MlKemKernel>,
    group: Group,
    client: &Client,
    n: usize,
) {
    match group {
        Group::X25519 => {
            let peer: [u8; 32] = client.share.as_slice().try_into().expect("32 bytes");
            for share in x25519_server_shares(kernel, &vec![peer; n]) {
                share.expect("engine key share");
            }
        }
        Group::X25519MlKem768 => {
            let (mlkem, peer) = split_hybrid(&client.share).expect("a hybrid share");
            let encapsulations: Vec<Encapsulation> = match mlkem_kernel {
                Some(mlkem_kernel) => mlkem768_encapsulate_batch(mlkem_kernel, &vec![mlkem; n])
                    .into_iter()
                    .map(|e| e.expect("ML-KEM").into())
                    .collect(),
                None => (0..n)
                    .map(|_| encapsulate(mlkem).expect("ML-KEM"))
                    .collect(),
            };
            let shares = x25519_server_shares(kernel, &vec![peer; n]);
            for (encapsulation, share) in encapsulations.into_iter().zip(shares) {
                let share = share.expect("engine key share");
                hybrid(encapsulation, &share.public, &*share.shared);
            }
        }
        // No kernel: aws-lc's figure stands.
        Group::P256 | Group::P384 => {
            for _ in 0..n {
                compute(group, &client.share).expect("aws-lc key share");
            }
        }
    }
}

/// One row of the table: an algorithm's operations per second of each round, per column
/// (no kernel column for an algorithm without a kernel).
struct Row {
    name: &'static str,
    boringssl: Vec<f64>,
    aws_lc: Vec<f64>,
    kernels: Vec<Vec<f64>>,
}

/// Measures every algorithm of this table in `names` and prints the table.
pub(super) fn run(args: &SpeedArgs, names: &[&str]) -> anyhow::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let kernels = kernels(&args.kernel);
    if args.batch_sizes {
        return batch_sizes(args, names, &kernels);
    }
    if let Some(unknown) = names.iter().find(|n| !NAMES.contains(n)) {
        bail!("unknown algorithm {unknown:?}");
    }
    let mut rows = Vec::new();
    for &name in NAMES.iter().filter(|n| names.contains(n)) {
        rows.push(match group(name) {
            Some(group) => share_row(args, name, group, &kernels)?,
            None => p384_signature_row(args)?,
        });
    }
    progress("");
    print_table(&rows, &kernels);
    if kernels.is_empty() && rows.iter().any(|row| row.name.starts_with("x25519")) {
        match args.kernel.is_empty() {
            true => println!("{NO_X25519_KERNEL}"),
            false => println!("{NO_X25519_KERNEL_ASKED}"),
        }
    }
    Ok(())
}

/// A key-share row: BoringSSL, aws-lc and each kernel, round after round.
fn share_row(
    args: &SpeedArgs,
    name: &'static str,
    group: Group,
    kernels: &[X25519Kernel],
) -> anyhow::Result<Row> {
    let lanes = tlsterm_engine::LANES;
    let client = Client::new(group)?;
    let mlkem_kernel = batched_mlkem();
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
        for (runs, &kernel) in row.kernels.iter_mut().zip(kernels) {
            progress(&format!(
                "{name}: round {round}: batch of {lanes} ({})",
                kernel.name()
            ));
            runs.push(
                measure(args.seconds, args.elapsed, lanes, || {
                    engine_shares(kernel, mlkem_kernel, group, &client, lanes)
                })
                .0,
            );
        }
    }
    Ok(row)
}

/// ECDSA P-384 (SHA-384) signatures as `serve` makes them: BoringSSL's inline path and
/// aws-lc's, with the same key.
fn p384_signature_row(args: &SpeedArgs) -> anyhow::Result<Row> {
    progress("ecdsap384: generating key");
    let ec = EcKey::generate(&*EcGroup::from_curve_name(Nid::SECP384R1)?)?;
    let key = SigningKey::new(PKey::from_ec_key(ec)?)?;
    let scheme = Scheme::Ecdsa(HashAlg::Sha384);
    let mut row = Row {
        name: "ecdsap384",
        boringssl: Vec::new(),
        aws_lc: Vec::new(),
        kernels: Vec::new(),
    };
    for round in 1..=args.rounds {
        progress(&format!("ecdsap384: round {round}: BoringSSL"));
        row.boringssl.push(
            measure(args.seconds, args.elapsed, 1, || {
                key.sign_inline(scheme, P384_MESSAGE)
                    .expect("BoringSSL signature");
            })
            .0,
        );
        progress(&format!("ecdsap384: round {round}: aws-lc-rs"));
        row.aws_lc.push(
            measure(args.seconds, args.elapsed, 1, || {
                key.sign_aws_lc(scheme, P384_MESSAGE)
                    .expect("a P-384 key for aws-lc")
                    .expect("aws-lc signature");
            })
            .0,
        );
    }
    Ok(row)
}

fn print_table(rows: &[Row], kernels: &[X25519Kernel]) {
    let mut header = format!(
        "{:<15} {:>12} {:>7} {:>12} {:>7} {:>6}",
        "operation", "BoringSSL/s", "us", "aws-lc-rs/s", "us", "ratio"
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
        // A row without a kernel (the columns of the first are the kernels').
        for _ in row.kernels.len()..kernels.len() {
            line += &format!(" {:>14} {:>7} {:>6}", "-", "-", "-");
        }
        println!("{line}");
    }
    println!(
        "key shares: the server's half (key generation and agreement; for X25519MLKEM768 \
         also ML-KEM-768 encapsulation, {}); ecdsap384: a SHA-384 signature; ratio: over \
         BoringSSL; kernel columns: batches of {} (P-256 and P-384 have no kernel: aws-lc)",
        match batched_mlkem() {
            Some(_) => "by the ML-KEM kernel (AVX-512) in kernel columns, by aws-lc else",
            None => "by aws-lc in every tlsterm column: no ML-KEM kernel here",
        },
        tlsterm_engine::LANES
    );
}

/// What `tlsterm speed` says on a CPU without the X25519 kernel (AVX-512 IFMA).
const NO_X25519_KERNEL: &str =
    "no X25519 kernel on this CPU: the engine's needs AVX-512 IFMA, and an AVX2 one was \
     prototyped and not built, as it did not beat aws-lc-rs by 1.3x in every run \
     (docs/BENCHMARKS-engine.md); `serve` computes X25519 with aws-lc-rs, its column here";
/// What it says when `--kernel` names none of the X25519 kernels.
const NO_X25519_KERNEL_ASKED: &str =
    "no X25519 kernel among those --kernel names (X25519's are ifma and portable)";

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
            |n| engine_shares(kernel, None, Group::X25519, &client, n),
        );
    }
    Ok(())
}
