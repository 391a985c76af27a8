//! The shell's write side: carries out a reconcile [`Step`] against the API server (pods and
//! the results bound to them, closed results, the status through server-side apply, events; a
//! failed node's marks are [`crate::node_marks`]'s).

use futures::StreamExt;
use gpuval_crds::{FabricRoundSpec, GpuFabricRound, GpuNodeResult, GpuValidation};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, ResourceExt};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;

use crate::controller::{Ctx, Error, FIELD_MANAGER};
use crate::reconcile::allocation::{self, NodeAllocation};
use crate::reconcile::{PlannedEvent, Step};
use crate::{dra_claim, expected, fabric_key, pod, result_binding};

/// Applies `step` for validation `gv`: deletes first, then creates, then writes the status
/// (only when it changed), then tells (events) and acts on failed nodes. Events and node
/// actions are best effort: their failures are logged, not retried. Certificates come after,
/// once the terminal status is stored ([`crate::certificate_store::after_terminal`]).
pub async fn apply(gv: &GpuValidation, ctx: &Ctx, step: &Step) -> Result<(), Error> {
    delete_all::<Pod>(ctx, &step.delete_pods).await?;
    delete_results(ctx, &step.delete_results).await?;
    create_pods(gv, ctx, &step.create_pods).await?;
    if let Some(round) = &step.create_round {
        // A round too large for one object is written as parts, each under 64 KiB.
        for part in
            gpuval_crds::fabric_shard::shard(round, gpuval_crds::fabric_shard::MAX_PART_BYTES)
        {
            create_round(gv, ctx, &part).await?;
        }
    }
    // Before the status that makes their lines final: a late report never overrides a line.
    result_binding::close(gv, ctx, &step.close_results).await?;
    if gv.status.as_ref() != Some(&step.status) {
        write_status::<GpuValidation>(&gv.name_any(), ctx, &step.status).await?;
        ctx.metrics
            .count_new_verdicts(&step.new_verdicts, step.status.simulated == Some(true));
        if let Some(f) = step.status.fabric.as_ref() {
            ctx.metrics
                .fleet
                .fail_named(&gv.name_any(), &f.failed_nodes);
        }
    }
    // `spec.onFailure` is the node-state controller's (crate::node_marks): it marks a node
    // from its final line, tries again until the mark holds, and takes it back on a pass.
    publish_events(gv, ctx, &step.events).await;
    Ok(())
}

/// Deletes the named objects of kind `K` in the operator's namespace (gone already is fine).
async fn delete_all<K>(ctx: &Ctx, names: &[String]) -> Result<(), kube::Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    for name in names {
        ctx.throttle.acquire().await;
        ignore_not_found(
            api.delete(name, &DeleteParams::background())
                .await
                .map(|_| ()),
        )?;
    }
    Ok(())
}

/// Deletes the named results of an earlier run, each only as the operator's store shows it (a
/// uid precondition): a result made again under the name since (the current pod's) stays.
async fn delete_results(ctx: &Ctx, names: &[String]) -> Result<(), kube::Error> {
    let api: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    for name in names {
        let key = ObjectRef::new(name).within(&ctx.cfg.namespace);
        let uid = ctx.results.get(&key).and_then(|r| r.metadata.uid.clone());
        let dp = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        ctx.throttle.acquire().await;
        match api.delete(name, &dp).await {
            // Gone already, or another object under the name now.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            other => drop(other?),
        }
    }
    Ok(())
}

/// Creates the agent pods for `nodes` ((node, gpus) pairs), `--pod-create-concurrency` at once
/// (each within the API write rate limit); a pod that exists
/// already is fine.
async fn create_pods(gv: &GpuValidation, ctx: &Ctx, nodes: &[(String, i32)]) -> Result<(), Error> {
    if gv.spec.fabric.is_some() && !nodes.is_empty() {
        ensure_fabric_key(gv, ctx).await?;
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let inventory = crate::controller::dra_inventory(ctx);
    let allocations: Vec<NodeAllocation> = nodes
        .iter()
        .map(|(node, _)| allocation::decide(&ctx.cfg.allocation, node, &inventory))
        .collect();
    if allocations
        .iter()
        .any(|a| matches!(a, NodeAllocation::Dra(_)))
    {
        ensure_claim_template(gv, ctx).await?;
    }
    let pods: Vec<(String, Pod)> = nodes
        .iter()
        .zip(&allocations)
        .map(|((node, gpus), how)| (node.clone(), agent_pod(gv, ctx, node, *gpus, how)))
        .collect();
    let names: Vec<String> = nodes.iter().map(|(n, _)| n.clone()).collect();
    let mut baselines = crate::certificate_store::baselines_for(ctx, &names).await;
    let created = futures::stream::iter(pods.into_iter().map(|(node, mut pod)| {
        let (api, pp) = (api.clone(), pp.clone());
        expected::add_baselines(&mut pod, baselines.remove(&node));
        async move { create_pod(gv, ctx, (&api, &pp), &node, &pod).await }
    }))
    .buffer_unordered(ctx.cfg.pod_create_concurrency.max(1))
    .collect::<Vec<_>>()
    .await;
    for c in created {
        if c? {
            ctx.metrics.pods_created.inc();
        }
    }
    Ok(())
}

/// Creates agent pod `pod` of `node` (one that exists already is fine), then the result bound
/// to it ([`result_binding::bind`]); true when the pod is new.
async fn create_pod(
    gv: &GpuValidation,
    ctx: &Ctx,
    (api, pp): (&Api<Pod>, &PostParams),
    node: &str,
    pod: &Pod,
) -> Result<bool, kube::Error> {
    ctx.throttle.acquire().await;
    let created = match api.create(pp, pod).await {
        Ok(p) => Some(p),
        Err(kube::Error::Api(s)) if s.code == 409 => None,
        Err(e) => return Err(e),
    };
    let name = pod.name_any();
    match result_binding::pod_identity(gv, ctx, &name, created.as_ref()).await? {
        Some(identity) => result_binding::bind(gv, ctx, node, &identity).await?,
        None => {
            tracing::warn!(validation = %gv.name_any(), node, pod = %name, "the agent pod is gone or not this validation's; its result is bound on a later step")
        }
    }
    Ok(created.is_some())
}

/// The agent pod of `node`, taking its GPUs the way `how` says, with the GPU count it should
/// show.
fn agent_pod(gv: &GpuValidation, ctx: &Ctx, node: &str, gpus: i32, how: &NodeAllocation) -> Pod {
    let mut pod = pod::agent_pod(gv, node, gpus, &ctx.cfg);
    let expectation = match how {
        NodeAllocation::ExtendedResource => {
            let known = ctx.nodes.get(&ObjectRef::new(node));
            expected::expected_gpus(&gv.spec, known.as_deref())
        }
        NodeAllocation::Dra(published) => {
            let name = gv.metadata.name.as_deref().unwrap_or_default();
            let template = dra_claim::template_name(name, gv.metadata.generation.unwrap_or(0));
            let selector = gv.spec.dra.as_ref().is_some_and(|d| d.selector.is_some());
            dra_claim::use_claim(&mut pod, &template, published, selector);
            dra_claim::expected_gpus(&gv.spec, published)
        }
    };
    expected::add_to_pod(&mut pod, expectation);
    pod
}

/// Creates the claim template of the validation's generation before its DRA pods, which name
/// it (one that exists already is fine). The API server compiles `spec.dra.selector` here: a
/// refusal is a Warning event on the validation (`ClaimTemplateRefused`, with the server's
/// message) and fails the step, which is tried again.
async fn ensure_claim_template(gv: &GpuValidation, ctx: &Ctx) -> Result<(), Error> {
    let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let template = dra_claim::claim_template(gv, &ctx.cfg.allocation, &ctx.cfg.namespace);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    ctx.throttle.acquire().await;
    match api.create(&pp, &template).await {
        Ok(_) => {
            tracing::info!(validation = %gv.name_any(), template = %template.name_any(), class = %ctx.cfg.allocation.device_class, "DRA claim template created");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 422 => {
            let note = format!(
                "the API server refused the ResourceClaimTemplate {} (check spec.dra.selector): {}",
                template.name_any(),
                s.message
            );
            let refused = PlannedEvent {
                warning: true,
                reason: "ClaimTemplateRefused",
                note: note.clone(),
            };
            publish_events(gv, ctx, std::slice::from_ref(&refused)).await;
            Err(Error::ClaimTemplate(note))
        }
        Err(e) => Err(e.into()),
    }
}

/// Creates the validation's fabric key Secret before its fabric pods, which mount it. One that
/// exists is kept when it is this validation's; an earlier validation's of the same name (still
/// being deleted with it) is deleted, and the step fails to be tried again.
async fn ensure_fabric_key(gv: &GpuValidation, ctx: &Ctx) -> Result<(), Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let key = fabric_key::new_key().map_err(Error::FabricKey)?;
    let secret = fabric_key::secret(gv, &ctx.cfg.namespace, key);
    let name = secret.name_any();
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    ctx.throttle.acquire().await;
    match api.create(&pp, &secret).await {
        Ok(_) => {
            tracing::info!(validation = %gv.name_any(), secret = %name, "fabric rendezvous key created");
            return Ok(());
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.throttle.acquire().await;
    if fabric_key::belongs_to(&api.get(&name).await?, gv) {
        return Ok(());
    }
    ctx.throttle.acquire().await;
    ignore_not_found(
        api.delete(&name, &DeleteParams::background())
            .await
            .map(|_| ()),
    )?;
    Err(Error::FabricKey(format!(
        "the Secret {name} belongs to an earlier validation of the same name; it was deleted \
         and is made again on the next try"
    )))
}

/// Creates a fabric round (before the status that announces it; one that exists already is
/// fine: a retried step plans the same round under the same name).
async fn create_round(gv: &GpuValidation, ctx: &Ctx, spec: &FabricRoundSpec) -> Result<(), Error> {
    let api: Api<GpuFabricRound> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let round = pod::fabric_round(gv, spec);
    ctx.throttle.acquire().await;
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, &round).await {
        Ok(_) => {
            tracing::info!(validation = %gv.name_any(), round = spec.round, part = spec.shard, parts = spec.shards, purpose = %spec.purpose, groups = spec.groups.len(), "fabric round planned");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Writes `status` to the cluster-scoped object `name` of kind `K` (a validation or a
/// schedule) through server-side apply.
pub async fn write_status<K>(
    name: &str,
    ctx: &Ctx,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let api: Api<K> = Api::all(ctx.client.clone());
    ctx.throttle.acquire().await;
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Publishes `events` about `obj` (a validation or a schedule), logging the ones that could
/// not be published.
pub async fn publish_events<K>(obj: &K, ctx: &Ctx, events: &[PlannedEvent])
where
    K: Resource<DynamicType = ()>,
{
    let reference = obj.object_ref(&());
    for e in events {
        let ev = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.into(),
            note: Some(e.note.clone()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(kind = %K::kind(&()), name = %obj.name_any(), reason = e.reason, error = %err, "could not publish an event");
        }
    }
}

/// A 404 is no error when deleting.
fn ignore_not_found(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    }
}
