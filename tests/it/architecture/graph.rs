//! The import graph of one crate: every path a module names, resolved through `use`
//! declarations and re-exports (`pub use`, globs) to the module that defines it, and lifted
//! to the pair of sibling modules it connects. `sidecar::listen` naming
//! `sidecar::tasks::object_verdict` is an edge `listen → tasks` inside `sidecar`; `ledger::sqlite`
//! naming `ledger::TaskId`, which `ledger` re-exports from `ledger::types`, is an edge
//! `sqlite → types` inside `ledger`.

use std::collections::{BTreeMap, BTreeSet};

use super::source::{CrateSource, ModPath, anchored_paths, use_items};

/// What a `use` binds, resolved: a path inside the crate, or something outside it.
type Binding = Option<Vec<String>>;

/// One edge between sibling modules, with the import that makes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// The modules' common parent.
    pub parent: ModPath,
    pub from: String,
    pub to: String,
}

pub struct ImportGraph {
    /// Every edge, with one import that makes it (`sidecar::listen names sidecar::tasks::x`).
    pub edges: BTreeMap<Edge, String>,
}

struct Resolver<'a> {
    source: &'a CrateSource,
    /// Per module: the names its `use` declarations bind.
    bindings: BTreeMap<ModPath, BTreeMap<String, Binding>>,
    /// Per module: the modules it glob-imports (`use x::*`).
    globs: BTreeMap<ModPath, Vec<ModPath>>,
}

/// `path` as written in `module`, made absolute: `crate::`, `super::`, `self::`, a child
/// module's name or a name the module's own `use`s bind; `None` outside the crate.
fn absolute(
    source: &CrateSource,
    module: &ModPath,
    path: &[String],
    bound: &BTreeMap<String, Binding>,
) -> Binding {
    let (first, rest) = path.split_first()?;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module.clone(),
        "super" => {
            let mut base = module.clone();
            base.pop();
            let mut rest = rest;
            while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
                base.pop();
                rest = tail;
            }
            base.extend(rest.iter().cloned());
            return Some(base);
        }
        _ => {
            let mut child = module.clone();
            child.push(first.clone());
            if source.is_module(&child) {
                child
            } else {
                let mut target = bound.get(first).cloned().flatten()?;
                target.extend(rest.iter().cloned());
                return Some(target);
            }
        }
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

impl<'a> Resolver<'a> {
    fn new(source: &'a CrateSource) -> Self {
        let mut bindings = BTreeMap::new();
        let mut globs: BTreeMap<ModPath, Vec<ModPath>> = BTreeMap::new();
        for (module, code) in &source.code {
            let items = use_items(code);
            // Two passes: a `use` may start from a name another `use` of the module binds.
            let mut bound: BTreeMap<String, Binding> = BTreeMap::new();
            for _ in 0..2 {
                for item in &items {
                    let target = absolute(source, module, &item.path, &bound);
                    if item.binding == "*" {
                        continue;
                    }
                    bound.insert(item.binding.clone(), target);
                }
            }
            for item in items.iter().filter(|i| i.binding == "*") {
                if let Some(target) = absolute(source, module, &item.path, &bound)
                    && source.is_module(&target)
                {
                    globs.entry(module.clone()).or_default().push(target);
                }
            }
            bindings.insert(module.clone(), bound);
        }
        Resolver {
            source,
            bindings,
            globs,
        }
    }

    /// Follows re-exports until `path` names the module that defines its item.
    fn resolve(&self, mut path: Vec<String>) -> Vec<String> {
        'follow: for _ in 0..32 {
            let module = self.source.module_prefix(&path).to_vec();
            let Some(name) = path.get(module.len()).cloned() else {
                return path;
            };
            let rest = path[module.len() + 1..].to_vec();
            if let Some(binding) = self.bindings.get(&module).and_then(|b| b.get(&name)) {
                match binding {
                    Some(target) if *target != path[..module.len() + 1] => {
                        path = target.iter().cloned().chain(rest).collect();
                        continue 'follow;
                    }
                    _ => return path,
                }
            }
            if self.source.defines(&module, &name) {
                return path;
            }
            for glob in self.globs.get(&module).into_iter().flatten() {
                let mut candidate = glob.clone();
                candidate.push(name.clone());
                let found = self.source.is_module(&candidate)
                    || self.source.defines(glob, &name)
                    || self
                        .bindings
                        .get(glob)
                        .is_some_and(|b| b.contains_key(&name));
                if found {
                    path = candidate.into_iter().chain(rest).collect();
                    continue 'follow;
                }
            }
            return path;
        }
        path
    }
}

impl ImportGraph {
    pub fn of(source: &CrateSource) -> ImportGraph {
        let resolver = Resolver::new(source);
        let mut edges = BTreeMap::new();
        for (module, code) in &source.code {
            let bound = &resolver.bindings[module];
            let written = use_items(code)
                .into_iter()
                .filter(|item| item.binding != "*" || !item.path.is_empty())
                .map(|item| item.path)
                .chain(anchored_paths(code));
            for path in written {
                let Some(absolute) = absolute(source, module, &path, bound) else {
                    continue;
                };
                let resolved = resolver.resolve(absolute);
                let target = source.module_prefix(&resolved).to_vec();
                let common = module
                    .iter()
                    .zip(&target)
                    .take_while(|(a, b)| a == b)
                    .count();
                if common >= module.len() || common >= target.len() {
                    continue; // a module naming its ancestors or descendants
                }
                let edge = Edge {
                    parent: module[..common].to_vec(),
                    from: module[common].clone(),
                    to: target[common].clone(),
                };
                edges
                    .entry(edge)
                    .or_insert_with(|| format!("{} names {}", show(module), show(&resolved)));
            }
        }
        ImportGraph { edges }
    }

    /// The edges between the children of `parent`.
    pub fn among(&self, parent: &[String]) -> BTreeMap<(String, String), String> {
        self.edges
            .iter()
            .filter(|(e, _)| e.parent == parent)
            .map(|(e, why)| ((e.from.clone(), e.to.clone()), why.clone()))
            .collect()
    }

    /// Every parent module whose children import each other in a cycle, with the cycle.
    pub fn cycles(&self) -> Vec<String> {
        let parents: BTreeSet<&ModPath> = self.edges.keys().map(|e| &e.parent).collect();
        parents
            .into_iter()
            .filter_map(|parent| {
                let among = self.among(parent);
                find_cycle(&among.keys().cloned().collect()).map(|cycle| {
                    let why: Vec<String> = cycle
                        .windows(2)
                        .map(|w| among[&(w[0].clone(), w[1].clone())].clone())
                        .collect();
                    format!(
                        "in {}: {} ({})",
                        show(parent),
                        cycle.join(" → "),
                        why.join("; ")
                    )
                })
            })
            .collect()
    }
}

/// `crate::a::b` for `["a", "b"]`.
pub fn show(path: &[String]) -> String {
    std::iter::once("crate")
        .chain(path.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

pub fn find_cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
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
    graph
        .keys()
        .find_map(|node| visit(node, &graph, &mut Vec::new(), &mut done))
}
