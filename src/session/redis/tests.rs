//! Unit tests: the Redis store against a real redis-server.

use super::*;

#[test]
fn urls_are_logged_without_credentials() {
    for (url, shown) in [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@10.0.0.1/", "redis://***@10.0.0.1/"),
        (
            "rediss://user:s3cret@redis.test:6380",
            "rediss://***@redis.test:6380",
        ),
        ("redis://user:s3/c@r?et@host/0", "redis://***@host/0"),
        (
            "redis+unix:///run/redis.sock?db=1&pass=s3cret",
            "redis+unix:///run/redis.sock?db=1&pass=***",
        ),
        ("s3cret", "(not a URL)"),
    ] {
        assert_eq!(redacted(url), shown);
    }
}

#[test]
fn setup_errors_do_not_show_the_password() {
    for url in [
        "redis://:s3cret@127.0.0.1:notaport/",
        "redis://:s3cret@[::1/",
    ] {
        let key = Arc::new(FleetKey::from_keys(vec![Zeroizing::new([1; 32])]));
        let err = RedisStore::new(url, None, "p:", Duration::from_millis(10), key)
            .err()
            .expect("an invalid URL");
        let text = format!("{err:#} {err:?}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("***@"), "{text}");
    }
}
