//! OCSP stapling: a response from a file (`ocsp`), checked before it is stapled, and
//! responses fetched by tlsterm (`ocsp_fetch = true`) from a real responder: `openssl
//! ocsp` serving an index file on 127.0.0.1, named by the leaf's Authority Information
//! Access. Fetch timings are shortened through `[ocsp]`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::common::config::ConfigBuilder;
use crate::common::*;

/// Fast fetch timings, so retries and refreshes happen within a test's deadline.
fn fast_fetching() -> ConfigBuilder {
    ConfigBuilder::new().section("ocsp", |ocsp| {
        ocsp.set("timeout", "2s")
            .set("retry", "200ms")
            .set("min_refresh", "1s")
            .set("max_refresh", "2s")
    })
}

/// A CA, a leaf for localhost whose AIA names a responder on `port`, and the leaf's file
/// with its issuer after it (`chain.pem`).
struct Pki {
    dir: tempfile::TempDir,
    port: u16,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        make_ca(dir.path(), "Test OCSP CA");
        make_leaf(
            dir.path(),
            "leaf",
            "/CN=localhost",
            &format!(
                "subjectAltName=DNS:localhost\nauthorityInfoAccess=OCSP;URI:http://127.0.0.1:{port}/"
            ),
        );
        let chain = [
            std::fs::read(dir.path().join("leaf.pem")).unwrap(),
            std::fs::read(dir.path().join("ca.pem")).unwrap(),
        ]
        .concat();
        std::fs::write(dir.path().join("chain.pem"), chain).unwrap();
        Pki { dir, port }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The responder's index: the leaf valid ("V") or revoked ("R").
    fn set_status(&self, status: char) {
        let serial = run(Command::new("openssl").args([
            "x509",
            "-noout",
            "-serial",
            "-in",
            &self.path("leaf.pem"),
        ]));
        let serial = String::from_utf8_lossy(&serial.stdout)
            .trim()
            .trim_start_matches("serial=")
            .to_string();
        let revoked = if status == 'R' { "240101000000Z" } else { "" };
        std::fs::write(
            self.dir.path().join("index.txt"),
            format!("{status}\t991231235959Z\t{revoked}\t{serial}\tunknown\t/CN=localhost\n"),
        )
        .unwrap();
    }

    /// Starts `openssl ocsp` on the leaf's responder port; its responses are valid for
    /// `minutes`, or have no nextUpdate.
    fn responder(&self, minutes: Option<u32>) -> Responder {
        self.responder_signed_by("ca", minutes)
    }

    /// As `responder`, signing with `<signer>.pem` and `.key` in the PKI's directory.
    fn responder_signed_by(&self, signer: &str, minutes: Option<u32>) -> Responder {
        let next_update = minutes.map(|m| vec!["-nmin".to_string(), m.to_string()]);
        use std::io::BufRead;
        let mut child = Command::new("openssl")
            .args(["ocsp", "-index", &self.path("index.txt")])
            .args(["-port", &self.port.to_string()])
            .args([
                "-rsigner",
                &self.path(&format!("{signer}.pem")),
                "-rkey",
                &self.path(&format!("{signer}.key")),
            ])
            .args(["-CA", &self.path("ca.pem")])
            .args(next_update.unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("openssl ocsp starts");
        // Ready once it says so (a probing connection would stall it: it serves one at a time).
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let (ready, listening) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if line.contains("waiting for OCSP client connections") {
                    let _ = ready.send(());
                }
            }
        });
        let responder = Responder(child);
        listening
            .recv_timeout(DEADLINE)
            .expect("the OCSP responder listens");
        responder
    }

    /// A config with one listener serving the leaf with `ocsp_fetch = true`, and the
    /// response in `file_response` as its starting value if given.
    fn config(&self, file_response: Option<&str>) -> (PathBuf, u16) {
        let port = free_port();
        let (chain, key) = (self.path("chain.pem"), self.path("leaf.key"));
        let config = fast_fetching().listener(|l| {
            l.port(port).backend("builtin").certificate(|c| {
                let c = c.set("cert", chain).set("key", key).set("ocsp_fetch", true);
                match file_response {
                    Some(file) => c.set("ocsp", file),
                    None => c,
                }
            })
        });
        (config.write(self.dir.path()), port)
    }
}

/// A responder process, killed when dropped.
struct Responder(Child);

impl Drop for Responder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn handshake_with_status(port: u16) -> String {
    let out = s_client(port, &["-servername", "localhost", "-status"], "");
    assert!(out.contains("Cipher is"), "handshake failed: {out}");
    out
}

fn stapled_good(out: &str) -> bool {
    out.contains("OCSP Response Status: successful") && out.contains("Cert Status: good")
}

const NOT_STAPLED: &str = "OCSP response: no response sent";

/// The value of one sample (`name{labels}`) on the admin listener of `config`.
fn sample(config: &Path, sample: &str) -> f64 {
    let (name, labels) = sample.split_once('{').unwrap_or((sample, ""));
    metric(
        admin_address(config).unwrap(),
        name,
        labels.trim_end_matches('}'),
    )
}

#[test]
fn fetched_response_is_stapled_and_survives_a_reload() {
    let pki = Pki::new();
    pki.set_status('V');
    let responder = pki.responder(Some(60));
    let (config, port) = pki.config(None);
    let server = Server::start(&config);

    eventually("a good response is stapled", || {
        stapled_good(&handshake_with_status(port)).then_some(())
    });
    assert!(sample(&config, "tlsterm_ocsp_fetches_total{result=\"ok\"}") >= 1.0);
    assert!(sample(&config, "tlsterm_ocsp_responses_total{result=\"stapled\"}") >= 1.0);
    // A client that does not ask gets no staple, and the handshake is the same.
    let plain = s_client(port, &["-servername", "localhost"], "");
    assert!(
        plain.contains("Cipher is") && !plain.contains("OCSP Response Data"),
        "{plain}"
    );

    // The fetched response carries over a reload, even with the responder gone.
    drop(responder);
    assert!(server.reload().contains("reloaded"));
    let out = handshake_with_status(port);
    assert!(stapled_good(&out), "{out}");
}

#[test]
fn revoked_answer_is_not_stapled_and_counted() {
    let pki = Pki::new();
    pki.set_status('R');
    let _responder = pki.responder(Some(60));
    let (config, port) = pki.config(None);
    let server = Server::start(&config);

    eventually("the revoked answer is counted", || {
        (sample(&config, "tlsterm_ocsp_responses_total{result=\"not_good\"}") >= 1.0).then_some(())
    });
    server.log.wait_for("OCSP response not stapled", 0);
    let out = handshake_with_status(port);
    assert!(out.contains(NOT_STAPLED), "{out}");
}

/// A response signed by a certificate the issuer did not make a responder (no OCSPSigning
/// usage) would fail every client that checks it: not stapled, counted.
#[test]
fn answer_not_signed_for_the_issuer_is_not_stapled() {
    let pki = Pki::new();
    pki.set_status('V');
    make_leaf(
        pki.dir.path(),
        "server",
        "/CN=not a responder",
        "extendedKeyUsage=serverAuth",
    );
    let _responder = pki.responder_signed_by("server", Some(60));
    let (config, port) = pki.config(None);
    let _server = Server::start(&config);
    eventually("the bad signature is counted", || {
        (sample(
            &config,
            "tlsterm_ocsp_responses_total{result=\"bad_signature\"}",
        ) >= 1.0)
            .then_some(())
    });
    let out = handshake_with_status(port);
    assert!(out.contains(NOT_STAPLED), "{out}");
}

#[test]
fn revocation_is_noticed_at_the_next_refresh() {
    let pki = Pki::new();
    pki.set_status('V');
    let responder = pki.responder(Some(60));
    let (config, port) = pki.config(None);
    let _server = Server::start(&config);
    eventually("a good response is stapled", || {
        stapled_good(&handshake_with_status(port)).then_some(())
    });

    // The same responder, now saying "revoked": the good response stops being stapled.
    drop(responder);
    pki.set_status('R');
    let _responder = pki.responder(Some(60));
    eventually("the staple is withdrawn", || {
        handshake_with_status(port)
            .contains(NOT_STAPLED)
            .then_some(())
    });
}

#[test]
fn responder_down_does_not_stop_handshakes() {
    let pki = Pki::new();
    pki.set_status('V');
    let (config, port) = pki.config(None);
    let _server = Server::start(&config);

    eventually("a failed fetch is counted", || {
        (sample(&config, "tlsterm_ocsp_fetches_total{result=\"failed\"}") >= 1.0).then_some(())
    });
    let out = handshake_with_status(port);
    assert!(out.contains(NOT_STAPLED), "{out}");

    // Retried with back-off: once the responder is up, the response is stapled.
    let _responder = pki.responder(Some(60));
    eventually("a good response is stapled", || {
        stapled_good(&handshake_with_status(port)).then_some(())
    });
}

#[test]
fn fetching_needs_a_responder_url_and_an_issuer() {
    let pki = Pki::new();
    // The leaf without its issuer in the file.
    let (config, _) = pki.config(None);
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("chain.pem", "leaf.pem");
    std::fs::write(&config, text).unwrap();
    let err = check_refuses(&config);
    assert!(
        err.contains("ocsp_fetch") && err.contains("no issuer"),
        "{err}"
    );

    // A certificate that names no responder.
    let other = tempfile::tempdir().unwrap();
    make_ca(other.path(), "CA without OCSP");
    make_leaf(
        other.path(),
        "leaf",
        "/CN=localhost",
        "subjectAltName=DNS:localhost",
    );
    let chain = [
        std::fs::read(other.path().join("leaf.pem")).unwrap(),
        std::fs::read(other.path().join("ca.pem")).unwrap(),
    ]
    .concat();
    std::fs::write(other.path().join("chain.pem"), chain).unwrap();
    let config = ConfigBuilder::new().listener(|l| {
        l.port(free_port()).backend("builtin").certificate(|c| {
            c.files(Path::new("chain.pem"), Path::new("leaf.key"))
                .set("ocsp_fetch", true)
        })
    });
    let err = check_refuses(&config.write(other.path()));
    assert!(
        err.contains("ocsp_fetch") && err.contains("Authority Information Access"),
        "{err}"
    );
}

#[test]
fn response_stops_being_stapled_when_it_expires_unrefreshed() {
    let pki = Pki::new();
    pki.set_status('V');
    // Without nextUpdate a response is stapled for `max_refresh` (2 s here) after its fetch.
    let responder = pki.responder(None);
    let (config, port) = pki.config(None);
    let server = Server::start(&config);
    eventually("a good response is stapled", || {
        stapled_good(&handshake_with_status(port)).then_some(())
    });

    drop(responder);
    eventually("the expired response is withdrawn", || {
        handshake_with_status(port)
            .contains(NOT_STAPLED)
            .then_some(())
    });
    server.log.wait_for("expired before a refresh succeeded", 0);
    assert!(sample(&config, "tlsterm_ocsp_responses_total{result=\"stale\"}") >= 1.0);
}

#[test]
fn file_response_is_the_starting_value() {
    let pki = Pki::new();
    pki.set_status('V');
    let responder = pki.responder(Some(60));
    run(Command::new("openssl")
        .args(["ocsp", "-no_nonce", "-noverify"])
        .args([
            "-issuer",
            &pki.path("ca.pem"),
            "-cert",
            &pki.path("leaf.pem"),
        ])
        .args(["-url", &format!("http://127.0.0.1:{}/", pki.port)])
        .args(["-respout", &pki.path("resp.der")]));
    drop(responder);

    // With the responder down, the file's response is stapled from the first handshake on.
    let (config, port) = pki.config(Some("resp.der"));
    let _server = Server::start(&config);
    let out = handshake_with_status(port);
    assert!(stapled_good(&out), "{out}");
}

/// A CA, a leaf for localhost it signed, and a "good" OCSP response for the leaf made by
/// `openssl ocsp` acting as the responder (valid 7 days). Returns the response's path.
fn make_ocsp_pki(dir: &Path) -> std::path::PathBuf {
    let p = |name: &str| dir.join(name).display().to_string();
    make_ca(dir, "Test OCSP CA");
    make_leaf(dir, "leaf", "/CN=localhost", "subjectAltName=DNS:localhost");
    let serial =
        run(Command::new("openssl").args(["x509", "-noout", "-serial", "-in", &p("leaf.pem")]));
    let serial = String::from_utf8_lossy(&serial.stdout)
        .trim()
        .trim_start_matches("serial=")
        .to_string();
    std::fs::write(
        dir.join("index.txt"),
        format!("V\t991231235959Z\t\t{serial}\tunknown\t/CN=localhost\n"),
    )
    .unwrap();
    run(Command::new("openssl").args([
        "ocsp",
        "-issuer",
        &p("ca.pem"),
        "-cert",
        &p("leaf.pem"),
        "-no_nonce",
        "-reqout",
        &p("req.der"),
    ]));
    sign_ocsp_response(dir, "ca", "resp.der");
    dir.join("resp.der")
}

/// Answers `req.der` from `index.txt` in `dir` (valid 7 days), signed with `<signer>.pem`
/// and `.key` (its certificate goes in the response), into `out`.
fn sign_ocsp_response(dir: &Path, signer: &str, out: &str) {
    let p = |name: &str| dir.join(name).display().to_string();
    run(Command::new("openssl").args([
        "ocsp",
        "-index",
        &p("index.txt"),
        "-rsigner",
        &p(&format!("{signer}.pem")),
        "-rkey",
        &p(&format!("{signer}.key")),
        "-CA",
        &p("ca.pem"),
        "-reqin",
        &p("req.der"),
        "-respout",
        &p(out),
        "-ndays",
        "7",
    ]));
}

#[test]
fn ocsp_response_is_stapled_only_when_it_fits() {
    let dir = tempfile::tempdir().unwrap();
    let response = make_ocsp_pki(dir.path());
    let p = |name: &str| dir.path().join(name).display().to_string();
    let other = tempfile::tempdir().unwrap();
    let (other_cert, other_key) =
        make_cert(other.path(), "other", "other.test", KeyType::EcdsaP256);
    let port = free_port();
    let leaf = (dir.path().join("leaf.pem"), dir.path().join("leaf.key"));
    let config = ConfigBuilder::new()
        .listener(|l| {
            l.port(port)
                .backend("builtin")
                .certificate(|c| c.files(&leaf.0, &leaf.1).set("ocsp", &response))
                .certificate(|c| c.files(&other_cert, &other_key).set("ocsp", &response))
        })
        .write(dir.path());
    let server = Server::start(&config);

    let out = s_client(port, &["-servername", "localhost", "-status"], "");
    assert!(
        out.contains("OCSP Response Status: successful") && out.contains("Cert Status: good"),
        "{out}"
    );
    // The same response on a certificate it does not describe is not stapled.
    let out = s_client(port, &["-servername", "other.test", "-status"], "");
    assert!(out.contains("OCSP response: no response sent"), "{out}");
    server.log.wait_for("OCSP response not stapled", 0);
    let (_, metrics) = admin_get(admin_address(&config).unwrap(), "/metrics");
    assert!(
        metrics.contains("tlsterm_ocsp_responses_total{result=\"stapled\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tlsterm_ocsp_responses_total{result=\"wrong_certificate\"} 1"),
        "{metrics}"
    );

    // Past its nextUpdate the same response is refused (checked at load and reload).
    let leaf = boring::x509::X509::from_pem(&std::fs::read(p("leaf.pem")).unwrap()).unwrap();
    let der = std::fs::read(&response).unwrap();
    let now = std::time::SystemTime::now();
    assert_eq!(tlsterm::tls::ocsp::check(&der, &leaf, None, now), Ok(()));
    let later = now + std::time::Duration::from_secs(8 * 24 * 3600);
    assert_eq!(
        tlsterm::tls::ocsp::check(&der, &leaf, None, later),
        Err(tlsterm::tls::ocsp::OcspProblem::Stale)
    );
    assert_eq!(
        tlsterm::tls::ocsp::check(b"garbage", &leaf, None, now),
        Err(tlsterm::tls::ocsp::OcspProblem::Unparsable)
    );

    // Signed by the issuer, or by a responder it gave the OCSPSigning usage; not by a
    // certificate without it, and not verifiable with another CA's key.
    let cert = |path: &str| boring::x509::X509::from_pem(&std::fs::read(path).unwrap()).unwrap();
    let ca = cert(&p("ca.pem"));
    let bad = Err(tlsterm::tls::ocsp::OcspProblem::BadSignature);
    assert_eq!(
        tlsterm::tls::ocsp::check(&der, &leaf, Some(&ca), now),
        Ok(())
    );
    let stranger = cert(&other_cert.display().to_string());
    assert_eq!(
        tlsterm::tls::ocsp::check(&der, &leaf, Some(&stranger), now),
        bad
    );
    make_leaf(
        dir.path(),
        "responder",
        "/CN=responder",
        "extendedKeyUsage=OCSPSigning",
    );
    make_leaf(
        dir.path(),
        "server",
        "/CN=server",
        "extendedKeyUsage=serverAuth",
    );
    for (signer, expected) in [("responder", Ok(())), ("server", bad)] {
        sign_ocsp_response(dir.path(), signer, "delegated.der");
        let der = std::fs::read(p("delegated.der")).unwrap();
        assert_eq!(
            tlsterm::tls::ocsp::check(&der, &leaf, Some(&ca), now),
            expected,
            "{signer}"
        );
    }
}
