//! The shell of [`crate::decide::node_marks`]: writes a node's `gpuval.io/failed` taint and label as
//! its latest verdict asks. Taints are a list the API server replaces whole, so they are read,
//! edited and written back with the resourceVersion that was read: a concurrent change makes
//! the write fail with 409 Conflict, and it is read and tried again (a few times here, then by
//! the node-state controller with backoff until it holds). Nothing of anyone else's changes.
//! Where the cluster's own controller owns node taints (`--node-taints=cluster`), no taint is
//! written or removed here ([`for_taint_owner`]).

use gpuval_crds::labels;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams, ResourceExt};

use crate::context::Ctx;
use crate::decide::node_marks::{
    Wanted, edit_taints as edit_taints_for, for_taint_owner, label_edit,
};

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
    let removed = edit_node(ctx, name, |node| failure_patch(node, wanted)).await?;
    if !removed.is_empty() {
        tracing::info!(node = %name, ?wanted, removed = ?removed, "failure marks taken away");
    }
    Ok(removed)
}

/// Rewrites node `name`'s taints with `edit` (true when it changed them), the same way.
pub async fn edit_taints(
    ctx: &Ctx,
    name: &str,
    edit: impl Fn(&mut Vec<Taint>) -> bool,
) -> Result<(), kube::Error> {
    edit_node(ctx, name, |node| {
        let mut taints = taints_of(node);
        edit(&mut taints).then(|| (serde_json::json!({"spec": {"taints": taints}}), ()))
    })
    .await
}

/// A read-edit-write of node `name`: `edit` gives the merge patch and what to return, or None
/// when nothing is to change; the patch carries the resourceVersion read, and a 409 Conflict is
/// read and tried again, [`CONFLICT_TRIES`] times in all. A node that is gone gives the default.
async fn edit_node<T: Default>(
    ctx: &Ctx,
    name: &str,
    edit: impl Fn(&Node) -> Option<(serde_json::Value, T)>,
) -> Result<T, kube::Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut tries = 0;
    loop {
        tries += 1;
        ctx.throttle.acquire().await;
        let Some(node) = api.get_opt(name).await? else {
            return Ok(T::default());
        };
        let Some((mut patch, out)) = edit(&node) else {
            return Ok(T::default());
        };
        patch["metadata"]["resourceVersion"] = serde_json::json!(node.metadata.resource_version);
        ctx.throttle.acquire().await;
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(out),
            Err(kube::Error::Api(s)) if s.code == 409 && tries < CONFLICT_TRIES => {
                tracing::debug!(node = %name, tries, "the node changed while it was written; reading it again");
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(T::default()),
            Err(e) => return Err(e),
        }
    }
}

fn taints_of(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// The merge patch that brings `node`'s failure taint and label in line with `wanted`, with
/// what it removes in words; None when nothing is to change.
fn failure_patch(node: &Node, wanted: &Wanted) -> Option<(serde_json::Value, Vec<String>)> {
    let before = taints_of(node);
    let mut taints = before.clone();
    let taints_changed = edit_taints_for(&mut taints, wanted);
    let label_now = node.labels().get(labels::FAILED_NODE).cloned();
    let label = label_edit(label_now.as_deref(), wanted);
    if !taints_changed && label.is_none() {
        return None;
    }
    let mut patch = serde_json::json!({});
    if taints_changed {
        patch["spec"] = serde_json::json!({ "taints": taints });
    }
    if let Some(value) = &label {
        patch["metadata"] = serde_json::json!({"labels": { labels::FAILED_NODE: value }});
    }
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
    Some((patch, removed))
}
