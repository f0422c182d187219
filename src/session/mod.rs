//! Session resumption: ticket keys shared by all workers (from a file or rotated in
//! memory), a bounded session-ID cache, and a Redis-backed distributed cache.
//! (Issue 6; this is the hook the TLS setup calls.)

use boring::ssl::SslContextBuilder;
use serde::Deserialize;

use crate::config::ListenerConfig;

/// `[session]` in the configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionConfig {}

/// Process-wide resumption state; survives reloads so that clients keep resuming.
pub struct Sessions {}

impl Sessions {
    pub fn new(_config: &SessionConfig) -> anyhow::Result<Sessions> {
        Ok(Sessions {})
    }

    /// Applies a reloaded `[session]` section (e.g. re-reads the ticket key file).
    pub fn reload(&self, _config: &SessionConfig) -> anyhow::Result<()> {
        Ok(())
    }

    /// Installs tickets and caches on a listener's base context (BoringSSL's session context).
    pub fn install(
        &self,
        _base: &mut SslContextBuilder,
        _listener: &ListenerConfig,
    ) -> anyhow::Result<()> {
        Ok(())
    }
}
