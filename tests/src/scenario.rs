//! A whole cluster for an end-to-end test in a few lines: the control plane (with scheduler,
//! controller-manager and kwok), the CRDs, the operator's namespace, kwok GPU nodes, the fake
//! kubelet running real agent processes, and helpers to apply a validation and wait for it.

use std::path::PathBuf;
use std::time::Duration;

use gpuval_crds::{GpuNodeResult, GpuValidation, NodeVerdict, Phase};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::kubelet::{FakeKubelet, agent_binary};
use crate::{ControlPlane, Options, crds, nodes};

/// Installs the CRDs and creates the operator's namespace `namespace`.
pub async fn install(client: &Client, namespace: &str) {
    crds::install_crds(client).await.expect("CRDs");
    crds::create_namespace(client, namespace).await;
}

/// Creates kwok GPU nodes `names` of `gpus` GPUs each carrying `labels`, then waits up to
/// `ready` for each to be Ready.
pub async fn ready_gpu_nodes(
    client: &Client,
    names: &[&str],
    gpus: i32,
    labels: &[(&str, &str)],
    ready: Duration,
) {
    for n in names {
        nodes::create_gpu_node(client, n, gpus, labels)
            .await
            .expect("node");
    }
    for n in names {
        nodes::wait_node_ready(client, n, ready)
            .await
            .expect("node ready");
    }
}

/// Starts the fake kubelet running the real agent binary for the agent pods in `namespace`,
/// the agents reaching the API server with `kubeconfig`.
pub fn start_kubelet(client: &Client, kubeconfig: PathBuf, namespace: &str) -> FakeKubelet {
    FakeKubelet::start(
        client.clone(),
        kubeconfig,
        agent_binary().expect("agent binary"),
        namespace.into(),
    )
}

/// Waits (watching) until `cond` holds for object `name` of kind `K`; panics after `secs`
/// saying it is not `what` yet, with the object as it is then.
pub async fn wait<K>(api: Api<K>, name: &str, secs: u64, what: &str, cond: impl Condition<K>) -> K
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    match watch_until(&api, name, Duration::from_secs(secs), cond).await {
        Ok(k) => k,
        Err(other) => {
            let now = api.get_opt(name).await.ok().flatten();
            panic!("{name}: not {what} within {secs}s ({other}); now: {now:#?}")
        }
    }
}

/// Watches object `name` of kind `K` until `cond` holds, for up to `limit`; Err with what the
/// watch gave (its error, its end, or the timeout) where it did not.
pub async fn watch_until<K>(
    api: &Api<K>,
    name: &str,
    limit: Duration,
    cond: impl Condition<K>,
) -> Result<K, String>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    match tokio::time::timeout(limit, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(Some(k))) => Ok(k),
        other => Err(format!("{other:?}")),
    }
}

/// Waits (watching) until `cond` holds for validation `name`; Err after `limit` saying it was
/// not `what`, with the status it has then.
pub async fn wait_validation(
    client: &Client,
    name: &str,
    limit: Duration,
    what: &str,
    cond: impl Condition<GpuValidation>,
) -> Result<GpuValidation, String> {
    let api: Api<GpuValidation> = Api::all(client.clone());
    match watch_until(&api, name, limit, cond).await {
        Ok(gv) => Ok(gv),
        Err(other) => Err(format!(
            "{name}: not {what} within {}s ({other}); status now: {}",
            limit.as_secs(),
            status_now(&api, name).await
        )),
    }
}

/// Whether the validation is in a terminal phase (of whichever generation).
pub fn terminal(gv: Option<&GpuValidation>) -> bool {
    gv.and_then(|g| g.status.as_ref())
        .and_then(|s| s.phase)
        .is_some_and(Phase::is_terminal)
}

/// Whether the validation is in a terminal phase for its current generation.
pub fn terminal_for_generation(gv: Option<&GpuValidation>) -> bool {
    gv.and_then(|g| Some((g, g.status.as_ref()?)))
        .is_some_and(|(g, s)| {
            s.phase.is_some_and(Phase::is_terminal)
                && s.observed_generation == g.metadata.generation
        })
}

/// Node `node`'s line in the validation's status: its verdict and message (empty where it has
/// none); None where the status does not list the node.
pub fn node_line(gv: &GpuValidation, node: &str) -> Option<(NodeVerdict, String)> {
    gv.status
        .as_ref()?
        .nodes
        .iter()
        .find(|l| l.name == node)
        .map(|l| (l.verdict, l.message.clone().unwrap_or_default()))
}

/// Asserts that node `node`'s agent wrote `result`: `gpuval-agent/<node>` is among its field
/// managers (the admission policy lets only that agent's pod-bound token write it).
pub fn assert_written_by_agent(result: &GpuNodeResult, node: &str) {
    let managers: Vec<String> = result
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.contains(&format!("gpuval-agent/{node}")),
        "{}: field managers {managers:?}",
        result.name_any()
    );
}

/// Applies validation `name` with `spec` as field manager `manager` (server-side apply).
pub async fn apply_validation(
    client: &Client,
    manager: &str,
    name: &str,
    spec: Value,
) -> GpuValidation {
    let body = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
        "metadata": {"name": name}, "spec": spec});
    Api::<GpuValidation>::all(client.clone())
        .patch(name, &PatchParams::apply(manager), &Patch::Apply(&body))
        .await
        .expect("apply validation")
}

/// Validation `name`'s status as it is now, as pretty JSON (empty where it cannot be read).
pub async fn status_now(api: &Api<GpuValidation>, name: &str) -> String {
    api.get(name)
        .await
        .ok()
        .map(|g| serde_json::to_string_pretty(&g.status).unwrap_or_default())
        .unwrap_or_default()
}

/// A running test cluster.
pub struct Cluster {
    pub cp: ControlPlane,
    pub client: Client,
    pub kubelet: FakeKubelet,
    pub namespace: String,
}

impl Cluster {
    /// Starts everything with `gpu_nodes` nodes of `gpus` GPUs each, Ready.
    pub async fn start(namespace: &str, gpu_nodes: &[String], gpus: i32) -> Cluster {
        let names: Vec<&str> = gpu_nodes.iter().map(String::as_str).collect();
        Cluster::start_labelled(namespace, &names, gpus, &[]).await
    }

    /// Starts everything with `gpu_nodes` nodes of `gpus` GPUs each carrying `labels`, Ready.
    pub async fn start_labelled(
        namespace: &str,
        gpu_nodes: &[&str],
        gpus: i32,
        labels: &[(&str, &str)],
    ) -> Cluster {
        let cp = ControlPlane::start_with(Options::all())
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        install(&client, namespace).await;
        ready_gpu_nodes(&client, gpu_nodes, gpus, labels, Duration::from_secs(60)).await;
        let kubelet = start_kubelet(&client, cp.kubeconfig().to_path_buf(), namespace);
        Cluster {
            cp,
            client,
            kubelet,
            namespace: namespace.into(),
        }
    }

    /// Applies validation `name` with `spec` (server-side apply).
    pub async fn apply(&self, name: &str, spec: Value) -> GpuValidation {
        apply_validation(&self.client, "e2e", name, spec).await
    }

    /// Waits (watching) until `cond` holds for validation `name`; panics after `secs` with the
    /// status it has then.
    pub async fn wait_for(
        &self,
        name: &str,
        secs: u64,
        cond: impl Condition<GpuValidation>,
    ) -> GpuValidation {
        wait_validation(
            &self.client,
            name,
            Duration::from_secs(secs),
            "as asked",
            cond,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits until validation `name` reaches a terminal phase for its current generation.
    pub async fn wait_terminal(&self, name: &str, secs: u64) -> GpuValidation {
        self.wait_for(name, secs, terminal_for_generation).await
    }
}
