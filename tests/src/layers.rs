//! A crate's layers, held against its code: a module of `src/` never names (`crate::…`) a
//! module of a layer above its own, and the top-level modules form no circle. Each crate's
//! table lives in `tests/tests/layers.rs`. Test code (files `tests.rs` / `*_tests.rs`, and each
//! item under `#[cfg(test)]`) may reach anywhere and is not scanned.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One crate's layers, top first: a module may use its own layer and those below it.
pub struct Table {
    /// Where the table lives, for the messages (`tests/tests/layers.rs: AGENT`).
    pub name: &'static str,
    pub layers: &'static [(&'static str, &'static [&'static str])],
    /// Names used as `crate::NAME` that are not modules (`#[macro_export]` macros, items of the
    /// crate's root or re-exported there), and the module each comes from (`lib`: the root).
    pub aliases: &'static [(&'static str, &'static str)],
}

impl Table {
    /// The layer of a top-level module (0 = top), or `None` when the table does not place it.
    pub fn layer_of(&self, module: &str) -> Option<usize> {
        self.layers
            .iter()
            .position(|(_, modules)| modules.contains(&module))
    }

    /// The top-level module a path names: `crate::backend::sim::X` → `backend`, an alias → the
    /// module defining it.
    fn target_module<'a>(&self, name: &'a str) -> &'a str {
        self.aliases
            .iter()
            .find(|(alias, _)| *alias == name)
            .map_or(name, |(_, module)| module)
    }

    /// Every upward use in one file of module `module`, in words.
    pub fn violations(&self, module: &str, source: &str) -> Vec<String> {
        let Some(own) = self.layer_of(module) else {
            return vec![format!(
                "module `{module}` is in no layer: add it to {}",
                self.name
            )];
        };
        let mut found = Vec::new();
        for used in crate_modules(source) {
            let target = self.target_module(&used);
            if target == module {
                continue;
            }
            let Some(theirs) = self.layer_of(target) else {
                found.push(format!(
                    "`{module}` uses `crate::{used}`, which is in no layer: add it to {}",
                    self.name
                ));
                continue;
            };
            if theirs < own {
                found.push(format!(
                    "`{module}` ({}) uses `crate::{used}` ({}), a layer above it: move what it \
                     needs down, or pass it in",
                    self.layers[own].0, self.layers[theirs].0
                ));
            }
        }
        found
    }

    /// The circles among the crate's top-level modules (each as its modules, sorted; none when
    /// the imports point one way), each name read through the aliases.
    pub fn circles(&self, src: &Path) -> Vec<Vec<String>> {
        let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (_, module, source) in production_files(src) {
            let used: BTreeSet<String> = crate_modules(&source)
                .iter()
                .map(|m| self.target_module(m).to_string())
                .filter(|m| *m != module)
                .collect();
            uses.entry(module).or_default().extend(used);
        }
        circles_of(&uses)
    }

    /// The layer violations of the crate whose sources are under `src`, each with its file.
    pub fn check(&self, src: &Path) -> Vec<String> {
        let mut problems = Vec::new();
        for (relative, module, source) in production_files(src) {
            for problem in self.violations(&module, &source) {
                problems.push(format!("{}: {problem}", relative.display()));
            }
        }
        problems
    }
}

/// The strongly connected groups of more than one module in `uses` (Tarjan's algorithm).
pub fn circles_of(uses: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        uses: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in self.uses.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    self.low.entry(v).and_modify(|l| *l = (*l).min(lw));
                } else if self.stack.contains(&w) {
                    let iw = self.index[w];
                    self.low.entry(v).and_modify(|l| *l = (*l).min(iw));
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    group.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        uses,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in uses.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// Each production file under `src` with its top-level module and source (`lib.rs` and test
/// files left out).
fn production_files(src: &Path) -> Vec<(PathBuf, String, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    assert!(
        files.len() > 1,
        "found no module files under {}",
        src.display()
    );
    files
        .into_iter()
        .filter(|p| !is_test_file(p))
        .filter_map(|path| {
            let relative = path.strip_prefix(src).ok()?.to_path_buf();
            let module = module_of(&relative)?;
            let source = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            Some((relative, module, source))
        })
        .collect()
}

/// The production part of a source file: comments dropped, and each item under `#[cfg(test)]`
/// left out (a `use` line, or a block such as `mod tests { … }` up to its closing brace).
pub fn production_code(source: &str) -> String {
    let mut kept = String::new();
    let mut skipping = false;
    let mut depth = 0i64;
    let mut opened = false;
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        if code.trim_start().starts_with("#[cfg(test)]") {
            (skipping, depth, opened) = (true, 0, false);
            continue;
        }
        if skipping {
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            opened |= code.contains('{');
            let attribute = code.trim_start().starts_with("#[");
            let ended = if opened {
                depth <= 0
            } else {
                code.trim_end().ends_with(';')
            };
            if ended && !attribute {
                skipping = false;
            }
            continue;
        }
        kept.push_str(code);
        kept.push('\n');
    }
    kept
}

/// The top-level modules a source names through `crate::`: `crate::a::b`, `crate::a!` and
/// every first name of a group `crate::{a, b::{c}, d}`.
pub fn crate_modules(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let code = production_code(source);
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `gpuval_crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            found.extend(group_heads(group));
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name.to_string());
            }
        }
    }
    found
}

/// The first names of each entry of a `{…}` group, up to its closing brace.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut expect_head = true;
    let mut chars = group.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => expect_head = true,
            c if expect_head && depth == 0 && (c.is_alphanumeric() || c == '_') => {
                let name = ident(&group[i..]);
                if name != "self" {
                    heads.push(name.to_string());
                }
                expect_head = false;
                for _ in 1..name.chars().count() {
                    chars.next();
                }
            }
            _ => {}
        }
    }
    heads
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level module a file of `src` belongs to (`main` for the binary's root), or `None`
/// for `lib.rs`.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let module = first.strip_suffix(".rs").unwrap_or(first);
    (module != "lib").then(|| module.to_string())
}

/// A file of tests only (`tests.rs`, `*_tests.rs`).
pub fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// Every `.rs` file under `dir`, into `into`.
pub fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The glob imports (`use x::*;`, `pub use x::*;`) in production source `source`.
pub fn glob_imports(source: &str) -> Vec<String> {
    production_code(source)
        .lines()
        .map(str::trim)
        .filter(|l| (l.starts_with("use ") || l.starts_with("pub use ")) && l.ends_with("::*;"))
        .map(str::to_string)
        .collect()
}

/// A crate whose tree is its table: each top-level folder (or single file) of `src/` is one
/// layer, named here top first, and the modules of a layer are the folder's entries. Nothing
/// of the tree may be missing from the list, nor the list name what the tree lacks; no module
/// names a layer above its own; and the modules (`layer::module`) form no circle.
pub struct Tree {
    /// Where the list lives, for the messages (`tests/tests/layers.rs: OPERATOR`).
    pub name: &'static str,
    /// The layers, top first: `main` (the binary's root), then folders or files of `src/`.
    pub layers: &'static [&'static str],
}

impl Tree {
    /// The same layers as a [`Table`] whose every layer is one top-level module, so that the
    /// upward check reads a folder as one module.
    pub fn table(&self) -> Table {
        let layers: Vec<(&'static str, &'static [&'static str])> = self
            .layers
            .iter()
            .map(|l| -> (&'static str, &'static [&'static str]) { (l, Box::leak(Box::new([*l]))) })
            .collect();
        Table {
            name: self.name,
            layers: Box::leak(layers.into_boxed_slice()),
            aliases: &[],
        }
    }

    /// Where the tree under `src` and the list disagree, in words.
    pub fn mismatches(&self, src: &Path) -> Vec<String> {
        let on_disk: BTreeSet<String> = std::fs::read_dir(src)
            .unwrap_or_else(|e| panic!("read {}: {e}", src.display()))
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let module = name.strip_suffix(".rs").unwrap_or(&name).to_string();
                (module != "lib").then_some(module)
            })
            .collect();
        let listed: BTreeSet<String> = self.layers.iter().map(|l| l.to_string()).collect();
        let missing = on_disk.difference(&listed).map(|m| {
            format!(
                "`src/{m}` is in no layer: move it into a layer's folder, or add the layer to {}",
                self.name
            )
        });
        let absent = listed
            .difference(&on_disk)
            .map(|m| format!("{} names layer `{m}`, which the tree lacks", self.name));
        missing.chain(absent).collect()
    }

    /// Every problem of the crate under `src`: the tree against the list, upward imports, and
    /// the circles among its modules (`layer::module`).
    pub fn check(&self, src: &Path) -> Vec<String> {
        let mut problems = self.mismatches(src);
        problems.extend(self.table().check(src));
        problems.extend(
            module_circles(src)
                .into_iter()
                .map(|c| format!("a circle of modules: {}", c.join(" -> "))),
        );
        problems
    }
}

/// The circles among the second-level modules (`layer::module`, or the layer itself for a
/// single file) of the crate under `src`.
pub fn module_circles(src: &Path) -> Vec<Vec<String>> {
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (relative, _, source) in production_files(src) {
        let own = module_path(&relative);
        let own_key = own.iter().take(2).cloned().collect::<Vec<_>>().join("::");
        let entry = uses.entry(own_key.clone()).or_default();
        for used in named_paths(&source, &own) {
            let key = used.join("::");
            if key != own_key && !key.is_empty() {
                entry.insert(key);
            }
        }
    }
    circles_of(&uses)
}

/// The module path of a file of `src` (`decide/reconcile/mod.rs` → `decide::reconcile`,
/// `write/pods.rs` → `write::pods`, `main.rs` → `main`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
        if stem != "mod" {
            parts.push(stem);
        }
    }
    parts
}

/// The paths a file of module `own` names from its own crate (`crate::…`, `super::…`,
/// `self::…`), each as the crate-level path of its first two modules.
pub fn named_paths(source: &str, own: &[String]) -> BTreeSet<Vec<String>> {
    let code = production_code(source);
    let mut found = BTreeSet::new();
    for start in ["crate::", "super::", "self::"] {
        let mut rest = code.as_str();
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().next_back();
            let tail = &rest[at..];
            rest = &rest[at + start.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // `gpuval_crate::`, or the second `super::` of a chain
            }
            let (base, path) = resolve(tail, own);
            for p in use_tree(path) {
                let mut whole = base.clone();
                whole.extend(p);
                found.insert(whole.into_iter().take(2).collect());
            }
        }
    }
    found
}

/// The module a relative path starts from and the rest of the path: `super::super::x` from
/// `a::b::c` → (`a`, `x…`).
fn resolve<'a>(mut tail: &'a str, own: &[String]) -> (Vec<String>, &'a str) {
    if let Some(rest) = tail.strip_prefix("crate::") {
        return (Vec::new(), rest);
    }
    if let Some(rest) = tail.strip_prefix("self::") {
        return (own.to_vec(), rest);
    }
    let mut base = own.to_vec();
    while let Some(rest) = tail.strip_prefix("super::") {
        base.pop();
        tail = rest;
    }
    (base, tail)
}

/// The paths of a use tree at the start of `s` (`a::b::{c, d::e}` → `a::b::c`, `a::b::d::e`),
/// each cut at its first two names.
fn use_tree(s: &str) -> Vec<Vec<String>> {
    let mut path = Vec::new();
    let mut rest = s;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut out = Vec::new();
            for entry in split_group(group) {
                for tail in use_tree(entry.trim_start()) {
                    let mut whole = path.clone();
                    whole.extend(tail);
                    out.push(whole);
                }
            }
            return out;
        }
        let name = ident(rest);
        if name.is_empty() || name == "self" {
            return vec![path];
        }
        path.push(name.to_string());
        match rest[name.len()..].strip_prefix("::") {
            Some(next) if path.len() < 2 => rest = next,
            _ => return vec![path],
        }
    }
}

/// The entries of a `{…}` group, up to its closing brace.
fn split_group(group: &str) -> Vec<&str> {
    let mut entries = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                entries.push(&group[start..i]);
                return entries;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    entries
}
