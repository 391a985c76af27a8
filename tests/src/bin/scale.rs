//! Scale benchmark for the operator (not a test): N fake GPU nodes, one validation over all of
//! them, the real operator binary as a separate process, and a fast fake agent that writes each
//! node's result as soon as its pod is bound. Measures apply → all pods created, last result →
//! Passed, the operator's peak RSS and CPU time, and the validation object's stored size.
//!
//!   cargo build --release -p gpuval-operator -p gpuval-tests
//!   target/release/scale --nodes 1000 --operator target/release/gpuval-operator --out bench/results/scale
//!
//! Uses etcd, kube-apiserver and kube-scheduler from tests/scripts/build-control-plane.sh.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
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
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        nodes: 1000,
        operator: PathBuf::from("target/release/gpuval-operator"),
        out: PathBuf::from("bench/results/scale"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        match k.as_str() {
            "--nodes" => a.nodes = v.parse().map_err(|e| format!("--nodes: {e}"))?,
            "--operator" => a.operator = v.into(),
            "--out" => a.out = v.into(),
            _ => {
                return Err(format!(
                    "unknown flag {k}: use --nodes N --operator PATH --out DIR"
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

/// Writes the node's result the way the agent does (SSA object + SSA status).
async fn write_result(
    client: kube::Client,
    gv: &GpuValidation,
    node: &str,
) -> Result<(), kube::Error> {
    let name = gv.name_any();
    let rname = result_name(&name, node);
    let api: Api<GpuNodeResult> = Api::namespaced(client, NS);
    let generation = gv.metadata.generation.unwrap_or(0);
    let obj = json!({
        "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
        "metadata": {
            "name": rname, "namespace": NS,
            "labels": {labels::VALIDATION: name, labels::NODE: node, labels::GENERATION: generation.to_string(),
                       labels::VERDICT: "Pass", "app.kubernetes.io/managed-by": "gpuval-operator"},
            "annotations": {labels::NODE: node, labels::SUMMARY: ""},
            "ownerReferences": [{"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation", "name": name,
                                  "uid": gv.metadata.uid.clone().unwrap_or_default()}],
        },
        "spec": {"validation": name, "generation": generation, "nodeName": node},
    });
    let pp = PatchParams::apply(&format!("gpuval-agent/{node}")).force();
    api.patch(&rname, &pp, &Patch::Apply(&obj)).await?;
    let status = json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult", "status": fake_report(node)});
    api.patch_status(&rname, &pp, &Patch::Apply(&status))
        .await?;
    Ok(())
}

fn proc_stat(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm_kb = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
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
    (hwm_kb, ticks / 100.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    let a = args()?;
    let e = |s: &str| {
        let s = s.to_string();
        move |err: kube::Error| format!("{s}: {err}")
    };
    let cp = ControlPlane::start_with(Options {
        scheduler: true,
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

    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let mut op = Command::new(&a.operator)
        .env("KUBECONFIG", cp.kubeconfig())
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
    let pid = op.id();

    // Fake agents: as soon as a pod is bound, write its node's result and finish the pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let gvs: Api<GpuValidation> = Api::all(client.clone());
    let seen_pods = Arc::new(Mutex::new(HashSet::<String>::new()));
    let done_results = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let all_created = Arc::new(Mutex::new(None::<Instant>));
    let total = a.nodes;
    let agent = {
        let (pods, gvs, client) = (pods.clone(), gvs.clone(), client.clone());
        let (seen, done, created) = (seen_pods.clone(), done_results.clone(), all_created.clone());
        tokio::spawn(async move {
            watcher(pods.clone(), watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .for_each_concurrent(32, |p| {
                    let (pods, gvs, client, seen, done, created) = (
                        pods.clone(),
                        gvs.clone(),
                        client.clone(),
                        seen.clone(),
                        done.clone(),
                        created.clone(),
                    );
                    async move {
                        let Ok(p) = p else { return };
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
                        match write_result(client, &gv, &node).await {
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

    let applied = Instant::now();
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
        let deadline = tokio::time::sleep(Duration::from_secs(600));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return Err("no verdict within 10 minutes".into()),
                ev = stream.next() => match ev {
                    Some(Ok(v)) if v.status.as_ref().and_then(|s| s.phase).is_some_and(|p| p.is_terminal()) => break (Instant::now(), v),
                    Some(_) => {}
                    None => return Err("watch ended".into()),
                }
            }
        }
    };
    let (passed, final_gv) = passed_at;
    let (rss_kb, cpu_s) = proc_stat(pid);
    let _ = op.kill();
    let _ = op.wait();
    agent.abort();

    let created = all_created.lock().await.ok_or("not every pod was seen")?;
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
        "apply_to_all_pods_created_s": (created - applied).as_secs_f64(),
        "apply_to_last_result_s": (last_result - applied).as_secs_f64(),
        "last_result_to_verdict_s": passed.saturating_duration_since(last_result).as_secs_f64(),
        "operator_peak_rss_mb": rss_kb as f64 / 1024.0,
        "operator_cpu_seconds": cpu_s,
        "validation_object_bytes": raw.len(),
        "kube_apiserver": "v1.36.3",
        "machine": format!("{} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)),
    });
    std::fs::create_dir_all(&a.out).map_err(|e| e.to_string())?;
    let file = a.out.join(format!("scale-{}.json", a.nodes));
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
