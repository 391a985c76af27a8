//! Results bound to their run, and only whom the administrator grants `admit` makes nodes join
//! (issue 43), on a real control plane (etcd, kube-apiserver, controller-manager, scheduler,
//! kwok nodes) with the chart installed by helm (its RBAC and admission policies). Agents are
//! stood in for by pods of the chart's agent service account and their pod-bound tokens, as a
//! kubelet mounts them:
//! - an agent writes only the report of the result the operator made for its own pod, for every
//!   name length (a validation name of 240 characters): not another run's result on its node,
//!   not another node's, none of the binding, nothing once its report is stored or the result
//!   is closed, and it creates no result at all (200 tries, also with `create` granted);
//! - a late Pass, after the node's line became final without it (DeadlineExceeded on a node the
//!   status cannot list), is refused, and one that got in anyway never makes the node Pass;
//! - a user with the edit role cannot make a schedule admit nodes, nor write a run a schedule
//!   owns (forging the schedule's uid); the admin role and the operator can; the failure taint
//!   is never an admission key.
//!
//! Tests wait on conditions (watches, the wait helpers), never on sleeps. SECURITY.md and
//! RELIABILITY.md name what each proves.

use std::time::Duration;

use gpuval_crds::result::{agent_pod_name, result_name};
use gpuval_crds::{GpuNodeResult, GpuValidation, GpuValidationSchedule, NodeVerdict, labels};
use gpuval_tests::auth::{self, BoundPod};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::{ControlPlane, Options, chart, crds, nodes, results, scenario, waits};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
const RELEASE: &str = "gpuval";
const LONG: Duration = Duration::from_secs(240);

/// A control plane with the chart installed and kwok GPU nodes.
struct Installed {
    cp: ControlPlane,
    admin: Client,
    agent_sa: String,
    operator_sa: String,
}

/// Starts a control plane, creates `gpu_nodes` (Ready), and installs the chart with the e2e
/// values and `extra` values (YAML appended to them).
async fn install(extra: &str, gpu_nodes: &[&str]) -> Installed {
    let cp = ControlPlane::start_with(Options::all())
        .await
        .expect("control plane");
    let admin = cp.client().await.expect("client");
    scenario::ready_gpu_nodes(&admin, gpu_nodes, 8, &[], LONG).await;
    let base = std::fs::read_to_string(crds::repo_root().join("tests/chart/e2e-values.yaml"))
        .expect("e2e values");
    let values = cp.dir().join("binding-values.yaml");
    std::fs::write(&values, format!("{base}\n{extra}\n")).expect("write values");
    chart::install(RELEASE, NS, &values, cp.kubeconfig())
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    let rendered = chart::render(RELEASE, NS, &[values.as_path()]).expect("render");
    let docs = chart::documents(&rendered).expect("documents");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the operator's Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let env = chart::deployment_env(deployment, NS, "operator").expect("env");
    let agent_sa = env
        .iter()
        .find(|(k, _)| k == "GPUVAL_AGENT_SERVICE_ACCOUNT")
        .map(|(_, v)| v.clone())
        .expect("the agent service account");
    Installed {
        admin,
        agent_sa,
        operator_sa: pod["serviceAccountName"].as_str().expect("SA").into(),
        cp,
    }
}

/// Whether a call was refused for lack of rights (403) or by admission (422/403 with the
/// policy's message); returns the message.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => s.message,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// Applies validation `name` with `spec` as admin.
async fn validation(client: &Client, name: &str, spec: Value) -> GpuValidation {
    scenario::apply_validation(client, "binding", name, spec).await
}

/// A pod of the agent service account on `node`, named as the operator names the agent pod of
/// validation `validation` (generation 1) there (kwok runs it: it is not labelled an agent
/// pod), and a client with its pod-bound token.
async fn agent_pod(c: &Installed, validation: &str, node: &str) -> (BoundPod, Client) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": agent_pod_name(validation, node, 1), "namespace": NS},
        "spec": {
            "nodeName": node,
            "serviceAccountName": c.agent_sa,
            "tolerations": [{"key": nodes::KWOK_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "agent", "image": "gpuval-agent:test"}],
        },
    }))
    .expect("pod");
    let pod = Api::<Pod>::namespaced(c.admin.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    let bound = BoundPod {
        name: pod.name_any(),
        uid: pod.uid().expect("pod uid"),
    };
    (bound.clone(), token_client(c, Some(&bound)).await)
}

/// A client with a token of the agent service account, bound to `pod` when given.
async fn token_client(c: &Installed, pod: Option<&BoundPod>) -> Client {
    let token = auth::request_token(&c.admin, NS, &c.agent_sa, pod)
        .await
        .expect("token");
    auth::token_client(c.cp.server(), &token)
        .await
        .expect("token client")
}

/// A merge patch of result `name` with `client`.
async fn merge(client: &Client, name: &str, patch: Value) -> Result<GpuNodeResult, kube::Error> {
    Api::<GpuNodeResult>::namespaced(client.clone(), NS)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// A result as an agent once created its own (server-side apply of the whole object, naming
/// itself as the writer): `validation` on `node`, written by `pod`.
fn result_as_created(validation: &str, node: &str, pod: &BoundPod) -> Value {
    json!({
        "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
        "metadata": {"name": result_name(validation, node), "namespace": NS,
            "labels": {labels::VALIDATION: labels::node_value(validation), labels::NODE: node,
                       labels::GENERATION: "1", labels::VERDICT: "Pass"},
            "annotations": {labels::NODE: node, labels::POD: pod.name, labels::POD_UID: pod.uid}},
        "spec": {"validation": validation, "generation": 1, "nodeName": node},
    })
}

async fn apply(client: &Client, body: &Value) -> Result<GpuNodeResult, kube::Error> {
    let name = body["metadata"]["name"].as_str().expect("name").to_string();
    Api::<GpuNodeResult>::namespaced(client.clone(), NS)
        .patch(
            &name,
            &PatchParams::apply("gpuval-agent/probe").force(),
            &Patch::Apply(body),
        )
        .await
}

/// Waits until the agent-own-node policy is in force (the API server loads policies in the
/// background): a token that names no node is refused writing result `name`.
async fn own_node_policy_in_force(c: &Installed, name: &str) {
    let unbound = token_client(c, None).await;
    waits::until("the agent-own-node policy", LONG, || async {
        match merge(
            &unbound,
            name,
            json!({"metadata": {"labels": {"probe": "x"}}}),
        )
        .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("names no node") => Some(()),
            _ => None,
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A validation name of `len` characters (a DNS subdomain of 60-character labels).
fn long_name(len: usize) -> String {
    let mut name = String::new();
    let mut label = b'a';
    while name.len() < len {
        if !name.is_empty() {
            name.push('.');
        }
        let room = (len - name.len()).min(60);
        name.extend(std::iter::repeat_n(label as char, room));
        label += 1;
    }
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_writes_only_the_report_of_the_result_made_for_its_pod() {
    let c = install("", &["gpu-a", "gpu-b"]).await;
    let long = long_name(240);
    assert_eq!(long.len(), 240);
    assert!(
        agent_pod_name(&long, "gpu-a", 1).len() <= 63 && result_name(&long, "gpu-a").len() > 240,
        "the pod's name is hashed, the result's is not"
    );
    let v_long = validation(&c.admin, &long, json!({"checks": {"memory": {}}})).await;
    let v_other = validation(&c.admin, "other", json!({"checks": {"memory": {}}})).await;
    // Pods and results where the operator would make them (no operator runs here).
    let (long_a, agent) = agent_pod(&c, &long, "gpu-a").await;
    let (other_a, other_agent) = agent_pod(&c, "other", "gpu-a").await;
    let (long_b, agent_b) = agent_pod(&c, &long, "gpu-b").await;
    let bind = |gv: &GpuValidation, node: &'static str, pod: &BoundPod| {
        let (admin, gv, pod) = (c.admin.clone(), gv.clone(), pod.clone());
        async move {
            results::create_bound(&admin, NS, &gv, node, &pod)
                .await
                .expect("a result bound to its pod")
                .name_any()
        }
    };
    let mine = bind(&v_long, "gpu-a", &long_a).await;
    let others = bind(&v_other, "gpu-a", &other_a).await;
    bind(&v_long, "gpu-b", &long_b).await;
    own_node_policy_in_force(&c, &mine).await;

    // Allowed: the report of the result made for its own pod.
    results::write_report(&agent, NS, &mine, "gpu-a", "Fail")
        .await
        .expect("an agent writes its report");

    // Another run's pod on the same node: refused, whether it takes the result over under its
    // own name (as an agent once could where the pod's name is hashed) or writes a report.
    let m = refused(
        "another run's pod takes the result over",
        apply(&other_agent, &result_as_created(&long, "gpu-a", &other_a)).await,
    );
    assert!(m.contains("is bound to pod"), "{m}");
    let m = refused(
        "another run's pod writes a report",
        results::write_report(&other_agent, NS, &mine, "gpu-a", "Pass").await,
    );
    assert!(
        m.contains(&format!("is bound to pod {}", long_a.name)),
        "{m}"
    );
    // The same validation's pod on another node.
    let m = refused(
        "a pod on another node",
        results::write_report(&agent_b, NS, &mine, "gpu-b", "Pass").await,
    );
    assert!(
        m.contains("an agent on node gpu-b may not write the result of node gpu-a"),
        "{m}"
    );

    // Its own result: nothing of the binding may change.
    let binding_changes = [
        json!({"metadata": {"annotations": {labels::POD_UID: other_a.uid}}}),
        json!({"metadata": {"annotations": {labels::POD: other_a.name}}}),
        json!({"metadata": {"annotations": {labels::VALIDATION_UID: v_other.uid()}}}),
        json!({"metadata": {"annotations": {labels::NODE: "gpu-b"}}}),
        json!({"metadata": {"labels": {labels::GENERATION: "2"}}}),
        json!({"metadata": {"labels": {labels::VALIDATION: "other"}}}),
        json!({"metadata": {"labels": {labels::NODE: null}}}),
        json!({"metadata": {"labels": {"gpuval.io/extra": "x"}}}),
    ];
    for patch in binding_changes {
        let m = refused(
            &patch.to_string(),
            merge(&agent, &mine, patch.clone()).await,
        );
        assert!(m.contains("may change only its report"), "{patch}: {m}");
    }
    for patch in [
        json!({"spec": {"generation": 2}}),
        json!({"metadata": {"ownerReferences": null}}),
        json!({"metadata": {"finalizers": ["example.com/keep"]}}),
    ] {
        let m = refused(
            &patch.to_string(),
            merge(&agent, &mine, patch.clone()).await,
        );
        assert!(
            m.contains("may not change the spec, owner references or finalizers"),
            "{patch}: {m}"
        );
    }
    // Once the report is stored it is final; the fabric test's annotations still go.
    let m = refused(
        "turn a stored Fail into a Pass",
        results::write_report(&agent, NS, &mine, "gpu-a", "Pass").await,
    );
    assert!(m.contains("may change only its report"), "{m}");
    let m = refused(
        "change the stored report",
        Api::<GpuNodeResult>::namespaced(agent.clone(), NS)
            .patch_status(
                &mine,
                &PatchParams::apply("gpuval-agent/gpu-a").force(),
                &Patch::Apply(results::report_status("gpu-a", "Pass")),
            )
            .await,
    );
    assert!(m.contains("is stored and final"), "{m}");
    merge(
        &agent,
        &mine,
        json!({"metadata": {"annotations": {labels::FABRIC_OUTCOMES: "[]"}}}),
    )
    .await
    .expect("the fabric outcomes after the report");
    let stored = Api::<GpuNodeResult>::namespaced(c.admin.clone(), NS)
        .get(&mine)
        .await
        .expect("the result");
    assert_eq!(stored.labels()[labels::VERDICT], "Fail");
    assert_eq!(
        stored.status.map(|s| s.verdict),
        Some(gpuval_crds::Verdict::Fail)
    );

    // A closed result (its node's line became final without it) is written by no one.
    merge(
        &c.admin,
        &others,
        json!({"metadata": {"annotations": {labels::CLOSED: "DeadlineExceeded"}}}),
    )
    .await
    .expect("close the result");
    let m = refused(
        "write a closed result",
        results::write_report(&other_agent, NS, &others, "gpu-a", "Pass").await,
    );
    assert!(m.contains("is closed"), "{m}");

    // No result without bound: an agent creates none, whatever the names' lengths, as an agent
    // once could (tried: 200 in 2 s); and none when an administrator grants it `create` either.
    for i in 0..200 {
        let validation = if i % 2 == 0 {
            format!("{}-{i}", long_name(230))
        } else {
            format!("run-{i}")
        };
        let m = refused(
            "create a result",
            apply(&agent, &result_as_created(&validation, "gpu-a", &long_a)).await,
        );
        assert!(m.contains("cannot create"), "{i}: {m}");
    }
    grant_create(&c).await;
    let body = result_as_created(&format!("{}-x", long_name(230)), "gpu-a", &long_a);
    let m = waits::until("the create grant to apply", LONG, || async {
        match apply(&agent, &body).await {
            Err(kube::Error::Api(s)) if !s.message.contains("cannot create") => Some(s.message),
            Ok(r) => panic!("an agent created {}", r.name_any()),
            Err(_) => None,
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(m.contains("agents may not create GpuNodeResults"), "{m}");
    let all = Api::<GpuNodeResult>::namespaced(c.admin.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("list results");
    assert_eq!(
        all.items.len(),
        3,
        "only the results made for pods: {:?}",
        all.items.iter().map(|r| r.name_any()).collect::<Vec<_>>()
    );
}

/// Grants the agent service account `create` on results, as an administrator might by mistake.
async fn grant_create(c: &Installed) {
    let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(json!({
        "metadata": {"name": "too-much", "namespace": NS},
        "rules": [{"apiGroups": ["gpuval.io"], "resources": ["gpunoderesults"], "verbs": ["create"]}],
    }))
    .expect("role");
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "too-much", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "too-much"},
        "subjects": [{"kind": "ServiceAccount", "name": c.agent_sa, "namespace": NS}],
    }))
    .expect("binding");
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(c.admin.clone(), NS)
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(c.admin.clone(), NS)
        .create(&PostParams::default(), &binding)
        .await
        .expect("role binding");
}

/// An operator (in-process, as admin) whose agent pods use the chart's agent service account;
/// agents run nowhere (no kubelet): the test writes their reports with their pods' tokens.
fn operator(c: &Installed) -> OperatorHandle {
    let mut cfg = test_config(NS, "");
    cfg.agent_env.clear();
    cfg.agent_service_account = c.agent_sa.clone();
    OperatorHandle::start(c.admin.clone(), cfg)
}

/// The agent pods of validation `name`'s generation 1, once there are `n` bound to their
/// nodes.
async fn bound_pods(client: &Client, name: &str, n: usize) -> Vec<Pod> {
    let selector = format!("{}={name},{}=1", labels::VALIDATION, labels::GENERATION);
    waits::until("agent pods bound to their nodes", LONG, || async {
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?
            .items;
        let bound = pods
            .iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
            .count();
        (bound == n).then_some(pods)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn node_of(p: &Pod) -> String {
    p.annotations()[labels::NODE].clone()
}

fn bound(p: &Pod) -> BoundPod {
    BoundPod {
        name: p.name_any(),
        uid: p.uid().expect("pod uid"),
    }
}

fn verdict_label(n: &Node) -> Option<&str> {
    n.labels().get(labels::NODE_VERDICT).map(String::as_str)
}

/// The result the operator made for `pod` (of `validation` on its node), once it exists.
async fn made_result(client: &Client, validation: &str, pod: &Pod) -> GpuNodeResult {
    let name = result_name(validation, &node_of(pod));
    let api: Api<GpuNodeResult> = Api::namespaced(client.clone(), NS);
    waits::until(
        "the result the operator makes with the pod",
        LONG,
        || async { api.get_opt(&name).await.ok().flatten() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_pass_after_the_deadline_never_overrides_the_final_line() {
    // 51 nodes: 50 failed lines fill the status's list, so the last node's is not listed.
    let names: Vec<String> = (0..=gpuval_crds::MAX_LISTED_NODES)
        .map(|i| format!("gpu-{i:02}"))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let last = names.last().expect("nodes").clone();
    let c = install("", &refs).await;
    let _op = operator(&c);

    // First the last node fails on hardware evidence (its agent's report, written with its
    // pod's token into the result the operator made): labelled Fail, GpuValidated=False.
    validation(
        &c.admin,
        "before",
        json!({"nodeNames": [last], "checks": {"memory": {}}}),
    )
    .await;
    let before = bound_pods(&c.admin, "before", 1).await.remove(0);
    let result = made_result(&c.admin, "before", &before).await;
    let binding = gpuval_crds::binding::Binding::of(&result.metadata).expect("bound");
    assert_eq!(
        (binding.pod.as_str(), Some(binding.pod_uid.as_str())),
        (before.name_any().as_str(), before.metadata.uid.as_deref()),
        "the operator bound the result to the pod it made"
    );
    let agent = token_client(&c, Some(&bound(&before))).await;
    own_node_policy_in_force(&c, &result.name_any()).await;
    results::write_report(&agent, NS, &result.name_any(), &last, "Fail")
        .await
        .expect("the agent's report");
    nodes::wait_node(&c.admin, &last, "labelled Fail", LONG, |n| {
        verdict_label(n) == Some("Fail")
    })
    .await;
    // Its GPUs are free again for the next run's pod.
    Api::<Pod>::namespaced(c.admin.clone(), NS)
        .delete(&before.name_any(), &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the finished agent pod");

    // A run over every node: 50 agent pods are evicted (Error, listed), the last node's never
    // runs and is out of time (DeadlineExceeded, not listed).
    validation(
        &c.admin,
        "late",
        json!({"checks": {"memory": {}}, "deadline": "30s"}),
    )
    .await;
    let pods = bound_pods(&c.admin, "late", names.len()).await;
    let mut late_agent = None;
    for p in &pods {
        if node_of(p) == last {
            late_agent = Some((token_client(&c, Some(&bound(p))).await, p.clone()));
            continue;
        }
        Api::<Pod>::namespaced(c.admin.clone(), NS)
            .patch_status(
                &p.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Failed", "reason": "Evicted",
                    "message": "The node was low on resource: memory."}})),
            )
            .await
            .expect("evict");
    }
    let (late_agent, late_pod) = late_agent.expect("the last node's pod");
    let gv = scenario::wait_validation(&c.admin, "late", LONG, "finished", scenario::terminal)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = gv.status.clone().expect("status");
    assert!(
        status.nodes_not_listed >= 1 && !status.nodes.iter().any(|l| l.name == last),
        "{last} is not listed: {:?}",
        status.nodes.iter().map(|l| &l.name).collect::<Vec<_>>()
    );
    let name = result_name("late", &last);
    let closed = Api::<GpuNodeResult>::namespaced(c.admin.clone(), NS)
        .get(&name)
        .await
        .expect("the last node's result");
    assert_eq!(
        gpuval_crds::binding::closed(&closed.metadata),
        Some(NodeVerdict::DeadlineExceeded.as_str()),
        "closed with the node's line"
    );

    // The late Pass, with the pod's token while the pod is still being deleted: refused.
    let m = refused(
        "a late pass",
        results::write_report(&late_agent, NS, &name, &last, "Pass").await,
    );
    assert!(m.contains("is closed"), "{m}");
    assert!(late_pod.metadata.uid.is_some());
    // One that got in anyway (written as admin) is kept for the record and counts for nothing.
    merge(&c.admin, &name, results::report_metadata("Pass"))
        .await
        .expect("plant the late pass");
    Api::<GpuNodeResult>::namespaced(c.admin.clone(), NS)
        .patch_status(
            &name,
            &PatchParams::apply("gpuval-agent/late").force(),
            &Patch::Apply(results::report_status(&last, "Pass")),
        )
        .await
        .expect("plant the late report");
    // The node-state controller looks at the node again once its marks change: a forged Pass
    // label is put back to what the node's evidence says, the earlier hardware Fail.
    Api::<Node>::all(c.admin.clone())
        .patch(
            &last,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {labels::NODE_VERDICT: "Pass"}}})),
        )
        .await
        .expect("forge the node's verdict");
    let node = nodes::wait_node(&c.admin, &last, "labelled Fail again", LONG, |n| {
        verdict_label(n) == Some("Fail")
    })
    .await;
    let condition = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuValidated"))
        .map(|c| c.status.clone());
    assert_eq!(condition.as_deref(), Some("False"), "{:?}", node.labels());
}

/// A user: a service account in `default` bound cluster-wide to the built-in ClusterRole
/// `role` (edit or admin, which the chart's aggregated roles extend), and its client.
async fn user(c: &Installed, name: &str, role: &str) -> Client {
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}}))
            .expect("service account");
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(c.admin.clone(), "default")
        .create(&PostParams::default(), &sa)
        .await
        .expect("create the service account");
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
    }))
    .expect("binding");
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(c.admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the role");
    let token = auth::request_token(&c.admin, "default", name, None)
        .await
        .expect("token");
    auth::token_client(c.cp.server(), &token)
        .await
        .expect("client")
}

/// A schedule named `name` with `spec`.
fn schedule(name: &str, spec: Value) -> GpuValidationSchedule {
    serde_json::from_value(json!({"apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidationSchedule", "metadata": {"name": name}, "spec": spec}))
    .expect("schedule")
}

fn admits(key: &str) -> Value {
    json!({"admission": {"debounce": "1s", "taint": {"key": key}},
           "template": {"checks": {"memory": {}}}})
}

/// A run that names schedule `s` as its controller (as the operator makes one).
fn run_of(name: &str, s: &GpuValidationSchedule) -> GpuValidation {
    let mut v: GpuValidation = serde_json::from_value(json!({"apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation", "metadata": {"name": name},
        "spec": {"nodeNames": ["gpu-a"], "checks": {"topology": {}}}}))
    .expect("run");
    v.metadata.owner_references = Some(vec![s.controller_owner_ref(&()).expect("owner")]);
    v
}

/// Creates `obj` with `client` until it works (RBAC aggregation and role bindings apply in
/// the background).
async fn create_when_allowed<K>(client: &Client, obj: &K) -> K
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    waits::until(&format!("create {}", obj.name_any()), LONG, || async {
        api.create(&PostParams::default(), obj).await.ok()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_whom_the_administrator_grants_admit_makes_nodes_join() {
    let c = install("rbac:\n  aggregateToEdit: true", &["gpu-a"]).await;
    let editor = user(&c, "editor", "edit").await;
    let administrator = user(&c, "administrator", "admin").await;
    let schedules: Api<GpuValidationSchedule> = Api::all(editor.clone());
    // The edit role starts validations and plain schedules...
    create_when_allowed(
        &editor,
        &schedule(
            "nightly",
            json!({"schedule": "0 3 * * *", "template": {"checks": {"memory": {}}}}),
        ),
    )
    .await;
    // ...but makes no schedule admit nodes (once the policy is in force).
    let m = waits::until("the admit policy", LONG, || async {
        match schedules
            .create(
                &PostParams::default(),
                &schedule("mine", admits(labels::UNVALIDATED)),
            )
            .await
        {
            Err(kube::Error::Api(s)) => Some(s.message),
            Ok(_) => {
                let _ = schedules.delete("mine", &DeleteParams::default()).await;
                None
            }
            Err(_) => None,
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        m.contains("the verb admit on gpuvalidationschedules") && m.contains("editor"),
        "{m}"
    );
    let m = refused(
        "add admission to a plain schedule",
        schedules
            .patch(
                "nightly",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"admission": {}}})),
            )
            .await,
    );
    assert!(m.contains("admit"), "{m}");

    // The admin role (and cluster-admin) may.
    let gate = create_when_allowed(
        &administrator,
        &schedule("gate", admits(labels::UNVALIDATED)),
    )
    .await;
    // The edit role can neither weaken the gate's checks nor write a run it owns.
    let m = refused(
        "change the gate's template",
        schedules
            .patch(
                "gate",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"checks": {"topology": {}}}}})),
            )
            .await,
    );
    assert!(m.contains("admit"), "{m}");
    let runs: Api<GpuValidation> = Api::all(editor.clone());
    let m = refused(
        "a run owned by the gate (its uid copied)",
        runs.create(&PostParams::default(), &run_of("forged", &gate))
            .await,
    );
    assert!(
        m.contains("a validation owned by GpuValidationSchedule gate"),
        "{m}"
    );
    let mut not_controller = run_of("forged-owner", &gate);
    if let Some(o) = not_controller
        .metadata
        .owner_references
        .as_mut()
        .and_then(|o| o.first_mut())
    {
        o.controller = Some(false);
    }
    refused(
        "a run that only names the gate as an owner",
        runs.create(&PostParams::default(), &not_controller).await,
    );
    // The operator's own identity writes the runs of schedules.
    let operator_token = auth::request_token(&c.admin, NS, &c.operator_sa, None)
        .await
        .expect("operator token");
    let operator_identity = auth::token_client(c.cp.server(), &operator_token)
        .await
        .expect("operator client");
    Api::<GpuValidation>::all(operator_identity)
        .create(&PostParams::default(), &run_of("gate-run", &gate))
        .await
        .expect("the operator writes a schedule's run");

    // The failure taint is no admission key, not even for cluster-admin: the operator refuses
    // the schedule, saying why, and starts nothing.
    let _op = operator(&c);
    Api::<GpuValidationSchedule>::all(c.admin.clone())
        .create(
            &PostParams::default(),
            &schedule("unfail", admits(labels::FAILED_NODE)),
        )
        .await
        .expect("cluster-admin writes the schedule");
    let refused_schedule = scenario::wait(
        Api::<GpuValidationSchedule>::all(c.admin.clone()),
        "unfail",
        LONG.as_secs(),
        "refused",
        |s: Option<&GpuValidationSchedule>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "AdmissionRefused")
            })
        },
    )
    .await;
    let ready = refused_schedule
        .status
        .map(|s| s.conditions)
        .unwrap_or_default();
    let msg = &ready
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready")
        .message;
    assert!(
        msg.contains(labels::FAILED_NODE) && msg.contains("never an admission taint"),
        "{msg}"
    );
    let started = Api::<GpuValidation>::all(c.admin.clone())
        .list(&ListParams::default().labels(&format!("{}=unfail", labels::SCHEDULE)))
        .await
        .expect("runs");
    assert!(started.items.is_empty());
}

/// The keys the agent-own-node policy lets an agent write are the API crate's
/// (`gpuval_crds::binding`), which the agent's writes and the operator's readers use.
#[test]
fn the_policy_lets_an_agent_write_exactly_the_api_crate_s_report_keys() {
    let docs = chart::documents(&chart::render(RELEASE, NS, &[]).expect("render")).expect("docs");
    let policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "ValidatingAdmissionPolicy"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-agent-own-node"))
        })
        .expect("the agent-own-node policy");
    let list = |name: &str| -> Vec<String> {
        let expr = policy["spec"]["variables"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == name))
            .and_then(|v| v["expression"].as_str())
            .unwrap_or_else(|| panic!("variable {name}"));
        expr.trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|k| k.trim().trim_matches('\'').to_string())
            .collect()
    };
    let api = |keys: &[&str]| -> Vec<String> { keys.iter().map(|k| k.to_string()).collect() };
    use gpuval_crds::binding::{AGENT_LABELS, FABRIC_ANNOTATIONS, REPORT_ANNOTATIONS};
    assert_eq!(list("reportLabels"), api(&AGENT_LABELS));
    assert_eq!(list("reportAnnotations"), api(&REPORT_ANNOTATIONS));
    assert_eq!(list("fabricAnnotations"), api(&FABRIC_ANNOTATIONS));
}
