//! Scale benchmark for the operator (not a test): N fake GPU nodes, one validation over all of
//! them, the real operator binary as a separate process, and a fast fake agent that writes each
//! node's result as soon as its pod is bound. Measures apply → all pods created, last result →
//! Passed, the operator's CPU time and memory (resident with empty caches, in a first operator
//! started before any node exists; at the verdict; once it has read every node's figures for
//! its metrics; and at its peak; and so its memory per node), its heap in use (counted by its
//! allocator, `gpuval_operator_heap_bytes`: what it keeps, without what the C allocator holds
//! back) at the same points, and the stored size of the
//! validation and of one result.
//!
//! With `--report FILE` every result carries that report (the simulator's, e.g. an 8-GPU H200
//! run of `gpuval-agent run --simulate`: it must say `"simulated": true`), with the node's name
//! set; without it, a small made-up report of 8 GPUs.
//!
//!   cargo build --release -p gpuval-operator -p gpuval-tests
//!   target/release/scale --nodes 1000 --operator target/release/gpuval-operator --report sim.json --out bench/results/scale
//!
//! With `--churn R` the validation's own Nodes are written R times a second between the apply
//! and the verdict (round robin, an annotation: what kubelets, GPU feature discovery and other
//! controllers do to Nodes), and with `--burst R` unrelated Nodes and Pods (20 CPU nodes, 20
//! pods in namespace `apps`) R times a second in bursts of 5 s every 10 s (issue 55). The
//! operator runs as its own service account and the API server keeps an audit log, so its
//! writes are counted from the API server's side; the output names the time to the first agent
//! pod and to the verdict, and the operator's writes per Node event.
//!
//! Uses etcd, kube-apiserver and kube-scheduler from tests/scripts/build-control-plane.sh.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use gpuval_crds::{
    GpuNodeResult, GpuReport, GpuValidation, NodeReport, Verdict, labels, result::result_name,
};
use gpuval_tests::{ControlPlane, Options, crds};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, ResourceExt};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::Mutex;

const NS: &str = "gpuval-system";

struct Args {
    nodes: usize,
    operator: PathBuf,
    out: PathBuf,
    report: Option<PathBuf>,
    /// Writes a second on the validation's own Nodes during the run.
    churn: f64,
    /// Writes a second on unrelated Nodes and Pods, in bursts.
    burst: f64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        nodes: 1000,
        operator: PathBuf::from("target/release/gpuval-operator"),
        out: PathBuf::from("bench/results/scale"),
        report: None,
        churn: 0.0,
        burst: 0.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        match k.as_str() {
            "--nodes" => a.nodes = v.parse().map_err(|e| format!("--nodes: {e}"))?,
            "--operator" => a.operator = v.into(),
            "--out" => a.out = v.into(),
            "--report" => a.report = Some(v.into()),
            "--churn" => a.churn = v.parse().map_err(|e| format!("--churn: {e}"))?,
            "--burst" => a.burst = v.parse().map_err(|e| format!("--burst: {e}"))?,
            _ => {
                return Err(format!(
                    "unknown flag {k}: use --nodes N --operator PATH --out DIR [--report FILE] [--churn R] [--burst R]"
                ));
            }
        }
    }
    Ok(a)
}

fn node_json(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"}},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake"}],
        }
    })
}

/// The report every result carries: `template` (a simulator's report) with the node's name,
/// or a small made-up one.
fn report_for(template: Option<&serde_json::Value>, node: &str) -> serde_json::Value {
    match template {
        Some(t) => {
            let mut r = t.clone();
            r["node"] = json!(node);
            r
        }
        None => serde_json::to_value(fake_report(node)).unwrap_or_default(),
    }
}

/// Reads the report at `path`: a simulator's (it must say so) whose verdict is Pass.
fn read_report(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the report {}: {e}", path.display()))?;
    let r: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the report {} is not JSON: {e}", path.display()))?;
    if r["simulated"] != json!(true) {
        return Err(format!(
            "{}: only a simulator's report (\"simulated\": true) may stand in for the fake agents'",
            path.display()
        ));
    }
    if r["verdict"] != json!("Pass") {
        return Err(format!(
            "{}: the report's verdict is {}; the bench needs a passing one",
            path.display(),
            r["verdict"]
        ));
    }
    Ok(r)
}

fn fake_report(node: &str) -> NodeReport {
    NodeReport {
        simulated: true,
        backend: "simulated".into(),
        agent_version: "scale-bench".into(),
        node: Some(node.into()),
        started_at: "2026-11-21T00:00:00Z".into(),
        finished_at: "2026-11-21T00:05:00Z".into(),
        verdict: Verdict::Pass,
        gpus: (0..8)
            .map(|i| GpuReport {
                index: i,
                uuid: format!("GPU-sim-{node}-{i}"),
                name: "NVIDIA H200 (simulated)".into(),
                memory_total_mib: 143_771,
                verdict: Verdict::Pass,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Writes the node's result as the operator binds it and the agent reports (SSA object + SSA
/// status, as admin: the scale test stands in for both).
async fn write_result(
    client: kube::Client,
    gv: &GpuValidation,
    node: &str,
    pod: &Pod,
    report: serde_json::Value,
) -> Result<(), kube::Error> {
    let name = gv.name_any();
    let rname = result_name(&name, node);
    let api: Api<GpuNodeResult> = Api::namespaced(client, NS);
    let generation = gv.metadata.generation.unwrap_or(0);
    // The labels and annotations the agent puts beside its report: the operator counts a result
    // only once they agree with the stored report (gpuval_crds::binding::check_report).
    let meta = report_meta(&report);
    let mut result_labels = serde_json::Map::new();
    for (k, v) in meta.labels() {
        result_labels.insert(k, json!(v));
    }
    for (k, v) in [
        (labels::VALIDATION, name.clone()),
        (labels::NODE, node.to_string()),
        (labels::GENERATION, generation.to_string()),
        (
            "app.kubernetes.io/managed-by",
            "gpuval-operator".to_string(),
        ),
    ] {
        result_labels.insert(k.to_string(), json!(v));
    }
    let mut annotations = serde_json::Map::new();
    for (k, v) in meta.annotations() {
        annotations.insert(k, json!(v));
    }
    // The binding, as the operator writes it (it may have created the result already): the
    // operator counts only a result bound to its run and current pod.
    for (k, v) in [
        (labels::NODE, node.to_string()),
        (labels::POD, pod.name_any()),
        (
            labels::POD_UID,
            pod.metadata.uid.clone().unwrap_or_default(),
        ),
        (
            labels::VALIDATION_UID,
            gv.metadata.uid.clone().unwrap_or_default(),
        ),
    ] {
        annotations.insert(k.to_string(), json!(v));
    }
    let obj = json!({
        "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
        "metadata": {
            "name": rname, "namespace": NS,
            "labels": result_labels,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation", "name": name,
                                  "uid": gv.metadata.uid.clone().unwrap_or_default()}],
        },
        "spec": {"validation": name, "generation": generation, "nodeName": node},
    });
    let pp = PatchParams::apply(&format!("gpuval-agent/{node}")).force();
    api.patch(&rname, &pp, &Patch::Apply(&obj)).await?;
    let status =
        json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult", "status": report});
    api.patch_status(&rname, &pp, &Patch::Apply(&status))
        .await?;
    Ok(())
}

/// What the agent writes beside `report` on its result (the verdict, action and simulated labels,
/// the codes): the report's own, as `gpuval-agent` derives them.
fn report_meta(report: &serde_json::Value) -> gpuval_crds::result_meta::ReportMeta {
    let parsed: Option<NodeReport> = serde_json::from_value(report.clone()).ok();
    gpuval_crds::result_meta::ReportMeta {
        verdict: parsed.as_ref().map_or(Verdict::Error, |r| r.verdict),
        action: parsed.as_ref().map(|r| r.action).unwrap_or_default(),
        simulated: parsed.as_ref().is_some_and(|r| r.simulated),
        summary: String::new(),
        codes: parsed.as_ref().map(|r| r.codes()).unwrap_or_default(),
        versions: parsed.as_ref().map(|r| r.versions()).unwrap_or_default(),
    }
}

/// A process's memory and CPU so far.
#[derive(Debug, Clone, Copy)]
struct ProcStat {
    /// Resident now, KiB.
    rss_kb: u64,
    /// Resident at its peak, KiB.
    hwm_kb: u64,
    /// User and system CPU, seconds.
    cpu_s: f64,
}

fn proc_stat(pid: u32) -> ProcStat {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = fields
        .get(11)
        .and_then(|u| u.parse::<f64>().ok())
        .unwrap_or(0.0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
    ProcStat {
        rss_kb: kb("VmRSS:"),
        hwm_kb: kb("VmHWM:"),
        cpu_s: ticks / 100.0,
    }
}

/// The operator's answer to `GET path` on `port` (None: no 200 answer).
async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).await.ok()?;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    (reply.starts_with("HTTP/1.0 200") || reply.starts_with("HTTP/1.1 200")).then_some(reply)
}

/// Waits until the operator at `port` answers /readyz with 200 (its caches are filled).
async fn wait_ready(port: u16) -> Result<(), String> {
    for _ in 0..600 {
        if http_get(port, "/readyz").await.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the operator was not ready within 60 s".into())
}

/// How long the run may take to its verdict: 10 minutes, or 0.3 s a node on larger clusters
/// (the operator's write throttle creates the pods at a few a second on two cores).
fn verdict_limit(nodes: usize) -> Duration {
    Duration::from_secs_f64((nodes as f64 * 0.3).max(600.0))
}

/// Waits (at most `limit`) until the operator at `port` holds the figures of `nodes` nodes
/// (`gpuval_fleet_nodes`): it reads each finished result once, in the background, so its
/// memory is steady only then. Returns how long that took after the call, or None.
async fn wait_for_figures(port: u16, nodes: usize, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    // One series per `simulated` value: every node counted in one of them.
    let want = format!(" {nodes}.0");
    let counted = |m: &str| {
        m.lines()
            .any(|l| l.starts_with("gpuval_fleet_nodes{") && l.ends_with(&want))
    };
    while t.elapsed() < limit {
        if http_get(port, "/metrics")
            .await
            .is_some_and(|m| counted(&m))
        {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

/// The operator's heap in use (`gpuval_operator_heap_bytes` on /metrics), in KB.
async fn heap_kb(port: u16) -> Option<u64> {
    let text = http_get(port, "/metrics").await?;
    let line = text
        .lines()
        .find(|l| l.starts_with("gpuval_operator_heap_bytes"))?;
    let bytes: f64 = line.split_whitespace().last()?.parse().ok()?;
    Some((bytes / 1024.0) as u64)
}

fn mb(kb: u64) -> f64 {
    (kb as f64 / 1024.0 * 10.0).round() / 10.0
}

/// KB of operator memory per node: `kb` less the resident memory before any node, over `nodes`.
fn per_node_kb(kb: u64, empty_kb: u64, nodes: usize) -> f64 {
    let per = kb.saturating_sub(empty_kb) as f64 * 1.024 / nodes.max(1) as f64;
    (per * 10.0).round() / 10.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Starts the operator binary against `cp`; returns it and its metrics port.
fn start_operator(
    a: &Args,
    kubeconfig: &std::path::Path,
) -> Result<(std::process::Child, u16), String> {
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let op = Command::new(&a.operator)
        .env("KUBECONFIG", kubeconfig)
        .env(
            "RUST_LOG",
            std::env::var("OPERATOR_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .args([
            "--agent-image",
            "gpuval-agent:scale",
            "--log-format",
            "text",
            "--namespace",
            NS,
            "--concurrency",
            "8",
        ])
        // No controller-manager here, so the not-ready taint that admission puts on new nodes stays.
        .args([
            "--agent-toleration",
            "node.kubernetes.io/not-ready:NoSchedule",
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("start {}: {e}", a.operator.display()))?;
    Ok((op, metrics_port))
}

async fn run() -> Result<(), String> {
    let a = args()?;
    let e = |s: &str| {
        let s = s.to_string();
        move |err: kube::Error| format!("{s}: {err}")
    };
    let cp = ControlPlane::start_with(Options {
        scheduler: true,
        audit_log: true,
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let client = cp.client().await.map_err(|e| e.to_string())?;
    crds::install_crds(&client).await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))
                .map_err(|e| e.to_string())?,
        )
        .await
        .map_err(e("create namespace"))?;

    // The operator as its own service account: the audit log names its writes.
    let kubeconfig = gpuval_tests::replica::identity(&cp, &client, NS, OPERATOR_SA).await?;
    // The operator's resident memory with empty caches: a first operator, before any node.
    let (mut op, metrics_port) = start_operator(&a, &kubeconfig)?;
    wait_ready(metrics_port).await?;
    let empty = proc_stat(op.id());
    let empty_heap = heap_kb(metrics_port).await.unwrap_or(0);
    let _ = op.kill();
    let _ = op.wait();
    let template = a.report.as_deref().map(read_report).transpose()?;
    let template = Arc::new(template);

    let t = Instant::now();
    let nodes: Api<Node> = Api::all(client.clone());
    futures::stream::iter((0..a.nodes).map(|i| {
        let nodes = nodes.clone();
        async move {
            let n: Node = serde_json::from_value(node_json(&format!("gpu-{i:05}")))
                .map_err(|e| e.to_string())?;
            nodes
                .create(&PostParams::default(), &n)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<_>>()
    .await?;
    eprintln!(
        "{} nodes created in {:.1}s",
        a.nodes,
        t.elapsed().as_secs_f64()
    );

    let unrelated = unrelated_objects(&client).await?;
    let (mut op, metrics_port) = start_operator(&a, &kubeconfig)?;
    let pid = op.id();
    wait_ready(metrics_port).await?;

    // Fake agents: as soon as a pod is bound, write its node's result and finish the pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let gvs: Api<GpuValidation> = Api::all(client.clone());
    let seen_pods = Arc::new(Mutex::new(HashSet::<String>::new()));
    let done_results = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let all_created = Arc::new(Mutex::new(None::<Instant>));
    let first_pod = Arc::new(Mutex::new(None::<Instant>));
    let total = a.nodes;
    let agent = {
        let (pods, gvs, client, template) =
            (pods.clone(), gvs.clone(), client.clone(), template.clone());
        let (seen, done, created) = (seen_pods.clone(), done_results.clone(), all_created.clone());
        let first = first_pod.clone();
        tokio::spawn(async move {
            watcher(pods.clone(), watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .for_each_concurrent(32, |p| {
                    let first = first.clone();
                    let (pods, gvs, client, seen, done, created, template) = (
                        pods.clone(),
                        gvs.clone(),
                        client.clone(),
                        seen.clone(),
                        done.clone(),
                        created.clone(),
                        template.clone(),
                    );
                    async move {
                        let Ok(p) = p else { return };
                        first.lock().await.get_or_insert_with(Instant::now);
                        {
                            let mut s = seen.lock().await;
                            let first = s.insert(format!("c/{}", p.name_any()));
                            if first && s.iter().filter(|k| k.starts_with("c/")).count() == total {
                                *created.lock().await = Some(Instant::now());
                            }
                        }
                        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                            if std::env::var_os("SCALE_DEBUG").is_some() {
                                eprintln!(
                                    "pod {} not bound: {:?}",
                                    p.name_any(),
                                    p.status.as_ref().and_then(|s| s.conditions.clone())
                                );
                            }
                            return;
                        };
                        if !seen.lock().await.insert(format!("r/{}", p.name_any())) {
                            return;
                        }
                        let Some(owner) = p.owner_references().first().map(|o| o.name.clone())
                        else {
                            return;
                        };
                        let Ok(gv) = gvs.get(&owner).await else {
                            return;
                        };
                        let report = report_for(template.as_ref().as_ref(), &node);
                        match write_result(client, &gv, &node, &p, report).await {
                            Ok(()) => done.lock().await.push(Instant::now()),
                            Err(e) => eprintln!("fake agent: result for {node}: {e}"),
                        }
                        let status = json!({"status": {"phase": "Succeeded"}});
                        let _ = pods
                            .patch_status(
                                &p.name_any(),
                                &PatchParams::default(),
                                &Patch::Merge(&status),
                            )
                            .await;
                    }
                })
                .await;
        })
    };

    let before_apply = proc_stat(pid);
    let heap_before_apply = heap_kb(metrics_port).await.unwrap_or(0);
    let churn = Churn::start(&client, &a, &unrelated);
    let applied = Instant::now();
    let applied_at = k8s_openapi::jiff::Timestamp::now();
    let gv = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation", "metadata": {"name": "scale"},
                    "spec": {"checks": {"memory": {}, "compute": {"duration": "5m"}}, "deadline": "2h"}});
    gvs.patch(
        "scale",
        &PatchParams::apply("scale-bench"),
        &Patch::Apply(&gv),
    )
    .await
    .map_err(e("apply validation"))?;

    // Wait for Passed (watch the validation).
    let passed_at = {
        let mut stream = watcher(
            gvs.clone(),
            watcher::Config::default().fields("metadata.name=scale"),
        )
        .default_backoff()
        .applied_objects()
        .boxed();
        let deadline = tokio::time::sleep(verdict_limit(a.nodes));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return Err(format!("no verdict within {} s", verdict_limit(a.nodes).as_secs())),
                ev = stream.next() => match ev {
                    Some(Ok(v)) if v.status.as_ref().and_then(|s| s.phase).is_some_and(|p| p.is_terminal()) => break (Instant::now(), v),
                    Some(_) => {}
                    None => return Err("watch ended".into()),
                }
            }
        }
    };
    let (passed, final_gv) = passed_at;
    let verdict_at = k8s_openapi::jiff::Timestamp::now();
    let churned = churn.stop();
    let at_verdict = proc_stat(pid);
    let heap_at_verdict = heap_kb(metrics_port).await.unwrap_or(0);
    let figures_after = wait_for_figures(metrics_port, a.nodes, verdict_limit(a.nodes)).await;
    let end = proc_stat(pid);
    let heap_end = heap_kb(metrics_port).await.unwrap_or(0);
    let _ = op.kill();
    let _ = op.wait();
    agent.abort();

    let created = all_created.lock().await.ok_or("not every pod was seen")?;
    let first_pod = first_pod.lock().await.ok_or("no pod was seen")?;
    let audit = cp.audit_log().ok_or("no audit log")?;
    let user = format!("system:serviceaccount:{NS}:{OPERATOR_SA}");
    let mut op_writes = BTreeMap::<String, u64>::new();
    let mut op_refused = BTreeMap::<String, u64>::new();
    for w in gpuval_tests::audit::writes(&audit)? {
        if w.user == user && w.received >= applied_at && w.received <= verdict_at {
            let what = match &w.subresource {
                Some(sub) => format!("{} {}/{sub}", w.verb, w.resource),
                None => format!("{} {}", w.verb, w.resource),
            };
            if !w.succeeded() {
                *op_refused.entry(format!("{what} {}", w.code)).or_default() += 1;
            }
            *op_writes.entry(what).or_default() += 1;
        }
    }
    let op_writes_total: u64 = op_writes.values().sum();
    let last_result = done_results
        .lock()
        .await
        .iter()
        .max()
        .copied()
        .ok_or("no result written")?;
    let raw = client
        .request_text(
            http::Request::get("/apis/gpuval.io/v1alpha1/gpuvalidations/scale")
                .body(Vec::new())
                .map_err(|e| e.to_string())?,
        )
        .await
        .map_err(e("get validation"))?;
    let result_raw = client
        .request_text(
            http::Request::get(format!(
                "/apis/gpuval.io/v1alpha1/namespaces/{NS}/gpunoderesults/{}",
                result_name("scale", "gpu-00000")
            ))
            .body(Vec::new())
            .map_err(|e| e.to_string())?,
        )
        .await
        .map_err(e("get a result"))?;
    let pods_now = pods
        .list(&ListParams::default().labels("gpuval.io/validation=scale"))
        .await
        .map_err(e("list pods"))?
        .items
        .len();
    let phase = final_gv
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .map(|p| format!("{p:?}"))
        .unwrap_or_default();
    let summary = final_gv
        .status
        .as_ref()
        .and_then(|s| s.summary.clone())
        .unwrap_or_default();

    let result = json!({
        "nodes": a.nodes,
        "phase": phase,
        "passed": summary.passed,
        "failed": summary.failed,
        "pods": pods_now,
        "churn_node_writes_per_s": a.churn,
        "burst_writes_per_s": a.burst,
        "node_writes_during_run": churned.own_nodes + churned.other_nodes,
        "own_node_writes_during_run": churned.own_nodes,
        "unrelated_node_writes_during_run": churned.other_nodes,
        "unrelated_pod_writes_during_run": churned.other_pods,
        "operator_writes_apply_to_verdict": op_writes_total,
        "operator_writes_by_request": op_writes,
        "operator_writes_refused_by_request_and_code": op_refused,
        "apply_to_first_pod_s": (first_pod - applied).as_secs_f64(),
        "apply_to_verdict_s": (passed - applied).as_secs_f64(),
        "apply_to_all_pods_created_s": (created - applied).as_secs_f64(),
        "apply_to_last_result_s": (last_result - applied).as_secs_f64(),
        "last_result_to_verdict_s": passed.saturating_duration_since(last_result).as_secs_f64(),
        "operator_rss_before_nodes_mb": mb(empty.rss_kb),
        "operator_rss_before_apply_mb": mb(before_apply.rss_kb),
        "operator_rss_end_mb": mb(end.rss_kb),
        "operator_peak_rss_mb": mb(end.hwm_kb),
        "operator_kb_per_node_peak": per_node_kb(end.hwm_kb, empty.rss_kb, a.nodes),
        "operator_kb_per_node_end": per_node_kb(end.rss_kb, empty.rss_kb, a.nodes),
        "operator_rss_at_verdict_mb": mb(at_verdict.rss_kb),
        "operator_kb_per_node_at_verdict": per_node_kb(at_verdict.rss_kb, empty.rss_kb, a.nodes),
        "operator_heap_before_nodes_mb": mb(empty_heap),
        "operator_heap_end_mb": mb(heap_end),
        "operator_heap_kb_per_node_nodes_only": per_node_kb(heap_before_apply, empty_heap, a.nodes),
        "operator_heap_kb_per_node_at_verdict": per_node_kb(heap_at_verdict, empty_heap, a.nodes),
        "operator_heap_kb_per_node_end": per_node_kb(heap_end, empty_heap, a.nodes),
        "figures_of_every_node_read_s_after_verdict": figures_after.map(|d| d.as_secs_f64()),
        "operator_cpu_seconds_at_verdict": at_verdict.cpu_s,
        "operator_cpu_seconds": end.cpu_s,
        "operator_cpu_seconds_run": end.cpu_s - before_apply.cpu_s,
        "validation_object_bytes": raw.len(),
        "result_object_bytes": result_raw.len(),
        "report": a.report.as_ref().map(|p| p.display().to_string()),
        "kube_apiserver": "v1.36.3",
        "machine": format!("{} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)),
    });
    std::fs::create_dir_all(&a.out).map_err(|e| e.to_string())?;
    let kind = if a.churn > 0.0 || a.burst > 0.0 {
        "churn"
    } else {
        "quiet"
    };
    let file = match (a.churn > 0.0 || a.burst > 0.0, a.churn, a.burst) {
        (false, ..) => a.out.join(format!("scale-{}.json", a.nodes)),
        (true, c, b) => a.out.join(format!("scale-{}-{kind}-{c}-{b}.json", a.nodes)),
    };
    std::fs::write(
        &file,
        serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// The operator's service account (see `gpuval_tests::replica::identity`).
const OPERATOR_SA: &str = "gpuval-operator";
/// Unrelated objects the bursts write: CPU nodes and pods in namespace [`APPS`].
const UNRELATED: usize = 20;
const APPS: &str = "apps";

/// Nodes without GPUs and pods on them in namespace [`APPS`], none of them the operator's.
async fn unrelated_objects(client: &kube::Client) -> Result<Vec<String>, String> {
    let nodes: Api<Node> = Api::all(client.clone());
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": APPS}}))
                .map_err(|e| e.to_string())?,
        )
        .await
        .map_err(|e| format!("create namespace {APPS}: {e}"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), APPS);
    let mut names = Vec::new();
    for i in 0..UNRELATED {
        let name = format!("cpu-{i:02}");
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": {"cpu": "64", "pods": "110"}, "allocatable": {"cpu": "64", "pods": "110"}},
        }))
        .map_err(|e| e.to_string())?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .map_err(|e| format!("create {name}: {e}"))?;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("app-{i:02}")},
            "spec": {"nodeName": name, "containers": [{"name": "app", "image": "app"}]},
        }))
        .map_err(|e| e.to_string())?;
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("create pod app-{i:02}: {e}"))?;
        names.push(name);
    }
    Ok(names)
}

/// The writes the churn made.
#[derive(Debug, Default, Clone, Copy)]
struct Churned {
    own_nodes: u64,
    other_nodes: u64,
    other_pods: u64,
}

/// The writers of `--churn` and `--burst`, running until [`Churn::stop`].
struct Churn {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    counts: [Arc<AtomicU64>; 3],
}

impl Churn {
    fn start(client: &kube::Client, a: &Args, unrelated: &[String]) -> Churn {
        let counts = [0, 1, 2].map(|_| Arc::new(AtomicU64::new(0)));
        let mut tasks = Vec::new();
        let own: Vec<String> = (0..a.nodes).map(|i| format!("gpu-{i:05}")).collect();
        if a.churn > 0.0 {
            tasks.extend(writers(
                client,
                Target::Nodes(own),
                a.churn,
                false,
                &counts[0],
            ));
        }
        if a.burst > 0.0 {
            let pods = (0..unrelated.len())
                .map(|i| format!("app-{i:02}"))
                .collect();
            let half = a.burst / 2.0;
            tasks.extend(writers(
                client,
                Target::Nodes(unrelated.to_vec()),
                half,
                true,
                &counts[1],
            ));
            tasks.extend(writers(client, Target::Pods(pods), half, true, &counts[2]));
        }
        Churn { tasks, counts }
    }

    fn stop(self) -> Churned {
        self.tasks.iter().for_each(tokio::task::JoinHandle::abort);
        let n = |i: usize| self.counts[i].load(Ordering::Relaxed);
        Churned {
            own_nodes: n(0),
            other_nodes: n(1),
            other_pods: n(2),
        }
    }
}

#[derive(Clone)]
enum Target {
    Nodes(Vec<String>),
    Pods(Vec<String>),
}

/// Writers that patch an annotation of `target`'s objects in turn, `rate` times a second in
/// all (one writer per 20 a second, each waiting for its answer), only in the first 5 s of each
/// 10 s when `bursts`; each landed write counted in `count`.
fn writers(
    client: &kube::Client,
    target: Target,
    rate: f64,
    bursts: bool,
    count: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let n = (rate / 20.0).ceil().max(1.0) as usize;
    let every = Duration::from_secs_f64(n as f64 / rate);
    let start = tokio::time::Instant::now();
    (0..n)
        .map(|w| {
            let (client, target, count) = (client.clone(), target.clone(), count.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let nodes: Api<Node> = Api::all(client.clone());
                let pods: Api<Pod> = Api::namespaced(client, APPS);
                for i in (w..).step_by(n) {
                    tick.tick().await;
                    if bursts && start.elapsed().as_secs() % 10 >= 5 {
                        continue;
                    }
                    let patch = json!({"metadata": {"annotations": {"bench.gpuval.io/write": i.to_string()}}});
                    let (pp, p) = (PatchParams::default(), Patch::Merge(&patch));
                    let landed = match &target {
                        Target::Nodes(names) => nodes.patch(&names[i % names.len()], &pp, &p).await.is_ok(),
                        Target::Pods(names) => pods.patch(&names[i % names.len()], &pp, &p).await.is_ok(),
                    };
                    if landed {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect()
}
