//! `make demo`: a local control plane (etcd + kube-apiserver built from source), the gpuval CRDs
//! and the quick example validation; prints what `kubectl get gpuval` shows and a kubeconfig to
//! explore with. Runs until Ctrl-C (or exits at once with `--exit`).

use std::process::ExitCode;

use gpuval_tests::{ControlPlane, crds};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;

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

async fn run() -> Result<(), String> {
    let exit_at_once = std::env::args().any(|a| a == "--exit");
    let cp = ControlPlane::start().await.map_err(|e| e.to_string())?;
    let client = cp.client().await.map_err(|e| e.to_string())?;
    let names = crds::install_crds(&client).await?;
    println!("installed CRDs: {}", names.join(", "));

    let example = crds::repo_root().join("deploy/examples/quick.yaml");
    for doc in crds::read_yaml_documents(&example)? {
        let name = doc["metadata"]["name"]
            .as_str()
            .ok_or("example without a name")?
            .to_string();
        let ar = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "gpuval.io",
            "v1alpha1",
            "GpuValidation",
        ));
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        api.patch(
            &name,
            &PatchParams::apply("gpuval-demo"),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|e| format!("apply {}: {e}", example.display()))?;
        println!("applied {} (GpuValidation/{name})", example.display());
    }

    let out = cp
        .kubectl()
        .map_err(|e| e.to_string())?
        .args(["get", "gpuvalidations", "-o", "wide"])
        .output()
        .map_err(|e| format!("run kubectl: {e}"))?;
    println!(
        "\n$ kubectl get gpuvalidations -o wide\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    if !out.status.success() {
        return Err(format!(
            "kubectl failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if exit_at_once {
        return Ok(());
    }
    // Keep a copy of the kubeconfig where the user can reach it while the demo runs.
    let kc = std::env::temp_dir().join("gpuval-demo.kubeconfig");
    std::fs::copy(cp.kubeconfig(), &kc).map_err(|e| format!("copy kubeconfig: {e}"))?;
    println!(
        "The control plane stays up until Ctrl-C. Explore it with:\n  export KUBECONFIG={}\n  {}/kubectl get gpuval -o yaml",
        kc.display(),
        cp.tool("kubectl")
            .map_err(|e| e.to_string())?
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    );
    tokio::signal::ctrl_c()
        .await
        .map_err(|e| format!("wait for Ctrl-C: {e}"))?;
    println!("stopping");
    Ok(())
}
