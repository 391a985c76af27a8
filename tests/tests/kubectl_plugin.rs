//! `kubectl gpuval` against a real control plane: two validations of one kwok GPU node (the
//! second with a planted memory fault on GPU5) run to their verdicts by the operator and the
//! simulated agent; then the plugin binary, with the admin kubeconfig, prints the status tree,
//! writes the HTML, Markdown and JSON reports, and diffs the two runs. It also measures what
//! one node's result costs in etcd (its JSON, as the API server returns and stores it).

use std::process::{Command, Output};
use std::time::Duration;

use gpuval_crds::{GpuNodeResult, GpuValidation, Phase};
use gpuval_tests::binaries::{run_plugin as plugin, workspace_binary};
use gpuval_tests::kubelet::{FakeKubelet, agent_binary};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::{ControlPlane, Options, crds, nodes};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

const NS: &str = "gpuval-system";
const SIM: &str = "gpus=8,model=H200,timescale=0.002";

async fn run_to_verdict(client: &kube::Client, name: &str) -> GpuValidation {
    let api: Api<GpuValidation> = Api::all(client.clone());
    let body = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
        "metadata": {"name": name},
        "spec": {"checks": {"memory": {}, "compute": {"duration": "30s"}, "p2p": {}}}});
    api.patch(name, &PatchParams::apply("test"), &Patch::Apply(&body))
        .await
        .expect("apply");
    let done = |g: Option<&GpuValidation>| {
        g.and_then(|g| g.status.as_ref())
            .and_then(|s| s.phase)
            .is_some_and(Phase::is_terminal)
    };
    tokio::time::timeout(Duration::from_secs(120), await_condition(api, name, done))
        .await
        .unwrap_or_else(|_| panic!("{name} reached no verdict in 120s"))
        .expect("watch")
        .expect("validation")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_shows_status_reports_and_the_diff_of_two_runs() {
    let cp = ControlPlane::start_with(Options::all())
        .await
        .expect("control plane");
    let client = cp.client().await.expect("client");
    crds::install_crds(&client).await.expect("CRDs");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    nodes::create_gpu_node(&client, "gpu-a", 8, &[])
        .await
        .expect("node");
    nodes::wait_node_ready(&client, "gpu-a", Duration::from_secs(60))
        .await
        .expect("ready");
    let kubelet = FakeKubelet::start(
        client.clone(),
        cp.kubeconfig().to_path_buf(),
        agent_binary().expect("agent binary"),
        NS.into(),
    );
    let _op = OperatorHandle::start(client.clone(), test_config(NS, SIM));
    let before = run_to_verdict(&client, "before").await;
    assert_eq!(before.status.and_then(|s| s.phase), Some(Phase::Passed));
    kubelet.set_node_env("gpu-a", "GPUVAL_SIMULATE", &format!("{SIM},fail=memory@5"));
    let after = run_to_verdict(&client, "after").await;
    assert_eq!(after.status.and_then(|s| s.phase), Some(Phase::Failed));
    let kc = cp.kubeconfig();

    let status = plugin(kc, &["status", "after"]);
    let tree = stdout(&status);
    assert_eq!(status.status.code(), Some(1), "the run failed: {tree}");
    assert!(
        tree.starts_with("after  Failed  (1 nodes selected, 1 reports)  SIMULATED\n"),
        "{tree}"
    );
    assert!(
        tree.contains("└─ gpu-a  Fail  8 GPUs  [ReplaceHardware] GPU5 memory"),
        "the recommended action leads the node's first failure: {tree}"
    );
    assert!(!tree.contains("\n   fabric"), "{tree}");
    let gpu5 = tree
        .lines()
        .find(|l| l.contains("─ GPU5 "))
        .expect("GPU5's line");
    assert!(gpu5.contains("Fail  GPU5 memory: "), "{gpu5}");
    assert_eq!(plugin(kc, &["status", "before"]).status.code(), Some(0));
    let all = stdout(&plugin(kc, &["status"]));
    assert!(
        all.contains("before  Passed") && all.contains("after  Failed"),
        "{all}"
    );

    let dir = tempfile::tempdir().expect("tmp");
    let html = dir.path().join("after.html");
    let path = html.to_string_lossy().into_owned();
    assert!(
        plugin(kc, &["report", "after", "-o", "html", "-f", &path])
            .status
            .success()
    );
    let page = std::fs::read_to_string(&html).expect("page");
    assert!(page.contains("id=\"simulated\"") && page.contains("id=\"p2p-uni-gpu-a\""));
    let md = stdout(&plugin(kc, &["report", "after", "-o", "markdown"]));
    assert!(md.contains("| gpu-a | Fail | 8 |"), "{md}");
    // -o is a format, as kubectl's is; a file's extension names its format.
    let file_as_format = plugin(kc, &["report", "after", "-o", "report.html"]);
    assert_eq!(file_as_format.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&file_as_format.stderr).contains("-f report.html"),
        "{}",
        String::from_utf8_lossy(&file_as_format.stderr)
    );
    let md_file = dir.path().join("after.md");
    let md_path = md_file.to_string_lossy().into_owned();
    assert!(
        plugin(kc, &["report", "after", "-f", &md_path])
            .status
            .success()
    );
    let written = std::fs::read_to_string(&md_file).expect("markdown file");
    assert!(written.contains("| gpu-a | Fail | 8 |"), "{written}");
    let contradicted = plugin(kc, &["report", "after", "-o", "json", "-f", &md_path]);
    assert_eq!(contradicted.status.code(), Some(2));
    let doc: gpuval_view::Document =
        serde_json::from_str(&stdout(&plugin(kc, &["report", "before", "-o", "json"])))
            .expect("JSON document");
    assert_eq!(doc.nodes.len(), 1);
    assert_eq!(
        doc.nodes[0].result.as_deref(),
        Some(gpuval_crds::result::result_name("before", "gpu-a").as_str())
    );

    let diff = plugin(kc, &["diff", "before", "after"]);
    let text = stdout(&diff);
    assert_eq!(diff.status.code(), Some(1), "a worse verdict: {text}");
    assert!(
        text.contains("gpu-a GPU5: verdict Pass -> Fail (worse)"),
        "{text}"
    );
    let counts = text.lines().next().unwrap_or_default();
    assert!(
        counts.contains("verdict(s) worse") && !counts.contains(" 0 verdict(s) worse"),
        "the counts agree with the exit code: {counts}"
    );
    let every = stdout(&plugin(kc, &["diff", "before", "after", "--all"]));
    assert!(
        every.contains("GPU0->GPU1 p2p unidirectional GB/s"),
        "{every}"
    );
    assert!(
        text.lines().count() < every.lines().count() && !every.contains("-0.0%"),
        "only changes by default:\n{text}\n--all:\n{every}"
    );
    let same = plugin(kc, &["diff", "before", "before"]);
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));

    let missing = plugin(kc, &["report", "nope"]);
    assert_eq!(missing.status.code(), Some(3), "not found: its own code");
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "Error from server (NotFound): gpuvalidations.gpuval.io \"nope\" not found\n"
    );
    assert_eq!(
        plugin(kc, &["report", "after", "-o", "json", "--exit-code"])
            .status
            .code(),
        Some(1)
    );
    closed_pipe_is_quiet(kc);
    like_kubectl(&cp, &client, kc).await;

    // What a node's result costs in etcd: the object as stored (managed fields included).
    let r = Api::<GpuNodeResult>::namespaced(client.clone(), NS)
        .get(&gpuval_crds::result::result_name("after", "gpu-a"))
        .await
        .expect("result");
    let whole = serde_json::to_vec(&r).expect("json").len();
    let mut bare = r.clone();
    bare.metadata.managed_fields = None;
    let without = serde_json::to_vec(&bare).expect("json").len();
    println!(
        "result of an 8-GPU node (memory, compute, p2p): {whole} bytes as stored, {without} without managedFields"
    );
    assert!(
        whole < 256 * 1024,
        "a result stays far below etcd's object limit: {whole}"
    );
}

/// `kubectl gpuval status | head -1`: the reader goes away before the plugin writes, and the
/// plugin ends quietly (no panic about a broken pipe).
fn closed_pipe_is_quiet(kc: &std::path::Path) {
    let bin = workspace_binary("kubectl-gpuval", "kubectl-gpuval").expect("plugin binary");
    let mut child = Command::new(bin)
        .args(["status", "before"])
        .env("KUBECONFIG", kc)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl-gpuval");
    drop(child.stdout.take());
    let done = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(
        err.is_empty() && done.status.code() == Some(0),
        "{:?}: {err}",
        done.status
    );
}

/// `wait` returns at once on a verdict, `rerun` starts a new run of the same spec on the named
/// node, `kubectl get -o wide` names the first failed node and results show their action.
async fn like_kubectl(cp: &ControlPlane, client: &kube::Client, kc: &std::path::Path) {
    let waited = plugin(kc, &["wait", "after", "--timeout", "30"]);
    assert_eq!(waited.status.code(), Some(1), "{}", stdout(&waited));
    // A run that failed says why, from its Ready condition, whole.
    let line = stdout(&waited);
    assert!(
        line.starts_with("gpuvalidation.gpuval.io/after Failed: ") && line.contains("gpu-a"),
        "{line}"
    );
    assert_eq!(
        plugin(kc, &["wait", "before", "--timeout", "5m"])
            .status
            .code(),
        Some(0),
        "--timeout takes a duration, as kubectl's does"
    );
    // A name that does not exist is said at once, as kubectl says it, not waited on.
    let started = std::time::Instant::now();
    let nosuch = plugin(kc, &["wait", "nosuch", "--timeout", "10m"]);
    assert_eq!(
        nosuch.status.code(),
        Some(3),
        "not found has its own code, apart from a failed run (1)"
    );
    assert_eq!(
        String::from_utf8_lossy(&nosuch.stderr),
        "Error from server (NotFound): gpuvalidations.gpuval.io \"nosuch\" not found\n"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let rerun = plugin(kc, &["rerun", "after", "--node", "gpu-a"]);
    let said = stdout(&rerun);
    assert!(rerun.status.success(), "{said}");
    let name = said
        .split_whitespace()
        .next()
        .and_then(|w| w.strip_prefix("gpuvalidation.gpuval.io/"))
        .expect("the new name")
        .to_string();
    let api: Api<GpuValidation> = Api::all(client.clone());
    let new = api.get(&name).await.expect("the rerun");
    assert_eq!(
        new.spec.node_names,
        vec![gpuval_crds::spec::NodeName("gpu-a".into())]
    );
    let slow = plugin(kc, &["wait", &name, "--timeout", "0"]);
    assert_eq!(slow.status.code(), Some(4), "a timeout has its own code");
    assert!(String::from_utf8_lossy(&slow.stderr).contains("timed out"));
    let again = plugin(kc, &["wait", &name, "--timeout", "120"]);
    assert_eq!(again.status.code(), Some(1), "the fault is still there");

    let wide = cp
        .kubectl()
        .expect("kubectl")
        .args(["get", "gpuvalidation", "after", "-o", "wide"])
        .output()
        .expect("kubectl get");
    let table = String::from_utf8_lossy(&wide.stdout);
    assert!(
        table.contains("FIRST-NODE") && table.contains("FABRIC") && table.contains("gpu-a"),
        "{table}"
    );
    // MESSAGE is the Ready condition's, whole: it names the failed node.
    let message = cp
        .kubectl()
        .expect("kubectl")
        .args([
            "get",
            "gpuvalidation",
            "after",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].message}",
        ])
        .output()
        .expect("kubectl get");
    let message = String::from_utf8_lossy(&message.stdout).into_owned();
    assert!(
        !message.is_empty() && table.contains(&message),
        "{message:?} in {table}"
    );
    let results = cp
        .kubectl()
        .expect("kubectl")
        .args(["-n", NS, "get", "gpunoderesults"])
        .output()
        .expect("kubectl get");
    let table = String::from_utf8_lossy(&results.stdout);
    assert!(
        table.contains("ACTION") && table.contains("ReplaceHardware"),
        "{table}"
    );
}
