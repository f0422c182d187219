//! SNI names mapped to values: exact names and one-label wildcards.

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
        let sni = normal_name(sni);
        self.exact.get(&sni).or_else(|| {
            let (_, parent) = sni.split_once('.')?;
            self.wildcard.get(parent)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
