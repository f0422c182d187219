//! A typed builder for tlsterm's configuration file, so that a test says what it serves
//! (`ConfigBuilder::new().listener(|l| l.port(port).backend("builtin").cert(&c, &k))`)
//! rather than how TOML spells it. It renders with the `toml` crate, which quotes and
//! escapes; a key without a method of its own goes through `set`.

use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::free_port;

/// What renders as a TOML value: strings, paths, numbers, booleans and lists of them.
pub trait TomlValue {
    fn into_value(self) -> Value;
}

impl TomlValue for &str {
    fn into_value(self) -> Value {
        Value::String(self.to_string())
    }
}

impl TomlValue for String {
    fn into_value(self) -> Value {
        Value::String(self)
    }
}

impl TomlValue for &String {
    fn into_value(self) -> Value {
        Value::String(self.clone())
    }
}

impl TomlValue for &Path {
    fn into_value(self) -> Value {
        Value::String(self.display().to_string())
    }
}

impl TomlValue for &PathBuf {
    fn into_value(self) -> Value {
        self.as_path().into_value()
    }
}

impl TomlValue for std::net::SocketAddr {
    fn into_value(self) -> Value {
        Value::String(self.to_string())
    }
}

impl TomlValue for bool {
    fn into_value(self) -> Value {
        Value::Boolean(self)
    }
}

/// Integers of the widths tests write (ports, sizes, counts, thresholds).
macro_rules! toml_integer {
    ($($int:ty),*) => {$(
        impl TomlValue for $int {
            fn into_value(self) -> Value {
                Value::Integer(i64::try_from(self).expect("fits a TOML integer"))
            }
        }
    )*};
}

toml_integer!(i32, i64, u16, u32, u64, usize);

impl<T: TomlValue + Clone> TomlValue for &[T] {
    fn into_value(self) -> Value {
        Value::Array(self.iter().cloned().map(TomlValue::into_value).collect())
    }
}

impl<T: TomlValue, const N: usize> TomlValue for [T; N] {
    fn into_value(self) -> Value {
        Value::Array(self.into_iter().map(TomlValue::into_value).collect())
    }
}

impl<T: TomlValue> TomlValue for Vec<T> {
    fn into_value(self) -> Value {
        Value::Array(self.into_iter().map(TomlValue::into_value).collect())
    }
}

/// Appends `table` to the array of tables `key` (`[[key]]`).
fn push_table(into: &mut Table, key: &str, table: Table) {
    let list = into.entry(key).or_insert_with(|| Value::Array(Vec::new()));
    list.as_array_mut()
        .expect("an array of tables")
        .push(Value::Table(table));
}

/// Appends `value` to the list `key`.
fn push_value(into: &mut Table, key: &str, value: Value) {
    let list = into.entry(key).or_insert_with(|| Value::Array(Vec::new()));
    list.as_array_mut().expect("a list").push(value);
}

/// A whole configuration file: two workers and an admin port of its own (tests run in
/// parallel) unless the test says otherwise. A clone keeps the admin port: a test that
/// rewrites its configuration for a reload builds both from one base.
#[derive(Clone)]
pub struct ConfigBuilder {
    root: Table,
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        ConfigBuilder::new()
    }
}

impl ConfigBuilder {
    pub fn new() -> ConfigBuilder {
        let mut root = Table::new();
        root.insert("workers".into(), Value::Integer(2));
        let mut admin = Table::new();
        let address = format!("127.0.0.1:{}", free_port());
        admin.insert("address".into(), Value::String(address));
        root.insert("admin".into(), Value::Table(admin));
        ConfigBuilder { root }
    }

    /// The `[admin]` address.
    pub fn admin_address(&self) -> std::net::SocketAddr {
        self.root["admin"]["address"]
            .as_str()
            .and_then(|address| address.parse().ok())
            .expect("an admin address")
    }

    /// A top-level key.
    pub fn set(mut self, key: &str, value: impl TomlValue) -> ConfigBuilder {
        self.root.insert(key.into(), value.into_value());
        self
    }

    /// One `[[listener]]`.
    pub fn listener(mut self, build: impl FnOnce(Listener) -> Listener) -> ConfigBuilder {
        let listener = build(Listener(Table::new()));
        push_table(&mut self.root, "listener", listener.0);
        self
    }

    /// A section such as `[session]` or `[ocsp]`, key by key.
    pub fn section(mut self, name: &str, build: impl FnOnce(Section) -> Section) -> ConfigBuilder {
        let section = self
            .root
            .entry(name)
            .or_insert_with(|| Value::Table(Table::new()))
            .as_table_mut()
            .expect("a section")
            .clone();
        let built = build(Section(section));
        self.root.insert(name.into(), Value::Table(built.0));
        self
    }

    /// `[session]`.
    pub fn session(self, build: impl FnOnce(Section) -> Section) -> ConfigBuilder {
        self.section("session", build)
    }

    /// `[session]` as `session` has it.
    pub fn session_as(self, session: &Section) -> ConfigBuilder {
        self.section("session", |_| session.clone())
    }

    pub fn render(&self) -> String {
        toml::to_string(&self.root).expect("a configuration renders as TOML")
    }

    /// Writes `tlsterm.toml` in `dir`; returns its path.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("tlsterm.toml");
        std::fs::write(&path, self.render()).unwrap();
        path
    }
}

/// A section's keys; `Section::default()` starts one to pass around (e.g. a fleet's
/// `[session]` shared by several servers).
#[derive(Clone, Default)]
pub struct Section(Table);

impl Section {
    pub fn set(mut self, key: &str, value: impl TomlValue) -> Section {
        self.0.insert(key.into(), value.into_value());
        self
    }

    pub fn has(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }
}

/// One `[[listener]]`.
pub struct Listener(Table);

impl Listener {
    pub fn set(mut self, key: &str, value: impl TomlValue) -> Listener {
        self.0.insert(key.into(), value.into_value());
        self
    }

    /// `address = "127.0.0.1:port"`.
    pub fn port(self, port: u16) -> Listener {
        self.set("address", format!("127.0.0.1:{port}"))
    }

    /// Adds one entry to `backends`.
    pub fn backend(mut self, backend: impl TomlValue) -> Listener {
        push_value(&mut self.0, "backends", backend.into_value());
        self
    }

    /// `proxy_protocol = "v2"`: a PROXY v2 header, with the TLS details, to the backend.
    pub fn proxy_v2(self) -> Listener {
        self.set("proxy_protocol", "v2")
    }

    /// `client_auth` with the CA bundle that verifies client certificates.
    pub fn client_auth(self, mode: &str, ca: &Path) -> Listener {
        self.set("client_auth", mode).set("client_ca", ca)
    }

    /// A `[[listener.certificate]]` with this certificate chain and key.
    pub fn cert(self, cert: &Path, key: &Path) -> Listener {
        self.certificate(|c| c.files(cert, key))
    }

    /// A `[[listener.certificate]]` with more than its files.
    pub fn certificate(mut self, build: impl FnOnce(Certificate) -> Certificate) -> Listener {
        push_table(
            &mut self.0,
            "certificate",
            build(Certificate(Table::new())).0,
        );
        self
    }

    /// A `[[listener.server_name]]` for `names`.
    pub fn server_name(
        mut self,
        names: &[&str],
        build: impl FnOnce(ServerName) -> ServerName,
    ) -> Listener {
        let name = ServerName(Table::new()).set("names", names);
        push_table(&mut self.0, "server_name", build(name).0);
        self
    }
}

/// One `[[listener.certificate]]`.
pub struct Certificate(Table);

impl Certificate {
    pub fn set(mut self, key: &str, value: impl TomlValue) -> Certificate {
        self.0.insert(key.into(), value.into_value());
        self
    }

    pub fn files(self, cert: &Path, key: &Path) -> Certificate {
        self.set("cert", cert).set("key", key)
    }
}

/// One `[[listener.server_name]]`.
pub struct ServerName(Table);

impl ServerName {
    pub fn set(mut self, key: &str, value: impl TomlValue) -> ServerName {
        self.0.insert(key.into(), value.into_value());
        self
    }

    /// Adds one entry to its `backends`.
    pub fn backend(mut self, backend: impl TomlValue) -> ServerName {
        push_value(&mut self.0, "backends", backend.into_value());
        self
    }

    /// Its own `client_auth` with the CA bundle that verifies client certificates.
    pub fn client_auth(self, mode: &str, ca: &Path) -> ServerName {
        self.set("client_auth", mode).set("client_ca", ca)
    }

    /// A `[[listener.server_name.certificate]]`.
    pub fn cert(mut self, cert: &Path, key: &Path) -> ServerName {
        push_table(
            &mut self.0,
            "certificate",
            Certificate(Table::new()).files(cert, key).0,
        );
        self
    }
}
