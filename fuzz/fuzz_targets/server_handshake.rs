//! The server side of a handshake fed arbitrary client bytes: a `ServerTls` built as
//! `tlsterm serve` builds it (default listener, self-signed RSA and ECDSA certificates,
//! session cache and tickets) accepts over an in-memory stream whose client side writes
//! the fuzz input, in chunks whose size the first byte picks, then closes. The handshake
//! fails or succeeds; it never panics, hangs or leaks.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tlsterm::config::Config;
use tlsterm::session::Sessions;
use tlsterm::tls::{CertifiedKey, ServerTls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Fixture {
    tls: ServerTls,
    runtime: tokio::runtime::Runtime,
    // The session store must outlive the contexts that refer to it.
    _sessions: Sessions,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        // The embedded default plus 0-RTT, so the anti-replay path sees fuzz bytes too.
        let text = "[[listener]]\naddress = \"127.0.0.1:8443\"\nbackends = [\"builtin\"]\n\
                    alpn = [\"http/1.1\"]\nearly_data = true\n";
        let config = Config::parse("<fuzz>", text).expect("fuzz config");
        let sessions = Sessions::new(&config.session).expect("session store");
        let certs = CertifiedKey::self_signed_pair().expect("self-signed certificates");
        let tls = ServerTls::build(&config.listeners[0], certs, &sessions, &config.session)
            .expect("server TLS");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        Fixture {
            tls,
            runtime,
            _sessions: sessions,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, client_bytes)) = data.split_first() else {
        return;
    };
    let chunk = (chunk as usize).max(1);
    let fixture = fixture();
    let ssl = fixture.tls.new_ssl(std::net::Ipv4Addr::LOCALHOST.into()).expect("new SSL");
    fixture.runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let feed = async move {
            for piece in client_bytes.chunks(chunk) {
                if client.write_all(piece).await.is_err() {
                    break;
                }
            }
            let _ = client.shutdown().await;
            // Drain what the server says so that it never blocks on a full pipe.
            let mut sink = Vec::new();
            let _ = client.read_to_end(&mut sink).await;
        };
        let accept = async move {
            if let Ok(mut tls) = tokio_boring::SslStreamBuilder::new(ssl, server)
                .accept()
                .await
            {
                // A complete handshake from fuzz bytes is unlikely; read what follows.
                let mut buf = [0u8; 1024];
                while let Ok(n) = tls.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            }
        };
        tokio::join!(feed, accept);
    });
});
