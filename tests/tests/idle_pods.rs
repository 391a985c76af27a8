//! `idleOnly` reads the cluster's pods in pages on a real kube-apiserver: a node whose GPUs a
//! pod holds is found however many pages come before that pod, agents and pods on nodes the
//! template does not select are left out.

use gpuval_operator::controllers::schedule::busy_nodes;
use gpuval_tests::{ControlPlane, crds};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

const NS: &str = "work";

fn pod(name: &str, node: &str, gpus: u32, agent: bool) -> Pod {
    let labels = if agent {
        json!({"app.kubernetes.io/managed-by": "gpuval-operator"})
    } else {
        json!({})
    };
    let resources = if gpus > 0 {
        json!({"limits": {"nvidia.com/gpu": gpus.to_string()}})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "resources": resources}]},
    }))
    .expect("a pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_nodes_are_found_across_pages() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::create_namespace(&client, NS).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    // Names sort in list order: the GPU pods come after several pages of idle pods.
    let mut pods: Vec<Pod> = (0..7)
        .map(|i| pod(&format!("a-idle-{i}"), "gpu-a", 0, false))
        .collect();
    pods.push(pod("b-agent", "gpu-a", 8, true));
    pods.push(pod("c-elsewhere", "cpu-1", 1, false));
    pods.push(pod("d-train", "gpu-b", 4, false));
    for p in &pods {
        api.create(&PostParams::default(), p).await.expect("pod");
    }
    let all: Api<Pod> = Api::all(client.clone());
    let selected = vec!["gpu-a".to_string(), "gpu-b".to_string()];
    let busy = busy_nodes(&all, &Default::default(), &selected, 2)
        .await
        .expect("pages");
    assert_eq!(busy.keys().collect::<Vec<_>>(), ["gpu-b"], "{busy:?}");
    assert!(busy["gpu-b"].contains("work/d-train holds 4"), "{busy:?}");
}
