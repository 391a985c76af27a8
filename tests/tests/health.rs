//! Verdicts an operator can act on, end to end on a real control plane (etcd, kube-apiserver,
//! controller-manager, scheduler, kwok): the operator passes each agent its node's GPU count (the
//! node's `nvidia.com/gpu` capacity here), an agent whose simulated node shows one GPU fewer
//! fails at once with the code and action in the validation's node line and the node's
//! condition and labels, the fleet's versions land in `status.fleet` with the node that differs
//! from the majority (a Warn), and the API server refuses a severity override of an unknown
//! code or of one code twice.

use gpuval_crds::{Action, GpuNodeResult, GpuValidation, NodeVerdict, Phase, Verdict};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{self, terminal, wait};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
const SIM: &str = "gpus=8,model=H200,timescale=0.002";

fn body(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation", "metadata": {"name": name}, "spec": spec})
}

async fn apply(client: &Client, name: &str, spec: Value) -> Result<GpuValidation, kube::Error> {
    Api::<GpuValidation>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("health"),
            &Patch::Apply(&body(name, spec)),
        )
        .await
}

fn condition_message(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "GpuValidated")?
        .message
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_short_of_a_gpu_fails_fast_and_the_fleet_names_the_driver_that_drifted() {
    let scenario::Cluster {
        cp: _cp,
        client,
        kubelet,
        ..
    } = scenario::Cluster::start_labelled(NS, &["gpu-a", "gpu-b", "gpu-c"], 8, &[]).await;
    // gpu-b runs an older driver; gpu-c's NVML shows 7 of the 8 GPUs its node advertises.
    let driver = |v: &str| format!("{SIM},version=driver:{v}+vbios:96.00.99.00.01");
    kubelet.set_node_env("gpu-a", "GPUVAL_SIMULATE", &driver("570.86.15"));
    kubelet.set_node_env("gpu-b", "GPUVAL_SIMULATE", &driver("535.104.05"));
    let seven = format!("{},gpus=7", driver("570.86.15"));
    kubelet.set_node_env("gpu-c", "GPUVAL_SIMULATE", &seven);
    // The node's condition and labels are asserted: the test-only opt-in lets these simulated
    // results act on (kwok) nodes.
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    let _op = OperatorHandle::start(client.clone(), cfg);

    // The API server refuses what a severity override may not say, naming the field.
    let bad = apply(
        &client,
        "bad-override",
        json!({"checks": {"memory": {}}, "severityOverrides": [{"code": "RowsRemaped", "severity": "Fail"}]}),
    )
    .await
    .expect_err("an unknown code is refused");
    let text = bad.to_string();
    assert!(
        text.contains("spec.severityOverrides[0].code") && text.contains("RowsRemaped"),
        "{text}"
    );
    let twice = apply(
        &client,
        "bad-override",
        json!({"checks": {"memory": {}}, "severityOverrides": [
            {"code": "RowsRemapped", "severity": "Fail"}, {"code": "RowsRemapped", "severity": "Info"}]}),
    )
    .await
    .expect_err("a code twice is refused");
    // Server-side apply refuses it while merging (`duplicate entries for key [code=...]`), a
    // create while validating (`Duplicate value`): either way naming the field and the code.
    let twice = twice.to_string();
    assert!(
        twice.contains("spec.severityOverrides")
            && twice.contains("uplicate")
            && twice.contains("RowsRemapped"),
        "{twice}"
    );

    apply(
        &client,
        "fleet",
        json!({"checks": {"topology": {}, "memory": {}, "compute": {"duration": "30s"}},
               "severityOverrides": [{"code": "RowsRemapped", "severity": "Fail"}]}),
    )
    .await
    .expect("a valid validation");
    let validations: Api<GpuValidation> = Api::all(client.clone());
    let gv = wait(validations, "fleet", 120, "terminal", terminal).await;
    let s = gv.status.as_ref().expect("status");
    assert_eq!(s.phase, Some(Phase::Failed));

    // The node short of a GPU: its line says what, with the code and the action.
    let c = s
        .nodes
        .iter()
        .find(|n| n.name == "gpu-c")
        .expect("gpu-c listed");
    assert_eq!(c.verdict, NodeVerdict::Failed);
    assert_eq!(c.codes.as_deref(), Some("GpuCountMismatch"));
    assert_eq!(c.action, Some(Action::RebootNode));
    let message = c.message.as_deref().unwrap_or_default();
    assert!(
        message.starts_with(
            "7 GPUs visible, 8 expected (the node's nvidia.com/gpu capacity): NVML sees 0000:18:00.0"
        ),
        "{message}"
    );
    assert!(
        s.nodes.iter().all(|n| n.name == "gpu-c"),
        "the others passed: {:?}",
        s.nodes
    );
    // It failed before the long checks: its result has no memory or compute figures.
    let results: Api<GpuNodeResult> = Api::namespaced(client.clone(), NS);
    let rc = results
        .get(&gpuval_crds::result::result_name("fleet", "gpu-c"))
        .await
        .expect("gpu-c's result");
    let report = rc.status.expect("report");
    assert_eq!(report.verdict, Verdict::Fail);
    assert!(
        report
            .gpus
            .iter()
            .all(|g| g.memory.is_none() && g.compute.is_none())
    );
    assert_eq!(
        rc.metadata.labels.as_ref().unwrap()["gpuval.io/action"],
        "RebootNode"
    );

    // The fleet: gpu-b's driver differs from the other two (a Warn; the phase is the nodes').
    let fleet = s.fleet.as_ref().expect("status.fleet");
    assert_eq!(fleet.verdict, Verdict::Warn);
    assert_eq!(fleet.nodes, 3);
    assert_eq!(
        fleet.message.as_deref(),
        Some("driver: 1 of 3 nodes differ from 570.86.15 (gpu-b 535.104.05)")
    );
    let drivers = fleet
        .components
        .iter()
        .find(|c| c.component == "driver")
        .expect("driver");
    assert_eq!(drivers.differing.len(), 1);
    assert_eq!(drivers.differing[0].node, "gpu-b");
    let vbios = fleet
        .components
        .iter()
        .find(|c| c.component == "vbios")
        .expect("vbios");
    assert!(vbios.differing.is_empty() && vbios.majority == "96.00.99.00.01");

    // The node carries the action and the code where schedulers and people look.
    let node_api: Api<Node> = Api::all(client.clone());
    let marked = wait(node_api, "gpu-c", 60, "marked", |n: Option<&Node>| {
        n.is_some_and(|n| condition_message(n).is_some())
    })
    .await;
    assert_eq!(
        marked.labels().get("gpuval.io/action").map(String::as_str),
        Some("RebootNode")
    );
    let m = condition_message(&marked).unwrap_or_default();
    assert!(
        m.starts_with(
            "[GpuCountMismatch; action RebootNode] GpuValidation fleet: 7 GPUs visible, 8 expected"
        ),
        "{m}"
    );
    let reasons = &s.summary.as_ref().expect("summary").reasons;
    assert_eq!(
        reasons[0].reason, "Fail: GpuCountMismatch",
        "the summary counts findings by code: {reasons:?}"
    );
    drop(kubelet);
}
