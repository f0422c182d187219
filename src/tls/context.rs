//! The listener's protocol settings on a BoringSSL context: versions, suites, groups,
//! early data, ALPN, client certificates.

use std::sync::Arc;

use anyhow::Context as _;
use boring::ssl::{AlpnError, SslContextBuilder, SslMode, SslVersion};
use boring::x509::X509Name;

use super::profile::{select_alpn, verify_mode, Profiles};
use super::tls13::Tls13Order;
use crate::config::{ListenerConfig, TlsVersion};

pub(super) fn ssl_version(version: TlsVersion) -> SslVersion {
    match version {
        TlsVersion::Tls12 => SslVersion::TLS1_2,
        TlsVersion::Tls13 => SslVersion::TLS1_3,
    }
}

/// Applies the listener's protocol settings; every context of a listener gets them, because
/// switching context on SNI also switches callbacks such as ALPN selection.
pub(super) fn configure(
    builder: &mut SslContextBuilder,
    listener: &ListenerConfig,
    profiles: &Arc<Profiles>,
) -> anyhow::Result<()> {
    builder.set_min_proto_version(Some(ssl_version(listener.min_version)))?;
    builder.set_max_proto_version(Some(ssl_version(listener.max_version)))?;
    builder
        .set_strict_cipher_list(listener.ciphers.get_ref())
        .with_context(|| format!("invalid cipher list `{}`", listener.ciphers.get_ref()))?;
    let groups: Vec<&str> = listener
        .groups
        .get_ref()
        .iter()
        .filter_map(|g| crate::config::group_name(g))
        .collect();
    builder.set_curves_list(&groups.join(":"))?;
    Tls13Order::parse(listener.tls13_ciphers.get_ref())?.apply_to_context(builder)?;
    builder.set_session_id_context(b"tlsterm")?;
    // A write that waits on the socket is retried with the writer's buffer as it is then:
    // hyper's HTTP/1 writer keeps its output in a buffer that grows, and can move, while it
    // waits. BoringSSL refuses a retry from another address (BAD_WRITE_RETRY, which ended a
    // slow client's response) unless told that the bytes, not their address, are what count.
    builder.set_mode(SslMode::ACCEPT_MOVING_WRITE_BUFFER);
    if *listener.early_data.get_ref() {
        crate::sys::enable_early_data(builder);
    }
    if profiles.list.iter().any(|p| !p.alpn.is_empty()) {
        let profiles = profiles.clone();
        builder.set_alpn_select_callback(move |ssl, client| {
            select_alpn(&profiles.for_ssl(ssl).alpn, client).ok_or(AlpnError::NOACK)
        });
    }
    if let (Some(ca), Some(client)) = (&listener.client_ca, &profiles.client_store) {
        builder.set_verify_cert_store(client.store.clone())?;
        // The CA names sent in CertificateRequest, so clients pick the right certificate.
        builder.set_client_ca_list(X509Name::load_client_ca_file(ca.get_ref())?);
        builder.set_verify(verify_mode(listener.client_auth));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};

    use boring::ssl::{Ssl, SslConnector, SslMethod, SslStream, SslVerifyMode};

    use super::*;
    use crate::config::Config;
    use crate::tls::selfsigned::{generate, SelfSignedKey};

    /// A response written while the client reads slowly: the write that waited is retried
    /// from a copy of its bytes elsewhere in memory, as hyper's growing buffer does, and
    /// goes on.
    #[test]
    fn a_write_retried_from_another_address_goes_on() {
        let config = Config::embedded_default();
        let listener = &config.listeners[0];
        let profiles = Arc::new(Profiles::build(listener).unwrap());
        let mut builder = SslContextBuilder::new(SslMethod::tls()).unwrap();
        configure(&mut builder, listener, &profiles).unwrap();
        let (cert, key) = generate(SelfSignedKey::EcdsaP256).unwrap();
        builder.set_certificate(&cert).unwrap();
        builder.set_private_key(&key).unwrap();
        let server_ssl = Ssl::new(&builder.build()).unwrap();

        let (server_socket, client_socket) = crate::testing::socket_pair();
        let (start_reading, reading) = std::sync::mpsc::channel::<()>();
        let client = std::thread::spawn(move || {
            let mut connector = SslConnector::builder(SslMethod::tls()).unwrap();
            connector.set_verify(SslVerifyMode::NONE);
            let mut tls = connector
                .build()
                .connect("localhost", client_socket)
                .unwrap();
            reading.recv().unwrap();
            let mut received = Vec::new();
            tls.read_to_end(&mut received).unwrap();
            received.len()
        });
        let mut server = SslStream::new(server_ssl, server_socket).unwrap();
        server.accept().unwrap();

        server.get_ref().set_nonblocking(true).unwrap();
        let first = vec![b'x'; 1 << 20];
        let mut sent = 0;
        let waited = loop {
            match server.ssl_write(&first[sent..]) {
                Ok(written) => sent += written,
                Err(err)
                    if err.io_error().map(std::io::Error::kind) == Some(ErrorKind::WouldBlock) =>
                {
                    break first[sent..].to_vec();
                }
                Err(err) => panic!("first write: {err}"),
            }
        };
        drop(first);
        start_reading.send(()).unwrap();
        server.get_ref().set_nonblocking(false).unwrap();
        server
            .write_all(&waited)
            .expect("the retried write goes on");
        server.shutdown().unwrap();
        drop(server);
        assert_eq!(client.join().unwrap(), 1 << 20);
    }
}
