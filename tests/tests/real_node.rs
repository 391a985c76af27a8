//! The chart end to end on a real node: the images CI builds from the Dockerfile
//! (`tests/scripts/build-images.sh`, `make images`) run as containers under a real kubelet and
//! containerd (`gpuval_tests::real_node`), installed with `helm install`.
//!
//! It proves what the process-based end-to-end tests cannot: the operator image starts and
//! passes its probes under the chart's security context (non-root, read-only root filesystem,
//! no capabilities); the agent image runs in its pod with the downward API and the projected
//! service-account token, writes its result through the admission policy that only a pod-bound
//! token passes, its nccl sweep and training step run in child processes with their run
//! directories under the container's temporary directory (the chart's root filesystem is
//! read-only), and its I/O check writes into the administrator's host directory as UID 65532;
//! a killed agent container gives the node Error with the reason; `helm uninstall` leaves no
//! pod and no container. The many fault cases stay in the faster process-based tests.
//!
//! Skipped where the host cannot run containers; CI (`CI=true`) and
//! `GPUVAL_REQUIRE_REAL_NODE=1` make that a failure.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuval_crds::{GpuNodeResult, GpuValidation, NodeVerdict, Phase};
use gpuval_tests::chart;
use gpuval_tests::crds;
use gpuval_tests::real_node::{ProcessFacts, RealNode, RealNodeOptions, process_facts};
use gpuval_tests::scenario::{self, terminal};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
const RELEASE: &str = "gpuval";
const GPUS: u32 = 2;
/// The chart's test-only value: simulated seconds pass 20 times faster, so the quick
/// example's 1-minute burn takes 3 s and the fault run's 1-hour burn 3 minutes (time enough to
/// kill its agent).
const SIMULATE: &str = "gpus=2,model=H100,timescale=0.05";
/// The image's user (the Dockerfile's `USER 65532:65532`).
const NONROOT: u32 = 65532;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_in_containers_on_a_real_kubelet() {
    let Some(node) = RealNode::start_or_skip(RealNodeOptions { gpus: GPUS }).await else {
        return;
    };
    let client = node.client().await.expect("client");
    let io_dir = admin_io_dir(&node);
    agent_image_finds_its_libraries(&node);
    let mut clock = Instant::now();
    let mut lap = |what: &str| {
        println!("{what}: {:.1}s", clock.elapsed().as_secs_f64());
        clock = Instant::now();
    };
    helm_install(&node, &io_dir);
    lap("helm install");
    operator_ready_and_locked_down(&node, &client).await;
    lap("operator Deployment Ready, its container locked down");
    quick_validation_passes(&node, &client, &io_dir).await;
    lap(
        "quick example Passed (agent container, simulated, nccl and training in children, I/O as 65532)",
    );
    killed_agent_gives_error(&node, &client).await;
    lap("killed agent container: node Error with the reason");
    uninstall_leaves_nothing_running(&node, &client).await;
    lap("helm uninstall: no pod, no container");
}

/// The libraries the agent loads by name (cudarc: cuBLAS, cuBLASLt, NVRTC and the builtins NVRTC
/// loads; the nccl check: `libnccl.so`, the image's link to `libnccl.so.2`).
const AGENT_LIBRARIES: [&str; 5] = [
    "libcublas.so.13",
    "libcublasLt.so.13",
    "libnvrtc.so.13",
    "libnvrtc-builtins.so.13.0",
    "libnccl.so",
];

/// In a container of the agent image, with the image's own environment: each library the agent
/// loads is on its LD_LIBRARY_PATH, and everything it needs resolves inside the image.
fn agent_image_finds_its_libraries(node: &RealNode) {
    let script = format!(
        r#"for lib in {}; do
  path=""
  for d in $(echo "$LD_LIBRARY_PATH" | tr : ' '); do
    if [ -e "$d/$lib" ]; then path="$d/$lib"; break; fi
  done
  if [ -z "$path" ]; then echo "MISSING $lib (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"; continue; fi
  unresolved=$(/lib64/ld-linux-x86-64.so.2 --list "$path" | grep 'not found' | tr -s ' 	
' ' ')
  echo "FOUND $lib $(readlink -f "$path") $unresolved"
done"#,
        AGENT_LIBRARIES.join(" ")
    );
    let out = node
        .run_image(
            &node.images().agent,
            "agent-libraries",
            &["/bin/bash", "-c", &script],
        )
        .unwrap_or_else(|e| panic!("run the agent image: {e}"));
    for lib in AGENT_LIBRARIES {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(lib))
            .unwrap_or_else(|| panic!("{lib} not checked: {out}"));
        assert!(line.starts_with("FOUND "), "{line}");
        assert!(
            !line.contains("not found"),
            "{lib} needs what the image lacks: {line}"
        );
    }
    println!("the agent image loads {}", AGENT_LIBRARIES.join(", "));
}

/// The administrator's I/O directory: owned by the agent's user, mode 0700, so only that user
/// can write there (the container has no capability that would bypass it).
fn admin_io_dir(node: &RealNode) -> PathBuf {
    let dir = node.scratch_dir("io").join("gpuval");
    std::fs::create_dir_all(&dir).expect("create the I/O directory");
    std::os::unix::fs::chown(&dir, Some(NONROOT), Some(NONROOT)).expect("chown");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    dir
}

fn helm_install(node: &RealNode, io_dir: &Path) {
    let images = node.images();
    let values = json!({
        "operator": {
            "image": {"repository": images.operator.repository(), "tag": images.operator.tag(), "pullPolicy": "Never"},
            "logFormat": "text",
        },
        "agent": {
            "image": {"repository": images.agent.repository(), "tag": images.agent.tag(), "pullPolicy": "Never"},
            "simulate": SIMULATE,
            "allowSimulated": true,
            "io": {
                "hostPath": io_dir.display().to_string(),
                "allowedPaths": [io_dir.parent().expect("parent").display().to_string()],
            },
        },
    });
    let file = node.scratch_dir("values.json");
    std::fs::write(&file, values.to_string()).expect("write values");
    let notes = chart::install(RELEASE, NS, &file, node.control_plane().kubeconfig())
        .unwrap_or_else(|e| panic!("helm install: {e}"));
    assert!(
        notes.contains("SIMULATED"),
        "the notes warn that agents are simulated: {notes}"
    );
    for image in [&images.operator, &images.agent] {
        println!(
            "image {}: {} ({:.1} MB as an archive)",
            image.reference,
            image.size,
            image.archive_bytes as f64 / 1e6
        );
    }
}

/// Waits up to `secs` for `name` to satisfy `cond`; on a timeout, fails with the node's logs.
async fn wait<K>(
    node: &RealNode,
    api: Api<K>,
    name: &str,
    secs: u64,
    what: &str,
    cond: impl Condition<K>,
) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let done = await_condition(api, name, cond);
    match tokio::time::timeout(Duration::from_secs(secs), done).await {
        Ok(Ok(Some(obj))) => obj,
        Ok(Ok(None)) => panic!("{name} is gone while waiting for {what}"),
        Ok(Err(e)) => panic!("watch {name}: {e}"),
        Err(_) => panic!("{name}: not {what} within {secs}s\n{}", node.logs()),
    }
}

/// The pod's first container's containerd id (`containerd://<id>` in its status).
fn container_id(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("containerd://"))
        .unwrap_or_else(|| {
            panic!(
                "{} has no containerd container: {:?}",
                pod.name_any(),
                pod.status
            )
        })
        .to_string()
}

/// What the pod's container process runs as, read from /proc on the node.
fn container_process(node: &RealNode, pod: &Pod) -> ProcessFacts {
    let id = container_id(pod);
    let tasks = node.ctr().tasks().expect("ctr tasks ls");
    let task = tasks
        .iter()
        .find(|t| t.id == id)
        .unwrap_or_else(|| panic!("no containerd task {id} for {}: {tasks:?}", pod.name_any()));
    assert_eq!(task.status, "RUNNING", "{task:?}");
    process_facts(task.pid).expect("read the container's process")
}

fn assert_locked_down(what: &str, p: &ProcessFacts) {
    assert_eq!(p.uids, [NONROOT; 4], "{what} runs as {NONROOT}: {p:?}");
    assert_eq!(
        p.gids, [NONROOT; 4],
        "{what} runs as group {NONROOT}: {p:?}"
    );
    assert_eq!(p.cap_eff, 0, "{what} has no capabilities: {p:?}");
    assert!(p.no_new_privs, "{what} cannot gain privileges: {p:?}");
    assert!(
        p.root_read_only,
        "{what} has a read-only root filesystem: {p:?}"
    );
}

async fn operator_ready_and_locked_down(node: &RealNode, client: &Client) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let name = format!("{RELEASE}-operator");
    wait(
        node,
        deployments,
        &name,
        240,
        "Ready",
        |d: Option<&Deployment>| {
            d.and_then(|d| d.status.as_ref())
                .is_some_and(|s| s.ready_replicas == Some(1) && s.available_replicas == Some(1))
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
        .await
        .expect("list operator pods");
    assert_eq!(list.items.len(), 1, "one operator pod");
    let pod = &list.items[0];
    // Ready through its readiness probe, which the kubelet ran against the container.
    let status = &pod
        .status
        .as_ref()
        .expect("status")
        .container_statuses
        .as_ref()
        .expect("containers")[0];
    assert!(status.ready, "{status:?}");
    let spec = &pod.spec.as_ref().expect("spec").containers[0];
    assert!(
        spec.readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .is_some()
    );
    assert_eq!(
        spec.image.as_deref(),
        Some(node.images().operator.reference.as_str())
    );
    assert_locked_down("the operator", &container_process(node, pod));
}

/// deploy/examples/quick.yaml as an administrator would apply it, with the I/O check added
/// (small files) and a name of our choosing.
fn quick_example(name: &str, compute: &str) -> Value {
    let path = crds::repo_root().join("deploy/examples/quick.yaml");
    let mut docs = crds::read_yaml_documents(&path).expect("quick.yaml");
    assert_eq!(docs.len(), 1, "{}", path.display());
    let mut gv = docs.remove(0);
    assert_eq!(gv["kind"], "GpuValidation");
    gv["metadata"]["name"] = json!(name);
    gv["spec"]["checks"]["compute"]["duration"] = json!(compute);
    gv["spec"]["checks"]["io"] = json!({"fileSizeMib": 8, "files": 2, "concurrency": 2});
    gv
}

fn kubectl_apply(node: &RealNode, name: &str, object: &Value) {
    let file = node.scratch_dir(&format!("{name}.json"));
    std::fs::write(&file, object.to_string()).expect("write the manifest");
    let mut apply = node.control_plane().kubectl().expect("kubectl");
    apply.arg("apply").arg("-f").arg(&file);
    chart::output(&mut apply).unwrap_or_else(|e| panic!("kubectl apply {name}: {e}"));
}

/// The quick example with the nccl and training checks added, small: each runs in a child
/// process of the agent, whose run directory (the NCCL library link, NCCL's log) lies under the
/// container's temporary directory, on the chart's read-only root filesystem unless the pod
/// gives it a writable one.
fn quick_with_children() -> Value {
    let mut gv = quick_example("quick", "1m");
    gv["spec"]["checks"]["nccl"] = json!({
        "maxBytes": 1 << 20, "iterations": 2, "warmupIterations": 1, "timeout": "30s"
    });
    gv["spec"]["checks"]["training"] = json!({
        "hiddenSize": 256, "layers": 2, "steps": 4, "warmupSteps": 1, "checksumEvery": 2,
        "timeout": "30s"
    });
    gv
}

/// The nccl and training checks passed, and in child processes: the sweep reached NCCL through
/// the link in its run directory, and the transport came from the log file its process wrote
/// there; the training step's note is its process's.
fn assert_children_ran(report: &Value) {
    let nccl = &report["nccl"];
    assert_eq!(nccl["verdict"], "Pass", "the nccl check passed: {nccl}");
    assert!(
        nccl["library"]
            .as_str()
            .is_some_and(|l| l.contains("simulated") && l.ends_with("linked as libnccl.so")),
        "the sweep process loaded NCCL through its run directory's link: {nccl}"
    );
    assert_eq!(
        nccl["sweep"]["transport"]["kinds"],
        json!(["P2P/CUMEM"]),
        "the transport, read from NCCL's log in the run directory: {nccl}"
    );
    let training = &report["training"];
    assert_eq!(
        training["verdict"], "Pass",
        "the training check passed: {training}"
    );
    assert!(
        training["notes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|x| x
                .as_str()
                .is_some_and(|x| x.contains("the agent's training process")))),
        "the step ran in the training process: {training}"
    );
}

async fn quick_validation_passes(node: &RealNode, client: &Client, io_dir: &Path) {
    kubectl_apply(node, "quick", &quick_with_children());
    let validations: Api<GpuValidation> = Api::all(client.clone());
    let gv = wait(node, validations, "quick", 300, "finished", terminal).await;
    let status = gv.status.expect("status");
    assert_eq!(
        status.phase,
        Some(Phase::Passed),
        "{status:?}\n{}",
        node.container_logs("gpuval-quick")
    );
    let results: Api<GpuNodeResult> = Api::namespaced(client.clone(), NS);
    let list = results
        .list(&ListParams::default().labels("gpuval.io/validation=quick"))
        .await
        .expect("list results");
    assert_eq!(list.items.len(), 1, "one result, the node's");
    let result = &list.items[0];
    assert_eq!(result.spec.node_name, node.name());
    let report = serde_json::to_value(result.status.as_ref().expect("report")).expect("JSON");
    assert_eq!(
        report["simulated"], true,
        "the simulated backend says so: {report}"
    );
    assert_children_ran(&report);
    let io = &report["io"];
    assert_eq!(io["verdict"], "Pass", "the I/O check passed: {io}");
    assert!(
        io["bytes"].as_i64().is_some_and(|b| b >= 2 * (8 << 20)),
        "{io}"
    );
    // Written by the agent with its own token: the admission policy lets only a pod-bound
    // token of a pod on this node write this node's result, as field manager gpuval-agent/<node>.
    scenario::assert_written_by_agent(result, node.name());
    // Only UID 65532 could write into the 0700 directory; the check removed its files.
    assert_eq!(
        std::fs::read_dir(io_dir)
            .expect("read the I/O directory")
            .count(),
        0,
        "the I/O check cleaned up after itself"
    );
    certificate_names_the_image_by_digest(node, client).await;
}

/// The node's certificate names the agent image as containerd ran it: the pod status's
/// `imageID`, a digest, beside the image as configured.
async fn certificate_names_the_image_by_digest(node: &RealNode, client: &Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = pods
        .list(&ListParams::default().labels("gpuval.io/validation=quick"))
        .await
        .expect("list the agent pods")
        .items
        .into_iter()
        .next()
        .expect("the quick run's pod");
    let ran = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .map(|c| c.image_id)
        .expect("a container status");
    assert!(ran.contains("sha256:"), "containerd's imageID: {ran}");
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), NS);
    let selector = format!(
        "gpuval.io/certificate=node,gpuval.io/validation=quick,gpuval.io/node={}",
        node.name()
    );
    let cm = gpuval_tests::waits::until(
        "the node's certificate",
        Duration::from_secs(60),
        || async {
            maps.list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let text = cm
        .data
        .and_then(|d| d.get("certificate.json").cloned())
        .expect("certificate.json");
    let signed: Value = serde_json::from_str(&text).expect("a certificate");
    let software = &signed["document"]["software"];
    assert_eq!(software["imageId"], ran.as_str(), "{software}");
    assert!(software["image"].is_string(), "{software}");
}

async fn killed_agent_gives_error(node: &RealNode, client: &Client) {
    let mut fault = quick_example("fault", "1h");
    fault["spec"]["deadline"] = json!("2h");
    kubectl_apply(node, "fault", &fault);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod_name = gpuval_crds::result::agent_pod_name("fault", node.name(), 1);
    let pod = wait(
        node,
        pods,
        &pod_name,
        240,
        "running its agent",
        |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        },
    )
    .await;
    let agent = container_process(node, &pod);
    assert_locked_down("the agent", &agent);
    let spec = pod.spec.as_ref().expect("spec");
    assert!(
        spec.volumes
            .iter()
            .flatten()
            .any(|v| v.projected.as_ref().is_some_and(|p| p
                .sources
                .iter()
                .flatten()
                .any(|s| s.service_account_token.is_some()))),
        "the agent gets a projected service-account token"
    );
    node.ctr()
        .kill(&container_id(&pod), "SIGKILL")
        .expect("kill the agent");

    let validations: Api<GpuValidation> = Api::all(client.clone());
    let gv = wait(node, validations, "fault", 180, "finished", terminal).await;
    let status = gv.status.expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:?}");
    let ours = status
        .nodes
        .iter()
        .find(|n| n.name == node.name())
        .unwrap_or_else(|| panic!("{} in {status:?}", node.name()));
    assert_eq!(ours.verdict, NodeVerdict::Error, "{ours:?}");
    let message = ours.message.as_deref().unwrap_or("");
    assert!(
        message.contains("agent pod failed") && message.contains("exit code 137"),
        "the reason names the kill: {ours:?}"
    );
}

async fn uninstall_leaves_nothing_running(node: &RealNode, client: &Client) {
    let mut delete = node.control_plane().kubectl().expect("kubectl");
    delete.args([
        "delete",
        "gpuvalidations",
        "--all",
        "--wait",
        "--timeout=120s",
    ]);
    chart::output(&mut delete).unwrap_or_else(|e| panic!("delete the validations: {e}"));
    let kubeconfig = node.control_plane().kubeconfig();
    chart::uninstall(RELEASE, NS, kubeconfig, &["--timeout=180s"])
        .unwrap_or_else(|e| panic!("helm uninstall: {e}"));

    let pods: Api<Pod> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let left: Vec<String> = pods
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .iter()
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        let containers = node.ctr().containers().expect("ctr containers ls");
        let tasks = node.ctr().tasks().expect("ctr tasks ls");
        if left.is_empty() && containers.is_empty() && tasks.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after helm uninstall, still: pods {left:?}, containers {containers:?}, tasks {tasks:?}\n{}",
            node.logs()
        );
        // The kubelet removes the containers of deleted pods in its garbage collection (every
        // minute); nothing announces it, so look again shortly.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
