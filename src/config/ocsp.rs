//! `[ocsp]`: timing of the OCSP responses tlsterm fetches for its certificates.

use std::time::Duration;

use serde::Deserialize;

use super::source::{ConfigError, SourceMap};

/// `[ocsp]`: how fetched OCSP responses are refreshed (as HAProxy's ocsp-update delays).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OcspConfig {
    /// The longest one fetch may take, connecting included.
    #[serde(default = "default_ocsp_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// A response is refreshed halfway through its validity, but no sooner than this...
    #[serde(default = "default_ocsp_min_refresh", with = "humantime_serde")]
    pub min_refresh: Duration,
    /// ...and no later than this (also how long a response without nextUpdate is stapled).
    #[serde(default = "default_ocsp_max_refresh", with = "humantime_serde")]
    pub max_refresh: Duration,
    /// First retry after a failed fetch or an answer that cannot be stapled; doubles with
    /// each failure up to `min_refresh`.
    #[serde(default = "default_ocsp_retry", with = "humantime_serde")]
    pub retry: Duration,
}

impl Default for OcspConfig {
    fn default() -> Self {
        Self {
            timeout: default_ocsp_timeout(),
            min_refresh: default_ocsp_min_refresh(),
            max_refresh: default_ocsp_max_refresh(),
            retry: default_ocsp_retry(),
        }
    }
}

fn default_ocsp_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_ocsp_min_refresh() -> Duration {
    Duration::from_secs(300)
}
fn default_ocsp_max_refresh() -> Duration {
    Duration::from_secs(3600)
}
fn default_ocsp_retry() -> Duration {
    Duration::from_secs(10)
}

impl OcspConfig {
    pub(super) fn validate(&self, map: &SourceMap<'_>) -> Result<(), ConfigError> {
        let ocsp = self;
        if [ocsp.timeout, ocsp.min_refresh, ocsp.retry].contains(&Duration::ZERO)
            || ocsp.min_refresh > ocsp.max_refresh
        {
            return Err(map.plain(
                "keys `ocsp.*`: durations must be above zero and `min_refresh` <= `max_refresh`",
            ));
        }
        Ok(())
    }
}
