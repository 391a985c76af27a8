//! A node's state is a record, not the latest reading (issue 52, points 2 and 3), on a real
//! control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes) with the
//! operator in-process and agents run as processes by the FakeKubelet:
//! - a failure on hardware evidence stands through a shallower re-run that passes (the taint,
//!   the Fail label and `GpuValidated=False` stay) until a pass of the same depth clears it,
//!   and the `ReturnedToService` event names that run;
//! - a pass that turns the failed code down (a severity override) clears nothing;
//! - deleting the failing run lets no older pass resurface, and a pass of another validation
//!   (no schedule's, not the same) does not clear the failure;
//! - `GpuValidated` never blinks: through a re-run and the deletion of the run that set it, the
//!   condition stays with its status and its transition time, and while the re-run is under
//!   way its message says so;
//! - a GPU held by no pod (the kubelet's PodResources API says so on its socket) in runs in a
//!   row asks for a reset, a tenant's pod on it does not.
//!
//! The operator lets the simulated agents' results act on nodes (the test-only opt-in). Tests
//! wait on conditions (the node's record or marks, watches), never on sleeps.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use gpuval_crds::{GpuNodeResult, GpuValidation, Phase, labels};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::pod_resources::Held;
use gpuval_tests::scenario::Cluster;
use gpuval_tests::{nodes, waits};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
/// Simulated GPUs, fast.
const SIM: &str = "gpus=2,model=H200,timescale=0.001";
/// The same, with GPU 1's memory failing.
const SIM_GPU1_BAD: &str = "gpus=2,model=H200,timescale=0.001,fail=memory@1";
const CONDITION: &str = "GpuValidated";
const RECORD: &str = "gpuval.io/verdict-record";
const LONG: Duration = Duration::from_secs(240);

fn operator(client: &Client) -> OperatorHandle {
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    OperatorHandle::start(client.clone(), cfg)
}

fn condition(n: &Node) -> Option<&NodeCondition> {
    gpuval_tests::nodes::condition(n, CONDITION)
}

fn failure_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == labels::FAILED_NODE))
}

fn label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.labels().get(key).map(String::as_str)
}

/// The node's verdict record (JSON; null where it has none).
fn record(n: &Node) -> Value {
    n.annotations()
        .get(RECORD)
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or(Value::Null)
}

/// The verdict the node's record was last judged on: its run, time and whether it passed.
fn judged(n: &Node) -> Option<(String, String, bool)> {
    let j = record(n).get("judged")?.clone();
    Some((
        j["run"].as_str()?.to_string(),
        j["at"].as_str()?.to_string(),
        j["passed"].as_bool()?,
    ))
}

/// Runs `name` with `spec` (a new generation where it exists) and waits until it ended.
async fn run(c: &Cluster, name: &str, spec: Value) -> GpuValidation {
    c.apply(name, spec).await;
    c.wait_terminal(name, LONG.as_secs()).await
}

fn phase(gv: &GpuValidation) -> Option<Phase> {
    gv.status.as_ref().and_then(|s| s.phase)
}

/// The notes of the events with `reason` about node `node`, once there is one.
async fn node_events(client: &Client, node: &str, reason: &str) -> Vec<String> {
    waits::until(&format!("a {reason} event"), LONG, || async {
        let notes: Vec<String> = Api::<Event>::all(client.clone())
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
            })
            .filter_map(|e| e.note)
            .collect();
        (!notes.is_empty()).then_some(notes)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Asserts that `node` still stands failed by the run `run`: tainted, labelled Fail, False.
fn assert_failed(n: &Node, run: &str, after: &str) {
    assert!(failure_taint(n), "{after}: the failure taint stays: {n:?}");
    assert_eq!(label(n, labels::NODE_VERDICT), Some("Fail"), "{after}");
    assert_eq!(label(n, labels::VERDICT_RUN), Some(run), "{after}");
    assert_eq!(
        condition(n).map(|c| c.status.as_str()),
        Some("False"),
        "{after}: {:?}",
        condition(n)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shallow_re_run_that_passes_never_clears_a_deep_failure() {
    let node = "gpu-d";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    c.kubelet
        .set_node_env(node, "GPUVAL_SIMULATE", SIM_GPU1_BAD);
    let _op = operator(&c.client);
    let deep = |deadline: &str| {
        json!({"checks": {"memory": {"fraction": 0.5, "passes": 2}},
               "onFailure": {"action": "Taint"}, "deadline": deadline})
    };
    let gv = run(&c, "deep", deep("10m")).await;
    assert_eq!(phase(&gv), Some(Phase::Failed));
    // Tainted, and the failure in the node's record (the taint may come first: a spec edited
    // before the record holds the failure gives it the edited depth, see RELIABILITY.md).
    nodes::wait_node(&c.client, node, "tainted and recorded", LONG, |n| {
        failure_taint(n) && !record(n)["failures"].is_null()
    })
    .await;

    // Repaired, but the re-run looks at a quarter of the memory once: it passes, and clears
    // nothing.
    c.kubelet.set_node_env(node, "GPUVAL_SIMULATE", SIM);
    let shallow =
        json!({"checks": {"memory": {"fraction": 0.1}}, "onFailure": {"action": "Taint"}});
    let gv = run(&c, "deep", shallow).await;
    assert_eq!(phase(&gv), Some(Phase::Passed));
    let seen = nodes::wait_node(&c.client, node, "the shallow pass judged", LONG, |n| {
        judged(n).is_some_and(|(_, _, passed)| passed) || !failure_taint(n)
    })
    .await;
    assert_failed(&seen, "deep", "a shallower pass");
    let standing = record(&seen);
    assert_eq!(standing["failures"][0]["run"], "deep", "{standing}");
    assert_eq!(
        standing["failures"][0]["depth"]["checks"]["memory"]["fraction"], 0.5,
        "{standing}"
    );

    // The same depth again: the failure is covered, the node returns to service.
    let gv = run(&c, "deep", deep("11m")).await;
    assert_eq!(phase(&gv), Some(Phase::Passed));
    let back = nodes::wait_node(&c.client, node, "returned to service", LONG, |n| {
        !failure_taint(n)
            && label(n, labels::NODE_VERDICT) == Some("Pass")
            && record(n)["failures"].is_null()
    })
    .await;
    assert_eq!(condition(&back).map(|c| c.status.as_str()), Some("True"));
    let notes = node_events(&c.client, node, "ReturnedToService").await;
    assert!(notes.iter().all(|n| n.contains("deep")), "{notes:?}");
}

/// A re-run as deep as the failing run that passes only because it turns the failed code down
/// (a severity override) proves nothing about the memory: the failure stands, with the GPU
/// still bad and after the override is dropped again on a repaired one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_overrides_the_failed_code_clears_nothing() {
    let node = "gpu-o";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    c.kubelet
        .set_node_env(node, "GPUVAL_SIMULATE", SIM_GPU1_BAD);
    let _op = operator(&c.client);
    let memory = json!({"checks": {"memory": {"fraction": 0.2}}, "onFailure": {"action": "Taint"}});
    assert_eq!(
        phase(&run(&c, "strict", memory.clone()).await),
        Some(Phase::Failed)
    );
    nodes::wait_node(&c.client, node, "tainted and recorded", LONG, |n| {
        failure_taint(n) && !record(n)["failures"].is_null()
    })
    .await;

    // The same depth with MemoryMismatch turned down to a warning: the run passes on the same
    // bad GPU, and clears nothing.
    let mut lenient = memory.clone();
    lenient["severityOverrides"] = json!([{"code": "MemoryMismatch", "severity": "Warn"}]);
    assert_eq!(
        phase(&run(&c, "strict", lenient).await),
        Some(Phase::Passed)
    );
    let seen = nodes::wait_node(&c.client, node, "the lenient pass judged", LONG, |n| {
        judged(n).is_some_and(|(_, _, passed)| passed) || !failure_taint(n)
    })
    .await;
    assert_failed(&seen, "strict", "a pass with the failed code overridden");
    assert_eq!(
        record(&seen)["failures"][0]["run"],
        "strict",
        "{}",
        record(&seen)
    );

    // Repaired, and the same spec without the override: that pass covers it.
    c.kubelet.set_node_env(node, "GPUVAL_SIMULATE", SIM);
    let mut again = memory;
    again["deadline"] = json!("11m");
    assert_eq!(phase(&run(&c, "strict", again).await), Some(Phase::Passed));
    nodes::wait_node(&c.client, node, "returned to service", LONG, |n| {
        !failure_taint(n)
            && label(n, labels::NODE_VERDICT) == Some("Pass")
            && record(n)["failures"].is_null()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_failing_run_lets_no_older_or_foreign_pass_clear_it() {
    let node = "gpu-b";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    let _op = operator(&c.client);
    let memory = json!({"checks": {"memory": {"fraction": 0.1}}, "onFailure": {"action": "Taint"}});
    assert_eq!(
        phase(&run(&c, "early", memory.clone()).await),
        Some(Phase::Passed)
    );
    nodes::wait_node(&c.client, node, "labelled Pass", LONG, |n| {
        label(n, labels::NODE_VERDICT) == Some("Pass")
    })
    .await;
    c.kubelet
        .set_node_env(node, "GPUVAL_SIMULATE", SIM_GPU1_BAD);
    assert_eq!(
        phase(&run(&c, "failing", memory.clone()).await),
        Some(Phase::Failed)
    );
    nodes::wait_node(&c.client, node, "tainted", LONG, failure_taint).await;

    // The failing run goes (its results with it): the older pass of "early" is no news.
    let gvs = Api::<GpuValidation>::all(c.client.clone());
    gvs.delete("failing", &DeleteParams::background())
        .await
        .expect("delete the failing run");
    waits::until_gone(&gvs, "failing", LONG)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // A pass of another validation (no schedule's, not the failing one's) is news, judged, and
    // clears nothing.
    c.kubelet.set_node_env(node, "GPUVAL_SIMULATE", SIM);
    assert_eq!(phase(&run(&c, "later", memory).await), Some(Phase::Passed));
    let seen = nodes::wait_node(&c.client, node, "the later pass judged", LONG, |n| {
        judged(n).is_some_and(|(run, _, _)| run == "later") || !failure_taint(n)
    })
    .await;
    assert_failed(
        &seen,
        "failing",
        "the failing run deleted, a foreign pass later",
    );
    assert_eq!(record(&seen)["failures"][0]["run"], "failing");
}

/// Every `GpuValidated` condition the watch of node `node` sees (None: the node had none).
fn watch_condition(client: &Client, node: &str) -> Arc<Mutex<Vec<Option<NodeCondition>>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let api: Api<Node> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let into = seen.clone();
    tokio::spawn(async move {
        let mut nodes = watcher(api, config).applied_objects().boxed();
        while let Some(Ok(n)) = nodes.next().await {
            if let Ok(mut v) = into.lock() {
                v.push(condition(&n).cloned());
            }
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_condition_keeps_its_status_through_a_re_run_and_a_deletion() {
    let node = "gpu-c";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    let _op = operator(&c.client);
    let spec =
        |deadline: &str| json!({"checks": {"memory": {"fraction": 0.1}}, "deadline": deadline});
    assert_eq!(
        phase(&run(&c, "keep", spec("10m")).await),
        Some(Phase::Passed)
    );
    let first = nodes::wait_node(&c.client, node, "GpuValidated=True", LONG, |n| {
        condition(n).is_some_and(|c| c.status == "True")
    })
    .await;
    let since = condition(&first).and_then(|c| c.last_transition_time.clone());
    let beat = condition(&first).and_then(|c| c.last_heartbeat_time.clone());
    let seen = watch_condition(&c.client, node);

    // A re-run: the node keeps True while it is under way, and the pass moves the heartbeat
    // only.
    assert_eq!(
        phase(&run(&c, "keep", spec("11m")).await),
        Some(Phase::Passed)
    );
    // Judged: the record names the re-run's generation (its heartbeat moves too, unless both
    // runs ended within the same whole second, which a Time cannot tell apart).
    nodes::wait_node(&c.client, node, "the re-run's pass", LONG, move |n| {
        record(n)["judged"]["generation"] == 2
            && condition(n).is_some_and(|c| c.status == "True" && c.last_heartbeat_time >= beat)
    })
    .await;
    // The run that set it goes; another pass later is the news the node waits for.
    let gvs = Api::<GpuValidation>::all(c.client.clone());
    gvs.delete("keep", &DeleteParams::background())
        .await
        .expect("delete the run");
    waits::until_gone(&gvs, "keep", LONG)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        phase(&run(&c, "other", spec("10m")).await),
        Some(Phase::Passed)
    );
    let last = nodes::wait_node(&c.client, node, "the other run's pass", LONG, |n| {
        label(n, labels::VERDICT_RUN) == Some("other")
    })
    .await;
    assert_eq!(
        condition(&last).and_then(|c| c.last_transition_time.clone()),
        since,
        "the status never flipped"
    );
    let seen = seen.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(!seen.is_empty());
    for c in &seen {
        let c = c
            .as_ref()
            .unwrap_or_else(|| panic!("the condition blinked: {seen:?}"));
        assert_eq!(c.status, "True", "{seen:?}");
        assert_eq!(c.last_transition_time, since, "{seen:?}");
    }
    assert!(
        seen.iter().flatten().any(|c| c
            .message
            .as_deref()
            .is_some_and(|m| m.contains("a run is under way"))),
        "while the re-run is under way the message says so: {seen:?}"
    );
}

/// The same simulated GPUs, GPU 0 held by a process that is not the agent's: busy.
const SIM_BUSY: &str = "gpus=2,model=H200,timescale=0.001,proc=0:4242:python3:10240";

/// No evidence for too long is a signal (issue 52, point 5): with the administrator's
/// `unknownAfterNonEvidence: 2`, one busy run leaves the pass as it is, the second in a row turns
/// `GpuValidated` `Unknown` (reason `NoRecentEvidence`, naming the busy run and the last
/// hardware evidence), and the next hardware pass sets it `True` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_streak_turns_the_condition_unknown_where_the_administrator_asks() {
    let node = "gpu-q";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    cfg.unknown_after_non_evidence = 2;
    let _op = OperatorHandle::start(c.client.clone(), cfg);
    let spec = json!({"checks": {"memory": {"fraction": 0.1}}});
    assert_eq!(
        phase(&run(&c, "base", spec.clone()).await),
        Some(Phase::Passed)
    );
    nodes::wait_node(&c.client, node, "GpuValidated=True", LONG, |n| {
        condition(n).is_some_and(|c| c.status == "True")
    })
    .await;

    c.kubelet.set_node_env(node, "GPUVAL_SIMULATE", SIM_BUSY);
    assert_ne!(
        phase(&run(&c, "busy-1", spec.clone()).await),
        Some(Phase::Passed)
    );
    let once = nodes::wait_node(&c.client, node, "one busy line counted", LONG, |n| {
        record(n)["quiet"]["lines"] == 1
    })
    .await;
    assert_eq!(
        condition(&once).map(|c| c.status.as_str()),
        Some("True"),
        "one busy run is no signal: {:?}",
        condition(&once)
    );
    assert_ne!(
        phase(&run(&c, "busy-2", spec.clone()).await),
        Some(Phase::Passed)
    );
    let quiet = nodes::wait_node(&c.client, node, "GpuValidated=Unknown", LONG, |n| {
        condition(n).is_some_and(|c| c.status == "Unknown")
    })
    .await;
    let cond = condition(&quiet).cloned().unwrap_or_default();
    assert_eq!(cond.reason.as_deref(), Some("NoRecentEvidence"), "{cond:?}");
    let message = cond.message.unwrap_or_default();
    for want in ["2 runs in a row", "Busy", "busy-2", "GpuValidation base"] {
        assert!(message.contains(want), "{want}: {message}");
    }
    assert_eq!(
        label(&quiet, labels::NODE_VERDICT),
        Some("Pass"),
        "the labels stay"
    );

    // Hardware evidence again: True, and the streak is over.
    c.kubelet.set_node_env(node, "GPUVAL_SIMULATE", SIM);
    assert_eq!(
        phase(
            &run(
                &c,
                "base",
                json!({"checks": {"memory": {"fraction": 0.1}}, "deadline": "11m"})
            )
            .await
        ),
        Some(Phase::Passed)
    );
    // (The record is written after the condition: wait for both.)
    nodes::wait_node(&c.client, node, "True again, the streak over", LONG, |n| {
        condition(n).is_some_and(|c| c.status == "True") && record(n)["quiet"].is_null()
    })
    .await;
}

fn admitted(n: &Node) -> Option<&NodeCondition> {
    gpuval_tests::nodes::condition(n, labels::ADMITTED_CONDITION)
}

/// Admission stays the administrator's (issue 52, point 4), with the cluster's taint
/// controller (`nodeTaints: cluster`): a pass of a validation any author may write sets
/// `GpuValidated=True` but leaves `GpuAdmitted` (the condition the Node Readiness Controller
/// rule reads) `Unknown` and the node without `gpuval.io/admission`, so an `untestedNodes` gate
/// still tests it; the gate's own pass admits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_run_whose_author_may_admit_makes_a_node_admitted() {
    let node = "gpu-u";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    cfg.node_taints = gpuval_operator::settings::config::NodeTaints::Cluster;
    let _op = OperatorHandle::start(c.client.clone(), cfg);
    let spec = json!({"checks": {"memory": {"fraction": 0.1}}});
    assert_eq!(
        phase(&run(&c, "trivial", spec.clone()).await),
        Some(Phase::Passed)
    );
    let seen = nodes::wait_node(&c.client, node, "GpuValidated=True", LONG, |n| {
        condition(n).is_some_and(|c| c.status == "True") && admitted(n).is_some()
    })
    .await;
    let a = admitted(&seen).cloned().unwrap_or_default();
    assert_eq!(
        (a.status.as_str(), a.reason.as_deref()),
        ("Unknown", Some("NotAdmitted")),
        "another author's pass never admits: {a:?}"
    );
    assert_eq!(label(&seen, labels::ADMISSION), None);

    // The administrator's gate takes the node for untested and admits it.
    let schedule = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidationSchedule",
        "metadata": {"name": "gate"},
        "spec": {"admission": {"debounce": "1s", "untestedNodes": true}, "template": spec}});
    Api::<gpuval_crds::GpuValidationSchedule>::all(c.client.clone())
        .patch(
            "gate",
            &kube::api::PatchParams::apply("verdict-record"),
            &kube::api::Patch::Apply(&schedule),
        )
        .await
        .expect("apply the schedule");
    // (The record is written after the condition: wait for both.)
    let admitted_node = nodes::wait_node(&c.client, node, "GpuAdmitted=True", LONG, |n| {
        admitted(n).is_some_and(|a| a.status == "True") && record(n)["admission"].is_object()
    })
    .await;
    assert_eq!(label(&admitted_node, labels::ADMISSION), Some("Pass"));
    let by = record(&admitted_node)["admission"]["run"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(by.starts_with("gate-admit-"), "{by}");
    let a = admitted(&admitted_node).cloned().unwrap_or_default();
    assert!(
        a.message.as_deref().is_some_and(|m| m.contains(&by)),
        "{a:?}"
    );
}

/// GPU 1 busy with memory and load (pid 4242, outside the agent's PID namespace).
const SIM_HELD: &str = "gpus=2,model=H200,timescale=0.001,pidns=1,proc=1:4242:python3:20480:0.5";

/// A GPU stuck after a fault (issue 52, point 5): memory and load on GPU 1 that no pod holds,
/// as the kubelet's PodResources API tells the agent on its node's socket, in two runs in a row
/// sets `gpuval.io/action=ResetGpu` and leads the condition's message with the finding while the
/// condition keeps its status (no hardware verdict); the same load held by a tenant's pod is
/// only busy, and no reset is asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_held_by_no_pod_in_runs_in_a_row_asks_for_a_reset() {
    let (stuck, tenant) = ("gpu-s", "gpu-t");
    let c = Cluster::start(NS, &[stuck.to_string(), tenant.to_string()], 2).await;
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    cfg.agent_pod_resources = true;
    let _op = OperatorHandle::start(c.client.clone(), cfg);
    c.kubelet.serve_pod_resources(stuck, Vec::new());
    let trainer = Held::gpus("ml", "trainer-0", &[gpuval_tests::dra::sim_uuid(1)]);
    c.kubelet.serve_pod_resources(tenant, vec![trainer]);
    let spec = json!({"checks": {"memory": {"fraction": 0.1}}});
    assert_eq!(
        phase(&run(&c, "base", spec.clone()).await),
        Some(Phase::Passed)
    );
    for node in [stuck, tenant] {
        nodes::wait_node(&c.client, node, "GpuValidated=True", LONG, |n| {
            condition(n).is_some_and(|c| c.status == "True")
        })
        .await;
        c.kubelet
            .set_node_env(node, gpuval_crds::agent_env::SIMULATE, SIM_HELD);
    }
    for (runs, name) in [(1u64, "held-1"), (2, "held-2")] {
        let gv = run(&c, name, spec.clone()).await;
        assert_ne!(phase(&gv), Some(Phase::Passed), "busy is no pass");
        let status = gv.status.clone().unwrap_or_default();
        let line = |node: &str| status.nodes.iter().find(|l| l.name == node).cloned();
        let held = line(stuck).and_then(|l| l.codes).unwrap_or_default();
        assert!(held.contains("GpuHeldByNoPod"), "{held}: {status:#?}");
        let busy = line(tenant).expect("the tenant's line");
        let codes = busy.codes.clone().unwrap_or_default();
        assert!(
            !codes.contains("GpuHeldByNoPod") && codes.contains("GpuBusy"),
            "{codes}"
        );
        let results = Api::<GpuNodeResult>::namespaced(c.client.clone(), NS);
        let r = results
            .get(&gpuval_crds::result::result_name(name, tenant))
            .await
            .expect("the tenant's result");
        let gpu1 = r
            .status
            .and_then(|s| s.gpus.into_iter().find(|g| g.index == 1));
        let says: Vec<String> = gpu1
            .iter()
            .flat_map(|g| &g.reasons)
            .map(|x| x.message.clone())
            .collect();
        assert!(
            says.iter()
                .any(|m| m.contains("the kubelet lists pod ml/trainer-0")),
            "the kubelet names the pod: {says:?}"
        );
        for node in [stuck, tenant] {
            nodes::wait_node(&c.client, node, "the busy line counted", LONG, move |n| {
                record(n)["quiet"]["lines"] == runs
            })
            .await;
        }
    }
    let n = nodes::wait_node(&c.client, stuck, "asked to reset the GPU", LONG, |n| {
        label(n, labels::ACTION) == Some("ResetGpu")
    })
    .await;
    let cond = condition(&n).cloned().unwrap_or_default();
    assert_eq!(cond.status, "True", "no hardware verdict: {cond:?}");
    let message = cond.message.unwrap_or_default();
    assert!(
        message.starts_with("[GpuHeldByNoPod; action ResetGpu]") && message.contains("held-2"),
        "{message}"
    );
    assert!(
        !failure_taint(&n),
        "a stuck GPU is no failure on hardware evidence"
    );
    let t = Api::<Node>::all(c.client.clone())
        .get(tenant)
        .await
        .expect("the tenant's node");
    assert_ne!(
        label(&t, labels::ACTION),
        Some("ResetGpu"),
        "a tenant's work is no stuck GPU"
    );
    assert_eq!(record(&t)["quiet"]["unheld"], Value::Null, "{}", record(&t));
    assert_eq!(condition(&t).map(|c| c.status.as_str()), Some("True"));
}
