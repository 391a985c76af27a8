//! Images and GitOps, as far as tests reach without a Docker engine or an Argo CD / Flux
//! install: the Dockerfile passes hadolint and builds what CI builds; the Argo CD health check
//! runs in Lua 5.1 on sample statuses; the Flux and Argo CD examples point at a validation the
//! API server accepts.

use std::path::Path;

use gpuval_tests::chart::{self, ChartTools};
use gpuval_tests::{ControlPlane, crds};
use serde_json::{Value, json};

fn read(rel: &str) -> String {
    let path = crds::repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn dockerfile_passes_hadolint_and_builds_what_ci_builds() {
    let tools = ChartTools::install().expect("hadolint (tests/scripts/install-chart-tools.sh)");
    let root = crds::repo_root();
    let out = std::process::Command::new(&tools.hadolint)
        .arg(root.join("Dockerfile"))
        .output()
        .expect("run hadolint");
    assert!(
        out.status.success(),
        "hadolint found problems:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).collect();
    // Two targets, each ending as a non-root numeric user with OCI labels and versions as
    // build arguments.
    let stages: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .copied()
        .collect();
    assert!(
        stages.iter().any(|s| s.ends_with(" AS build")),
        "{stages:?}"
    );
    assert!(
        stages.iter().any(|s| s.ends_with(" AS operator")),
        "{stages:?}"
    );
    let agent = stages
        .iter()
        .find(|s| s.ends_with(" AS agent"))
        .expect("agent target");
    assert!(
        agent.contains("nvidia/cuda:") && agent.contains("-runtime-"),
        "{agent}"
    );
    for arg in [
        "RUST_VERSION",
        "CUDA_VERSION",
        "UBUNTU_VERSION",
        "VERSION",
        "REVISION",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("ARG {arg}"))),
            "build argument {arg}"
        );
    }
    for target in ["operator", "agent"] {
        let start = lines
            .iter()
            .position(|l| l.starts_with("FROM ") && l.ends_with(&format!(" AS {target}")))
            .expect("stage");
        let end = lines[start + 1..]
            .iter()
            .position(|l| l.starts_with("FROM "))
            .map_or(lines.len(), |i| start + 1 + i);
        let stage = &lines[start..end];
        let user = stage
            .iter()
            .rev()
            .find(|l| l.starts_with("USER "))
            .unwrap_or_else(|| panic!("{target}: no USER"));
        let uid: u32 = user[5..]
            .split(':')
            .next()
            .and_then(|u| u.parse().ok())
            .unwrap_or_else(|| panic!("{target}: USER must be numeric: {user}"));
        assert_ne!(uid, 0, "{target} runs as root");
        for label in ["title", "version", "revision", "source", "licenses"] {
            assert!(
                stage
                    .iter()
                    .any(|l| l.contains(&format!("org.opencontainers.image.{label}="))),
                "{target}: OCI label {label}"
            );
        }
        assert!(
            stage
                .iter()
                .any(|l| l.starts_with("ENTRYPOINT [\"/usr/local/bin/gpuval-")),
            "{target}: entrypoint"
        );
    }
    // The image build runs `make release`, and `make release` is the cargo command CI runs.
    assert!(
        dockerfile.contains("make release"),
        "the build stage runs make release"
    );
    let makefile = read("Makefile");
    let release = makefile
        .split("\nrelease:\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .expect("a release target in the Makefile");
    assert_eq!(
        release.trim(),
        "$(CARGO) build --release --locked -p gpuval-operator -p gpuval-agent"
    );
    assert!(
        read(".ci/run").contains("\nmake release\n"),
        "CI builds the release binaries"
    );
    assert!(read(".dockerignore").contains("target/"));
}

#[test]
fn chart_and_image_versions_follow_the_workspace() {
    let cargo = read("Cargo.toml");
    let version = cargo
        .split("[workspace.package]")
        .nth(1)
        .and_then(|s| s.lines().find(|l| l.starts_with("version")))
        .and_then(|l| l.split('"').nth(1))
        .expect("workspace version");
    let chart_yaml = chart::documents(&read("charts/gpuval/Chart.yaml")).unwrap();
    assert_eq!(
        chart_yaml[0]["appVersion"], version,
        "Chart.yaml appVersion"
    );
    assert!(
        read("Dockerfile").contains(&format!("ARG VERSION={version}")),
        "the Dockerfile's default VERSION is {version}"
    );
    // The chart's default images are tagged with the appVersion.
    let rendered = chart::render("gpuval", "gpuval-system", &[]).unwrap();
    assert!(
        rendered.contains(&format!("gpuval-operator:{version}")),
        "{rendered}"
    );
    assert!(rendered.contains(&format!("gpuval-agent:{version}")));
}

/// A GpuValidation at `generation` with the given status.
fn validation(generation: i64, status: Value) -> Value {
    json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "metadata": {"name": "v", "generation": generation},
        "spec": {"checks": {"memory": {}}},
        "status": status,
    })
}

fn cond(kind: &str, status: &str, reason: &str, message: &str, generation: i64) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": message,
           "observedGeneration": generation, "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

#[test]
fn argocd_health_check_maps_every_state_of_a_validation() {
    let tools = ChartTools::install().expect("lupa (tests/scripts/install-chart-tools.sh)");
    let mut no_status = validation(1, Value::Null);
    no_status.as_object_mut().unwrap().remove("status");
    let mut deleting = validation(1, json!({"observedGeneration": 1, "phase": "Running"}));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let running = |g| {
        json!({"observedGeneration": g, "phase": "Running", "conditions": [
            cond("Ready", "False", "Running", "1 of 2 node(s) done", g),
            cond("Reconciling", "True", "Running", "1 of 2 node(s) done", g),
            cond("Stalled", "False", "Running", "", g),
        ]})
    };
    let passed = json!({"observedGeneration": 2, "phase": "Passed", "conditions": [
        cond("Ready", "True", "Passed", "2 of 2 node(s) passed", 2),
        cond("Reconciling", "False", "Passed", "2 of 2 node(s) passed", 2),
        cond("Stalled", "False", "Passed", "", 2),
    ]});
    let failed = json!({"observedGeneration": 1, "phase": "Failed", "conditions": [
        cond("Ready", "False", "NodesFailed", "1 of 2 node(s) failed; gpu-b Failed: GPU5 memory", 1),
        cond("Reconciling", "False", "NodesFailed", "done", 1),
        cond("Stalled", "True", "NodesFailed", "1 of 2 node(s) failed; gpu-b Failed: GPU5 memory", 1),
    ]});
    // Passed at generation 2, but the spec is now at 3: the old verdict must not count.
    let stale = validation(3, passed.clone());
    // Status written for generation 2 with conditions left from generation 1.
    let mixed = validation(
        2,
        json!({"observedGeneration": 2, "phase": "Pending", "conditions": [
            cond("Ready", "True", "Passed", "old run", 1),
        ]}),
    );
    let cases = [
        (
            "no status",
            no_status,
            "Progressing",
            "Waiting for the gpuval operator",
        ),
        ("deleting", deleting, "Progressing", "being deleted"),
        (
            "pending",
            validation(1, json!({"observedGeneration": 1, "phase": "Pending"})),
            "Progressing",
            "Pending",
        ),
        (
            "running",
            validation(1, running(1)),
            "Progressing",
            "1 of 2 node(s) done",
        ),
        (
            "passed",
            validation(2, passed),
            "Healthy",
            "2 of 2 node(s) passed",
        ),
        (
            "failed",
            validation(1, failed),
            "Degraded",
            "gpu-b Failed: GPU5 memory",
        ),
        ("spec edited", stale, "Progressing", "observe generation 3"),
        ("old conditions", mixed, "Progressing", "Pending"),
    ];
    let objects: Vec<Value> = cases.iter().map(|c| c.1.clone()).collect();
    let answers = chart::argocd_health(&tools, &objects).expect("run health.lua");
    assert_eq!(answers.len(), cases.len());
    for ((name, _, status, message), answer) in cases.iter().zip(&answers) {
        assert_eq!(answer["status"], *status, "{name}: {answer}");
        assert!(
            answer["message"]
                .as_str()
                .is_some_and(|m| m.contains(message)),
            "{name}: {answer}"
        );
    }

    // argocd-cm.yaml carries exactly health.lua.
    let cm = chart::documents(&read("deploy/examples/gitops/argocd/argocd-cm.yaml")).unwrap();
    let embedded = cm[0]["data"]["resource.customizations.health.gpuval.io_GpuValidation"]
        .as_str()
        .expect("the health key in argocd-cm.yaml");
    assert_eq!(embedded, read("deploy/examples/gitops/argocd/health.lua"));
}

/// `kubectl kustomize <repo>/<path>`: the manifests a GitOps tool would apply from that path.
fn kustomize(cp: &ControlPlane, path: &str) -> Vec<Value> {
    let dir = crds::repo_root().join(path.trim_start_matches("./"));
    let out = cp
        .kubectl()
        .expect("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl kustomize");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    chart::documents(&String::from_utf8_lossy(&out.stdout)).expect("kustomize output")
}

fn dry_run(cp: &ControlPlane, docs: &[Value], name: &str) {
    let file = cp.dir().join(name);
    let text: Vec<String> = docs
        .iter()
        .map(|d| serde_json::to_string(d).expect("JSON"))
        .collect();
    std::fs::write(&file, text.join("\n---\n")).expect("write the manifests");
    let out = cp
        .kubectl()
        .expect("kubectl")
        .args(["apply", "--dry-run=server", "-f"])
        .arg(&file)
        .output()
        .expect("kubectl apply");
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitops_examples_gate_on_a_validation_the_api_server_accepts() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::install_crds(&client).await.expect("CRDs");

    // Flux: the acceptance Kustomization health-checks GpuValidations that its path applies,
    // and the workloads depend on it.
    let flux = chart::documents(&read("deploy/examples/gitops/flux/gpu-acceptance.yaml")).unwrap();
    let kustomizations: Vec<&Value> = flux
        .iter()
        .filter(|d| d["kind"] == "Kustomization")
        .collect();
    let gate = kustomizations
        .iter()
        .find(|k| k["spec"]["healthChecks"].is_array())
        .expect("a Kustomization with health checks");
    let gate_name = gate["metadata"]["name"].as_str().unwrap();
    let applied = kustomize(&cp, gate["spec"]["path"].as_str().unwrap());
    dry_run(&cp, &applied, "flux-acceptance.yaml");
    let checks = gate["spec"]["healthChecks"].as_array().unwrap();
    assert!(!checks.is_empty());
    for hc in checks {
        assert_eq!(hc["apiVersion"], "gpuval.io/v1alpha1");
        assert_eq!(hc["kind"], "GpuValidation");
        assert!(
            hc.get("namespace").is_none(),
            "GpuValidation is cluster-scoped"
        );
        assert!(
            applied
                .iter()
                .any(|d| d["kind"] == "GpuValidation" && d["metadata"]["name"] == hc["name"]),
            "health check {} names nothing the path applies",
            hc["name"]
        );
    }
    // Longer than the validation's deadline, or Flux gives up on a run still going.
    let deadline = applied
        .iter()
        .find(|d| d["kind"] == "GpuValidation")
        .and_then(|d| d["spec"]["deadline"].as_str())
        .and_then(|d| d.parse::<gpuval_crds::Duration>().ok())
        .expect("the gate sets a deadline");
    let timeout: gpuval_crds::Duration = gate["spec"]["timeout"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("the gate sets a timeout");
    assert!(
        timeout.as_std() > deadline.as_std(),
        "{timeout:?} vs {deadline:?}"
    );
    assert!(
        kustomizations.iter().any(|k| k["spec"]["dependsOn"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["name"] == gate_name))),
        "nothing waits on {gate_name}"
    );

    // Argo CD: the Application's path applies validations the API server accepts.
    let app = chart::documents(&read("deploy/examples/gitops/argocd/application.yaml")).unwrap();
    let path = app[0]["spec"]["source"]["path"]
        .as_str()
        .expect("source path");
    let docs = kustomize(&cp, path);
    assert!(docs.iter().any(|d| d["kind"] == "GpuValidation"));
    dry_run(&cp, &docs, "argocd-acceptance.yaml");
    assert!(Path::new(&crds::repo_root().join(path)).is_dir());
}
