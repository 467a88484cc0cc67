//! The core's top-level modules depend on each other without cycles, but for those listed in
//! [`KNOWN`] (none now): a new cycle (module `a` naming `crate::b` while `b` reaches `a`) fails
//! this test, so the ones broken stay broken. Dependencies are read from the source: every `crate::<module>`
//! outside comments and test code, `use crate::{a::X, b::Y}` included.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles left, each a set of top-level modules that reach each other (none: `config` <->
/// `routing` went when the object helpers both parse with moved to `object`).
const KNOWN: &[&[&str]] = &[];

/// The top-level module a file belongs to (`deliver/read.rs` -> `deliver`), or `None` for `lib.rs`
/// and test files.
fn module_of(rel: &Path) -> Option<String> {
    let name = rel.file_name()?.to_str()?;
    if name == "lib.rs" && rel.parent().is_some_and(|p| p.as_os_str().is_empty()) {
        return None;
    }
    if name == "tests.rs" || rel.components().any(|c| c.as_os_str() == "tests") {
        return None;
    }
    let first = rel.components().next()?.as_os_str().to_str()?;
    Some(first.trim_end_matches(".rs").to_string())
}

/// The code of a file without comments and without an inline `#[cfg(test)] mod tests { ... }`.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string ("http://...") cuts the line short, which can only hide
            // an edge written after it on the same line: none is.
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segments of the paths after each `crate::` (`crate::a::X` -> a; `crate::{a::X, b}` -> a, b).
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(inner) = rest.strip_prefix('{') {
            let (mut depth, mut end) = (1, inner.len());
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let mut depth = 0;
            let mut item = String::new();
            for c in inner[..end].chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(item.trim().split("::").next().unwrap_or("").to_string());
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        } else {
            out.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    // As cargo sets it when it runs the test: a binary reused from another clone of the repository
    // (the target directory is shared) has that clone's path compiled in.
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from);
    let src = dir.join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let modules: BTreeSet<String> = files.iter().filter_map(|p| module_of(p.strip_prefix(&src).unwrap())).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for p in &files {
        let Some(from) = module_of(p.strip_prefix(&src).unwrap()) else { continue };
        for to in crate_paths(&code(&std::fs::read_to_string(p).unwrap())) {
            if to != from && modules.contains(&to) {
                edges.get_mut(&from).unwrap().insert(to);
            }
        }
    }
    edges
}

/// Modules reachable from `from`.
fn reach(edges: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(m) = todo.pop() {
        for n in &edges[&m] {
            if seen.insert(n.clone()) {
                todo.push(n.clone());
            }
        }
    }
    seen
}

/// The sets of two or more modules that reach each other.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<BTreeSet<String>> {
    let reached: BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|m| (m, reach(edges, m))).collect();
    edges
        .keys()
        .map(|a| {
            edges.keys().filter(|b| *b == a || (reached[a].contains(*b) && reached[*b].contains(a))).cloned().collect()
        })
        .filter(|c: &BTreeSet<String>| c.len() > 1)
        .collect()
}

#[test]
fn the_core_modules_form_no_cycle() {
    let edges = graph();
    assert!(edges.len() > 20 && edges["deliver"].contains("pipeline"), "the graph was read: {edges:?}");
    let known: BTreeSet<BTreeSet<String>> = KNOWN.iter().map(|c| c.iter().map(|m| m.to_string()).collect()).collect();
    let found = cycles(&edges);
    let new: Vec<_> = found.difference(&known).collect();
    assert!(new.is_empty(), "new module cycles in cdc-core: {new:?} (edges: {edges:?})");
    // A known cycle that was broken leaves the list, so it cannot come back unnoticed.
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(gone.is_empty(), "cycles listed in KNOWN that are broken now: {gone:?}");
}

#[test]
fn a_cycle_is_found_when_there_is_one() {
    // Negative control of the checker itself: the graph with one more edge back.
    let mut edges = graph();
    edges.get_mut("decode").unwrap().insert("pipeline".into());
    let found = cycles(&edges);
    assert!(found.iter().any(|c| c.contains("decode") && c.contains("pipeline")), "{found:?}");
    // And the parser reads grouped imports.
    assert_eq!(crate_paths("use crate::{decode::{A, B}, envelope::C, Lsn};"), ["decode", "envelope", "Lsn"]);
    assert!(code("// crate::pipeline\nlet x = 1; // crate::snapshot").trim() == "let x = 1;");
}
