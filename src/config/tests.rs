//! Configuration checks: every error names its key and line.

use super::*;

#[test]
fn group_names() {
    assert_eq!(group_name("x25519"), Some("X25519"));
    assert_eq!(group_name("X25519MLKEM768"), Some("X25519MLKEM768"));
    assert_eq!(group_name("prime256v1"), Some("P-256"));
    assert_eq!(group_name("X448"), None);
}

#[test]
fn a_bad_session_table_names_its_line() {
    let text = "workers = 1\n\n[session]\nticket_rotation = \"0s\"\n\n[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(3), "{err}");
    assert!(
        err.message.contains("ticket_rotation must be more than 0"),
        "{err}"
    );
}

#[test]
fn embedded_default_parses() {
    let config = Config::embedded_default();
    assert_eq!(config.listeners.len(), 1);
    assert_eq!(
        config.listeners[0].handshake_timeout,
        Duration::from_secs(10)
    );
    assert_eq!(config.engine.mode, EngineMode::Batch);
}

#[test]
fn unknown_key_names_key_and_line() {
    let text = "workers = 1\n\n[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nfrobnicate = 3\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(6), "{err}");
    assert!(err.message.contains("frobnicate"), "{err}");
}

#[test]
fn a_listener_address_twice_names_the_second() {
    let listener = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    let err = Config::parse("t.toml", &listener.repeat(2)).unwrap_err();
    assert_eq!(err.line, Some(5), "{err}");
    assert!(err.message.contains("key `address`"), "{err}");
}

#[test]
fn bad_value_names_line() {
    let text = "[[listener]]\naddress = \"not an address\"\nbackends = [\"builtin\"]\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(2), "{err}");
}

#[test]
fn missing_certificate_file_names_key_and_line() {
    let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n[[listener.certificate]]\ncert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\"\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(5), "{err}");
    assert!(err.message.contains("key `cert`"), "{err}");
}

#[test]
fn early_data_needs_tls13() {
    let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nmax_version = \"1.2\"\nearly_data = true\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(5), "{err}");
    assert!(err.message.contains("key `early_data`"), "{err}");
    let on = text.replace("max_version = \"1.2\"\n", "");
    assert!(*Config::parse("t.toml", &on).unwrap().listeners[0]
        .early_data
        .get_ref());
    let err = Config::parse("t.toml", &format!("{on}max_early_data = 20000\n")).unwrap_err();
    assert_eq!(err.line, Some(5), "{err}");
    assert!(err.message.contains("key `max_early_data`"), "{err}");
}

#[test]
fn server_name_certificates_default_to_the_block_names() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["a.pem", "a.key"] {
        std::fs::write(dir.path().join(file), "").unwrap();
    }
    let text = format!(
        "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n\
         [[listener.server_name]]\nnames = [\"a.test\", \"*.a.test\"]\n\
         [[listener.server_name.certificate]]\ncert = \"{0}/a.pem\"\nkey = \"{0}/a.key\"\n\
         [[listener.server_name.certificate]]\ncert = \"{0}/a.pem\"\nkey = \"{0}/a.key\"\nnames = [\"x.test\"]\n",
        dir.path().display()
    );
    let config = Config::parse("t.toml", &text).unwrap();
    let certs = &config.listeners[0].certificates;
    assert_eq!(certs.len(), 2);
    assert_eq!(certs[0].names, ["a.test", "*.a.test"]);
    assert_eq!(certs[1].names, ["x.test"]);
    assert!(config.listeners[0].server_names[0].certificates.is_empty());
}

#[test]
fn client_crl_needs_client_ca() {
    let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nclient_crl = \"crl.pem\"\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(4), "{err}");
    assert!(
        err.message.contains("key `client_crl` needs `client_ca`"),
        "{err}"
    );
}

#[test]
fn a_name_with_its_own_client_certificate_policy_needs_its_own_backends() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), "").unwrap();
    let ca = format!("client_ca = \"{}/ca.pem\"\n", dir.path().display());
    let listener = |auth: &str| {
        format!(
            "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n{ca}\
             client_auth = \"{auth}\"\n[[listener.server_name]]\nnames = [\"admin.test\"]\n"
        )
    };
    for (auth, name) in [
        ("none", "client_auth = \"required\"\n"),
        ("none", "client_auth = \"optional\"\n"),
        ("required", "client_auth = \"none\"\n"),
        ("required", "client_crl_check = \"chain\"\n"),
        ("optional", ca.as_str()),
    ] {
        let text = format!("{}{name}", listener(auth));
        let err = Config::parse("t.toml", &text).unwrap_err();
        assert_eq!(err.line, Some(7), "{auth} / {name}: {err}");
        assert!(err.message.contains("key `backends`"), "{err}");
        let own = format!("{text}backends = [\"127.0.0.1:2\"]\n");
        assert!(Config::parse("t.toml", &own).is_ok(), "{auth} / {name}");
    }
    // The listener's policy again, or none asked for at all: the listener's backends.
    for (auth, name) in [
        ("required", "client_auth = \"required\"\n"),
        ("none", "client_auth = \"none\"\n"),
        ("none", "client_crl_check = \"chain\"\n"),
        ("optional", "alpn = [\"h2\"]\n"),
    ] {
        let text = format!("{}{name}", listener(auth));
        assert!(Config::parse("t.toml", &text).is_ok(), "{auth} / {name}");
    }
}

#[test]
fn cert_compression_is_checked() {
    let base = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    let config = Config::parse("t.toml", base).unwrap();
    assert_eq!(
        config.listeners[0].cert_compression.get_ref(),
        &["brotli", "zlib"]
    );
    for bad in ["[\"zstd\"]", "[\"zlib\", \"ZLIB\"]"] {
        let text = format!("{base}cert_compression = {bad}\n");
        let err = Config::parse("t.toml", &text).unwrap_err();
        assert_eq!(err.line, Some(4), "{err}");
        assert!(err.message.contains("key `cert_compression`"), "{err}");
    }
    let off = format!("{base}cert_compression = []\n");
    assert!(Config::parse("t.toml", &off).unwrap().listeners[0]
        .cert_compression
        .get_ref()
        .is_empty());
}

#[test]
fn post_quantum_group_is_first_by_default() {
    let base = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    let config = Config::parse("t.toml", base).unwrap();
    assert_eq!(config.listeners[0].groups.get_ref()[0], "X25519MLKEM768");
    let text = format!("{base}groups = [\"x25519mlkem768\", \"x25519\"]\n");
    assert!(Config::parse("t.toml", &text).is_ok());
    let err = Config::parse("t.toml", &format!("{base}groups = []\n")).unwrap_err();
    assert_eq!(err.line, Some(4), "{err}");
}

#[test]
fn unknown_group_is_refused() {
    let text =
        "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\ngroups = [\"X448\"]\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(4), "{err}");
}

#[test]
fn acme_names_come_from_the_listener_or_the_server_name() {
    let text = r#"
[acme]
directory = "https://ca.example/dir"
storage = "/tmp/acme"

[[listener]]
address = "127.0.0.1:1"
backends = ["builtin"]
acme = { names = ["A.example", "b.example."] }

[[listener.server_name]]
names = ["api.example"]
acme = { key_types = ["rsa-2048", "ecdsa-p256"] }
"#;
    let config = Config::parse("t.toml", text).unwrap();
    let got: Vec<(Vec<String>, AcmeKeyType)> = config.listeners[0]
        .acme_certificates
        .iter()
        .map(|c| (c.names.clone(), c.key_type))
        .collect();
    let ab = vec!["a.example".to_string(), "b.example".to_string()];
    let api = vec!["api.example".to_string()];
    assert_eq!(
        got,
        [
            (ab, AcmeKeyType::EcdsaP256),
            (api.clone(), AcmeKeyType::Rsa2048),
            (api, AcmeKeyType::EcdsaP256)
        ]
    );
}

#[test]
fn acme_names_without_acme_section_name_their_line() {
    let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nacme = { names = [\"a.example\"] }\n";
    let err = Config::parse("t.toml", text).unwrap_err().to_string();
    assert!(
        err.starts_with("t.toml:4:") && err.contains("[acme]"),
        "{err}"
    );
    let with_redis = "[session]\nredis_url = \"redis://127.0.0.1\"\n[acme]\ndirectory = \"https://ca.example/dir\"\nstorage = \"s\"\n".to_string() + text;
    let err = Config::parse("t.toml", &with_redis)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fleet_key_file"), "{err}");
}

/// The fleet key: needed with Redis (the error names `[session]`), refused with its line
/// and key when group or others may read it, or when it holds no key; `[acme]
/// fleet_key_file` says where it went.
#[test]
fn the_fleet_key_file_is_checked_and_names_its_line() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("fleet.key");
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    let listener = "\n[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    let redis = "workers = 1\n\n[session]\nredis_url = \"redis://127.0.0.1/\"\n";
    let err = Config::parse("t.toml", &format!("{redis}{listener}")).unwrap_err();
    assert_eq!(err.line, Some(3), "{err}");
    assert!(
        err.message.contains("key `fleet_key_file` is needed"),
        "{err}"
    );

    let with_key = format!("{redis}fleet_key_file = {key:?}\n{listener}");
    for mode in [0o644, 0o640, 0o606] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        let err = Config::parse("t.toml", &with_key).unwrap_err();
        assert_eq!(err.line, Some(5), "{err}");
        assert!(
            err.message.starts_with("key `fleet_key_file`")
                && err.message.contains(&format!("mode {mode:04o}")),
            "{err}"
        );
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = Config::parse("t.toml", &with_key).unwrap();
    assert_eq!(config.session.fleet_key_file.unwrap().get_ref(), &key);
    std::fs::write(&key, "# rotated out\n").unwrap();
    let err = Config::parse("t.toml", &with_key).unwrap_err();
    assert_eq!(err.line, Some(5), "{err}");
    assert!(err.message.contains("no key"), "{err}");

    let acme = format!("[acme]\ndirectory = \"https://ca.example/dir\"\nstorage = \"s\"\nfleet_key_file = {key:?}\n{listener}");
    let err = Config::parse("t.toml", &acme).unwrap_err();
    assert_eq!(err.line, Some(4), "{err}");
    assert!(
        err.message.contains("moved to `[session] fleet_key_file`"),
        "{err}"
    );
}

/// The ACME directory must be https:// (its error always said so).
#[test]
fn an_acme_directory_that_is_not_https_names_its_line() {
    let listener = "\n[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    for directory in [
        "http://ca.example/dir",
        "ftp://ca.example/",
        "https://",
        "ca.example",
    ] {
        let text = format!("[acme]\nstorage = \"s\"\ndirectory = \"{directory}\"\n{listener}");
        let err = Config::parse("t.toml", &text).unwrap_err();
        assert_eq!(err.line, Some(3), "{directory}: {err}");
        assert!(err.message.contains("must be an https:// URL"), "{err}");
    }
    for directory in ["https://ca.example/dir", "HTTPS://ca.example/dir"] {
        let text = format!("[acme]\nstorage = \"s\"\ndirectory = \"{directory}\"\n{listener}");
        Config::parse("t.toml", &text).unwrap();
    }
}

#[test]
fn a_ticket_rotation_too_long_for_shared_keys_names_its_line() {
    let text = "workers = 1\n\n[session]\nticket_rotation = \"100000000000000000s\"\nredis_ticket_keys = true\nredis_url = \"redis://127.0.0.1/\"\n\n[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(3), "{err}");
    assert!(
        err.message
            .contains("[session] ticket_rotation is too long"),
        "{err}"
    );
    // Without Redis the keys live in memory, on the clock: a century at most.
    let memory = text.replace("redis_ticket_keys = true\n", "");
    let err = Config::parse("t.toml", &memory).unwrap_err();
    assert_eq!(err.line, Some(3), "{err}");
    assert!(
        err.message
            .contains("[session] ticket_rotation may be at most"),
        "{err}"
    );
    let grace = memory.replace(
        "\"100000000000000000s\"",
        "\"1h\"\nticket_grace = \"101years\"",
    );
    let err = Config::parse("t.toml", &grace).unwrap_err();
    assert!(
        err.message
            .contains("[session] ticket_grace may be at most"),
        "{err}"
    );
}

#[test]
fn a_listener_max_connections_beyond_a_semaphore_names_its_line() {
    let base = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    for bad in ["0", "4611686018427387904"] {
        let text = format!("{base}max_connections = {bad}\n");
        let err = Config::parse("t.toml", &text).unwrap_err();
        assert_eq!(err.line, Some(4), "{bad}: {err}");
        assert!(err.message.contains("key `max_connections`"), "{err}");
    }
    let most = format!(
        "{base}max_connections = {}\n",
        tokio::sync::Semaphore::MAX_PERMITS
    );
    assert!(Config::parse("t.toml", &most).is_ok());
}

#[test]
fn a_log_level_that_is_not_a_level_names_its_line() {
    let listener = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n";
    let with = |level: &str| format!("workers = 1\n[log]\nlevel = \"{level}\"\n{listener}");
    for bad in ["information", "warning", "info,tlsterm", "tlsterm=loud", ""] {
        let err = Config::parse("t.toml", &with(bad)).unwrap_err();
        assert_eq!(err.line, Some(3), "{bad}: {err}");
        assert!(err.message.contains("key `log.level`"), "{bad}: {err}");
    }
    for good in [
        "info",
        "WARN",
        "off",
        "info,tlsterm=debug",
        "tlsterm::tls=trace, warn",
        "[conn]=debug",
    ] {
        let config = Config::parse("t.toml", &with(good)).unwrap();
        assert_eq!(config.log.level, good);
    }
}

#[test]
fn a_server_name_min_version_above_the_listener_max_names_its_line() {
    let text = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\nmax_version = \"1.2\"\n[[listener.server_name]]\nnames = [\"a.test\"]\nmin_version = \"1.3\"\n";
    let err = Config::parse("t.toml", text).unwrap_err();
    assert_eq!(err.line, Some(7), "{err}");
    assert!(err.message.contains("key `min_version`"), "{err}");
    let both = text.replace("max_version = \"1.2\"\n", "");
    let config = Config::parse("t.toml", &both).unwrap();
    let min = config.listeners[0].server_names[0].min_version.as_ref();
    assert_eq!(min.map(|v| *v.get_ref()), Some(TlsVersion::Tls13));
}

/// A name with a stricter client-certificate policy may share a backend with its listener
/// only when PROXY v2 tells that backend each connection's name and client certificate.
#[test]
fn a_backend_shared_under_two_client_policies_needs_proxy_v2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "").unwrap();
    let text = |proxy: &str, backends: &str| {
        format!("[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"app:80\"]\n{proxy}\n[[listener.server_name]]\nnames = [\"admin.test\"]\nclient_auth = \"required\"\nclient_ca = {ca:?}\nbackends = [{backends}]\n")
    };
    let err = Config::parse("t.toml", &text("", "\"admin:80\", \"app:80\"")).unwrap_err();
    assert_eq!(err.line, Some(9), "{err}");
    assert!(
        err.message.contains("key `backends`") && err.message.contains("`app:80`"),
        "{err}"
    );
    let v1 = text("proxy_protocol = \"v1\"", "\"app:80\"");
    assert!(
        Config::parse("t.toml", &v1).is_err(),
        "v1 carries no name nor certificate"
    );
    for accepted in [
        text("", "\"admin:80\""),
        text("proxy_protocol = \"v2\"", "\"app:80\""),
    ] {
        Config::parse("t.toml", &accepted).unwrap();
    }
}

/// Two server names with different client-certificate policies may share a backend only
/// with PROXY v2, as a name and its listener.
#[test]
fn a_backend_shared_by_two_names_of_different_client_policies_needs_proxy_v2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "").unwrap();
    let text = |proxy: &str, second_auth: &str| {
        format!("[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"app:80\"]\n{proxy}\n[[listener.server_name]]\nnames = [\"admin.test\"]\nclient_auth = \"required\"\nclient_ca = {ca:?}\nbackends = [\"admin:80\"]\n[[listener.server_name]]\nnames = [\"partner.test\"]\nclient_auth = \"{second_auth}\"\nclient_ca = {ca:?}\nbackends = [\"admin:80\"]\n")
    };
    let err = Config::parse("t.toml", &text("", "optional")).unwrap_err();
    assert_eq!(err.line, Some(14), "the second block's `backends`: {err}");
    assert!(
        err.message.contains("`admin:80`") && err.message.contains("admin.test"),
        "{err}"
    );
    for accepted in [
        text("", "required"),
        text("proxy_protocol = \"v2\"", "optional"),
    ] {
        Config::parse("t.toml", &accepted).unwrap();
    }
}

/// The same check on the addresses the backends resolve to: another spelling of the
/// listener's backend (a name, a shortened or zero-padded IPv4 address, an IPv4-mapped
/// IPv6 one, another loopback address) is the same backend, and the error names the
/// lines of both lists.
#[test]
fn a_backend_spelled_otherwise_is_compared_by_address() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "").unwrap();
    let text = |name_backends: &str| {
        format!("[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"127.0.0.1:9001\"]\n\n[[listener.server_name]]\nnames = [\"admin.test\"]\nclient_auth = \"required\"\nclient_ca = {ca:?}\nbackends = [{name_backends}]\n[[listener.server_name]]\nnames = [\"partner.test\"]\nclient_auth = \"optional\"\nclient_ca = {ca:?}\nbackends = [\"10.0.0.2:80\"]\n")
    };
    let resolve = |backend: &str| -> Vec<std::net::SocketAddr> {
        match backend {
            "localhost:9001" => vec![
                "[::1]:9001".parse().unwrap(),
                "127.0.0.1:9001".parse().unwrap(),
            ],
            "127.1:9001" | "127.0.0.1:09001" => vec!["127.0.0.1:9001".parse().unwrap()],
            "other.test:80" => vec!["10.0.0.2:80".parse().unwrap()],
            "own.test:9002" => vec!["127.0.0.1:9002".parse().unwrap()],
            written => vec![written.parse().unwrap()],
        }
    };
    for spelling in [
        "localhost:9001",
        "127.1:9001",
        "127.0.0.1:09001",
        "[::ffff:127.0.0.1]:9001",
        "127.0.0.2:9001",
        "[::1]:9001",
        "0.0.0.0:9001",
    ] {
        let config = Config::parse(
            "t.toml",
            &text(&format!("\"own.test:9002\", \"{spelling}\"")),
        )
        .unwrap();
        let err = config.listeners[0]
            .check_backend_addresses(resolve)
            .unwrap_err();
        assert_eq!(err.line, Some(9), "{spelling}: {err}");
        assert!(
            err.message.contains(&format!("`{spelling}`"))
                && err.message.contains("`127.0.0.1:9001`")
                && err.message.contains("the listener (line 3)"),
            "{spelling}: {err}"
        );
    }
    // Two names of different policies: the second's line, and the first's.
    let config = Config::parse("t.toml", &text("\"own.test:9002\"")).unwrap();
    config.listeners[0]
        .check_backend_addresses(resolve)
        .unwrap();
    let both = text("\"other.test:80\"");
    let config = Config::parse("t.toml", &both).unwrap();
    let err = config.listeners[0]
        .check_backend_addresses(resolve)
        .unwrap_err();
    assert_eq!(err.line, Some(14), "{err}");
    assert!(
        err.message.contains("`10.0.0.2:80`") && err.message.contains("(line 9)"),
        "{err}"
    );
    // With PROXY v2 the backend tells the policies apart: nothing to compare.
    let v2 = text("\"localhost:9001\"").replace("\n\n", "\nproxy_protocol = \"v2\"\n");
    let config = Config::parse("t.toml", &v2).unwrap();
    config.listeners[0]
        .check_backend_addresses(resolve)
        .unwrap();
}

#[test]
fn a_server_name_in_two_blocks_names_the_second() {
    let base = "[[listener]]\naddress = \"127.0.0.1:1\"\nbackends = [\"builtin\"]\n[[listener.server_name]]\nnames = [\"a.test\", \"*.b.test\"]\nalpn = [\"h2\"]\n";
    for again in ["A.test.", "*.B.test"] {
        let text = format!("{base}[[listener.server_name]]\nnames = [\"c.test\", \"{again}\"]\n");
        let err = Config::parse("t.toml", &text).unwrap_err();
        assert_eq!(err.line, Some(8), "{again}: {err}");
        assert!(
            err.message.contains(&format!("key `names`: `{again}`")),
            "{err}"
        );
    }
    // Another listener may serve the same name otherwise.
    let other = base.replace("127.0.0.1:1", "127.0.0.1:2");
    assert!(Config::parse("t.toml", &format!("{base}{other}")).is_ok());
}
