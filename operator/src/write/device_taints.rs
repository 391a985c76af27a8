//! The shell of [`crate::decide::reconcile::device_taints`]: finds out through discovery whether the API
//! server serves `DeviceTaintRule` (KEP-5055; in Kubernetes 1.36 `resource.k8s.io/v1beta2`
//! behind the `DRADeviceTaintRules` gate), and per node, after its verdict changes, writes the
//! rules of its failed GPUs and removes those of GPUs that passed again. Where the kind is not
//! served, nothing is written: the node's condition, labels and `spec.onFailure` taint (which
//! work on DRA nodes as on any other) are what schedulers see.

use gpuval_crds::GpuNodeResult;
use gpuval_crds::result::result_name;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, ResourceExt};
use kube::discovery::{ApiResource, Discovery};

use crate::context::{Ctx, FIELD_MANAGER};
use crate::decide::node_evidence::Evidence;
use crate::decide::reconcile::device_taints;

/// The served `DeviceTaintRule` resource (its most stable version), or None.
pub async fn discover(client: &Client) -> Option<ApiResource> {
    let found = Discovery::new(client.clone())
        .filter(&["resource.k8s.io"])
        .run()
        .await;
    let discovery = match found {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "discovery of resource.k8s.io failed; no device taints");
            return None;
        }
    };
    let rule = discovery.get("resource.k8s.io").and_then(|g| {
        g.resources_by_stability()
            .into_iter()
            .map(|(ar, _)| ar)
            .find(|ar| ar.kind == "DeviceTaintRule")
    });
    match &rule {
        Some(ar) => {
            tracing::info!(version = %ar.api_version, "failed GPUs on DRA nodes get DeviceTaintRules")
        }
        None => tracing::info!(
            "the API server serves no DeviceTaintRule (resource.k8s.io/v1beta2 with the DRADeviceTaintRules feature gate): failed GPUs on DRA nodes show in the node's condition, labels and spec.onFailure taint only"
        ),
    }
    rule
}

/// Brings node `node`'s rules in line with its latest verdict `evidence` (nothing without one,
/// or when the node has no GPU in the driver's slices); the rules it removed (GPUs that passed
/// again, returned to service by `evidence`'s run).
pub async fn sync_node(
    ctx: &Ctx,
    rule: &ApiResource,
    node: &str,
    evidence: Option<&Evidence>,
) -> Result<Vec<String>, kube::Error> {
    let inventory = crate::context::dra_inventory(ctx);
    let published = inventory.gpus(node);
    let Some(evidence) = evidence.filter(|_| !published.is_empty()) else {
        return Ok(Vec::new());
    };
    // A failed verdict: the GPUs its report failed get rules, those it passed lose theirs. A
    // verdict without a report (Error, DeadlineExceeded) changes nothing.
    let (failed, passed) = if evidence.passed {
        (Vec::new(), None)
    } else {
        let results: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
        ctx.throttle.acquire().await;
        let report = results
            .get_opt(&result_name(&evidence.validation, node))
            .await?
            .and_then(|r| r.status);
        let Some(report) = report else {
            return Ok(Vec::new());
        };
        let passed = device_taints::passed_rules(&report, published);
        (device_taints::failed_gpus(&report), Some(passed))
    };
    let want = device_taints::desired(
        &rule.api_version,
        &ctx.cfg.allocation.driver,
        &evidence.validation,
        node,
        &failed,
        published,
    );
    let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), rule);
    let selector = format!(
        "{}={},{}={}",
        gpuval_crds::labels::MANAGED_BY_KEY,
        gpuval_crds::labels::MANAGED_BY,
        gpuval_crds::labels::NODE,
        gpuval_crds::labels::node_value(node)
    );
    let existing: Vec<String> = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .map(|r| r.name_any())
        .collect();
    for body in &want {
        let name = body["metadata"]["name"].as_str().unwrap_or_default();
        ctx.throttle.acquire().await;
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await?;
        tracing::info!(node, rule = name, validation = %evidence.validation, "device taint written");
    }
    let mut removed = Vec::new();
    for name in device_taints::stale(&existing, &want, passed.as_ref()) {
        ctx.throttle.acquire().await;
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(node, rule = %name, validation = %evidence.validation, "device taint removed: the GPU passed");
                removed.push(name);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}
