//! The modules of `src/` depend on each other one way: a module uses only modules of a
//! lower layer, or of its own layer when no loop results. The layers are read from the
//! "Layout" table in `src/lib.rs`, so the table and the code cannot drift apart.
//!
//! Every `crate::module` path counts (use statements, grouped `crate::{a, b}` imports and
//! paths written inline); comments do not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// Module name → layer, from the rows `//! | N | `a`, `b` | ... |` of lib.rs's table.
fn layers() -> BTreeMap<String, u32> {
    let lib = std::fs::read_to_string(Path::new(SRC).join("lib.rs")).unwrap();
    let mut layers = BTreeMap::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! |") else {
            continue;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(layer) = cells.first().and_then(|cell| cell.parse::<u32>().ok()) else {
            continue;
        };
        for name in cells[1].split('`').skip(1).step_by(2) {
            layers.insert(name.trim_end_matches(".rs").to_string(), layer);
        }
    }
    assert!(!layers.is_empty(), "no Layout table in src/lib.rs");
    layers
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/tls/ech.rs` → `tls`).
fn module_of(path: &Path) -> String {
    let relative = path.strip_prefix(SRC).unwrap();
    let first = relative.components().next().unwrap();
    let name = first.as_os_str().to_str().unwrap();
    name.trim_end_matches(".rs").to_string()
}

/// The top-level modules a line of code names through `crate::`.
fn imports(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::X, b}`: each top-level item of the group.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            found.push(item);
        } else {
            found.push(rest.to_string());
        }
    }
    found
        .iter()
        .map(|item| {
            item.trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// Module → modules it imports, over all of `src/`.
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let from = module_of(&file);
        if from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines() {
            let code = line.split("//").next().unwrap();
            for to in imports(code) {
                if to != from {
                    graph.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    graph
}

#[test]
fn every_module_has_a_layer() {
    let layers = layers();
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    for file in files {
        let module = module_of(&file);
        assert!(
            module == "lib" || layers.contains_key(&module),
            "{} belongs to `{module}`, which the Layout table of src/lib.rs does not name",
            file.display()
        );
    }
}

#[test]
fn imports_point_down_the_layers() {
    let layers = layers();
    let mut wrong = Vec::new();
    for (from, targets) in dependencies() {
        for to in targets {
            let (Some(&a), Some(&b)) = (layers.get(&from), layers.get(&to)) else {
                wrong.push(format!("`{from}` imports `{to}`, which has no layer"));
                continue;
            };
            if b > a {
                wrong.push(format!("`{from}` (layer {a}) imports `{to}` (layer {b})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports pointing up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn modules_of_one_layer_import_each_other_without_loops() {
    let layers = layers();
    let graph = dependencies();
    // Only edges within a layer can close a loop, since the others all point down.
    let sideways = |from: &str| -> Vec<String> {
        graph
            .get(from)
            .into_iter()
            .flatten()
            .filter(|to| layers.get(*to) == layers.get(from))
            .cloned()
            .collect()
    };
    for start in graph.keys() {
        // Depth-first from `start`: reaching it again is a loop.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((module, path)) = stack.pop() {
            for next in sideways(&module) {
                assert!(
                    next != *start,
                    "modules import each other in a loop: {} → {next}",
                    path.join(" → ")
                );
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next, longer));
                }
            }
        }
    }
}

#[test]
fn the_scanner_sees_every_form_of_import() {
    assert_eq!(imports("use crate::config::Config;"), ["config"]);
    assert_eq!(
        imports("use crate::{config::{A, B}, metrics};"),
        ["config", "metrics"]
    );
    assert_eq!(
        imports("    let x = crate::tls::ech::EchKey::load(f) + crate::sys::f();"),
        ["tls", "sys"]
    );
    assert!(imports("use tlsterm_crate::x;").is_empty());
}
