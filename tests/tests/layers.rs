//! The layers of the agent and of the operator, each in one table here, held against their code
//! ([`gpuval_tests::layers`]): no module names a module of a layer above its own, no circle
//! among the top-level modules, no exceptions. `docs/architecture.md` shows both tables; the
//! crates' `lib.rs` describe them.

use std::path::{Path, PathBuf};

use gpuval_tests::layers::{self, Table};

/// The agent, top first.
const AGENT: Table = Table {
    name: "AGENT in tests/tests/layers.rs",
    layers: &[
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
                "nccl",
            ],
        ),
        ("hardware names", &["pci", "host_identity"]),
    ],
    macros: &[
        ("check_result", "judge"),
        ("gpu_slot", "checks"),
        ("node_slot", "checks"),
        ("settings_in", "checks"),
        ("flags_of", "checks"),
    ],
};

/// The operator, top first: the wiring, the controllers, what writes, what reads the caches,
/// the context every shell module stands on, the caches, the pure decisions, the settings,
/// the services.
const OPERATOR: Table = Table {
    name: "OPERATOR in tests/tests/layers.rs",
    layers: &[
        ("wiring", &["main", "controller"]),
        ("controllers", &["schedule", "admission", "node_state"]),
        (
            "writers",
            &[
                "apply",
                "write",
                "certificate_store",
                "node_marks",
                "device_taints",
                "result_binding",
            ],
        ),
        ("readers", &["observe", "result_figures", "baselines"]),
        ("context", &["context"]),
        (
            "caches",
            &["pod_views", "stores", "wakes", "watch_backoff", "leader"],
        ),
        (
            "decisions",
            &[
                "reconcile",
                "selection",
                "pod",
                "pod_reading",
                "failure_marks",
                "failure_record",
                "node_evidence",
                "certificates",
                "dra_claim",
                "expected",
                "fabric_key",
                "runs",
            ],
        ),
        ("settings", &["config", "allocation_config", "clock"]),
        (
            "services",
            &[
                "metrics",
                "port_metrics",
                "heap",
                "throttle",
                "paged",
                "certificate_retry",
            ],
        ),
    ],
    macros: &[],
};

fn src_of(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

/// `table` holds for the crate `krate`: no upward import, no circle.
fn assert_holds(table: &Table, krate: &str) {
    let src = src_of(krate);
    let problems = table.check(&src);
    assert!(
        problems.is_empty(),
        "layer violations:\n{}",
        problems.join("\n")
    );
    assert_eq!(layers::circles(&src), Vec::<Vec<String>>::new());
}

#[test]
fn no_module_of_the_agent_imports_a_higher_layer_or_closes_a_circle() {
    assert_holds(&AGENT, "agent");
}

#[test]
fn no_module_of_the_operator_imports_a_higher_layer_or_closes_a_circle() {
    assert_holds(&OPERATOR, "operator");
}

#[test]
fn every_module_is_placed_once() {
    for table in [&AGENT, &OPERATOR] {
        let mut seen = std::collections::BTreeSet::new();
        for (_, modules) in table.layers {
            for m in *modules {
                assert!(seen.insert(*m), "{m} twice in {}", table.name);
            }
        }
    }
}

#[test]
fn a_planted_upward_import_fails() {
    let planted = "use crate::backend::Backend;\nuse crate::config::RunSettings;\n";
    let found = AGENT.violations("checks", planted);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("crate::config"), "{found:?}");
    let planted = "use crate::context::Ctx;\n";
    assert_eq!(OPERATOR.violations("reconcile", planted).len(), 1);
}

#[test]
fn a_planted_upward_import_in_a_group_or_a_call_fails() {
    let grouped = "use crate::{judge::Judge, runner::{self, Plan}};\n";
    assert_eq!(
        AGENT.violations("check", grouped).len(),
        1,
        "runner is above check"
    );
    let called = "fn f() { crate::k8s::retry(\"x\", || ()); }\n";
    assert_eq!(
        AGENT.violations("runner", called).len(),
        1,
        "k8s is above runner"
    );
}

#[test]
fn downward_and_same_layer_imports_and_test_code_pass() {
    let source = "use crate::{backend::Backend, judge::Judge, pci};\n\
                  crate::check_result!(X);\n\
                  // crate::k8s in a comment\n\
                  #[cfg(test)]\nmod tests { use crate::runner; }\n";
    assert_eq!(AGENT.violations("report", source), Vec::<String>::new());
}

#[test]
fn code_after_a_test_only_item_is_scanned() {
    // A test-only import at the top of a file hides nothing below it.
    let source = "#[cfg(test)]\nuse futures::StreamExt;\nuse crate::k8s::Thing;\n";
    assert_eq!(
        AGENT.violations("runner", source).len(),
        1,
        "k8s is above runner"
    );
    let source = "#[cfg(test)]\nmod tests {\n    use crate::k8s;\n    fn f() {}\n}\nfn g() { crate::k8s::x(); }\n";
    assert_eq!(AGENT.violations("runner", source).len(), 1);
    let source = "#[cfg(test)]\n#[allow(dead_code)]\nfn helper() {\n    crate::k8s::x();\n}\n";
    assert!(AGENT.violations("runner", source).is_empty());
}

#[test]
fn a_module_missing_from_the_table_fails() {
    assert_eq!(AGENT.violations("newcomer", "").len(), 1);
    assert_eq!(
        AGENT.violations("check", "use crate::newcomer::X;").len(),
        1
    );
}

#[test]
fn a_planted_circle_is_found() {
    let uses = |pairs: &[(&str, &str)]| {
        let mut m = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
        for (a, b) in pairs {
            m.entry(a.to_string()).or_default().insert(b.to_string());
        }
        m
    };
    let circle = uses(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]);
    assert_eq!(layers::circles_of(&circle), vec![vec!["a", "b", "c"]]);
    let tower = uses(&[("a", "b"), ("b", "c"), ("a", "c")]);
    assert!(layers::circles_of(&tower).is_empty());
}

#[test]
fn the_agents_kubernetes_flow_names_each_import() {
    // Where a name comes from is seen where it is used: no glob import in k8s/ (tests aside).
    let dir = src_of("agent").join("k8s");
    let mut files = Vec::new();
    layers::rust_files(&dir, &mut files);
    assert!(files.len() >= 3, "{files:?}");
    let globs: Vec<String> = files
        .iter()
        .filter(|f| !layers::is_test_file(f))
        .flat_map(|f| {
            let source = std::fs::read_to_string(f).expect("read a source file");
            layers::glob_imports(&source)
                .into_iter()
                .map(move |g| format!("{}: {g}", f.display()))
        })
        .collect();
    assert!(globs.is_empty(), "glob imports: {globs:#?}");
    assert_eq!(
        layers::glob_imports("use a::b;\npub use self::env::*;\n#[cfg(test)]\nuse super::*;"),
        ["pub use self::env::*;"],
        "a planted glob is found; test code is not scanned"
    );
}

/// The modules the first column of the table under `heading` in docs/architecture.md names
/// (`a.rs`, `b/` → `a`, `b`), row by row.
fn documented_rows(heading: &str) -> Vec<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md");
    let text = std::fs::read_to_string(&path).expect("docs/architecture.md");
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("no section {heading:?} in docs/architecture.md"));
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let first = l.split('|').nth(1).unwrap_or_default();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|name| {
                    name.trim_end_matches('/')
                        .trim_end_matches(".rs")
                        .to_string()
                })
                .collect()
        })
        .collect()
}

/// The rows of `table` as module names, in order.
fn table_rows(table: &Table) -> Vec<Vec<String>> {
    table
        .layers
        .iter()
        .map(|(_, ms)| ms.iter().map(|m| m.to_string()).collect())
        .collect()
}

#[test]
fn the_architecture_page_shows_each_table_as_it_is() {
    for (heading, table) in [
        ("The agent's layers", &AGENT),
        ("The operator's layers", &OPERATOR),
    ] {
        let mut documented = documented_rows(heading);
        let mut code = table_rows(table);
        for rows in [&mut documented, &mut code] {
            for row in rows.iter_mut() {
                row.sort();
            }
        }
        assert_eq!(
            documented, code,
            "docs/architecture.md, {heading:?}: the rows (top first) must name the modules of {}",
            table.name
        );
    }
}
