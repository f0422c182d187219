//! Certificates from an ACME CA: Pebble (Let's Encrypt's test server) on loopback,
//! validating TLS-ALPN-01 against tlsterm's listener and HTTP-01 against its plain-HTTP
//! listener, with short-lived certificates for renewal.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use crate::common::pebble::Pebble;
use crate::common::*;
use boring::ssl::SslVersion;

const NAME: &str = "a.example";

/// A config with `[acme]` pointing at `pebble`, storage in `dir`, and one listener on
/// `port` obtaining a certificate for `a.example`.
fn acme_config(dir: &Path, pebble: &Pebble, port: u16, acme_extra: &str, header: &str) -> PathBuf {
    let acme = format!(
        "{header}\n[acme]\ndirectory = \"{}\"\nstorage = \"acme\"\nca_file = \"{}\"\nretry_min = \"1s\"\nretry_max = \"2s\"\n{acme_extra}",
        pebble.directory(),
        Pebble::https_ca().display()
    );
    let listener = format!(
        "address = \"127.0.0.1:{port}\"\nbackends = [\"builtin\"]\nalpn = [\"http/1.1\"]\nacme = {{ names = [\"{NAME}\"] }}"
    );
    write_config(dir, &acme, &[listener])
}

/// A member of a fleet: its own directory `dir/name` (storage, config, a copy of
/// `dir/fleet.key`), the shared `redis`, a listener on `port`; with its admin address.
fn fleet_member(
    dir: &Path,
    name: &str,
    pebble: &Pebble,
    port: u16,
    redis: &Redis,
) -> (Server, std::net::SocketAddr) {
    let own = dir.join(name);
    std::fs::create_dir(&own).unwrap();
    std::fs::copy(dir.join("fleet.key"), own.join("fleet.key")).unwrap();
    let session = format!(
        "[session]\nredis_url = \"{}\"\nfleet_key_file = \"fleet.key\"",
        redis.url()
    );
    let config = acme_config(&own, pebble, port, "", &session);
    (Server::start(&config), admin_address(&config).unwrap())
}

/// Whether the certificate served for `NAME` on `port` verifies against `pebble`'s root
/// (written into `dir`).
fn served_verified(pebble: &Pebble, dir: &Path, port: u16) -> bool {
    let root = pebble.root(&dir.join("root.pem"));
    served(port, NAME, &root).0
}

/// The Redis key of the default fleet's order lock for `NAME`'s certificate of `key_type`.
fn order_lock(key_type: &str) -> String {
    format!("tlsterm:session:acme:lock:{NAME}_{key_type}")
}

/// Takes that lock for two minutes as `holder`, as a member ordering would: the fleet's
/// members wait instead of ordering.
fn hold_order_lock(connection: &mut redis::Connection, key_type: &str, holder: &str) {
    let _: () = redis::cmd("SET")
        .arg(order_lock(key_type))
        .arg(holder)
        .arg("PX")
        .arg(120_000)
        .query(connection)
        .unwrap();
}

/// The certificate served for `name` on `port`: whether it verifies against `root`, its
/// serial and its subjectAltName text.
fn served(port: u16, name: &str, root: &Path) -> (bool, String, String) {
    let out = s_client(
        port,
        &["-servername", name, "-CAfile", &root.display().to_string()],
        "",
    );
    let pem_start = out.find("-----BEGIN CERTIFICATE-----").expect(&out);
    let pem_end = out.find("-----END CERTIFICATE-----").expect(&out) + 25;
    let pem = &out[pem_start..pem_end];
    let mut x509 = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-ext", "subjectAltName"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    x509.stdin
        .take()
        .unwrap()
        .write_all(pem.as_bytes())
        .unwrap();
    let text = String::from_utf8(x509.wait_with_output().unwrap().stdout).unwrap();
    let serial = text
        .lines()
        .find_map(|l| l.strip_prefix("serial="))
        .unwrap()
        .to_string();
    (out.contains("Verify return code: 0 (ok)"), serial, text)
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn first_issuance_chains_to_pebble_and_a_restart_reuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pebble = Pebble::start(dir.path(), port, free_port(), 90 * 86_400);
    let config = acme_config(dir.path(), &pebble, port, "", "");
    // An ECDSA and an RSA certificate, served side by side.
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "acme = { names = [\"a.example\"] }",
        "acme = { names = [\"a.example\"], key_types = [\"ecdsa-p256\", \"rsa-2048\"] }",
    );
    std::fs::write(&config, text).unwrap();
    let admin = admin_address(&config).unwrap();
    let server = Server::start(&config);
    server.log.wait_for_count("ACME certificate installed", 2);
    // The two orders name the same name, and a CA's validation connection carries only the
    // name: they take turns, and each validates at its first attempt.
    let log = server.log.text();
    assert!(!log.contains("ACME order failed"), "{log}");
    assert_eq!(
        metric(admin, "tlsterm_acme_orders_total", "result=\"failed\""),
        0.0
    );
    // Pebble reuses no authorization here: each order's own was validated. Pebble's log is
    // read on a thread of its own and may lag behind tlsterm's: wait for both lines.
    pebble
        .log
        .wait_for_count("set VALID by completed challenge", 2);
    assert_eq!(pebble.log.count("set VALID by completed challenge"), 2);
    assert_eq!(pebble.log.count("set INVALID"), 0, "{}", pebble.log.text());

    let root = pebble.root(&dir.path().join("root.pem"));
    let (verified, serial, text) = served(port, NAME, &root);
    assert!(verified, "the certificate chains to Pebble's root: {text}");
    assert!(text.contains("DNS:a.example"), "{text}");
    let root_arg = root.display().to_string();
    let rsa_only = [
        "-servername",
        NAME,
        "-CAfile",
        &root_arg,
        "-tls1_2",
        "-cipher",
        "ECDHE-RSA-AES128-GCM-SHA256",
    ];
    let out = s_client(port, &rsa_only, "");
    assert!(out.contains("Verify return code: 0 (ok)"), "{out}");
    assert!(out.contains("Server public key is 2048 bit"), "{out}");
    assert_eq!(
        metric(admin, "tlsterm_acme_orders_total", "result=\"issued\""),
        2.0
    );
    // The CA's validation connections are counted closed like any other.
    assert!(
        metric(
            admin,
            "tlsterm_connections_closed_total",
            "reason=\"acme_validation\""
        ) >= 2.0
    );
    let expiry = metric(
        admin,
        "tlsterm_certificate_expiry_seconds",
        "name=\"a.example\"",
    );
    assert!(expiry > now_unix() + 80.0 * 86_400.0, "{expiry}");
    // The key is kept for restarts, readable by its owner only.
    use std::os::unix::fs::PermissionsExt as _;
    let key = dir.path().join("acme/a.example_ecdsa-p256/key.pem");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A validation connection with no challenge pending is refused, for this name and
    // for one tlsterm does not serve; a normal client never sees a challenge certificate.
    for name in [NAME, "unknown.example"] {
        let out = s_client(port, &["-servername", name, "-alpn", "acme-tls/1"], "");
        assert!(!out.contains("BEGIN CERTIFICATE"), "{name}: {out}");
    }
    assert!(served(port, NAME, &root).0);

    drop(server);
    let server = Server::start(&config);
    server
        .log
        .wait_for("ACME certificate loaded from storage", 0);
    let (verified, again, _) = served(port, NAME, &root);
    assert!(verified);
    assert_eq!(
        again, serial,
        "the stored certificate is served after a restart"
    );
    // Once its schedule is computed (from the CA's renewal information), nothing was ordered.
    wait_until("the next renewal time", || {
        metric(
            admin,
            "tlsterm_acme_next_renewal_seconds",
            "name=\"a.example\"",
        ) > 0.0
    });
    assert!(metric(admin, "tlsterm_acme_next_renewal_seconds", "") > now_unix());
    assert_eq!(metric(admin, "tlsterm_acme_orders_total", ""), 0.0);
    assert_eq!(pebble.log.count("Issued certificate serial"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_lived_certificates_are_renewed_while_connections_relay() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pebble = Pebble::start(dir.path(), port, free_port(), 8);
    let config = acme_config(dir.path(), &pebble, port, "", "");
    let server = Server::start(&config);
    let log = server.log.clone();
    tokio::task::spawn_blocking(move || log.wait_for("ACME certificate installed", 0))
        .await
        .unwrap();
    let root = pebble.root(&dir.path().join("root.pem"));
    let first = tokio::task::block_in_place(|| served(port, NAME, &root)).1;

    let mut open = tls_connect(port, NAME, SslVersion::TLS1_3, &["http/1.1"])
        .await
        .unwrap();
    http_get(&mut open, "/").await.unwrap();
    let log = server.log.clone();
    tokio::task::spawn_blocking(move || log.wait_for_count("ACME certificate installed", 2))
        .await
        .unwrap();
    let renewed = tokio::task::block_in_place(|| served(port, NAME, &root));
    assert!(renewed.0, "the renewed certificate chains to Pebble's root");
    assert_ne!(renewed.1, first, "a new certificate is served");
    // The connection made before the renewal keeps relaying.
    http_get(&mut open, "/").await.unwrap();
    // Each renewal names the certificate it replaces (RFC 9773).
    assert!(pebble.log.count("Issued certificate serial") >= 2);
}

#[test]
fn a_failed_renewal_keeps_the_old_certificate_and_the_next_attempt_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut pebble = Pebble::start(dir.path(), port, free_port(), 15);
    let config = acme_config(dir.path(), &pebble, port, "", "");
    let admin = admin_address(&config).unwrap();
    let server = Server::start(&config);
    server.log.wait_for("ACME certificate installed", 0);
    let root = pebble.root(&dir.path().join("root.pem"));
    let (_, first, _) = served(port, NAME, &root);

    pebble.stop();
    server.log.wait_for("ACME order failed", 0);
    assert!(metric(admin, "tlsterm_acme_orders_total", "result=\"failed\"") >= 1.0);
    let (_, still, _) = served(port, NAME, &root);
    assert_eq!(still, first, "the old certificate keeps serving");

    // Pebble comes back with a new CA and without the account: tlsterm registers again.
    pebble.resume();
    server.log.wait_for_count("ACME certificate installed", 2);
    let root = pebble.root(&dir.path().join("root2.pem"));
    let (verified, renewed, _) = served(port, NAME, &root);
    assert!(verified, "the new certificate chains to the new root");
    assert_ne!(renewed, first);
    assert!(metric(admin, "tlsterm_acme_orders_total", "result=\"issued\"") >= 2.0);
}

#[test]
fn a_fleet_sharing_redis_orders_once() {
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start();
    let (port_a, port_b) = (free_port(), free_port());
    // The CA validates on A's port; if B wins the lock, A answers with B's challenge.
    let pebble = Pebble::start(dir.path(), port_a, free_port(), 3600);
    write_fleet_key(&dir.path().join("fleet.key"), &[&"11".repeat(32)]);
    // Both processes are up before either may order: the test holds the lock meanwhile.
    let mut connection = redis.connection().unwrap();
    hold_order_lock(&mut connection, "ecdsa-p256", "test");
    let servers: Vec<(Server, std::net::SocketAddr, u16)> = [("a", port_a), ("b", port_b)]
        .into_iter()
        .map(|(name, port)| {
            let (server, admin) = fleet_member(dir.path(), name, &pebble, port, &redis);
            (server, admin, port)
        })
        .collect();
    let _: () = redis::cmd("DEL")
        .arg(order_lock("ecdsa-p256"))
        .query(&mut connection)
        .unwrap();
    for (server, _, _) in &servers {
        server.log.wait_for("ACME certificate installed", 0);
    }
    let orders: f64 = servers
        .iter()
        .map(|(_, admin, _)| metric(*admin, "tlsterm_acme_orders_total", "result=\"issued\""))
        .sum();
    assert_eq!(orders, 1.0, "one order for the fleet");
    assert_eq!(pebble.log.count("Issued certificate serial"), 1);
    let shared: f64 = servers
        .iter()
        .map(|(_, admin, _)| {
            metric(
                *admin,
                "tlsterm_acme_certificates_installed_total",
                "source=\"fleet\"",
            )
        })
        .sum();
    assert_eq!(
        shared, 1.0,
        "the other process installed the shared certificate"
    );
    let root = pebble.root(&dir.path().join("root.pem"));
    let serials: Vec<String> = servers
        .iter()
        .map(|(_, _, port)| {
            let (verified, serial, _) = served(*port, NAME, &root);
            assert!(verified);
            serial
        })
        .collect();
    assert_eq!(serials[0], serials[1], "both serve the same certificate");
    // Redis holds the certificate and key sealed, not in the clear.
    let sealed: Vec<u8> = redis::cmd("GET")
        .arg(format!("tlsterm:session:acme:cert:{NAME}_ecdsa-p256"))
        .query(&mut connection)
        .unwrap();
    assert!(!sealed.is_empty());
    assert!(!sealed.windows(11).any(|w| w == b"PRIVATE KEY"));
}

#[test]
fn a_fleet_picks_up_each_renewal_ordered_by_one_of_its_members() {
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start();
    let port = free_port();
    let pebble = Pebble::start(dir.path(), port, free_port(), 6);
    write_fleet_key(&dir.path().join("fleet.key"), &[&"22".repeat(32)]);
    // Both listen on the port the CA validates on (SO_REUSEPORT): either may be asked.
    let servers: Vec<(Server, std::net::SocketAddr)> = ["a", "b"]
        .into_iter()
        .map(|name| fleet_member(dir.path(), name, &pebble, port, &redis))
        .collect();
    let total = |metric_name: &str, labels: &str| -> f64 {
        servers
            .iter()
            .map(|(_, admin)| metric(*admin, metric_name, labels))
            .sum()
    };
    let ordered = || -> Vec<String> {
        servers
            .iter()
            .flat_map(|(server, _)| server.log.lines_with("ACME certificate ordered"))
            .collect()
    };
    // The first certificate and at least two renewals, each ordered by one member.
    wait_until("two renewals", || ordered().len() >= 3);
    // Each order renews the certificate its member served, which must have been the
    // fleet's newest: a member that ordered instead of taking the newer certificate
    // another had shared would name a certificate that was already renewed. (A member may
    // skip a certificate that was renewed again before it looked: it only needs the
    // newest, so how many certificates each takes from the fleet is not fixed.)
    let mut replaced: Vec<String> = ordered()
        .into_iter()
        .map(|line| {
            let (_, rest) = line.split_once("replaces=").expect(&line);
            rest.split_whitespace().next().unwrap().to_string()
        })
        .collect();
    let orders = replaced.len();
    assert!(orders >= 3, "{replaced:?}");
    replaced.sort();
    replaced.dedup();
    // The members' ACME lines and warnings, to tell a missed certificate from a failed
    // Redis read.
    let acme_lines = || -> String {
        servers
            .iter()
            .flat_map(|(server, _)| server.log.lines_with(""))
            .filter(|l| l.contains("ACME") || l.contains("WARN") || l.contains("Redis"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        replaced.len(),
        orders,
        "two orders renewed the same certificate:\n{}",
        acme_lines()
    );
    assert!(
        total(
            "tlsterm_acme_certificates_installed_total",
            "source=\"fleet\""
        ) >= 1.0,
        "members take certificates the fleet ordered"
    );
    // The CA logs an issuance before the member that ordered it has the certificate.
    assert!(pebble.log.count("Issued certificate serial") >= orders);
}

/// Redis's `INFO stats` counter `field`.
fn redis_stat(connection: &mut redis::Connection, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(connection).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {info}"))
        .trim()
        .parse()
        .unwrap()
}

/// Any client may send a validation ClientHello, with any name: a fleet member asks Redis
/// for the answers to names it orders certificates for only, and over its one connection.
#[test]
fn a_fleet_member_looks_up_challenge_answers_only_for_its_own_names() {
    let (_dir, redis, _pebble, _server, port) = fleet_of_one("55");

    let mut connection = redis.connection().unwrap();
    let stats = |connection: &mut redis::Connection| {
        (
            redis_stat(connection, "total_connections_received"),
            redis_stat(connection, "keyspace_misses"),
        )
    };
    let validate = |name: &str| {
        let out = s_client(port, &["-servername", name, "-alpn", "acme-tls/1"], "");
        assert!(!out.contains("BEGIN CERTIFICATE"), "{name}: {out}");
    };
    let (connections, misses) = stats(&mut connection);
    validate("other.example");
    assert_eq!(
        stats(&mut connection),
        (connections, misses),
        "a name not ordered here is refused without asking Redis"
    );
    // Its own name, with no challenge pending anywhere (the answer its order shared is
    // gone): asked, one GET that finds nothing, over the connection the member has.
    let _: () = redis::cmd("DEL")
        .arg(format!("tlsterm:session:acme:challenge:{NAME}"))
        .query(&mut connection)
        .unwrap();
    validate(NAME);
    assert_eq!(stats(&mut connection), (connections, misses + 1));
}

/// A flood of validation ClientHellos for a name the fleet orders, without an answer
/// anywhere, costs Redis a few lookups, not one per ClientHello: those arriving together
/// share a lookup, and a name is looked up at most every 250 ms. Each is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_validation_client_hellos_shares_fleet_lookups() {
    let (_dir, redis, _pebble, server, port) = tokio::task::block_in_place(|| fleet_of_one("99"));
    let admin = admin_address(&_dir.path().join("a").join("tlsterm.toml")).unwrap();
    let mut connection = redis.connection().unwrap();
    let _: () = redis::cmd("DEL")
        .arg(format!("tlsterm:session:acme:challenge:{NAME}"))
        .query(&mut connection)
        .unwrap();
    let misses = redis_stat(&mut connection, "keyspace_misses");
    const HELLOS: usize = 200;
    let started = std::time::Instant::now();
    let hellos: Vec<_> = (0..HELLOS)
        .map(|_| {
            tokio::spawn(async move {
                tls_connect(port, NAME, SslVersion::TLS1_3, &["acme-tls/1"]).await
            })
        })
        .collect();
    let mut answered = 0;
    for hello in hellos {
        answered += usize::from(hello.await.unwrap().is_ok());
    }
    // Every ClientHello refused; should one be answered, the server's last lines say
    // which answer it held (its own order's, or one learnt from the fleet).
    let log = server.log.text();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    assert_eq!(
        answered,
        0,
        "{answered} of {HELLOS} validation ClientHellos answered; the server's last lines:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    let lookups = redis_stat(&mut connection, "keyspace_misses") - misses;
    // One at once, then one per interval while ClientHellos keep coming.
    let most = 2 + (started.elapsed().as_millis() / 250) as u64;
    assert!(
        (1..=most).contains(&lookups),
        "{lookups} lookups for {HELLOS} ClientHellos in {:?}",
        started.elapsed()
    );
    let counted = |result: &str| {
        metric(
            admin,
            "tlsterm_acme_fleet_challenge_lookups_total",
            &format!("result=\"{result}\""),
        )
    };
    assert_eq!(counted("none"), HELLOS as f64);
    assert_eq!(counted("answered") + counted("refused"), 0.0);
}

/// The plain-HTTP listener holds at most 8 connections per client address, and one that
/// sends no request within 3 s gives its slot back: idle connections from one address do
/// not keep another's request (the CA's fetch) waiting in the accept queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_one_address_do_not_delay_the_http_listener() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let pebble = Pebble::start(dir.path(), free_port(), free_port(), 3600);
    let http_port = free_port();
    let extra = format!("challenge = \"http-01\"\nhttp_address = \"127.0.0.1:{http_port}\"");
    let config = acme_config(dir.path(), &pebble, free_port(), &extra, "");
    let admin = admin_address(&config).unwrap();
    let server = Server::start(&config);
    server.log.wait_for("plain-HTTP listener", 0);
    let address: std::net::SocketAddr = ([127, 0, 0, 1], http_port).into();

    let started = std::time::Instant::now();
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(tokio::net::TcpStream::connect(address).await.unwrap());
    }
    let refused = || {
        metric(
            admin,
            "tlsterm_acme_http_connections_refused_total",
            "reason=\"per_address\"",
        )
    };
    tokio::task::block_in_place(|| wait_until("idle connections refused", || refused() >= 250.0));

    // Another address is answered at once.
    let asked = std::time::Instant::now();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(address).await.unwrap();
    other
        .write_all(b"GET / HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, other.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 301"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(2),
        "answered after {:?}",
        asked.elapsed()
    );
    // Every idle connection ends: at once beyond the 8, after the header timeout for those.
    for mut connection in idle {
        let mut rest = Vec::new();
        tokio::time::timeout(DEADLINE, connection.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(9),
        "idle connections held for {:?}",
        started.elapsed()
    );
}

/// A fresh Pebble and redis-server, and a fleet of one member ("a", fleet key bytes
/// `key_byte` repeated) whose certificate is installed: its directory, Redis, Pebble, the
/// member and its port.
fn fleet_of_one(key_byte: &str) -> (tempfile::TempDir, Redis, Pebble, Server, u16) {
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start();
    let port = free_port();
    let pebble = Pebble::start(dir.path(), port, free_port(), 3600);
    write_fleet_key(&dir.path().join("fleet.key"), &[&key_byte.repeat(32)]);
    let (server, _) = fleet_member(dir.path(), "a", &pebble, port, &redis);
    server.log.wait_for("ACME certificate installed", 0);
    (dir, redis, pebble, server, port)
}

/// The listener's `acme` names in `config` become `names` (a TOML array's inside).
fn set_acme_names(config: &Path, names: &str) {
    let text = std::fs::read_to_string(config).unwrap().replace(
        &format!("acme = {{ names = [\"{NAME}\"] }}"),
        &format!("acme = {{ names = [{names}] }}"),
    );
    std::fs::write(config, text).unwrap();
}

/// X.509 allows a Common Name of at most 64 characters, and BoringSSL writes no longer
/// one: a first name longer than that is ordered, and answered, with the name in the
/// subjectAltName only.
#[test]
fn a_name_longer_than_a_common_name_allows_is_ordered() {
    let long = format!("{}.{}.example", "a".repeat(40), "b".repeat(30));
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pebble = Pebble::start(dir.path(), port, free_port(), 3600);
    let config = acme_config(dir.path(), &pebble, port, "", "");
    set_acme_names(&config, &format!("\"{long}\""));
    let server = Server::start(&config);
    server.log.wait_for("ACME certificate installed", 0);
    let root = pebble.root(&dir.path().join("root.pem"));
    let (verified, _, text) = served(port, &long, &root);
    assert!(verified, "{text}");
    assert!(text.contains(&format!("DNS:{long}")), "{text}");
}

/// A name added to a fleet's certificate keeps its storage name (the first name), so Redis
/// still holds the certificate for the old names: the member does not take it, it orders
/// one for every name.
#[test]
fn a_fleet_certificate_that_gains_a_name_is_ordered_again() {
    let (dir, redis, pebble, first, port) = fleet_of_one("33");
    // It lets go of the order lock right after installing; stopped before that, it would
    // keep the second member waiting for the lock to expire.
    let mut connection = redis.connection().unwrap();
    let lock = order_lock("ecdsa-p256");
    wait_until("the order lock released", || {
        let held: bool = redis::cmd("EXISTS")
            .arg(&lock)
            .query(&mut connection)
            .unwrap();
        !held
    });
    drop(first);

    let own = dir.path().join("b");
    std::fs::create_dir(&own).unwrap();
    std::fs::copy(dir.path().join("fleet.key"), own.join("fleet.key")).unwrap();
    let session = format!(
        "[session]\nredis_url = \"{}\"\nfleet_key_file = \"fleet.key\"",
        redis.url()
    );
    let config = acme_config(&own, &pebble, port, "", &session);
    set_acme_names(&config, &format!("\"{NAME}\", \"more.example\""));
    let admin = admin_address(&config).unwrap();
    let second = Server::start(&config);
    second.log.wait_for("ACME certificate installed", 0);
    assert_eq!(
        metric(admin, "tlsterm_acme_orders_total", "result=\"issued\""),
        1.0
    );
    let root = pebble.root(&dir.path().join("root.pem"));
    let (verified, _, text) = served(port, "more.example", &root);
    assert!(verified, "{text}");
    assert!(text.contains("DNS:more.example"), "{text}");
}

/// In a fleet whose Redis is down, a member orders on its own and answers its own TLS-ALPN-01
/// challenge: it cannot share the answer, but that does not stop the order.
#[test]
fn a_fleet_member_orders_alone_while_redis_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pebble = Pebble::start(dir.path(), port, free_port(), 3600);
    write_fleet_key(&dir.path().join("fleet.key"), &[&"44".repeat(32)]);
    // Nothing listens there.
    let session = format!(
        "[session]\nredis_url = \"redis://127.0.0.1:{}\"\nfleet_key_file = \"fleet.key\"",
        free_port()
    );
    let config = acme_config(dir.path(), &pebble, port, "", &session);
    let server = Server::start(&config);
    server.log.wait_for("ordering without the fleet lock", 0);
    server.log.wait_for("ACME certificate installed", 0);
    let root = pebble.root(&dir.path().join("root.pem"));
    let (verified, _, text) = served(port, NAME, &root);
    assert!(verified, "{text}");
}

#[test]
fn http01_is_answered_on_the_plain_http_listener_which_redirects_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (port, http_port) = (free_port(), free_port());
    let pebble = Pebble::start(dir.path(), free_port(), http_port, 3600);
    let extra = format!("challenge = \"http-01\"\nhttp_address = \"127.0.0.1:{http_port}\"");
    let config = acme_config(dir.path(), &pebble, port, &extra, "");
    let server = Server::start(&config);
    server.log.wait_for("ACME certificate installed", 0);
    assert!(served_verified(&pebble, dir.path(), port));
    assert!(pebble.log.contains("Attempting to validate w/ HTTP"));

    let out = run(Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
        ])
        .args(["-H", "Host: a.example:80"])
        .arg(format!("http://127.0.0.1:{http_port}/path?q=1")));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "301 https://a.example/path?q=1"
    );
    let out = run(Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["-H", "Host: a.example"])
        .arg(format!(
            "http://127.0.0.1:{http_port}/.well-known/acme-challenge/nope"
        )));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "404");
}

/// Two fleets sharing one Redis, each with its own `[session] redis_prefix`, do not
/// share ACME locks, answers or certificates: a member of the second orders while the
/// first fleet's lock for the same certificate is held, and keeps its certificate under
/// its own prefix.
#[test]
fn fleets_with_their_own_redis_prefix_do_not_share_acme_locks() {
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start();
    let port = free_port();
    let pebble = Pebble::start(dir.path(), port, free_port(), 3600);
    write_fleet_key(&dir.path().join("fleet.key"), &[&"88".repeat(32)]);
    let mut connection = redis.connection().unwrap();
    // The first fleet (default prefix) holds the lock and never lets go.
    hold_order_lock(&mut connection, "ecdsa-p256", "first fleet");
    let session = format!(
        "[session]\nredis_url = \"{}\"\nfleet_key_file = \"fleet.key\"\nredis_prefix = \"second:\"",
        redis.url()
    );
    let config = acme_config(dir.path(), &pebble, port, "", &session);
    let server = Server::start(&config);
    server.log.wait_for("ACME certificate installed", 0);
    let exists = |key: String| {
        redis::cmd("EXISTS")
            .arg(key)
            .query::<i64>(&mut redis.connection().unwrap())
            .unwrap()
            == 1
    };
    assert!(exists(format!("second:acme:cert:{NAME}_ecdsa-p256")));
    assert!(!exists(format!(
        "tlsterm:session:acme:cert:{NAME}_ecdsa-p256"
    )));
}

/// Redis is not trusted with challenge answers: an answer written there without the
/// fleet key (a TLS-ALPN-01 digest, an HTTP-01 key authorization), with which whoever can
/// write to Redis would get certificates for the fleet's names from the CA, is not served
/// but counted; one sealed with the fleet key (the entry's Redis key, which holds the name
/// or the token, as associated data) is.
#[test]
fn challenge_answers_in_redis_are_served_only_when_sealed_with_the_fleet_key() {
    use tlsterm::seal::FleetKey;
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start();
    let pebble = Pebble::start(dir.path(), free_port(), free_port(), 3600);
    let key_line = "77".repeat(32);
    write_fleet_key(&dir.path().join("fleet.key"), &[&key_line]);
    let fleet_key = FleetKey::parse(&key_line).unwrap();
    // The test holds the order lock: the members never order, they only answer.
    let mut connection = redis.connection().unwrap();
    let set = |connection: &mut redis::Connection, key: &str, value: &[u8]| {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(120_000)
            .query(connection)
            .unwrap();
    };
    hold_order_lock(&mut connection, "ecdsa-p256", "test");
    let member = |name: &str, port: u16, extra: &str| {
        let own = dir.path().join(name);
        std::fs::create_dir(&own).unwrap();
        std::fs::copy(dir.path().join("fleet.key"), own.join("fleet.key")).unwrap();
        let session = format!(
            "[session]\nredis_url = \"{}\"\nfleet_key_file = \"fleet.key\"",
            redis.url()
        );
        let config = acme_config(&own, &pebble, port, extra, &session);
        (Server::start(&config), admin_address(&config).unwrap())
    };
    let refused = |admin, entry: &str| {
        metric(
            admin,
            "tlsterm_fleet_entries_refused_total",
            &format!("entry=\"{entry}\""),
        )
    };

    // TLS-ALPN-01.
    let port = free_port();
    let (_alpn, admin) = member("alpn", port, "");
    let entry = format!("tlsterm:session:acme:challenge:{NAME}");
    set(&mut connection, &entry, &[0x41; 32]);
    let validate = || s_client(port, &["-servername", NAME, "-alpn", "acme-tls/1"], "");
    let out = validate();
    assert!(!out.contains("BEGIN CERTIFICATE"), "{out}");
    assert_eq!(refused(admin, "acme_challenge"), 1.0);
    // Sealed for another name: refused too.
    let elsewhere = fleet_key
        .seal(b"tlsterm:session:acme:challenge:b.example", &[0x42; 32])
        .unwrap();
    set(&mut connection, &entry, &elsewhere);
    assert!(!validate().contains("BEGIN CERTIFICATE"));
    assert_eq!(refused(admin, "acme_challenge"), 2.0);
    let sealed = fleet_key.seal(entry.as_bytes(), &[0x42; 32]).unwrap();
    set(&mut connection, &entry, &sealed);
    let out = validate();
    assert!(out.contains("BEGIN CERTIFICATE"), "{out}");
    assert_eq!(refused(admin, "acme_challenge"), 2.0);

    // HTTP-01.
    let http_port = free_port();
    let extra = format!("challenge = \"http-01\"\nhttp_address = \"127.0.0.1:{http_port}\"");
    let (http, admin) = member("http", free_port(), &extra);
    http.log.wait_for("plain-HTTP listener", 0);
    let fetch = |token: &str| {
        raw_http(
            ([127, 0, 0, 1], http_port).into(),
            &format!("GET /.well-known/acme-challenge/{token} HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n"),
        )
    };
    let answer = serde_json::to_vec(&(NAME, "forged.thumbprint")).unwrap();
    set(
        &mut connection,
        "tlsterm:session:acme:http01:forged",
        &answer,
    );
    assert_eq!(fetch("forged").0, 404);
    assert_eq!(refused(admin, "acme_http01"), 1.0);
    let entry = "tlsterm:session:acme:http01:sealed";
    let answer = serde_json::to_vec(&(NAME, "sealed.thumbprint")).unwrap();
    set(
        &mut connection,
        entry,
        &fleet_key.seal(entry.as_bytes(), &answer).unwrap(),
    );
    assert_eq!(fetch("sealed"), (200, "sealed.thumbprint".to_string()));
    // The same sealed answer moved to another token: refused.
    let moved = redis::cmd("GET")
        .arg(entry)
        .query::<Vec<u8>>(&mut connection);
    set(
        &mut connection,
        "tlsterm:session:acme:http01:moved",
        &moved.unwrap(),
    );
    assert_eq!(fetch("moved").0, 404);
    assert_eq!(refused(admin, "acme_http01"), 2.0);
}

/// HTTP-01 in a fleet: the CA's request may reach a member other than the one that
/// ordered (a load balancer in front of the fleet), and that member answers it from Redis.
#[test]
fn http01_is_answered_by_another_member_of_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start();
    let (ordering_port, answering_port, ca_http_port) = (free_port(), free_port(), free_port());
    let pebble = Pebble::start(dir.path(), free_port(), ca_http_port, 3600);
    write_fleet_key(&dir.path().join("fleet.key"), &[&"66".repeat(32)]);
    let member = |name: &str, port: u16, http_port: u16, key_types: &str| {
        let own = dir.path().join(name);
        std::fs::create_dir(&own).unwrap();
        std::fs::copy(dir.path().join("fleet.key"), own.join("fleet.key")).unwrap();
        let session = format!(
            "[session]\nredis_url = \"{}\"\nfleet_key_file = \"fleet.key\"",
            redis.url()
        );
        let extra = format!("challenge = \"http-01\"\nhttp_address = \"127.0.0.1:{http_port}\"");
        let config = acme_config(&own, &pebble, port, &extra, &session);
        set_acme_names(
            &config,
            &format!("\"{NAME}\"], key_types = [\"{key_types}\""),
        );
        Server::start(&config)
    };
    // The answering member orders only its RSA certificate, whose order lock the test
    // holds: it never orders, but it serves the port the CA's requests arrive on.
    let mut connection = redis.connection().unwrap();
    hold_order_lock(&mut connection, "rsa-2048", "test");
    let answering = member("answering", answering_port, ca_http_port, "rsa-2048");
    answering.log.wait_for("plain-HTTP listener", 0);
    // The ordering member's own plain-HTTP listener is one the CA never asks.
    let ordering = member("ordering", ordering_port, free_port(), "ecdsa-p256");
    ordering.log.wait_for("ACME certificate installed", 0);
    assert!(pebble.log.contains("Attempting to validate w/ HTTP"));
    assert!(served_verified(&pebble, dir.path(), ordering_port));
}

#[test]
fn an_external_account_binding_is_sent_when_the_ca_requires_one() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let key = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";
    let eab = serde_json::json!({
        "externalAccountBindingRequired": true,
        "externalAccountMACKeys": { "kid-1": key },
    });
    let pebble = Pebble::start_with(dir.path(), port, free_port(), 3600, eab);
    std::fs::write(dir.path().join("eab.key"), format!("{key}\n")).unwrap();
    let extra = "external_account = { key_id = \"kid-1\", hmac_key_file = \"eab.key\" }";
    let config = acme_config(dir.path(), &pebble, port, extra, "");
    let server = Server::start(&config);
    server.log.wait_for("ACME certificate installed", 0);
    assert!(served_verified(&pebble, dir.path(), port));
}

#[test]
fn a_reload_starts_and_ends_the_names_it_adds_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pebble = Pebble::start(dir.path(), port, free_port(), 3600);
    let config = acme_config(dir.path(), &pebble, port, "", "");
    let admin = admin_address(&config).unwrap();
    let server = Server::start(&config);
    server.log.wait_for("ACME certificate installed", 0);
    let root = pebble.root(&dir.path().join("root.pem"));
    assert!(served(port, NAME, &root).0);

    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("names = [\"a.example\"]", "names = [\"b.example\"]");
    std::fs::write(&config, text).unwrap();
    assert!(server.reload().contains("reloaded"));
    server
        .log
        .wait_for("certificate=b.example_ecdsa-p256 source=\"order\"", 0);
    let (verified, _, san) = served(port, "b.example", &root);
    assert!(verified && san.contains("DNS:b.example"), "{san}");
    // a.example is no longer served from ACME, nor renewed.
    assert!(!served(port, NAME, &root).0);
    assert!(server.log.contains("certificate=a.example_ecdsa-p256"));
    assert!(server.log.contains("no longer configured"));
    assert_eq!(
        metric(
            admin,
            "tlsterm_acme_next_renewal_seconds",
            "name=\"a.example\""
        ),
        0.0
    );
}

/// A reload that adds a name to a certificate: until the CA issues the new one, the one
/// it replaces keeps serving the names it has (here the CA is down meanwhile).
#[test]
fn a_name_added_by_a_reload_leaves_the_others_served_until_the_new_certificate_comes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut pebble = Pebble::start(dir.path(), port, free_port(), 3600);
    let config = acme_config(dir.path(), &pebble, port, "", "");
    let server = Server::start(&config);
    server.log.wait_for("ACME certificate installed", 0);
    let root = pebble.root(&dir.path().join("root.pem"));
    let (_, serial, _) = served(port, NAME, &root);

    pebble.stop();
    set_acme_names(&config, &format!("\"{NAME}\", \"more.example\""));
    assert!(server.reload().contains("reloaded"));
    server.log.wait_for("ACME order failed", 0);
    let (verified, still, _) = served(port, NAME, &root);
    assert!(verified, "a.example is still served by an ACME certificate");
    assert_eq!(still, serial, "the certificate it had");

    // The CA comes back (with a new root): the certificate for both names replaces it.
    pebble.resume();
    server.log.wait_for_count("ACME certificate installed", 2);
    let root = pebble.root(&dir.path().join("root2.pem"));
    let (verified, _, san) = served(port, "more.example", &root);
    assert!(verified, "{san}");
    assert!(
        san.contains("DNS:a.example") && san.contains("DNS:more.example"),
        "{san}"
    );
}

#[test]
fn check_validates_an_acme_configuration_without_ordering() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tlsterm.toml");
    std::fs::write(
        &config,
        format!(
            "[acme]\ndirectory = \"https://127.0.0.1:{}/dir\"\nstorage = \"acme\"\n\n[[listener]]\naddress = \"127.0.0.1:{}\"\nbackends = [\"builtin\"]\nacme = {{ names = [\"{NAME}\"], key_types = [\"ecdsa-p256\", \"rsa-2048\"] }}\n",
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    let out = run(Command::new(TLSTERM)
        .args(["serve", "--check", "-c"])
        .arg(&config));
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration OK"));
    assert!(
        !dir.path().join("acme").exists(),
        "nothing ordered, nothing stored"
    );

    // A name an ACME CA cannot validate is refused with its line.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(NAME, "*.a.example");
    std::fs::write(&config, text).unwrap();
    let err = check_refuses(&config);
    assert!(err.contains(":8:") && err.contains("acme.names"), "{err}");
}
