//! The crate's module structure, checked over the whole crate (the library from `src/lib.rs`
//! and the binary from `src/main.rs`, `src/cli/` included):
//! - no sibling modules anywhere import each other in a cycle;
//! - top-level library modules import only what the table in `src/lib.rs` allows, and every
//!   permission the table gives is used;
//! - the sidecar's modules import only from layers below their own (the table in
//!   `src/sidecar/mod.rs`);
//! - the layer tables and the operator listing name every module and only modules.
//!
//! Imports are read from the source text (`crate::`, `super::`, `self::` paths and every
//! `use`), resolved through re-exports to the module that defines the item
//! ([`graph`]), and lifted to the pair of sibling modules they connect. Each rule is also run on
//! a copy of `src/` with a violation planted, so a reader that stopped seeing imports fails here.

mod graph;
mod source;
mod tables;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use graph::{ImportGraph, show};
use source::{CrateSource, ModPath, anchored_paths, use_items};
use tables::{Layers, compare_listing, crate_docs};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The library and the binary, read from `src`.
fn crates(src: &Path) -> [(&'static str, CrateSource); 2] {
    [
        ("the library", CrateSource::load(&src.join("lib.rs"))),
        ("the binary", CrateSource::load(&src.join("main.rs"))),
    ]
}

fn children(source: &CrateSource, parent: &[String]) -> BTreeSet<String> {
    source
        .code
        .keys()
        .filter(|m| m.len() == parent.len() + 1 && m.starts_with(parent))
        .map(|m| m[parent.len()].clone())
        .collect()
}

fn cycle_violations(src: &Path) -> Vec<String> {
    crates(src)
        .iter()
        .flat_map(|(name, source)| {
            ImportGraph::of(source)
                .cycles()
                .into_iter()
                .map(move |c| format!("{name}: {c}"))
        })
        .collect()
}

/// Top-level library imports against `src/lib.rs`'s table: edges it does not allow,
/// permissions nothing uses, and modules it omits or names wrongly.
fn lib_table_violations(src: &Path) -> Vec<String> {
    let table =
        tables::allowed_imports(&read(&src.join("lib.rs"))).unwrap_or_else(|e| panic!("{e}"));
    let library = CrateSource::load(&src.join("lib.rs"));
    let top = ImportGraph::of(&library).among(&[]);
    let mut problems = compare_listing(
        "src/lib.rs's import table",
        &table.keys().cloned().collect::<Vec<_>>(),
        &children(&library, &[]),
    );
    for ((from, to), why) in &top {
        match table.get(from) {
            Some(allowed) if allowed.contains(to) => {}
            Some(_) => problems.push(format!("`{from}` may not import `{to}` ({why})")),
            None => {}
        }
    }
    for (from, allowed) in &table {
        for to in allowed {
            if !top.contains_key(&(from.clone(), to.clone())) {
                problems.push(format!(
                    "`{from}` may import `{to}` but does not: drop the permission"
                ));
            }
        }
    }
    problems
}

fn sidecar_layers(src: &Path) -> Layers {
    Layers::parse(
        &crate_docs(&read(&src.join("sidecar/mod.rs"))),
        "| layer | modules |",
        "src/sidecar/mod.rs",
    )
}

/// Sidecar imports against its layer table: each goes to a lower layer.
fn layer_violations(src: &Path) -> Vec<String> {
    let layers = sidecar_layers(src);
    let library = CrateSource::load(&src.join("lib.rs"));
    let sidecar = ImportGraph::of(&library).among(&["sidecar".to_owned()]);
    let mut problems = Vec::new();
    for ((from, to), why) in &sidecar {
        let (Some((from_layer, from_name)), Some((to_layer, to_name))) =
            (layers.of(from), layers.of(to))
        else {
            continue; // the listing test names what is missing
        };
        if to_layer <= from_layer {
            problems.push(format!(
                "`{from}` ({from_name}) imports `{to}` ({to_name}), not a lower layer ({why})"
            ));
        }
    }
    problems
}

#[test]
fn no_sibling_modules_import_each_other_in_a_cycle() {
    let cycles = cycle_violations(&src());
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn top_level_modules_import_exactly_what_lib_rs_allows() {
    let problems = lib_table_violations(&src());
    assert!(
        problems.is_empty(),
        "update the code or the table in src/lib.rs:\n{}",
        problems.join("\n")
    );
}

#[test]
fn sidecar_modules_import_only_from_lower_layers() {
    let problems = layer_violations(&src());
    assert!(
        problems.is_empty(),
        "update the code or the layer table in src/sidecar/mod.rs:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_reader_sees_the_whole_crate() {
    let [(_, library), (_, binary)] = crates(&src());
    for module in [
        vec!["sidecar", "tasks", "create"],
        vec!["ledger", "sqlite"],
        vec!["mcp", "methods"], // an inline module
    ] {
        let module: ModPath = module.into_iter().map(String::from).collect();
        assert!(library.is_module(&module), "{} not read", show(&module));
    }
    assert!(binary.is_module(&["cli".to_owned(), "revoke".to_owned()]));
    // Test-only modules are not production code.
    assert!(!library.is_module(&["operator".to_owned(), "contract_tests".to_owned()]));
    let graph = ImportGraph::of(&library);
    let sidecar = graph.among(&["sidecar".to_owned()]);
    assert!(sidecar.len() > 50, "{sidecar:?}");
    // An import through a re-export lands on the defining module: `ledger::LedgerError` is
    // `ledger::error::LedgerError`.
    let ledger = graph.among(&["ledger".to_owned()]);
    assert!(
        ledger
            .get(&("sqlite".to_owned(), "error".to_owned()))
            .is_some_and(|why| why.ends_with("crate::ledger::error::LedgerError")),
        "{ledger:?}"
    );
}

#[test]
fn the_reader_resolves_groups_aliases_and_relative_paths() {
    let code = "use super::super::{error::Error, decisions::{plan_read, task_view as view}};\n\
        use crate::ledger::TaskId;\nlet x = self::helper(); let s = \"crate::not::code\";\n\
        // crate::nor::this\nuse std::sync::{Arc, self};";
    let items = use_items(source::code_only(code).as_str());
    let bindings: Vec<(&str, String)> = items
        .iter()
        .map(|i| (i.binding.as_str(), i.path.join("::")))
        .collect();
    assert!(bindings.contains(&("view", "super::super::decisions::task_view".into())));
    assert!(bindings.contains(&("Error", "super::super::error::Error".into())));
    assert!(bindings.contains(&("sync", "std::sync".into())));
    let paths: Vec<String> = anchored_paths(&source::code_only(code))
        .iter()
        .map(|p| p.join("::"))
        .collect();
    assert!(paths.contains(&"self::helper".to_owned()), "{paths:?}");
    assert!(
        !paths.iter().any(|p| p.contains("not") || p.contains("nor")),
        "{paths:?}"
    );
    let cyclic: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert!(graph::find_cycle(&cyclic).is_some());
    let acyclic: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("a", "c")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert!(graph::find_cycle(&acyclic).is_none());
}

/// A copy of `src/` with `code` appended to `file`, removed on drop.
struct Planted(PathBuf);

impl Planted {
    fn new(file: &str, code: &str) -> Planted {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("lifeguard-architecture-{}-{n}", std::process::id()));
        copy_tree(&src(), &dir);
        let target = dir.join(file);
        let text = read(&target);
        std::fs::write(&target, format!("{text}\n{code}\n")).expect("plant");
        Planted(dir)
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create copy");
    for entry in std::fs::read_dir(from).expect("read src") {
        let path = entry.expect("dir entry").path();
        let dest = to.join(path.file_name().expect("a name"));
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).expect("copy source");
        }
    }
}

#[test]
fn a_cycle_in_the_cli_is_caught() {
    assert!(cycle_violations(&src()).is_empty());
    let planted = Planted::new("cli/present.rs", "use super::revoke::RevokeArgs;");
    let found = cycle_violations(&planted.0);
    assert!(
        found
            .iter()
            .any(|c| c.starts_with("the binary: in crate::cli:")
                && c.contains("present")
                && c.contains("revoke")),
        "{found:?}"
    );
}

#[test]
fn an_import_through_a_re_export_is_caught() {
    // `ledger::error` naming `ledger::SqliteLedger` (re-exported from `ledger::sqlite`, which
    // imports `ledger::error`) closes a cycle only the resolved path shows.
    assert!(cycle_violations(&src()).is_empty());
    let planted = Planted::new("ledger/error.rs", "fn planted(_: super::SqliteLedger) {}");
    let found = cycle_violations(&planted.0);
    assert!(
        found
            .iter()
            .any(|c| c.contains("in crate::ledger:") && c.contains("error")),
        "{found:?}"
    );
    // And across the top level: `policy` naming `crate::operator::run` (re-exported).
    let planted = Planted::new(
        "policy/mod.rs",
        "fn planted() { let _ = crate::operator::run; }",
    );
    let found = lib_table_violations(&planted.0);
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("`policy` may not import `operator`")),
        "{found:?}"
    );
}

#[test]
fn a_layer_order_breach_is_caught() {
    assert!(layer_violations(&src()).is_empty());
    let planted = Planted::new("sidecar/decisions/mod.rs", "use super::tasks::get;");
    let found = layer_violations(&planted.0);
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("`decisions` (leaves) imports `tasks` (handlers)")),
        "{found:?}"
    );
}

#[test]
fn an_unused_permission_is_caught() {
    let lib = read(&src().join("lib.rs"));
    let widened = lib.replace(
        "| `policy` (pure compiler) | `api` |",
        "| `policy` (pure compiler) | `api`, `model` |",
    );
    assert_ne!(
        lib, widened,
        "the policy row of src/lib.rs changed: update this test"
    );
    let planted = Planted::new("lib.rs", "");
    std::fs::write(planted.0.join("lib.rs"), widened).expect("rewrite lib.rs");
    let found = lib_table_violations(&planted.0);
    assert!(
        found.contains(&"`policy` may import `model` but does not: drop the permission".to_owned()),
        "{found:?}"
    );
}

/// The sidecar's layer tables (docs/design.md, "Inside the sidecar", and the crate docs of
/// `src/sidecar/mod.rs`) name every module of the sidecar, and only those.
#[test]
fn the_sidecar_layer_tables_name_every_module_and_only_modules() {
    let library = CrateSource::load(&src().join("lib.rs"));
    let actual = children(&library, &["sidecar".to_owned()]);
    assert!(
        actual.contains("pipeline") && actual.contains("decisions"),
        "{actual:?}"
    );
    let design: Vec<String> = read(&src().join("../docs/design.md"))
        .lines()
        .map(str::to_owned)
        .collect();
    let crate_docs = crate_docs(&read(&src().join("sidecar/mod.rs")));
    let mut problems = compare_listing(
        "docs/design.md's sidecar layer table",
        &tables::table_modules(
            &design,
            "| layer | modules | what they do |",
            "docs/design.md",
        ),
        &actual,
    );
    problems.extend(compare_listing(
        "src/sidecar/mod.rs's layer table",
        &tables::table_modules(&crate_docs, "| layer | modules |", "src/sidecar/mod.rs"),
        &actual,
    ));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The operator's listing in docs/design.md names every module of the operator, and only those.
#[test]
fn the_operator_listing_names_every_module_and_only_modules() {
    let library = CrateSource::load(&src().join("lib.rs"));
    let problems = compare_listing(
        "docs/design.md's operator listing",
        &tables::operator_listing(&read(&src().join("../docs/design.md"))),
        &children(&library, &["operator".to_owned()]),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_table_reader_takes_names_outside_parentheses() {
    assert_eq!(
        tables::named_outside_parentheses(
            " `mod.rs` (`run`), `tasks/` (`create`, `get`), `upstream` + `x` (with `y` (`z`)) "
        ),
        ["tasks", "upstream", "x"]
    );
    let docs: Vec<String> = [
        "| layer | modules |",
        "|---|---|",
        "| top | `a`, `b` (uses `c`) |",
        "| bottom | `c` |",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let layers = Layers::parse(&docs, "| layer | modules |", "test");
    assert_eq!(layers.of("b"), Some((0, "top")));
    assert_eq!(layers.of("c"), Some((1, "bottom")));
}

/// Every integration test is a module of the one test binary, `tests/it/main.rs`: a `*.rs`
/// file (or a `*/main.rs`) directly under `tests/` would be a binary of its own that links the
/// whole crate again, and a file in `tests/it/` that `main.rs` does not declare is never built.
#[test]
fn integration_tests_are_modules_of_one_binary() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&tests).expect("read tests/") {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        if path.extension().is_some_and(|e| e == "rs")
            || path.join("main.rs").is_file() && name != "it"
        {
            problems.push(format!(
                "tests/{name} is a test binary of its own: move it into tests/it/"
            ));
        }
    }
    let main = read(&tests.join("it/main.rs"));
    for entry in std::fs::read_dir(tests.join("it")).expect("read tests/it/") {
        let path = entry.expect("dir entry").path();
        let Some(module) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".rs"))
        else {
            continue;
        };
        if module != "main" && !main.lines().any(|l| l == format!("mod {module};")) {
            problems.push(format!(
                "tests/it/{module}.rs is not declared in tests/it/main.rs: it never runs"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
