//! The agent's Kubernetes mode (`gpuval-agent k8s`) with the fake kubelet, on a real control
//! plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok), without the
//! operator: agent pods and their results (bound to the pod) are made by hand the way the
//! operator makes them, kube-scheduler binds them to a kwok GPU node, and the FakeKubelet runs
//! the agent as a local process, which writes its report into that result.
//!
//! The agent binary is `target/debug/gpuval-agent` (under `$CARGO_TARGET_DIR` when set);
//! `gpuval_tests::agent_binary` runs `cargo build -p gpuval-agent` first (a no-op when it is
//! up to date), or takes `$GPUVAL_AGENT_BIN` as it is.

use std::time::Duration;

use gpuval_crds::{GpuNodeResult, GpuValidation, labels, result::result_name};
use gpuval_tests::auth::BoundPod;
use gpuval_tests::{ControlPlane, FakeKubelet, Options, crds, nodes, results, waits};
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Namespace, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::wait::{await_condition, conditions},
};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
const WAIT: Duration = Duration::from_secs(120);

/// Fields drop in order: the agents stop before the control plane does.
struct Cluster {
    kubelet: FakeKubelet,
    client: Client,
    _cp: ControlPlane,
}

/// A control plane with the CRDs, the namespace, one kwok node with 8 GPUs, and a FakeKubelet.
async fn cluster(node: &str) -> Cluster {
    let cp = ControlPlane::start_with(Options::all())
        .await
        .expect("control plane");
    let client = cp.client().await.expect("client");
    crds::install_crds(&client).await.expect("install CRDs");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NS}})).expect("namespace");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    nodes::create_gpu_node(&client, node, 8, &[("gpuval.io/pool", "test")])
        .await
        .expect("create node");
    nodes::wait_node_ready(&client, node, WAIT)
        .await
        .expect("node Ready");
    let agent = gpuval_tests::agent_binary().expect("agent binary");
    let kubelet = FakeKubelet::start(
        client.clone(),
        cp.kubeconfig().to_path_buf(),
        agent,
        NS.to_string(),
    );
    Cluster {
        kubelet,
        client,
        _cp: cp,
    }
}

/// Applies a GpuValidation as JSON through the API.
async fn create_validation(client: &Client, name: &str, spec: Value) -> GpuValidation {
    let api: Api<GpuValidation> = Api::all(client.clone());
    let obj = json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "metadata": {"name": name},
        "spec": spec,
    });
    api.patch(
        name,
        &PatchParams::apply("gpuval-tests"),
        &Patch::Apply(&obj),
    )
    .await
    .expect("apply GpuValidation")
}

/// An agent pod as the operator makes it: pinned to `node` by node affinity, all 8 GPUs,
/// tolerating the kwok taint, restartPolicy Never, the assignment in its environment.
fn agent_pod(name: &str, validation: &GpuValidation, node: &str, simulate: &str) -> Pod {
    let v_name = validation.metadata.name.clone().expect("validation name");
    let uid = validation.metadata.uid.clone().expect("validation uid");
    let generation = validation
        .metadata
        .generation
        .expect("validation generation");
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                (labels::APP_NAME_KEY): labels::AGENT_APP,
                (labels::MANAGED_BY_KEY): labels::MANAGED_BY,
                (labels::VALIDATION): v_name,
                (labels::NODE): labels::node_value(node),
                (labels::GENERATION): generation.to_string(),
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]
            }}},
            "tolerations": [{
                "key": nodes::KWOK_NODE_KEY,
                "operator": "Equal",
                "value": nodes::KWOK_NODE_VALUE,
                "effect": "NoSchedule",
            }],
            "containers": [{
                "name": "agent",
                "image": "gpuval-agent:test",
                "args": ["k8s"],
                "resources": {"limits": {"nvidia.com/gpu": 8}},
                "env": [
                    {"name": "GPUVAL_VALIDATION", "value": v_name},
                    {"name": "GPUVAL_GENERATION", "value": generation.to_string()},
                    {"name": "GPUVAL_VALIDATION_UID", "value": uid},
                    {"name": "GPUVAL_SIMULATE", "value": simulate},
                    {"name": "NODE_NAME", "valueFrom": field("spec.nodeName")},
                    {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
                    {"name": "POD_NAME", "valueFrom": field("metadata.name")},
                ],
            }],
        },
    }))
    .expect("agent pod")
}

fn phase(p: Option<&Pod>) -> Option<&str> {
    p?.status.as_ref()?.phase.as_deref()
}

/// Asserts that GpuNodeResult `name` (made with the pod) carries no report: no status, no
/// verdict (`why` says why there should be none).
async fn assert_no_report(c: &Cluster, name: &str, why: &str) {
    let results: Api<GpuNodeResult> = Api::namespaced(c.client.clone(), NS);
    let found = results
        .get(name)
        .await
        .expect("the result made with the pod");
    assert!(found.status.is_none(), "{why}: {:?}", found.status);
    assert!(
        !found.labels().contains_key(labels::VERDICT),
        "{why}: {:?}",
        found.labels()
    );
}

/// Creates the result of `pod` (of `validation` on `node`), bound to it, as the operator does
/// right after the pod; one that exists already stays as it is.
async fn bind_result(c: &Cluster, validation: &GpuValidation, node: &str, pod: &Pod) {
    let bound = BoundPod {
        name: pod.name_any(),
        uid: pod.metadata.uid.clone().expect("pod uid"),
    };
    match results::create_bound(&c.client, NS, validation, node, &bound).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create the result of pod {}: {e}", bound.name),
    }
}

/// The agent container's terminated state; fails the test when it has none.
fn terminated(pod: &Pod) -> &ContainerStateTerminated {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|cs| cs.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .expect("terminated container state")
}

/// Waits (watching) until pod `name` satisfies `cond`; on timeout, fails with the agent's log.
async fn wait_pod(
    c: &Cluster,
    name: &str,
    what: &str,
    cond: impl Fn(Option<&Pod>) -> bool + Send + 'static,
) -> Pod {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let waited = tokio::time::timeout(WAIT, await_condition(pods.clone(), name, cond)).await;
    match waited {
        Ok(Ok(Some(pod))) => pod,
        Ok(Ok(None)) => panic!("pod {name} is gone while waiting until it is {what}"),
        Ok(Err(e)) => panic!("watch pod {name}: {e}"),
        Err(_) => {
            let now = pods.get_opt(name).await.ok().flatten();
            panic!(
                "pod {name} not {what} within {}s; pod status: {:?}\nagent log:\n{}",
                WAIT.as_secs(),
                now.and_then(|p| p.status),
                c.kubelet.logs(name)
            )
        }
    }
}

/// Creates the agent pod `name` for `validation` on `node` with the simulator spec `simulate`,
/// and waits until it has ended (Succeeded or Failed).
async fn run_to_end(
    c: &Cluster,
    name: &str,
    validation: &GpuValidation,
    node: &str,
    simulate: &str,
) -> Pod {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let pod = pods
        .create(
            &PostParams::default(),
            &agent_pod(name, validation, node, simulate),
        )
        .await
        .unwrap_or_else(|e| panic!("create agent pod {name}: {e}"));
    bind_result(c, validation, node, &pod).await;
    wait_pod(c, name, "Succeeded or Failed", |p| {
        matches!(phase(p), Some("Succeeded" | "Failed"))
    })
    .await
}

#[tokio::test]
async fn agent_pod_runs_the_checks_and_stores_a_failing_result() {
    let node = "gpu-node-a";
    let c = cluster(node).await;
    let v = create_validation(&c.client, "burn-in", memory_and_burn()).await;

    let pod_name = "burn-in-gpu-node-a";
    let pod = run_to_end(
        &c,
        pod_name,
        &v,
        node,
        "gpus=8,fail=memory@3,timescale=0.01",
    )
    .await;
    let log = c.kubelet.logs(pod_name);
    assert_eq!(
        phase(Some(&pod)),
        Some("Succeeded"),
        "a GPU failure is a verdict, not a crash; agent log:\n{log}"
    );
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node),
        "bound by kube-scheduler"
    );
    let terminated = terminated(&pod);
    assert_eq!(terminated.exit_code, 0);
    assert_eq!(c.kubelet.started(), vec![pod_name.to_string()]);
    assert!(log.contains("SIMULATED"), "agent log:\n{log}");

    let results: Api<GpuNodeResult> = Api::namespaced(c.client.clone(), NS);
    let name = result_name("burn-in", node);
    let r = results.get(&name).await.expect("the GpuNodeResult exists");
    let l = r.metadata.labels.clone().unwrap_or_default();
    assert_eq!(l.get(labels::VERDICT).map(String::as_str), Some("Fail"));
    assert_eq!(
        l.get(labels::VALIDATION).map(String::as_str),
        Some("burn-in")
    );
    assert_eq!(l.get(labels::NODE).map(String::as_str), Some(node));
    assert_eq!(
        l.get(labels::GENERATION).cloned(),
        v.metadata.generation.map(|g| g.to_string())
    );
    assert_eq!(
        l.get(labels::MANAGED_BY_KEY).map(String::as_str),
        Some(labels::MANAGED_BY)
    );
    let summary = r
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(labels::SUMMARY))
        .cloned()
        .unwrap_or_default();
    assert!(summary.contains("GPU3"), "summary: {summary:?}");

    assert_eq!(r.spec.validation, "burn-in");
    assert_eq!(r.spec.node_name, node);
    assert_eq!(Some(r.spec.generation), v.metadata.generation);
    let status = r.status.as_ref().expect("status written");
    assert!(status.simulated, "simulated reports say so");
    assert_eq!(status.gpus.len(), 8);
    assert_eq!(status.verdict, gpuval_crds::Verdict::Fail);
    assert_eq!(status.node.as_deref(), Some(node));

    let owners = r.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].kind, "GpuValidation");
    assert_eq!(owners[0].api_version, "gpuval.io/v1alpha1");
    assert_eq!(Some(&owners[0].name), v.metadata.name.as_ref());
    assert_eq!(Some(&owners[0].uid), v.metadata.uid.as_ref());
    assert_eq!(owners[0].controller, Some(true));
    // Bound to the pod that wrote it: the agent changed nothing of its binding.
    let binding = gpuval_crds::binding::Binding::of(&r.metadata).expect("bound");
    assert_eq!(binding.pod, pod_name);
    assert_eq!(Some(binding.pod_uid), pod.metadata.uid.clone());
    assert_eq!(Some(binding.validation_uid), v.metadata.uid.clone());

    gpuval_tests::scenario::assert_written_by_agent(&r, node);

    // The spec changes (generation 2): a pod still made for generation 1 is stale. Its agent
    // exits 0 without a result (the operator replaces such pods), and the stored result stays.
    // The node's 8 GPUs are free again: the first pod is terminal.
    let newer = create_validation(
        &c.client,
        "burn-in",
        json!({"checks": {"memory": {}, "compute": {"duration": "20s"}}}),
    )
    .await;
    assert_ne!(newer.metadata.generation, v.metadata.generation);
    let stale_name = "burn-in-gpu-node-a-stale";
    let stale = run_to_end(&c, stale_name, &v, node, "gpus=8,timescale=0.01").await;
    let stale_log = c.kubelet.logs(stale_name);
    assert_eq!(phase(Some(&stale)), Some("Succeeded"), "{stale_log}");
    assert!(stale_log.contains("nothing to do"), "{stale_log}");
    let again = results.get(&name).await.expect("result");
    assert_eq!(
        again.metadata.resource_version, r.metadata.resource_version,
        "a stale agent writes nothing"
    );
}

/// The nccl check through the API: a simulated wrong result on GPU1 is judged by the agent,
/// stored in the result's status (the curve, the transport, the mismatch) and read back
/// through the CRD schema intact.
#[tokio::test]
async fn a_simulated_nccl_fault_is_stored_with_the_result() {
    let node = "gpu-node-n";
    let c = cluster(node).await;
    let spec = json!({"checks": {"nccl": {"maxBytes": 1048576, "timeout": "5s"}}});
    let v = create_validation(&c.client, "collectives", spec).await;
    let pod_name = "collectives-gpu-node-n";
    let pod = run_to_end(&c, pod_name, &v, node, "gpus=8,fail=nccl@1").await;
    let log = c.kubelet.logs(pod_name);
    assert_eq!(phase(Some(&pod)), Some("Succeeded"), "agent log:\n{log}");

    let results: Api<GpuNodeResult> = Api::namespaced(c.client.clone(), NS);
    let r = results
        .get(&result_name("collectives", node))
        .await
        .expect("the GpuNodeResult exists");
    let status = r.status.as_ref().expect("status written");
    assert_eq!(status.verdict, gpuval_crds::Verdict::Fail);
    let nccl = status.nccl.as_ref().expect("the nccl section is stored");
    assert_eq!(
        nccl.verdict,
        gpuval_crds::Verdict::Fail,
        "{:?}",
        nccl.reasons
    );
    assert_eq!(nccl.gpus, (0..8).collect::<Vec<i32>>());
    assert!(!nccl.mismatches.is_empty(), "{:?}", nccl.reasons);
    let sweep = nccl.sweep.as_ref().expect("the sweep is stored");
    assert!(
        sweep.curves.iter().any(|c| !c.rows.is_empty()),
        "{:?}",
        sweep.curves
    );
    assert!(sweep.transport.is_some());
    let verdicts: Vec<_> = status.gpus.iter().map(|g| g.verdict).collect();
    assert_eq!(verdicts[1], gpuval_crds::Verdict::Fail, "{verdicts:?}");
    assert!(
        verdicts
            .iter()
            .enumerate()
            .all(|(i, v)| i == 1 || *v == gpuval_crds::Verdict::Pass),
        "{verdicts:?}"
    );
}

/// A validation with a 10 s burn and its agent pod, once the agent runs. `timescale=1`: the
/// simulated burn takes its real 10 s, long enough to act on the agent mid-run.
/// A memory check and a 10 s compute burn.
fn memory_and_burn() -> Value {
    json!({"checks": {"memory": {}, "compute": {"duration": "10s"}}})
}

async fn running_agent(
    c: &Cluster,
    validation: &str,
    pod_name: &str,
    node: &str,
) -> (GpuValidation, Pod) {
    let v = create_validation(&c.client, validation, memory_and_burn()).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let created = pods
        .create(
            &PostParams::default(),
            &agent_pod(pod_name, &v, node, "gpus=8,timescale=1"),
        )
        .await
        .expect("create agent pod");
    bind_result(c, &v, node, &created).await;
    let pod = wait_pod(c, pod_name, "Running", |p| phase(p) == Some("Running")).await;
    (v, pod)
}

#[tokio::test]
async fn a_crashed_agent_leaves_its_pod_failed_and_no_report() {
    let node = "gpu-node-b";
    let c = cluster(node).await;
    let pod_name = "crash-gpu-node-b";
    running_agent(&c, "crash", pod_name, node).await;
    assert!(c.kubelet.kill(pod_name), "the agent process was running");

    let pod = wait_pod(&c, pod_name, "Failed", |p| {
        matches!(phase(p), Some("Succeeded" | "Failed"))
    })
    .await;
    assert_eq!(phase(Some(&pod)), Some("Failed"));
    let terminated = terminated(&pod);
    assert_eq!(terminated.exit_code, 137, "SIGKILL");
    assert_eq!(terminated.reason.as_deref(), Some("Error"));
    assert!(terminated.finished_at.is_some());
    assert!(!c.kubelet.kill(pod_name), "nothing left to kill");

    assert_no_report(
        &c,
        &result_name("crash", node),
        "a crashed agent stores no report",
    )
    .await;
}

#[tokio::test]
async fn deleting_a_running_agent_pod_stops_the_agent_and_removes_the_pod() {
    let node = "gpu-node-c";
    let c = cluster(node).await;
    let pod_name = "stopped-gpu-node-c";
    let (v, running) = running_agent(&c, "stopped", pod_name, node).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let uid = running.metadata.uid.clone().expect("pod uid");

    // A graceful delete (30s): the pod stays, Terminating, until the kubelet has stopped the
    // agent and removes it; kwok leaves agent pods alone.
    pods.delete(pod_name, &DeleteParams::default())
        .await
        .expect("delete pod");
    let gone = await_condition(pods.clone(), pod_name, conditions::is_deleted(&uid));
    tokio::time::timeout(WAIT, gone)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "pod {pod_name} still there after {}s; agent log:\n{}",
                WAIT.as_secs(),
                c.kubelet.logs(pod_name)
            )
        })
        .expect("watch pod");

    let log = c.kubelet.logs(pod_name);
    assert!(
        log.contains("SIGTERM") && log.contains("no result is written"),
        "the agent stopped on SIGTERM; agent log:\n{log}"
    );
    assert!(c.kubelet.running().is_empty());
    assert_no_report(
        &c,
        &result_name("stopped", node),
        "a stopped agent stores no report",
    )
    .await;

    // Pods that are not agents are kwok's: Running at once, never started by the FakeKubelet.
    let mut other = agent_pod("not-an-agent", &v, node, "gpus=8");
    other.metadata.labels = None;
    pods.create(&PostParams::default(), &other)
        .await
        .expect("create other pod");
    wait_pod(&c, "not-an-agent", "Running", |p| {
        phase(p) == Some("Running")
    })
    .await;
    assert_eq!(c.kubelet.started(), vec![pod_name.to_string()]);
}

/// An agent whose result the operator has not created yet (agents never create one) says so
/// and waits; once the result exists, bound to its pod, it stores its report there.
#[tokio::test]
async fn an_agent_waits_for_the_result_the_operator_has_not_made_yet() {
    let node = "gpu-node-w";
    let c = cluster(node).await;
    let v = create_validation(&c.client, "waits", json!({"checks": {"memory": {}}})).await;
    let pod_name = "waits-gpu-node-w";
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let pod = pods
        .create(
            &PostParams::default(),
            &agent_pod(pod_name, &v, node, "gpus=8,timescale=0.01"),
        )
        .await
        .expect("create agent pod");
    let name = result_name("waits", node);
    let said = waits::until("the agent to say its result is missing", WAIT, || async {
        let log = c.kubelet.logs(pod_name);
        log.contains("does not exist: the operator creates it")
            .then_some(log)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; agent log:\n{}", c.kubelet.logs(pod_name)));
    assert!(said.contains(&name), "{said}");
    assert!(
        said.contains("retrying"),
        "it waits instead of giving up:\n{said}"
    );
    bind_result(&c, &v, node, &pod).await;
    let ended = wait_pod(&c, pod_name, "Succeeded or Failed", |p| {
        matches!(phase(p), Some("Succeeded" | "Failed"))
    })
    .await;
    let log = c.kubelet.logs(pod_name);
    assert_eq!(phase(Some(&ended)), Some("Succeeded"), "agent log:\n{log}");
    let r = Api::<GpuNodeResult>::namespaced(c.client.clone(), NS)
        .get(&name)
        .await
        .expect("the result");
    assert_eq!(
        r.status.as_ref().map(|s| s.verdict),
        Some(gpuval_crds::Verdict::Pass),
        "agent log:\n{log}"
    );
    gpuval_tests::scenario::assert_written_by_agent(&r, node);
}
