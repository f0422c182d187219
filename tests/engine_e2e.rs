//! Handshakes through `serve` with the batch engine: many concurrent clients, RSA keys of
//! every size, PSS and PKCS#1 v1.5; each client verifies the server's signature (BoringSSL
//! checks CertificateVerify / ServerKeyExchange even when it does not check the chain).

mod common;

use boring::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
use common::*;
use tokio::net::TcpStream;

#[derive(Clone, Copy)]
enum Sig {
    Pss13,
    Pss12,
    Pkcs1v15,
}

async fn handshake(port: u16, sig: Sig) -> anyhow::Result<()> {
    let mut builder = SslConnector::builder(SslMethod::tls())?;
    builder.set_verify(SslVerifyMode::NONE);
    match sig {
        Sig::Pss13 => builder.set_min_proto_version(Some(SslVersion::TLS1_3))?,
        Sig::Pss12 => {
            builder.set_max_proto_version(Some(SslVersion::TLS1_2))?;
            builder.set_sigalgs_list("RSA-PSS+SHA256:RSA-PSS+SHA384")?;
        }
        Sig::Pkcs1v15 => {
            builder.set_max_proto_version(Some(SslVersion::TLS1_2))?;
            builder.set_sigalgs_list("RSA+SHA256:RSA+SHA512")?;
        }
    }
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let mut tls = tokio_boring::connect(builder.build().configure()?, "localhost", tcp).await?;
    let body = http_get(&mut tls, "/bytes/64").await?;
    anyhow::ensure!(body.len() == 64);
    Ok(())
}

async fn run_load(mode: &str, key: &str, clients: usize, per_client: usize) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cert = dir.path().join("c.pem");
    let keyfile = dir.path().join("k.pem");
    run(std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-newkey",
            key,
            "-subj",
            "/CN=localhost",
            "-keyout",
        ])
        .arg(&keyfile)
        .arg("-out")
        .arg(&cert));
    let listener = format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\n[[listener.certificate]]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        keyfile.display().to_string()
    );
    let header =
        format!("[engine]\nmode = \"{mode}\"\nsmall_batch_threshold = 1\npoll_delay = \"2ms\"\n");
    let config = write_config(dir.path(), &header, &[listener]);
    let _server = Server::start(&config);
    let admin = admin_address(&config).unwrap();

    let mut tasks = Vec::new();
    for client in 0..clients {
        let sig = [Sig::Pss13, Sig::Pss12, Sig::Pkcs1v15][client % 3];
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_client {
                handshake(port, sig)
                    .await
                    .expect("handshake with a verified signature");
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(DEADLINE * 4, task)
            .await
            .expect("load finishes")
            .unwrap();
    }
    let batch = metric(admin, "tlsterm_engine_operations_total", "algorithm=\"rsa");
    let batches = metric(admin, "tlsterm_engine_batch_operations_count", "");
    let ops_in_batches = metric(admin, "tlsterm_engine_batch_operations_sum", "");
    assert_eq!(
        batch,
        (clients * per_client) as f64,
        "one signature per handshake"
    );
    (batch, batches, ops_in_batches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa2048_concurrent_handshakes_through_the_batch_engine() {
    let (_, batches, ops) = run_load("batch", "rsa:2048", 48, 6).await;
    assert_eq!(
        ops,
        48.0 * 6.0,
        "every RSA signature went through a multi-buffer batch"
    );
    assert!(
        ops / batches > 1.0,
        "batches held more than one operation on average ({ops} ops in {batches} batches)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa3072_and_rsa4096_through_the_batch_engine() {
    for key in ["rsa:3072", "rsa:4096"] {
        let (_, _, ops) = run_load("batch", key, 12, 2).await;
        assert_eq!(ops, 24.0, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_never_batches() {
    let (_, batches, _) = run_load("inline", "rsa:2048", 8, 2).await;
    assert_eq!(batches, 0.0);
}
