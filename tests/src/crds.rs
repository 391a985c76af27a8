//! Installing the generated CRDs (the committed YAML, exactly what users apply).

use std::{path::PathBuf, time::Duration};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
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
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let path = repo_root().join("deploy/crds/gpuval.io.yaml");
    let mut names = Vec::new();
    for doc in read_yaml_documents(&path)? {
        let crd: CustomResourceDefinition = serde_json::from_value(doc)
            .map_err(|e| format!("{} is not a CRD: {e}", path.display()))?;
        let name = crd.metadata.name.clone().ok_or("CRD without a name")?;
        api.patch(
            &name,
            &PatchParams::apply("gpuval-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|e| format!("apply CRD {name}: {e}"))?;
        names.push(name);
    }
    for name in &names {
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .map_err(|_| format!("CRD {name} not Established within 30s"))?
            .map_err(|e| format!("watch CRD {name}: {e}"))?;
    }
    Ok(names)
}
