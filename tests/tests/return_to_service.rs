//! A node's failure marks are durable and taken back on proof (issue 43, points 4 to 6), on a
//! real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes) with
//! the operator in-process and agents run as processes by the FakeKubelet:
//! - a hardware failure under `spec.onFailure: Taint` taints the node even where the API server
//!   refuses the write for a while (the operator tries again with backoff until it holds; a 409
//!   Conflict is read again and retried the same way); a later run that passes removes the taint, labels the node Pass with the run that
//!   proved it (`gpuval.io/verdict-run`, the `GpuValidated` message) and says so in a
//!   `ReturnedToService` event;
//! - a node failed on hardware evidence in two runs within the window is a repeat offender
//!   (label, message naming both runs and the GPU that failed in both, event);
//! - a node deleted and created again under its name starts with no verdict, and the marks
//!   written for a node read before it was deleted create no Node and mark no successor.
//!
//! The operator lets the simulated agents' results act on nodes (the test-only opt-in). Tests
//! wait on conditions, never on sleeps.

use std::time::Duration;

use gpuval_crds::{Phase, labels};
use gpuval_tests::nodes;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::Cluster;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const NS: &str = "gpuval-system";
/// Simulated GPUs, fast.
const SIM: &str = "gpus=2,model=H200,timescale=0.001";
/// The same, with GPU 1's memory failing.
const SIM_GPU1_BAD: &str = "gpus=2,model=H200,timescale=0.001,fail=memory@1";
const CONDITION: &str = "GpuValidated";
const LONG: Duration = Duration::from_secs(240);

fn operator(client: &Client) -> OperatorHandle {
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    OperatorHandle::start(client.clone(), cfg)
}

fn condition(n: &Node) -> Option<&NodeCondition> {
    gpuval_tests::nodes::condition(n, CONDITION)
}

fn failure_taint(n: &Node) -> Option<String> {
    n.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == labels::FAILED_NODE)
        .map(|t| format!("{}:{}", t.value.clone().unwrap_or_default(), t.effect))
}

fn label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.labels().get(key).map(String::as_str)
}

/// The notes of the events with `reason` about node `node`.
async fn node_events(client: &Client, node: &str, reason: &str) -> Vec<String> {
    gpuval_tests::waits::until(&format!("a {reason} event"), LONG, || async {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_is_tainted_until_it_holds_and_returns_to_service_on_a_pass() {
    let node = "gpu-r";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    c.kubelet
        .set_node_env(node, "GPUVAL_SIMULATE", SIM_GPU1_BAD);
    let binding = nodes::refuse_failure_taints(&c.client, LONG).await;
    let _op = operator(&c.client);
    c.apply(
        "burn",
        json!({"checks": {"memory": {"fraction": 0.1}}, "onFailure": {"action": "Taint"}}),
    )
    .await;
    let gv = c.wait_terminal("burn", LONG.as_secs()).await;
    assert_eq!(gv.status.and_then(|s| s.phase), Some(Phase::Failed));
    // Labelled Fail, but the API server refuses its failure taint for now.
    let refused = nodes::wait_node(&c.client, node, "labelled Fail", LONG, |n| {
        label(n, labels::NODE_VERDICT) == Some("Fail")
    })
    .await;
    assert_eq!(failure_taint(&refused), None);
    // Once the API server takes it, the operator's next try writes it.
    nodes::lift_refusal(&c.client, &binding).await;
    let failed = nodes::wait_node(&c.client, node, "tainted gpuval.io/failed", LONG, |n| {
        failure_taint(n).is_some()
    })
    .await;
    assert_eq!(failure_taint(&failed).as_deref(), Some("burn:NoSchedule"));
    assert_eq!(label(&failed, labels::VERDICT_RUN), Some("burn"));
    assert_eq!(condition(&failed).map(|c| c.status.as_str()), Some("False"));

    // Repaired: the validation runs again as deep (a new generation) and passes, and the node
    // returns to service (the agent tolerates the failure taint, so the run that proves the
    // node can run there). A pass of another validation, not a schedule's, would not do: only
    // the same validation or a schedule's run (whose author may admit nodes) clears a failure.
    c.kubelet.set_node_env(node, "GPUVAL_SIMULATE", SIM);
    c.apply(
        "burn",
        json!({"checks": {"memory": {"fraction": 0.1}}, "onFailure": {"action": "Taint"}, "deadline": "11m"}),
    )
    .await;
    let gv = c.wait_terminal("burn", LONG.as_secs()).await;
    assert_eq!(gv.status.and_then(|s| s.phase), Some(Phase::Passed));
    let back = nodes::wait_node(&c.client, node, "returned to service", LONG, |n| {
        failure_taint(n).is_none() && label(n, labels::NODE_VERDICT) == Some("Pass")
    })
    .await;
    assert_eq!(label(&back, labels::VERDICT_RUN), Some("burn"));
    let cond = condition(&back).expect("GpuValidated");
    assert_eq!(cond.status, "True");
    assert!(
        cond.message
            .as_deref()
            .is_some_and(|m| m.contains("passed GpuValidation burn")),
        "{cond:?}"
    );
    let notes = node_events(&c.client, node, "ReturnedToService").await;
    assert!(
        notes.iter().any(|n| n.contains("passed GpuValidation burn")
            && n.contains("taint gpuval.io/failed=burn:NoSchedule")),
        "{notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_fails_twice_within_the_window_is_a_repeat_offender() {
    let node = "gpu-o";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    c.kubelet
        .set_node_env(node, "GPUVAL_SIMULATE", SIM_GPU1_BAD);
    let _op = operator(&c.client);
    for run in ["first", "second"] {
        c.apply(run, json!({"checks": {"memory": {"fraction": 0.1}}}))
            .await;
        let gv = c.wait_terminal(run, LONG.as_secs()).await;
        assert_eq!(
            gv.status.and_then(|s| s.phase),
            Some(Phase::Failed),
            "{run}"
        );
    }
    let n = nodes::wait_node(&c.client, node, "a repeat offender", LONG, |n| {
        label(n, labels::REPEAT_OFFENDER) == Some("true")
            && condition(n)
                .and_then(|c| c.message.as_deref())
                .is_some_and(|m| m.contains("repeat offender"))
    })
    .await;
    let message = condition(&n)
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("repeat offender: failed 2 runs within 168h (first, second); GPU "),
        "{message}"
    );
    let notes = node_events(&c.client, node, "RepeatOffender").await;
    assert!(
        notes.iter().any(|n| n.contains("first, second")),
        "{notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_created_again_under_its_name_starts_with_no_verdict() {
    let node = "gpu-n";
    let c = Cluster::start(NS, &[node.to_string()], 2).await;
    let _op = operator(&c.client);
    c.apply("before", json!({"checks": {"memory": {"fraction": 0.1}}}))
        .await;
    let gv = c.wait_terminal("before", LONG.as_secs()).await;
    assert_eq!(gv.status.and_then(|s| s.phase), Some(Phase::Passed));
    nodes::wait_node(&c.client, node, "labelled Pass", LONG, |n| {
        label(n, labels::NODE_VERDICT) == Some("Pass")
    })
    .await;

    // The machine is replaced: the Node is deleted and registers again under its name.
    let api: Api<Node> = Api::all(c.client.clone());
    let old_uid = api.get(node).await.expect("node").uid();
    api.delete(node, &Default::default()).await.expect("delete");
    gpuval_tests::waits::until_gone(&api, node, LONG)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    api.create(&PostParams::default(), &nodes::gpu_node(node, 2, &[]))
        .await
        .expect("create the node again");
    nodes::wait_node_ready(&c.client, node, LONG)
        .await
        .expect("node ready");
    // A mark in the operator's name that the node-state controller takes away once it has
    // looked at the new node (with no verdict to give it, it owns no label there).
    let stray = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {labels::ACTION: "Rerun"}}});
    api.patch(
        node,
        &PatchParams::apply(gpuval_operator::context::FIELD_MANAGER).force(),
        &Patch::Apply(&stray),
    )
    .await
    .expect("the stray label");
    let fresh = nodes::wait_node(
        &c.client,
        node,
        "looked at by the node-state controller",
        LONG,
        |n| label(n, labels::ACTION).is_none(),
    )
    .await;
    assert_ne!(fresh.uid(), old_uid);
    assert_eq!(
        label(&fresh, labels::NODE_VERDICT),
        None,
        "{:?}",
        fresh.labels()
    );
    assert_eq!(label(&fresh, labels::VERDICT_RUN), None);
    assert!(condition(&fresh).is_none(), "{:?}", condition(&fresh));
}

fn admission_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == labels::UNVALIDATED))
}

/// The finished admission runs of schedule `schedule` that cover `node`.
async fn finished_runs_of(client: &Client, schedule: &str, node: &str) -> Vec<String> {
    let selector = format!("{}={schedule}", labels::SCHEDULE);
    Api::<gpuval_crds::GpuValidation>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v.spec.node_names.iter().any(|n| n.0 == node))
        .filter(|v| gpuval_tests::scenario::terminal_for_generation(Some(v)))
        .map(|v| v.name_any())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_created_again_is_admitted_only_by_a_run_of_its_own() {
    let node = "gpu-adm";
    let c = Cluster::start(NS, &[], 2).await;
    nodes::tainted_node(&c.client, node, labels::UNVALIDATED, LONG).await;
    let _op = operator(&c.client);
    let schedule = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidationSchedule",
        "metadata": {"name": "gate"},
        "spec": {"admission": {"debounce": "1s"}, "template": {"checks": {"memory": {"fraction": 0.1}}}}});
    Api::<gpuval_crds::GpuValidationSchedule>::all(c.client.clone())
        .patch(
            "gate",
            &PatchParams::apply("return-to-service"),
            &Patch::Apply(&schedule),
        )
        .await
        .expect("schedule");
    nodes::wait_node(&c.client, node, "admitted", LONG, |n| !admission_taint(n)).await;
    let first = finished_runs_of(&c.client, "gate", node).await;
    assert_eq!(first.len(), 1, "{first:?}");

    // The machine is replaced; the new Node registers with the admission taint again.
    let api: Api<Node> = Api::all(c.client.clone());
    api.delete(node, &Default::default()).await.expect("delete");
    gpuval_tests::waits::until_gone(&api, node, LONG)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    nodes::tainted_node(&c.client, node, labels::UNVALIDATED, LONG).await;
    // Not admitted by the first run's pass: by a run of its own.
    let again = nodes::wait_node(&c.client, node, "admitted again", LONG, |n| {
        !admission_taint(n)
    })
    .await;
    let runs = finished_runs_of(&c.client, "gate", node).await;
    assert_eq!(
        runs.len(),
        2,
        "a second admission run for the new node: {runs:?}"
    );
    let second = runs
        .iter()
        .find(|r| !first.contains(r))
        .expect("the new node's run");
    // Its verdict is its own run's (none of the first run's is carried over).
    let proved = nodes::wait_node(&c.client, node, "labelled by its own run", LONG, |n| {
        label(n, labels::VERDICT_RUN).is_some()
    })
    .await;
    assert!(!admission_taint(&again));
    assert_eq!(
        label(&proved, labels::VERDICT_RUN),
        Some(labels::node_value(second).as_str())
    );
}

/// The node-state controller's marks are bound to the node it read: a node deleted since is not
/// brought back as a bare Node by the apply (an apply is a create where nothing exists), and a
/// node created again under the name is not given its predecessor's marks. Before the bodies
/// named the UID, the first apply below created a Node `gpu-gone` (a CI run met it as
/// `AlreadyExists` when the test above created its node again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marks_for_a_node_read_before_it_was_deleted_create_nothing() {
    let node = "gpu-gone";
    let c = Cluster::start(NS, &[], 2).await;
    let api: Api<Node> = Api::all(c.client.clone());
    let old = api
        .create(&PostParams::default(), &nodes::gpu_node(node, 2, &[]))
        .await
        .expect("node");
    let mark = gpuval_operator::decide::node_state::Mark {
        labels: [(labels::NODE_VERDICT.to_string(), "Pass".to_string())].into(),
        condition: None,
        admitted: None,
    };
    let (meta, status) = gpuval_operator::decide::node_state::apply_bodies(&old, &mark);
    let pp = PatchParams::apply(gpuval_operator::context::FIELD_MANAGER).force();
    api.delete(node, &Default::default()).await.expect("delete");
    gpuval_tests::waits::until_gone(&api, node, LONG)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    match api.patch(node, &pp, &Patch::Apply(&meta)).await {
        Err(kube::Error::Api(s)) => {
            assert!(
                gpuval_operator::decide::node_state::gone_or_replaced(&s),
                "{s:?}"
            )
        }
        other => panic!("the apply created {other:?}"),
    }
    assert!(
        api.get_opt(node).await.expect("read").is_none(),
        "a Node was created by the marks of a deleted one"
    );
    match api.patch_status(node, &pp, &Patch::Apply(&status)).await {
        Err(kube::Error::Api(s)) => {
            assert!(
                gpuval_operator::decide::node_state::gone_or_replaced(&s),
                "{s:?}"
            )
        }
        other => panic!("the status apply found a node: {other:?}"),
    }

    // Created again: the old node's marks are refused (422, the UID is immutable), the new
    // node's are written.
    let new = api
        .create(&PostParams::default(), &nodes::gpu_node(node, 2, &[]))
        .await
        .expect("node again");
    match api.patch(node, &pp, &Patch::Apply(&meta)).await {
        Err(kube::Error::Api(s)) => assert!(
            gpuval_operator::decide::node_state::gone_or_replaced(&s) && s.code != 404,
            "{s:?}"
        ),
        other => panic!("the old node's marks were not refused: {other:?}"),
    }
    let unmarked = api.get(node).await.expect("read");
    assert_eq!(label(&unmarked, labels::NODE_VERDICT), None);
    let (meta, _) = gpuval_operator::decide::node_state::apply_bodies(&new, &mark);
    let marked = api
        .patch(node, &pp, &Patch::Apply(&meta))
        .await
        .expect("the new node's marks");
    assert_eq!(label(&marked, labels::NODE_VERDICT), Some("Pass"));
}
