//! The agent's layers hold: a module of `agent/src` never names (`crate::…`) a module of a layer
//! above its own. The table of layers lives here, in one place; `lib.rs`'s doc comment describes
//! it. Test code (files `tests.rs` / `*_tests.rs`, and everything from a file's first
//! `#[cfg(test)]` on) may reach anywhere and is not scanned.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The agent's layers, top first. A module may use its own layer and those below it.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "entry points",
        &["main", "k8s", "config", "saved_result", "bare_certificate"],
    ),
    ("flows", &["runner", "render", "fabric"]),
    ("checks", &["checks"]),
    ("check contract", &["check"]),
    (
        "services",
        &[
            "backend",
            "api_retry",
            "judge",
            "run_control",
            "text",
            "profiles",
            "link_floors",
            "telemetry",
            "report",
            "test_hooks",
            "worker",
            "pod_resources",
        ],
    ),
    ("hardware names", &["pci", "host_identity"]),
];

/// `#[macro_export]` macros, named `crate::NAME!` from anywhere, and the module defining each.
const MACROS: &[(&str, &str)] = &[("check_result", "judge")];

/// Known upward imports, each with why it stays for now (none: the fabric's circles with the
/// simulated backend and with the Kubernetes flow (`k8s/`) were cut; a new one must say why here).
const KNOWN_EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// The layer of a top-level module (0 = top), or `None` when the table does not place it.
fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// The top-level module a path names: `crate::backend::sim::X` → `backend`, a macro → the
/// module defining it.
fn target_module(name: &str) -> &str {
    MACROS
        .iter()
        .find(|(macro_name, _)| *macro_name == name)
        .map_or(name, |(_, module)| module)
}

/// The production part of a source file: comments dropped, everything from the first
/// `#[cfg(test)]` on cut.
fn production_code(source: &str) -> String {
    let mut kept = String::new();
    for line in source.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        kept.push_str(code);
        kept.push('\n');
    }
    kept
}

/// The top-level modules a source names through `crate::`: `crate::a::b`, `crate::a!` and
/// every first name of a group `crate::{a, b::{c}, d}`.
fn crate_modules(source: &str) -> BTreeSet<String> {
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

/// The top-level module a file of `agent/src` belongs to, or `None` for `lib.rs`.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let module = first.strip_suffix(".rs").unwrap_or(first);
    (module != "lib").then(|| module.to_string())
}

fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// Every upward use in one file of module `module`: `(from, to, why it is wrong)`.
fn violations(module: &str, source: &str) -> Vec<String> {
    let Some(own) = layer_of(module) else {
        return vec![format!(
            "module `{module}` is in no layer: add it to LAYERS in agent/tests/layers.rs"
        )];
    };
    let mut found = Vec::new();
    for used in crate_modules(source) {
        let target = target_module(&used);
        if target == module {
            continue;
        }
        let Some(theirs) = layer_of(target) else {
            found.push(format!(
                "`{module}` uses `crate::{used}`, which is in no layer: add it to LAYERS"
            ));
            continue;
        };
        let known = KNOWN_EXCEPTIONS
            .iter()
            .any(|(from, to, _)| *from == module && *to == target);
        if theirs < own && !known {
            found.push(format!(
                "`{module}` ({}) uses `crate::{used}` ({}), a layer above it: move what it needs \
                 down, or pass it in",
                LAYERS[own].0, LAYERS[theirs].0
            ));
        }
    }
    found
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
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

#[test]
fn no_module_of_the_agent_imports_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 20,
        "found only {} files under {}",
        files.len(),
        src.display()
    );
    let mut problems = Vec::new();
    for path in files.iter().filter(|p| !is_test_file(p)) {
        let relative = path.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(relative) else {
            continue;
        };
        let source = std::fs::read_to_string(path).expect("read source");
        for problem in violations(&module, &source) {
            problems.push(format!("{}: {problem}", relative.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "layer violations:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_known_exception_is_still_needed() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for (from, to, why) in KNOWN_EXCEPTIONS {
        let still_used = files.iter().filter(|p| !is_test_file(p)).any(|path| {
            let relative = path.strip_prefix(&src).expect("under src");
            module_of(relative).as_deref() == Some(*from)
                && crate_modules(&std::fs::read_to_string(path).expect("read source"))
                    .iter()
                    .any(|used| target_module(used) == *to)
        });
        assert!(
            still_used,
            "`{from}` no longer uses `{to}`: drop the exception ({why})"
        );
    }
}

#[test]
fn a_planted_upward_import_fails() {
    let planted = "use crate::backend::Backend;\nuse crate::config::RunSettings;\n";
    let found = violations("checks", planted);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("crate::config"), "{found:?}");
}

#[test]
fn a_planted_upward_import_in_a_group_or_a_call_fails() {
    let grouped = "use crate::{judge::Judge, runner::{self, Plan}};\n";
    assert_eq!(
        violations("check", grouped).len(),
        1,
        "runner is above check"
    );
    let called = "fn f() { crate::k8s::retry(\"x\", || ()); }\n";
    assert_eq!(violations("runner", called).len(), 1, "k8s is above runner");
}

#[test]
fn downward_and_same_layer_imports_and_test_code_pass() {
    let source = "use crate::{backend::Backend, judge::Judge, pci};\n\
                  crate::check_result!(X);\n\
                  // crate::k8s in a comment\n\
                  #[cfg(test)]\nmod tests { use crate::runner; }\n";
    assert_eq!(violations("report", source), Vec::<String>::new());
}

#[test]
fn a_module_missing_from_the_table_fails() {
    assert_eq!(violations("newcomer", "").len(), 1);
    assert_eq!(violations("check", "use crate::newcomer::X;").len(), 1);
}

/// The glob imports (`use x::*;`, `pub use x::*;`) in production source `source`.
fn glob_imports(source: &str) -> Vec<String> {
    production_code(source)
        .lines()
        .map(str::trim)
        .filter(|l| (l.starts_with("use ") || l.starts_with("pub use ")) && l.ends_with("::*;"))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_kubernetes_flow_names_each_import() {
    // Where a name comes from is seen where it is used: no glob import in k8s/ (tests aside).
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/k8s");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(files.len() >= 3, "{files:?}");
    let globs: Vec<String> = files
        .iter()
        .filter(|f| !is_test_file(f))
        .flat_map(|f| {
            let source = std::fs::read_to_string(f).expect("read a source file");
            glob_imports(&source)
                .into_iter()
                .map(move |g| format!("{}: {g}", f.display()))
        })
        .collect();
    assert!(globs.is_empty(), "glob imports: {globs:#?}");
    assert_eq!(
        glob_imports("use a::b;\npub use self::env::*;\n#[cfg(test)]\nuse super::*;"),
        ["pub use self::env::*;"],
        "a planted glob is found; test code is not scanned"
    );
}
