//! Encrypted Client Hello, server side: the keys a listener decrypts with. The key files
//! themselves are read with the configuration (`config::ech_key`).

use boring::ssl::SslEchKeys;

pub use crate::config::ech_key::{config_list, EchKey};

/// The keys of a listener: the first offered in retry configs, all used to decrypt.
pub fn server_keys(keys: &[EchKey]) -> anyhow::Result<SslEchKeys> {
    let mut builder = SslEchKeys::builder()?;
    for (index, key) in keys.iter().enumerate() {
        builder.add_key(index == 0, &key.config, key.hpke_key()?)?;
    }
    Ok(builder.build())
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
