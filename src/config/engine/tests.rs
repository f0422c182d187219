//! `[engine]` checks: a value out of range names its key and line.

use crate::config::{Config, EcdsaMode};

const LISTENER: &str = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";

fn parse(engine: &str) -> Result<Config, crate::config::ConfigError> {
    Config::parse(
        "t.toml",
        &format!("[engine]\nmode = \"batch\"\n{engine}\n{LISTENER}"),
    )
}

#[test]
fn a_zero_count_names_its_key_and_line() {
    for key in [
        "batch_size",
        "small_batch_threshold",
        "x25519_small_batch_threshold",
        "mlkem_small_batch_threshold",
        "ecdsa_small_batch_threshold",
    ] {
        let err = parse(&format!("poll_delay = \"1ms\"\n{key} = 0")).unwrap_err();
        assert_eq!(err.line, Some(4), "{key}: {err}");
        assert!(
            err.message.contains(&format!("`engine.{key}`")) && err.message.contains("at least 1"),
            "{err}"
        );
        assert_eq!(err.file, "t.toml");
    }
}

#[test]
fn ecdsa_is_batch_or_inline() {
    let config = parse("").unwrap();
    assert_eq!(config.engine.ecdsa, EcdsaMode::Batch);
    assert!(config.engine.ecdsa_small_batch_threshold.is_none());
    let config = parse("ecdsa = \"inline\"\necdsa_small_batch_threshold = 5").unwrap();
    assert_eq!(config.engine.ecdsa, EcdsaMode::Inline);
    let threshold = config.engine.ecdsa_small_batch_threshold.unwrap();
    assert_eq!(*threshold.get_ref(), 5);
    let err = parse("ecdsa = \"gpu\"").unwrap_err();
    assert_eq!(err.line, Some(3), "{err}");
    assert!(err.message.contains("`inline`"), "{err}");
}
