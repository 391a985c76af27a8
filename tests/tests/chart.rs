//! The Helm chart (charts/gpuval) on a real control plane: it lints, renders with the default
//! and every ci/ values file into manifests the API server accepts, refuses bad values with a
//! clear message, and installs for real; the operator, run with the chart's operator
//! service-account token and the chart Deployment's environment, completes a validation
//! whose agents run with pod-bound tokens of the chart's agent service account, which proves
//! both sets of RBAC are enough; the agent's token is then shown to be confined.

use std::path::PathBuf;
use std::time::Duration;

use gpuval_crds::{GpuNodeResult, GpuValidation, Phase};
use gpuval_tests::auth::{self, BoundPod};
use gpuval_tests::binaries::operator_binary;
use gpuval_tests::chart::{self, ChartTools, OperatorProcess};
use gpuval_tests::kubelet::{FakeKubelet, KubeletOptions, agent_binary};
use gpuval_tests::{ControlPlane, Options, crds, nodes, results, scenario, waits};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
const RELEASE: &str = "gpuval";

fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart::chart_dir().join("ci"))
        .expect("charts/gpuval/ci")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "ci values files: {files:?}");
    files
}

fn kinds(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

async fn wait_crd(client: &Client, name: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api, name, conditions::is_crd_established()),
    )
    .await
    .unwrap_or_else(|_| panic!("CRD {name} not Established"))
    .expect("watch CRD");
}

/// What every rendering must hold, whatever the values: a hardened operator, separate
/// identities for operator and agent, and an agent that can write nothing but results.
fn check_invariants(file: &str, docs: &[Value]) {
    let deployments = find(docs, "Deployment");
    assert_eq!(deployments.len(), 1, "{file}: {:?}", kinds(docs));
    let pod = &deployments[0]["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{file}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{file}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{file}");
    assert_eq!(sc["privileged"], false, "{file}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{file}");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert!(c[probe]["httpGet"]["path"].is_string(), "{file}: {probe}");
    }
    assert!(c["resources"]["requests"].is_object(), "{file}: resources");
    let env = |name: &str| {
        c["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == name))
            .and_then(|v| v["value"].as_str())
            .map(str::to_string)
    };
    let replicas = deployments[0]["spec"]["replicas"].as_i64().unwrap_or(1);
    if replicas > 1 {
        assert_eq!(
            env("GPUVAL_LEADER_ELECT").as_deref(),
            Some("true"),
            "{file}"
        );
    }
    // Two replicas are never evicted together; one needs no budget.
    let pdbs = find(docs, "PodDisruptionBudget");
    assert_eq!(
        pdbs.len(),
        usize::from(replicas > 1),
        "{file}: {:?}",
        kinds(docs)
    );
    if let Some(pdb) = pdbs.first() {
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{file}");
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"],
            deployments[0]["spec"]["selector"]["matchLabels"],
            "{file}"
        );
    }
    // Read access for the built-in view role, never more unless asked.
    let aggregated = |label: &str| {
        docs.iter()
            .filter(|d| d["kind"] == "ClusterRole" && d["metadata"]["labels"][label] == "true")
            .count()
    };
    assert_eq!(
        aggregated("rbac.authorization.k8s.io/aggregate-to-view"),
        1,
        "{file}"
    );
    // Admission (the `admit` verb) is never the edit role's: only admin's and the operator's.
    for role in find(docs, "ClusterRole") {
        let verbs = role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| {
                r["verbs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
            });
        let admits = verbs.into_iter().any(|v| v == "admit" || v == "*");
        let to_edit =
            role["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true";
        assert!(
            !(admits && to_edit),
            "{file}: {} gives edit admit",
            role["metadata"]["name"]
        );
    }
    for np in find(docs, "NetworkPolicy") {
        assert_eq!(np["spec"]["policyTypes"], json!(["Ingress"]), "{file}");
    }
    let operator_sa = pod["serviceAccountName"].as_str().expect("operator SA");
    let agent_sa = env("GPUVAL_AGENT_SERVICE_ACCOUNT").expect("agent SA");
    assert_ne!(operator_sa, agent_sa, "{file}: one identity for both");
    let sas: Vec<&str> = find(docs, "ServiceAccount")
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .collect();
    assert!(
        sas.contains(&operator_sa) && sas.contains(&agent_sa.as_str()),
        "{file}: {sas:?}"
    );

    let mut dra_rules = 0;
    // No wildcards; secrets only for the operator in its own namespace (the fabric key Secrets
    // it makes: created, read back by name, deleted; never listed or watched); cluster-wide
    // roles never write pods (they may list them: idleOnly schedules look for pods that hold
    // GPUs).
    for role in docs
        .iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("Role" | "ClusterRole")))
    {
        for rule in role["rules"].as_array().into_iter().flatten() {
            for field in ["apiGroups", "resources", "verbs"] {
                assert!(
                    !rule[field]
                        .as_array()
                        .is_some_and(|v| v.iter().any(|x| x == "*")),
                    "{file}: wildcard in {rule}"
                );
            }
            let resources = rule["resources"].as_array().cloned().unwrap_or_default();
            if resources.contains(&json!("secrets")) {
                assert_eq!(resources, vec![json!("secrets")], "{file}: {rule}");
                assert_eq!(role["kind"], "Role", "{file}: {rule}");
                assert!(
                    role["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with("-operator")),
                    "{file}: only the operator's Role may touch secrets: {rule}"
                );
                assert_eq!(
                    rule["verbs"],
                    json!(["create", "get", "delete"]),
                    "{file}: {rule}"
                );
            }
            // DRA: slices are only read and claims only listed (cluster-wide), claim templates
            // only created (in the operator's namespace); no rule at all when the chart never
            // uses DRA.
            if rule["apiGroups"] == json!(["resource.k8s.io"]) {
                let dra_mode = env("GPUVAL_GPU_ALLOCATION");
                assert_ne!(
                    dra_mode.as_deref(),
                    Some("extendedResource"),
                    "{file}: {rule}"
                );
                let (kind, verbs) = if resources == vec![json!("resourceslices")] {
                    ("ClusterRole", json!(["get", "list", "watch"]))
                } else if resources == vec![json!("devicetaintrules")] {
                    ("ClusterRole", json!(["list", "create", "patch", "delete"]))
                } else if resources == vec![json!("resourceclaims")] {
                    // idleOnly: the claims that hold GPUs, listed with the pods.
                    ("ClusterRole", json!(["list"]))
                } else {
                    assert_eq!(resources, vec![json!("resourceclaimtemplates")], "{file}");
                    ("Role", json!(["create"]))
                };
                assert_eq!(
                    (&role["kind"], &rule["verbs"]),
                    (&json!(kind), &verbs),
                    "{file}"
                );
                dra_rules += 1;
            }
            if role["kind"] == "ClusterRole" && resources.contains(&json!("pods")) {
                assert_eq!(rule["verbs"], json!(["list"]), "{file}: {rule}");
            }
        }
    }

    let dra = env("GPUVAL_GPU_ALLOCATION");
    let want = if dra.as_deref() == Some("extendedResource") {
        0
    } else {
        4
    };
    assert_eq!(dra_rules, want, "{file}: DRA rules under mode {dra:?}");

    // Every rule bound to the agent: no pods, no spec writes, results only.
    let agent_roles: Vec<&str> = docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("RoleBinding" | "ClusterRoleBinding")
            )
        })
        .filter(|b| {
            b["subjects"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["name"] == agent_sa.as_str()))
        })
        .filter_map(|b| b["roleRef"]["name"].as_str())
        .collect();
    assert!(!agent_roles.is_empty(), "{file}: agent has no role");
    for d in docs.iter().filter(|d| {
        matches!(d["kind"].as_str(), Some("Role" | "ClusterRole"))
            && agent_roles.contains(&d["metadata"]["name"].as_str().unwrap_or(""))
    }) {
        for rule in d["rules"].as_array().into_iter().flatten() {
            let strings = |key: &str| -> Vec<&str> {
                rule[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect()
            };
            let (resources, verbs) = (strings("resources"), strings("verbs"));
            assert_eq!(rule["apiGroups"], json!(["gpuval.io"]), "{file}: {rule}");
            for r in &resources {
                match *r {
                    "gpuvalidations" => assert_eq!(verbs, ["get"], "{file}: {rule}"),
                    // Agents write their report into the result the operator made for their
                    // pod: they never create one.
                    "gpunoderesults" | "gpunoderesults/status" => {
                        assert_eq!(verbs, ["patch"], "{file}: {rule}")
                    }
                    "gpufabricrounds" => assert!(
                        verbs.iter().all(|v| matches!(*v, "get" | "list" | "watch")),
                        "{file}: the agent only reads fabric rounds: {rule}"
                    ),
                    other => panic!("{file}: agent may touch {other}"),
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_lints_and_every_rendering_is_accepted_by_the_api_server() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::create_namespace(&client, NS).await;
    // The ServiceMonitor and PrometheusRule kinds must exist for their dry run (stand-ins for
    // the Prometheus Operator's CRDs).
    for (file, crd) in [
        (
            "servicemonitor-crd.yaml",
            "servicemonitors.monitoring.coreos.com",
        ),
        (
            "prometheusrule-crd.yaml",
            "prometheusrules.monitoring.coreos.com",
        ),
    ] {
        let path = crds::repo_root().join("tests/chart").join(file);
        chart::output(cp.kubectl().unwrap().args(["apply", "-f"]).arg(&path))
            .unwrap_or_else(|e| panic!("kubectl apply {file}: {e}"));
        wait_crd(&client, crd).await;
    }

    let mut sets: Vec<(String, Vec<PathBuf>)> = vec![("defaults".into(), Vec::new())];
    sets.extend(ci_values().into_iter().map(|f| {
        (
            f.file_name().unwrap().to_string_lossy().into_owned(),
            vec![f],
        )
    }));
    for (name, files) in &sets {
        // helm lint --strict (warnings fail too).
        let mut lint = chart::helm().unwrap();
        lint.args(["lint", "--strict", &chart::kube_version_arg()])
            .arg(chart::chart_dir());
        for f in files {
            lint.arg("--values").arg(f);
        }
        chart::output(&mut lint).unwrap_or_else(|e| panic!("helm lint with {name}: {e}"));

        // helm template, CRDs included, then a server-side dry run of every manifest.
        let mut template = chart::helm().unwrap();
        template
            .args(["template", RELEASE])
            .arg(chart::chart_dir())
            .args([
                "--namespace",
                NS,
                "--include-crds",
                &chart::kube_version_arg(),
            ]);
        for f in files {
            template.arg("--values").arg(f);
        }
        let rendered = chart::output(&mut template)
            .unwrap_or_else(|e| panic!("helm template with {name}: {e}"));
        let docs = chart::documents(&rendered).unwrap();
        check_invariants(name, &docs);
        let manifest = cp.dir().join(format!("rendered-{name}"));
        std::fs::write(&manifest, &rendered).unwrap();
        let out = cp
            .kubectl()
            .unwrap()
            .args(["apply", "--dry-run=server", "-f"])
            .arg(&manifest)
            .output()
            .expect("kubectl");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: the API server refused a manifest: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        // One line of output per object: every manifest went through the server.
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.contains("(server dry run)"))
                .count(),
            docs.len(),
            "{name}: {stdout}"
        );
        println!(
            "{name}: {} objects accepted: {:?}",
            docs.len(),
            kinds(&docs)
        );
    }

    // The values files change what they should.
    let with = |file: &str| {
        let f = chart::chart_dir().join("ci").join(file);
        chart::documents(&chart::render(RELEASE, NS, &[f.as_path()]).unwrap()).unwrap()
    };
    let defaults = chart::documents(&chart::render(RELEASE, NS, &[]).unwrap()).unwrap();
    // The agent's own-node policy, the admission-authority policy and the NCCL environment
    // policy.
    assert_eq!(find(&defaults, "ValidatingAdmissionPolicy").len(), 3);
    assert!(find(&defaults, "ServiceMonitor").is_empty());
    let minimal = with("minimal-values.yaml");
    assert!(find(&minimal, "ValidatingAdmissionPolicy").is_empty());
    assert!(find(&minimal, "Service").is_empty());
    let ha = with("ha-monitoring-values.yaml");
    assert_eq!(find(&ha, "ServiceMonitor").len(), 1);
    assert_eq!(find(&ha, "Deployment")[0]["spec"]["replicas"], 2);
    let ha_env = &find(&ha, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"];
    for (name, value) in [
        ("GPUVAL_POD_CREATE_CONCURRENCY", "64"),
        ("GPUVAL_API_QPS", "50"),
        ("GPUVAL_API_BURST", "200"),
        ("GPUVAL_AGENT_RESULT_JITTER_SECONDS", "60"),
    ] {
        assert!(
            ha_env
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == name && v["value"] == value),
            "{name}={value} in {ha_env}"
        );
    }
    check_observability(&defaults, &with("observability-values.yaml"));
    let io = with("io-privileged-values.yaml");
    let env = &find(&io, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"];
    let get = |n: &str| {
        env.as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == n)
            .map(|v| v["value"].clone())
    };
    assert_eq!(get("GPUVAL_AGENT_PRIVILEGED"), Some(json!("true")));
    assert_eq!(
        get("GPUVAL_IO_HOST_PATH"),
        Some(json!("/var/lib/gpuval/io"))
    );
    assert_eq!(
        get("GPUVAL_AGENT_TOLERATIONS"),
        Some(json!("dedicated=gpu:NoSchedule,nvidia.com/maintenance"))
    );
    let d = &find(&defaults, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        d.as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "GPUVAL_AGENT_PRIVILEGED" && v["value"] == "false"),
        "agents are unprivileged unless an admin opts in"
    );
}

#[test]
fn helm_template_renders_offline_without_a_kube_version() {
    // As a newcomer types it, with no cluster to ask: helm assumes the Kubernetes version it
    // was built for (its release settings), which the chart's kubeVersion accepts.
    let mut cmd = chart::helm().expect("helm (tests/scripts/build-control-plane.sh)");
    cmd.args(["template", RELEASE])
        .arg(crds::repo_root().join("charts/gpuval"))
        .args(["--namespace", NS])
        .env("KUBECONFIG", "/nonexistent/kubeconfig");
    let out = chart::output(&mut cmd).unwrap_or_else(|e| panic!("helm template: {e}"));
    assert!(out.contains("kind: Deployment"), "{out}");
}

#[test]
fn bad_values_are_refused_with_a_message_naming_the_value() {
    let dir = crds::repo_root().join("tests/chart/bad");
    let files = crds::sorted_entries(&dir);
    assert!(files.len() >= 10, "{files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{}: first line must be `# expect: <message>`", f.display()));
        match chart::render(RELEASE, NS, &[f.as_path()]) {
            Ok(_) => panic!("{} was accepted", f.display()),
            Err(e) => assert!(
                e.contains(expect),
                "{}: expected {expect:?} in:\n{e}",
                f.display()
            ),
        }
    }
}

/// The `gpuval_*` metric names in `text`.
fn metric_names(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("gpuval_"))
        .map(str::to_string)
        .collect()
}

/// Dashboard and alerts are off by default; on, the dashboard is a sidecar ConfigMap holding
/// dashboard JSON, the rules carry the values, and both name only metrics the operator exports.
fn check_observability(defaults: &[Value], on: &[Value]) {
    assert!(find(defaults, "PrometheusRule").is_empty());
    assert!(
        find(defaults, "ConfigMap").is_empty(),
        "no dashboard by default"
    );
    let cm = find(on, "ConfigMap");
    assert_eq!(cm.len(), 1);
    assert_eq!(cm[0]["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm[0]["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(cm[0]["metadata"]["annotations"]["grafana_folder"], "GPU");
    let text = cm[0]["data"]["gpuval-results.json"]
        .as_str()
        .expect("dashboard JSON");
    let dash: Value = serde_json::from_str(text).expect("the dashboard is JSON");
    assert!(
        dash["panels"].as_array().is_some_and(|p| p.len() >= 10),
        "panels"
    );
    let rules = find(on, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    let rules_text = serde_json::to_string(&rules[0]["spec"]).expect("rules as JSON");
    for alert in [
        "GpuvalNodeFailed",
        "GpuvalGpuRegressed",
        "GpuvalValidationStale",
    ] {
        assert!(rules_text.contains(alert), "{alert}");
    }
    assert!(
        rules_text.contains("< 0.92") && rules_text.contains("[14d]"),
        "{rules_text}"
    );
    assert!(rules_text.contains(&(45 * 86400).to_string()) && rules_text.contains("critical"));
    let exported: Vec<String> = gpuval_operator::services::metrics::FLEET_FAMILIES
        .iter()
        .map(|(n, _)| format!("gpuval_{n}"))
        .collect();
    for name in metric_names(text)
        .into_iter()
        .chain(metric_names(&rules_text))
    {
        assert!(
            exported.contains(&name),
            "{name} is not a metric the operator exports"
        );
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

/// A result of `validation` for `node`, annotated as `annotated`'s and as written by `pod`.
fn result_body(validation: &str, node: &str, annotated: &str, pod: &BoundPod) -> Value {
    json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuNodeResult",
        "metadata": {
            "name": gpuval_crds::result::result_name(validation, node),
            "namespace": NS,
            "annotations": {"gpuval.io/node": annotated, "gpuval.io/pod": pod.name,
                            "gpuval.io/pod-uid": pod.uid},
            "labels": {"gpuval.io/node": annotated},
        },
        "spec": {"validation": validation, "generation": 1, "nodeName": node},
    })
}

async fn apply_result(client: &Client, body: &Value) -> Result<GpuNodeResult, kube::Error> {
    let api: Api<GpuNodeResult> = Api::namespaced(client.clone(), NS);
    let name = body["metadata"]["name"]
        .as_str()
        .expect("result name")
        .to_string();
    api.patch(
        &name,
        &PatchParams::apply("gpuval-agent/probe").force(),
        &Patch::Apply(body),
    )
    .await
}

fn lua_health(tools: &ChartTools, objects: &[Value]) -> Vec<Value> {
    chart::argocd_health(tools, objects).expect("run the Argo CD health check")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_and_agents_complete_a_validation_under_the_charts_own_rbac() {
    let started = std::time::Instant::now();
    let tools = ChartTools::install().expect("chart tools");
    let operator_bin = operator_binary().expect("operator binary");
    let agent_bin = agent_binary().expect("agent binary");
    let cp = ControlPlane::start_with(Options::all())
        .await
        .expect("control plane");
    let admin = cp.client().await.expect("client");
    for n in ["gpu-a", "gpu-b"] {
        nodes::create_gpu_node(&admin, n, 8, &[])
            .await
            .expect("node");
    }

    // helm install, for real: CRDs from crds/, then every template.
    let values = crds::repo_root().join("tests/chart/e2e-values.yaml");
    let notes = chart::install(RELEASE, NS, &values, cp.kubeconfig())
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    assert!(
        notes.contains("kubectl apply") && notes.contains("kubectl wait --for=condition=Ready"),
        "NOTES tell how to start a validation: {notes}"
    );
    wait_crd(&admin, "gpuvalidations.gpuval.io").await;
    wait_crd(&admin, "gpunoderesults.gpuval.io").await;
    for n in ["gpu-a", "gpu-b"] {
        nodes::wait_node_ready(&admin, n, Duration::from_secs(60))
            .await
            .expect("node ready");
    }

    // The operator as its Deployment runs it: that container's environment and the chart's
    // operator service account (a TokenRequest token, not admin).
    let mut get = chart::helm().unwrap();
    get.args([
        "get",
        "manifest",
        RELEASE,
        "--namespace",
        NS,
        "--kubeconfig",
    ])
    .arg(cp.kubeconfig());
    let installed = chart::documents(&chart::output(&mut get).unwrap()).unwrap();
    let deployment = find(&installed, "Deployment")[0];
    let pod_spec = &deployment["spec"]["template"]["spec"];
    let operator_sa = pod_spec["serviceAccountName"].as_str().unwrap();
    let pod_name = "gpuval-operator-5d4f-x7k2p";
    let mut env = chart::deployment_env(deployment, NS, pod_name).unwrap();
    let agent_sa = env
        .iter()
        .find(|(k, _)| k == "GPUVAL_AGENT_SERVICE_ACCOUNT")
        .map(|(_, v)| v.clone())
        .unwrap();
    // The one change: /metrics on a free loopback port instead of the pod's 0.0.0.0:8080.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (k, v) in env.iter_mut() {
        if k == "GPUVAL_METRICS_ADDR" {
            *v = format!("127.0.0.1:{port}");
        }
    }
    let operator_token = auth::request_token(&admin, NS, operator_sa, None)
        .await
        .expect("operator token");
    let operator_kc = cp.dir().join("operator.kubeconfig");
    std::fs::write(
        &operator_kc,
        auth::token_kubeconfig(cp.server(), &operator_token),
    )
    .unwrap();
    let args: Vec<String> = pod_spec["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    let mut operator = OperatorProcess::start(
        &operator_bin,
        &args,
        &env,
        &operator_kc,
        cp.dir().join("operator.log"),
    )
    .expect("operator process");

    // Agents run with their own pod-bound tokens of the agent service account.
    let kubelet = FakeKubelet::start_with(
        admin.clone(),
        cp.kubeconfig().to_path_buf(),
        agent_bin,
        NS.into(),
        KubeletOptions {
            pod_tokens: true,
            ..Default::default()
        },
    );

    let validations: Api<GpuValidation> = Api::all(admin.clone());
    let body = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
        "metadata": {"name": "chart"},
        "spec": {"checks": {"topology": {}, "memory": {}, "compute": {"duration": "30s"}}}});
    validations
        .patch("chart", &PatchParams::apply("e2e"), &Patch::Apply(&body))
        .await
        .expect("apply validation");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let gv = loop {
        operator.check_running().unwrap();
        let gv = validations.get("chart").await.expect("get validation");
        let done = gv.status.as_ref().is_some_and(|s| {
            s.phase.is_some_and(Phase::is_terminal)
                && s.observed_generation == gv.metadata.generation
        });
        if done {
            break gv;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "no verdict in 120s; status: {}\noperator log:\n{}\nagent logs: {:?}",
                serde_json::to_string_pretty(&gv.status).unwrap_or_default(),
                operator.logs(),
                kubelet
                    .started()
                    .iter()
                    .map(|p| kubelet.logs(p))
                    .collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let s = gv.status.as_ref().unwrap();
    assert_eq!(
        s.phase,
        Some(Phase::Passed),
        "status: {}\noperator log:\n{}",
        serde_json::to_string_pretty(s).unwrap_or_default(),
        operator.logs()
    );
    assert_eq!(s.summary.as_ref().unwrap().passed, 2);
    assert_eq!(
        kubelet.tokens_minted(),
        2,
        "each agent had its own pod token"
    );

    // The agent pods carry the chart's settings: its agent service account, the extra
    // toleration (the kwok nodes are tainted with it), and no privilege.
    let agent_pods = Api::<Pod>::namespaced(admin.clone(), NS)
        .list(&ListParams::default().labels("gpuval.io/validation=chart"))
        .await
        .unwrap()
        .items;
    assert_eq!(agent_pods.len(), 2);
    for p in &agent_pods {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some(agent_sa.as_str())
        );
        assert!(
            spec.tolerations
                .iter()
                .flatten()
                .any(|t| t.key.as_deref() == Some("kwok.x-k8s.io/node"))
        );
        let sc = spec.containers[0].security_context.as_ref().unwrap();
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("gpuval-agent:test")
        );
    }

    // The results were written by each node's agent, as that agent.
    let results: Api<GpuNodeResult> = Api::namespaced(admin.clone(), NS);
    let all = results.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 2);
    for r in &all {
        scenario::assert_written_by_agent(r, &r.spec.node_name);
    }
    // Leader election took the Lease under the chart's RBAC, named after the pod.
    let lease = Api::<Lease>::namespaced(admin.clone(), NS)
        .get("gpuval-operator")
        .await
        .expect("lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(pod_name)
    );
    // Events about the (cluster-scoped) validation were published in `default`.
    let events = Api::<Event>::namespaced(admin.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert!(
        events
            .iter()
            .any(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("chart")),
        "no event about the validation: {:?}\noperator log:\n{}",
        events.iter().map(|e| &e.reason).collect::<Vec<_>>(),
        operator.logs()
    );
    // The operator's endpoints answer.
    let metrics = http_get(port, "/metrics").await;
    assert!(metrics.contains("gpuval"), "{metrics}");
    // Under the chart's RBAC the operator reads each finished result once for its figures:
    // every node's verdict and its GPUs' memory figures reach /metrics.
    let want: Vec<String> = all
        .iter()
        .map(|r| {
            format!(
                "gpuval_node_verdict{{node=\"{}\",validation=\"chart\"",
                r.spec.node_name
            )
        })
        .collect();
    let metrics = endpoint_until(port, "/metrics", &operator, |m| {
        want.iter().all(|w| m.contains(w.as_str()))
    })
    .await;
    assert!(metrics.contains("gpuval_gpu_memory_gbps{"), "{metrics}");
    // Ready: caches filled and leading (a lease renewal that trails on a loaded machine may
    // flip it for a moment; it must come back within the lease's bounds).
    endpoint_until(port, "/readyz", &operator, |r| r.trim() == "ok").await;

    // The Argo CD health check, on the real object, says Healthy.
    let health = lua_health(&tools, &[serde_json::to_value(&gv).unwrap()]);
    assert_eq!(health[0]["status"], "Healthy", "{health:?}");

    // --- The agent's identity is confined. The operator stops (nothing acts on the probe
    // validation below); a pod of the agent service account on gpu-a (kwok runs it; it is not
    // an agent pod, so the fake kubelet leaves it alone) and its result, made and bound to it
    // as the operator makes one.
    drop(operator);
    let probe_gv = validations
        .patch(
            "probe",
            &PatchParams::apply("e2e"),
            &Patch::Apply(
                &json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
                "metadata": {"name": "probe"}, "spec": {"checks": {"memory": {}}}}),
            ),
        )
        .await
        .expect("apply the probe validation");
    let probe: Pod = serde_json::from_value(json!({
        // Named as the operator names the agent pod of validation "probe" on gpu-a.
        "metadata": {"name": gpuval_crds::result::agent_pod_name("probe", "gpu-a", 1), "namespace": NS},
        "spec": {
            "nodeName": "gpu-a",
            "serviceAccountName": agent_sa,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "probe", "image": "gpuval-agent:test"}],
        },
    }))
    .unwrap();
    let probe = Api::<Pod>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &probe)
        .await
        .expect("probe pod");
    let bound = BoundPod {
        name: probe.name_any(),
        uid: probe.uid().unwrap(),
    };
    let own = results::create_bound(&admin, NS, &probe_gv, "gpu-a", &bound)
        .await
        .expect("the probe pod's result, as the operator makes it");
    let agent_token = auth::request_token(&admin, NS, &agent_sa, Some(&bound))
        .await
        .expect("agent token");
    let agent = auth::token_client(cp.server(), &agent_token).await.unwrap();

    // Allowed: the report of the result made for its own pod.
    results::write_report(&agent, NS, &own.name_any(), "gpu-a", "Pass")
        .await
        .expect("an agent writes the report of its own pod's result");
    // Refused by RBAC: making a result (the operator makes every one).
    let m = refused(
        "create a result",
        apply_result(&agent, &result_body("probe2", "gpu-a", "gpu-a", &bound)).await,
    );
    assert!(m.contains("cannot create"), "{m}");
    // Refused by the admission policy: another node's result, and another validation's result
    // on its own node (bound to that validation's agent pod).
    let other = all.iter().find(|r| r.spec.node_name == "gpu-b").unwrap();
    let m = refused(
        "write gpu-b's result",
        results::write_report(&agent, NS, &other.name_any(), "gpu-b", "Fail").await,
    );
    assert!(m.contains("may not write the result of node gpu-b"), "{m}");
    let neighbour = all.iter().find(|r| r.spec.node_name == "gpu-a").unwrap();
    let m = refused(
        "write another validation's result",
        results::write_report(&agent, NS, &neighbour.name_any(), "gpu-a", "Fail").await,
    );
    assert!(m.contains("is bound to pod gpuval-chart-gpu-a"), "{m}");
    // Refused: claiming another pod on its own result.
    let m = refused(
        "claim another pod",
        Api::<GpuNodeResult>::namespaced(agent.clone(), NS)
            .patch(
                &own.name_any(),
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"gpuval.io/pod-uid": "another-pod-uid"}}}),
                ),
            )
            .await,
    );
    assert!(
        m.contains("may change only its report") && m.contains("gpuval.io/pod-uid"),
        "{m}"
    );
    let status_patch = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
        "status": {"verdict": "Fail", "failures": [
            {"code": "Unclassified", "severity": "Fail", "action": "None", "message": "forged"}]}});
    let m = refused(
        "overwrite gpu-b's status",
        Api::<GpuNodeResult>::namespaced(agent.clone(), NS)
            .patch_status(
                &other.name_any(),
                &PatchParams::apply("gpuval-agent/gpu-a").force(),
                &Patch::Apply(&status_patch),
            )
            .await,
    );
    assert!(m.contains("gpu-b"), "{m}");
    // Refused by RBAC: pods, the validation's spec and status, reading or deleting results.
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "x"},
        "spec": {"containers": [{"name": "x", "image": "x"}]}}))
    .unwrap();
    refused(
        "create a pod",
        Api::<Pod>::namespaced(agent.clone(), NS)
            .create(&PostParams::default(), &pod)
            .await,
    );
    let agent_gv: Api<GpuValidation> = Api::all(agent.clone());
    agent_gv
        .get("chart")
        .await
        .expect("an agent reads its validation");
    refused(
        "change the validation's spec",
        agent_gv
            .patch(
                "chart",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"checks": {"memory": {"fraction": 0.1}}}})),
            )
            .await,
    );
    refused(
        "change the validation's status",
        agent_gv
            .patch_status(
                "chart",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Passed"}})),
            )
            .await,
    );
    let agent_results: Api<GpuNodeResult> = Api::namespaced(agent.clone(), NS);
    refused(
        "list results",
        agent_results.list(&ListParams::default()).await,
    );
    refused(
        "delete a result",
        agent_results
            .delete(&other.name_any(), &DeleteParams::default())
            .await,
    );
    // No Secret is readable with the agent's token: the fabric key reaches only the pods that
    // mount it.
    refused(
        "an agent reads a secret",
        Api::<Secret>::namespaced(agent.clone(), NS)
            .get(&gpuval_operator::decide::fabric_key::secret_name("chart"))
            .await,
    );
    // A token of the agent service account that is not bound to a scheduled pod names no node.
    let unbound = auth::request_token(&admin, NS, &agent_sa, None)
        .await
        .unwrap();
    let unbound = auth::token_client(cp.server(), &unbound).await.unwrap();
    let m = refused(
        "write with an unbound token",
        results::write_report(&unbound, NS, &own.name_any(), "gpu-a", "Fail").await,
    );
    assert!(m.contains("names no node"), "{m}");

    // The operator's identity is confined too: no secrets, no pods outside its namespace.
    let op = auth::token_client(cp.server(), &operator_token)
        .await
        .unwrap();
    refused(
        "operator lists secrets",
        Api::<Secret>::namespaced(op.clone(), NS)
            .list(&ListParams::default())
            .await,
    );
    // What it may do with Secrets is what a fabric key needs: create, read back, delete.
    let op_secrets = Api::<Secret>::namespaced(op.clone(), NS);
    let key: Secret = serde_json::from_value(json!({
        "metadata": {"name": gpuval_operator::decide::fabric_key::secret_name("probe")},
        "data": {"key": "a2V5"},
    }))
    .unwrap();
    op_secrets
        .create(&PostParams::default(), &key)
        .await
        .expect("the operator creates a fabric key Secret");
    op_secrets
        .get(&key.name_any())
        .await
        .expect("and reads it back by name");
    op_secrets
        .delete(&key.name_any(), &DeleteParams::default())
        .await
        .expect("and deletes it");
    refused(
        "operator reads a secret outside its namespace",
        Api::<Secret>::namespaced(op.clone(), "default")
            .get("any")
            .await,
    );
    refused(
        "operator creates a pod in default",
        Api::<Pod>::namespaced(op, "default")
            .create(&PostParams::default(), &pod)
            .await,
    );
    // helm uninstall removes what the templates made and keeps the CRDs (and so the
    // validations and results), as the README says.
    chart::uninstall(RELEASE, NS, cp.kubeconfig(), &[])
        .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), NS);
    assert!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    assert!(
        roles
            .list(&ListParams::default().labels("app.kubernetes.io/part-of=gpuval"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let crd_api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    assert!(
        crd_api
            .get_opt("gpuvalidations.gpuval.io")
            .await
            .unwrap()
            .is_some()
    );
    assert!(validations.get_opt("chart").await.unwrap().is_some());
    println!(
        "chart e2e: install, verdict, confinement and uninstall in {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

/// GETs `path` from the operator until its body satisfies `ok` (within 30s) and returns that
/// body; fails with the body then and the operator's log when it does not.
async fn endpoint_until(
    port: u16,
    path: &str,
    operator: &OperatorProcess,
    ok: impl Fn(&str) -> bool,
) -> String {
    let ok = &ok;
    let got = waits::until(path, Duration::from_secs(30), move || async move {
        let body = http_get(port, path).await;
        ok(&body).then_some(body)
    })
    .await;
    match got {
        Ok(body) => body,
        Err(e) => panic!(
            "{e}: {}\noperator log:\n{}",
            http_get(port, path).await,
            operator.logs()
        ),
    }
}

/// GET http://127.0.0.1:<port><path> with a plain HTTP/1.1 request (the operator's endpoints).
async fn http_get(port: u16, path: &str) -> String {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
            .expect("connect to the operator's metrics port");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .expect("send the request");
        let mut buf = String::new();
        s.read_to_string(&mut buf).expect("read the answer");
        buf.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or(buf)
    })
    .await
    .expect("join")
}

/// The chart's admission policy on NCCL variables, on a real API server: a validation (or a
/// schedule's template) naming a variable outside the allowlist is refused with its name, an
/// allowed one is accepted, and the administrator's additions in Helm values are honoured. The
/// chart's default list is the API crate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nccl_environment_is_limited_to_what_the_administrator_allows() {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::create_namespace(&client, NS).await;
    crds::install_crds(&client).await.expect("CRDs");
    let values = cp.dir().join("nccl-values.yaml");
    std::fs::write(
        &values,
        "agent:\n  fabric:\n    ncclEnvAllowed: [NCCL_LL128_BUFFSIZE]\n",
    )
    .unwrap();
    let rendered = chart::render(RELEASE, NS, &[values.as_path()]).expect("render");
    let docs = chart::documents(&rendered).unwrap();
    let policy: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-nccl-env"))
        })
        .collect();
    assert_eq!(policy.len(), 2, "the policy and its binding");
    let allowed_expr = policy[0]["spec"]["variables"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "allowed"))
        .and_then(|v| v["expression"].as_str())
        .expect("the allowed variable");
    let allowed: Vec<String> = serde_json::from_str(allowed_expr).expect("a JSON list");
    let mut want: Vec<String> = gpuval_crds::nccl_env::DEFAULT_ALLOWED
        .iter()
        .map(|s| s.to_string())
        .collect();
    want.push("NCCL_LL128_BUFFSIZE".into());
    assert_eq!(allowed, want, "the chart's default list is the API crate's");
    let manifest = cp.dir().join("nccl-policy.yaml");
    let text: String = policy
        .iter()
        .map(|d| format!("---\n{}\n", serde_json::to_string(d).unwrap()))
        .collect();
    std::fs::write(&manifest, text).unwrap();
    chart::output(cp.kubectl().unwrap().args(["apply", "-f"]).arg(&manifest))
        .expect("apply the policy");

    let api: Api<GpuValidation> = Api::all(client.clone());
    let body = |name: &str, var: &str| {
        json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
            "metadata": {"name": name},
            "spec": {"checks": {"memory": {}},
                     "fabric": {"tcp": {}, "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
                                        {"name": var, "value": "x"}]}}})
    };
    // The policy takes effect once the API server has loaded it: retry until it refuses.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let refusal = loop {
        // Only the policy refuses: a refusal without its words is the CRD's, a bug here.
        let created = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(body("plugin", "NCCL_NET_PLUGIN")).unwrap(),
            )
            .await;
        match created {
            Err(e) => break e.to_string(),
            Ok(_) => {
                api.delete("plugin", &DeleteParams::default())
                    .await
                    .unwrap();
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the NCCL policy never refused NCCL_NET_PLUGIN"
                );
                // The API server loads policies in the background: ask again shortly.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(
        refusal.contains("spec.fabric.env: NCCL_NET_PLUGIN may not be set"),
        "{refusal}"
    );
    for refused in [
        "NCCL_DEBUG_FILE",
        "NCCL_TUNER_PLUGIN",
        "NCCL_DEBUG",
        "NCCL_IB_EXTRA",
    ] {
        let e = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(body("x", refused)).unwrap(),
            )
            .await
            .expect_err(refused);
        assert!(e.to_string().contains(refused), "{refused}: {e}");
    }
    for accepted in ["NCCL_IB_HCA", "NCCL_LL128_BUFFSIZE"] {
        let name = accepted.to_lowercase().replace('_', "-");
        api.create(
            &PostParams::default(),
            &serde_json::from_value(body(&name, accepted)).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("{accepted} is allowed: {e}"));
    }
    // A schedule's template is held to the same list.
    let schedules: Api<gpuval_crds::GpuValidationSchedule> = Api::all(client.clone());
    let schedule = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidationSchedule",
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "template": body("t", "NCCL_NET_PLUGIN")["spec"].clone()}});
    let e = schedules
        .create(
            &PostParams::default(),
            &serde_json::from_value(schedule).unwrap(),
        )
        .await
        .expect_err("a schedule with a plugin");
    assert!(e.to_string().contains("NCCL_NET_PLUGIN"), "{e}");
}
