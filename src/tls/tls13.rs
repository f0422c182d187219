//! The TLS 1.3 suite order, which BoringSSL only takes through its C API, and the
//! ChaCha20-first variant for clients without AES hardware.

use anyhow::Context as _;
use boring::ssl::{ClientHello, SslContextBuilder, SslRef};

use super::select::u16_list;

pub(super) const CHACHA20_POLY1305_SHA256: u16 = 0x1303;

/// The TLS 1.3 suite order in BoringSSL's form: protocol IDs, and flags marking "equal
/// preference with the next" ("A|B" in the configuration: the client's order decides).
#[derive(Clone)]
pub(super) struct Tls13Order {
    pub(super) ids: Vec<u16>,
    pub(super) flags: Vec<u32>,
}

impl Tls13Order {
    pub(super) fn parse(entries: &[String]) -> anyhow::Result<Tls13Order> {
        let mut order = Tls13Order {
            ids: Vec::new(),
            flags: Vec::new(),
        };
        for entry in entries {
            let group: Vec<&str> = entry.split('|').map(str::trim).collect();
            for (position, name) in group.iter().enumerate() {
                let id = crate::config::tls13_cipher_id(name).context("unknown TLS 1.3 suite")?;
                order.ids.push(id);
                let equal_with_next = position + 1 < group.len();
                order.flags.push(if equal_with_next {
                    boring_sys::SSL_CIPHER_FLAG_EQUAL_PREFERENCE_WITH_NEXT as u32
                } else {
                    0
                });
            }
        }
        Ok(order)
    }

    /// The same order with ChaCha20 first, if it is configured at all.
    pub(super) fn chacha_first(&self) -> Option<Tls13Order> {
        let at = self
            .ids
            .iter()
            .position(|&id| id == CHACHA20_POLY1305_SHA256)?;
        let mut order = self.clone();
        order.ids.remove(at);
        let ended_group = order.flags.remove(at) == 0;
        // If ChaCha20 closed its group, its predecessor now closes it.
        if ended_group && at > 0 {
            order.flags[at - 1] = 0;
        }
        order.ids.insert(0, CHACHA20_POLY1305_SHA256);
        order.flags.insert(0, 0);
        Some(order)
    }

    pub(super) fn apply_to_context(&self, builder: &mut SslContextBuilder) -> anyhow::Result<()> {
        let ok = crate::sys::set_tls13_ciphers(builder, &self.ids, &self.flags);
        anyhow::ensure!(ok, "BoringSSL refused the TLS 1.3 suites");
        Ok(())
    }

    pub(super) fn apply_to_connection(&self, ssl: &mut SslRef) -> bool {
        crate::sys::set_connection_tls13_ciphers(ssl, &self.ids, &self.flags)
    }
}

/// Whether the client's first TLS 1.3 suite is ChaCha20: clients without AES hardware
/// order it first, and for them it is the faster cipher.
pub(super) fn client_prefers_chacha(hello: &ClientHello<'_>) -> bool {
    u16_list(hello.ciphers(), 0)
        .find(|id| (0x1301..=0x1305).contains(id))
        .is_some_and(|id| id == CHACHA20_POLY1305_SHA256)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn chacha_first_keeps_the_other_groups() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let flag = boring_sys::SSL_CIPHER_FLAG_EQUAL_PREFERENCE_WITH_NEXT as u32;
        let order = Tls13Order::parse(&names(&[
            "TLS_AES_128_GCM_SHA256|TLS_CHACHA20_POLY1305_SHA256",
            "TLS_AES_256_GCM_SHA384",
        ]))
        .unwrap();
        assert_eq!(order.ids, [0x1301, 0x1303, 0x1302]);
        assert_eq!(order.flags, [flag, 0, 0]);
        let chacha = order.chacha_first().unwrap();
        assert_eq!(chacha.ids, [0x1303, 0x1301, 0x1302]);
        assert_eq!(chacha.flags, [0, 0, 0]);
        let grouped = Tls13Order::parse(&names(&[
            "TLS_CHACHA20_POLY1305_SHA256|TLS_AES_128_GCM_SHA256|TLS_AES_256_GCM_SHA384",
        ]))
        .unwrap()
        .chacha_first()
        .unwrap();
        assert_eq!(grouped.flags, [0, flag, 0]);
        let without = Tls13Order::parse(&names(&["TLS_AES_128_GCM_SHA256"])).unwrap();
        assert!(without.chacha_first().is_none());
    }
}
