//! ACME in a build without the `acme` feature: an `Acme` with the same methods that
//! provides no certificate and refuses a configuration with `[acme]`, so that the server's
//! code is one and the same in both builds.

use std::time::SystemTime;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::config::{AcmeCertificate, Config};
use crate::tls::CertifiedKey;

/// A certificate that is ready to serve; never sent in this build.
pub struct Announcement {
    pub certificate: String,
    pub source: &'static str,
    pub not_after: SystemTime,
}

/// Provides no certificates.
pub struct Acme {
    /// Kept so that the receiver waits for ever instead of seeing a closed channel.
    _announce: UnboundedSender<Announcement>,
}

/// Nothing to apply.
pub struct Plan;

impl Acme {
    pub fn new() -> (Acme, UnboundedReceiver<Announcement>) {
        let (announce, announced) = unbounded_channel();
        (
            Acme {
                _announce: announce,
            },
            announced,
        )
    }

    /// Refuses `[acme]`: this build cannot obtain certificates.
    pub fn prepare(&self, config: &Config) -> anyhow::Result<Plan> {
        anyhow::ensure!(
            config.acme.is_none(),
            "this build has no ACME (feature acme): remove [acme]"
        );
        Ok(Plan)
    }

    pub fn apply(&mut self, _plan: Plan) -> anyhow::Result<()> {
        Ok(())
    }

    pub fn certificates(&self, _wanted: &[AcmeCertificate]) -> Vec<CertifiedKey> {
        Vec::new()
    }
}
