//! One final line per node, and only hardware evidence acts on a node (issue 43), on a real
//! control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes) with the
//! operator in-process and agents run as processes by the FakeKubelet:
//! - a node the fabric test names is never labelled Pass, never `GpuValidated=True`, keeps
//!   its admission taint and gets no passing certificate (its own checks passed first);
//! - a registry outage (agent pods in ErrImagePull / ImagePullBackOff) and an evicted agent
//!   pod leave every node's labels, taints and `GpuValidated` condition as they were, while
//!   the validation says what to fix;
//! - a result that carries no report (from a pod that never ran) never makes its node
//!   `GpuValidated=True`.
//!
//! The operator lets the simulated agents' results act on nodes (the test-only opt-in). Tests
//! wait on conditions (watches, the wait helpers), never on sleeps. RELIABILITY.md and
//! SECURITY.md name what each proves.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuval_crds::{Evidence, GpuNodeResult, GpuValidation, NodeVerdict, Phase, labels};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{self, Cluster, node_line};
use gpuval_tests::{nodes, waits};
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeCondition, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
/// Simulated GPUs, fast.
const SIM: &str = "gpus=2,model=H200,timescale=0.001";
const UNVALIDATED: &str = "gpuval.io/unvalidated";
const CONDITION: &str = "GpuValidated";
const LONG: Duration = Duration::from_secs(240);

/// An operator whose simulated agents' results act on nodes, its fabric groups on ports from
/// `fabric_port` (tests run in parallel on one host).
fn operator(client: &Client, fabric_port: u16) -> OperatorHandle {
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    cfg.fabric.port = fabric_port;
    OperatorHandle::start(client.clone(), cfg)
}

/// What gpuval may change on a node: its labels, its taints and its `GpuValidated` condition.
#[derive(Debug, Clone, PartialEq)]
struct NodeMarks {
    labels: BTreeMap<String, String>,
    taints: Vec<(String, Option<String>, String)>,
    condition: Option<(String, Option<String>, Option<String>)>,
}

fn condition(n: &Node) -> Option<&NodeCondition> {
    gpuval_tests::nodes::condition(n, CONDITION)
}

fn marks(n: &Node) -> NodeMarks {
    NodeMarks {
        labels: n.labels().clone(),
        taints: n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|t| (t.key, t.value, t.effect))
            .collect(),
        condition: condition(n).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone())),
    }
}

fn has_taint(n: &Node, key: &str) -> bool {
    marks(n).taints.iter().any(|(k, _, _)| k == key)
}

async fn marks_of(client: &Client, node: &str) -> NodeMarks {
    let n = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .expect("node");
    marks(&n)
}

/// The node certificate's signed verdict for `node` in validation `validation`.
async fn certified_verdict(client: &Client, validation: &str, node: &str) -> String {
    let selector = format!(
        "gpuval.io/certificate=node,{}={validation},{}={node}",
        labels::VALIDATION,
        labels::NODE
    );
    let maps = waits::until("the node's certificate", LONG, || async {
        Api::<ConfigMap>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()
            .map(|l| l.items)
            .filter(|items| !items.is_empty())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let data = maps[0]
        .data
        .as_ref()
        .and_then(|d| d.get("certificate.json"))
        .expect("certificate.json");
    let signed: Value = serde_json::from_str(data).expect("certificate JSON");
    signed["document"]["verdict"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The admission run of schedule `schedule`, once it has ended.
async fn finished_admission_run(client: &Client, schedule: &str) -> GpuValidation {
    let selector = format!("{}={schedule}", labels::SCHEDULE);
    waits::until("the admission run to finish", LONG, || async {
        Api::<GpuValidation>::all(client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|v| scenario::terminal_for_generation(Some(v)))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_fabric_names_is_never_pass_nor_admitted_nor_certified() {
    let nodes = ["gpu-00", "gpu-01", "gpu-02", "gpu-03"];
    let c = Cluster::start(NS, &[], 2).await;
    // gpu-03 cannot start NCCL: its own checks pass, then the fabric test names it.
    c.kubelet.set_node_env(
        "gpu-03",
        "GPUVAL_SIMULATE",
        &format!("{SIM},netfault=local"),
    );
    for n in nodes {
        nodes::tainted_node(&c.client, n, UNVALIDATED, LONG).await;
    }
    let _op = operator(&c.client, 32100);
    let schedule = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidationSchedule",
        "metadata": {"name": "gate"},
        "spec": {"admission": {"debounce": "1s"}, "template": {
            "checks": {"memory": {"fraction": 0.1}},
            "fabric": {"nccl": {"minBusBandwidthGbps": 350}, "tcp": {"streams": 2, "duration": "1s"},
                       "roundTimeout": "60s"}}}});
    Api::<gpuval_crds::GpuValidationSchedule>::all(c.client.clone())
        .patch(
            "gate",
            &PatchParams::apply("evidence"),
            &Patch::Apply(&schedule),
        )
        .await
        .expect("schedule");

    let run = finished_admission_run(&c.client, "gate").await;
    let name = run.name_any();
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    let fabric = status.fabric.clone().expect("fabric status");
    assert_eq!(fabric.failed_nodes, ["gpu-03"], "{fabric:?}");

    // The healthy nodes are admitted and labelled Pass: the operator acted on this run.
    for n in ["gpu-00", "gpu-01", "gpu-02"] {
        let node = nodes::wait_node(&c.client, n, "admitted and Pass", LONG, |n| {
            !has_taint(n, UNVALIDATED) && condition(n).is_some_and(|c| c.status == "True")
        })
        .await;
        assert_eq!(node.labels()[labels::NODE_VERDICT], "Pass", "{n}");
    }
    // The named node: Fail, GpuValidated=False, kept out with the failure taint.
    let named = nodes::wait_node(&c.client, "gpu-03", "marked failed", LONG, |n| {
        has_taint(n, labels::FAILED_NODE) && condition(n).is_some()
    })
    .await;
    let m = marks(&named);
    assert_eq!(
        m.labels.get(labels::NODE_VERDICT).map(String::as_str),
        Some("Fail"),
        "{m:?}"
    );
    let (cond, reason, _) = m.condition.clone().expect("condition");
    assert_eq!(
        (cond.as_str(), reason.as_deref()),
        ("False", Some("Failed"))
    );
    assert!(
        has_taint(&named, UNVALIDATED),
        "kept its admission taint: {m:?}"
    );

    // Certificates: the named node's signs no pass; a healthy node's does.
    assert_eq!(certified_verdict(&c.client, &name, "gpu-03").await, "Fail");
    assert_eq!(certified_verdict(&c.client, &name, "gpu-00").await, "Pass");
    // Still, after all of that: never admitted, never Pass.
    let m = marks_of(&c.client, "gpu-03").await;
    assert!(m.taints.iter().any(|(k, _, _)| k == UNVALIDATED), "{m:?}");
    assert_ne!(
        m.labels.get(labels::NODE_VERDICT).map(String::as_str),
        Some("Pass")
    );
    let line = status
        .nodes
        .iter()
        .find(|l| l.name == "gpu-03")
        .expect("listed");
    assert_eq!(
        (line.verdict, line.evidence),
        (NodeVerdict::Failed, Some(Evidence::Hardware))
    );
}

/// The agent pods of validation `name` (generation 1), once there are `n`, each bound to its
/// node by the scheduler.
async fn bound_pods(client: &Client, name: &str, n: usize) -> Vec<Pod> {
    let selector = format!("{}={name},{}=1", labels::VALIDATION, labels::GENERATION);
    waits::until("agent pods bound to their nodes", LONG, || async {
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items;
        let bound = pods
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        (bound == n).then_some(pods)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Stages pod `p`'s status as a kubelet would write it.
async fn stage(client: &Client, p: &Pod, status: Value) {
    Api::<Pod>::namespaced(client.clone(), NS)
        .patch_status(
            &p.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .expect("stage the pod's status");
}

/// The status of an agent pod whose image cannot be pulled (`reason`: ErrImagePull or
/// ImagePullBackOff).
fn cannot_pull(p: &Pod, reason: &str) -> Value {
    let container = p
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .unwrap_or_default();
    json!({"phase": "Pending", "containerStatuses": [{
        "name": container.0, "image": container.1, "imageID": "", "ready": false,
        "restartCount": 0, "started": false,
        "state": {"waiting": {"reason": reason,
            "message": format!("failed to pull image \"{}\": registry unavailable", container.1)}},
    }]})
}

fn node_of(p: &Pod) -> String {
    p.annotations()[labels::NODE].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_outage_and_an_evicted_agent_leave_every_node_as_it_was() {
    let validated = ["gpu-a", "gpu-b", "gpu-c"];
    let all = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"];
    let names: Vec<String> = validated.iter().map(|n| n.to_string()).collect();
    let c = Cluster::start(NS, &names, 2).await;
    let _op = operator(&c.client, 32200);
    // A first run passes: the nodes are labelled Pass with GpuValidated=True.
    c.apply("before", json!({"checks": {"memory": {"fraction": 0.1}}}))
        .await;
    let gv = c.wait_terminal("before", LONG.as_secs()).await;
    assert_eq!(gv.status.and_then(|s| s.phase), Some(Phase::Passed));
    for n in validated {
        nodes::wait_node(&c.client, n, "labelled Pass", LONG, |n| {
            condition(n).is_some_and(|c| c.status == "True")
        })
        .await;
    }
    // A node that has never been validated.
    scenario::ready_gpu_nodes(&c.client, &["gpu-d"], 2, &[], LONG).await;
    // The registry goes down: no agent container can start any more.
    let Cluster {
        cp,
        client,
        kubelet,
        ..
    } = c;
    drop(kubelet);
    let mut before = BTreeMap::new();
    for n in all {
        before.insert(n, marks_of(&client, n).await);
    }

    scenario::apply_validation(
        &client,
        "evidence",
        "outage",
        json!({"checks": {"memory": {}}, "onFailure": {"action": "Taint"}}),
    )
    .await;
    for p in bound_pods(&client, "outage", 4).await {
        let status = match node_of(&p).as_str() {
            "gpu-a" => cannot_pull(&p, "ErrImagePull"),
            "gpu-b" | "gpu-d" => cannot_pull(&p, "ImagePullBackOff"),
            _ => json!({"phase": "Failed", "reason": "Evicted",
                        "message": "The node was low on resource: memory."}),
        };
        stage(&client, &p, status).await;
    }
    let gv = scenario::wait_validation(&client, "outage", LONG, "finished", scenario::terminal)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The node without a verdict says why it has none (the node-state controller has seen
    // the run's end)...
    let fresh = nodes::wait_node(&client, "gpu-d", "GpuValidated=Unknown", LONG, |n| {
        condition(n).is_some()
    })
    .await;
    let (status, reason, _) = marks(&fresh).condition.expect("condition");
    assert_eq!(
        (status.as_str(), reason.as_deref()),
        ("Unknown", Some("Infrastructure"))
    );
    // ...and once the registry is back, a run on it passes: everything before was handled.
    let kubelet = scenario::start_kubelet(&client, cp.kubeconfig().to_path_buf(), NS);
    scenario::apply_validation(
        &client,
        "evidence",
        "after",
        json!({"nodeNames": ["gpu-d"], "checks": {"memory": {"fraction": 0.1}}}),
    )
    .await;
    nodes::wait_node(&client, "gpu-d", "GpuValidated=True", LONG, |n| {
        condition(n).is_some_and(|c| c.status == "True")
    })
    .await;
    drop(kubelet);
    for n in validated {
        let after = marks_of(&client, n).await;
        assert_eq!(
            after, before[n],
            "{n}: its labels, taints and condition changed"
        );
    }
    let d = marks_of(&client, "gpu-d").await;
    assert!(
        !d.taints.iter().any(|(k, _, _)| k == labels::FAILED_NODE),
        "{d:?}"
    );
    // The validation says what to fix, node by node.
    for (n, fix) in [
        ("gpu-a", "cannot be pulled"),
        ("gpu-b", "cannot be pulled"),
        ("gpu-c", "evicted"),
        ("gpu-d", "cannot be pulled"),
    ] {
        let (verdict, message) = node_line(&gv, n).expect("listed");
        assert_eq!(verdict, NodeVerdict::Error, "{n}: {message}");
        assert!(message.contains(fix), "{n}: {message}");
        let line = gv
            .status
            .as_ref()
            .and_then(|s| s.nodes.iter().find(|l| l.name == n));
        assert_eq!(
            line.and_then(|l| l.evidence),
            Some(Evidence::Infrastructure),
            "{n}"
        );
    }
    drop(cp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_without_a_report_never_makes_its_node_validated() {
    let c = Cluster::start(NS, &["gpu-a".to_string()], 2).await;
    let Cluster {
        cp,
        client,
        kubelet,
        ..
    } = c;
    // No kubelet: the agent pod is bound but never runs.
    drop(kubelet);
    let _op = operator(&client, 32300);
    scenario::apply_validation(
        &client,
        "evidence",
        "noreport",
        json!({"checks": {"memory": {}}, "deadline": "30s"}),
    )
    .await;
    let pod = bound_pods(&client, "noreport", 1).await.remove(0);
    // The result the operator made with the pod (bound to it), labelled Pass by its agent's
    // identity, with no report. Waited for first: planted before the operator's own create, it
    // would race the operator for the result's metadata.
    let name = gpuval_crds::result::result_name("noreport", "gpu-a");
    let results = Api::<GpuNodeResult>::namespaced(client.clone(), NS);
    let bound = waits::until("the operator's result", LONG, || async {
        results.get_opt(&name).await.ok().flatten()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        bound.annotations().get(labels::POD).map(String::as_str),
        Some(pod.name_any().as_str()),
        "bound to the pod"
    );
    let labelled = json!({"metadata": {"labels": {labels::VERDICT: "Pass"}}});
    let agent = PatchParams {
        field_manager: Some("gpuval-agent/gpu-a".into()),
        ..Default::default()
    };
    results
        .patch(&name, &agent, &Patch::Merge(&labelled))
        .await
        .expect("plant a verdict without a report");

    // The node-state controller decides about the node once the run has a line for it.
    let node = nodes::wait_node(&client, "gpu-a", "a GpuValidated condition", LONG, |n| {
        condition(n).is_some()
    })
    .await;
    let m = marks(&node);
    let (status, _, _) = m.condition.clone().expect("condition");
    assert_ne!(status, "True", "{m:?}");
    assert_ne!(
        m.labels.get(labels::NODE_VERDICT).map(String::as_str),
        Some("Pass"),
        "{m:?}"
    );
    let gv = Api::<GpuValidation>::all(client.clone())
        .get("noreport")
        .await
        .expect("validation");
    assert_ne!(
        gv.status.and_then(|s| s.phase),
        Some(Phase::Passed),
        "a result without a report is no pass"
    );
    drop(cp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_managed_fields_on_a_result_without_a_report_pass_nothing() {
    let c = Cluster::start(NS, &["gpu-a".to_string()], 2).await;
    let Cluster {
        cp,
        client,
        kubelet,
        ..
    } = c;
    // No kubelet: the agent pod is bound but never runs, so no report is ever stored.
    drop(kubelet);
    let _op = operator(&client, 32320);
    scenario::apply_validation(
        &client,
        "evidence",
        "forged",
        json!({"checks": {"memory": {}}, "deadline": "30s"}),
    )
    .await;
    bound_pods(&client, "forged", 1).await;
    let name = gpuval_crds::result::result_name("forged", "gpu-a");
    let results = Api::<GpuNodeResult>::namespaced(client.clone(), NS);
    waits::until("the operator's result", LONG, || async {
        results.get_opt(&name).await.ok().flatten()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // What a writer can say about itself: a Pass label and a managedFields entry claiming that
    // the agent stored the status, dated far in the future. No status at all.
    let forged = json!({"metadata": {
        "labels": {labels::VERDICT: "Pass"},
        "managedFields": [{
            "manager": "gpuval-agent/gpu-a",
            "operation": "Update",
            "apiVersion": "gpuval.io/v1alpha1",
            "time": "2099-01-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {}},
            "subresource": "status",
        }],
    }});
    let agent = PatchParams {
        field_manager: Some("gpuval-agent/gpu-a".into()),
        ..Default::default()
    };
    results
        .patch(&name, &agent, &Patch::Merge(&forged))
        .await
        .expect("forge a report");
    let stored = results.get(&name).await.expect("result");
    assert!(stored.status.is_none(), "no report is stored");

    // The run ends (its deadline) without a verdict about the node.
    let gvs = Api::<GpuValidation>::all(client.clone());
    let gv = waits::until("the run to end", LONG, || async {
        gvs.get_opt("forged")
            .await
            .ok()
            .flatten()
            .filter(|g| scenario::terminal_for_generation(Some(g)))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed),
        "forged managedFields are no report: {}",
        scenario::status_now(&gvs, "forged").await
    );
    let node = nodes::wait_node(&client, "gpu-a", "a GpuValidated condition", LONG, |n| {
        condition(n).is_some()
    })
    .await;
    let m = marks(&node);
    let (status, _, _) = m.condition.clone().expect("condition");
    assert_ne!(status, "True", "{m:?}");
    assert!(
        !m.labels.contains_key(labels::VALIDATED_AT),
        "no verdict, no date: {m:?}"
    );
    let certificates = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels("gpuval.io/certificate=node"))
        .await
        .expect("certificates");
    assert!(
        certificates.items.iter().all(|c| !c
            .data
            .iter()
            .flatten()
            .any(|(_, v)| v.contains("\"Pass\""))),
        "no passing certificate"
    );
    drop(cp);
}
