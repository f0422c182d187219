//! A listener's HTTP/3 keys (`quic`, `quic_address`, `quic_*`): their defaults and checks.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::listener::ListenerConfig;
use super::source::{ConfigError, SourceMap};
use super::tls_names::TlsVersion;

pub(super) fn default_quic() -> Spanned<bool> {
    Spanned::new(0..0, false)
}
pub(super) fn default_quic_idle_timeout() -> Duration {
    Duration::from_secs(30)
}
pub(super) fn default_quic_max_connections() -> Spanned<usize> {
    Spanned::new(0..0, 10_000)
}
pub(super) fn default_quic_backend_timeout() -> Duration {
    Duration::from_secs(60)
}
pub(super) fn default_quic_retry() -> QuicRetry {
    QuicRetry::Auto
}
pub(super) fn default_quic_retry_threshold() -> Spanned<usize> {
    Spanned::new(0..0, 200)
}
pub(super) fn default_quic_client_cert_headers() -> bool {
    true
}

/// When a client's first Initial packet is answered with a stateless Retry, which makes
/// the client prove that it receives packets at its address before tlsterm spends a
/// handshake (a signature, connection state) on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuicRetry {
    /// When the worker has `quic_retry_threshold` handshakes in progress or more.
    Auto,
    /// Every new connection: one round trip more for every client.
    Always,
    /// Never: address validation is left to QUIC's limit of three times what the client
    /// sent until its handshake completes.
    Never,
}

/// More connections than connection IDs can name apart on one worker makes no sense, and
/// a larger figure is surely a typing error.
const MAX_QUIC_CONNECTIONS: usize = 1 << 24;

impl ListenerConfig {
    /// Where the listener answers HTTP/3 (UDP), if it does: `quic_address`, or its own
    /// address and port.
    pub fn quic_address(&self) -> Option<SocketAddr> {
        if !*self.quic.get_ref() {
            return None;
        }
        Some(
            self.quic_address
                .as_ref()
                .map_or_else(|| self.address(), |a| *a.get_ref()),
        )
    }

    /// The HTTP/3 keys: QUIC is TLS 1.3 only, and the other keys need `quic = true`.
    pub(super) fn check_quic(&self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        let enabled = *self.quic.get_ref();
        if let (false, Some(address)) = (enabled, &self.quic_address) {
            return Err(map.error(address, "key `quic_address` needs `quic = true`"));
        }
        if !enabled {
            return Ok(());
        }
        if !cfg!(feature = "http3") {
            return Err(map.error(
                &self.quic,
                "key `quic`: this build has no HTTP/3 (feature `http3`)",
            ));
        }
        if self.max_version < TlsVersion::Tls13 {
            return Err(map.error(
                &self.quic,
                "key `quic`: QUIC is TLS 1.3 only, but `max_version` is 1.2",
            ));
        }
        let threshold = *self.quic_retry_threshold.get_ref();
        if threshold == 0 || threshold > MAX_QUIC_CONNECTIONS {
            return Err(map.error(
                &self.quic_retry_threshold,
                format!("key `quic_retry_threshold`: between 1 and {MAX_QUIC_CONNECTIONS}"),
            ));
        }
        let limit = *self.quic_max_connections.get_ref();
        if limit == 0 || limit > MAX_QUIC_CONNECTIONS {
            return Err(map.error(
                &self.quic_max_connections,
                format!("key `quic_max_connections`: between 1 and {MAX_QUIC_CONNECTIONS}"),
            ));
        }
        for (key, value) in [
            ("quic_idle_timeout", self.quic_idle_timeout),
            ("quic_backend_timeout", self.quic_backend_timeout),
        ] {
            if value.is_zero() {
                return Err(map.plain(format!(
                    "listener {}: key `{key}` must be above zero",
                    self.address()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn listener(keys: &str) -> String {
        format!("[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n{keys}")
    }

    #[test]
    fn quic_answers_on_the_listener_address_or_its_own() {
        let config = Config::parse("t.toml", &listener("quic = true\n")).unwrap();
        let address = config.listeners[0].quic_address();
        assert_eq!(address, Some("127.0.0.1:1".parse().unwrap()));
        let own = listener("quic = true\nquic_address = \"127.0.0.1:2\"\n");
        let config = Config::parse("t.toml", &own).unwrap();
        let address = config.listeners[0].quic_address();
        assert_eq!(address, Some("127.0.0.1:2".parse().unwrap()));
        let off = Config::parse("t.toml", &listener("")).unwrap();
        assert_eq!(off.listeners[0].quic_address(), None);
    }

    #[test]
    fn bad_quic_keys_name_key_and_line() {
        let cases = [
            (
                "quic_address = \"127.0.0.1:2\"\n",
                4,
                "`quic_address` needs `quic = true`",
            ),
            (
                "max_version = \"1.2\"\nquic = true\n",
                5,
                "QUIC is TLS 1.3 only",
            ),
            (
                "quic = true\nquic_max_connections = 0\n",
                5,
                "`quic_max_connections`",
            ),
            (
                "quic = true\nquic_retry_threshold = 0\n",
                5,
                "`quic_retry_threshold`",
            ),
            (
                "quic = true\nquic_retry = \"sometimes\"\n",
                5,
                "`auto`, `always`, `never`",
            ),
        ];
        for (keys, line, message) in cases {
            let err = Config::parse("t.toml", &listener(keys)).unwrap_err();
            assert_eq!(err.line, Some(line), "{err}");
            assert!(err.message.contains(message), "{err}");
        }
        let zero = listener("quic = true\nquic_idle_timeout = \"0s\"\n");
        let err = Config::parse("t.toml", &zero).unwrap_err();
        assert!(
            err.message
                .contains("`quic_idle_timeout` must be above zero"),
            "{err}"
        );
    }
}
