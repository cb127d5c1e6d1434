//! The code's shape, checked: no production file in `src/` or `dataplane/src/` is over 800
//! lines, and no two files import each other, directly or around a longer cycle. A file's
//! imports are the `crate::` and `super::` paths in its code (comments and its inline test
//! module left out), resolved to the module files they name; a module using its own
//! descendants, or a child using its parent's items, is nesting, not a cycle.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

/// Module path ("nft::plan", "" for the crate root) -> file, for the `.rs` files under
/// `root`; test-only files (`tests.rs`, `tests/`) are left out.
fn modules(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "tests") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("tests.rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The code of a file without comments and without its inline test module.
fn code(text: &str) -> String {
    let body = text
        .split("#[cfg(test)]\nmod tests {")
        .next()
        .unwrap_or(text);
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Paths starting `crate::` or `super::`, with the names of `use` groups expanded one
/// level (`use super::{a, b::c}` gives `super::a` and `super::b::c`).
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            if at > 0 && (ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                continue;
            }
            let mut end = at;
            while end < bytes.len() && (ident(bytes[end]) || bytes[end] == b':') {
                end += 1;
            }
            let path = code[at..end].trim_end_matches(':').to_string();
            if code[end..].starts_with('{') {
                let close = code[end..].find('}').map_or(code.len(), |c| end + c);
                for item in code[end + 1..close].split(',') {
                    let item: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    if !item.is_empty() && item != "self" {
                        out.push(format!("{path}::{item}"));
                    }
                }
            }
            out.push(path);
        }
    }
    out
}

/// The module file a path names: its longest prefix that is a module.
fn resolve(from: &str, path: &str, mods: &BTreeMap<String, PathBuf>) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").collect()
    };
    match parts.first() {
        Some(&"crate") => {
            base.clear();
            parts.remove(0);
        }
        Some(&"super") => {
            while parts.first() == Some(&"super") {
                base.pop();
                parts.remove(0);
            }
        }
        _ => return None,
    }
    (0..=parts.len()).rev().find_map(|n| {
        let mut m = base.clone();
        m.extend(&parts[..n]);
        let m = m.join("::");
        mods.contains_key(&m).then_some(m)
    })
}

fn nested(a: &str, b: &str) -> bool {
    a.is_empty()
        || b.is_empty()
        || a.starts_with(&format!("{b}::"))
        || b.starts_with(&format!("{a}::"))
}

/// Strongly connected groups of more than one file.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Reachability is enough at this size: a and b are in one cycle when each reaches the other.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for m in graph.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    todo.push(m.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|k| (k, reach(k))).collect();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for a in graph.keys() {
        if groups.iter().any(|g| g.contains(a)) {
            continue;
        }
        let group: Vec<String> = graph
            .keys()
            .filter(|b| *b == a || (reaches[a].contains(*b) && reaches[*b].contains(a)))
            .cloned()
            .collect();
        if group.len() > 1 {
            groups.push(group);
        }
    }
    groups
}

fn check(root: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mods = modules(root);
    let mut long = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, file) in &mods {
        let text = std::fs::read_to_string(file).unwrap();
        let lines = text.lines().count();
        if lines > MAX_LINES {
            long.push(format!("{} ({lines} lines)", file.display()));
        }
        let deps = graph.entry(m.clone()).or_default();
        for p in paths(&code(&text)) {
            if let Some(t) = resolve(m, &p, &mods).filter(|t| t != m && !nested(m, t)) {
                deps.insert(t);
            }
        }
    }
    (long, cycles(&graph))
}

#[test]
fn no_production_file_is_over_800_lines_and_no_files_import_each_other() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for root in [here.join("src"), here.join("dataplane/src")] {
        let (long, cycles) = check(&root);
        assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
        assert!(
            cycles.is_empty(),
            "import cycles in {}: {cycles:?}",
            root.display()
        );
    }
}

#[test]
fn the_checker_sees_a_cycle_and_a_long_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod x;\nuse crate::b::thing;\n").unwrap();
    // A child using its parent is nesting; the doc comment naming b is no import.
    std::fs::write(src.join("a/x.rs"), "use super::*;\n/// see crate::b\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        format!(
            "use crate::a::{{x, other}};\n{}",
            "\n".repeat(MAX_LINES + 1)
        ),
    )
    .unwrap();
    let (long, cycles) = check(src);
    assert_eq!(long.len(), 1, "{long:?}");
    assert_eq!(cycles, vec![vec!["a".to_string(), "b".to_string()]]);
}
