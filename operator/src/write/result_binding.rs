//! The operator's part of result binding ([`gpuval_crds::binding`]): it creates each agent
//! pod's `GpuNodeResult` right after the pod, bound to the run and that pod; it binds a result
//! that carries no report to the pod that replaced its own; and it closes the result of a node
//! whose line became final without it, so that a late report is kept for the record and never
//! overrides the line. Agents only write their report into the result bound to their pod.

use std::collections::BTreeSet;

use gpuval_crds::binding::{self, Binding};
use gpuval_crds::result::result_name;
use gpuval_crds::{GpuNodeResult, GpuValidation, NodeVerdict, labels};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, ResourceExt};
use kube::runtime::reflector::ObjectRef;

use crate::caches::pod_views::PodIdentity;
use crate::context::{Ctx, FIELD_MANAGER};
use crate::read::observe::{has_report, owned_by};

/// What to do about a node's existing result, given the binding it should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// It is bound to this very pod.
    Bound,
    /// It belongs to this run, is bound to an earlier pod and carries no report: bind it to
    /// this pod.
    Rebind,
    /// It belongs to another run (an earlier generation, or an earlier validation of the same
    /// name), or to none: delete it and create this run's.
    Replace,
    /// Keep it as it is (closed, or it carries an earlier pod's report, kept for the record),
    /// and why.
    Keep(String),
}

/// What to do about an existing result with metadata `meta`, for binding `want`.
pub fn decide(meta: &ObjectMeta, want: &Binding) -> Existing {
    let Some(bound) = Binding::of(meta) else {
        return Existing::Replace;
    };
    if !bound.is_run(&want.validation_uid, want.generation) || bound.node != want.node {
        return Existing::Replace;
    }
    if let Some(verdict) = binding::closed(meta) {
        return Existing::Keep(format!(
            "it is closed (the node's line became final as {verdict} without it)"
        ));
    }
    if bound == *want {
        return Existing::Bound;
    }
    if has_report(meta) {
        return Existing::Keep(format!(
            "it carries the report of the earlier pod {} (uid {}), kept for the record; that report does not count and the new pod cannot write it",
            bound.pod, bound.pod_uid
        ));
    }
    Existing::Rebind
}

/// The binding of `node`'s result to agent pod `pod` in the run of `gv`.
fn binding_of(gv: &GpuValidation, node: &str, pod: &PodIdentity) -> Binding {
    Binding {
        validation_uid: gv.metadata.uid.clone().unwrap_or_default(),
        generation: gv.metadata.generation.unwrap_or(0),
        node: node.to_string(),
        pod: pod.name.clone(),
        pod_uid: pod.uid.clone().unwrap_or_default(),
    }
}

/// Creates the result of `node`'s agent pod `pod` for the run of `gv`, or settles the one that
/// exists ([`decide`]): bound already, bound to `pod` now, replaced, or kept as it is.
pub async fn bind(
    gv: &GpuValidation,
    ctx: &Ctx,
    node: &str,
    pod: &PodIdentity,
) -> Result<(), kube::Error> {
    let want = binding_of(gv, node, pod);
    let validation = gv.name_any();
    let mut object = want.result(&validation, &ctx.cfg.namespace);
    // The Node object the pod runs on: a node created again under its name inherits no verdict
    // of this result (crate::decide::node_state::Incarnation).
    let node_uid = ctx
        .nodes
        .get(&kube::runtime::reflector::ObjectRef::new(node))
        .and_then(|n| n.metadata.uid.clone());
    if let (Some(uid), Some(ann)) = (node_uid, object.metadata.annotations.as_mut()) {
        ann.insert(labels::NODE_UID.to_string(), uid);
    }
    let api: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let name = object.name_any();
    if create(ctx, &api, &object).await? {
        return Ok(());
    }
    ctx.throttle.acquire().await;
    let existing = api.get_metadata(&name).await?;
    match decide(&existing.metadata, &want) {
        Existing::Bound => Ok(()),
        Existing::Keep(why) => {
            tracing::warn!(validation = %validation, node, result = %name, pod = %pod.name, reason = %why, "the result stays as it is");
            Ok(())
        }
        Existing::Rebind => {
            let patch = serde_json::json!({"metadata": {
                "resourceVersion": existing.metadata.resource_version,
                "annotations": {labels::POD: want.pod, labels::POD_UID: want.pod_uid},
            }});
            ctx.throttle.acquire().await;
            api.patch(&name, &merge(), &Patch::Merge(&patch)).await?;
            tracing::info!(validation = %validation, node, result = %name, pod = %pod.name, "result bound to the pod that replaced its own");
            Ok(())
        }
        Existing::Replace => {
            let pre = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: existing.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::background()
            };
            ctx.throttle.acquire().await;
            match api.delete(&name, &pre).await {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                other => drop(other?),
            }
            tracing::info!(validation = %validation, node, result = %name, "replaced another run's result");
            // A result that came back in between (a racing step) fails this step, which is
            // tried again.
            create(ctx, &api, &object).await.map(drop)
        }
    }
}

/// Creates `object`; false when one of its name exists.
async fn create(
    ctx: &Ctx,
    api: &Api<GpuNodeResult>,
    object: &GpuNodeResult,
) -> Result<bool, kube::Error> {
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    ctx.throttle.acquire().await;
    match api.create(&pp, object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

fn merge() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// The identity of agent pod `name` of `gv`: `created` when this step created it, else the
/// pod as it is (None when it is gone or not this validation's).
pub async fn pod_identity(
    gv: &GpuValidation,
    ctx: &Ctx,
    name: &str,
    created: Option<&Pod>,
) -> Result<Option<PodIdentity>, kube::Error> {
    let pod = match created {
        Some(p) => Some(p.clone()),
        None => {
            let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
            api.get_opt(name).await?
        }
    };
    let uid = gv.metadata.uid.as_deref().unwrap_or_default();
    Ok(pod
        .filter(|p| owned_by(&p.metadata, uid))
        .map(|p| PodIdentity {
            name: p.name_any(),
            uid: p.metadata.uid,
        }))
}

/// Closes the results of `nodes`, whose lines became final (with the verdict given) without
/// them, so that no late report overrides a line. One closed already, or none, is left alone.
pub async fn close(
    gv: &GpuValidation,
    ctx: &Ctx,
    nodes: &[(String, NodeVerdict)],
) -> Result<(), kube::Error> {
    let api: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let validation = gv.name_any();
    for (node, verdict) in nodes {
        let name = result_name(&validation, node);
        let key = ObjectRef::new(&name).within(&ctx.cfg.namespace);
        if ctx
            .results
            .get(&key)
            .is_some_and(|r| binding::closed(&r.metadata).is_some())
        {
            continue;
        }
        let patch =
            serde_json::json!({"metadata": {"annotations": {labels::CLOSED: verdict.as_str()}}});
        ctx.throttle.acquire().await;
        match api.patch(&name, &merge(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(validation = %validation, node = %node, result = %name, verdict = %verdict, "result closed: the node's line is final without it")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The agent pods of `gv`'s current run (on `nodes` only, when given) whose result, as the
/// operator's store shows it, should be bound to them and is not: missing, of another run, or
/// bound to another pod without a report. A closed result, or one that carries another pod's
/// report, stays as it is ([`decide`]) and is left out. The shell binds them ([`bind`]).
pub fn unbound(
    gv: &GpuValidation,
    ctx: &Ctx,
    nodes: Option<&BTreeSet<String>>,
) -> Vec<(String, PodIdentity)> {
    let uid = gv.metadata.uid.as_deref().unwrap_or_default();
    let generation = gv.metadata.generation.unwrap_or(0);
    let validation = gv.name_any();
    ctx.pods
        .current_by_node(uid, generation)
        .into_iter()
        .filter(|(node, _)| nodes.is_none_or(|n| n.contains(node)))
        .filter(|(node, pod)| {
            let key = ObjectRef::new(&result_name(&validation, node)).within(&ctx.cfg.namespace);
            let Some(r) = ctx.results.get(&key) else {
                return true;
            };
            let want = binding_of(gv, node, pod);
            matches!(
                decide(&r.metadata, &want),
                Existing::Rebind | Existing::Replace
            )
        })
        .collect()
}

/// The results of `gv`'s current run (on `nodes` only, when given) whose metadata says a report
/// may be stored (a verdict label and a write of the status in `managedFields`, which any writer
/// can forge: a hint of where to look, never evidence) and that the operator has not checked
/// ([`gpuval_crds::binding::report_checked`]) or closed. The shell checks them ([`check`]).
pub fn unchecked(gv: &GpuValidation, ctx: &Ctx, nodes: Option<&BTreeSet<String>>) -> Vec<String> {
    let uid = gv.metadata.uid.as_deref().unwrap_or_default();
    let generation = gv.metadata.generation.unwrap_or(0);
    ctx.results
        .state()
        .iter()
        .filter(|r| owned_by(&r.metadata, uid))
        .filter(|r| Binding::of(&r.metadata).is_some_and(|b| b.is_run(uid, generation)))
        .filter(|r| {
            nodes.is_none_or(|n| {
                crate::read::observe::node_of(&r.metadata).is_some_and(|x| n.contains(x))
            })
        })
        .filter(|r| r.labels().contains_key(labels::VERDICT) && has_report(&r.metadata))
        .filter(|r| {
            binding::report_checked(&r.metadata).is_none() && binding::closed(&r.metadata).is_none()
        })
        .map(|r| r.name_any())
        .collect()
}

/// Results whose stored reports are read and checked at once.
pub const CHECKS_AT_ONCE: usize = 8;

/// Reads result `name` whole and, when its stored report holds
/// ([`gpuval_crds::binding::check_report`]), marks it checked now
/// ([`labels::REPORT_CHECKED`], on the version read): from then on it counts, dated by this
/// time. One that does not hold is left unchecked (logged): it never counts.
pub async fn check(gv: &GpuValidation, ctx: &Ctx, name: &str) -> Result<(), kube::Error> {
    let api: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let validation = gv.name_any();
    ctx.throttle.acquire().await;
    let Some(result) = api.get_opt(name).await? else {
        return Ok(());
    };
    if let Err(why) = binding::check_report(&result) {
        tracing::warn!(validation = %validation, result = %name, reason = %why, "the result's report does not count");
        return Ok(());
    }
    let now = ctx.cfg.clock.now();
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": result.metadata.resource_version,
        "annotations": {labels::REPORT_CHECKED: now.to_string()},
    }});
    ctx.throttle.acquire().await;
    match api.patch(name, &merge(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(validation = %validation, result = %name, checked_at = %now, "the result's stored report is checked: it counts");
            Ok(())
        }
        // Written in between (the next wake checks it again), or gone.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn want() -> Binding {
        Binding {
            validation_uid: "v-uid".into(),
            generation: 2,
            node: "gpu-0".into(),
            pod: "gpuval-v-gpu-0-1-g2".into(),
            pod_uid: "pod-now".into(),
        }
    }

    fn existing(b: &Binding) -> ObjectMeta {
        b.result("v", "ns").metadata
    }

    fn reported(mut meta: ObjectMeta) -> ObjectMeta {
        meta.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("gpuval-agent/gpu-0".into()),
            subresource: Some("status".into()),
            ..Default::default()
        }]);
        meta
    }

    #[test]
    fn a_result_bound_to_this_pod_stays() {
        assert_eq!(decide(&existing(&want()), &want()), Existing::Bound);
    }

    #[test]
    fn an_earlier_pods_result_without_a_report_is_bound_to_the_new_pod() {
        let earlier = Binding {
            pod_uid: "pod-before".into(),
            ..want()
        };
        assert_eq!(decide(&existing(&earlier), &want()), Existing::Rebind);
    }

    #[test]
    fn an_earlier_pods_report_is_kept_for_the_record() {
        let earlier = Binding {
            pod_uid: "pod-before".into(),
            ..want()
        };
        let kept = decide(&reported(existing(&earlier)), &want());
        assert!(
            matches!(&kept, Existing::Keep(why) if why.contains("pod-before") && why.contains("record")),
            "{kept:?}"
        );
    }

    #[test]
    fn a_closed_result_is_never_rebound() {
        let earlier = Binding {
            pod_uid: "pod-before".into(),
            ..want()
        };
        let mut meta = existing(&earlier);
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(labels::CLOSED.into(), "DeadlineExceeded".into());
        let kept = decide(&meta, &want());
        assert!(
            matches!(&kept, Existing::Keep(why) if why.contains("DeadlineExceeded")),
            "{kept:?}"
        );
    }

    #[test]
    fn another_runs_or_an_unbound_result_is_replaced() {
        let older = Binding {
            generation: 1,
            ..want()
        };
        assert_eq!(
            decide(&reported(existing(&older)), &want()),
            Existing::Replace
        );
        let recreated = Binding {
            validation_uid: "earlier-validation".into(),
            ..want()
        };
        assert_eq!(decide(&existing(&recreated), &want()), Existing::Replace);
        assert_eq!(decide(&ObjectMeta::default(), &want()), Existing::Replace);
    }
}
