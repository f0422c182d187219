//! SNI names mapped to values: exact names and one-label wildcards.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::config::normal_name;

/// SNI names mapped to values: exact names and "*.suffix" wildcards (one label deep).
pub(super) struct NameTable<T> {
    pub(super) exact: HashMap<String, T>,
    /// Keyed by the suffix after "*.".
    pub(super) wildcard: HashMap<String, T>,
}

impl<T: Default> NameTable<T> {
    pub(super) fn new() -> Self {
        NameTable {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
        }
    }

    pub(super) fn entry(&mut self, name: &str) -> &mut T {
        let name = normal_name(name);
        match name.strip_prefix("*.") {
            Some(suffix) => self.wildcard.entry(suffix.to_string()).or_default(),
            None => self.exact.entry(name).or_default(),
        }
    }

    /// The value for `sni`; a fully qualified name ("example.com.") is the same name.
    pub(super) fn lookup(&self, sni: &str) -> Option<&T> {
        // Clients send names in lower case: look those up as they are, without the copy
        // `normal_name` makes (this runs several times per handshake); the same name as it.
        let sni = sni.strip_suffix('.').unwrap_or(sni);
        let sni: Cow<'_, str> = match sni.bytes().any(|b| b.is_ascii_uppercase()) {
            true => Cow::Owned(sni.to_ascii_lowercase()),
            false => Cow::Borrowed(sni),
        };
        self.exact.get(sni.as_ref()).or_else(|| {
            let (_, parent) = sni.split_once('.')?;
            self.wildcard.get(parent)
        })
    }
}

/// Whether an SNI value is a host name: dot-separated labels of letters, digits, `-` and
/// `_` (1 to 63 bytes, no `-` at either end), 253 bytes at most, one trailing dot allowed.
/// Where names have client-certificate policies of their own, anything else
/// (`admin.test..`, a space, an empty label) is refused rather than given the listener's
/// policy while a backend reads it as the protected name.
pub(super) fn is_host_name(sni: &str) -> bool {
    let name = sni.strip_suffix('.').unwrap_or(sni);
    !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|label| crate::config::is_dns_label(label, b"_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_what_is_not_one() {
        for good in [
            "admin.test",
            "ADMIN.test.",
            "a-b.c_d.test",
            "localhost",
            "x",
        ] {
            assert!(is_host_name(good), "{good}");
        }
        let long_label = format!("{}.test", "a".repeat(64));
        let long_name = format!("{}a", "a.".repeat(127));
        for bad in [
            "admin.test..",
            ".admin.test",
            "admin..test",
            "admin.test ",
            " admin.test",
            "admin test",
            "-admin.test",
            "admin-.test",
            "*.admin.test",
            "admin.test\0",
            "",
            ".",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(!is_host_name(bad), "{bad:?}");
        }
    }

    #[test]
    pub(super) fn a_trailing_dot_names_the_same_host() {
        let mut table = NameTable::<usize>::new();
        *table.entry("Admin.Test") = 1;
        *table.entry("*.api.test.") = 2;
        assert_eq!(table.lookup("admin.test."), Some(&1));
        assert_eq!(table.lookup("ADMIN.TEST"), Some(&1));
        assert_eq!(table.lookup("x.api.test."), Some(&2));
        assert_eq!(table.lookup("x.api.test"), Some(&2));
        assert_eq!(table.lookup("admin.test.."), None);
        assert_eq!(table.lookup("."), None);
    }
}
