//! A client-certificate PKI made with the openssl CLI, and a client that presents one of
//! its certificates, for the client-certificate and server-name tests.

use std::path::Path;

use tokio::io::AsyncReadExt;

use super::*;

/// A CA and a client certificate it signed (CN=alice, SAN email:alice@example.test), and
/// `mallory.pem`/`.key` from a CA the server does not trust.
pub fn make_client_pki(dir: &Path) {
    make_ca(dir, "Test Client CA");
    make_leaf(
        dir,
        "alice",
        "/CN=alice/O=Example",
        "subjectAltName=email:alice@example.test,DNS:alice.example.test",
    );
    let untrusted = dir.join("untrusted");
    std::fs::create_dir(&untrusted).unwrap();
    make_ca(&untrusted, "Untrusted CA");
    make_leaf(
        &untrusted,
        "mallory",
        "/CN=mallory",
        "subjectAltName=DNS:mallory.test",
    );
    for file in ["mallory.pem", "mallory.key"] {
        std::fs::copy(untrusted.join(file), dir.join(file)).unwrap();
    }
}

/// The listener keys that require a client certificate from `pki`'s CA.
pub fn requiring_client_certificates(pki: &Path) -> String {
    format!(
        "client_auth = \"required\"\nclient_ca = {:?}\n",
        pki.join("ca.pem").display().to_string()
    )
}

/// What an echo backend (`common::echo`) shows it received from a connection that presented
/// Alice's certificate from `pki`, as (`x-seen-*` header, value) pairs: her subject, the
/// SHA-256 fingerprint of her certificate and her names.
pub fn alice_as_seen_by_the_backend(pki: &Path) -> [(&'static str, String); 3] {
    let pem = std::fs::read(pki.join("alice.pem")).unwrap();
    let der = boring::x509::X509::from_pem(&pem)
        .unwrap()
        .to_der()
        .unwrap();
    [
        ("x-seen-x-client-cert-subject", "O=Example,CN=alice".into()),
        ("x-seen-x-client-cert-sha256", super::echo::hex_sha256(&der)),
        (
            "x-seen-x-client-cert-san",
            "email:alice@example.test | DNS:alice.example.test".into(),
        ),
    ]
}

/// Sends a line through `openssl s_client` (with `args` and Alice's client certificate
/// from `pki`) and checks that the api backend receives it; returns s_client's output.
pub async fn to_api_backend_as_alice(
    port: u16,
    api_backend: &RawBackend,
    pki: &Path,
    args: &[&str],
) -> String {
    let p = |name: &str| pki.join(name).display().to_string();
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.extend([
        "-cert".into(),
        p("alice.pem"),
        "-key".into(),
        p("alice.key"),
    ]);
    args.push("-ign_eof".into());
    let client = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        s_client(port, &args, "to the api backend")
    });
    let mut upstream = api_backend.accept().await;
    let mut got = vec![0u8; 18];
    tokio::time::timeout(DEADLINE, upstream.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"to the api backend");
    drop(upstream);
    client.await.unwrap()
}
