//! The shell of [`crate::failure_marks`]: writes a node's `gpuval.io/failed` taint and label as
//! its latest verdict asks. Taints are a list the API server replaces whole, so they are read,
//! edited and written back with the resourceVersion that was read: a concurrent change makes
//! the write fail with 409 Conflict, and it is read and tried again (a few times here, then by
//! the node-state controller with backoff until it holds). Nothing of anyone else's changes.
//! Where the cluster's own controller owns node taints (`--node-taints=cluster`), no taint is
//! written or removed here ([`for_taint_owner`]).

use gpuval_crds::labels;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams, ResourceExt};

use crate::controller::Ctx;
use crate::failure_marks::{Wanted, edit_taints, for_taint_owner, label_edit};

/// Conflicts tried again at once before the controller's backoff takes over.
const CONFLICT_TRIES: usize = 3;

/// Brings node `name`'s failure taint and label in line with `wanted`; what it removed, in
/// words (`taint gpuval.io/failed=a:NoSchedule`, `label gpuval.io/failed=a`), for the
/// return-to-service event. A node that is gone is no error.
pub async fn write(ctx: &Ctx, name: &str, wanted: &Wanted) -> Result<Vec<String>, kube::Error> {
    let wanted = &for_taint_owner(wanted, ctx.cfg.node_taints);
    if *wanted == Wanted::Keep {
        return Ok(Vec::new());
    }
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut tries = 0;
    loop {
        tries += 1;
        match write_once(ctx, &api, name, wanted).await {
            Err(kube::Error::Api(s)) if s.code == 409 && tries < CONFLICT_TRIES => {
                tracing::debug!(node = %name, tries, "the node changed while its failure marks were written; reading it again");
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Vec::new()),
            other => return other,
        }
    }
}

/// One read-edit-write of node `name`.
async fn write_once(
    ctx: &Ctx,
    api: &Api<Node>,
    name: &str,
    wanted: &Wanted,
) -> Result<Vec<String>, kube::Error> {
    ctx.throttle.acquire().await;
    let Some(node) = api.get_opt(name).await? else {
        return Ok(Vec::new());
    };
    let before: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut taints = before.clone();
    let taints_changed = edit_taints(&mut taints, wanted);
    let label_now = node.labels().get(labels::FAILED_NODE).cloned();
    let label = label_edit(label_now.as_deref(), wanted);
    if !taints_changed && label.is_none() {
        return Ok(Vec::new());
    }
    let mut patch = serde_json::json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
    });
    if taints_changed {
        patch["spec"] = serde_json::json!({ "taints": taints });
    }
    if let Some(value) = &label {
        patch["metadata"]["labels"] = serde_json::json!({ labels::FAILED_NODE: value });
    }
    ctx.throttle.acquire().await;
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    tracing::info!(node = %name, ?wanted, taints_changed, label = ?label, "failure marks");
    let mut removed: Vec<String> = before
        .iter()
        .filter(|t| !taints.contains(t))
        .map(|t| {
            format!(
                "taint {}={}:{}",
                t.key,
                t.value.as_deref().unwrap_or_default(),
                t.effect
            )
        })
        .collect();
    if let (Some(None), Some(old)) = (&label, &label_now) {
        removed.push(format!("label {}={old}", labels::FAILED_NODE));
    }
    Ok(removed)
}
