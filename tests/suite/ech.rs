//! Encrypted Client Hello with Go's crypto/tls client: keys made by `tlsterm ech keygen`,
//! accepted with the current and the previous key, rejected with the retry configs for an
//! unknown one, the inner name choosing the certificate and reaching the backend, keys
//! re-read on reload.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::config::{ConfigBuilder, Listener};
use crate::common::*;
use tlsterm::proxy::proxy_protocol::{self, PP2_TYPE_AUTHORITY};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ECH: &str = "tlsterm_ech_total";

/// `tlsterm ech keygen` into `dir/<stem>.pem`; returns the file and the printed ECHConfigList.
fn keygen(dir: &Path, stem: &str) -> (PathBuf, String) {
    let file = dir.join(format!("{stem}.pem"));
    let out = run(Command::new(TLSTERM)
        .args(["ech", "keygen", "--public-name", "public.test", "--out"])
        .arg(&file));
    let list = String::from_utf8(out.stdout).unwrap().trim().to_string();
    (file, list)
}

/// `l` with certificates for public.test (default) and secret.test, `ech_keys` set to
/// `keys`, PROXY v2 to `backend` (unless it is the built-in one).
fn ech_listener(l: Listener, dir: &Path, port: u16, backend: &str, keys: &[&Path]) -> Listener {
    // PROXY v2 to every backend (the built-in one strips it): the backend learns the inner
    // name, and a name with its own client-certificate policy may share it.
    let mut l = l
        .port(port)
        .backend(backend)
        .proxy_v2()
        .set("ech_keys", keys.to_vec());
    for (name, default) in [("public", true), ("secret", false)] {
        let cert = dir.join(format!("{name}.pem"));
        if !cert.exists() {
            make_cert(dir, name, &format!("{name}.test"), KeyType::EcdsaP256);
        }
        let key = dir.join(format!("{name}.key"));
        l = l.certificate(|c| c.files(&cert, &key).set("default", default));
    }
    l
}

/// A PROXY v2 backend that reports each connection's authority TLV and answers 200.
async fn authority_backend() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let backend = RawBackend::bind().await;
    let address = backend.address.to_string();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = backend.listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut received = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = stream.read(&mut chunk).await.unwrap_or(0);
                    received.extend_from_slice(&chunk[..n]);
                    if let Ok((header, used)) = proxy_protocol::decode(&received) {
                        if received[used..].windows(4).any(|w| w == b"\r\n\r\n") {
                            let authority = header.tlv(PP2_TYPE_AUTHORITY).unwrap_or_default();
                            let _ = tx.send(String::from_utf8_lossy(authority).into_owned());
                            let reply =
                                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                            let _ = stream.write_all(reply.as_bytes()).await;
                            return;
                        }
                    }
                    if n == 0 {
                        return;
                    }
                }
            });
        }
    });
    (address, rx)
}

fn go_ech(port: u16, ech: &str, dir: &Path) -> serde_json::Value {
    let cafile = dir.join("public.pem").display().to_string();
    go_connect(
        port,
        &["-sni", "secret.test", "-ech", ech, "-cafile", &cafile],
    )
}

#[test]
fn keygen_writes_a_private_key_file_and_prints_the_config_list() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (file, list) = keygen(dir.path(), "k");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let decoded = boring::base64::decode_block(&list).unwrap();
    assert_eq!(
        u16::from_be_bytes([decoded[0], decoded[1]]) as usize,
        decoded.len() - 2
    );
    // ECH version 0xfe0d, and the public name inside.
    assert_eq!(&decoded[2..4], &[0xfe, 0x0d]);
    assert!(decoded.windows(11).any(|w| w == b"public.test"));
    // An existing key file is never overwritten.
    let again = Command::new(TLSTERM)
        .args(["ech", "keygen", "--public-name", "public.test", "--out"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!again.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ech_with_current_previous_and_unknown_keys_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let (old, old_list) = keygen(dir.path(), "old");
    let (new, new_list) = keygen(dir.path(), "new");
    let (newest, newest_list) = keygen(dir.path(), "newest");
    let (backend, mut authorities) = authority_backend().await;
    let port = free_port();
    // Rotation: the new key first (offered in retry configs), the old one still decrypts.
    let base = ConfigBuilder::new().section("log", |log| log.set("connections", true));
    let config = base
        .clone()
        .listener(|l| ech_listener(l, dir.path(), port, &backend, &[&new, &old]))
        .write(dir.path());
    let server = Server::start(&config);
    let admin = admin_address(&config).unwrap();
    let dir = dir.path().to_path_buf();
    let go = move |list: &str| {
        let (dir, list) = (dir.clone(), list.to_string());
        async move {
            tokio::task::spawn_blocking(move || go_ech(port, &list, &dir))
                .await
                .unwrap()
        }
    };
    let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>| {
        let got = rx.try_recv();
        got.expect("the backend saw the connection")
    };

    for list in [&new_list, &old_list] {
        let got = go(list).await;
        assert_eq!(got["ech_accepted"], true, "{got}");
        // The inner name chose the certificate, and the backend learns it.
        assert_eq!(got["certificate_names"][0], "secret.test", "{got}");
        assert_eq!(got["status"], 200, "{got}");
        assert_eq!(next(&mut authorities), "secret.test");
    }
    assert_eq!(metric(admin, ECH, "result=\"accepted\""), 2.0);
    let line = server.log.wait_for("ech=accepted", 0);
    assert!(line.contains("sni=secret.test"), "{line}");

    // A config the server has no key for: the public name's certificate (which Go
    // checks) and the retry configs, which are the first key's.
    let got = go(&newest_list).await;
    assert_eq!(got["ech_retry_configs"], new_list.as_str(), "{got}");
    assert_eq!(metric(admin, ECH, "result=\"rejected\""), 1.0);

    // Reload with only the newest key: it is accepted, the old ones are not.
    let dir = config.parent().unwrap();
    let only_newest = base.listener(|l| ech_listener(l, dir, port, &backend, &[&newest]));
    only_newest.write(dir);
    assert!(server.reload().contains("reloaded"));
    let got = go(&newest_list).await;
    assert_eq!(got["ech_accepted"], true, "{got}");
    assert_eq!(next(&mut authorities), "secret.test");
    let got = go(&old_list).await;
    assert_eq!(got["ech_retry_configs"], newest_list.as_str(), "{got}");
    // A client without ECH is served as before.
    let plain = tokio::task::spawn_blocking(move || go_connect(port, &["-sni", "secret.test"]))
        .await
        .unwrap();
    assert_eq!(plain["ech_accepted"], false, "{plain}");
    assert_eq!(plain["status"], 200, "{plain}");
    assert_eq!(metric(admin, ECH, "result=\"not_offered\""), 1.0);
}

/// `tlsterm bench --ech-config` (rustls): `n` connections to secret.test; its JSON report.
fn bench(port: u16, list: &str, n: &str) -> serde_json::Value {
    let out = run(Command::new(TLSTERM)
        .args(["bench", &format!("https://127.0.0.1:{port}/")])
        .args(["--sni", "secret.test", "--insecure", "--json", "--quiet"])
        .args(["-c", "1", "-n", n, "--ech-config", list]));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_encrypts_its_client_hello() {
    let dir = tempfile::tempdir().unwrap();
    let (key, list) = keygen(dir.path(), "key");
    let (_, unknown) = keygen(dir.path(), "unknown");
    let port = free_port();
    let config = ConfigBuilder::new()
        .listener(|l| ech_listener(l, dir.path(), port, "builtin", &[&key]))
        .write(dir.path());
    let server = Server::start(&config);
    let report = bench(port, &list, "3");
    assert_eq!(report["errors_total"], 0, "{report}");
    assert_eq!(report["ech_accepted"], 3, "{report}");
    // rustls does not go on after a rejection, and says why.
    let report = bench(port, &unknown, "2");
    assert_eq!(report["ech_accepted"], 0, "{report}");
    let errors = report["errors"].to_string();
    assert!(
        errors.contains("ServerRejectedEncryptedClientHello"),
        "{report}"
    );
    let admin = admin_address(&server.config).unwrap();
    assert_eq!(metric(admin, ECH, "result=\"accepted\""), 3.0);
    assert_eq!(metric(admin, ECH, "result=\"rejected\""), 2.0);
}

#[test]
fn a_bad_ech_key_file_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a key").unwrap();
    let text = format!(
        "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nech_keys = [\"{}\"]\n",
        bad.display()
    );
    let err = tlsterm::config::Config::parse("t.toml", &text).unwrap_err();
    assert_eq!(err.line, Some(4), "{err}");
    assert!(err.message.contains("key `ech_keys`"), "{err}");
}

/// The client-certificate policy of the encrypted name applies, not the public name's.
#[test]
fn the_inner_name_sets_the_client_certificate_policy() {
    let dir = tempfile::tempdir().unwrap();
    make_ca(dir.path(), "client CA");
    let (key, list) = keygen(dir.path(), "key");
    let port = free_port();
    let config = ConfigBuilder::new()
        .listener(|l| {
            ech_listener(l, dir.path(), port, "builtin", &[&key]).server_name(
                &["secret.test"],
                |n| {
                    n.client_auth("required", &dir.path().join("ca.pem"))
                        .backend("builtin")
                },
            )
        })
        .write(dir.path());
    let _server = Server::start(&config);
    let admin = admin_address(&config).unwrap();
    let client = |sni: &str| {
        Command::new(go_client())
            .arg("-addr")
            .arg(format!("127.0.0.1:{port}"))
            .args(["-sni", sni, "-ech", &list])
            .output()
            .unwrap()
    };
    // Both ClientHellos show public.test outside; only secret.test asks for a certificate.
    let open = client("public.test");
    assert!(open.status.success(), "{open:?}");
    let refused = client("secret.test");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    // The client usually reads the server's alert ("certificate required"); when its
    // request is written after the server closed, it sees a reset instead. Either way the
    // server must have refused the handshake for the missing client certificate.
    let deadline = std::time::Instant::now() + DEADLINE;
    while metric(
        admin,
        "tlsterm_handshake_failures_total",
        "reason=\"client_certificate\"",
    ) < 1.0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no client_certificate failure counted; client said: {stderr}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
