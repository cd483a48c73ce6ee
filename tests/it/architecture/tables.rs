//! The documented structure the architecture test holds the code to, read from where people
//! read it: the "Who may import whom" table in `src/lib.rs`, the sidecar's layer table in
//! `src/sidecar/mod.rs`, and docs/design.md's sidecar table and operator listing.

use std::collections::{BTreeMap, BTreeSet};

/// The `//!` docs of a source file, without the comment prefix.
pub fn crate_docs(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .map(|l| l.trim_start().to_owned())
        .collect()
}

/// The backticked names of a table cell outside parentheses (those are the row's modules;
/// inside parentheses are descriptions, submodules and functions), with a trailing `/` and
/// `mod.rs` dropped.
pub fn named_outside_parentheses(cell: &str) -> Vec<String> {
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

/// The body rows of the Markdown table whose header row is `header`, split into cells.
pub fn table_rows(lines: &[String], header: &str, source: &str) -> Vec<Vec<String>> {
    let start = lines
        .iter()
        .position(|l| l.trim() == header)
        .unwrap_or_else(|| panic!("no table `{header}` in {source}"));
    lines[start + 2..]
        .iter()
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(|row| {
            let row = row.trim().trim_start_matches('|').trim_end_matches('|');
            row.split('|').map(|c| c.trim().to_owned()).collect()
        })
        .collect()
}

/// The modules column (the second) of the table whose header row is `header`.
pub fn table_modules(lines: &[String], header: &str, source: &str) -> Vec<String> {
    table_rows(lines, header, source)
        .iter()
        .flat_map(|cells| named_outside_parentheses(cells.get(1).map_or("", String::as_str)))
        .collect()
}

/// `src/lib.rs`'s "Who may import whom": each top-level module and the top-level modules it
/// may import. A row names its modules in the first cell and what they may import in the
/// second ("nothing of the crate" names none).
pub fn allowed_imports(lib_rs: &str) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let docs = crate_docs(lib_rs);
    let mut table = BTreeMap::new();
    for cells in table_rows(&docs, "| module | may import |", "src/lib.rs") {
        let [modules, allowed] = &cells[..] else {
            return Err(format!(
                "src/lib.rs: a row of two cells expected: {cells:?}"
            ));
        };
        let allowed: BTreeSet<String> = named_outside_parentheses(allowed).into_iter().collect();
        for module in named_outside_parentheses(modules) {
            if table.insert(module.clone(), allowed.clone()).is_some() {
                return Err(format!("src/lib.rs: `{module}` has two rows"));
            }
        }
    }
    Ok(table)
}

/// The sidecar's layers, top (entry) first, each with its modules.
pub struct Layers(pub Vec<(String, Vec<String>)>);

impl Layers {
    pub fn parse(docs: &[String], header: &str, source: &str) -> Layers {
        Layers(
            table_rows(docs, header, source)
                .into_iter()
                .map(|cells| {
                    let name = cells.first().cloned().unwrap_or_default();
                    let modules =
                        named_outside_parentheses(cells.get(1).map_or("", String::as_str));
                    (name, modules)
                })
                .collect(),
        )
    }

    /// The layer (index from the top, name) of `module`.
    pub fn of(&self, module: &str) -> Option<(usize, &str)> {
        self.0
            .iter()
            .enumerate()
            .find(|(_, (_, modules))| modules.iter().any(|m| m == module))
            .map(|(i, (name, _))| (i, name.as_str()))
    }
}

/// `documented` against `actual`: what the docs omit and what they name that does not exist.
pub fn compare_listing(
    what: &str,
    documented: &[String],
    actual: &BTreeSet<String>,
) -> Vec<String> {
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

/// The operator's listing in docs/design.md ("Inside the operator": one file or directory per
/// line, `a.rs, b.rs` sharing a line, the description after two spaces).
pub fn operator_listing(design: &str) -> Vec<String> {
    let section = &design[design
        .find("### Inside the operator")
        .expect("an operator section in docs/design.md")..];
    let block = section
        .split("```")
        .nth(1)
        .expect("a code block in the operator section");
    block
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.trim().is_empty())
        .flat_map(|l| {
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
        .collect()
}
