//! Session resumption end to end: how many TLS 1.3 tickets a handshake sends
//! (`num_tickets`, counted by `openssl s_client`), tickets shared through a key file, in-memory key
//! rotation with a grace period, session IDs and ticket keys shared through a real Redis
//! (plain and TLS), Redis dying under load, the session cache bound. The client is BoringSSL in-process, with its own session
//! capture (the common `tls_connect` does not resume).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::config::{ConfigBuilder, Section};
use crate::common::*;
use boring::ssl::{
    SslConnector, SslMethod, SslSession, SslSessionCacheMode, SslSessionRef, SslVerifyMode,
    SslVersion,
};
use tokio::net::TcpStream;

// ---------------------------------------------------------------------------------------
// Client with session capture

/// A client that keeps the last session the server gave it.
struct Client {
    connector: SslConnector,
    last: Arc<Mutex<Option<SslSession>>>,
}

struct Connected {
    reused: bool,
    version: &'static str,
    /// The session to offer next time (the newest ticket, or the session-ID session).
    session: Option<SslSession>,
}

impl Client {
    fn new(max_version: SslVersion) -> Client {
        let last = Arc::new(Mutex::new(None));
        let mut builder = SslConnector::builder(SslMethod::tls()).unwrap();
        builder.set_verify(SslVerifyMode::NONE);
        builder.set_max_proto_version(Some(max_version)).unwrap();
        builder.set_session_cache_mode(SslSessionCacheMode::CLIENT);
        let slot = last.clone();
        builder.set_new_session_callback(move |_ssl, session| {
            *slot.lock().unwrap() = Some(session);
        });
        Client {
            connector: builder.build(),
            last,
        }
    }

    /// Handshake (offering `offer`), one HTTP request (so TLS 1.3 tickets arrive), close.
    async fn connect(&self, port: u16, offer: Option<&SslSession>) -> anyhow::Result<Connected> {
        self.last.lock().unwrap().take();
        let mut config = self.connector.configure()?;
        if let Some(session) = offer {
            // SAFETY: every session offered comes from this client's connector.
            unsafe { config.set_session(session)? };
        }
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        let mut stream =
            tokio::time::timeout(DEADLINE, tokio_boring::connect(config, "localhost", tcp))
                .await??;
        let reused = stream.ssl().session_reused();
        let version = stream.ssl().version_str();
        let body = tokio::time::timeout(DEADLINE, http_get(&mut stream, "/bytes/10")).await??;
        anyhow::ensure!(body.len() == 10, "short body");
        let session = self.last.lock().unwrap().take();
        Ok(Connected {
            reused,
            version,
            session,
        })
    }

    /// A full handshake; returns the session it produced.
    async fn fresh(&self, port: u16) -> SslSession {
        let c = self.connect(port, None).await.unwrap();
        assert!(!c.reused);
        c.session.expect("the server gave a session")
    }

    /// Offers `session`; says whether it was resumed (the handshake itself must succeed).
    async fn resumes(&self, port: u16, session: &SslSession) -> bool {
        self.connect(port, Some(session)).await.unwrap().reused
    }
}

/// The name of the key that encrypted a session's ticket (its first 16 bytes).
fn ticket_key_name(session: &SslSessionRef) -> Option<Vec<u8>> {
    let mut data = std::ptr::null();
    let mut len = 0usize;
    // SAFETY: a `&SslSessionRef` is a pointer to the SSL_SESSION it wraps (foreign-types);
    // get0_ticket only reads it and returns a borrowed pointer valid while `session` is.
    unsafe {
        boring_sys::SSL_SESSION_get0_ticket(
            session as *const SslSessionRef as *const boring_sys::SSL_SESSION,
            &mut data,
            &mut len,
        );
        (len >= 16).then(|| std::slice::from_raw_parts(data, 16).to_vec())
    }
}

// ---------------------------------------------------------------------------------------
// Servers, configuration, metrics

struct Setup {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// The fleet key of every process of the test that uses Redis (unless its `[session]`
    /// names another).
    fleet_key: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    // ECDSA: cheap full handshakes, so tests that make hundreds of them stay quick.
    let (cert, key) = make_cert(dir.path(), "ecdsa", "localhost", KeyType::EcdsaP256);
    let fleet_key = fleet_key_file(dir.path(), "fleet.key");
    Setup {
        dir: dir.path().to_path_buf(),
        _dir: dir,
        cert,
        key,
        fleet_key,
    }
}

struct Instance {
    server: Server,
    port: u16,
    admin: u16,
}

impl Setup {
    /// Writes `<name>.toml` (one listener, `session` as its `[session]`).
    fn config(&self, name: &str, port: u16, admin: u16, session: &Section) -> PathBuf {
        let mut session = session.clone();
        if session.has("redis_url") && !session.has("fleet_key_file") {
            session = session.set("fleet_key_file", &self.fleet_key);
        }
        let config = ConfigBuilder::new()
            .section("admin", |a| a.set("address", format!("127.0.0.1:{admin}")))
            .session_as(&session)
            .listener(|l| l.port(port).backend("builtin").cert(&self.cert, &self.key));
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, config.render()).unwrap();
        path
    }

    fn start(&self, name: &str, session: &Section) -> Instance {
        let port = free_port();
        let admin = free_port();
        let server = Server::start(&self.config(name, port, admin, session));
        Instance {
            server,
            port,
            admin,
        }
    }
}

/// What a process logs once it uses the ticket keys it read from Redis.
const SHARED_KEYS: &str = "ticket keys in use: shared through Redis";

/// What a process logs when it cannot read the shared ticket keys.
const NO_SHARED_KEYS: &str = "cannot read the shared session ticket keys";

/// A `[session]` with `redis_ticket_keys` through the Redis at `url` (no session-ID
/// cache, so resumptions are by ticket).
fn shared_keys_session(url: &str) -> Section {
    Section::default()
        .set("redis_ticket_keys", true)
        .set("redis_url", url)
        .set("cache", false)
}

impl Setup {
    /// Starts a process with `redis_ticket_keys` and waits until it uses the shared keys.
    fn start_sharing_keys(&self, name: &str, session: &Section) -> Instance {
        let instance = self.start(name, session);
        instance.server.log.wait_for(SHARED_KEYS, 0);
        instance
    }

    /// Starts a process with `redis_ticket_keys` whose Redis does not give it the keys,
    /// and waits until it says so.
    fn start_without_shared_keys(&self, name: &str, session: &Section) -> Instance {
        let instance = self.start(name, session);
        instance.server.log.wait_for(NO_SHARED_KEYS, 0);
        assert!(!instance.server.log.contains(SHARED_KEYS));
        instance
    }
}

impl Instance {
    /// Sum of the samples of `name` whose labels contain `labels` (e.g. `result="redis"`).
    fn metric(&self, name: &str, labels: &str) -> f64 {
        metric(([127, 0, 0, 1], self.admin).into(), name, labels)
    }
}

// ---------------------------------------------------------------------------------------
// Redis

impl Redis {
    fn exists(&self, key: &str) -> bool {
        let mut c = self.connection().unwrap();
        redis::cmd("EXISTS").arg(key).query::<i64>(&mut c).unwrap() == 1
    }

    /// Waits until the session is in Redis (stores are asynchronous).
    fn wait_for_session(&self, session: &SslSessionRef) {
        let key = format!("tlsterm:session:{}", hex(session.id()));
        let deadline = Instant::now() + DEADLINE;
        while !self.exists(&key) {
            assert!(
                Instant::now() < deadline,
                "session {key} never reached Redis"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------
// Tests

/// A ticket issued by process A is accepted by process B with the same key file (TLS 1.3 and
/// 1.2); a ticket under a key B does not have gives a full handshake; SIGHUP re-reads the
/// file (the new last line encrypts, the old key still decrypts) and a broken file is refused.
#[tokio::test]
async fn tickets_from_a_shared_key_file_resume_on_another_process() {
    let s = setup();
    let keys = s.dir.join("ticket.keys");
    let first = key_line(1);
    std::fs::write(&keys, format!("# tlsterm ticket keys\n{first}\n")).unwrap();
    let session = Section::default()
        .set("ticket_key_file", &keys)
        .set("cache", false);
    let a = s.start("a", &session);
    let b = s.start("b", &session);
    let other_keys = s.dir.join("other.keys");
    std::fs::write(&other_keys, key_line(9)).unwrap();
    let c = s.start("c", &session.clone().set("ticket_key_file", &other_keys));

    for version in [SslVersion::TLS1_3, SslVersion::TLS1_2] {
        let client = Client::new(version);
        let session = client.fresh(a.port).await;
        assert_eq!(ticket_key_name(&session).unwrap()[0], 1);
        let on_b = client.connect(b.port, Some(&session)).await.unwrap();
        assert!(on_b.reused, "{version:?}: B resumes A's ticket");
        let expected = if version == SslVersion::TLS1_3 {
            "TLSv1.3"
        } else {
            "TLSv1.2"
        };
        assert_eq!(on_b.version, expected);
        assert!(client.resumes(a.port, &session).await);
        // Unknown key: a full handshake, not an error.
        assert!(!client.resumes(c.port, &session).await, "{version:?}");
    }

    // Rotate the file: a new key appended (it encrypts), the old one kept (it decrypts).
    let client = Client::new(SslVersion::TLS1_2);
    let old = client.fresh(a.port).await;
    std::fs::write(&keys, format!("{first}\n{}\n", key_line(2))).unwrap();
    assert!(a.server.reload().contains("reloaded"));
    let new = client.fresh(a.port).await;
    assert_eq!(
        ticket_key_name(&new).unwrap()[0],
        2,
        "the last line encrypts"
    );
    let renewed = client.connect(a.port, Some(&old)).await.unwrap();
    assert!(
        renewed.reused,
        "the old key still decrypts after the reload"
    );
    assert_eq!(
        ticket_key_name(renewed.session.as_ref().expect("renewed ticket")).unwrap()[0],
        2,
        "a ticket under an older key is renewed under the current one"
    );
    // B has not reloaded: it does not know key 2 yet, and says so with a full handshake.
    assert!(!client.resumes(b.port, &new).await);

    // A broken key file refuses the whole reload; the keys in use stay.
    std::fs::write(&keys, "not base64 !!!\n").unwrap();
    let verdict = a.server.reload();
    assert!(verdict.contains("reload refused"), "{verdict}");
    assert!(client.resumes(a.port, &new).await);
    assert!(client.resumes(a.port, &old).await);
}

/// `redis_ticket_keys`: processes sharing a Redis resume each other's tickets without a key
/// file, and a restarted process finds the keys in Redis. A process whose Redis is down at
/// start serves with keys of its own, and takes the shared ones once Redis is back, its own
/// still decrypting.
#[tokio::test]
async fn ticket_keys_shared_through_redis() {
    let s = setup();
    let redis = Redis::start();
    let session = shared_keys_session(&redis.url());
    let a = s.start_sharing_keys("a", &session);
    let b = s.start_sharing_keys("b", &session);
    for version in [SslVersion::TLS1_3, SslVersion::TLS1_2] {
        let client = Client::new(version);
        let session = client.fresh(a.port).await;
        assert!(
            client.resumes(b.port, &session).await,
            "{version:?}: B resumes A's ticket"
        );
    }
    let client = Client::new(SslVersion::TLS1_3);
    let from_b = client.fresh(b.port).await;

    // A restart: the keys are in Redis, not in the process.
    drop(a);
    let a = s.start_sharing_keys("a", &session);
    assert!(client.resumes(a.port, &from_b).await);
    let syncs = "op=\"ticket_keys\",result=\"ok\"";
    assert!(a.metric("tlsterm_session_redis_operations_total", syncs) >= 1.0);

    // Redis down at start (a short rotation makes the retries quick).
    let mut down = Redis::start();
    let port = down.port;
    down.kill();
    let session = shared_keys_session(&down.url())
        .set("ticket_rotation", "4s")
        .set("ticket_grace", "40s");
    let c = s.start_without_shared_keys("c", &session);
    let own = client.fresh(c.port).await;
    assert!(client.resumes(c.port, &own).await, "c's own keys work");
    let _up = Redis::start_on(port);
    c.server.log.wait_for(SHARED_KEYS, 0);
    assert!(
        client.resumes(c.port, &own).await,
        "the own key still decrypts"
    );
    // c's new tickets are under the fleet's key: another process of that Redis resumes them.
    let now_shared = client.fresh(c.port).await;
    let d = s.start_sharing_keys("d", &session);
    assert!(client.resumes(d.port, &now_shared).await);
}

/// `rediss://`: the fleet's ticket keys travel over TLS, checked against `redis_ca_file`;
/// a process that does not trust the server's certificate gets no keys from it.
#[tokio::test]
async fn ticket_keys_shared_through_redis_over_tls() {
    let s = setup();
    let ca_dir = s.dir.join("redis-ca");
    std::fs::create_dir(&ca_dir).unwrap();
    let redis = Redis::start_tls(&ca_dir, "127.0.0.1");
    let trusting = |url: &str| shared_keys_session(url).set("redis_ca_file", "redis-ca/ca.pem");
    let session = trusting(&redis.url());
    let a = s.start_sharing_keys("a", &session);
    let b = s.start_sharing_keys("b", &session);
    let client = Client::new(SslVersion::TLS1_3);
    let ticket = client.fresh(a.port).await;
    assert!(
        client.resumes(b.port, &ticket).await,
        "B resumes A's ticket"
    );

    // The system's roots do not include the test CA: no keys, and a warning.
    let c = s.start_without_shared_keys("c", &shared_keys_session(&redis.url()));
    assert!(!client.resumes(c.port, &ticket).await);

    // A certificate from the trusted CA for another address: refused too.
    let misnamed = Redis::start_tls(&ca_dir, "127.0.0.2");
    s.start_without_shared_keys("d", &trusting(&misnamed.url()));
}

/// A Redis that refuses writes but still answers reads (here `min-replicas-to-write` not
/// met: NOREPLICAS; likewise maxmemory with noeviction, or a read-only replica) still gives
/// the keys it holds: a process started then shares them, and says once why it cannot store
/// new ones.
#[tokio::test]
async fn ticket_keys_shared_through_redis_that_refuses_writes() {
    let s = setup();
    let redis = Redis::start();
    let session = shared_keys_session(&redis.url());
    let a = s.start_sharing_keys("a", &session);
    // A has stored the keys of this epoch and the next; from now on every write fails.
    let mut c = redis.connection().unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("min-replicas-to-write")
        .arg(1)
        .query::<()>(&mut c)
        .unwrap();
    let refused = redis::cmd("SET").arg("probe").arg(1).query::<()>(&mut c);
    assert!(
        refused.is_err_and(|e| e.code() == Some("NOREPLICAS")),
        "Redis refuses writes"
    );

    let b = s.start_sharing_keys("b", &session);
    let warning = "Redis refuses to store new shared session ticket keys";
    assert_eq!(b.server.log.count(warning), 1);
    assert!(b.server.log.contains("NOREPLICAS"), "the reason is logged");
    assert!(!b.server.log.contains(NO_SHARED_KEYS));
    let syncs = "op=\"ticket_keys\",result=\"ok\"";
    assert!(b.metric("tlsterm_session_redis_operations_total", syncs) >= 1.0);

    for version in [SslVersion::TLS1_3, SslVersion::TLS1_2] {
        let client = Client::new(version);
        let from_a = client.fresh(a.port).await;
        assert!(
            client.resumes(b.port, &from_a).await,
            "{version:?}: B resumes A's ticket"
        );
        let from_b = client.fresh(b.port).await;
        assert!(
            client.resumes(a.port, &from_b).await,
            "{version:?}: A resumes B's ticket"
        );
    }
}

/// In-memory keys: after a rotation, a ticket under the previous key is still accepted
/// during the grace period, and refused (full handshake) after it.
#[tokio::test]
async fn rotated_ticket_key_is_accepted_during_grace_and_refused_after() {
    const ROTATION: Duration = Duration::from_secs(1);
    const GRACE: Duration = Duration::from_secs(3);
    let s = setup();
    let rotating = Section::default()
        .set("ticket_rotation", "1s")
        .set("ticket_grace", "3s")
        .set("cache", false);
    let a = s.start("a", &rotating);
    let tls13 = Client::new(SslVersion::TLS1_3);
    let tls12 = Client::new(SslVersion::TLS1_2);
    let s13 = tls13.fresh(a.port).await;
    let s12 = tls12.fresh(a.port).await;
    // The key was made no later than this, so it decrypts until this + rotation + grace.
    let issued = Instant::now();
    let old_name = ticket_key_name(&s12).unwrap();
    assert_eq!(ticket_key_name(&s13).unwrap(), old_name);

    // Wait for the rotation to show: a new ticket under another key.
    let deadline = issued + DEADLINE;
    loop {
        let probe = tls12.fresh(a.port).await;
        if ticket_key_name(&probe).unwrap() != old_name {
            break;
        }
        assert!(Instant::now() < deadline, "the ticket key never rotated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        issued.elapsed() < ROTATION + GRACE,
        "too slow to check the grace period"
    );
    assert!(
        tls13.resumes(a.port, &s13).await,
        "TLS 1.3 ticket within grace"
    );
    assert!(
        tls12.resumes(a.port, &s12).await,
        "TLS 1.2 ticket within grace"
    );
    assert!(
        issued.elapsed() < ROTATION + GRACE,
        "too slow to check the grace period"
    );

    // Past the grace period (waiting for that deadline is the point of the test).
    let expired = issued + ROTATION + GRACE + Duration::from_millis(300);
    tokio::time::sleep_until(expired.into()).await;
    assert!(
        !tls13.resumes(a.port, &s13).await,
        "TLS 1.3 ticket after grace"
    );
    assert!(
        !tls12.resumes(a.port, &s12).await,
        "TLS 1.2 ticket after grace"
    );
    assert!(a.metric("tlsterm_session_tickets_total", "result=\"unknown_key\"") >= 2.0);
    assert!(a.metric("tlsterm_session_tickets_total", "result=\"old_key\"") >= 2.0);
}

/// Two processes sharing one Redis resume each other's TLS 1.2 session IDs (tickets off).
#[tokio::test]
async fn two_processes_share_session_ids_through_redis() {
    let redis = Redis::start();
    let s = setup();
    let session = Section::default()
        .set("tickets", false)
        .set("redis_url", redis.url());
    let a = s.start("a", &session);
    let b = s.start("b", &session);
    let client = Client::new(SslVersion::TLS1_2);

    let from_a = client.fresh(a.port).await;
    assert!(!from_a.id().is_empty());
    assert!(
        ticket_key_name(&from_a).is_none(),
        "no ticket: tickets are off"
    );
    redis.wait_for_session(&from_a);
    assert!(
        client.resumes(b.port, &from_a).await,
        "B resumes A's session via Redis"
    );
    assert!(
        client.resumes(a.port, &from_a).await,
        "A resumes its own (local cache)"
    );

    let from_b = client.fresh(b.port).await;
    redis.wait_for_session(&from_b);
    assert!(
        client.resumes(a.port, &from_b).await,
        "A resumes B's session via Redis"
    );
    assert!(a.metric("tlsterm_session_cache_lookups_total", "result=\"redis\"") >= 1.0);
    assert!(b.metric("tlsterm_session_cache_lookups_total", "result=\"redis\"") >= 1.0);

    // Sessions survive a reload (new TLS contexts, same cache).
    assert!(a.server.reload().contains("reloaded"));
    assert!(client.resumes(a.port, &from_a).await);
}

impl Redis {
    fn get(&self, key: &str) -> Vec<u8> {
        let mut c = self.connection().unwrap();
        redis::cmd("GET").arg(key).query(&mut c).unwrap()
    }

    fn set(&self, key: &str, value: &[u8]) {
        let mut c = self.connection().unwrap();
        redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("PX")
            .arg(60_000)
            .query::<()>(&mut c)
            .unwrap();
    }
}

fn session_key(session: &SslSessionRef) -> String {
    format!("tlsterm:session:{}", hex(session.id()))
}

const REFUSED: &str = "tlsterm_fleet_entries_refused_total";

/// Redis is not trusted with sessions: what a process stores there is sealed with the
/// fleet key (no master secret in the clear), a process with the same key resumes it,
/// one with another key cannot, and an entry altered, forged (a session written in the
/// clear, with a master secret the writer knows) or moved to another session ID is not
/// used but counted. A rotated key file (the new key first, the old one after) still
/// opens what the old key sealed.
#[tokio::test]
async fn sessions_in_redis_are_sealed_with_the_fleet_key() {
    let redis = Redis::start();
    let s = setup();
    let session = Section::default()
        .set("tickets", false)
        .set("redis_url", redis.url());
    let a = s.start("a", &session);
    let b = s.start("b", &session);
    let other_key = fleet_key_file(&s.dir, "other.key");
    let other = session.clone().set("fleet_key_file", &other_key);
    let c = s.start("c", &other);
    let client = Client::new(SslVersion::TLS1_2);
    let refused = |i: &Instance| i.metric(REFUSED, "entry=\"session\"");

    let from_a = client.fresh(a.port).await;
    redis.wait_for_session(&from_a);
    let mut master = vec![0u8; from_a.master_key_len()];
    from_a.master_key(&mut master);
    let stored = redis.get(&session_key(&from_a));
    assert!(
        !stored.windows(master.len()).any(|w| w == master),
        "the master secret is not in Redis in the clear"
    );
    assert!(client.resumes(b.port, &from_a).await, "the same fleet key");
    assert!(!client.resumes(c.port, &from_a).await, "another fleet key");
    assert_eq!(refused(&c), 1.0);
    assert_eq!(refused(&b), 0.0);

    // Altered: one byte of the sealed entry.
    let altered = client.fresh(a.port).await;
    redis.wait_for_session(&altered);
    let mut entry = redis.get(&session_key(&altered));
    *entry.last_mut().unwrap() ^= 1;
    redis.set(&session_key(&altered), &entry);
    assert!(!client.resumes(b.port, &altered).await);
    assert_eq!(refused(&b), 1.0);

    // Forged: the session written in the clear by someone who knows its master secret.
    let forged = client.fresh(a.port).await;
    redis.wait_for_session(&forged);
    redis.set(&session_key(&forged), &forged.to_der().unwrap());
    assert!(!client.resumes(b.port, &forged).await);
    assert_eq!(refused(&b), 2.0);

    // Moved: another session's sealed entry under this session's ID.
    let (first, second) = (client.fresh(a.port).await, client.fresh(a.port).await);
    redis.wait_for_session(&first);
    redis.wait_for_session(&second);
    redis.set(&session_key(&second), &redis.get(&session_key(&first)));
    assert!(!client.resumes(b.port, &second).await);
    assert_eq!(refused(&b), 3.0);
    assert_eq!(b.metric("tlsterm_handshake_failures_total", ""), 0.0);

    // Rotation on A: a new key seals, the old one (B's) still opens.
    let old = std::fs::read_to_string(&s.fleet_key).unwrap();
    write_fleet_key(&s.fleet_key, &[&fleet_key_line(), old.trim()]);
    assert!(a.server.reload().contains("reloaded"));
    let from_b = client.fresh(b.port).await;
    redis.wait_for_session(&from_b);
    assert!(client.resumes(a.port, &from_b).await, "the old key opens");
    let from_a = client.fresh(a.port).await;
    redis.wait_for_session(&from_a);
    let d = s.start("d", &session);
    assert!(client.resumes(d.port, &from_a).await, "the new key seals");
}

/// Ticket keys shared through Redis are sealed with the fleet key: Redis holds no key in
/// the clear, a process with another fleet key (or one reading keys a writer put there
/// in the clear) uses none of them and counts them, and makes tickets under keys of its
/// own.
#[tokio::test]
async fn shared_ticket_keys_are_sealed_with_the_fleet_key() {
    let s = setup();
    let redis = Redis::start();
    let session = shared_keys_session(&redis.url());
    let a = s.start_sharing_keys("a", &session);
    let b = s.start_sharing_keys("b", &session);
    let client = Client::new(SslVersion::TLS1_3);
    let ticket = client.fresh(a.port).await;
    assert!(client.resumes(b.port, &ticket).await, "the same fleet key");
    let name = ticket_key_name(&ticket).unwrap();
    let mut c = redis.connection().unwrap();
    let entries: Vec<String> = redis::cmd("KEYS")
        .arg("tlsterm:session:*ticket_key*")
        .query(&mut c)
        .unwrap();
    assert!(!entries.is_empty());
    for entry in &entries {
        let value = redis.get(entry);
        assert!(
            !value.windows(name.len()).any(|w| w == name),
            "{entry} holds the key in the clear"
        );
    }

    let not_installed = "shared session ticket keys not installed";
    let other_key = fleet_key_file(&s.dir, "other.key");
    let other = session.clone().set("fleet_key_file", &other_key);
    let outsider = s.start("outsider", &other);
    outsider.server.log.wait_for(not_installed, 0);
    assert!(!client.resumes(outsider.port, &ticket).await);
    assert!(outsider.metric(REFUSED, "entry=\"ticket_key\"") >= 1.0);

    // A writer replaces every entry with a key of its own, in the clear.
    let planted = [0x5a_u8; 80];
    for entry in &entries {
        redis.set(entry, &planted);
    }
    let late = s.start("late", &session);
    late.server.log.wait_for(not_installed, 0);
    assert!(late.metric(REFUSED, "entry=\"ticket_key\"") >= 1.0);
    let own = client.fresh(late.port).await;
    assert_ne!(
        ticket_key_name(&own).unwrap(),
        planted[..16],
        "the planted key is not used"
    );
    assert!(!late.server.log.contains(SHARED_KEYS));
}

/// Redis killed while clients keep connecting: no handshake fails; resumption through Redis
/// stops (full handshakes) and the fallback metric counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_traffic_fails_no_handshake() {
    let mut redis = Redis::start();
    let s = setup();
    // No local cache: every lookup goes to Redis.
    let session = Section::default()
        .set("tickets", false)
        .set("cache", false)
        .set("redis_url", redis.url())
        .set("redis_timeout", "50ms");
    let a = s.start("a", &session);
    let b = s.start("b", &session);
    let (pa, pb) = (a.port, b.port);

    let stop = Arc::new(AtomicBool::new(false));
    let handshakes = Arc::new(AtomicUsize::new(0));
    let resumed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (stop, handshakes, resumed) = (stop.clone(), handshakes.clone(), resumed.clone());
        tasks.push(tokio::spawn(async move {
            let client = Client::new(SslVersion::TLS1_2);
            while !stop.load(Ordering::Relaxed) {
                // Full handshake on A, then offer that session to B: B asks Redis.
                let session = client.connect(pa, None).await?.session.unwrap();
                let on_b = client.connect(pb, Some(&session)).await?;
                handshakes.fetch_add(2, Ordering::Relaxed);
                if on_b.reused {
                    resumed.fetch_add(1, Ordering::Relaxed);
                }
            }
            anyhow::Ok(())
        }));
    }
    let wait_until = |target: usize| {
        let handshakes = handshakes.clone();
        async move {
            let deadline = Instant::now() + DEADLINE;
            while handshakes.load(Ordering::Relaxed) < target {
                assert!(Instant::now() < deadline, "traffic stalled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_until(200).await;
    assert!(
        resumed.load(Ordering::Relaxed) > 0,
        "resumption through Redis works"
    );
    redis.kill();
    let at_kill = handshakes.load(Ordering::Relaxed);
    let resumed_at_kill = resumed.load(Ordering::Relaxed);
    wait_until(at_kill + 300).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap().expect("no handshake failed");
    }
    // Sessions still go through for a moment after the kill (in flight); then none.
    let after = resumed.load(Ordering::Relaxed) - resumed_at_kill;
    assert!(after < 50, "{after} resumptions after Redis died");
    assert!(b.metric("tlsterm_session_redis_fallbacks_total", "") >= 1.0);
    assert_eq!(b.metric("tlsterm_handshake_failures_total", ""), 0.0);
}

/// The session-ID cache keeps at most `cache_max_entries` sessions, least recently used out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_bound_holds_under_many_sessions() {
    let s = setup();
    let small_cache = Section::default()
        .set("tickets", false)
        .set("cache_max_entries", 100);
    let a = s.start("a", &small_cache);
    let port = a.port;
    let mut tasks = Vec::new();
    for _ in 0..10 {
        tasks.push(tokio::spawn(async move {
            let client = Client::new(SslVersion::TLS1_2);
            let mut sessions = Vec::new();
            for _ in 0..50 {
                sessions.push(client.fresh(port).await);
            }
            sessions
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    assert_eq!(all.len(), 500);
    assert_eq!(a.metric("tlsterm_session_cache_entries", ""), 100.0);
    assert!(a.metric("tlsterm_session_cache_evictions", "") >= 400.0);
    // The most recent sessions are kept, the oldest are gone (a full handshake, no error).
    let client = Client::new(SslVersion::TLS1_2);
    let newest = client.fresh(port).await;
    assert!(client.resumes(port, &newest).await);
    let mut resumed_oldest = 0;
    for old in all.iter().step_by(50) {
        // The first session of each task: among the oldest 100 created.
        resumed_oldest += client.resumes(port, old).await as usize;
    }
    assert!(
        resumed_oldest == 0,
        "{resumed_oldest} evicted sessions resumed"
    );
}

/// How many NewSessionTicket messages `openssl s_client` reports after a TLS 1.3 handshake
/// and one request; the last ticket is written to `session_file` (when there is one).
fn tls13_tickets_received(port: u16, session_file: &std::path::Path) -> usize {
    let file = session_file.to_str().unwrap();
    let out = s_client(port, &["-tls1_3", "-ign_eof", "-sess_out", file], GET_CLOSE);
    assert!(out.contains("HTTP/1.1 200"), "{out}");
    out.matches("Post-Handshake New Session Ticket arrived")
        .count()
}

/// Whether `openssl s_client` resumes the session in `session_file`.
fn openssl_resumes(port: u16, session_file: &std::path::Path) -> bool {
    let file = session_file.to_str().unwrap();
    let out = s_client(port, &["-tls1_3", "-sess_in", file], "");
    assert!(out.contains("TLSv1.3"), "{out}");
    out.contains("Reused, TLSv1.3")
}

/// `num_tickets`: a full TLS 1.3 handshake sends that many tickets (one by default), each
/// resumes; 0 sends none, so the next handshake is a full one; a reload applies a new count.
#[tokio::test]
async fn num_tickets_is_how_many_tls13_tickets_a_handshake_sends() {
    let s = setup();
    let default = s.start("default", &Section::default());
    let file = s.dir.join("default.session");
    assert_eq!(tls13_tickets_received(default.port, &file), 1);
    assert!(openssl_resumes(default.port, &file));

    let two = Section::default().set("num_tickets", 2);
    let a = s.start("a", &two);
    let file = s.dir.join("a.session");
    assert_eq!(tls13_tickets_received(a.port, &file), 2);
    assert!(openssl_resumes(a.port, &file));

    // Down to none on reload: no ticket, and the session of that handshake does not resume.
    s.config("a", a.port, a.admin, &two.clone().set("num_tickets", 0));
    assert!(a.server.reload().contains("reloaded"));
    let none = s.dir.join("none.session");
    assert_eq!(tls13_tickets_received(a.port, &none), 0);
    if none.exists() {
        assert!(!openssl_resumes(a.port, &none));
    }
    // A ticket issued before the reload still resumes: the keys are the same.
    assert!(openssl_resumes(a.port, &file));

    s.config("a", a.port, a.admin, &two.set("num_tickets", 1));
    assert!(a.server.reload().contains("reloaded"));
    assert_eq!(tls13_tickets_received(a.port, &file), 1);
    assert!(openssl_resumes(a.port, &file));

    // Out of range: refused, naming the key.
    let bad = s.config(
        "bad",
        free_port(),
        free_port(),
        &Section::default().set("num_tickets", 17),
    );
    let stderr = check_refuses(&bad);
    assert!(stderr.contains("num_tickets"), "{stderr}");
}

#[test]
fn ticket_key_file_errors_refuse_start() {
    let s = setup();
    let keys = s.dir.join("short.keys");
    std::fs::write(&keys, boring::base64::encode_block(&[0u8; 48])).unwrap();
    let config = s.config(
        "bad",
        free_port(),
        free_port(),
        &Section::default().set("ticket_key_file", &keys),
    );
    let stderr = check_refuses(&config);
    assert!(stderr.contains("expected 80"), "{stderr}");
}
