//! The layers of the agent and of the operator, each in one table here, held against their code
//! ([`gpuval_tests::layers`]): no module names a module of a layer above its own, no circle
//! among the top-level modules, no exceptions. `docs/architecture.md` shows both tables; the
//! crates' `lib.rs` describe them.

use std::path::{Path, PathBuf};

use gpuval_tests::layers::{self, Table, Tree};

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
    aliases: &[
        ("check_result", "judge"),
        ("gpu_slot", "checks"),
        ("node_slot", "checks"),
        ("settings_in", "checks"),
        ("flags_of", "checks"),
    ],
};

/// The operator, top first: its folders (and single files) of `src/` are its layers, so the
/// tree is this list and each folder's entries are its modules.
const OPERATOR: Tree = Tree {
    name: "OPERATOR in tests/tests/layers.rs",
    layers: &[
        "main",
        "wiring",
        "controllers",
        "write",
        "read",
        "context",
        "caches",
        "decide",
        "settings",
        "services",
    ],
};

/// The API crate, top first. `lib` is the crate's root: the group, version, labels and
/// agent environment names, and the re-exports.
const CRDS: Table = Table {
    name: "CRDS in tests/tests/layers.rs",
    layers: &[
        ("the crdgen command", &["bin"]),
        (
            "the CRDs as committed and the spec's checks",
            &["validate", "schema"],
        ),
        (
            "certificates, attestations, baselines and schedules",
            &["attestation", "baseline", "certificate", "schedule"],
        ),
        (
            "the kinds and their final lines",
            &["spec", "evidence", "binding"],
        ),
        (
            "results and status",
            &["result", "status", "fabric_shard", "nccl_env"],
        ),
        (
            "the report and its sections",
            &[
                "report",
                "result_meta",
                "fabric",
                "depth",
                "facts",
                "nccl",
                "training",
                "xid",
                "selector",
            ],
        ),
        ("reasons and the spec's rules", &["reason", "rules"]),
        ("values", &["duration", "kinds", "fabric_ports", "seal"]),
        (
            "leaves",
            &[
                "conditions",
                "cron",
                "dra",
                "names",
                "pem",
                "schema_inline",
                "spelling",
                "text",
                "lib",
            ],
        ),
    ],
    aliases: &[
        ("Checks", "spec"),
        ("DEADLINE_RANGE", "spec"),
        ("GpuValidation", "spec"),
        ("GpuValidationSpec", "spec"),
        ("Thresholds", "spec"),
        ("DURATION_PATTERN", "duration"),
        ("Duration", "duration"),
        ("cel_quote", "duration"),
        ("GpuNodeResult", "result"),
        ("GpuValidationSchedule", "schedule"),
        ("NodeReport", "report"),
        ("Phase", "status"),
        ("GROUP", "lib"),
        ("VERSION", "lib"),
        ("labels", "lib"),
        ("agent_env", "lib"),
        ("GPU_RESOURCE", "lib"),
    ],
};

/// The fabric planner, top first. `lib` is the crate's root: the round and group types.
const FABRIC: Table = Table {
    name: "FABRIC in tests/tests/layers.rs",
    layers: &[
        ("models for tests", &["model", "property"]),
        ("the planner", &["plan"]),
        ("faults between nodes", &["between"]),
        ("who is near whom", &["neighbours"]),
        ("what the rounds say", &["evaluate"]),
        ("settings and the round types", &["settings", "lib"]),
    ],
    aliases: &[
        ("BetweenFault", "between"),
        ("Evaluation", "evaluate"),
        ("Evidence", "evaluate"),
        ("GroupFailure", "evaluate"),
        ("History", "evaluate"),
        ("NodeState", "evaluate"),
        ("Standing", "evaluate"),
        ("Conclusion", "plan"),
        ("Decision", "plan"),
        ("NodeFabric", "plan"),
        ("next", "plan"),
        ("Settings", "settings"),
        ("Purpose", "lib"),
        ("Group", "lib"),
        ("Round", "lib"),
    ],
};

/// The views, top first. `lib` is the crate's root: the document and its lines.
const VIEW: Table = Table {
    name: "VIEW in tests/tests/layers.rs",
    layers: &[
        ("pages", &["html", "junit", "tree"]),
        ("Markdown", &["markdown"]),
        ("comparison", &["diff"]),
        ("the list of checks' views", &["checks"]),
        ("figures and drawing", &["figures", "svg"]),
        ("the document", &["lib", "sample"]),
    ],
    aliases: &[
        ("Document", "lib"),
        ("ValidationLine", "lib"),
        ("FabricLine", "lib"),
        ("NodeEntry", "lib"),
        ("LineView", "lib"),
        ("with_action", "lib"),
        ("worst_first", "lib"),
        ("json", "lib"),
        ("ReadError", "lib"),
        ("parse_report", "lib"),
        ("diff", "diff"),
        ("html", "html"),
        ("junit", "junit"),
        ("markdown", "markdown"),
        ("tree", "tree"),
        ("node_figures", "checks"),
        ("Figure", "figures"),
        ("Scope", "figures"),
        ("Change", "diff"),
        ("Diff", "diff"),
        ("Tolerance", "diff"),
    ],
};

/// The kubectl plugin, top first. `lib` is the crate's root: a validation as a document.
const PLUGIN: Table = Table {
    name: "PLUGIN in tests/tests/layers.rs",
    layers: &[
        ("the command", &["main"]),
        ("arguments and certificates", &["cli", "certificates"]),
        ("the document", &["lib"]),
    ],
    aliases: &[("document", "lib"), ("ready_message", "lib")],
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
    assert_eq!(table.circles(&src), Vec::<Vec<String>>::new());
}

#[test]
fn no_module_of_the_agent_imports_a_higher_layer_or_closes_a_circle() {
    assert_holds(&AGENT, "agent");
}

#[test]
fn the_operators_tree_is_its_table_and_no_module_imports_a_higher_layer_or_closes_a_circle() {
    let problems = OPERATOR.check(&src_of("operator"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_module_outside_the_operators_layers_or_a_circle_of_its_modules_fails() {
    let dir = tempfile::tempdir().expect("a scratch tree");
    let src = dir.path();
    for layer in OPERATOR.layers {
        let folder = src.join(layer);
        std::fs::create_dir_all(&folder).expect("a layer folder");
        std::fs::write(folder.join("mod.rs"), "").expect("a mod.rs");
    }
    for (file, source) in [
        ("decide/a.rs", "use crate::decide::b::X;\n"),
        ("decide/b.rs", "use super::a::Y;\n"),
        ("decide/c.rs", "use crate::write::apply;\n"),
        ("stray.rs", ""),
    ] {
        std::fs::write(src.join(file), source).expect("a planted file");
    }
    let problems = OPERATOR.check(src);
    let said = problems.join("\n");
    assert!(said.contains("`src/stray` is in no layer"), "{said}");
    assert!(said.contains("a layer above it"), "{said}");
    assert!(
        said.contains("a circle of modules: decide::a -> decide::b"),
        "{said}"
    );
    assert!(said.contains("module `stray` is in no layer"), "{said}");
    assert_eq!(problems.len(), 4, "{said}");
}

#[test]
fn no_module_of_the_api_the_fabric_planner_the_views_or_the_plugin_imports_a_higher_layer_or_closes_a_circle()
 {
    assert_holds(&CRDS, "crds");
    assert_holds(&FABRIC, "fabric");
    assert_holds(&VIEW, "view");
    assert_holds(&PLUGIN, "kubectl-gpuval");
}

#[test]
fn every_module_is_placed_once() {
    for table in [&AGENT, &OPERATOR.table(), &CRDS, &FABRIC, &VIEW, &PLUGIN] {
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
    assert_eq!(OPERATOR.table().violations("decide", planted).len(), 1);
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
        ("The operator's layers", &OPERATOR.table()),
        ("The API's layers", &CRDS),
        ("The fabric planner's layers", &FABRIC),
        ("The views' layers", &VIEW),
        ("The plugin's layers", &PLUGIN),
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
