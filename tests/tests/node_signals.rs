//! The node signals of docs/node-signals.md (issue 45, point 6):
//! - the Cluster API MachineHealthCheck example is accepted by Cluster API's own
//!   CustomResourceDefinition (generated from its Go types; taken from its published Go module
//!   at [`CAPI_VERSION`]) on a real API server, with strict field validation, and a misspelt
//!   field is refused, so the check bites;
//! - every example reads the `GpuValidated` condition the way the operator writes it (`True` to
//!   admit, `False` to remediate, never `Unknown`), with its circuit breaker;
//! - with node taints left to the cluster's controller (`--node-taints=cluster`), a hardware
//!   failure under `spec.onFailure: Taint` writes no taint while the condition still tells
//!   every verdict, False then True.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use gpuval_crds::{Phase, labels};
use gpuval_operator::settings::config::NodeTaints;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{Cluster, wait};
use gpuval_tests::{ControlPlane, crds};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

/// The Cluster API release whose MachineHealthCheck schema the example is checked against.
const CAPI_VERSION: &str = "1.14.2";
const DOC: &str = "docs/node-signals.md";
const NS: &str = "gpuval-system";
const SIM: &str = "gpus=2,model=H200,timescale=0.001";
const LONG: Duration = Duration::from_secs(240);

/// The YAML blocks of the document, parsed.
fn examples() -> Vec<Value> {
    let text = std::fs::read_to_string(crds::repo_root().join(DOC)).expect(DOC);
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        match (&mut block, line.trim_start()) {
            (None, "```yaml") => block = Some(String::new()),
            (Some(b), "```") => {
                blocks
                    .push(serde_saphyr::from_str(b).unwrap_or_else(|e| panic!("{DOC}: {e}\n{b}")));
                block = None;
            }
            (Some(b), _) => {
                b.push_str(line);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

fn example(kind: &str) -> Value {
    examples()
        .into_iter()
        .find(|e| e["kind"] == kind)
        .unwrap_or_else(|| panic!("{DOC} has no {kind} example"))
}

#[test]
fn every_example_reads_the_condition_as_the_operator_writes_it() {
    let condition = gpuval_operator::decide::node_state::CONDITION;
    // The readiness rule admits: it reads GpuAdmitted, which only a run whose author may
    // admit nodes turns True (issue 52, point 4).
    let nrr = example("NodeReadinessRule");
    assert_eq!(
        nrr["spec"]["conditions"][0]["type"],
        gpuval_crds::labels::ADMITTED_CONDITION
    );
    assert_eq!(nrr["spec"]["conditions"][0]["requiredStatus"], "True");
    assert_eq!(nrr["spec"]["enforcementMode"], "bootstrap-only");
    let mhc = example("MachineHealthCheck");
    let unhealthy = mhc["spec"]["checks"]["unhealthyNodeConditions"]
        .as_array()
        .expect("unhealthyNodeConditions");
    assert!(
        unhealthy
            .iter()
            .all(|c| c["type"] == condition && c["status"] == "False")
    );
    assert!(
        mhc["spec"]["remediation"]["triggerIf"]["unhealthyLessThanOrEqualTo"].is_string(),
        "the circuit breaker"
    );
    let nhc = example("NodeHealthCheck");
    let unhealthy = nhc["spec"]["unhealthyConditions"]
        .as_array()
        .expect("unhealthyConditions");
    assert!(
        unhealthy
            .iter()
            .all(|c| c["type"] == condition && c["status"] == "False")
    );
    assert!(nhc["spec"]["minHealthy"].is_string(), "the circuit breaker");
}

/// The directory of Cluster API's Go module at [`CAPI_VERSION`], downloaded into Go's module
/// cache (the control plane's own modules come the same way).
fn capi_module() -> PathBuf {
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let out = Command::new("go")
        .args(["mod", "download", "-json"])
        .arg(format!("sigs.k8s.io/cluster-api@v{CAPI_VERSION}"))
        .current_dir(scratch.path())
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("run go (the Go toolchain builds the control plane too: install golang)");
    assert!(
        out.status.success(),
        "go mod download sigs.k8s.io/cluster-api@v{CAPI_VERSION}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let info: Value = serde_json::from_slice(&out.stdout).expect("go mod download -json");
    PathBuf::from(info["Dir"].as_str().expect("the module's directory"))
}

async fn apply_strict(api: &Api<DynamicObject>, body: &Value) -> Result<(), kube::Error> {
    let name = body["metadata"]["name"].as_str().unwrap_or_default();
    let pp = PatchParams::apply("gpuval-docs").validation_strict();
    api.patch(name, &pp, &Patch::Apply(body)).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machine_health_check_example_is_accepted_by_cluster_api_s_own_schema() {
    let crd = capi_module().join("core/config/crd/bases/cluster.x-k8s.io_machinehealthchecks.yaml");
    assert!(Path::new(&crd).exists(), "{}", crd.display());
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::apply_crds(&client, &crd, "gpuval-docs", Duration::from_secs(60))
        .await
        .expect("Cluster API's MachineHealthCheck CRD");
    let mhc = example("MachineHealthCheck");
    let ar = ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "MachineHealthCheck".into(),
        plural: "machinehealthchecks".into(),
    };
    let ns = mhc["metadata"]["namespace"].as_str().unwrap_or("default");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    apply_strict(&api, &mhc)
        .await
        .unwrap_or_else(|e| panic!("{DOC}'s MachineHealthCheck refused: {e}"));
    // The v1beta1 spelling is not this version's: strict validation refuses it.
    let mut old = mhc.clone();
    old["metadata"]["name"] = json!("gpu-validated-v1beta1-spelling");
    old["spec"]["unhealthyConditions"] = old["spec"]["checks"]["unhealthyNodeConditions"].take();
    let refused = apply_strict(&api, &old)
        .await
        .expect_err("a misspelt field");
    assert!(
        refused.to_string().contains("unhealthyConditions"),
        "{refused}"
    );
}

fn failure_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == labels::FAILED_NODE))
}

fn condition_status(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == gpuval_operator::decide::node_state::CONDITION)
        .map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_cluster_s_taint_controller_gpuval_writes_no_taint_and_the_condition_tells_all() {
    let node = "gpu-c";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    c.kubelet
        .set_node_env(node, "GPUVAL_SIMULATE", &format!("{SIM},fail=memory@1"));
    // Every version of the node, as the watch sees it, for the whole test.
    let seen: Arc<Mutex<Vec<Node>>> = Arc::default();
    let record = seen.clone();
    let nodes: Api<Node> = Api::all(c.client.clone());
    let watching = tokio::spawn(
        watcher(nodes.clone(), watcher::Config::default())
            .applied_objects()
            .for_each(move |n| {
                if let Ok(n) = n {
                    record.lock().unwrap_or_else(|e| e.into_inner()).push(n);
                }
                futures::future::ready(())
            }),
    );
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    cfg.node_taints = NodeTaints::Cluster;
    let _op = OperatorHandle::start(c.client.clone(), cfg);
    c.apply(
        "burn",
        json!({"checks": {"memory": {"fraction": 0.1}}, "onFailure": {"action": "Taint"}}),
    )
    .await;
    let gv = c.wait_terminal("burn", LONG.as_secs()).await;
    assert_eq!(gv.status.and_then(|s| s.phase), Some(Phase::Failed));
    wait(
        nodes.clone(),
        node,
        LONG.as_secs(),
        "GpuValidated=False",
        |n: Option<&Node>| n.and_then(condition_status).as_deref() == Some("False"),
    )
    .await;
    // Repaired: the validation runs again (only the same validation or a schedule's run, as
    // deep, clears a failure) and passes.
    c.kubelet.set_node_env(node, "GPUVAL_SIMULATE", SIM);
    c.apply(
        "burn",
        json!({"checks": {"memory": {"fraction": 0.1}}, "onFailure": {"action": "Taint"}, "deadline": "11m"}),
    )
    .await;
    let gv = c.wait_terminal("burn", LONG.as_secs()).await;
    assert_eq!(gv.status.and_then(|s| s.phase), Some(Phase::Passed));
    let passed = wait(
        nodes.clone(),
        node,
        LONG.as_secs(),
        "GpuValidated=True",
        |n: Option<&Node>| n.and_then(condition_status).as_deref() == Some("True"),
    )
    .await;
    watching.abort();
    assert_eq!(
        passed
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::VERDICT_RUN))
            .map(String::as_str),
        Some("burn")
    );
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        seen.len() > 2,
        "the watch saw the node change: {}",
        seen.len()
    );
    assert!(
        !seen.iter().any(failure_taint),
        "gpuval wrote a node taint although the cluster's controller owns them"
    );
}
