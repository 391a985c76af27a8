//! Pod Security `restricted` on a real kube-apiserver (its PodSecurity admission plugin): in a
//! namespace labelled `pod-security.kubernetes.io/enforce=restricted`, the agent pods the
//! operator builds by default and the chart's operator pod are admitted; what an administrator
//! turns on (privileged agents, fabric capabilities, host networking) is what the level
//! refuses, so such privileges stay the administrator's opt-in.

use gpuval_crds::GpuValidation;
use gpuval_operator::decide::pod::agent_pod;
use gpuval_operator::settings::config::OperatorConfig;
use gpuval_tests::{ControlPlane, chart};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

const NS: &str = "gpuval-restricted";

fn validation(spec: serde_json::Value) -> GpuValidation {
    let mut gv: GpuValidation = serde_json::from_value(json!({
        "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
        "metadata": {"name": "quick", "uid": "0b9a-uid"}, "spec": spec,
    }))
    .expect("a validation");
    gv.metadata.generation = Some(1);
    gv
}

async fn create(api: &Api<Pod>, mut pod: Pod, name: &str) -> Result<Pod, kube::Error> {
    pod.metadata.name = Some(name.into());
    // Owner references name a validation that does not exist here; they do not matter to
    // Pod Security.
    pod.metadata.owner_references = None;
    api.create(&PostParams::default(), &pod).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_and_operator_pods_meet_pod_security_restricted() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest"}}}))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let cfg = OperatorConfig {
        namespace: NS.into(),
        ..OperatorConfig::default()
    };

    // The default agent pod, with and without a fabric section.
    let plain = agent_pod(
        &validation(json!({"checks": {"memory": {}}})),
        "gpu-a",
        8,
        &cfg,
    );
    create(&pods, plain, "agent-plain")
        .await
        .unwrap_or_else(|e| panic!("the default agent pod is refused by restricted: {e}"));
    let fabric = validation(json!({"checks": {"memory": {}}, "fabric": {}}));
    create(&pods, agent_pod(&fabric, "gpu-a", 8, &cfg), "agent-fabric")
        .await
        .unwrap_or_else(|e| panic!("a fabric agent pod is refused by restricted: {e}"));

    // The administrator's opt-ins are what restricted refuses.
    let privileged = OperatorConfig {
        agent_privileged: true,
        ..cfg.clone()
    };
    let e = create(
        &pods,
        agent_pod(&fabric, "gpu-a", 8, &privileged),
        "agent-privileged",
    )
    .await
    .expect_err("privileged");
    assert!(e.to_string().contains("violates PodSecurity"), "{e}");
    let mut with_caps = cfg.clone();
    with_caps.fabric.capabilities = vec!["IPC_LOCK".into()];
    with_caps.fabric.host_network = true;
    let e = create(
        &pods,
        agent_pod(&fabric, "gpu-a", 8, &with_caps),
        "agent-caps",
    )
    .await
    .expect_err("capabilities and host network");
    assert!(e.to_string().contains("violates PodSecurity"), "{e}");

    // The chart's operator pod, as its Deployment's template makes it.
    let rendered = chart::render("gpuval", NS, &[]).expect("helm template");
    let docs = chart::documents(&rendered).expect("documents");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the operator Deployment");
    let template = &deployment["spec"]["template"];
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "operator", "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }))
    .expect("a pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("the chart's operator pod is refused by restricted: {e}"));
}
