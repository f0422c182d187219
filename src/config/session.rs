//! `[session]`: resumption settings (tickets, the session-ID cache, Redis, 0-RTT
//! anti-replay) and their checks, which `Config::parse` reports with the table's line.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::sys::MAX_TLS13_TICKETS;

/// With `redis_ticket_keys`, how many epochs of keys a ticket can outlive its own by.
const MAX_SHARED_EPOCHS: u32 = 1000;

/// The longest `ticket_rotation` and `ticket_grace`: 100 years.
const MAX_TICKET_KEY_TIME: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `[session]` in the configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Issue and accept session tickets (TLS 1.2 and 1.3).
    pub tickets: bool,
    /// With `tickets`: how many TLS 1.3 tickets a handshake (full or resumed) sends.
    pub num_tickets: TicketCount,
    /// Ticket keys: base64 lines of 80 bytes (16-byte name, 32-byte HMAC key, 32-byte AES
    /// key); the last line encrypts, all lines decrypt. Re-read on SIGHUP. Without it, keys
    /// are generated in memory and rotated.
    pub ticket_key_file: Option<PathBuf>,
    /// In-memory keys: how long one key encrypts new tickets.
    #[serde(with = "humantime_serde")]
    pub ticket_rotation: Duration,
    /// In-memory keys: how long a replaced key still decrypts tickets.
    #[serde(with = "humantime_serde")]
    pub ticket_grace: Duration,
    /// How long a session (ticket or cached ID) can be resumed.
    #[serde(with = "humantime_serde")]
    pub lifetime: Duration,
    /// The in-process session-ID cache (TLS 1.2), shared by all workers.
    pub cache: bool,
    pub cache_max_entries: usize,
    /// Serialized sessions plus bookkeeping, in bytes.
    pub cache_max_bytes: usize,
    /// e.g. "redis://127.0.0.1:6379/0": a session-ID cache shared by several processes.
    /// "rediss://" connects with TLS (rustls).
    pub redis_url: Option<String>,
    /// With "rediss://": PEM CA certificates the Redis server's certificate must chain to
    /// (default: the system's roots).
    pub redis_ca_file: Option<PathBuf>,
    /// The longest a handshake waits for Redis before it goes on as a full handshake.
    #[serde(with = "humantime_serde")]
    pub redis_timeout: Duration,
    /// Prefix of the Redis keys (followed by the session ID in hex).
    pub redis_prefix: String,
    /// Needed with `redis_url`: the fleet key, which seals what the fleet shares through
    /// Redis (sessions, ticket keys, ACME answers and certificates), so that whoever can
    /// read or write Redis can neither use nor forge them. One key per line (64 hex
    /// digits, `openssl rand -hex 32`): the first seals, all open (rotation). Mode 0600:
    /// refused if group or others may access it. Every process of a fleet needs the same
    /// keys. Re-read on reload.
    pub fleet_key_file: Option<Spanned<PathBuf>>,
    /// Share the ticket keys of the fleet through Redis (`redis_url`): one key per
    /// `ticket_rotation` epoch of the wall clock, created by the first process that needs
    /// it, kept for `ticket_grace` after its epoch. Instead of `ticket_key_file`.
    pub redis_ticket_keys: bool,
    /// TLS 1.3 early data: how many ClientHellos the anti-replay memory holds (about
    /// 60 bytes each). When full, 0-RTT is refused until older entries expire.
    pub early_data_replay_entries: usize,
    /// The fraction of that memory one client network (IPv4 address, IPv6 /56) may fill
    /// in a window (a wider network, IPv4 /24 or IPv6 /48, `replay::WIDER_NETWORK_SHARES`
    /// times that); beyond it, its 0-RTT is refused (1-RTT goes on).
    pub early_data_replay_client_share: f64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            tickets: true,
            num_tickets: TicketCount::DEFAULT,
            ticket_key_file: None,
            ticket_rotation: Duration::from_secs(3600),
            ticket_grace: Duration::from_secs(3600),
            lifetime: Duration::from_secs(600),
            cache: true,
            cache_max_entries: 20_000,
            cache_max_bytes: 32 << 20,
            redis_url: None,
            redis_ca_file: None,
            redis_timeout: Duration::from_millis(20),
            redis_prefix: "tlsterm:session:".into(),
            fleet_key_file: None,
            redis_ticket_keys: false,
            early_data_replay_entries: 100_000,
            early_data_replay_client_share: 0.01,
        }
    }
}

/// `num_tickets`: the TLS 1.3 NewSessionTicket messages sent after a handshake, 0 to
/// BoringSSL's most. A ticket is single-use for a TLS 1.3 client, so a client resumes as
/// many connections at once as it holds tickets; each one costs the server a sealed
/// session and a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub struct TicketCount(u8);

impl TicketCount {
    pub const DEFAULT: TicketCount = TicketCount(1);

    pub fn get(self) -> u8 {
        self.0
    }
}

impl TryFrom<i64> for TicketCount {
    type Error = String;

    /// Refuses what BoringSSL would silently lower (more than its most) or cannot hold.
    fn try_from(count: i64) -> Result<TicketCount, String> {
        u8::try_from(count)
            .ok()
            .filter(|&count| count <= MAX_TLS13_TICKETS)
            .map(TicketCount)
            .ok_or_else(|| {
                format!("key `num_tickets`: {count} is not between 0 and {MAX_TLS13_TICKETS} (the most tickets BoringSSL sends after a handshake)")
            })
    }
}

impl SessionConfig {
    /// Checks the values that parsing alone cannot judge; the message names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.ticket_key_file.is_some() || !self.ticket_rotation.is_zero(),
            "[session] ticket_rotation must be more than 0"
        );
        anyhow::ensure!(
            self.lifetime >= Duration::from_secs(1) && self.lifetime.as_secs() <= u32::MAX as u64,
            "[session] lifetime must be at least 1s"
        );
        anyhow::ensure!(
            !self.redis_timeout.is_zero(),
            "[session] redis_timeout must be more than 0"
        );
        anyhow::ensure!(
            self.early_data_replay_client_share > 0.0 && self.early_data_replay_client_share <= 1.0,
            "[session] early_data_replay_client_share must be above 0 and at most 1"
        );
        if let Some(url) = &self.redis_url {
            anyhow::ensure!(
                !url.contains("#insecure"),
                "[session] redis_url: tlsterm always verifies the Redis certificate (no #insecure)"
            );
        }
        if self.redis_ca_file.is_some() {
            let client = self.redis_url.as_deref().map(::redis::Client::open);
            anyhow::ensure!(
                client.is_some_and(|client| client.is_ok_and(|c| redis_uses_tls(&c))),
                "[session] redis_ca_file needs a rediss:// redis_url"
            );
        }
        if self.redis_ticket_keys {
            anyhow::ensure!(
                self.redis_url.is_some(),
                "[session] redis_ticket_keys needs redis_url"
            );
            anyhow::ensure!(
                self.ticket_key_file.is_none(),
                "[session] redis_ticket_keys and ticket_key_file exclude each other"
            );
            anyhow::ensure!(
                self.ticket_rotation.subsec_nanos() == 0 && self.ticket_rotation.as_secs() >= 1,
                "[session] with redis_ticket_keys, ticket_rotation must be whole seconds"
            );
            // Every process reads the keys of all epochs that may still decrypt. A rotation
            // so long that this product exceeds any duration is refused, not overflowed.
            let Some(shared) = self.ticket_rotation.checked_mul(MAX_SHARED_EPOCHS) else {
                anyhow::bail!(
                    "[session] ticket_rotation is too long: with redis_ticket_keys, {MAX_SHARED_EPOCHS} rotations must fit in 2^64 seconds"
                );
            };
            anyhow::ensure!(
                self.ticket_grace <= shared,
                "[session] with redis_ticket_keys, ticket_grace may be at most {MAX_SHARED_EPOCHS} times ticket_rotation"
            );
        }
        // Key lifetimes are added to the clock: a century is more than enough and cannot
        // overflow it.
        anyhow::ensure!(
            self.ticket_rotation <= MAX_TICKET_KEY_TIME,
            "[session] ticket_rotation may be at most 100 years"
        );
        anyhow::ensure!(
            self.ticket_grace <= MAX_TICKET_KEY_TIME,
            "[session] ticket_grace may be at most 100 years"
        );
        Ok(())
    }
}

/// Whether a Redis client connects with TLS (rediss://).
pub fn redis_uses_tls(client: &redis::Client) -> bool {
    matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_ticket_keys_need_redis_and_no_key_file() {
        let parse = |text: &str| toml::from_str::<SessionConfig>(text).unwrap().validate();
        let redis = "redis_ticket_keys = true\nredis_url = \"redis://127.0.0.1/\"\n";
        assert!(parse(redis).is_ok());
        let err = parse("redis_ticket_keys = true\n").unwrap_err();
        assert!(err.to_string().contains("needs redis_url"), "{err}");
        let err = parse(&format!("{redis}ticket_key_file = \"k\"\n")).unwrap_err();
        assert!(err.to_string().contains("exclude each other"), "{err}");
        let err = parse(&format!(
            "{redis}ticket_rotation = \"1s\"\nticket_grace = \"1h\"\n"
        ))
        .unwrap_err();
        assert!(err.to_string().contains("at most 1000 times"), "{err}");
    }

    #[test]
    fn num_tickets_is_0_to_16_and_a_bad_one_names_its_line() {
        let parse = |text: &str| toml::from_str::<SessionConfig>(text).map(|c| c.num_tickets);
        assert_eq!(parse("").unwrap(), TicketCount::DEFAULT);
        for count in [0, 1, 16] {
            let got = parse(&format!("num_tickets = {count}\n")).unwrap();
            assert_eq!(i64::from(got.get()), count);
        }
        for bad in ["17", "-1", "256", "\"2\""] {
            let text = format!("[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n[session]\ntickets = true\nnum_tickets = {bad}\n");
            let err = crate::config::Config::parse("t.toml", &text).unwrap_err();
            assert_eq!(err.line, Some(6), "{bad}: {err}");
            if bad != "\"2\"" {
                assert!(err.message.contains("key `num_tickets`"), "{err}");
                assert!(err.message.contains("between 0 and 16"), "{err}");
            }
        }
    }

    #[test]
    fn redis_ca_file_needs_a_tls_url() {
        let parse = |text: &str| toml::from_str::<SessionConfig>(text).unwrap().validate();
        let ca = "redis_ca_file = \"ca.pem\"\n";
        let err = parse(&format!("{ca}redis_url = \"redis://127.0.0.1/\"\n")).unwrap_err();
        assert!(err.to_string().contains("needs a rediss://"), "{err}");
        assert!(parse(&format!("{ca}redis_url = \"rediss://127.0.0.1/\"\n")).is_ok());
    }
}
