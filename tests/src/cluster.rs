//! A whole test cluster in one call: the control plane with every component, the CRDs, the
//! operator's namespace, kwok GPU nodes (Ready) and a [`FakeKubelet`] for agent pods.

use std::time::Duration;

use kube::Client;

use crate::kubelet::{FakeKubelet, agent_binary};
use crate::{ControlPlane, Options, crds, nodes};

/// What [`start`] brings up; dropping it tears everything down.
pub struct Cluster {
    pub cp: ControlPlane,
    pub client: Client,
    pub kubelet: FakeKubelet,
}

/// Starts a cluster with namespace `namespace` and a kwok node with 8 GPUs and `labels` for
/// each of `gpu_nodes`, waiting until they are Ready. Panics (this is test setup) with what
/// failed.
pub async fn start(namespace: &str, gpu_nodes: &[&str], labels: &[(&str, &str)]) -> Cluster {
    let cp = ControlPlane::start_with(Options::all())
        .await
        .expect("control plane");
    let client = cp.client().await.expect("client");
    crds::install_crds(&client).await.expect("CRDs");
    crds::create_namespace(&client, namespace).await;
    for n in gpu_nodes {
        nodes::create_gpu_node(&client, n, 8, labels)
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
    }
}
