//! `mode = "http"` through `serve`: curl and an in-process TLS client against a tlsterm
//! process whose backend is a real HTTP/1.1 server in this test that echoes what it
//! received. Requests and bodies both ways, the forwarding headers (the client's copies
//! dropped), backend connections reused across client connections, 502 and 504 (also before
//! a request body arrived whole), drain on SIGTERM, HTTP/2 clients (ALPN `h2`) forwarded as
//! HTTP/1.1, requests in 0-RTT data marked as such, and the settings this mode refuses.

use crate::common;

use std::process::Command;

use crate::common::echo::*;
use crate::common::*;

/// tlsterm with one `mode = "http"` listener forwarding to `backend`.
fn start_http(backend: &str, extra: &str) -> (tempfile::TempDir, Server, u16) {
    start_listener(backend, &format!("mode = \"http\"\n{extra}"))
}

/// curl against the listener on `port` (certificates not verified: they are self-signed);
/// returns what it printed.
fn curl(port: u16, args: &[&str]) -> String {
    let out = run(Command::new("curl")
        .args(["--silent", "--show-error", "--insecure", "--max-time", "30"])
        .args(["--connect-to", &format!("localhost:443:127.0.0.1:{port}")])
        .args(args));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The value of the response header `name` in curl's `--include` output (of the final
/// response, after any `100 Continue`).
fn header<'a>(response: &'a str, name: &str) -> &'a str {
    let last = response.rfind("HTTP/1.1 ").unwrap_or(0);
    response[last..]
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
        .unwrap_or_default()
}

/// curl's GET of `/hello?x=1` with forged forwarding fields and a cookie in two fields, and
/// its POST of a 3 MB body (the answer saved in `dir`), each on a connection of its own over
/// `protocol` (curl's `--http1.1` or `--http2`); what curl printed of each.
async fn get_and_post(
    port: u16,
    dir: &std::path::Path,
    protocol: &'static str,
) -> (String, String) {
    let upload = dir.join("upload");
    std::fs::write(&upload, pattern(3_000_000)).unwrap();
    let body_at = dir.join("answer");
    tokio::task::spawn_blocking(move || {
        let get = curl(
            port,
            &[
                protocol,
                "--include",
                "-H",
                "X-Forwarded-For: 6.6.6.6",
                "-H",
                "Forwarded: for=6.6.6.6",
                "-H",
                "X-Client-Cert-Subject: CN=mallory",
                "-H",
                "X-Custom: kept",
                "-H",
                "Cookie: a=1",
                "-H",
                "Cookie: b=2",
                "https://localhost/hello?x=1",
            ],
        );
        let post = curl(
            port,
            &[
                protocol,
                "--dump-header",
                "-",
                "--data-binary",
                &format!("@{}", upload.display()),
                "--output",
                &body_at.display().to_string(),
                "https://localhost/upload",
            ],
        );
        (get, post)
    })
    .await
    .unwrap()
}

/// The GET of [`get_and_post`] reached the backend as HTTP/1.1 with tlsterm's forwarding
/// fields once, the client's forged copies gone.
fn assert_forwarded_get(get: &str) {
    assert_eq!(header(get, "x-seen-version"), "HTTP/1.1");
    assert_eq!(header(get, "x-seen-method"), "GET");
    assert_eq!(header(get, "x-seen-path"), "/hello?x=1");
    assert_eq!(header(get, "x-seen-host"), "localhost");
    assert_eq!(header(get, "x-seen-x-forwarded-for"), "127.0.0.1");
    assert_eq!(header(get, "x-seen-x-forwarded-proto"), "https");
    assert_eq!(header(get, "x-seen-forwarded"), "");
    assert_eq!(header(get, "x-seen-x-client-cert-subject"), "");
    assert_eq!(header(get, "x-seen-x-custom"), "kept");
}

/// The POST of [`get_and_post`]: the backend saw the whole body, and it came back whole.
fn assert_echoed_upload(post: &str, dir: &std::path::Path) {
    assert_eq!(header(post, "x-seen-method"), "POST");
    assert_eq!(header(post, "x-seen-body-len"), "3000000");
    let answer = std::fs::read(dir.join("answer")).unwrap();
    assert_eq!(answer.len(), 3_000_000, "the body comes back whole");
    assert_eq!(hex_sha256(&answer), hex_sha256(&pattern(3_000_000)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_the_backend_with_forwarding_headers_over_reused_connections() {
    let (backend, accepted) = echo_backend_watched().await;
    let (dir, server, port) = start_http(&backend.to_string(), "");
    let (get, post) = get_and_post(port, dir.path(), "--http1.1").await;
    assert!(get.starts_with("HTTP/1.1 200"), "{get}");
    assert_forwarded_get(&get);
    // curl asks before sending a large body (`Expect: 100-continue`): hyper says go on.
    assert!(post.starts_with("HTTP/1.1 100 Continue"), "{post}");
    assert!(post.contains("HTTP/1.1 200"), "{post}");
    assert_echoed_upload(&post, dir.path());

    // Six more client connections, one after another, each with one request: a byte relay
    // would open a backend connection for each; here at most one per worker is opened
    // (two workers) and kept for the next client.
    tokio::task::spawn_blocking(move || {
        for _ in 0..6 {
            assert!(curl(port, &["--include", "https://localhost/"]).starts_with("HTTP/1.1 200"));
        }
    })
    .await
    .unwrap();
    let admin = admin_address(&server.config).unwrap();
    assert_eq!(
        metric(admin, "tlsterm_handshakes_total", "kind=\"full\""),
        8.0
    );
    assert_eq!(
        metric(admin, "tlsterm_http_requests_total", "answer=\"backend\""),
        8.0
    );
    // The plaintext both ways is counted as a relay counts it: the 3 MB each way at least.
    for direction in ["to_backend", "to_client"] {
        let label = format!("direction=\"{direction}\"");
        eventually("the connections' bytes are counted", || {
            (metric(admin, "tlsterm_bytes_total", &label) > 3_000_000.0).then_some(())
        });
    }
    let stats = run(Command::new(TLSTERM).args(["stats", "--admin", &admin.to_string()]));
    let stats = String::from_utf8_lossy(&stats.stdout);
    assert!(
        stats
            .lines()
            .any(|l| l.starts_with("http requests") && l.contains("answer=\"backend\"")),
        "{stats}"
    );
    let opened = accepted.accepted();
    assert!(
        (1..=2).contains(&opened),
        "{opened} backend connections for 8 client connections"
    );
}

/// A verified client certificate reaches the backend as `X-Client-Cert-*` fields, on every
/// request of the connection; the client's own copies never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_reaches_the_backend_as_headers() {
    let backend = echo_backend().await;
    let pki = tempfile::tempdir().unwrap();
    common::client_pki::make_client_pki(pki.path());
    let p = |name: &str| pki.path().join(name).display().to_string();
    let extra = common::client_pki::requiring_client_certificates(pki.path());
    let (_dir, _server, port) = start_http(&backend.to_string(), &extra);
    let (cert, key) = (p("alice.pem"), p("alice.key"));
    let answer = tokio::task::spawn_blocking(move || {
        curl(
            port,
            &[
                "--include",
                "--cert",
                &cert,
                "--key",
                &key,
                "-H",
                "X-Client-Cert-Subject: CN=forged",
                "https://localhost/one",
                "https://localhost/two",
            ],
        )
    })
    .await
    .unwrap();
    let alice = common::client_pki::alice_as_seen_by_the_backend(pki.path());
    let responses: Vec<&str> = answer.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(responses.len(), 2, "{answer}");
    for response in responses {
        let response = format!("HTTP/1.1 {response}");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        for (name, value) in &alice {
            assert_eq!(header(&response, name), value, "{name}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_requests_of_one_connection_are_answered_in_turn_and_connect_is_not_forwarded() {
    let (backend, accepted) = echo_backend_watched().await;
    let (_dir, _server, port) = start_http(&backend.to_string(), "");
    let mut client = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    for path in ["/one", "/two", "/three"] {
        http_get(&mut client, path).await.unwrap();
    }
    let opened = accepted.accepted();
    let connect = "CONNECT elsewhere.test:443 HTTP/1.1\r\nHost: elsewhere.test:443\r\n\r\n";
    tokio::io::AsyncWriteExt::write_all(&mut client, connect.as_bytes())
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    tokio::time::timeout(
        DEADLINE,
        tokio::io::AsyncReadExt::read_exact(&mut client, &mut answer),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 405");
    assert_eq!(accepted.accepted(), opened, "no backend connection for it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_is_answered_502_and_a_silent_one_504() {
    let (_refusing, refused) = refusing_address();
    let (_dir, server, port) = start_http(&refused, "");
    let answer =
        tokio::task::spawn_blocking(move || curl(port, &["--include", "https://localhost/"]))
            .await
            .unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    let admin = admin_address(&server.config).unwrap();
    assert_eq!(
        metric(admin, "tlsterm_http_requests_total", "answer=\"502\""),
        1.0
    );

    let backend = echo_backend().await;
    let (_dir, _server, port) = start_http(&backend.to_string(), "idle_timeout = \"1s\"\n");
    let answer =
        tokio::task::spawn_blocking(move || curl(port, &["--include", "https://localhost/never"]))
            .await
            .unwrap();
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
}

/// With `[log] requests`, each request gets a line once its answer's head is on its way:
/// who asked for what (the path without its query, which may carry credentials), the
/// status and who answered it; an unreachable backend's 502 is tlsterm's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_logged_without_its_query() {
    let backend = echo_backend().await;
    let (_refusing, refused) = refusing_address();
    let dir = tempfile::tempdir().unwrap();
    let (port, dead_port) = (free_port(), free_port());
    let listener = |port: u16, backend: &str| {
        format!("address = \"127.0.0.1:{port}\"\nbackends = [\"{backend}\"]\nmode = \"http\"")
    };
    let listeners = [
        listener(port, &backend.to_string()),
        listener(dead_port, &refused),
    ];
    let config = write_config(dir.path(), "[log]\nrequests = true", &listeners);
    let server = Server::start(&config);
    let size = tokio::task::spawn_blocking(move || {
        curl(dead_port, &["--http1.1", "https://localhost/gone"]);
        // A POST, whose body the backend echoes: an answer with a body.
        let size = ["--output", "/dev/null", "--write-out", "%{size_download}"];
        let post = [
            "--data",
            "ten bytes!",
            "https://localhost/hello?token=s3cr3t",
        ];
        curl(port, &[&size[..], &post[..]].concat())
    })
    .await
    .unwrap();
    let ok = server.log.wait_for("path=/hello", 0);
    // Written once the answer's body ended: its length as the client received it.
    assert_eq!(size, "10");
    let sent = format!("bytes={size} complete=true");
    assert!(ok.contains(&sent), "{sent} in {ok}");
    assert!(ok.contains("total_us="), "{ok}");
    for field in [
        "client=127.0.0.1",
        "version=1.1",
        "method=POST",
        "host=localhost",
        "status=200",
        "answered_by=backend",
        "early_data=false",
    ] {
        assert!(ok.contains(field), "{field} in {ok}");
    }
    let failed = server.log.wait_for("path=/gone", 0);
    assert!(
        failed.contains("status=502") && failed.contains("answered_by=502"),
        "{failed}"
    );
    assert!(failed.contains("bytes=0 complete=true"), "{failed}");
    assert!(
        !server.log.text().contains("s3cr3t"),
        "{}",
        server.log.text()
    );
}

/// A request answered before the client sent its whole body (here 502: no backend to send
/// it to) leaves the connection in the middle of that body, where no next request can be
/// found: the answer arrives whole and the connection closes at once, not after
/// `idle_timeout`. A request whose body arrived whole keeps its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_answered_before_its_body_arrived_closes_its_connection_after_the_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_refusing, refused) = refusing_address();
    let (_dir, _server, port) = start_http(&refused, "idle_timeout = \"1h\"\n");
    let connect = || tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &[]);
    let post = |sent: usize| {
        format!(
            "POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{}",
            "x".repeat(sent)
        )
    };
    let answer_then_end = |mut client: TlsClient| async move {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(DEADLINE, client.read_to_end(&mut answer)).await;
        (String::from_utf8_lossy(&answer).to_string(), read.is_ok())
    };

    let mut client = connect().await.unwrap();
    client.write_all(post(10).as_bytes()).await.unwrap();
    let (answer, ended) = answer_then_end(client).await;
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(ended, "the connection stayed open mid-body: {answer}");

    let mut client = connect().await.unwrap();
    client.write_all(post(1000).as_bytes()).await.unwrap();
    client
        .write_all(b"GET /next HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answers, ended) = answer_then_end(client).await;
    assert!(ended, "{answers}");
    assert_eq!(answers.matches("HTTP/1.1 502").count(), 2, "{answers}");
}

/// A reload that names another backend sends the requests of new connections there, while
/// a connection opened before keeps its backend for its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reload_new_connections_reach_the_new_backend() {
    let (first, first_accepted) = echo_backend_watched().await;
    let (second, second_accepted) = echo_backend_watched().await;
    let (_dir, server, port) = start_http(&first.to_string(), "");
    let mut before = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    http_get(&mut before, "/").await.unwrap();

    let text = std::fs::read_to_string(&server.config).unwrap();
    let renamed = text.replace(&first.to_string(), &second.to_string());
    assert_ne!(text, renamed);
    std::fs::write(&server.config, renamed).unwrap();
    let verdict = server.reload();
    assert!(verdict.contains("reloaded"), "{verdict}");

    let mut after = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    http_get(&mut after, "/").await.unwrap();
    http_get(&mut before, "/").await.unwrap();
    assert_eq!(second_accepted.accepted(), 1);
    assert_eq!(first_accepted.accepted(), 1);
}

/// A client that sends a large request and then stops reading the answer is closed once
/// nothing has moved for `idle_timeout`: it does not hold its connection, and the
/// backend connection, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_response_is_closed_after_idle_timeout() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_http(&backend.to_string(), "idle_timeout = \"1s\"\n");
    let admin = admin_address(&server.config).unwrap();
    let mut client = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    // More than the socket buffers of both sides hold, so that tlsterm's writes stop.
    let body = vec![b'x'; 48 << 20];
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut client, head.as_bytes())
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut client, &body)
        .await
        .unwrap();
    // The answer comes back (as large) and is not read.
    wait_for_metric(
        admin,
        "tlsterm_connections_closed_total{reason=\"idle_timeout\"} 1",
    );
    drop(client);
}

/// On SIGTERM a request in progress is answered, and the connection then closes, as does
/// an idle keep-alive connection: tlsterm exits without waiting for `drain_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_request_in_progress_and_closes_idle_connections() {
    let (backend, seen) = echo_backend_watched().await;
    let (_dir, mut server, port) = start_http(&backend.to_string(), "");
    let mut idle = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    http_get(&mut idle, "/").await.unwrap();
    let in_flight =
        tokio::task::spawn_blocking(move || curl(port, &["--include", "https://localhost/wait"]));
    wait_until("the backend holds the request", || seen.waiting() == 1);
    server.signal("TERM");
    server.log.wait_for("stopping", 0);
    seen.release_waiting();
    let answered = in_flight.await.unwrap();
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert_eq!(header(&answered, "connection"), "close");
    let status = eventually("tlsterm exits once drained", || {
        server.child.try_wait().unwrap()
    });
    assert!(status.success(), "{status}");
    // The idle connection was closed, not left to the drain deadline (30 s by default).
    let mut byte = [0u8; 1];
    let read = tokio::io::AsyncReadExt::read(&mut idle, &mut byte).await;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

#[test]
fn settings_a_forwarded_request_cannot_carry_are_refused_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    for (extra, says) in [
        (
            "proxy_protocol = \"v2\"",
            "X-Forwarded-For, not as a PROXY header",
        ),
        ("alpn = [\"h2\", \"spdy/3\"]", "not \"spdy/3\""),
    ] {
        let listener = format!(
            "address = \"127.0.0.1:{}\"\nbackends = [\"127.0.0.1:1\"]\nmode = \"http\"\n{extra}",
            free_port()
        );
        let config = write_config(dir.path(), "", &[listener]);
        let refused = check_refuses(&config);
        assert!(refused.contains("key `mode`"), "{refused}");
        assert!(refused.contains("tlsterm.toml:7:"), "{refused}");
        assert!(refused.contains(says), "{refused}");
    }
}

/// With `early_data = true`, a request sent in 0-RTT data reaches the backend with
/// `Early-Data: 1` (it could be a replay), one sent on the same connection after the
/// handshake does not, and one that a client marked itself keeps its mark (an earlier hop
/// forwarded it in early data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_in_early_data_reach_the_backend_marked() {
    let (backend, echo) = echo_backend_watched().await;
    let (dir, server, port) = start_http(&backend.to_string(), "early_data = true");
    let marked =
        "GET /marked HTTP/1.1\r\nHost: localhost\r\nEarly-Data: 1\r\nConnection: close\r\n\r\n";
    let early = "GET /early HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let after = "GET /after HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let (first, resumed) = resume_with_early_data(dir.path(), port, marked, early, after).await;
    assert!(first.contains("x-seen-early-data: 1"), "{first}");
    assert!(resumed.contains("Early data was accepted"), "{resumed}");
    assert!(resumed.contains("x-seen-path: /after"), "{resumed}");
    assert_eq!(echo.received("/marked"), ["1"]);
    assert_eq!(echo.received("/early"), ["1"]);
    assert_eq!(echo.received("/after"), [""]);
    let admin = admin_address(&server.config).unwrap();
    let early_requests = "tlsterm_http_early_data_requests_total";
    assert_eq!(metric(admin, early_requests, "version=\"1.1\""), 1.0);
}

/// A request that tlsterm forwarded in 0-RTT data and that the backend refuses as too
/// early (425) is sent again once the client's handshake is confirmed, without the mark:
/// the client gets the backend's real answer. One that the client itself marked (an
/// earlier hop forwarded it early) gets the 425, for that hop to act on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_as_too_early_is_sent_again_after_the_handshake() {
    let (backend, echo) = echo_backend_watched().await;
    let (dir, server, port) = start_http(&backend.to_string(), "early_data = true");
    let marked = "GET /too-early-marked HTTP/1.1\r\nHost: localhost\r\nEarly-Data: 1\r\n\
                  Connection: close\r\n\r\n";
    let early = "GET /too-early HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let (first, resumed) = resume_with_early_data(dir.path(), port, marked, early, "").await;
    assert!(first.contains("HTTP/1.1 425"), "{first}");
    assert_eq!(echo.received("/too-early-marked"), ["1"]);
    assert!(resumed.contains("Early data was accepted"), "{resumed}");
    assert!(resumed.contains("HTTP/1.1 200"), "{resumed}");
    assert!(resumed.contains("x-seen-path: /too-early"), "{resumed}");
    assert_eq!(echo.received("/too-early"), ["1", ""], "marked, then not");
    let admin = admin_address(&server.config).unwrap();
    let retries = "tlsterm_http_too_early_retries_total";
    assert_eq!(metric(admin, retries, "version=\"1.1\""), 1.0);
}

/// openssl s_client twice on the listener at `port`: a full TLS 1.3 handshake that sends
/// `first` and keeps its session (in `dir`), then a resumption that sends `early` as 0-RTT
/// data and `after` once connected; what each printed.
async fn resume_with_early_data(
    dir: &std::path::Path,
    port: u16,
    first: &'static str,
    early: &str,
    after: &'static str,
) -> (String, String) {
    let file = |name: &str| dir.join(name).display().to_string();
    let (session, early_file) = (file("session.pem"), file("early.txt"));
    std::fs::write(&early_file, early).unwrap();
    tokio::task::spawn_blocking(move || {
        let full = ["-tls1_3", "-ign_eof", "-sess_out", &session];
        let first = s_client(port, &full, first);
        let resumed = [
            "-tls1_3",
            "-ign_eof",
            "-sess_in",
            &session,
            "-early_data",
            &early_file,
        ];
        (first, s_client(port, &resumed, after))
    })
    .await
    .unwrap()
}

/// A connection on which nothing moves for a second after an answer gives up hyper's
/// buffers (it parks) and answers its next request as before, also one whose head began
/// before it parked (the bytes hyper read but had not used go to the next connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_quiet_between_requests_parks_and_answers_its_next_request() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_http(&backend.to_string(), "");
    let admin = admin_address(&server.config).unwrap();
    let parked = |times: f64| {
        eventually(&format!("the connection parked {times} times"), || {
            (metric(admin, "tlsterm_http_parked_total", "") >= times).then_some(())
        })
    };
    let mut client = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    http_get(&mut client, "/first").await.unwrap();
    parked(1.0);
    http_get(&mut client, "/second").await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    client
        .write_all(b"GET /third HTTP/1.1\r\nHost: local")
        .await
        .unwrap();
    parked(2.0);
    client.write_all(b"host\r\n\r\n").await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(DEADLINE, client.read(&mut byte)).await;
        assert_eq!(read.unwrap().unwrap(), 1, "closed in the response head");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(header(&head, "x-seen-path"), "/third", "{head}");
    assert_eq!(
        metric(admin, "tlsterm_http_requests_total", "answer=\"backend\""),
        3.0
    );
}

/// The listener of the HTTP/2 tests: `h2` offered first.
const OFFER_H2: &str = "alpn = [\"h2\", \"http/1.1\"]";

/// A client that chooses HTTP/2 by ALPN: its requests reach the backend as HTTP/1.1 (Host
/// from `:authority`, the Cookie pieces joined, the forwarding fields tlsterm's, the client's
/// copies dropped), bodies go both ways whole, and fifty requests sent at once on one
/// connection are each answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_requests_reach_the_backend_as_http11_requests() {
    let backend = echo_backend().await;
    let (dir, server, port) = start_http(&backend.to_string(), OFFER_H2);
    let (get, post) = get_and_post(port, dir.path(), "--http2").await;
    assert!(get.starts_with("HTTP/2 200"), "{get}");
    assert_forwarded_get(&get);
    assert_eq!(header(&get, "x-seen-cookie"), "a=1; b=2");
    assert!(post.contains("HTTP/2 200"), "{post}");
    assert_echoed_upload(&post, dir.path());

    // curl waits to multiplex these over one connection (no --parallel-immediate).
    let parallel = tokio::task::spawn_blocking(move || {
        curl(
            port,
            &[
                "--http2",
                "--parallel",
                "--parallel-max",
                "50",
                "--output",
                "/dev/null",
                "--write-out",
                "%{http_version} %{response_code} %{num_connects}\\n",
                "https://localhost/stream[1-50]",
            ],
        )
    })
    .await
    .unwrap();
    let transfers: Vec<&str> = parallel.lines().collect();
    assert_eq!(transfers.len(), 50, "{parallel}");
    assert!(
        transfers.iter().all(|t| t.starts_with("2 200 ")),
        "{parallel}"
    );
    let connects: u32 = transfers
        .iter()
        .map(|t| t.rsplit(' ').next().unwrap().parse::<u32>().unwrap())
        .sum();
    assert_eq!(
        connects, 1,
        "the fifty requests shared one connection: {parallel}"
    );

    let admin = admin_address(&server.config).unwrap();
    assert_eq!(
        metric(admin, "tlsterm_handshakes_total", "kind=\"full\""),
        3.0
    );
    assert_eq!(
        metric(admin, "tlsterm_http_requests_total", "version=\"2\""),
        52.0
    );
    assert_eq!(
        metric(admin, "tlsterm_http_requests_total", "answer=\"backend\""),
        52.0
    );
}

/// With `backend_max_connections = 2`, five requests sent at once on one HTTP/2 connection
/// (one worker) share two backend connections: three wait, and each takes a connection
/// as an answer frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_backend_max_connections_wait_for_a_free_connection() {
    let (backend, seen) = echo_backend_watched().await;
    let extra = format!("{OFFER_H2}\nbackend_max_connections = 2");
    let (_dir, server, port) = start_http(&backend.to_string(), &extra);
    let parallel = tokio::task::spawn_blocking(move || {
        let each = "%{http_version} %{response_code}\\n";
        let args = [
            "--http2",
            "--parallel",
            "--output",
            "/dev/null",
            "--write-out",
            each,
        ];
        curl(
            port,
            &[&args[..], &["https://localhost/wait?[1-5]"]].concat(),
        )
    });
    let admin = admin_address(&server.config).unwrap();
    wait_for_metric(admin, "tlsterm_backend_connection_waits_total 3");
    wait_for_metric(admin, "tlsterm_backend_pooled_connections 2");
    let stats = run(Command::new(TLSTERM).args(["stats", "--admin", &admin.to_string()]));
    let stats = String::from_utf8_lossy(&stats.stdout);
    assert!(stats.contains("to backends, pooled 2"), "{stats}");
    // Two at a time reach the backend, on the same two connections throughout.
    for held in [2, 4, 5] {
        wait_until("the backend holds the requests", || seen.waiting() == held);
        assert_eq!(seen.accepted(), 2);
        seen.release_waiting();
    }
    let answers = parallel.await.unwrap();
    assert_eq!(
        answers.lines().filter(|a| *a == "2 200").count(),
        5,
        "{answers}"
    );
    assert_eq!(seen.accepted(), 2);
}

/// SIGTERM on an HTTP/2 connection with a request in progress: that request is answered
/// (a GOAWAY tells the client to send no more), and tlsterm then exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_http2_request_in_progress_then_exits() {
    let (backend, seen) = echo_backend_watched().await;
    let (_dir, mut server, port) = start_http(&backend.to_string(), OFFER_H2);
    let in_flight = tokio::task::spawn_blocking(move || {
        curl(port, &["--http2", "--include", "https://localhost/wait"])
    });
    wait_until("the backend holds the request", || seen.waiting() == 1);
    server.signal("TERM");
    server.log.wait_for("stopping", 0);
    seen.release_waiting();
    let answered = in_flight.await.unwrap();
    assert!(answered.starts_with("HTTP/2 200"), "{answered}");
    let status = eventually("tlsterm exits once drained", || {
        server.child.try_wait().unwrap()
    });
    assert!(status.success(), "{status}");
}

/// A client that chooses HTTP/2 and then sends what is not HTTP/2 (an HTTP/1.1 request
/// where the connection preface belongs) loses its own connection only: the next client's
/// HTTP/2 request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_breaks_http2_loses_only_its_connection() {
    let backend = echo_backend().await;
    let (_dir, _server, port) = start_http(&backend.to_string(), OFFER_H2);
    let mut broken = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &["h2"])
        .await
        .unwrap();
    assert_eq!(broken.ssl().selected_alpn_protocol(), Some(&b"h2"[..]));
    tokio::io::AsyncWriteExt::write_all(&mut broken, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Whatever the server says first (a GOAWAY), it then closes the connection.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::io::AsyncReadExt::read_to_end(&mut broken, &mut rest),
    )
    .await;
    assert!(closed.is_ok(), "the broken connection was left open");
    assert!(
        !String::from_utf8_lossy(&rest).contains("HTTP/1.1"),
        "no HTTP/1.1 answer on an HTTP/2 connection"
    );
    let answered = tokio::task::spawn_blocking(move || {
        curl(port, &["--http2", "--include", "https://localhost/after"])
    })
    .await
    .unwrap();
    assert!(answered.starts_with("HTTP/2 200"), "{answered}");
}

/// `tlsterm bench --mode idle --alpn h2` holds HTTP/2 connections to a `mode = "http"`
/// listener, each with one request answered over HTTP/2 (counted so by the server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_benchmark_holds_http2_connections() {
    let backend = echo_backend().await;
    let (_dir, server, port) = start_http(&backend.to_string(), OFFER_H2);
    let pid = server.child.id().to_string();
    let out = tokio::task::spawn_blocking(move || {
        run(Command::new(TLSTERM)
            .args(["bench", &format!("https://127.0.0.1:{port}/")])
            .args(["--alpn", "h2", "--insecure", "--json", "--mode", "idle"])
            .args([
                "-c",
                "20",
                "--threads",
                "2",
                "-d",
                "0s",
                "--server-pid",
                &pid,
            ]))
    })
    .await
    .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["open"].as_u64(), report["errors"].as_u64()),
        (Some(20), Some(0)),
        "{report}"
    );
    let admin = admin_address(&server.config).unwrap();
    assert_eq!(
        metric(admin, "tlsterm_http_requests_total", "version=\"2\""),
        20.0
    );
}

/// A backend that switches a request asking for WebSocket to a byte echo: it answers 101
/// (saying whether tlsterm's `X-Forwarded-For` came with the request), then sends back each
/// chunk it reads upper-cased, until the other side closes.
async fn switching_backend() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let raw = String::from_utf8_lossy(&head).to_string();
                let head = raw.to_lowercase();
                if !(head.contains("\r\nupgrade: websocket")
                    && head.contains("connection: upgrade"))
                {
                    let _ = stream
                        .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let forwarded = head.contains("\r\nx-forwarded-for: 127.0.0.1");
                // RFC 6455's answer to the key, as a WebSocket server makes it.
                let key = raw.lines().find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("sec-websocket-key")
                        .then(|| value.trim())
                });
                // Asked for `/wrong-accept`, a wrong one.
                let accept = match head.starts_with("get /wrong-accept ") {
                    true => "d3Jvbmc=".to_string(),
                    false => key.map_or(String::new(), |key| {
                        let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
                        boring::base64::encode_block(&boring::sha::sha1(
                            format!("{key}{guid}").as_bytes(),
                        ))
                    }),
                };
                let answer = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                     Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\
                     X-Seen-Forwarded: {forwarded}\r\n\r\n"
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
                let mut chunk = [0u8; 1024];
                loop {
                    let n = match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if stream
                        .write_all(&chunk[..n].to_ascii_uppercase())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    address
}

/// Reads from `stream` until what was read ends with `end`; all that was read.
async fn read_until(stream: &mut (impl tokio::io::AsyncRead + Unpin), end: &[u8]) -> String {
    let mut read = Vec::new();
    let mut chunk = [0u8; 1024];
    while !read.ends_with(end) {
        let n = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            tokio::io::AsyncReadExt::read(stream, &mut chunk),
        )
        .await
        .expect("the answer came")
        .unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&read));
        read.extend_from_slice(&chunk[..n]);
    }
    String::from_utf8_lossy(&read).into_owned()
}

/// A WebSocket handshake (HTTP/1.1 `Upgrade`) reaches the backend with the forwarding
/// fields; its 101 answer switches the client's connection to the backend's, both ways,
/// the bytes sent right behind the request included, until the client closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_switches_the_connection_to_the_backend() {
    use tokio::io::AsyncWriteExt;
    let backend = switching_backend().await;
    let (_dir, _server, port) = start_http(&backend.to_string(), "");
    let mut client = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &[])
        .await
        .unwrap();
    client
        .write_all(
            b"GET /chat HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n\
              Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\nfirst",
        )
        .await
        .unwrap();
    let answer = read_until(&mut client, b"FIRST").await;
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    let answer = answer.to_lowercase();
    assert!(answer.contains("\r\nupgrade: websocket\r\n"), "{answer}");
    assert!(answer.contains("\r\nconnection: upgrade\r\n"), "{answer}");
    assert!(
        answer.contains("\r\nx-seen-forwarded: true\r\n"),
        "{answer}"
    );
    client.write_all(b"second").await.unwrap();
    assert_eq!(read_until(&mut client, b"SECOND").await, "SECOND");
    // The client's close reaches the backend, whose close ends the connection.
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::io::AsyncReadExt::read_to_end(&mut client, &mut rest),
    )
    .await;
    assert!(ended.is_ok(), "the switched connection stayed open");
}

/// An HTTP/2 client opens a WebSocket on one stream (RFC 8441's extended CONNECT, which
/// tlsterm offers): the backend is asked with HTTP/1.1's `Upgrade: websocket` and a key
/// of tlsterm's, its 101 (with the matching accept) reaches the client as 200, and bytes
/// then go both ways while other streams of the connection are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_opens_a_websocket_on_a_stream() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::io::AsyncWriteExt;
    let backend = switching_backend().await;
    let (_dir, server, port) = start_http(&backend.to_string(), OFFER_H2);
    let tls = tls_connect(port, "localhost", boring::ssl::SslVersion::TLS1_3, &["h2"])
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = |method: hyper::Method| {
        hyper::Request::builder()
            .method(method)
            .uri("https://localhost/chat")
            .header("sec-websocket-version", "13")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    // A plain request first, which the backend refuses (no Upgrade): it also brings the
    // server's settings, which must offer extended CONNECT before the client may use it.
    let plain = sender
        .send_request(request(hyper::Method::GET))
        .await
        .unwrap();
    assert_eq!(plain.status(), 400);
    // An extended CONNECT for a WebSocket at `target`.
    let websocket = |target: &str| {
        let mut connect = request(hyper::Method::CONNECT);
        *connect.uri_mut() = target.parse().unwrap();
        let protocol = hyper::ext::Protocol::from_static("websocket");
        connect.extensions_mut().insert(protocol);
        connect
    };
    let connect = websocket("https://localhost/chat");
    let mut opened = sender.send_request(connect).await.unwrap();
    assert_eq!(opened.status(), 200, "{opened:?}");
    assert_eq!(opened.headers()["x-seen-forwarded"], "true");
    assert!(opened.headers().get("sec-websocket-accept").is_none());
    let mut stream = TokioIo::new(hyper::upgrade::on(&mut opened).await.unwrap());
    stream.write_all(b"hello").await.unwrap();
    assert_eq!(read_until(&mut stream, b"HELLO").await, "HELLO");
    // The connection serves other streams beside the WebSocket; a backend whose accept does
    // not answer tlsterm's key is no WebSocket server: 502.
    let again = sender
        .send_request(request(hyper::Method::GET))
        .await
        .unwrap();
    assert_eq!(again.status(), 400);
    let wrong = websocket("https://localhost/wrong-accept");
    assert_eq!(sender.send_request(wrong).await.unwrap().status(), 502);
    stream.write_all(b"bye").await.unwrap();
    assert_eq!(read_until(&mut stream, b"BYE").await, "BYE");
    // Counted as the client saw them: the refused WebSocket as tlsterm's 502, not as the
    // backend's 101.
    let admin = admin_address(&server.config).unwrap();
    let answered = |answer: &str| {
        let label = format!("answer=\"{answer}\"");
        metric(admin, "tlsterm_http_requests_total", &label)
    };
    assert_eq!((answered("backend"), answered("502")), (3.0, 1.0));
}
