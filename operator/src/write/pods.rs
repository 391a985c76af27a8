//! The agent pods of a run and the results bound to them: created (the fabric key and the DRA
//! claim template first, where the pods need them), and an earlier run's deleted.

use futures::StreamExt;
use gpuval_crds::{GpuNodeResult, GpuValidation};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::{Api, DeleteParams, PostParams, Preconditions, ResourceExt};
use kube::runtime::reflector::ObjectRef;

use super::{create_params, ignore_not_found};
use crate::context::{Ctx, Error};
use crate::decide::reconcile::allocation::{self, NodeAllocation};
use crate::decide::{claims, expected, pod};
use crate::write::result_binding;

/// Deletes the named objects of kind `K` in the operator's namespace (gone already is fine).
pub async fn delete_all<K>(ctx: &Ctx, names: &[String]) -> Result<(), kube::Error>
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
pub async fn delete_results(ctx: &Ctx, names: &[String]) -> Result<(), kube::Error> {
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
pub async fn create_pods(
    gv: &GpuValidation,
    ctx: &Ctx,
    nodes: &[(String, i32)],
) -> Result<(), Error> {
    if gv.spec.fabric.is_some() && !nodes.is_empty() {
        super::fabric::ensure_key(gv, ctx).await?;
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let pp = create_params();
    let inventory = crate::context::dra_inventory(ctx);
    let allocations: Vec<NodeAllocation> = nodes
        .iter()
        .map(|(node, _)| allocation::decide(&ctx.cfg.allocation, node, &inventory))
        .collect();
    if allocations
        .iter()
        .any(|a| matches!(a, NodeAllocation::Dra(_)))
    {
        super::claims::ensure_template(gv, ctx).await?;
    }
    let pods: Vec<(String, Pod)> = nodes
        .iter()
        .zip(&allocations)
        .map(|((node, gpus), how)| (node.clone(), agent_pod(gv, ctx, node, *gpus, how)))
        .collect();
    let names: Vec<String> = nodes.iter().map(|(n, _)| n.clone()).collect();
    let mut baselines = crate::read::baselines::baselines_for(ctx, &names).await;
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
            let template = claims::template_name(name, gv.metadata.generation.unwrap_or(0));
            let selector = gv.spec.dra.as_ref().is_some_and(|d| d.selector.is_some());
            claims::use_claim(&mut pod, &template, published, selector);
            claims::expected_gpus(&gv.spec, published)
        }
    };
    expected::add_to_pod(&mut pod, expectation);
    pod
}
