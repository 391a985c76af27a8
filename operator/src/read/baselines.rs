//! A node's GPU baselines for its next run: read from the metadata of its certificates (the
//! records of earlier runs), handed to its agent pod ([`crate::decide::expected::add_baselines`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};

use crate::context::Ctx;
use crate::{decide::certificates, services::paged};

/// The `GPUVAL_BASELINES` value for each of `nodes`' agents: its GPUs' baselines from the runs
/// its certificates record (metadata only, one list per [`certificates::NODES_PER_LIST`] nodes);
/// a node without history, or every node with certificates off, is left out. A list that
/// fails leaves its nodes out, logged: without its history a GPU is judged by its floors alone.
pub async fn baselines_for(ctx: &Ctx, nodes: &[String]) -> BTreeMap<String, String> {
    let settings = &ctx.cfg.certificates;
    if settings.retention.is_none() || settings.baseline_runs == 0 || nodes.is_empty() {
        return BTreeMap::new();
    }
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let mut metas: Vec<ObjectMeta> = Vec::new();
    for selector in certificates::node_selectors(nodes) {
        let base = ListParams::default().labels(&selector);
        let listed = paged::all_pages("GPU baselines", &base, settings.page, |p| {
            let api = api.clone();
            async move {
                ctx.throttle.acquire().await;
                api.list_metadata(&p).await
            }
        })
        .await;
        match listed {
            Ok(items) => metas.extend(items.into_iter().map(|m| m.metadata)),
            Err(e) => {
                tracing::warn!(error = %e, selector = %selector, "GPU baselines not read; these nodes are judged by their floors alone");
            }
        }
    }
    certificates::by_node(nodes, metas)
        .into_iter()
        .filter_map(|(node, metas)| {
            let env = certificates::baselines_env(
                &certificates::runs_of(&metas),
                settings.baseline_runs,
                settings.baseline_tolerance,
            )?;
            Some((node, env))
        })
        .collect()
}
