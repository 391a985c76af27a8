//! Node results for tests that stand in for the operator or for an agent: a result created and
//! bound to an agent pod as the operator creates it ([`gpuval_crds::binding`]), and a report
//! written into it as the agent writes one (a merge patch of the report's labels and
//! annotations, then the status with server-side apply).

use gpuval_crds::binding::Binding;
use gpuval_crds::{GpuNodeResult, GpuValidation, labels};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::auth::BoundPod;

/// The binding of `node`'s result of `gv`'s current generation to agent pod `pod`.
pub fn binding(gv: &GpuValidation, node: &str, pod: &BoundPod) -> Binding {
    Binding {
        validation_uid: gv.metadata.uid.clone().unwrap_or_default(),
        generation: gv.metadata.generation.unwrap_or(0),
        node: node.into(),
        pod: pod.name.clone(),
        pod_uid: pod.uid.clone(),
    }
}

/// Creates `node`'s result of `gv` in `namespace`, bound to `pod`, as the operator does.
pub async fn create_bound(
    client: &Client,
    namespace: &str,
    gv: &GpuValidation,
    node: &str,
    pod: &BoundPod,
) -> Result<GpuNodeResult, kube::Error> {
    let object = binding(gv, node, pod).result(&gv.name_any(), namespace);
    Api::<GpuNodeResult>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
}

/// The merge patch of a report's labels and annotations with verdict `verdict`.
pub fn report_metadata(verdict: &str) -> Value {
    json!({"metadata": {
        "labels": {labels::VERDICT: verdict, labels::ACTION: "None"},
        "annotations": {labels::SUMMARY: format!("a report that says {verdict}")},
    }})
}

/// A report's status with verdict `verdict` on `node`, as the status apply carries it.
pub fn report_status(node: &str, verdict: &str) -> Value {
    json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
        "status": {"verdict": verdict, "node": node, "simulated": false, "backend": "cuda", "agentVersion": "test",
                   "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:01:00Z"}})
}

/// Writes a report with verdict `verdict` into `node`'s result `name` as its agent does (with
/// `client`, the agent's identity): the labels and annotations, then the status.
pub async fn write_report(
    client: &Client,
    namespace: &str,
    name: &str,
    node: &str,
    verdict: &str,
) -> Result<(), kube::Error> {
    let api: Api<GpuNodeResult> = Api::namespaced(client.clone(), namespace);
    let manager = format!("gpuval-agent/{}", labels::node_value(node));
    let merge = PatchParams {
        field_manager: Some(manager.clone()),
        ..Default::default()
    };
    api.patch(name, &merge, &Patch::Merge(report_metadata(verdict)))
        .await?;
    api.patch_status(
        name,
        &PatchParams::apply(&manager).force(),
        &Patch::Apply(report_status(node, verdict)),
    )
    .await?;
    Ok(())
}
