//! Service-account identities for tests: tokens from the TokenRequest API (optionally bound to a
//! pod, as a kubelet's projected token is) and kubeconfig files that use them, so that a
//! process runs with a service account's rights instead of the admin's.

use std::path::Path;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

/// The pod a token is bound to (the token dies with the pod; when the pod is scheduled, the
/// token also names its node: user extra `authentication.kubernetes.io/node-name`).
#[derive(Debug, Clone)]
pub struct BoundPod {
    pub name: String,
    pub uid: String,
}

/// How long requested tokens live (the API server's minimum is 10 minutes).
pub const TOKEN_SECONDS: i64 = 3600;

/// A token for service account `namespace/name` from the TokenRequest API, bound to `pod` when
/// given. The API server's default audience (its issuer) is used.
pub async fn request_token(
    client: &Client,
    namespace: &str,
    service_account: &str,
    pod: Option<&BoundPod>,
) -> Result<String, kube::Error> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(TOKEN_SECONDS),
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(p.name.clone()),
                uid: Some(p.uid.clone()),
            }),
        }),
        ..Default::default()
    };
    let answer = api
        .create_token_request(service_account, &PostParams::default(), &request)
        .await?;
    Ok(answer.status.and_then(|s| s.token).unwrap_or_default())
}

/// A kubeconfig for `server` (the test control plane, TLS unchecked on loopback) that
/// authenticates with `token`.
pub fn token_kubeconfig(server: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: gpuval-test\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\n\
         users:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: gpuval-test\n  context:\n    cluster: gpuval-test\n    user: sa\n\
         current-context: gpuval-test\n"
    )
}

/// The API server address in a kubeconfig file (its current context's cluster).
pub fn server_of(kubeconfig: &Path) -> Result<String, String> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .map_err(|e| format!("read {}: {e}", kubeconfig.display()))?;
    let cluster_name = kc
        .contexts
        .iter()
        .find(|c| Some(&c.name) == kc.current_context.as_ref())
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone());
    kc.clusters
        .iter()
        .find(|c| cluster_name.is_none() || Some(&c.name) == cluster_name.as_ref())
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .ok_or_else(|| format!("no server in {}", kubeconfig.display()))
}

/// A client for `server` that authenticates with `token`.
pub async fn token_client(server: &str, token: &str) -> Result<Client, String> {
    let kc = Kubeconfig::from_yaml(&token_kubeconfig(server, token)).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Client::try_from(config).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_round_trips_server_and_token() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kc");
        std::fs::write(&path, token_kubeconfig("https://127.0.0.1:6443", "abc")).expect("write");
        assert_eq!(server_of(&path).as_deref(), Ok("https://127.0.0.1:6443"));
        let kc = Kubeconfig::read_from(&path).expect("parse");
        assert!(
            kc.auth_infos[0]
                .auth_info
                .as_ref()
                .is_some_and(|a| a.token.is_some())
        );
    }
}
