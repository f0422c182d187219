//! The configuration parser on arbitrary text: a `Config` or a `ConfigError`, never a
//! panic. A text that parses once parses again to the same listeners.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tlsterm::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse("/fuzz/tlsterm.toml", text) {
        Ok(config) => {
            let again = Config::parse("/fuzz/tlsterm.toml", text).expect("parses twice");
            assert_eq!(config.listeners.len(), again.listeners.len());
            let _ = config.worker_count();
        }
        Err(err) => {
            // The message is printable and names the file.
            assert!(err.to_string().contains("/fuzz/tlsterm.toml"), "{err}");
        }
    }
});
