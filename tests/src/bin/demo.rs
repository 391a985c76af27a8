//! `make demo`: the whole flow on this machine, no GPU needed. A local control plane (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, kwok; built from source), the gpuval
//! CRDs, three fake GPU nodes with 8 GPUs each, the operator, and the real agent binary run for
//! each agent pod by a fake kubelet with the SIMULATED GPU backend (one node is given a bad GPU).
//! Applies deploy/examples/quick.yaml, waits for the verdict, prints what `kubectl` shows, and
//! keeps the cluster up until Ctrl-C (`--exit` to stop at once).

use std::process::ExitCode;
use std::time::Duration;

use gpuval_crds::GpuValidation;
use gpuval_tests::kubelet::{FakeKubelet, agent_binary};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::{ControlPlane, Options, crds, nodes};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;

const NS: &str = "gpuval-system";

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
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

async fn run() -> Result<(), String> {
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
        "gpus=8,model=H200,timescale=0.01,fail=memory@6",
    );
    let _operator = OperatorHandle::start(
        client.clone(),
        test_config(NS, "gpus=8,model=H200,timescale=0.01"),
    );
    println!(
        "operator started; agents use the SIMULATED backend (gpu-node-c has a planted memory fault on GPU6)\n"
    );

    let example = crds::repo_root().join("deploy/examples/quick.yaml");
    let api: Api<GpuValidation> = Api::all(client.clone());
    for doc in crds::read_yaml_documents(&example)? {
        let name = doc["metadata"]["name"]
            .as_str()
            .ok_or("example without a name")?
            .to_string();
        api.patch(
            &name,
            &PatchParams::apply("gpuval-demo"),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|e| format!("apply {}: {e}", example.display()))?;
        println!("$ kubectl apply -f {}", example.display());
        let done = await_condition(api.clone(), &name, |g: Option<&GpuValidation>| {
            g.and_then(|g| g.status.as_ref())
                .and_then(|s| s.phase)
                .is_some_and(|p| p.is_terminal())
        });
        tokio::time::timeout(Duration::from_secs(300), done)
            .await
            .map_err(|_| "no verdict within 5 minutes".to_string())?
            .map_err(|e| e.to_string())?;
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
    if exit_at_once {
        return Ok(());
    }
    let kc = std::env::temp_dir().join("gpuval-demo.kubeconfig");
    std::fs::copy(cp.kubeconfig(), &kc).map_err(|e| format!("copy kubeconfig: {e}"))?;
    println!(
        "The cluster stays up until Ctrl-C. Explore it with:\n  export KUBECONFIG={}\n  {} get gpuval -o yaml",
        kc.display(),
        cp.tool("kubectl").map_err(|e| e.to_string())?.display()
    );
    tokio::signal::ctrl_c()
        .await
        .map_err(|e| format!("wait for Ctrl-C: {e}"))?;
    println!("stopping");
    Ok(())
}
