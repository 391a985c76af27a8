//! Installing the generated CRDs (the committed YAML, exactly what users apply).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::wait::{await_condition, conditions},
};

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Parses a multi-document YAML file into JSON values, skipping empty documents.
pub fn read_yaml_documents(path: &std::path::Path) -> Result<Vec<serde_json::Value>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| format!("parse {}: {e}", path.display()))?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

/// Applies `deploy/crds/*.yaml` with server-side apply and waits until each CRD is Established.
pub async fn install_crds(client: &Client) -> Result<Vec<String>, String> {
    let path = repo_root().join("deploy/crds/gpuval.io.yaml");
    apply_crds(client, &path, "gpuval-tests", Duration::from_secs(30)).await
}

/// Applies the CRDs in `path` with server-side apply as field manager `manager`, and waits up to
/// `timeout` until each is Established; gives their names.
pub async fn apply_crds(
    client: &Client,
    path: &Path,
    manager: &str,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for doc in read_yaml_documents(path)? {
        let crd: CustomResourceDefinition = serde_json::from_value(doc)
            .map_err(|e| format!("{} is not a CRD: {e}", path.display()))?;
        let name = crd.metadata.name.clone().ok_or("CRD without a name")?;
        api.patch(
            &name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("apply CRD {name}: {e}"))?;
        names.push(name);
    }
    for name in &names {
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        tokio::time::timeout(timeout, established)
            .await
            .map_err(|_| format!("CRD {name} not Established within {}s", timeout.as_secs()))?
            .map_err(|e| format!("watch CRD {name}: {e}"))?;
    }
    Ok(names)
}

/// Creates namespace `name`; fails the test if the API server refuses.
pub async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
        .expect("namespace object");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
}

/// The entries of directory `dir`, sorted by path; fails the test if it cannot be read.
pub fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    entries
}
