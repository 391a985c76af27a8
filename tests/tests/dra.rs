//! Dynamic Resource Allocation on the real control plane: a fake DRA driver publishes a
//! DeviceClass and ResourceSlices for kwok nodes that have no `nvidia.com/gpu`, the operator
//! (`--gpu-allocation auto`) gives their agent pods a claim from its ResourceClaimTemplate, the
//! real kube-scheduler allocates the claims, and the fake kubelet starts each agent with the
//! devices its claim was allocated, as a DRA kubelet plugin would.

use std::time::Duration;

use gpuval_crds::{GpuNodeResult, GpuValidation, NodeVerdict, Phase, labels};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{self, node_line, terminal_for_generation};
use gpuval_tests::{ControlPlane, Options, dra, nodes, waits};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{ApiResource, Discovery};
use kube::{Client, ResourceExt};
use serde_json::json;

const NS: &str = "gpuval-system";
/// Simulated GPUs (the fake kubelet sets the count a DRA pod's claim was allocated).
const SIM: &str = "gpus=8,model=H200,timescale=0.002";
const POOL: (&str, &str) = ("pool", "h200");

/// Creates kwok nodes `names` without `nvidia.com/gpu`, Ready, each publishing `uuids` of it
/// through the fake DRA driver.
async fn dra_nodes(client: &Client, nodes_uuids: &[(&str, Vec<String>)]) {
    for (name, uuids) in nodes_uuids {
        nodes::create_gpu_node(client, name, 0, &[POOL])
            .await
            .expect("node");
        dra::publish_gpus(client, name, uuids).await.expect("slice");
    }
    for (name, _) in nodes_uuids {
        nodes::wait_node_ready(client, name, Duration::from_secs(60))
            .await
            .expect("node ready");
    }
}

/// A pod outside gpuval on `node` holding one of its GPUs through its own claim, scheduled by
/// kube-scheduler (which allocates the claim), as another workload would.
async fn hog_one_gpu(client: &Client, node: &str) -> ResourceClaim {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "hog"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": dra::DRIVER, "allocationMode": "ExactCount", "count": 1}}]}}
    }))
    .expect("claim");
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hog"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "hog"}],
            "containers": [{"name": "hog", "image": "busybox",
                "resources": {"claims": [{"name": "gpu"}]}}]
        }
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    scenario::wait(
        claims,
        "hog",
        60,
        "allocated",
        |c: Option<&ResourceClaim>| {
            c.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.allocation.is_some())
        },
    )
    .await
}

/// The agent pod of `validation` on `node`.
async fn agent_pod(client: &Client, validation: &str, node: &str) -> Pod {
    let lp = ListParams::default().labels(&format!(
        "{}={},{}={}",
        labels::VALIDATION,
        labels::node_value(validation),
        labels::NODE,
        labels::node_value(node)
    ));
    let pods = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&lp)
        .await
        .expect("list pods")
        .items;
    pods.into_iter()
        .next()
        .unwrap_or_else(|| panic!("no agent pod of {validation} on {node}"))
}

async fn result_of(client: &Client, validation: &str, node: &str) -> GpuNodeResult {
    Api::<GpuNodeResult>::namespaced(client.clone(), NS)
        .get(&gpuval_crds::result::result_name(validation, node))
        .await
        .unwrap_or_else(|e| panic!("result of {node}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_resource_and_dra_nodes_pass_together_and_a_busy_dra_node_waits() {
    let e = scenario::Cluster::start_labelled(NS, &["gpu-er"], 8, &[POOL]).await;
    let c = &e.client;
    dra::publish_class(c).await.expect("device class");
    let sim = |n: usize| (0..n).map(dra::sim_uuid).collect::<Vec<_>>();
    dra_nodes(
        c,
        &[
            ("dra-a", sim(2)),
            // The driver lists a GPU the container is not given (the runtime shows it another).
            ("dra-bad", vec![dra::sim_uuid(0), "GPU-not-given".into()]),
            ("dra-busy", sim(2)),
        ],
    )
    .await;
    let hog = hog_one_gpu(c, "dra-busy").await;
    let _op = OperatorHandle::start(c.clone(), test_config(NS, SIM));
    e.apply(
        "mixed",
        json!({"nodeSelector": {"matchLabels": {"pool": "h200"}},
        "checks": {"memory": {}}}),
    )
    .await;

    // Everything but the busy node finishes (the status lists the nodes that did not pass);
    // the busy node's agent waits for its GPUs, and the status says why.
    let settled = |g: Option<&GpuValidation>| {
        g.is_some_and(|g| {
            let summary = g.status.as_ref().and_then(|s| s.summary.as_ref());
            let waiting = node_line(g, "dra-busy").is_some_and(|(v, m)| {
                v == NodeVerdict::Pending && m.contains("cannot allocate all claims")
            });
            summary.is_some_and(|s| s.passed + s.failed == 3) && waiting
        })
    };
    let gv = e.wait_for("mixed", 180, settled).await;
    let summary = gv.status.as_ref().unwrap().summary.clone().unwrap();
    assert_eq!((summary.passed, summary.failed), (2, 1), "{:?}", gv.status);
    assert_eq!(
        node_line(&gv, "dra-bad").map(|(v, _)| v),
        Some(NodeVerdict::Failed),
        "{:?}",
        gv.status
    );
    for node in ["gpu-er", "dra-a"] {
        let r = result_of(c, "mixed", node).await;
        let verdict = r.status.as_ref().map(|s| s.verdict);
        assert_eq!(verdict, Some(gpuval_crds::Verdict::Pass), "{node}");
    }

    // idleOnly: the node whose GPU another pod holds through its claim is busy, named with the
    // claim; the agents' own claims make no node busy, and without the claims nothing would.
    let claims: Api<ResourceClaim> = Api::all(c.clone());
    let held = gpuval_operator::controllers::schedule::gpu_claims(&claims, dra::DRIVER, 1)
        .await
        .expect("claims in pages");
    let pods: Api<Pod> = Api::all(c.clone());
    let selected: Vec<String> = ["gpu-er", "dra-a", "dra-bad", "dra-busy"]
        .map(String::from)
        .to_vec();
    let busy = gpuval_operator::controllers::schedule::busy_nodes(&pods, &held, &selected, 2)
        .await
        .expect("pods in pages");
    assert_eq!(busy.keys().collect::<Vec<_>>(), ["dra-busy"], "{busy:?}");
    assert_eq!(
        busy["dra-busy"],
        "busy: pod default/hog holds GPUs through ResourceClaim default/hog"
    );
    let blind = gpuval_operator::controllers::schedule::busy_nodes(
        &pods,
        &Default::default(),
        &selected,
        2,
    )
    .await
    .expect("pods in pages");
    assert!(
        blind.is_empty(),
        "the pods alone show no busy node: {blind:?}"
    );

    // The DRA node's pod took a claim, not nvidia.com/gpu; the extended-resource node's did not.
    let pod = agent_pod(c, "mixed", "dra-a").await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.resource_claims.as_ref().unwrap()[0]
            .resource_claim_template_name
            .as_deref(),
        Some("gpuval-mixed-g1-gpus")
    );
    let requests = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .clone();
    assert!(!requests.unwrap().contains_key(gpuval_crds::GPU_RESOURCE));
    let er = agent_pod(c, "mixed", "gpu-er").await;
    assert!(er.spec.as_ref().unwrap().resource_claims.is_none());

    // The DRA agent was held to the GPUs in the slices, and saw those.
    let r = result_of(c, "mixed", "dra-a").await;
    let facts = r.status.as_ref().unwrap().facts.clone().unwrap();
    assert_eq!(
        (facts.expected_gpus, facts.expected_from, facts.gpus_seen),
        (
            Some(2),
            Some(gpuval_crds::facts::CountSource::ResourceSlice),
            2
        )
    );
    // The node shown other GPUs than its claim names both lists.
    let bad = result_of(c, "mixed", "dra-bad").await;
    let failures = &bad.status.as_ref().unwrap().failures;
    let mismatch = failures
        .iter()
        .find(|f| f.code == gpuval_crds::reason::Code::DraAllocationMismatch)
        .unwrap_or_else(|| panic!("{failures:?}"));
    assert!(
        mismatch.message.contains("NVML shows GPU-sim-0, GPU-sim-1")
            && mismatch.message.contains("GPU-not-given"),
        "{}",
        mismatch.message
    );

    // The other workload ends; the waiting agent gets both GPUs and passes.
    Api::<Pod>::namespaced(c.clone(), "default")
        .delete("hog", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete hog pod");
    Api::<ResourceClaim>::namespaced(c.clone(), "default")
        .delete(&hog.name_any(), &DeleteParams::default())
        .await
        .expect("delete hog claim");
    let gv = e.wait_for("mixed", 120, terminal_for_generation).await;
    let status = gv.status.as_ref().unwrap();
    assert_eq!(status.summary.as_ref().unwrap().passed, 3, "{status:?}");
    assert_eq!(node_line(&gv, "dra-busy"), None, "passed: {status:?}");
    let busy = result_of(c, "mixed", "dra-busy").await;
    assert_eq!(busy.status.as_ref().unwrap().gpus.len(), 2);
    assert_eq!(status.phase, Some(Phase::Failed), "dra-bad failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cel_selector_narrows_the_claim_to_the_matching_gpus() {
    let e = scenario::Cluster::start_labelled(NS, &[], 8, &[POOL]).await;
    let c = &e.client;
    dra::publish_class(c).await.expect("device class");
    dra_nodes(c, &[("dra-a", (0..4).map(dra::sim_uuid).collect())]).await;
    let _op = OperatorHandle::start(c.clone(), test_config(NS, SIM));
    let selector = format!(
        "device.attributes['{}'].uuid in ['GPU-sim-0', 'GPU-sim-1']",
        dra::DRIVER
    );
    e.apply(
        "narrow",
        json!({"nodeNames": ["dra-a"], "checks": {"memory": {}},
            "dra": {"selector": selector}}),
    )
    .await;
    let gv = e.wait_for("narrow", 120, terminal_for_generation).await;
    assert_eq!(
        gv.status.as_ref().unwrap().phase,
        Some(Phase::Passed),
        "{:?}",
        gv.status
    );
    // The scheduler allocated the two matching GPUs, which the agent tested.
    let r = result_of(c, "narrow", "dra-a").await;
    assert_eq!(r.status.as_ref().unwrap().gpus.len(), 2);
    let facts = r.status.as_ref().unwrap().facts.clone().unwrap();
    assert_eq!(facts.expected_gpus, None, "a selector may claim fewer");

    // A selector the API server cannot compile is named in a Warning event on the validation.
    e.apply(
        "bad-cel",
        json!({"nodeNames": ["dra-a"], "checks": {"memory": {}},
            "dra": {"selector": "device.attributes["}}),
    )
    .await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(c.clone());
    let refused = waits::until(
        "the ClaimTemplateRefused event",
        Duration::from_secs(60),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|ev| {
                ev.reason.as_deref() == Some("ClaimTemplateRefused")
                    && ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad-cel")
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let note = refused.note.unwrap_or_default();
    assert!(
        note.contains("spec.dra.selector") && note.contains("gpuval-bad-cel-g1-gpus"),
        "{note}"
    );
}

/// A simulated spec whose GPU 1 fails the memory check.
const SIM_GPU1_BAD: &str = "gpus=8,model=H200,timescale=0.002,fail=memory@1";

/// Operator settings whose simulated results act on nodes (labels, taints), as real ones do.
fn acting_config() -> gpuval_operator::settings::config::OperatorConfig {
    gpuval_operator::settings::config::OperatorConfig {
        simulated_acts_on_nodes: true,
        ..test_config(NS, SIM)
    }
}

/// The DeviceTaintRule resource the API server serves, if any.
async fn served_rule(client: &Client) -> Option<ApiResource> {
    let d = Discovery::new(client.clone())
        .filter(&["resource.k8s.io"])
        .run()
        .await
        .expect("discovery");
    d.get("resource.k8s.io")?
        .resources_by_stability()
        .into_iter()
        .map(|(ar, _)| ar)
        .find(|ar| ar.kind == "DeviceTaintRule")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_dra_gpu_gets_a_device_taint_removed_when_it_passes_again() {
    let cp = ControlPlane::start_with(Options {
        device_taint_rules: true,
        ..Options::all()
    })
    .await
    .expect("control plane");
    let c = cp.client().await.expect("client");
    scenario::install(&c, NS).await;
    dra::publish_class(&c).await.expect("device class");
    dra_nodes(&c, &[("dra-a", (0..2).map(dra::sim_uuid).collect())]).await;
    let kubelet = scenario::start_kubelet(&c, cp.kubeconfig().to_path_buf(), NS);
    kubelet.set_node_env("dra-a", "GPUVAL_SIMULATE", SIM_GPU1_BAD);
    let rule = served_rule(&c).await.expect("DeviceTaintRule served");
    let _op = OperatorHandle::start(c.clone(), acting_config());

    scenario::apply_validation(&c, "e2e", "first", json!({"checks": {"memory": {}}})).await;
    let rules: Api<DynamicObject> = Api::all_with(c.clone(), &rule);
    let tainted = waits::until("the device taint", Duration::from_secs(120), || async {
        rules.get_opt("gpuval-dra-a-gpu-1").await.ok().flatten()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let spec = &tainted.data["spec"];
    assert_eq!(
        spec["deviceSelector"],
        json!({"driver": dra::DRIVER, "pool": "dra-a", "device": "gpu-1"}),
        "{tainted:?}"
    );
    let taint = &spec["taint"];
    assert_eq!(
        (&taint["key"], &taint["value"], &taint["effect"]),
        (
            &json!("gpuval.io/gpu-failed"),
            &json!("MemoryMismatch"),
            &json!("NoSchedule")
        ),
        "{tainted:?}"
    );
    assert_eq!(
        tainted.labels().get(labels::VALIDATION).map(String::as_str),
        Some("first")
    );
    let names: Vec<String> = rules
        .list(&ListParams::default())
        .await
        .expect("list rules")
        .items
        .iter()
        .map(|r| r.name_any())
        .collect();
    assert_eq!(names, ["gpuval-dra-a-gpu-1"], "only the failed GPU");

    // The GPU is repaired; the validation runs again (a new generation: only the same
    // validation or a schedule's run, as deep, clears a failure) and passes it (its claim
    // tolerates the taint), and the taint goes.
    kubelet.set_node_env("dra-a", "GPUVAL_SIMULATE", SIM);
    scenario::apply_validation(
        &c,
        "e2e",
        "first",
        json!({"checks": {"memory": {}}, "deadline": "11m"}),
    )
    .await;
    waits::until(
        "the device taint removed",
        Duration::from_secs(120),
        || async {
            rules
                .get_opt("gpuval-dra-a-gpu-1")
                .await
                .ok()
                .and_then(|r| r.is_none().then_some(()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let second = scenario::wait_validation(
        &c,
        "first",
        Duration::from_secs(30),
        "Passed",
        terminal_for_generation,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(second.status.unwrap().phase, Some(Phase::Passed));
    // The node says which run returned the GPU to service.
    let note = waits::until(
        "a GpuReturnedToService event",
        Duration::from_secs(60),
        || async {
            Api::<k8s_openapi::api::events::v1::Event>::all(c.clone())
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("GpuReturnedToService")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("dra-a")
                })
                .and_then(|e| e.note)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        note.contains("GpuValidation first") && note.contains("gpuval-dra-a-gpu-1"),
        "{note}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_device_taint_rules_a_failed_dra_gpu_taints_its_node_as_before() {
    let e = scenario::Cluster::start_labelled(NS, &[], 8, &[POOL]).await;
    let c = &e.client;
    assert!(served_rule(c).await.is_none(), "off by default in 1.36");
    dra::publish_class(c).await.expect("device class");
    dra_nodes(c, &[("dra-a", (0..2).map(dra::sim_uuid).collect())]).await;
    e.kubelet
        .set_node_env("dra-a", "GPUVAL_SIMULATE", SIM_GPU1_BAD);
    let _op = OperatorHandle::start(c.clone(), acting_config());
    e.apply(
        "fallback",
        json!({"checks": {"memory": {}}, "onFailure": {"action": "Taint"}}),
    )
    .await;
    let gv = e.wait_for("fallback", 120, terminal_for_generation).await;
    assert_eq!(gv.status.as_ref().unwrap().phase, Some(Phase::Failed));
    let nodes: Api<Node> = Api::all(c.clone());
    let node = scenario::wait(nodes, "dra-a", 60, "tainted", |n: Option<&Node>| {
        n.and_then(|n| n.spec.as_ref()?.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == labels::FAILED_NODE))
    })
    .await;
    assert!(node.spec.is_some());
}
