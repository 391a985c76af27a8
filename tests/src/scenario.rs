//! A whole cluster for an end-to-end test in a few lines: the control plane (with scheduler,
//! controller-manager and kwok), the CRDs, the operator's namespace, kwok GPU nodes, the fake
//! kubelet running real agent processes, and helpers to apply a validation and wait for it.

use std::time::Duration;

use gpuval_crds::{GpuValidation, Phase};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{Condition, await_condition};
use serde_json::{Value, json};

use crate::kubelet::{FakeKubelet, agent_binary};
use crate::{ControlPlane, Options, crds, nodes};

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
        let cp = ControlPlane::start_with(Options::all())
            .await
            .expect("control plane");
        let client = cp.client().await.expect("client");
        crds::install_crds(&client).await.expect("CRDs");
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))
            .expect("namespace object");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace");
        for n in gpu_nodes {
            nodes::create_gpu_node(&client, n, gpus, &[])
                .await
                .expect("node");
        }
        for n in gpu_nodes {
            nodes::wait_node_ready(&client, n, Duration::from_secs(60))
                .await
                .expect("node ready");
        }
        let kubelet = FakeKubelet::start(
            client.clone(),
            cp.kubeconfig().to_path_buf(),
            agent_binary().expect("agent binary"),
            namespace.into(),
        );
        Cluster {
            cp,
            client,
            kubelet,
            namespace: namespace.into(),
        }
    }

    /// Applies validation `name` with `spec` (server-side apply).
    pub async fn apply(&self, name: &str, spec: Value) -> GpuValidation {
        let api: Api<GpuValidation> = Api::all(self.client.clone());
        let body = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation", "metadata": {"name": name}, "spec": spec});
        api.patch(name, &PatchParams::apply("e2e"), &Patch::Apply(&body))
            .await
            .expect("apply validation")
    }

    /// Waits (watching) until `cond` holds for validation `name`; panics after `secs` with the
    /// status it has then.
    pub async fn wait_for(
        &self,
        name: &str,
        secs: u64,
        cond: impl Condition<GpuValidation>,
    ) -> GpuValidation {
        let api: Api<GpuValidation> = Api::all(self.client.clone());
        let waited = tokio::time::timeout(
            Duration::from_secs(secs),
            await_condition(api.clone(), name, cond),
        )
        .await;
        match waited {
            Ok(Ok(Some(gv))) => gv,
            other => {
                let now = api
                    .get(name)
                    .await
                    .ok()
                    .map(|g| serde_json::to_string_pretty(&g.status).unwrap_or_default());
                panic!(
                    "{name}: condition not met within {secs}s ({other:?}); status now: {}",
                    now.unwrap_or_default()
                )
            }
        }
    }

    /// Waits until validation `name` reaches a terminal phase for its current generation.
    pub async fn wait_terminal(&self, name: &str, secs: u64) -> GpuValidation {
        self.wait_for(name, secs, |g: Option<&GpuValidation>| {
            g.and_then(|g| Some((g, g.status.as_ref()?)))
                .is_some_and(|(g, s)| {
                    s.phase.is_some_and(Phase::is_terminal)
                        && s.observed_generation == g.metadata.generation
                })
        })
        .await
    }
}
