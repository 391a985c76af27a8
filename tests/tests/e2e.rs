//! End to end on a real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kwok): the operator (in-process) turns a GpuValidation into agent pods, the
//! scheduler binds them to kwok GPU nodes, the FakeKubelet runs the real agent binary for each
//! pod (simulated GPU backend) and finishes the pod as a kubelet would, and the operator turns the
//! results into a verdict.

use std::time::Duration;

use gpuval_crds::conditions::{self, READY, STALLED};
use gpuval_crds::{GpuNodeResult, GpuValidation, NodeVerdict, Phase};
use gpuval_tests::nodes;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{self, terminal_for_generation};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
/// Simulated GPUs: 8 × H200; checks take `duration × timescale`.
const SIM: &str = "gpus=8,model=H200,timescale=0.002";

async fn env(gpu_nodes: &[&str]) -> scenario::Cluster {
    scenario::Cluster::start_labelled(NS, gpu_nodes, 8, &[("pool", "h200")]).await
}

async fn apply(client: &Client, name: &str, spec: Value) -> GpuValidation {
    scenario::apply_validation(client, "e2e", name, spec).await
}

/// The cluster with `gpu_nodes`, an operator whose agents simulate `sim`, and validation `name`
/// of `spec` applied.
async fn started(
    gpu_nodes: &[&str],
    sim: &str,
    name: &str,
    spec: Value,
) -> (scenario::Cluster, OperatorHandle) {
    let e = env(gpu_nodes).await;
    let op = OperatorHandle::start(e.client.clone(), test_config(NS, sim));
    apply(&e.client, name, spec).await;
    (e, op)
}

/// Waits (watching, not polling) until `cond` holds for validation `name`.
async fn wait_for(
    client: &Client,
    name: &str,
    secs: u64,
    what: &str,
    cond: impl Condition<GpuValidation>,
) -> GpuValidation {
    match scenario::wait_validation(client, name, Duration::from_secs(secs), what, cond).await {
        Ok(gv) => gv,
        Err(e) => {
            let pods: Vec<String> = pods_of(client, name)
                .await
                .iter()
                .map(|p| {
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    format!(
                        "{} node={node:?} status={}",
                        p.name_any(),
                        serde_json::to_string(&p.status).unwrap_or_default()
                    )
                })
                .collect();
            panic!("{e}\npods: {pods:#?}")
        }
    }
}

/// Waits (watching) until validation `name` is in a terminal phase.
async fn wait_terminal(client: &Client, name: &str, secs: u64) -> GpuValidation {
    wait_for(client, name, secs, "terminal", terminal_for_generation).await
}

fn verdicts(gv: &GpuValidation) -> Vec<(String, NodeVerdict)> {
    gv.status
        .iter()
        .flat_map(|s| s.nodes.iter().map(|n| (n.name.clone(), n.verdict)))
        .collect()
}

/// The nodes whose result for `validation` has `verdict` (its `gpuval.io/verdict` label): the
/// status counts passing nodes without listing them, so a pass is read from the result.
async fn nodes_with_verdict(client: &Client, validation: &str, verdict: &str) -> Vec<String> {
    let api: Api<GpuNodeResult> = Api::namespaced(client.clone(), NS);
    let selector = format!("gpuval.io/validation={validation},gpuval.io/verdict={verdict}");
    let mut nodes: Vec<String> = api
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list results")
        .items
        .iter()
        .filter_map(|r| r.labels().get("gpuval.io/node").cloned())
        .collect();
    nodes.sort();
    nodes
}

async fn pods_of(client: &Client, validation: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    api.list(&ListParams::default().labels(&format!("gpuval.io/validation={validation}")))
        .await
        .expect("list pods")
        .items
}

/// Waits, re-checking on every pod event, until `done` holds for the validation's live pods
/// (those without a deletionTimestamp).
async fn wait_pods(
    client: &Client,
    validation: &str,
    secs: u64,
    what: &str,
    done: impl Fn(&[Pod]) -> bool,
) {
    use futures::StreamExt;
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut events = std::pin::pin!(kube::runtime::watcher(api, Default::default()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let live: Vec<Pod> = pods_of(client, validation)
            .await
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if done(&live) {
            return;
        }
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!(
                "{validation}: pods not {what} within {secs}s: {:?}",
                live.iter().map(|p| p.name_any()).collect::<Vec<_>>()
            ),
        }
    }
}

fn running(n: i32) -> impl Condition<GpuValidation> {
    move |g: Option<&GpuValidation>| {
        g.and_then(|g| g.status.as_ref())
            .is_some_and(|s| s.summary.as_ref().is_some_and(|x| x.running >= n))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_pass_gives_passed_ready_and_kubectl_wait_returns() {
    let e = env(&["gpu-a", "gpu-b", "gpu-c"]).await;
    let _op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    let mut wait = e.cp.kubectl().unwrap();
    apply(
        &e.client,
        "quick",
        json!({"checks": {"topology": {}, "memory": {}, "compute": {"duration": "30s"}}}),
    )
    .await;
    // kubectl wait runs beside the operator (off the async runtime) and must return on success.
    let kubectl_wait = tokio::task::spawn_blocking(move || {
        wait.args([
            "wait",
            "--for=condition=Ready",
            "gpuvalidation/quick",
            "--timeout=120s",
        ])
        .output()
    });
    let gv = wait_terminal(&e.client, "quick", 120).await;
    let waited = kubectl_wait.await.expect("join").expect("run kubectl wait");
    assert!(
        waited.status.success(),
        "kubectl wait failed: {}; status: {}",
        String::from_utf8_lossy(&waited.stderr),
        serde_json::to_string_pretty(&gv.status).unwrap_or_default()
    );
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Passed), "{:?}", verdicts(&gv));
    assert!(conditions::is_true(&s.conditions, READY));
    assert!(!conditions::is_true(&s.conditions, STALLED));
    assert_eq!(s.summary.as_ref().unwrap().passed, 3);
    // Every node's full report is a GpuNodeResult, marked simulated.
    let results: Api<GpuNodeResult> = Api::namespaced(e.client.clone(), NS);
    let all = results.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|r| {
        r.status
            .as_ref()
            .is_some_and(|st| st.simulated && st.gpus.len() == 8)
    }));
    assert_eq!(
        pods_of(&e.client, "quick").await.len(),
        3,
        "one pod per node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_gpu_fails_the_run_naming_node_and_gpu() {
    let e = env(&["gpu-a", "gpu-b"]).await;
    e.kubelet.set_node_env(
        "gpu-b",
        "GPUVAL_SIMULATE",
        "gpus=8,model=H200,timescale=0.002,fail=memory@5",
    );
    let op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    apply(
        &e.client,
        "bad-gpu",
        json!({"checks": {"memory": {}, "compute": {"duration": "30s"}}}),
    )
    .await;
    let gv = wait_terminal(&e.client, "bad-gpu", 120).await;
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Failed));
    let stalled = conditions::find(&s.conditions, STALLED).expect("Stalled");
    assert_eq!(stalled.status, "True");
    assert!(
        stalled.message.contains("gpu-b") && stalled.message.contains("GPU5"),
        "{}",
        stalled.message
    );
    let b = s.nodes.iter().find(|n| n.name == "gpu-b").unwrap();
    assert_eq!(b.verdict, NodeVerdict::Failed);
    assert!(b.message.as_deref().unwrap().contains("GPU5 memory"));
    assert!(
        s.nodes.iter().all(|n| n.name != "gpu-a"),
        "a passing node is counted, not listed"
    );
    assert_eq!(s.summary.as_ref().unwrap().passed, 1);
    assert_eq!(
        nodes_with_verdict(&e.client, "bad-gpu", "Pass").await,
        vec!["gpu-a".to_string()]
    );
    metrics_match_the_results(&e.client, &op).await;
}

/// The value of the series `name{labels}` in the exposition `text`.
fn series_value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let head = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(head.as_str()))
        .and_then(|v| v.parse().ok())
}

/// The operator's /metrics text carries each node's figures from its result: per GPU memory
/// and TFLOP/s equal to the report's, GPU5 of gpu-b failed, node verdicts, last-validated times.
async fn metrics_match_the_results(client: &Client, op: &OperatorHandle) {
    let api: Api<GpuNodeResult> = Api::namespaced(client.clone(), NS);
    let b = api
        .get(&gpuval_crds::result::result_name("bad-gpu", "gpu-b"))
        .await
        .expect("gpu-b's result");
    let report = b.status.expect("gpu-b's report");
    let gpu5 = report.gpus.iter().find(|g| g.index == 5).expect("GPU5");
    let labels = format!(
        r#"node="gpu-b",gpu="5",uuid="{}",model="{}""#,
        gpu5.uuid, gpu5.name
    );
    let memory = gpu5.memory.as_ref().expect("memory").gbps;
    let bf16 = gpu5.compute.as_ref().expect("compute").gemms[0].tflops;
    // The figures arrive once each result is read in the background: wait for them.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = op.metrics.encode();
        if text.contains(r#"gpuval_node_verdict{node="gpu-b""#)
            && text.contains(r#"gpuval_node_verdict{node="gpu-a""#)
        {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no node figures in /metrics within 30s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        series_value(
            &text,
            "gpuval_gpu_memory_gbps",
            &format!(r#"{labels},simulated="true""#)
        ),
        Some(memory),
        "{text}"
    );
    assert_eq!(
        series_value(
            &text,
            "gpuval_gpu_tflops",
            &format!(r#"{labels},dtype="bf16",simulated="true""#)
        ),
        Some(bf16),
        "{text}"
    );
    assert_eq!(
        series_value(
            &text,
            "gpuval_gpu_verdict",
            &format!(r#"{labels},verdict="Fail",simulated="true""#)
        ),
        Some(1.0)
    );
    assert_eq!(
        series_value(
            &text,
            "gpuval_node_verdict",
            r#"node="gpu-b",validation="bad-gpu",verdict="Fail",evidence="Hardware",simulated="true""#
        ),
        Some(1.0)
    );
    assert_eq!(
        series_value(
            &text,
            "gpuval_node_verdict",
            r#"node="gpu-a",validation="bad-gpu",verdict="Pass",evidence="Hardware",simulated="true""#
        ),
        Some(1.0)
    );
    let finished = report
        .finished_at
        .parse::<k8s_openapi::jiff::Timestamp>()
        .expect("finishedAt");
    assert_eq!(
        series_value(
            &text,
            "gpuval_node_last_validated_timestamp_seconds",
            r#"node="gpu-b",simulated="true""#
        ),
        Some(finished.as_millisecond() as f64 / 1000.0)
    );
    assert_eq!(
        text.matches("gpuval_gpu_memory_gbps{").count(),
        16,
        "8 GPUs on each of 2 nodes"
    );
    assert_eq!(
        series_value(&text, "gpuval_fleet_nodes", r#"simulated="true""#),
        Some(2.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_gives_error_and_the_run_completes() {
    // Each burn takes 10m × 0.02 = 12 s: time to kill gpu-b's agent mid-run.
    let (e, _op) = started(
        &["gpu-a", "gpu-b"],
        "gpus=8,model=H200,timescale=0.02",
        "crash",
        json!({"checks": {"compute": {"duration": "10m"}}, "deadline": "1h"}),
    )
    .await;
    wait_for(&e.client, "crash", 60, "running on both nodes", running(2)).await;
    let pods = pods_of(&e.client, "crash").await;
    let pod_b = pods
        .iter()
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("gpu-b"))
        .map(|p| p.name_any())
        .expect("a pod on gpu-b");
    assert!(e.kubelet.kill(&pod_b), "agent of {pod_b} was running");
    let gv = wait_terminal(&e.client, "crash", 120).await;
    let b = gv
        .status
        .as_ref()
        .unwrap()
        .nodes
        .iter()
        .find(|n| n.name == "gpu-b")
        .cloned()
        .unwrap();
    assert_eq!(b.verdict, NodeVerdict::Error, "{b:?}");
    assert!(
        b.message.as_deref().unwrap().contains("agent pod failed"),
        "{b:?}"
    );
    assert_eq!(gv.status.as_ref().unwrap().phase, Some(Phase::Failed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_gives_deadline_exceeded_and_removes_pods() {
    // 20 s × 5 = 100 s of simulated burn against a 30 s deadline.
    let (e, _op) = started(
        &["gpu-a"],
        "gpus=8,model=H200,timescale=5",
        "slow",
        json!({"checks": {"compute": {"duration": "20s"}}, "deadline": "30s"}),
    )
    .await;
    let gv = wait_terminal(&e.client, "slow", 120).await;
    assert_eq!(
        verdicts(&gv),
        vec![("gpu-a".to_string(), NodeVerdict::DeadlineExceeded)]
    );
    wait_pods(&e.client, "slow", 60, "removed", |live| live.is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_makes_no_duplicates_and_reaches_the_verdict() {
    let sim = "gpus=8,model=H200,timescale=0.01";
    let spec = json!({"checks": {"compute": {"duration": "10m"}}});
    let (e, op) = started(&["gpu-a", "gpu-b"], sim, "restart", spec).await;
    wait_for(&e.client, "restart", 60, "running", running(1)).await;
    op.stop().await;
    let _op2 = OperatorHandle::start(e.client.clone(), test_config(NS, sim));
    let gv = wait_terminal(&e.client, "restart", 120).await;
    assert_eq!(
        gv.status.as_ref().unwrap().phase,
        Some(Phase::Passed),
        "{:?}",
        verdicts(&gv)
    );
    assert_eq!(
        pods_of(&e.client, "restart").await.len(),
        2,
        "no duplicate pods"
    );
    assert_eq!(e.kubelet.started().len(), 2, "each agent ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_edit_starts_a_new_run_and_the_old_pods_go() {
    let (e, _op) = started(
        &["gpu-a"],
        "gpus=8,model=H200,timescale=0.05",
        "edit",
        json!({"checks": {"compute": {"duration": "10m"}}}),
    )
    .await;
    wait_for(&e.client, "edit", 60, "running", running(1)).await;
    let old: Vec<String> = pods_of(&e.client, "edit")
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    let edited = apply(
        &e.client,
        "edit",
        json!({"checks": {"memory": {"fraction": 0.5}}}),
    )
    .await;
    assert_eq!(edited.metadata.generation, Some(2));
    let gv = wait_for(
        &e.client,
        "edit",
        120,
        "terminal at generation 2",
        terminal_for_generation,
    )
    .await;
    assert_eq!(gv.status.as_ref().unwrap().observed_generation, Some(2));
    assert_eq!(gv.status.as_ref().unwrap().phase, Some(Phase::Passed));
    wait_pods(&e.client, "edit", 60, "only generation 2", |live| {
        live.iter().all(|p| {
            !old.contains(&p.name_any())
                && p.labels().get("gpuval.io/generation").map(String::as_str) == Some("2")
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_validation_takes_its_pods_and_results() {
    let spec = json!({"checks": {"memory": {}}});
    let (e, _op) = started(&["gpu-a", "gpu-b"], SIM, "gone", spec).await;
    wait_terminal(&e.client, "gone", 120).await;
    let results: Api<GpuNodeResult> = Api::namespaced(e.client.clone(), NS);
    assert_eq!(
        results
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    let owned: Vec<(String, String)> = results
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| (r.name_any(), r.uid().unwrap_or_default()))
        .collect();
    let api: Api<GpuValidation> = Api::all(e.client.clone());
    let uid = api.get("gone").await.unwrap().uid().unwrap();
    api.delete("gone", &DeleteParams::foreground())
        .await
        .unwrap();
    let deleted = await_condition(
        api,
        "gone",
        kube::runtime::wait::conditions::is_deleted(&uid),
    );
    tokio::time::timeout(Duration::from_secs(60), deleted)
        .await
        .expect("validation deleted")
        .unwrap();
    // Garbage collection (kube-controller-manager) removes the owned pods and results.
    wait_pods(&e.client, "gone", 60, "garbage-collected", |live| {
        live.is_empty()
    })
    .await;
    for (name, uid) in owned {
        let gone = await_condition(
            results.clone(),
            &name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        tokio::time::timeout(Duration::from_secs(60), gone)
            .await
            .unwrap_or_else(|_| panic!("result {name} not collected"))
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordoned_and_gpu_less_nodes_are_not_selected_and_status_says_why() {
    let e = env(&["gpu-a", "gpu-c"]).await;
    nodes::create_gpu_node(&e.client, "cpu-0", 0, &[("pool", "h200")])
        .await
        .unwrap();
    let node_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(e.client.clone());
    node_api
        .patch(
            "gpu-c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    let _op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    apply(
        &e.client,
        "pool",
        json!({"nodeSelector": {"matchLabels": {"pool": "h200"}}, "checks": {"memory": {}}}),
    )
    .await;
    let gv = wait_terminal(&e.client, "pool", 120).await;
    let s = gv.status.as_ref().unwrap();
    assert!(verdicts(&gv).is_empty(), "passing nodes are not listed");
    assert_eq!(s.summary.as_ref().unwrap().passed, 1);
    assert_eq!(
        nodes_with_verdict(&e.client, "pool", "Pass").await,
        vec!["gpu-a".to_string()]
    );
    let why = s.selection.as_deref().unwrap();
    assert!(
        why.contains("gpu-c (cordoned)")
            && why.contains(
                "cpu-0 (no allocatable nvidia.com/gpu and no GPU in ResourceSlices of driver gpu.nvidia.com)"
            ),
        "{why}"
    );

    // A named node that does not exist stalls the validation instead of retrying forever.
    apply(
        &e.client,
        "ghost",
        json!({"nodeNames": ["gpu-a", "ghost-node"], "checks": {"memory": {}}}),
    )
    .await;
    let gv = wait_terminal(&e.client, "ghost", 60).await;
    let stalled = conditions::find(&gv.status.as_ref().unwrap().conditions, STALLED).unwrap();
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "NodeNotFound")
    );
    assert!(stalled.message.contains("ghost-node"));
}

/// A check the installation cannot run (checks.io with no agent.io.hostPath) is the
/// installation's mistake, not the nodes': the run is refused before any agent starts, with a
/// Stalled condition and an event naming the Helm value, and no node is tainted or labelled
/// although the validation asks to taint failing nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_the_installation_cannot_run_refuses_the_run_and_leaves_nodes_alone() {
    let e = env(&["gpu-a", "gpu-b"]).await;
    let _op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    apply(
        &e.client,
        "noio",
        json!({"checks": {"memory": {}, "io": {}}, "onFailure": {"action": "Taint"}}),
    )
    .await;
    let gv = wait_terminal(&e.client, "noio", 60).await;
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Failed));
    let stalled = conditions::find(&s.conditions, STALLED).unwrap();
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "NotConfigured")
    );
    assert!(
        stalled.message.contains("agent.io.hostPath"),
        "{}",
        stalled.message
    );
    assert!(pods_of(&e.client, "noio").await.is_empty(), "no agent ran");
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(e.client.clone());
    let refused = gpuval_tests::waits::until(
        "the NotConfigured event",
        Duration::from_secs(30),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|ev| {
                ev.reason.as_deref() == Some("NotConfigured")
                    && ev
                        .note
                        .as_deref()
                        .is_some_and(|n| n.contains("agent.io.hostPath"))
            })
        },
    )
    .await;
    assert!(refused.is_ok(), "{refused:?}");
    let node_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(e.client.clone());
    for node in ["gpu-a", "gpu-b"] {
        let n = node_api.get(node).await.unwrap();
        let taints: Vec<String> = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        assert!(
            !taints.iter().any(|k| k.starts_with("gpuval.io")),
            "{node}: {taints:?}"
        );
        assert!(
            !n.metadata
                .labels
                .unwrap_or_default()
                .keys()
                .any(|k| k.starts_with("gpuval.io/verdict")),
            "{node} labelled"
        );
    }
}
