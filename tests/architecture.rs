//! The crate's module structure, checked: no import cycle between sibling modules anywhere in
//! the library, and top-level modules import only what the table in `src/lib.rs` allows.
//!
//! Imports are read from the source text (`crate::…`, `super::…`, `self::…` paths, including
//! `use` groups), resolved to modules, and lifted to the pair of sibling modules they connect:
//! `sidecar::tasks::get` naming `sidecar::error::Error` is an edge `tasks → error` inside
//! `sidecar`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

/// Which top-level modules each top-level module may import. Keep in step with `src/lib.rs`.
const ALLOWED: &[(&str, &[&str])] = &[
    ("model", &[]),
    ("api", &[]),
    ("telemetry", &[]),
    ("runtime", &[]),
    ("policy", &["api"]),
    ("ledger", &["model"]),
    ("identity", &["model", "policy", "api"]),
    ("audit", &["model", "policy", "api"]),
    ("mcp", &["model", "policy", "api"]),
    ("distribution", &["policy", "api"]),
    (
        "operator",
        &[
            "model",
            "api",
            "policy",
            "identity",
            "exception",
            "distribution",
            "telemetry",
            "runtime",
        ],
    ),
    (
        "webhook",
        &[
            "model",
            "api",
            "policy",
            "identity",
            "exception",
            "telemetry",
            "runtime",
        ],
    ),
    (
        "exception",
        &["model", "api", "policy", "identity", "audit", "mcp"],
    ),
    (
        "sidecar",
        &[
            "model",
            "api",
            "policy",
            "identity",
            "audit",
            "mcp",
            "ledger",
            "exception",
            "distribution",
            "telemetry",
            "runtime",
        ],
    ),
];

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The library module a file defines (`None` for the binary's files).
fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "main.rs" || p == "cli") {
        return None;
    }
    let last = parts.pop()?;
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        name => parts.push(name.trim_end_matches(".rs").to_owned()),
    }
    Some(parts)
}

/// Source text without comments and string literals (so prose naming paths is ignored).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Reads `a::b::{c, d::e}` at `pos`: every full path it names.
fn read_paths(
    code: &[u8],
    mut pos: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix;
    loop {
        while pos < code.len() && code[pos].is_ascii_whitespace() {
            pos += 1;
        }
        if pos < code.len() && code[pos] == b'{' {
            pos += 1;
            loop {
                pos = read_paths(code, pos, path.clone(), out);
                while pos < code.len() && code[pos].is_ascii_whitespace() {
                    pos += 1;
                }
                match code.get(pos) {
                    Some(b',') => pos += 1,
                    Some(b'}') => return pos + 1,
                    _ => return pos,
                }
                while pos < code.len() && code[pos].is_ascii_whitespace() {
                    pos += 1;
                }
                if code.get(pos) == Some(&b'}') {
                    return pos + 1;
                }
            }
        }
        let start = pos;
        while pos < code.len() && is_ident(code[pos]) {
            pos += 1;
        }
        if start == pos {
            out.push(path);
            return pos;
        }
        path.push(String::from_utf8_lossy(&code[start..pos]).into_owned());
        if code[pos..].starts_with(b"::") {
            pos += 2;
        } else {
            out.push(path);
            return pos;
        }
    }
}

/// Every module path a file refers to, resolved from `module`.
fn references(module: &ModPath, code: &str) -> Vec<ModPath> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(offset) = code[from..].find(start) {
            let at = from + offset;
            from = at + start.len();
            if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                continue;
            }
            let mut base: ModPath = match start {
                "crate::" => vec![],
                _ => module.clone(),
            };
            let mut pos = at + start.len();
            if start == "super::" {
                base.pop();
                while code[pos..].starts_with("super::") {
                    base.pop();
                    pos += "super::".len();
                }
            }
            let mut paths = Vec::new();
            read_paths(bytes, pos, base, &mut paths);
            found.extend(paths);
        }
    }
    found
}

/// Edges between sibling modules: parent → (from child, to child).
fn sibling_edges(src: &Path) -> BTreeMap<ModPath, BTreeSet<(String, String)>> {
    let mut files = Vec::new();
    source_files(src, &mut files);
    let modules: Vec<(ModPath, String)> = files
        .iter()
        .filter_map(|f| {
            let m = module_of(src, f)?;
            let text = std::fs::read_to_string(f).expect("read source");
            // Unit tests may reach across layers; only production code counts.
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(i) => text[..i].to_owned(),
                None => text,
            };
            Some((m, code_only(&text)))
        })
        .collect();
    let known: BTreeSet<ModPath> = modules.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<ModPath, BTreeSet<(String, String)>> = BTreeMap::new();
    for (module, code) in &modules {
        for target in references(module, code) {
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= module.len() || common >= target.len() {
                continue; // a module naming its ancestors or descendants
            }
            let parent = module[..common].to_vec();
            let mut child_target = parent.clone();
            child_target.push(target[common].clone());
            if !known.contains(&child_target) {
                continue; // an item of the parent, not a sibling module
            }
            edges
                .entry(parent)
                .or_default()
                .insert((module[common].clone(), target[common].clone()));
        }
    }
    edges
}

fn find_cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        graph.entry(a).or_default().push(b);
    }
    fn visit<'a>(
        node: &'a str,
        graph: &BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = stack[i..].iter().map(|s| s.to_string()).collect();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, &graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_module_imports_in_a_cycle() {
    let edges = sibling_edges(&src());
    assert!(
        edges.contains_key(&vec!["sidecar".to_owned()]),
        "the import reader found no edges inside the sidecar: {edges:?}"
    );
    let cycles: Vec<String> = edges
        .iter()
        .filter_map(|(parent, e)| {
            find_cycle(e).map(|c| format!("in crate::{}: {}", parent.join("::"), c.join(" → ")))
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn top_level_modules_import_only_what_lib_rs_allows() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let edges = sibling_edges(&src());
    let top = edges.get(&Vec::new()).cloned().unwrap_or_default();
    let mut violations = Vec::new();
    for (from, to) in &top {
        match allowed.get(from.as_str()) {
            Some(list) if list.contains(&to.as_str()) => {}
            Some(_) => violations.push(format!("{from} imports {to}")),
            None => violations.push(format!("{from} is not in the table (imports {to})")),
        }
    }
    assert!(
        violations.is_empty(),
        "update the code or the table in src/lib.rs and tests/architecture.rs:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_reader_resolves_groups_and_relative_paths() {
    let module: ModPath = vec!["sidecar".into(), "tasks".into(), "get".into()];
    let code = "use super::super::{error::Error, decisions::{plan_read, task_view}};\nuse crate::ledger::TaskId;\nlet x = self::helper();";
    let refs = references(&module, code);
    let has = |p: &[&str]| {
        refs.iter()
            .any(|r| r == &p.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    };
    assert!(has(&["sidecar", "error", "Error"]), "{refs:?}");
    assert!(has(&["sidecar", "decisions", "task_view"]), "{refs:?}");
    assert!(has(&["ledger", "TaskId"]), "{refs:?}");
    assert!(has(&["sidecar", "tasks", "get", "helper"]), "{refs:?}");
    let cyclic: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert!(find_cycle(&cyclic).is_some());
    let acyclic: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("a", "c")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert!(find_cycle(&acyclic).is_none());
}

/// The modules of `dir` as the docs name them: `*.rs` files (not `mod.rs`, not test-only
/// `*_tests.rs`) and directories (not `*_tests`).
fn modules_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("read module directory")
        .map(|e| e.expect("dir entry").path())
        .filter_map(|path| {
            let name = path.file_name()?.to_string_lossy().into_owned();
            let module = if path.is_dir() {
                name
            } else {
                name.strip_suffix(".rs")?.to_owned()
            };
            (module != "mod" && !module.ends_with("_tests")).then_some(module)
        })
        .collect()
}

/// The backticked names of a table cell outside parentheses (those are the row's modules;
/// inside parentheses are descriptions, submodules and functions), with a trailing `/` and
/// `mod.rs` dropped.
fn named_outside_parentheses(cell: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut chars = cell.chars();
    while let Some(c) = chars.next() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            '`' => {
                let name: String = chars.by_ref().take_while(|&c| c != '`').collect();
                let name = name.trim_end_matches('/').to_owned();
                if depth == 0 && name != "mod.rs" {
                    names.push(name);
                }
            }
            _ => {}
        }
    }
    names
}

/// The modules column (the second) of the Markdown table whose header row is `header`, from
/// `lines` (already stripped of any comment prefix).
fn table_modules(lines: &[String], header: &str, source: &str) -> Vec<String> {
    let start = lines
        .iter()
        .position(|l| l.trim() == header)
        .unwrap_or_else(|| panic!("no table `{header}` in {source}"));
    lines[start + 2..]
        .iter()
        .take_while(|l| l.trim_start().starts_with('|'))
        .flat_map(|row| {
            let cells: Vec<&str> = row.split('|').collect();
            named_outside_parentheses(cells.get(2).copied().unwrap_or_default())
        })
        .collect()
}

/// `documented` against `actual`: what the docs omit and what they name that does not exist.
fn compare_listing(what: &str, documented: &[String], actual: &BTreeSet<String>) -> Vec<String> {
    let named: BTreeSet<String> = documented.iter().cloned().collect();
    let mut problems: Vec<String> = actual
        .difference(&named)
        .map(|m| format!("{what}: module `{m}` is missing"))
        .collect();
    problems.extend(
        named
            .difference(actual)
            .map(|m| format!("{what}: names `{m}`, which is no module")),
    );
    problems
}

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The sidecar's layer tables (docs/design.md, "Inside the sidecar", and the crate docs of
/// `src/sidecar/mod.rs`) name every module of `src/sidecar/`, and only those.
#[test]
fn the_sidecar_layer_tables_name_every_module_and_only_modules() {
    let actual = modules_in(&src().join("sidecar"));
    assert!(
        actual.contains("pipeline") && actual.contains("decisions"),
        "{actual:?}"
    );
    let design: Vec<String> = repo_file("docs/design.md")
        .lines()
        .map(str::to_owned)
        .collect();
    let crate_docs: Vec<String> = repo_file("src/sidecar/mod.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.trim_start().to_owned())
        .collect();
    let mut problems = compare_listing(
        "docs/design.md's sidecar layer table",
        &table_modules(
            &design,
            "| layer | modules | what they do |",
            "docs/design.md",
        ),
        &actual,
    );
    problems.extend(compare_listing(
        "src/sidecar/mod.rs's layer table",
        &table_modules(&crate_docs, "| layer | modules |", "src/sidecar/mod.rs"),
        &actual,
    ));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The operator's listing in docs/design.md ("Inside the operator": one file or directory per
/// line, `a.rs, b.rs` sharing a line) names every module of `src/operator/`, and only those.
#[test]
fn the_operator_listing_names_every_module_and_only_modules() {
    let design = repo_file("docs/design.md");
    let section = &design[design
        .find("### Inside the operator")
        .expect("an operator section")..];
    let block = section
        .split("```")
        .nth(1)
        .expect("a code block in the operator section");
    let named: Vec<String> = block
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.trim().is_empty())
        .flat_map(|l| {
            // The names column ends where the description starts (two or more spaces).
            let names = l.split("  ").next().unwrap_or_default();
            names
                .split(',')
                .map(|n| {
                    n.trim()
                        .trim_end_matches('/')
                        .trim_end_matches(".rs")
                        .to_owned()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let problems = compare_listing(
        "docs/design.md's operator listing",
        &named,
        &modules_in(&src().join("operator")),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_table_reader_takes_only_names_outside_parentheses() {
    assert_eq!(
        named_outside_parentheses(
            " `mod.rs` (`run`), `tasks/` (`create`, `get`), `upstream` + `x` (with `y` (`z`)) "
        ),
        ["tasks", "upstream", "x"]
    );
}
