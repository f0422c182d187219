//! `docs/configuration.md` documents every key the configuration accepts, and only those.
//!
//! The list of keys comes from the config types themselves, not from a copy kept by hand.
//! Every table of the configuration is a struct with `#[serde(deny_unknown_fields)]`, and
//! serde answers an unknown key with the names it would have accepted there ("unknown
//! field `__probe__`, expected one of `workers`, `pin_workers`, ..."): the field names
//! after `rename`, without `skip`ped fields, exactly what `Config::parse` reads. The test
//! asks each table that way, starting at the top level, and asks each key it learns of in
//! turn: a key whose value can hold its own unknown key (`[engine]`, `[[listener]]`,
//! `[[listener.certificate]]`, `acme = { .. }`) is a table to document as a section, any
//! other key is a value to document as a row. A table or key added to the types is thus
//! found without this file changing; a new table must keep `deny_unknown_fields`, which
//! every table has so that a misspelt key is an error.
//!
//! In the document, a heading naming tables in backticks (`` ## `[engine]` ``, several
//! for tables of one type) starts their section, a heading with "top level" the section
//! of the top-level keys, and a row `` | `key` | default | reload or restart | ... | ``
//! documents a key of that section.

use std::collections::{BTreeMap, BTreeSet};

use tlsterm::config::Config;

const PROBE: &str = "__probe__";

/// One step of a table's path: its key, and whether it is an array of tables.
#[derive(Clone)]
struct Step {
    key: String,
    array: bool,
}

fn dotted(path: &[Step]) -> String {
    path.iter()
        .map(|s| s.key.as_str())
        .collect::<Vec<_>>()
        .join(".")
}

/// A configuration text whose table at `path` holds only an unknown key.
fn probe_text(path: &[Step]) -> String {
    let mut text = String::new();
    for end in 1..=path.len() {
        let name = dotted(&path[..end]);
        match path[end - 1].array {
            true => text.push_str(&format!("[[{name}]]\n")),
            false => text.push_str(&format!("[{name}]\n")),
        }
    }
    text.push_str(&format!("{PROBE} = 1\n"));
    text
}

/// The keys serde accepts in the table at `path`, or `None` if no table is there.
fn accepted_keys(path: &[Step]) -> Option<Vec<String>> {
    let text = probe_text(path);
    let message = match Config::parse("probe.toml", &text) {
        Ok(_) => panic!("a configuration with an unknown key was accepted:\n{text}"),
        Err(err) => err.message,
    };
    let rest = message.strip_prefix(&format!("unknown field `{PROBE}`"))?;
    // "expected `a`", "expected `a` or `b`", "expected one of `a`, `b`, ..."
    let keys: Vec<String> = rest
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(
        !keys.is_empty(),
        "table `{}` accepts no key? {message}",
        dotted(path)
    );
    Some(keys)
}

/// Every table of the configuration (dotted path, "" for the top level) with its value keys.
fn tables_from_code() -> BTreeMap<String, BTreeSet<String>> {
    let mut tables = BTreeMap::new();
    let mut pending: Vec<Vec<Step>> = vec![Vec::new()];
    while let Some(path) = pending.pop() {
        let keys = accepted_keys(&path).expect("the table answers with its keys");
        let mut values = BTreeSet::new();
        for key in keys {
            let table = [true, false].into_iter().find_map(|array| {
                let mut child = path.clone();
                child.push(Step {
                    key: key.clone(),
                    array,
                });
                accepted_keys(&child).map(|_| child)
            });
            match table {
                Some(child) => pending.push(child),
                None => {
                    values.insert(key);
                }
            }
        }
        tables.insert(dotted(&path), values);
    }
    tables
}

/// The document's sections (as `tables_from_code` names them) with the keys of their rows,
/// and the problems found reading them.
fn tables_from_doc(doc: &str) -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut current: Vec<String> = Vec::new();
    for line in doc.lines() {
        if line.starts_with('#') {
            current = line
                .split('`')
                .skip(1)
                .step_by(2)
                .filter_map(|name| {
                    let name = name.strip_prefix('[')?.strip_suffix(']')?;
                    let name = name.strip_prefix('[').unwrap_or(name);
                    Some(name.strip_suffix(']').unwrap_or(name).to_string())
                })
                .collect();
            if line.to_ascii_lowercase().contains("top level") {
                current.push(String::new());
            }
            for name in &current {
                tables.entry(name.clone()).or_default();
            }
            continue;
        }
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let Some((key, rest)) = row.split_once('`') else {
            continue;
        };
        let columns: Vec<&str> = rest.split('|').map(str::trim).collect();
        // columns[0] is what follows the key in its cell, then default, reload, meaning.
        let reload = columns.get(2).copied().unwrap_or("");
        if !(reload.contains("reload") || reload.contains("restart")) {
            problems.push(format!(
                "row `{key}`: the third column must say \"reload\" or \"restart\", not {reload:?}"
            ));
        }
        if columns.get(3).is_none_or(|meaning| meaning.is_empty()) {
            problems.push(format!("row `{key}`: no description"));
        }
        if current.is_empty() {
            problems.push(format!("row `{key}` outside a table's section"));
        }
        for name in &current {
            tables
                .get_mut(name)
                .expect("section")
                .insert(key.to_string());
        }
    }
    (tables, problems)
}

fn shown(table: &str) -> String {
    match table {
        "" => "the top level".to_string(),
        name => format!("[{name}]"),
    }
}

#[test]
fn configuration_reference_documents_every_key() {
    let code = tables_from_code();
    // The probe itself is checked on what is known to be there.
    for (table, key) in [
        ("", "workers"),
        ("engine", "key_shares"),
        ("engine", "x25519_small_batch_threshold"),
        ("listener.server_name.certificate", "ocsp_fetch"),
        ("acme.external_account", "hmac_key_file"),
    ] {
        assert!(
            code.get(table).is_some_and(|keys| keys.contains(key)),
            "the probe missed `{key}` in {}: {code:?}",
            shown(table)
        );
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration.md");
    let (documented, mut problems) = tables_from_doc(&doc);
    for (table, keys) in &code {
        let Some(rows) = documented.get(table) else {
            problems.push(format!(
                "{} has no section (a heading naming `[{table}]`)",
                shown(table)
            ));
            continue;
        };
        for key in keys.difference(rows) {
            problems.push(format!("`{key}` of {} is not documented", shown(table)));
        }
        for key in rows.difference(keys) {
            problems.push(format!(
                "`{key}` is documented in {} but the configuration has no such key",
                shown(table)
            ));
        }
    }
    for table in documented.keys().filter(|t| !code.contains_key(*t)) {
        problems.push(format!(
            "section {} names no table of the configuration",
            shown(table)
        ));
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md is out of date:\n  {}",
        problems.join("\n  ")
    );
}
