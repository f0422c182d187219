//! Pebble, Let's Encrypt's test ACME server, on free loopback ports with its own test CA,
//! and pebble-challtestsrv as its DNS server (every name resolves to 127.0.0.1), so that
//! Pebble validates challenges against tlsterm's own listeners. Built once per test process
//! with `go install` at a pinned version; killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{free_port, go, run, Log};

pub const VERSION: &str = "v2.8.0";
const MODULE: &str = "github.com/letsencrypt/pebble/v2";

/// The directory holding the `pebble` and `pebble-challtestsrv` binaries.
fn binaries() -> &'static Path {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let bin = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pebble-bin");
        for command in ["pebble", "pebble-challtestsrv"] {
            run(Command::new(go())
                .arg("install")
                .arg(format!("{MODULE}/cmd/{command}@{VERSION}"))
                .env("GOBIN", &bin)
                .env("GOTOOLCHAIN", "local"));
        }
        bin
    })
}

/// Pebble's own test certificates (its HTTPS certificate and the CA that signed it).
fn test_certs() -> PathBuf {
    let out = run(Command::new(go()).args(["env", "GOMODCACHE"]));
    let cache = String::from_utf8(out.stdout).unwrap();
    Path::new(cache.trim()).join(format!("{MODULE}@{VERSION}/test/certs"))
}

pub struct Pebble {
    pebble: Option<Child>,
    dns: Child,
    pub log: Log,
    config: PathBuf,
    dns_port: u16,
    pub port: u16,
    management: u16,
}

impl Pebble {
    /// A Pebble that validates TLS-ALPN-01 on `tls_port` and HTTP-01 on `http_port`, and
    /// issues certificates valid for `validity_seconds`.
    pub fn start(dir: &Path, tls_port: u16, http_port: u16, validity_seconds: u64) -> Pebble {
        Pebble::start_with(
            dir,
            tls_port,
            http_port,
            validity_seconds,
            serde_json::json!({}),
        )
    }

    /// As `start`, with more keys of Pebble's configuration (`extra` overrides).
    pub fn start_with(
        dir: &Path,
        tls_port: u16,
        http_port: u16,
        validity_seconds: u64,
        extra: serde_json::Value,
    ) -> Pebble {
        let bin = binaries();
        let certs = test_certs();
        let (port, management, dns_port, dns_management) =
            (free_port(), free_port(), free_port(), free_port());
        let config = dir.join("pebble.json");
        let mut text = serde_json::json!({ "pebble": {
            "listenAddress": format!("127.0.0.1:{port}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": certs.join("localhost/cert.pem"),
            "privateKey": certs.join("localhost/key.pem"),
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "retryAfter": { "authz": 1, "order": 1 },
            "profiles": { "default": { "description": "test", "validityPeriod": validity_seconds } },
        }});
        if let serde_json::Value::Object(extra) = extra {
            text["pebble"].as_object_mut().unwrap().extend(extra);
        }
        std::fs::write(&config, text.to_string()).unwrap();
        let dns = Command::new(bin.join("pebble-challtestsrv"))
            .args(["-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", ""])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .arg("-dns01")
            .arg(format!("127.0.0.1:{dns_port}"))
            .arg("-management")
            .arg(format!("127.0.0.1:{dns_management}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble-challtestsrv starts");
        let mut pebble = Pebble {
            pebble: None,
            dns,
            log: Log::default(),
            config,
            dns_port,
            port,
            management,
        };
        let dns_log = Log::follow(pebble.dns.stdout.take().unwrap());
        dns_log.wait_for("Starting challenge servers", 0);
        pebble.resume();
        pebble
    }

    /// The directory URL.
    pub fn directory(&self) -> String {
        format!("https://127.0.0.1:{}/dir", self.port)
    }

    /// The CA file that Pebble's own HTTPS certificate chains to.
    pub fn https_ca() -> PathBuf {
        test_certs().join("pebble.minica.pem")
    }

    /// Stops Pebble (it forgets everything: accounts, orders, its CA).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.pebble.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts Pebble again on the same ports (with a new CA) and waits until it serves.
    pub fn resume(&mut self) {
        let mut child = Command::new(binaries().join("pebble"))
            .arg("-config")
            .arg(&self.config)
            .arg("-dnsserver")
            .arg(format!("127.0.0.1:{}", self.dns_port))
            // No random sleep before validating, no rejected nonces, no reused
            // authorizations: every order validates its challenges.
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("pebble starts");
        self.log = Log::follow(child.stdout.take().unwrap());
        self.log.wait_for("ACME directory available", 0);
        self.pebble = Some(child);
    }

    /// The root of the chains Pebble issues now (PEM), written to `path`.
    pub fn root(&self, path: &Path) -> PathBuf {
        let out = run(Command::new("curl")
            .args(["-sf", "--cacert"])
            .arg(Pebble::https_ca())
            .arg(format!("https://127.0.0.1:{}/roots/0", self.management)));
        std::fs::write(path, out.stdout).unwrap();
        path.to_path_buf()
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
        let _ = self.dns.kill();
        let _ = self.dns.wait();
    }
}
