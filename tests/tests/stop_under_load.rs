//! The operator stops when told, under load (issue 55, point 3): on a real control plane (etcd,
//! kube-apiserver, controller-manager, scheduler, kwok), the release binary with leader
//! election, a validation of 20 nodes creating its agent pods and two unrelated Nodes patched
//! every 20 ms each, SIGTERM ends the process within the chart's grace period
//! (`terminationGracePeriodSeconds: 30`), with exit status 0 and the Lease handed back.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuval_tests::replica::{LeaseTiming, Replica, ReplicaSettings};
use gpuval_tests::scenario;
use gpuval_tests::{ControlPlane, Options, nodes, waits};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const NS: &str = "gpuval-system";
const SIM: &str = "gpus=8,model=H200,timescale=0.002";
const LEASE: &str = "gpuval-operator";
/// The chart's `terminationGracePeriodSeconds`.
const GRACE: Duration = Duration::from_secs(30);

/// Patches Node `name` every 20 ms until the task is aborted.
async fn churn(client: Client, name: String) {
    let api: Api<Node> = Api::all(client);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0u64.. {
        tick.tick().await;
        let patch = json!({"metadata": {"annotations": {"churn.gpuval.io/n": i.to_string()}}});
        let _ = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
}

async fn holder(client: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), NS)
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()?;
    lease.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_churn_burst_stops_the_operator_within_its_grace_period() {
    let cp = ControlPlane::start_with(Options::all())
        .await
        .expect("control plane");
    let client = cp.client().await.expect("client");
    scenario::install(&client, NS).await;
    let names: Vec<String> = (0..20).map(|i| format!("gpu-{i:02}")).collect();
    let gpu_nodes: Vec<&str> = names.iter().map(String::as_str).collect();
    let pool = [("pool", "h200")];
    scenario::ready_gpu_nodes(&client, &gpu_nodes, 8, &pool, Duration::from_secs(120)).await;
    for busy in ["busy-0", "busy-1"] {
        nodes::create_gpu_node(&client, busy, 8, &[("pool", "other")])
            .await
            .expect("busy node");
    }
    let settings = ReplicaSettings {
        namespace: NS.into(),
        lease: LEASE.into(),
        simulate: SIM.into(),
        timing: LeaseTiming::default(),
    };
    let op = Replica::start(&cp, &client, "replica-a", &settings)
        .await
        .expect("operator");
    waits::until("replica-a leading", Duration::from_secs(60), || async {
        (holder(&client).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await
    .expect("leader");

    let patchers: Vec<_> = ["busy-0", "busy-1"]
        .into_iter()
        .map(|n| tokio::spawn(churn(client.clone(), n.to_string())))
        .collect();
    scenario::apply_validation(
        &client,
        "stop",
        "under-load",
        json!({"nodeSelector": {"matchLabels": {"pool": "h200"}}, "checks": {"memory": {}}}),
    )
    .await;
    // The run is under way: its first agent pods exist, more are being written.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    waits::until("agent pods", Duration::from_secs(30), || async {
        let listed = pods.list(&ListParams::default()).await.ok()?;
        let owned = |p: &&Pod| p.owner_references().iter().any(|o| o.name == "under-load");
        (listed.items.iter().filter(owned).count() > 0).then_some(())
    })
    .await
    .expect("the run started");

    let op = Mutex::new(op);
    let signalled = Instant::now();
    op.lock().unwrap_or_else(|e| e.into_inner()).terminate();
    let exited = waits::until("the operator's exit", GRACE, || async {
        op.lock().unwrap_or_else(|e| e.into_inner()).exited()
    })
    .await;
    let took = signalled.elapsed();
    patchers.iter().for_each(tokio::task::JoinHandle::abort);
    let op = op.into_inner().unwrap_or_else(|e| e.into_inner());
    let status = exited.unwrap_or_else(|e| panic!("{e}; log:\n{}", op.logs()));
    assert!(
        status.success(),
        "exit {status} after {took:?}; log:\n{}",
        op.logs()
    );
    assert!(took < GRACE, "took {took:?}; log:\n{}", op.logs());
    assert_eq!(holder(&client).await, None, "the Lease handed back");
    eprintln!("stopped {took:?} after SIGTERM");
}
