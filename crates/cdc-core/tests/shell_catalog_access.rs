//! The extension's processes that decode keep the catalog entries a decoding built from one read
//! to the next, and drop them before any ordinary catalog access (`catalog::present_catalog` in
//! the extension's `src/catalog.rs`). That holds only if every ordinary access goes through it:
//! this test reads the extension's source and fails when a function outside `src/api/` (the SQL
//! functions, which run in sessions that never decode) starts a transaction or runs SPI without
//! calling `present_catalog()` itself.
use std::path::{Path, PathBuf};

/// Calls that reach the catalogs: SPI statements and a transaction's start (which a worker
/// follows with catalog access).
const ACCESS: &[&str] = &[
    "Spi::connect",
    "Spi::run",
    "Spi::get_one",
    "Spi::execute",
    "SPI_execute",
    "SPI_prepare",
    "SPI_cursor_open",
    "StartTransactionCommand()",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a line without its comment.
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |at| &line[..at])
}

/// Whether the line starts a function (`fn`, `pub fn`, `pub(crate) unsafe fn`, ...).
fn starts_fn(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().take_while(|w| !w.contains('(') || w.starts_with("pub(")).collect();
    words.contains(&"fn")
}

/// `file:line: code` of every access whose function does not call `present_catalog()`.
fn unguarded(text: &str, file: &str) -> Vec<String> {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    let lines: Vec<&str> = text.lines().collect();
    let starts: Vec<usize> = (0..lines.len()).filter(|&i| starts_fn(code(lines[i]))).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let line = code(line);
        if !ACCESS.iter().any(|a| line.contains(a)) {
            continue;
        }
        let start = starts.iter().rev().find(|&&s| s <= i).copied().unwrap_or(0);
        let end = starts.iter().find(|&&s| s > i).copied().unwrap_or(lines.len());
        if !lines[start..end].iter().any(|l| code(l).contains("present_catalog()")) {
            out.push(format!("{file}:{}: {}", i + 1, line.trim()));
        }
    }
    out
}

#[test]
fn every_catalog_access_of_the_shell_drops_decoding_entries_first() {
    // As cargo sets it when it runs the test (see module_cycles.rs).
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from);
    let src = dir.join("../../src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 10, "the extension's source is not at {}", src.display());
    let mut bad = Vec::new();
    let mut seen = 0;
    for path in files {
        let rel = path.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        if rel.starts_with("api/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        seen += text.lines().filter(|l| ACCESS.iter().any(|a| code(l).contains(a))).count();
        bad.extend(unguarded(&text, &rel));
    }
    assert!(seen >= 8, "found only {seen} catalog accesses: the scan no longer sees them");
    assert!(bad.is_empty(), "catalog access without catalog::present_catalog() first:\n{}", bad.join("\n"));
}

#[test]
fn an_access_without_the_guard_is_found() {
    let text = "fn ok() {\n    present_catalog();\n    Spi::connect(|c| 1);\n}\n\
                pub(crate) fn bad() {\n    // present_catalog() in a comment does not count\n    Spi::run(\"x\");\n}\n";
    assert_eq!(unguarded(text, "f.rs"), vec!["f.rs:7: Spi::run(\"x\");".to_string()]);
}
