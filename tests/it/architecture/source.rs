//! Reading a crate's source as far as the architecture rules need: which modules exist
//! (following `mod` declarations from the crate root, inline `mod x { … }` blocks included,
//! `#[cfg(test)]` items left out), each module's production code with comments and literals
//! blanked, and what each `use` declaration binds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A module inside one crate: `[]` is the crate root, `["sidecar", "tasks"]` is
/// `crate::sidecar::tasks`.
pub type ModPath = Vec<String>;

/// What a `use` declaration binds in its module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UseItem {
    /// The path as written, from the first segment (`crate`, `super`, `self`, a name).
    pub path: Vec<String>,
    /// The name it binds (`*` for a glob).
    pub binding: String,
}

/// One crate's modules: production code per module and the file it came from.
pub struct CrateSource {
    pub code: BTreeMap<ModPath, String>,
    pub files: BTreeMap<ModPath, PathBuf>,
}

impl CrateSource {
    /// The crate whose root file is `root` (`src/lib.rs`, `src/main.rs`).
    pub fn load(root: &Path) -> CrateSource {
        let mut source = CrateSource {
            code: BTreeMap::new(),
            files: BTreeMap::new(),
        };
        let dir = root.parent().expect("a crate root in a directory");
        let text = read(root);
        source.add(Vec::new(), root, &text, dir);
        source
    }

    fn add(&mut self, path: ModPath, file: &Path, text: &str, child_dir: &Path) {
        let code = strip_cfg_test(&code_only(text));
        let (code, inline) = take_inline_modules(&code);
        for name in declared_modules(&code) {
            let flat = child_dir.join(format!("{name}.rs"));
            let nested = child_dir.join(&name).join("mod.rs");
            let (child_file, grandchild_dir) = if flat.is_file() {
                (flat, child_dir.join(&name))
            } else if nested.is_file() {
                (nested, child_dir.join(&name))
            } else {
                panic!(
                    "{}: `mod {name};` has neither {} nor {}",
                    file.display(),
                    flat.display(),
                    nested.display()
                )
            };
            let mut child = path.clone();
            child.push(name);
            let text = read(&child_file);
            self.add(child, &child_file, &text, &grandchild_dir);
        }
        for (name, block) in inline {
            let mut child = path.clone();
            child.push(name.clone());
            self.add(child, file, &block, &child_dir.join(&name));
        }
        self.files.insert(path.clone(), file.to_owned());
        self.code.insert(path, code);
    }

    pub fn is_module(&self, path: &[String]) -> bool {
        self.code.contains_key(path)
    }

    /// The longest prefix of `path` that is a module (at least the crate root).
    pub fn module_prefix<'a>(&self, path: &'a [String]) -> &'a [String] {
        (0..=path.len())
            .rev()
            .map(|n| &path[..n])
            .find(|p| self.is_module(p))
            .unwrap_or(&path[..0])
    }

    /// Whether `module` defines an item called `name` itself (not through a `use`).
    pub fn defines(&self, module: &[String], name: &str) -> bool {
        let Some(code) = self.code.get(module) else {
            return false;
        };
        [
            "fn ",
            "struct ",
            "enum ",
            "trait ",
            "type ",
            "const ",
            "static ",
            "union ",
            "macro_rules! ",
        ]
        .iter()
        .any(|keyword| {
            let needle = format!("{keyword}{name}");
            code.match_indices(&needle).any(|(at, _)| {
                let before = code[..at].bytes().next_back();
                let after = code.as_bytes().get(at + needle.len()).copied();
                !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
            })
        })
    }
}

fn read(file: &Path) -> String {
    std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

pub fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Source text with comments removed and string and character literals emptied, so prose and
/// literals naming paths are not read as code.
pub fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let prev_ident = i > 0 && is_ident(bytes[i - 1]);
        if rest.starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0usize;
            while i < bytes.len() {
                if bytes[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if bytes[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(b' ');
        } else if let Some(end) = (!prev_ident).then(|| raw_string_end(rest)).flatten() {
            i += end;
            out.extend_from_slice(b"\"\"");
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.extend_from_slice(b"\"\"");
        } else if bytes[i] == b'\'' && char_literal_len(rest).is_some() {
            i += char_literal_len(rest).unwrap_or(1);
            out.extend_from_slice(b"' '");
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The length of a raw string literal (`r"…"`, `r#"…"#`, `br##"…"##`) starting at `text[0]`.
fn raw_string_end(text: &[u8]) -> Option<usize> {
    let mut i = usize::from(text.first() == Some(&b'b'));
    if text.get(i) != Some(&b'r') {
        return None;
    }
    i += 1;
    let hashes = text[i..].iter().take_while(|&&b| b == b'#').count();
    i += hashes;
    if text.get(i) != Some(&b'"') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let body = &text[i + 1..];
    let at = body.windows(close.len()).position(|w| w == close)?;
    Some(i + 1 + at + close.len())
}

/// The length of a character literal (`'a'`, `'\n'`, `'\u{7f}'`) at `text[0]`; `None` for a
/// lifetime.
fn char_literal_len(text: &[u8]) -> Option<usize> {
    if text.get(1) == Some(&b'\\') {
        let close = text[2..].iter().position(|&b| b == b'\'')?;
        return Some(close + 3);
    }
    let ch = std::str::from_utf8(&text[1..text.len().min(5)])
        .or_else(|e| std::str::from_utf8(&text[1..1 + e.valid_up_to()]))
        .ok()?
        .chars()
        .next()?;
    let width = ch.len_utf8();
    (text.get(1 + width) == Some(&b'\'')).then_some(width + 2)
}

/// The end (exclusive) of the brace block opening at `code[open]`.
fn block_end(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, &b) in code.iter().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// The end (exclusive) of the item starting at `code[start]`: its `;` or its `{ … }` block,
/// whichever comes first outside brackets.
fn item_end(code: &[u8], start: usize) -> usize {
    let mut depth = 0usize;
    let mut i = start;
    while i < code.len() {
        match code[i] {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth = depth.saturating_sub(1),
            b';' if depth == 0 => return i + 1,
            b'{' if depth == 0 => return block_end(code, i),
            _ => {}
        }
        i += 1;
    }
    code.len()
}

fn skip_ws(code: &[u8], mut pos: usize) -> usize {
    while pos < code.len() && code[pos].is_ascii_whitespace() {
        pos += 1;
    }
    pos
}

/// `code` without `#[cfg(test)]` items (test modules, test-only functions and imports).
pub fn strip_cfg_test(code: &str) -> String {
    let mut code = code.to_owned();
    while let Some(at) = code.find("#[cfg(test)]") {
        let bytes = code.as_bytes();
        let mut pos = at + "#[cfg(test)]".len();
        loop {
            pos = skip_ws(bytes, pos);
            if bytes[pos..].starts_with(b"#[") {
                let close = bytes[pos..].iter().position(|&b| b == b']').unwrap_or(0);
                pos += close + 1;
            } else {
                break;
            }
        }
        let end = item_end(bytes, pos);
        code.replace_range(at..end, " ");
    }
    code
}

/// Inline modules (`mod name { … }`) taken out of `code`: the rest of the code, and each
/// module's name and body.
fn take_inline_modules(code: &str) -> (String, Vec<(String, String)>) {
    let mut rest = code.to_owned();
    let mut modules = Vec::new();
    let mut from = 0;
    while let Some(offset) = rest[from..].find("mod ") {
        let at = from + offset;
        from = at + 4;
        let bytes = rest.as_bytes();
        if at > 0 && is_ident(bytes[at - 1]) {
            continue;
        }
        let name_start = skip_ws(bytes, at + 4);
        let mut name_end = name_start;
        while name_end < bytes.len() && is_ident(bytes[name_end]) {
            name_end += 1;
        }
        let open = skip_ws(bytes, name_end);
        if name_end == name_start || bytes.get(open) != Some(&b'{') {
            continue;
        }
        let end = block_end(bytes, open);
        let name = rest[name_start..name_end].to_owned();
        let body = rest[open + 1..end - 1].to_owned();
        rest.replace_range(at..end, " ");
        modules.push((name, body));
        from = at;
    }
    (rest, modules)
}

/// The names of `mod name;` declarations in `code`.
fn declared_modules(code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    code.match_indices("mod ")
        .filter(|(at, _)| *at == 0 || !is_ident(bytes[at - 1]))
        .filter_map(|(at, _)| {
            let start = skip_ws(bytes, at + 4);
            let mut end = start;
            while end < bytes.len() && is_ident(bytes[end]) {
                end += 1;
            }
            let semi = skip_ws(bytes, end);
            (end > start && bytes.get(semi) == Some(&b';')).then(|| code[start..end].to_owned())
        })
        .collect()
}

/// Every `use` declaration of `code` (production code of one module), flattened.
pub fn use_items(code: &str) -> Vec<UseItem> {
    let bytes = code.as_bytes();
    let mut items = Vec::new();
    for (at, _) in code.match_indices("use ") {
        let boundary_before = at == 0 || !is_ident(bytes[at - 1]) && bytes[at - 1] != b':';
        if boundary_before {
            read_use_tree(bytes, at + 4, Vec::new(), &mut items);
        }
    }
    items
}

fn ident_at(code: &[u8], pos: usize) -> (String, usize) {
    let mut end = pos;
    while end < code.len() && is_ident(code[end]) {
        end += 1;
    }
    (String::from_utf8_lossy(&code[pos..end]).into_owned(), end)
}

/// Reads one use tree (`a::b::{c, d as e, f::*}`) at `pos` under `prefix`; returns where it ends.
fn read_use_tree(code: &[u8], pos: usize, prefix: Vec<String>, out: &mut Vec<UseItem>) -> usize {
    let mut path = prefix;
    let mut pos = skip_ws(code, pos);
    if code[pos..].starts_with(b"::") {
        pos += 2; // `use ::std::…`: an external crate
        path.push(String::new());
    }
    loop {
        pos = skip_ws(code, pos);
        match code.get(pos) {
            Some(b'{') => {
                pos += 1;
                loop {
                    pos = skip_ws(code, pos);
                    if code.get(pos) == Some(&b'}') {
                        return pos + 1;
                    }
                    pos = read_use_tree(code, pos, path.clone(), out);
                    pos = skip_ws(code, pos);
                    match code.get(pos) {
                        Some(b',') => pos += 1,
                        Some(b'}') => return pos + 1,
                        _ => return pos,
                    }
                }
            }
            Some(b'*') => {
                out.push(UseItem {
                    path,
                    binding: "*".into(),
                });
                return pos + 1;
            }
            _ => {}
        }
        let (segment, end) = ident_at(code, pos);
        if segment.is_empty() {
            return pos;
        }
        pos = end;
        path.push(segment);
        if code[pos..].starts_with(b"::") {
            pos += 2;
            continue;
        }
        let after = skip_ws(code, pos);
        let mut binding = path.last().cloned().unwrap_or_default();
        if code[after..].starts_with(b"as ") {
            let (alias, end) = ident_at(code, skip_ws(code, after + 3));
            binding = alias;
            pos = end;
        }
        if path.last().is_some_and(|s| s == "self") {
            path.pop();
            if binding == "self" {
                binding = path.last().cloned().unwrap_or_default();
            }
        }
        out.push(UseItem { path, binding });
        return pos;
    }
}

/// Every path that starts with `crate::`, `super::` or `self::` in `code`, as written
/// (`use` groups expanded).
pub fn anchored_paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for anchor in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(anchor) {
            if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                continue;
            }
            let mut items = Vec::new();
            read_use_tree(bytes, at, Vec::new(), &mut items);
            found.extend(items.into_iter().map(|item| item.path));
        }
    }
    found
}
