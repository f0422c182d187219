//! `--mode record`: TLS record-layer throughput of BoringSSL (tlsterm's TLS stack)
//! in memory, per cipher. A client and a server `SslStream` talk over an in-memory
//! pipe; the server encrypts ("send") and the client decrypts ("receive") records of
//! `--record-size` bytes. Time is this thread's CPU time (user + system), as
//! `openssl speed` divides by CPU time by default.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::rc::Rc;

use anyhow::{bail, Context};
use boring::asn1::Asn1Time;
use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslMethod, SslStream, SslVerifyMode, SslVersion,
};
use boring::x509::{X509Name, X509};
use serde::Serialize;

use crate::BenchArgs;

/// One direction of an in-memory duplex: reads from `rx`, writes to `tx`.
struct Pipe {
    rx: Rc<RefCell<VecDeque<u8>>>,
    tx: Rc<RefCell<VecDeque<u8>>>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut rx = self.rx.borrow_mut();
        if rx.is_empty() {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        rx.read(buf)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx.borrow_mut().extend(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn pipe_pair() -> (Pipe, Pipe) {
    let a = Rc::new(RefCell::new(VecDeque::new()));
    let b = Rc::new(RefCell::new(VecDeque::new()));
    (
        Pipe {
            rx: a.clone(),
            tx: b.clone(),
        },
        Pipe { rx: b, tx: a },
    )
}

fn self_signed() -> anyhow::Result<(X509, PKey<Private>)> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    let key = PKey::from_ec_key(EcKey::generate(&group)?)?;
    let mut name = X509Name::builder()?;
    name.append_entry_by_text("CN", "localhost")?;
    let name = name.build();
    let mut b = X509::builder()?;
    b.set_version(2)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(&name)?;
    b.set_pubkey(&key)?;
    let (nb, na) = (Asn1Time::days_from_now(0)?, Asn1Time::days_from_now(1)?);
    b.set_not_before(&nb)?;
    b.set_not_after(&na)?;
    b.sign(&key, MessageDigest::sha256())?;
    Ok((b.build(), key))
}

/// A connected (client, server) pair using `cipher` (TLS 1.2) or TLS 1.3's default.
fn connected_pair(
    cipher: Option<&str>,
    cert: &X509,
    key: &PKey<Private>,
) -> anyhow::Result<(SslStream<Pipe>, SslStream<Pipe>)> {
    let version = if cipher.is_some() {
        SslVersion::TLS1_2
    } else {
        SslVersion::TLS1_3
    };
    let ctx = |server: bool| -> anyhow::Result<SslContext> {
        let mut b = SslContextBuilder::new(SslMethod::tls())?;
        b.set_min_proto_version(Some(version))?;
        b.set_max_proto_version(Some(version))?;
        if let Some(c) = cipher {
            b.set_cipher_list(c)?;
        }
        if server {
            b.set_certificate(cert)?;
            b.set_private_key(key)?;
        } else {
            b.set_verify(SslVerifyMode::NONE);
        }
        Ok(b.build())
    };
    let (cp, sp) = pipe_pair();
    let (cctx, sctx) = (ctx(false)?, ctx(true)?);
    let mut client = SslStream::new(Ssl::new(&cctx)?, cp)?;
    let mut server = SslStream::new(Ssl::new(&sctx)?, sp)?;
    let (mut c_done, mut s_done) = (false, false);
    for _ in 0..20 {
        if !c_done {
            match client.connect() {
                Ok(()) => c_done = true,
                Err(e) if e.code() == ErrorCode::WANT_READ => {}
                Err(e) => bail!("client handshake: {e}"),
            }
        }
        if !s_done {
            match server.accept() {
                Ok(()) => s_done = true,
                Err(e) if e.code() == ErrorCode::WANT_READ => {}
                Err(e) => bail!("server handshake: {e}"),
            }
        }
        if c_done && s_done {
            return Ok((client, server));
        }
    }
    bail!("in-memory handshake did not finish")
}

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[derive(Serialize, Debug)]
pub struct RecordResult {
    pub cipher: String,
    pub version: String,
    pub record_size: usize,
    pub bytes: u64,
    /// Server-side encryption (SSL_write) in MB (10^6 bytes) per CPU-second.
    pub send_mb_per_cpu_s: f64,
    /// Client-side decryption (SSL_read) in MB per CPU-second.
    pub recv_mb_per_cpu_s: f64,
}

/// Push `total` bytes from server to client, timing each side.
pub fn measure(
    cipher: Option<&str>,
    record_size: usize,
    total: u64,
) -> anyhow::Result<RecordResult> {
    // Writes are batched by size: an empty record would divide by zero.
    if record_size == 0 {
        bail!("--record-size must be at least 1");
    }
    let (cert, key) = self_signed()?;
    let (mut client, mut server) = connected_pair(cipher, &cert, &key)?;
    let chunk = vec![0x5au8; record_size];
    let mut buf = vec![0u8; 64 * 1024];
    // Writes per batch: keeps the in-memory ciphertext at ~1 MiB (cache-resident).
    let batch = ((1usize << 20) / record_size).max(1);
    let (mut send_s, mut recv_s, mut moved) = (0.0, 0.0, 0u64);
    let mut round = |count: bool| -> anyhow::Result<()> {
        let t0 = thread_cpu_seconds();
        for _ in 0..batch {
            server.ssl_write(&chunk).context("ssl_write")?;
        }
        let t1 = thread_cpu_seconds();
        let mut got = 0usize;
        while got < batch * record_size {
            match client.ssl_read(&mut buf) {
                Ok(n) => got += n,
                Err(e) if e.code() == ErrorCode::WANT_READ => bail!("short read"),
                Err(e) => bail!("ssl_read: {e}"),
            }
        }
        let t2 = thread_cpu_seconds();
        if count {
            send_s += t1 - t0;
            recv_s += t2 - t1;
            moved += got as u64;
        }
        Ok(())
    };
    for _ in 0..4 {
        round(false)?; // warm-up
    }
    for _ in 0..total.div_ceil((batch * record_size) as u64) {
        round(true)?;
    }
    let ssl = client.ssl();
    Ok(RecordResult {
        cipher: ssl
            .current_cipher()
            .map(|c| c.name().to_string())
            .unwrap_or_default(),
        version: ssl.version_str().to_string(),
        record_size,
        bytes: moved,
        send_mb_per_cpu_s: moved as f64 / send_s / 1e6,
        recv_mb_per_cpu_s: moved as f64 / recv_s / 1e6,
    })
}

/// The ciphers of the bulk-throughput comparison. TLS 1.2 suites pin the AEAD (BoringSSL does not let
/// TLS 1.3 suites be configured); the record-layer AEAD work is the same in 1.3.
pub const CIPHERS: &[Option<&str>] = &[
    Some("ECDHE-ECDSA-AES128-GCM-SHA256"),
    Some("ECDHE-ECDSA-AES256-GCM-SHA384"),
    Some("ECDHE-ECDSA-CHACHA20-POLY1305"),
    None,
];

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let mut results = Vec::new();
    for c in CIPHERS {
        results.push(measure(*c, args.record_size, args.record_bytes)?);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        println!(
            "BoringSSL record layer in memory, {} B records, {} MB per cipher (MB = 10^6 B, per CPU-second)",
            args.record_size,
            args.record_bytes / 1_000_000
        );
        println!(
            "{:<40} {:>8} {:>12} {:>12}",
            "cipher", "version", "send MB/s", "recv MB/s"
        );
        for r in &results {
            println!(
                "{:<40} {:>8} {:>12.0} {:>12.0}",
                r.cipher, r.version, r.send_mb_per_cpu_s, r.recv_mb_per_cpu_s
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn empty_records_are_refused() {
        let e = super::measure(None, 0, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("--record-size"), "{e}");
    }

    #[test]
    fn record_roundtrip() {
        let r = super::measure(Some("ECDHE-ECDSA-CHACHA20-POLY1305"), 16384, 4 << 20).unwrap();
        assert!(r.cipher.contains("CHACHA20"), "{}", r.cipher);
        assert!(r.send_mb_per_cpu_s > 0.0 && r.recv_mb_per_cpu_s > 0.0);
        let r = super::measure(None, 16384, 1 << 20).unwrap();
        assert_eq!(r.version, "TLSv1.3");
    }
}
