//! Unrelated churn never postpones a validation (issue 55), on a real control plane (etcd,
//! kube-apiserver, controller-manager, scheduler, kwok) with the operator in-process: while an
//! unrelated Node is patched every 20 ms, a validation created in that storm starts within a
//! few seconds (its status written for its generation, its agent pod created). Before the
//! fix, every Node event requeued every unfinished validation through kube's 200 ms debounce,
//! which restarts on each trigger, and nothing was reconciled until the patching stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpuval_crds::GpuValidation;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{self, wait_validation};
use gpuval_tests::{ControlPlane, Options, nodes, waits};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const NS: &str = "gpuval-system";
const SIM: &str = "gpus=8,model=H200,timescale=0.002";
/// How often the unrelated Node is patched.
const EVERY: Duration = Duration::from_millis(20);
/// How long the validation may take to start under that churn.
const START_WITHIN: Duration = Duration::from_secs(5);

/// Patches Node `name`'s annotation every [`EVERY`] until the task is aborted, counting the
/// patches that landed in `done`.
async fn churn(client: Client, name: &'static str, done: Arc<AtomicU64>) {
    let api: Api<Node> = Api::all(client);
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0u64.. {
        tick.tick().await;
        let patch = json!({"metadata": {"annotations": {"churn.gpuval.io/n": i.to_string()}}});
        let patched = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        if patched.is_ok() {
            done.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The agent pods of validation `name` (none where they cannot be listed).
async fn agent_pods(client: &Client, name: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pods = api.list(&ListParams::default()).await;
    let owned_by = |p: &Pod| p.owner_references().iter().any(|o| o.name == name);
    pods.map(|l| l.items.into_iter().filter(owned_by).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_starts_within_seconds_while_an_unrelated_node_is_patched_every_20ms() {
    let cp = ControlPlane::start_with(Options::all())
        .await
        .expect("control plane");
    let client = cp.client().await.expect("client");
    scenario::install(&client, NS).await;
    scenario::ready_gpu_nodes(
        &client,
        &["gpu-a"],
        8,
        &[("pool", "h200")],
        Duration::from_secs(60),
    )
    .await;
    // The churning node has GPUs too, in another pool: the validation could never select it.
    nodes::create_gpu_node(&client, "busy-0", 8, &[("pool", "other")])
        .await
        .expect("busy node");
    let op = OperatorHandle::start(client.clone(), test_config(NS, SIM));
    waits::until("operator ready", Duration::from_secs(60), || async {
        op.is_ready().then_some(())
    })
    .await
    .expect("operator ready");

    let done = Arc::new(AtomicU64::new(0));
    let patcher = tokio::spawn(churn(client.clone(), "busy-0", done.clone()));
    // The storm is on (a second of it) before the validation comes.
    waits::until("the churn under way", Duration::from_secs(30), || async {
        (done.load(Ordering::Relaxed) >= 1000 / EVERY.as_millis() as u64).then_some(())
    })
    .await
    .expect("patches landing");

    let before = done.load(Ordering::Relaxed);
    let applied = Instant::now();
    let gv = scenario::apply_validation(
        &client,
        "churn",
        "under-churn",
        json!({"nodeSelector": {"matchLabels": {"pool": "h200"}}, "checks": {"memory": {}}}),
    )
    .await;
    let generation = gv.metadata.generation;
    let started = wait_validation(
        &client,
        "under-churn",
        START_WITHIN,
        "started",
        move |g: Option<&GpuValidation>| {
            g.and_then(|g| g.status.as_ref())
                .is_some_and(|s| s.observed_generation == generation && s.phase.is_some())
        },
    )
    .await;
    let status_after = applied.elapsed();
    let pod = waits::until("the agent pod", START_WITHIN, || async {
        let pods = agent_pods(&client, "under-churn").await;
        (!pods.is_empty()).then_some(pods.len())
    })
    .await;
    let pod_after = applied.elapsed();
    let during = done.load(Ordering::Relaxed) - before;
    patcher.abort();

    started.unwrap_or_else(|e| panic!("{e} (after {status_after:?}, {during} patches meanwhile)"));
    let pods = pod.unwrap_or_else(|e| panic!("{e} (after {pod_after:?}, {during} patches)"));
    assert_eq!(pods, 1, "one agent pod, for gpu-a");
    // The churn went on while the validation started: at least one patch per 100 ms.
    let floor = pod_after.as_millis() as u64 / 100;
    assert!(
        during >= floor,
        "only {during} patches in {pod_after:?}: the churn did not keep up"
    );
    eprintln!(
        "started after {status_after:?}, agent pod after {pod_after:?}, {during} Node patches meanwhile"
    );
    op.stop().await;
}
