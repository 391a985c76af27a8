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
    /// `#[macro_export]` macros, named `crate::NAME!` from anywhere, and the module of each.
    pub macros: &'static [(&'static str, &'static str)],
}

impl Table {
    /// The layer of a top-level module (0 = top), or `None` when the table does not place it.
    pub fn layer_of(&self, module: &str) -> Option<usize> {
        self.layers
            .iter()
            .position(|(_, modules)| modules.contains(&module))
    }

    /// The top-level module a path names: `crate::backend::sim::X` → `backend`, a macro → the
    /// module defining it.
    fn target_module<'a>(&self, name: &'a str) -> &'a str {
        self.macros
            .iter()
            .find(|(macro_name, _)| *macro_name == name)
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

/// The circles among the top-level modules of the crate under `src` (each as its modules,
/// sorted; none when the imports point one way).
pub fn circles(src: &Path) -> Vec<Vec<String>> {
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, module, source) in production_files(src) {
        let entry = uses.entry(module.clone()).or_default();
        entry.extend(crate_modules(&source).into_iter().filter(|m| *m != module));
    }
    circles_of(&uses)
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
        files.len() > 10,
        "found only {} files under {}",
        files.len(),
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
