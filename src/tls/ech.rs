//! Encrypted Client Hello, server side: the keys a listener decrypts with. The key files
//! themselves are read with the configuration (`config::ech_key`).

use std::sync::LazyLock;

use boring::ex_data::Index;
use boring::ssl::{Ssl, SslEchKeys, SslRef};

pub use crate::config::ech_key::{config_list, EchKey};

/// The keys of a listener: the first offered in retry configs, all used to decrypt.
pub fn server_keys(keys: &[EchKey]) -> anyhow::Result<SslEchKeys> {
    let mut builder = SslEchKeys::builder()?;
    for (index, key) in keys.iter().enumerate() {
        builder.add_key(index == 0, &key.config, key.hpke_key()?)?;
    }
    Ok(builder.build())
}

/// Set on connections whose ClientHello carried an ECH extension (decrypted or not).
pub(super) static ECH_OFFERED: LazyLock<Index<Ssl, bool>> =
    LazyLock::new(|| Ssl::new_ex_index().expect("an SSL ex_data index"));

/// What became of a connection's Encrypted Client Hello, once its ClientHello is read:
/// "accepted" (decrypted: the inner ClientHello is used), "rejected" (offered but not
/// decrypted, GREASE from browsers included: the client gets the public name's
/// certificate and the retry configs), or "not_offered".
pub fn ech_outcome(ssl: &SslRef) -> &'static str {
    if ssl.ech_accepted() {
        "accepted"
    } else if ssl.ex_data(*ECH_OFFERED).is_some() {
        "rejected"
    } else {
        "not_offered"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_decrypts_with_all_its_keys() {
        let key = EchKey::generate("public.test").unwrap();
        let other = EchKey::generate("public.test").unwrap();
        assert!(server_keys(&[key, other]).is_ok());
    }
}
