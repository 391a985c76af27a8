//! Fake GPU nodes, run by kwok: they exist in the API, become Ready and advertise what they were
//! created with (cpu, memory, pods and `nvidia.com/gpu`), so that kube-scheduler places pods on
//! them. Nothing runs there: agent pods are run by [`FakeKubelet`](crate::FakeKubelet).

use std::collections::BTreeMap;
use std::time::Duration;

use gpuval_crds::GPU_RESOURCE;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::wait::await_condition;
use kube::{Api, Client, api::PostParams};

/// The annotation (and taint key) kwok uses to pick the nodes it runs.
pub const KWOK_NODE_KEY: &str = "kwok.x-k8s.io/node";
/// The annotation, label and taint value of kwok nodes.
pub const KWOK_NODE_VALUE: &str = "fake";

/// Creates a kwok node `name` with `gpus` × `nvidia.com/gpu` (none when 0), 64 CPUs, 512Gi
/// of memory and room for 110 pods, carrying `labels` plus `type: kwok` and
/// `kubernetes.io/hostname`, and the taint `kwok.x-k8s.io/node=fake:NoSchedule` (pods meant
/// for it tolerate that). kwok marks it Ready shortly after; see [`wait_node_ready`].
pub async fn create_gpu_node(
    client: &Client,
    name: &str,
    gpus: i32,
    labels: &[(&str, &str)],
) -> Result<Node, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    api.create(&PostParams::default(), &gpu_node(name, gpus, labels))
        .await
}

/// The node object [`create_gpu_node`] creates.
pub fn gpu_node(name: &str, gpus: i32, labels: &[(&str, &str)]) -> Node {
    let mut all_labels = BTreeMap::from([
        ("type".to_string(), "kwok".to_string()),
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
    ]);
    all_labels.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut resources = BTreeMap::from([
        ("cpu".to_string(), Quantity("64".into())),
        ("memory".to_string(), Quantity("512Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ]);
    if gpus > 0 {
        resources.insert(GPU_RESOURCE.to_string(), Quantity(gpus.to_string()));
    }
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(all_labels),
            annotations: Some(BTreeMap::from([(
                KWOK_NODE_KEY.to_string(),
                KWOK_NODE_VALUE.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: KWOK_NODE_KEY.to_string(),
                value: Some(KWOK_NODE_VALUE.to_string()),
                effect: "NoSchedule".to_string(),
                time_added: None,
            }]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            ..Default::default()
        }),
    }
}

/// True when the node's Ready condition is True.
/// The node's condition of type `type_` (`GpuValidated`), if it has one.
pub fn condition<'a>(n: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

pub fn is_node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits (watching, not polling) until kwok has marked node `name` Ready.
pub async fn wait_node_ready(client: &Client, name: &str, timeout: Duration) -> Result<(), String> {
    let api: Api<Node> = Api::all(client.clone());
    let ready = await_condition(api, name, |n: Option<&Node>| n.is_some_and(is_node_ready));
    tokio::time::timeout(timeout, ready)
        .await
        .map_err(|_| {
            format!(
                "node {name} not Ready within {}s (is kwok running?)",
                timeout.as_secs()
            )
        })?
        .map_err(|e| format!("watch node {name}: {e}"))?;
    Ok(())
}

/// Waits up to `limit` until node `name` satisfies `cond` (`what` names it in the panic when it
/// does not); gives the node back then.
pub async fn wait_node(
    client: &Client,
    name: &str,
    what: &str,
    limit: Duration,
    cond: impl Fn(&Node) -> bool + Send + 'static,
) -> Node {
    let api: Api<Node> = Api::all(client.clone());
    crate::scenario::wait(api, name, limit.as_secs(), what, move |n: Option<&Node>| {
        n.is_some_and(&cond)
    })
    .await
}

/// Creates kwok GPU node `name` with `gpus` GPUs carrying taint `key` (NoSchedule), as a node
/// registers with an admission taint.
pub async fn create_tainted_node(client: &Client, name: &str, gpus: i32, key: &str) {
    let mut node = gpu_node(name, gpus, &[]);
    if let Some(spec) = node.spec.as_mut() {
        spec.taints.get_or_insert_with(Vec::new).push(Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
    }
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("node");
}

/// [`create_tainted_node`] with 2 GPUs, then waits up to `limit` until the node is Ready.
pub async fn tainted_node(client: &Client, name: &str, key: &str, limit: Duration) {
    create_tainted_node(client, name, 2, key).await;
    wait_node_ready(client, name, limit)
        .await
        .expect("node ready");
}

/// Makes the API server refuse, for now, every update of a Node that adds the failure taint
/// (a ValidatingAdmissionPolicy and its binding), once it is in force (tried in dry runs on a
/// probe node without GPUs, which no run selects); returns the binding's name, to lift the
/// refusal by deleting it.
pub async fn refuse_failure_taints(client: &Client, limit: Duration) -> String {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use kube::api::{Patch, PatchParams};
    const NAME: &str = "test-refuse-failure-taint";
    const PROBE: &str = "policy-probe";
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &gpu_node(PROBE, 0, &[]))
        .await
        .expect("the probe node");
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["nodes"]}]},
            "validations": [{
                "expression": "!(has(object.spec.taints) && object.spec.taints.exists(t, t.key == 'gpuval.io/failed')) || (has(oldObject.spec.taints) && oldObject.spec.taints.exists(t, t.key == 'gpuval.io/failed'))",
                "message": "test: the API server refuses the failure taint for now"}]}
    }))
    .expect("policy");
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME},
        "spec": {"policyName": NAME, "validationActions": ["Deny"]}
    }))
    .expect("binding");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the binding");
    crate::waits::until("the policy in force", limit, || async {
        let probe = serde_json::json!({"spec": {"taints": [{"key": gpuval_crds::labels::FAILED_NODE, "value": "probe", "effect": "NoSchedule"}]}});
        let refused = nodes
            .patch(PROBE, &PatchParams::default().dry_run(), &Patch::Merge(&probe))
            .await
            .err()
            .is_some_and(|e| e.to_string().contains("refuses the failure taint"));
        refused.then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    NAME.into()
}

/// Lifts a refusal [`refuse_failure_taints`] made (deletes its binding).
pub async fn lift_refusal(client: &Client, binding: &str) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .delete(binding, &Default::default())
        .await
        .expect("lift the refusal");
}
