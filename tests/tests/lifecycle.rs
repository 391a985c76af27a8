//! Validation through a node's life, on a real control plane (etcd, kube-apiserver,
//! controller-manager, scheduler, kwok nodes) with agents run as processes by the FakeKubelet:
//! schedules fire on time and keep to their concurrency policy and history limits, `idleOnly`
//! leaves busy nodes out, new tainted nodes are admitted (untainted) or kept out, and the
//! GpuValidated condition and verdict labels are set and cleared.
//!
//! Time: the in-process operator is given a `Clock` (`OperatorConfig::clock`) that the test
//! moves forward with `Clock::advance`; each move makes the schedule controller plan again at
//! once, so an hourly schedule fires when the test says the hour has passed. Agents and the
//! validations' own deadlines run on real time.

use std::time::Duration;

use gpuval_crds::{GpuValidation, GpuValidationSchedule, Phase};
use gpuval_operator::decide::schedule::run_name;
use gpuval_operator::settings::clock::Clock;
use gpuval_tests::kubelet::FakeKubelet;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{self, terminal, wait};
use gpuval_tests::{ControlPlane, crds, nodes};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
/// Simulated GPUs: a 10-minute burn takes 12 s.
const SIM: &str = "gpus=8,model=H200,timescale=0.02";
const UNVALIDATED: &str = "gpuval.io/unvalidated";

struct Env {
    _cp: ControlPlane,
    client: Client,
    kubelet: FakeKubelet,
    clock: Clock,
    _op: OperatorHandle,
}

/// A cluster whose operator lets the simulated agents' results act on nodes (the test-only
/// opt-in: these tests are about node actions, on kwok nodes with simulated GPUs).
async fn env(gpu_nodes: &[&str]) -> Env {
    env_with(gpu_nodes, true).await
}

async fn env_with(gpu_nodes: &[&str], simulated_acts_on_nodes: bool) -> Env {
    env_configured(gpu_nodes, |cfg| {
        cfg.simulated_acts_on_nodes = simulated_acts_on_nodes
    })
    .await
}

/// [`env`] on an installation that names an io host path.
async fn env_io(gpu_nodes: &[&str]) -> Env {
    env_configured(gpu_nodes, |cfg| {
        cfg.simulated_acts_on_nodes = true;
        cfg.io_host_path = Some("/var/lib/gpuval-io".into());
    })
    .await
}

async fn env_configured(
    gpu_nodes: &[&str],
    configure: impl FnOnce(&mut gpuval_operator::settings::config::OperatorConfig),
) -> Env {
    let names: Vec<String> = gpu_nodes.iter().map(|n| n.to_string()).collect();
    let c = scenario::Cluster::start(NS, &names, 8).await;
    let (cp, client, kubelet) = (c.cp, c.client, c.kubelet);
    let clock = Clock::system();
    let mut cfg = test_config(NS, SIM);
    cfg.clock = clock.clone();
    configure(&mut cfg);
    let op = OperatorHandle::start(client.clone(), cfg);
    Env {
        _cp: cp,
        client,
        kubelet,
        clock,
        _op: op,
    }
}

async fn apply_schedule(client: &Client, name: &str, spec: Value) -> GpuValidationSchedule {
    let body = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidationSchedule",
        "metadata": {"name": name}, "spec": spec});
    Api::<GpuValidationSchedule>::all(client.clone())
        .patch(name, &PatchParams::apply("lifecycle"), &Patch::Apply(&body))
        .await
        .expect("apply schedule")
}

fn schedule_status(
    f: impl Fn(&gpuval_crds::GpuValidationScheduleStatus) -> bool,
) -> impl Condition<GpuValidationSchedule> {
    move |s: Option<&GpuValidationSchedule>| s.and_then(|s| s.status.as_ref()).is_some_and(&f)
}

/// Moves the clock to just past the schedule's next scheduled time (from its status, once the
/// status plans a time after the clock's now) and returns that time.
async fn advance_to_next(e: &Env, schedule: &str) -> Timestamp {
    let now = e.clock.now();
    let api: Api<GpuValidationSchedule> = Api::all(e.client.clone());
    let s = wait(
        api,
        schedule,
        30,
        "planned ahead of the clock",
        schedule_status(move |s| s.next_schedule_time.as_ref().is_some_and(|t| t.0 > now)),
    )
    .await;
    let next = s
        .status
        .and_then(|s| s.next_schedule_time)
        .expect("waited for a planned time")
        .0;
    let ahead = next.duration_since(e.clock.now());
    let by = Duration::try_from(ahead).unwrap_or(Duration::ZERO) + Duration::from_secs(1);
    e.clock.advance(by);
    next
}

async fn runs_of(client: &Client, schedule: &str) -> Vec<String> {
    let mut names: Vec<String> = Api::<GpuValidation>::all(client.clone())
        .list(&ListParams::default().labels(&format!("gpuval.io/schedule={schedule}")))
        .await
        .expect("list runs")
        .items
        .iter()
        .filter(|v| v.metadata.deletion_timestamp.is_none())
        .map(|v| v.name_any())
        .collect();
    names.sort();
    names
}

/// Waits, re-checking on every validation event, for the first run of `schedule`.
async fn first_run_of(client: &Client, schedule: &str, secs: u64) -> String {
    use futures::StreamExt;
    let api: Api<GpuValidation> = Api::all(client.clone());
    let mut events = std::pin::pin!(kube::runtime::watcher(api, Default::default()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(r) = runs_of(client, schedule).await.into_iter().next() {
            return r;
        }
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("{schedule}: no run within {secs}s"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_on_time_forbids_overlap_and_keeps_its_history() {
    let e = env(&["gpu-a"]).await;
    apply_schedule(
        &e.client,
        "hourly",
        // A 40-minute burn (48 s at this timescale): long enough that the first run still
        // burns when the clock reaches the next hour, also on a loaded CI machine.
        json!({"schedule": "0 * * * *", "successfulHistoryLimit": 1,
            "template": {"checks": {"compute": {"duration": "40m"}}}}),
    )
    .await;
    let validations: Api<GpuValidation> = Api::all(e.client.clone());
    let schedules: Api<GpuValidationSchedule> = Api::all(e.client.clone());

    // Nothing runs before the first scheduled time; at it, one run named for it.
    let first_at = advance_to_next(&e, "hourly").await;
    let first = run_name("hourly", first_at);
    wait(
        validations.clone(),
        &first,
        30,
        "created",
        |v: Option<&GpuValidation>| v.is_some(),
    )
    .await;
    assert_eq!(runs_of(&e.client, "hourly").await, vec![first.clone()]);
    let gv = validations.get(&first).await.unwrap();
    let owner = &gv.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("GpuValidationSchedule", "hourly")
    );

    // The next hour comes while the first run still burns: Forbid skips it.
    let second_at = advance_to_next(&e, "hourly").await;
    let s = wait(
        schedules.clone(),
        "hourly",
        30,
        "skipping",
        schedule_status(move |s| s.last_skipped_time.as_ref().map(|t| t.0) == Some(second_at)),
    )
    .await;
    let why = s.status.unwrap().last_skipped_reason.unwrap();
    assert!(
        why.contains(&first) && why.contains("still running"),
        "{why}"
    );
    assert_eq!(runs_of(&e.client, "hourly").await, vec![first.clone()]);

    // Once it passed, the next hour starts a run, and the history keeps only the newest pass.
    wait(validations.clone(), &first, 240, "finished", terminal).await;
    let third_at = advance_to_next(&e, "hourly").await;
    let third = run_name("hourly", third_at);
    wait(validations.clone(), &third, 120, "finished", terminal).await;
    let s = wait(
        schedules,
        "hourly",
        60,
        "pruned",
        schedule_status(move |s| s.last_validation.as_deref() == Some(third.as_str())),
    )
    .await;
    let st = s.status.unwrap();
    assert_eq!(st.last_verdict, Some(Phase::Passed));
    assert_eq!(st.last_schedule_time.map(|t| t.0), Some(third_at));
    let first_uid = gv.uid().unwrap();
    let deleted = await_condition(
        validations,
        &first,
        kube::runtime::wait::conditions::is_deleted(&first_uid),
    );
    tokio::time::timeout(Duration::from_secs(60), deleted)
        .await
        .expect("the older pass is pruned")
        .unwrap();
    assert_eq!(
        runs_of(&e.client, "hourly").await,
        vec![run_name("hourly", third_at)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_only_leaves_out_a_node_whose_gpus_a_pod_holds() {
    let e = env(&["gpu-a", "gpu-b"]).await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"nodeName": "gpu-b",
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [{"name": "train", "image": "trainer",
                "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(e.client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("GPU pod");
    apply_schedule(
        &e.client,
        "idle",
        json!({"schedule": "@hourly", "idleOnly": true,
            "template": {"checks": {"memory": {}}}}),
    )
    .await;
    let at = advance_to_next(&e, "idle").await;
    let name = run_name("idle", at);
    let gv = wait(
        Api::<GpuValidation>::all(e.client.clone()),
        &name,
        30,
        "created",
        |v: Option<&GpuValidation>| v.is_some(),
    )
    .await;
    let names: Vec<&str> = gv.spec.node_names.iter().map(|n| n.0.as_str()).collect();
    assert_eq!(names, ["gpu-a"]);
    // The status is written after the run is created.
    let s = wait(
        Api::<GpuValidationSchedule>::all(e.client.clone()),
        "idle",
        30,
        "listing the skipped node",
        schedule_status(|s| !s.skipped_nodes.is_empty()),
    )
    .await;
    let skipped = s.status.unwrap().skipped_nodes;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].name, "gpu-b");
    assert!(
        skipped[0]
            .reason
            .contains("default/train holds 4 nvidia.com/gpu"),
        "{skipped:?}"
    );
    wait(Api::all(e.client.clone()), &name, 120, "finished", terminal).await;
}

fn node_taints(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| t.key.clone())
        .collect()
}

fn condition(n: &Node) -> Option<(String, String, String)> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "GpuValidated")?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_nodes_are_untainted_on_a_pass_kept_out_on_a_failure_and_node_state_follows() {
    let e = env(&[]).await;
    e.kubelet.set_node_env(
        "gpu-bad",
        "GPUVAL_SIMULATE",
        "gpus=8,model=H200,timescale=0.02,fail=memory@3",
    );
    apply_schedule(
        &e.client,
        "gate",
        json!({"admission": {"debounce": "2s"}, "failedHistoryLimit": 5,
            "template": {"checks": {"memory": {}}}}),
    )
    .await;
    nodes::create_tainted_node(&e.client, "gpu-new", 8, UNVALIDATED).await;
    nodes::create_tainted_node(&e.client, "gpu-bad", 8, UNVALIDATED).await;
    let nodes_api: Api<Node> = Api::all(e.client.clone());

    wait(
        nodes_api.clone(),
        "gpu-new",
        120,
        "admitted",
        |n: Option<&Node>| n.is_some_and(|n| !node_taints(n).iter().any(|k| k == UNVALIDATED)),
    )
    .await;
    let good = wait(
        nodes_api.clone(),
        "gpu-new",
        60,
        "labelled",
        |n: Option<&Node>| n.is_some_and(|n| condition(n).is_some()),
    )
    .await;
    assert_eq!(
        good.labels().get("gpuval.io/verdict").map(String::as_str),
        Some("Pass")
    );
    let at: i64 = good.labels()["gpuval.io/validated-at"]
        .parse()
        .expect("seconds");
    assert!((at - Timestamp::now().as_second()).abs() < 600, "{at}");
    let (status, reason, _) = condition(&good).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Passed"));

    let bad = wait(
        nodes_api.clone(),
        "gpu-bad",
        120,
        "marked failed",
        |n: Option<&Node>| {
            n.is_some_and(|n| {
                node_taints(n).iter().any(|k| k == "gpuval.io/failed") && condition(n).is_some()
            })
        },
    )
    .await;
    assert!(
        node_taints(&bad).iter().any(|k| k == UNVALIDATED),
        "kept out"
    );
    assert_eq!(
        bad.labels().get("gpuval.io/verdict").map(String::as_str),
        Some("Fail")
    );
    let (status, reason, message) = condition(&bad).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Failed"));
    assert!(message.contains("GPU3 memory"), "{message}");
    // Both nodes were validated together, in one admission run.
    assert_eq!(
        runs_of(&e.client, "gate").await.len(),
        1,
        "{:?}",
        runs_of(&e.client, "gate").await
    );

    // Deleting the schedule takes its runs and their results; the node state stays (a record,
    // not a reading: issue 52): each node keeps its condition and verdict labels, and the
    // failed node its failure taint, until a later hardware verdict says otherwise.
    let runs = runs_of(&e.client, "gate").await;
    Api::<GpuValidationSchedule>::all(e.client.clone())
        .delete("gate", &DeleteParams::background())
        .await
        .unwrap();
    let validations: Api<GpuValidation> = Api::all(e.client.clone());
    for run in runs {
        gpuval_tests::waits::until_gone(&validations, &run, Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for (node, status, verdict) in [("gpu-new", "True", "Pass"), ("gpu-bad", "False", "Fail")] {
        let kept = nodes_api.get(node).await.expect("node");
        let (s, _, _) = condition(&kept).expect("the condition stays");
        assert_eq!(s, status, "{node}");
        assert_eq!(
            kept.labels().get("gpuval.io/verdict").map(String::as_str),
            Some(verdict),
            "{node}"
        );
        assert!(kept.labels().contains_key("gpuval.io/validated-at"));
    }
    let bad = nodes_api.get("gpu-bad").await.expect("node");
    assert!(node_taints(&bad).iter().any(|k| k == "gpuval.io/failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_removed_mid_admission_is_dropped_without_error() {
    let e = env(&[]).await;
    // The burn takes 10m x 0.02 = 12 s: time to remove a node mid-run. Both nodes must land in
    // one batch: a debounce of a few seconds covers the gap between their creation on a loaded
    // machine (with 1s, CI once saw them in two runs of one node each).
    apply_schedule(
        &e.client,
        "gate",
        json!({"admission": {"debounce": "5s"},
            "template": {"checks": {"compute": {"duration": "10m"}}}}),
    )
    .await;
    nodes::create_tainted_node(&e.client, "gpu-stays", 8, UNVALIDATED).await;
    nodes::create_tainted_node(&e.client, "gpu-goes", 8, UNVALIDATED).await;
    let validations: Api<GpuValidation> = Api::all(e.client.clone());
    let run = first_run_of(&e.client, "gate", 60).await;
    wait(
        validations.clone(),
        &run,
        60,
        "running",
        |v: Option<&GpuValidation>| {
            v.and_then(|v| v.status.as_ref())
                .and_then(|s| s.summary.as_ref())
                .is_some_and(|s| s.running >= 2)
        },
    )
    .await;
    Api::<Node>::all(e.client.clone())
        .delete("gpu-goes", &DeleteParams::default())
        .await
        .unwrap();
    wait(validations, &run, 120, "finished", terminal).await;
    let stays = wait(
        Api::<Node>::all(e.client.clone()),
        "gpu-stays",
        60,
        "admitted",
        |n: Option<&Node>| n.is_some_and(|n| !node_taints(n).iter().any(|k| k == UNVALIDATED)),
    )
    .await;
    assert!(!node_taints(&stays).iter().any(|k| k == "gpuval.io/failed"));
    // The run reports the node it lost; admission says nothing about it (no warning).
    let gv = Api::<GpuValidation>::all(e.client.clone())
        .get(&run)
        .await
        .unwrap();
    let lines = &gv.status.as_ref().unwrap().nodes;
    assert!(lines.iter().all(|l| l.name == "gpu-goes"), "{lines:?}");
    // The event is published after the taint goes: wait for it, then look at all of them.
    let event_api =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(e.client.clone(), "default");
    let events = gpuval_tests::waits::until(
        "a NodeAdmitted event about the schedule",
        std::time::Duration::from_secs(60),
        || async {
            let items = event_api.list(&ListParams::default()).await.ok()?.items;
            items
                .iter()
                .any(|ev| {
                    ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gate")
                        && ev.reason.as_deref() == Some("NodeAdmitted")
                })
                .then_some(items)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let about_gate: Vec<_> = events
        .iter()
        .filter(|ev| ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gate"))
        .collect();
    assert!(
        about_gate
            .iter()
            .all(|ev| ev.type_.as_deref() != Some("Warning")),
        "{about_gate:?}"
    );
    let s = Api::<GpuValidationSchedule>::all(e.client.clone())
        .get("gate")
        .await
        .unwrap();
    let ready = gpuval_crds::conditions::find(&s.status.unwrap().conditions, "Ready").cloned();
    assert_eq!(ready.map(|c| c.status), Some("True".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_or_reported_and_the_examples_are_accepted() {
    let e = env(&[]).await;
    let api: Api<GpuValidationSchedule> = Api::all(e.client.clone());
    let mut strict = PatchParams::apply("lifecycle");
    strict.field_validation = Some(kube::api::ValidationDirective::Strict);
    let template = json!({"checks": {"memory": {}}});
    for (spec, says) in [
        (json!({"template": template}), "spec needs schedule"),
        (
            json!({"schedule": "every hour", "template": template}),
            "spec.schedule",
        ),
        (
            json!({"schedule": "@daily", "template": {"checks": {}}}),
            "at least one of",
        ),
        (
            json!({"admission": {"debounce": "2h"}, "template": template}),
            "spec.admission.debounce",
        ),
    ] {
        let body = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidationSchedule",
            "metadata": {"name": "bad"}, "spec": spec});
        let err = api
            .patch("bad", &strict, &Patch::Apply(&body))
            .await
            .expect_err("refused");
        assert!(err.to_string().contains(says), "{spec}: {err}");
    }
    // The shape passes the schema; the operator's parser says what is wrong.
    apply_schedule(
        &e.client,
        "feb30",
        json!({"schedule": "0 0 30 2 *", "template": template}),
    )
    .await;
    let s = wait(
        api.clone(),
        "feb30",
        30,
        "reported",
        schedule_status(|s| !s.conditions.is_empty()),
    )
    .await;
    let ready = &s.status.unwrap().conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSchedule")
    );
    assert!(ready.message.contains("never fires"), "{}", ready.message);

    let path = crds::repo_root().join("deploy/examples/fleet.yaml");
    let docs = crds::read_yaml_documents(&path).unwrap();
    assert_eq!(docs.len(), 2);
    for doc in docs {
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        api.patch(&name, &strict, &Patch::Apply(&doc))
            .await
            .unwrap_or_else(|e| panic!("{name} rejected: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_pass_never_admits_labels_or_conditions_a_node() {
    // The production default: no opt-in, so simulated results are not evidence.
    let e = env_with(&[], false).await;
    apply_schedule(
        &e.client,
        "gate",
        json!({"admission": {"debounce": "1s"}, "template": {"checks": {"memory": {}}}}),
    )
    .await;
    nodes::create_tainted_node(&e.client, "gpu-new", 8, UNVALIDATED).await;
    let validations: Api<GpuValidation> = Api::all(e.client.clone());
    let run = first_run_of(&e.client, "gate", 60).await;
    let gv = wait(validations, &run, 120, "finished", terminal).await;
    let status = gv.status.expect("status");
    assert_eq!(status.phase, Some(Phase::Passed));
    assert_eq!(status.simulated, Some(true), "the run says it is simulated");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert!(ready.message.contains("simulated"), "{}", ready.message);
    // The schedule has seen the finished run (its status names it) before the node is read.
    let schedules: Api<GpuValidationSchedule> = Api::all(e.client.clone());
    let r = run.clone();
    wait(
        schedules,
        "gate",
        60,
        "saw the run",
        schedule_status(move |s| s.last_validation.as_deref() == Some(r.as_str())),
    )
    .await;
    let node = Api::<Node>::all(e.client.clone())
        .get("gpu-new")
        .await
        .expect("node");
    assert!(
        node_taints(&node).iter().any(|k| k == UNVALIDATED),
        "still gated: {:?}",
        node_taints(&node)
    );
    assert!(condition(&node).is_none(), "{:?}", condition(&node));
    assert!(!node.labels().contains_key("gpuval.io/verdict"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_error_never_taints_labels_or_fails_a_node() {
    let e = env_io(&["gpu-a", "gpu-b"]).await;
    // gpu-b also has a real memory fault: a hardware failure beside the configuration error.
    e.kubelet
        .set_node_env("gpu-b", "GPUVAL_SIMULATE", &format!("{SIM},fail=memory@3"));
    // The installation names an io host path (so the operator's preflight lets the run start),
    // but on these nodes the directory is missing: the agents' io check reports IoDirUnusable, a
    // configuration code, on every node.
    for node in ["gpu-a", "gpu-b"] {
        e.kubelet
            .set_node_env(node, "GPUVAL_IO_DIR", "/nonexistent/gpuval-io-missing");
    }
    let body = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
        "metadata": {"name": "no-io"},
        "spec": {"checks": {"memory": {}, "io": {}}, "onFailure": {"action": "Taint"}}});
    let validations: Api<GpuValidation> = Api::all(e.client.clone());
    validations
        .patch(
            "no-io",
            &PatchParams::apply("lifecycle"),
            &Patch::Apply(&body),
        )
        .await
        .expect("apply");
    let gv = wait(validations, "no-io", 120, "finished", terminal).await;
    let line = |node: &str| {
        gv.status
            .as_ref()
            .and_then(|s| s.nodes.iter().find(|n| n.name == node))
            .cloned()
            .expect("a node line")
    };
    assert_eq!(line("gpu-a").codes.as_deref(), Some("IoDirUnusable"));
    assert!(
        line("gpu-b")
            .codes
            .unwrap_or_default()
            .contains("MemoryMismatch")
    );
    // The hardware failure acts on gpu-b: wait for that, then gpu-a (the same steps, the
    // configuration error alone) must be untouched.
    let nodes_api: Api<Node> = Api::all(e.client.clone());
    wait(
        nodes_api.clone(),
        "gpu-b",
        60,
        "gpu-b tainted and labelled Fail",
        |n: Option<&Node>| {
            n.is_some_and(|n| {
                node_taints(n).iter().any(|k| k == "gpuval.io/failed")
                    && n.labels().get("gpuval.io/verdict").map(String::as_str) == Some("Fail")
            })
        },
    )
    .await;
    let node = wait(
        nodes_api.clone(),
        "gpu-a",
        60,
        "told why it has no verdict",
        |n: Option<&Node>| n.is_some_and(|n| condition(n).is_some()),
    )
    .await;
    assert!(
        !node_taints(&node).iter().any(|k| k == "gpuval.io/failed"),
        "{:?}",
        node_taints(&node)
    );
    assert!(!node.labels().contains_key("gpuval.io/verdict"));
    // A node without a verdict says why it has none: Unknown, never False.
    let (status, reason, message) = condition(&node).expect("GpuValidated");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("Unknown", "Configuration"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_removes_only_its_own_taint_and_refuses_a_foreign_key() {
    let e = env(&[]).await;
    // A taint gpuval does not own: refused, the schedule says why and starts nothing.
    apply_schedule(
        &e.client,
        "foreign",
        json!({"admission": {"debounce": "1s", "taint": {"key": "nvidia.com/gpu"}},
            "template": {"checks": {"memory": {}}}}),
    )
    .await;
    let s = wait(
        Api::<GpuValidationSchedule>::all(e.client.clone()),
        "foreign",
        60,
        "refused",
        schedule_status(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "AdmissionRefused")
        }),
    )
    .await;
    let ready = s.status.unwrap().conditions;
    let msg = &ready.iter().find(|c| c.type_ == "Ready").unwrap().message;
    assert!(msg.contains("allowedTaintKeys"), "{msg}");
    assert!(runs_of(&e.client, "foreign").await.is_empty());

    // gpuval's own key: on a pass only that key with that effect goes.
    apply_schedule(
        &e.client,
        "gate",
        json!({"admission": {"debounce": "1s"}, "template": {"checks": {"memory": {}}}}),
    )
    .await;
    let mut node = gpuval_tests::nodes::gpu_node("gpu-new", 8, &[]);
    if let Some(spec) = node.spec.as_mut() {
        let taints = spec.taints.get_or_insert_with(Vec::new);
        for effect in ["NoSchedule", "PreferNoSchedule"] {
            taints.push(Taint {
                key: UNVALIDATED.into(),
                effect: effect.into(),
                ..Default::default()
            });
        }
    }
    Api::<Node>::all(e.client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("node");
    let admitted = wait(
        Api::<Node>::all(e.client.clone()),
        "gpu-new",
        120,
        "admitted",
        |n: Option<&Node>| {
            n.is_some_and(|n| {
                !n.spec
                    .iter()
                    .flat_map(|s| s.taints.iter().flatten())
                    .any(|t| t.key == UNVALIDATED && t.effect == "NoSchedule")
            })
        },
    )
    .await;
    let left: Vec<(String, String)> = admitted
        .spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .map(|t| (t.key.clone(), t.effect.clone()))
        .collect();
    assert!(
        left.contains(&(UNVALIDATED.to_string(), "PreferNoSchedule".to_string())),
        "a taint of the same key with another effect is not gpuval's: {left:?}"
    );
}

/// Validation `a-b` on node `c` and validation `a` on node `b-c`: joined with '-' alone, their
/// agent pods (`gpuval-a-b-c-g1`) and results (`a-b-c`) had one name, so one of them could
/// never run or store its result. Each gets its own pod and result, and both pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validations_whose_names_read_alike_with_a_node_get_their_own_pods_and_results() {
    let e = env(&["c", "b-c"]).await;
    let pairs = [("a-b", "c"), ("a", "b-c")];
    for (validation, node) in pairs {
        scenario::apply_validation(
            &e.client,
            "test",
            validation,
            json!({"nodeNames": [node], "checks": {"memory": {}}}),
        )
        .await;
    }
    let validations: Api<GpuValidation> = Api::all(e.client.clone());
    let results: Api<gpuval_crds::GpuNodeResult> = Api::namespaced(e.client.clone(), NS);
    for (validation, node) in pairs {
        let gv = wait(validations.clone(), validation, 120, "finished", terminal).await;
        let status = gv.status.expect("status");
        assert_eq!(
            status.phase,
            Some(Phase::Passed),
            "{validation}: {status:?}"
        );
        let result = results
            .get(&gpuval_crds::result::result_name(validation, node))
            .await
            .unwrap_or_else(|err| panic!("{validation} on {node}: its result: {err}"));
        assert_eq!(
            (
                result.spec.validation.as_str(),
                result.spec.node_name.as_str()
            ),
            (validation, node)
        );
        let pod = gpuval_operator::decide::pod::pod_name(validation, node, 1);
        Api::<Pod>::namespaced(e.client.clone(), NS)
            .get(&pod)
            .await
            .unwrap_or_else(|err| panic!("{validation} on {node}: its agent pod {pod}: {err}"));
    }
}

fn failure_tainted(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == gpuval_crds::labels::FAILED_NODE))
}

fn verdict_of(n: &Node) -> (Option<String>, Option<String>, Option<String>) {
    let l = n.labels();
    let cond = nodes::condition(n, "GpuValidated").map(|c| c.status.clone());
    (
        l.get(gpuval_crds::labels::NODE_VERDICT).cloned(),
        l.get(gpuval_crds::labels::VERDICT_RUN).cloned(),
        cond,
    )
}

/// A schedule's history through a failure (issue 52): with `failedHistoryLimit: 0` the failing
/// run is kept until the node recorded its failure (here held back by the API server refusing
/// the failure taint), then pruned; the older pass of the same schedule clears nothing; the next
/// run of the schedule, as deep, passing on repaired GPUs, returns the node to service; and the
/// older pass then pruned by `successfulHistoryLimit` changes nothing, not even the
/// condition's transition time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_s_pruned_failure_stands_until_its_next_pass_covers_it() {
    use gpuval_crds::labels;
    let node = "gpu-h";
    let e = env(&[node]).await;
    let nodes_api: Api<Node> = Api::all(e.client.clone());
    let validations: Api<GpuValidation> = Api::all(e.client.clone());
    apply_schedule(
        &e.client,
        "nightly",
        json!({"schedule": "0 * * * *", "successfulHistoryLimit": 1, "failedHistoryLimit": 0,
            "template": {"checks": {"memory": {"fraction": 0.1}}, "onFailure": {"action": "Taint"}}}),
    )
    .await;
    let first = run_name("nightly", advance_to_next(&e, "nightly").await);
    wait(validations.clone(), &first, 120, "finished", terminal).await;
    let passed_first = labels::node_value(&first);
    nodes::wait_node(
        &e.client,
        node,
        "labelled Pass",
        Duration::from_secs(120),
        {
            let passed_first = passed_first.clone();
            move |n| verdict_of(n).1.as_deref() == Some(passed_first.as_str())
        },
    )
    .await;

    // GPU 1 goes bad, and the API server refuses the failure taint for now: the next run
    // fails, and the history keeps it (failedHistoryLimit 0) while the node has not recorded
    // its failure.
    let refusal = nodes::refuse_failure_taints(&e.client, Duration::from_secs(120)).await;
    e.kubelet.set_node_env(
        node,
        "GPUVAL_SIMULATE",
        "gpus=8,model=H200,timescale=0.02,fail=memory@1",
    );
    let failing = run_name("nightly", advance_to_next(&e, "nightly").await);
    let failing_label = labels::node_value(&failing);
    wait(validations.clone(), &failing, 120, "finished", terminal).await;
    let schedules: Api<GpuValidationSchedule> = Api::all(e.client.clone());
    let last = failing.clone();
    wait(
        schedules,
        "nightly",
        60,
        "its status names the failing run",
        schedule_status(move |s| {
            s.last_validation.as_deref() == Some(last.as_str())
                && s.last_verdict == Some(Phase::Failed)
        }),
    )
    .await;
    let held = nodes_api.get(node).await.expect("node");
    assert!(
        runs_of(&e.client, "nightly").await.contains(&failing),
        "a failure no node recorded is kept: {:?}",
        held.annotations().get("gpuval.io/verdict-record")
    );
    // Taken: the node records the failure, is tainted, and then the run is pruned.
    nodes::lift_refusal(&e.client, &refusal).await;
    nodes::wait_node(
        &e.client,
        node,
        "tainted by the failing run",
        Duration::from_secs(120),
        {
            let failing_label = failing_label.clone();
            move |n| {
                failure_tainted(n) && verdict_of(n).1.as_deref() == Some(failing_label.as_str())
            }
        },
    )
    .await;
    gpuval_tests::waits::until_gone(&validations, &failing, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("the failing run is pruned: {e}"));
    // The older pass of the same schedule is still there, and clears nothing.
    assert_eq!(runs_of(&e.client, "nightly").await, vec![first.clone()]);
    let after_prune = nodes_api.get(node).await.expect("node");
    assert!(failure_tainted(&after_prune), "{:?}", after_prune.spec);
    assert_eq!(
        verdict_of(&after_prune),
        (
            Some("Fail".into()),
            Some(failing_label.clone()),
            Some("False".into())
        )
    );

    // Repaired: the schedule's next run, as deep, passes and returns the node to service.
    e.kubelet.set_node_env(node, "GPUVAL_SIMULATE", SIM);
    let repaired = run_name("nightly", advance_to_next(&e, "nightly").await);
    let repaired_label = labels::node_value(&repaired);
    let back = nodes::wait_node(
        &e.client,
        node,
        "returned to service",
        Duration::from_secs(120),
        {
            let repaired_label = repaired_label.clone();
            move |n| {
                !failure_tainted(n)
                    && verdict_of(n)
                        == (
                            Some("Pass".into()),
                            Some(repaired_label.clone()),
                            Some("True".into()),
                        )
            }
        },
    )
    .await;
    let since =
        nodes::condition(&back, "GpuValidated").and_then(|c| c.last_transition_time.clone());
    // successfulHistoryLimit 1: the first pass goes; the node keeps what it carries.
    gpuval_tests::waits::until_gone(&validations, &first, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("the older pass is pruned: {e}"));
    let kept = nodes_api.get(node).await.expect("node");
    assert_eq!(
        verdict_of(&kept),
        (
            Some("Pass".into()),
            Some(repaired_label),
            Some("True".into())
        )
    );
    assert_eq!(
        nodes::condition(&kept, "GpuValidated").and_then(|c| c.last_transition_time.clone()),
        since
    );
}
