//! `make demo`: the whole flow on this machine, no GPU needed. A local control plane (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, kwok; built from source), the gpuval
//! CRDs, three fake GPU nodes with 8 GPUs each and one whose 8 GPUs a fake DRA driver publishes
//! (claimed through Dynamic Resource Allocation), the operator, and the real agent binary run for
//! each agent pod by a fake kubelet with the SIMULATED GPU backend (one node is given a bad GPU).
//! Applies deploy/examples/quick.yaml, shows the run's progress until its verdict, prints what
//! `kubectl` shows, then the bad node's `GpuValidated` condition flipping from False to True once
//! it is repaired and proven (the demo alone lets simulated results mark its fake nodes), ends
//! with the next commands to try (the kubectl plugin, the HTML report) and where the operator's
//! and the agents' logs are, and keeps the cluster up until Ctrl-C (`--exit` to stop at once).
//! Everything it writes (the kubeconfig, the logs) sits in one temporary directory, removed when
//! it stops, Ctrl-C at any point included. `make demo` builds the agent, the plugin and this
//! binary before anything starts (GPUVAL_AGENT_BIN and GPUVAL_PLUGIN_DIR name them), so nothing
//! compiles mid-run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuval_crds::GpuValidation;
use gpuval_crds::conditions::{self, RECONCILING};
use gpuval_tests::kubelet::{FakeKubelet, agent_binary};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::{ControlPlane, Options, crds, dra, nodes};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;

const NS: &str = "gpuval-system";
/// The simulated GPUs of every node.
const HEALTHY: &str = "gpus=8,model=H200,timescale=0.01";
/// The node with the planted fault.
const BAD_NODE: &str = "gpu-node-c";
/// The nodes' GpuValidated condition, as `kubectl get nodes` shows it (docs/node-signals.md).
const SIGNAL_COLUMNS: &str = "custom-columns=NODE:.metadata.name,GPU-VALIDATED:.status.conditions[?(@.type==\"GpuValidated\")].status,REASON:.status.conditions[?(@.type==\"GpuValidated\")].reason,SINCE:.status.conditions[?(@.type==\"GpuValidated\")].lastTransitionTime,RUN:.metadata.labels.gpuval\\.io/verdict-run";

#[tokio::main]
async fn main() -> ExitCode {
    let dir = match tempfile::Builder::new().prefix("gpuval-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: could not create the demo's directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = log_to(&dir.path().join(OPERATOR_LOG)) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    // Ctrl-C at any point drops the run: the cluster's processes stop and `dir` goes.
    let outcome = tokio::select! {
        r = run(dir.path()) => r,
        _ = tokio::signal::ctrl_c() => {
            println!("stopping (Ctrl-C); removing {}", dir.path().display());
            Ok(())
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The operator's log, in the demo's directory.
const OPERATOR_LOG: &str = "gpuval-operator.log";

/// Sends the operator's (in-process) tracing to `path`.
fn log_to(path: &Path) -> Result<(), String> {
    let file = std::fs::File::create(path)
        .map_err(|e| format!("could not create {}: {e}", path.display()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn,kube_client=off".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Mutex::new(file))
        .with_ansi(false)
        .try_init()
        .map_err(|e| format!("could not set up the operator's log: {e}"))
}

fn kubectl(cp: &ControlPlane, args: &[&str]) -> Result<String, String> {
    let out = cp
        .kubectl()
        .map_err(|e| e.to_string())?
        .args(args)
        .output()
        .map_err(|e| format!("run kubectl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn run(dir: &Path) -> Result<(), String> {
    let exit_at_once = std::env::args().any(|a| a == "--exit");
    println!(
        "starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) ..."
    );
    let cp = ControlPlane::start_with(Options::all())
        .await
        .map_err(|e| e.to_string())?;
    let client = cp.client().await.map_err(|e| e.to_string())?;
    let names = crds::install_crds(&client).await?;
    println!("installed CRDs: {}", names.join(", "));
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NS}}))
        .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map_err(|e| format!("create namespace: {e}"))?;
    for n in ["gpu-node-a", "gpu-node-b", "gpu-node-c"] {
        nodes::create_gpu_node(&client, n, 8, &[("nvidia.com/gpu.present", "true")])
            .await
            .map_err(|e| format!("create node {n}: {e}"))?;
        nodes::wait_node_ready(&client, n, Duration::from_secs(60)).await?;
    }
    println!("3 fake GPU nodes (kwok) with 8 GPUs each are Ready");
    // A fourth node without nvidia.com/gpu whose 8 GPUs a fake DRA driver publishes: its agent
    // claims them through Dynamic Resource Allocation (docs/dra.md).
    let dra_node = "gpu-node-dra";
    dra::publish_class(&client)
        .await
        .map_err(|e| format!("create the DeviceClass: {e}"))?;
    nodes::create_gpu_node(&client, dra_node, 0, &[("nvidia.com/gpu.present", "true")])
        .await
        .map_err(|e| format!("create node {dra_node}: {e}"))?;
    let uuids: Vec<String> = (0..8).map(dra::sim_uuid).collect();
    dra::publish_gpus(&client, dra_node, &uuids)
        .await
        .map_err(|e| format!("publish the GPUs of {dra_node}: {e}"))?;
    nodes::wait_node_ready(&client, dra_node, Duration::from_secs(60)).await?;
    println!(
        "{dra_node} is Ready: its 8 GPUs are claimed through DRA (ResourceSlices of gpu.nvidia.com)"
    );

    let agent = agent_binary()?;
    let kubelet = FakeKubelet::start(
        client.clone(),
        cp.kubeconfig().to_path_buf(),
        agent,
        NS.into(),
    );
    kubelet.set_node_env(
        "gpu-node-c",
        "GPUVAL_SIMULATE",
        &format!("{HEALTHY},fail=memory@6"),
    );
    let mut cfg = test_config(NS, HEALTHY);
    // Demo only (no flag or Helm value sets it): the simulated results mark these fake kwok
    // nodes, so that the GpuValidated condition can be seen. An installed operator never lets a
    // simulated result label, condition, taint or admit a node.
    cfg.simulated_acts_on_nodes = true;
    let _operator = OperatorHandle::start(client.clone(), cfg);
    println!(
        "operator started; agents use the SIMULATED backend (gpu-node-c has a planted memory fault on GPU6)"
    );
    println!(
        "demo only: the simulated results mark these fake nodes (GpuValidated condition, labels) so that you can see them; an installed operator never lets a simulated result mark a node\n"
    );

    let example = crds::repo_root().join("deploy/examples/quick.yaml");
    let api: Api<GpuValidation> = Api::all(client.clone());
    for doc in crds::read_yaml_documents(&example)? {
        let name = doc["metadata"]["name"]
            .as_str()
            .ok_or("example without a name")?
            .to_string();
        println!("$ kubectl apply -f {}", example.display());
        run_to_verdict(&client, &doc).await?;
        println!(
            "\n$ kubectl get gpuvalidations\n{}",
            kubectl(&cp, &["get", "gpuvalidations"])?
        );
        println!(
            "$ kubectl get gpunoderesults -n {NS}\n{}",
            kubectl(&cp, &["get", "gpunoderesults", "-n", NS])?
        );
        let gv = api
            .get(&name)
            .await
            .map_err(|e| format!("get {name}: {e}"))?;
        println!("conditions of {name}:");
        for c in gv.status.iter().flat_map(|s| s.conditions.iter()) {
            println!("  {}={} ({}): {}", c.type_, c.status, c.reason, c.message);
        }
        let status = gv.status.unwrap_or_default();
        println!("why nodes did not pass (status.summary.reasons):");
        for r in status.summary.iter().flat_map(|s| s.reasons.iter()) {
            println!("  {} node(s): {}", r.count, r.reason);
        }
        println!("nodes that did not pass (status.nodes; passing ones are only counted):");
        for n in &status.nodes {
            let why = n.message.as_deref().unwrap_or("");
            println!("  {} {}: {why}", n.name, n.verdict);
        }
    }
    show_node_signals(&cp, &client, &kubelet, &example).await?;
    let plugin_dir = match std::env::var_os("GPUVAL_PLUGIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => gpuval_tests::binaries::workspace_binary("kubectl-gpuval", "kubectl-gpuval")?
            .parent()
            .map(Path::to_path_buf)
            .ok_or("the plugin binary has no directory")?,
    };
    show_fabric(&cp, &client, &kubelet, &plugin_dir).await?;
    let kc = dir.join("kubeconfig");
    std::fs::copy(cp.kubeconfig(), &kc).map_err(|e| format!("copy kubeconfig: {e}"))?;
    let kubectl = cp.tool("kubectl").map_err(|e| e.to_string())?;
    print!("{}", next_steps(&kc, &kubectl, &plugin_dir, !exit_at_once));
    print!(
        "{}",
        logs(
            &dir.join(OPERATOR_LOG),
            kubelet.log_dir(),
            &kubelet.started()
        )
    );
    print!(
        "{}",
        other_examples(&crds::repo_root().join("deploy/examples"))
    );
    if exit_at_once {
        return Ok(());
    }
    std::future::pending::<()>().await;
    Ok(())
}

/// What each shipped example does in this cluster (its `# make demo:` line).
fn other_examples(dir: &Path) -> String {
    let mut s = String::from("The examples (kubectl apply -f FILE) in this cluster:\n");
    for path in crds::sorted_entries(dir) {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if let Some(said) = text.lines().find_map(|l| l.strip_prefix("# make demo: ")) {
            let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
            s.push_str(&format!("  {:<18} {said}\n", file.unwrap_or_default()));
        }
    }
    s
}

/// Where the logs are: the agents run as processes of the fake kubelet (a kwok node serves no
/// `kubectl logs`), one file per pod.
fn logs(operator: &Path, agents: Option<&Path>, pods: &[String]) -> String {
    let mut s = format!(
        "Logs (removed when the demo stops):\n  operator: {}\n",
        operator.display()
    );
    match agents {
        Some(dir) => {
            s.push_str(&format!(
                "  agents:   {}/<pod>-<uid>.log ({} pod(s) so far; kwok nodes serve no `kubectl logs`)\n",
                dir.display(),
                pods.len()
            ));
        }
        None => s.push_str("  agents:   not kept (no log directory could be made)\n"),
    }
    s
}

/// The bad node's `GpuValidated` condition flipping: False after the quick run, then True once
/// the node is "repaired" (its fault taken away) and `quick` runs again on it. Only a pass of
/// the same validation (or a schedule's) at no less depth clears a failure
/// (docs/operations.md), so the proof is `quick` itself, its spec narrowed to that node.
async fn show_node_signals(
    cp: &ControlPlane,
    client: &kube::Client,
    kubelet: &FakeKubelet,
    example: &Path,
) -> Result<(), String> {
    let columns = ["get", "nodes", "-o", SIGNAL_COLUMNS];
    condition_is(client, BAD_NODE, "False").await?;
    println!(
        "\n$ kubectl get nodes -o {SIGNAL_COLUMNS}\n{}",
        kubectl(cp, &columns)?
    );
    println!(
        "{BAD_NODE} is repaired (its planted fault removed); quick runs again on it, the same checks (a shallower or another validation's pass would not clear the failure):"
    );
    kubelet.set_node_env(BAD_NODE, "GPUVAL_SIMULATE", HEALTHY);
    let api: Api<GpuValidation> = Api::all(client.clone());
    for mut doc in crds::read_yaml_documents(example)? {
        let name = doc["metadata"]["name"]
            .as_str()
            .ok_or("example without a name")?
            .to_string();
        doc["spec"]["nodeNames"] = serde_json::json!([BAD_NODE]);
        println!(
            "$ kubectl patch gpuvalidation {name} --type merge -p '{{\"spec\":{{\"nodeNames\":[\"{BAD_NODE}\"]}}}}'"
        );
        api.patch(
            &name,
            &PatchParams::apply("gpuval-demo"),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|e| format!("run {name} again on {BAD_NODE}: {e}"))?;
    }
    condition_is(client, BAD_NODE, "True").await?;
    println!(
        "$ kubectl get nodes -o {SIGNAL_COLUMNS}\n{}",
        kubectl(cp, &columns)?
    );
    println!(
        "GpuValidated flipped to True (its SINCE moved); a controller that owns taints, such as the Node Readiness Controller, reads it: docs/node-signals.md"
    );
    Ok(())
}

/// The node the fabric step adds, whose simulated fabric is planted slow for the second run.
const SLOW_NIC_NODE: &str = "gpu-node-d";
/// The fabric runs' nodes (gpu-node-c's GPU fault would keep it out of the fabric).
const FABRIC_NODES: [&str; 3] = ["gpu-node-a", "gpu-node-b", SLOW_NIC_NODE];

/// The fabric runs' spec: each node's memory, then one NCCL all-reduce across the nodes and a
/// TCP pair per node (the TCP floor fits loopback on a busy laptop; the demo has no RDMA).
fn fabric_spec() -> serde_json::Value {
    serde_json::json!({
        "nodeNames": FABRIC_NODES,
        "checks": {"memory": {"fraction": 0.1}},
        "fabric": {"nccl": {"minBusBandwidthGbps": 350},
                   "tcp": {"streams": 2, "duration": "1s", "minGbps": 1},
                   "roundTimeout": "60s"},
    })
}

/// Validation `name` with [`fabric_spec`].
fn fabric_run(name: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
        "metadata": {"name": name}, "spec": fabric_spec()})
}

/// Two fabric validations over [`FABRIC_NODES`]: `fabric-pass` on healthy nodes, then
/// `fabric-fault` after a slow NIC is planted on [`SLOW_NIC_NODE`] (simulated NCCL bus
/// bandwidth 40 GB/s against a 350 floor): the fabric test splits the group until it names
/// that node. Shown as `kubectl get gpuval -o wide` and `kubectl gpuval status` show them; with
/// `GPUVAL_DEMO_REPORTS=DIR` their HTML reports are written there too (the demo's test reads
/// them in a browser).
async fn show_fabric(
    cp: &ControlPlane,
    client: &kube::Client,
    kubelet: &FakeKubelet,
    plugin_dir: &Path,
) -> Result<(), String> {
    nodes::create_gpu_node(
        client,
        SLOW_NIC_NODE,
        8,
        &[("nvidia.com/gpu.present", "true")],
    )
    .await
    .map_err(|e| format!("create node {SLOW_NIC_NODE}: {e}"))?;
    nodes::wait_node_ready(client, SLOW_NIC_NODE, Duration::from_secs(60)).await?;
    println!(
        "
The fabric between nodes: {SLOW_NIC_NODE} joins; a validation over {} with a fabric test (NCCL across the nodes, a TCP pair per node):",
        FABRIC_NODES.join(", ")
    );
    println!(
        "$ kubectl apply -f - <<EOF  # fabric-pass\n{}\nEOF",
        fabric_spec()
    );
    run_to_verdict(client, &fabric_run("fabric-pass")).await?;
    kubelet.set_node_env(
        SLOW_NIC_NODE,
        "GPUVAL_SIMULATE",
        &format!("{HEALTHY},net=40"),
    );
    println!(
        "{SLOW_NIC_NODE}'s NIC is planted slow (simulated NCCL bus bandwidth 40 GB/s, the floor 350); the same spec again as fabric-fault:"
    );
    run_to_verdict(client, &fabric_run("fabric-fault")).await?;
    println!(
        "\n$ kubectl get gpuval -o wide\n{}",
        kubectl(cp, &["get", "gpuval", "-o", "wide"])?
    );
    println!(
        "$ kubectl gpuval status fabric-fault\n{}",
        plugin(cp, plugin_dir, &["status", "fabric-fault"])?
    );
    if let Some(reports) = std::env::var_os("GPUVAL_DEMO_REPORTS") {
        let reports = PathBuf::from(reports);
        for name in ["fabric-pass", "fabric-fault"] {
            let file = reports.join(format!("{name}.html"));
            let path = file.to_string_lossy().into_owned();
            plugin(cp, plugin_dir, &["report", name, "-o", "html", "-f", &path])?;
            println!("wrote {path}");
        }
    }
    Ok(())
}

/// Applies validation document `doc` (named in its metadata) and prints its progress until it
/// ends.
async fn run_to_verdict(client: &kube::Client, doc: &serde_json::Value) -> Result<(), String> {
    let name = doc["metadata"]["name"]
        .as_str()
        .ok_or("a validation without a name")?;
    let api: Api<GpuValidation> = Api::all(client.clone());
    api.patch(name, &PatchParams::apply("gpuval-demo"), &Patch::Apply(doc))
        .await
        .map_err(|e| format!("apply {name}: {e}"))?;
    let last = Arc::new(Mutex::new(String::new()));
    let done = await_condition(api, name, move |g: Option<&GpuValidation>| {
        let status = g.and_then(|g| g.status.as_ref());
        if let Some(line) = status.and_then(progress) {
            let mut shown = last.lock().unwrap_or_else(|e| e.into_inner());
            if *shown != line {
                println!("  {line}");
                *shown = line;
            }
        }
        status
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_terminal())
    });
    tokio::time::timeout(Duration::from_secs(300), done)
        .await
        .map_err(|_| format!("{name}: no verdict within 5 minutes"))?
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// `kubectl gpuval ARGS` with the plugin's directory first on PATH; its output (a failed
/// run's status exits 1 and is still shown).
fn plugin(cp: &ControlPlane, plugin_dir: &Path, args: &[&str]) -> Result<String, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![plugin_dir.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let path = std::env::join_paths(dirs).map_err(|e| e.to_string())?;
    let out = cp
        .kubectl()
        .map_err(|e| e.to_string())?
        .env("PATH", path)
        .arg("gpuval")
        .args(args)
        .output()
        .map_err(|e| format!("run kubectl gpuval: {e}"))?;
    match out.status.code() {
        Some(0 | 1) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        _ => Err(format!(
            "kubectl gpuval {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

async fn condition_is(client: &kube::Client, name: &str, status: &str) -> Result<(), String> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let want = status.to_string();
    let flipped = await_condition(
        nodes,
        name,
        move |n: Option<&k8s_openapi::api::core::v1::Node>| {
            n.and_then(|n| n.status.as_ref()?.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "GpuValidated" && c.status == want)
        },
    );
    tokio::time::timeout(Duration::from_secs(120), flipped)
        .await
        .map_err(|_| format!("{name}: GpuValidated not {status} within 2 minutes"))?
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The run's progress in one line (the Reconciling condition's message while it runs, the phase
/// once it is over), for printing each time it changes.
fn progress(status: &gpuval_crds::GpuValidationStatus) -> Option<String> {
    let phase = status.phase?;
    if phase.is_terminal() {
        return Some(format!("{phase}"));
    }
    let c = conditions::find(&status.conditions, RECONCILING)?;
    Some(format!("{phase}: {}", c.message))
}

/// What to try next, with this cluster's kubeconfig, its kubectl and the kubectl plugin's
/// directory (put on PATH so that `kubectl gpuval` finds it).
fn next_steps(kubeconfig: &Path, kubectl: &Path, plugin_dir: &Path, stays_up: bool) -> String {
    let kubectl_dir = kubectl.parent().unwrap_or(Path::new("."));
    let mut s = String::from("\nNext, in another shell:\n");
    s.push_str(&format!(
        "  export KUBECONFIG={} PATH={}:{}:$PATH\n",
        kubeconfig.display(),
        plugin_dir.display(),
        kubectl_dir.display()
    ));
    for (command, what) in [
        (
            "kubectl gpuval status quick",
            "the tree of nodes and GPUs, worst first",
        ),
        (
            "kubectl gpuval report quick -o html -f /tmp/quick.html",
            "one self-contained page (open it in a browser)",
        ),
        (
            "kubectl get gpuval -o wide",
            "the first node that did not pass",
        ),
        (
            "kubectl gpuval rerun quick --node gpu-node-c",
            "quick's spec again on that node, as a new validation",
        ),
        (
            "kubectl gpuval wait quick-xxxxx",
            "0 Passed, 1 Failed, 3 no such run, 4 timed out (the name rerun printed)",
        ),
        (
            "kubectl gpuval diff quick quick-xxxxx",
            "every figure of quick's checks, compared on gpu-node-c",
        ),
    ] {
        s.push_str(&format!("  {command:<56} # {what}\n"));
    }
    if stays_up {
        s.push_str("The cluster stays up until Ctrl-C.\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_ends_with_the_plugin_and_the_report_on_path() {
        let s = next_steps(
            Path::new("/tmp/k.conf"),
            Path::new("/cache/bin/kubectl"),
            Path::new("/repo/target/debug"),
            true,
        );
        assert!(
            s.contains("export KUBECONFIG=/tmp/k.conf PATH=/repo/target/debug:/cache/bin:$PATH"),
            "{s}"
        );
        for want in [
            "kubectl gpuval status quick",
            "kubectl gpuval report quick -o html",
            "kubectl gpuval rerun quick --node gpu-node-c",
            "Ctrl-C",
        ] {
            assert!(s.contains(want), "{want}: {s}");
        }
    }

    #[test]
    fn every_shipped_example_says_what_it_does_in_the_demo() {
        let dir = gpuval_tests::crds::repo_root().join("deploy/examples");
        let s = other_examples(&dir);
        for file in ["quick.yaml", "standard.yaml", "fabric.yaml", "dra.yaml"] {
            assert!(s.contains(&format!("  {file}")), "{file}: {s}");
        }
        assert!(s.contains("quick.yaml         runs"), "{s}");
    }

    #[test]
    fn make_demo_builds_everything_before_the_cluster_starts() {
        let makefile = std::fs::read_to_string(gpuval_tests::crds::repo_root().join("Makefile"))
            .expect("Makefile");
        let recipe: Vec<&str> = makefile
            .split("\ndemo:")
            .nth(1)
            .expect("a demo target")
            .lines()
            .skip(1)
            .take_while(|l| l.starts_with('\t'))
            .collect();
        let build = recipe
            .iter()
            .position(|l| l.contains("build") && l.contains("kubectl-gpuval"))
            .expect("the demo builds the plugin");
        assert!(recipe[build].contains("gpuval-agent") && recipe[build].contains("--bin demo"));
        let run = recipe
            .iter()
            .position(|l| l.contains("GPUVAL_AGENT_BIN") && l.contains("/demo"))
            .expect("the demo runs the built binaries");
        assert!(build < run, "{recipe:?}");
        assert!(
            !recipe
                .iter()
                .any(|l| l.contains("cargo run") || l.contains("$(CARGO) run")),
            "nothing compiles once the cluster is up: {recipe:?}"
        );
    }

    #[test]
    fn progress_follows_the_reconciling_message_then_the_phase() {
        let mut status = gpuval_crds::GpuValidationStatus {
            phase: Some(gpuval_crds::Phase::Running),
            ..Default::default()
        };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        conditions::set_condition(
            &mut status.conditions,
            RECONCILING,
            true,
            "Running",
            "1/3 node(s) done, 1 passed, 0 failed",
            Some(1),
            &now,
        );
        assert_eq!(
            progress(&status).as_deref(),
            Some("Running: 1/3 node(s) done, 1 passed, 0 failed")
        );
        status.phase = Some(gpuval_crds::Phase::Failed);
        assert_eq!(progress(&status).as_deref(), Some("Failed"));
    }
}
