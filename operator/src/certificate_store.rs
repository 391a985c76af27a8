//! The shell side of certificates ([`crate::certificates`] decides): the signing key (the
//! administrator's Secret, or one generated on first use and kept in that Secret) with its public
//! half published in a ConfigMap; at the end of a run, the run's results read, the certificates
//! written as ConfigMaps, and the oldest pruned past the retention setting.

use std::collections::BTreeMap;

use gpuval_crds::seal;
use gpuval_crds::{GpuNodeResult, GpuValidation, GpuValidationStatus, labels};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, ResourceExt};
use ring::rand::SystemRandom;
use ring::signature::Ed25519KeyPair;

use crate::certificates::{self, PRIVATE_KEY_DATA, PUBLIC_KEY_CONFIGMAP};
use crate::controller::{Ctx, Error, FIELD_MANAGER};

/// The signing key (PKCS#8 DER) from Secret `secret` in `namespace`; generated and stored there
/// when the Secret does not exist. Publishes its public half in [`PUBLIC_KEY_CONFIGMAP`].
pub async fn signing_key(client: &Client, namespace: &str, secret: &str) -> Result<Vec<u8>, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let found = match api.get_opt(secret).await? {
        Some(s) => s,
        None => create_key_secret(&api, namespace, secret).await?,
    };
    let pem = found
        .data
        .as_ref()
        .and_then(|d| d.get(PRIVATE_KEY_DATA))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| {
            Error::Certificate(format!(
                "the Secret {namespace}/{secret} has no {PRIVATE_KEY_DATA}: store an ed25519 PKCS#8 PEM under that key (openssl genpkey -algorithm ed25519)"
            ))
        })?;
    let pkcs8 = seal::private_key_from_pem(&pem)
        .map_err(|e| Error::Certificate(format!("the Secret {namespace}/{secret}: {e}")))?;
    publish_public_key(client, namespace, &pkcs8).await?;
    Ok(pkcs8)
}

async fn create_key_secret(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
) -> Result<Secret, Error> {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
        .map_err(|_| Error::Certificate("the system's random number generator failed".into()))?;
    let pem = gpuval_crds::pem::encode("PRIVATE KEY", pkcs8.as_ref());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                labels::MANAGED_BY_KEY.to_string(),
                labels::MANAGED_BY.to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(
            PRIVATE_KEY_DATA.to_string(),
            ByteString(pem.into_bytes()),
        )])),
        ..Default::default()
    };
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, &secret).await {
        Ok(s) => {
            tracing::info!(secret = name, "certificate signing key generated");
            Ok(s)
        }
        // Another operator replica made it first: use theirs.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(api.get(name).await?),
        Err(e) => Err(e.into()),
    }
}

async fn publish_public_key(client: &Client, namespace: &str, pkcs8: &[u8]) -> Result<(), Error> {
    let public = seal::public_key_of(pkcs8).map_err(|e| Error::Certificate(e.to_string()))?;
    let cm = certificates::public_key_map(namespace, &public);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut value = serde_json::to_value(&cm)?;
    value["apiVersion"] = "v1".into();
    value["kind"] = "ConfigMap".into();
    api.patch(
        PUBLIC_KEY_CONFIGMAP,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(value),
    )
    .await?;
    Ok(())
}

/// Writes the certificates of `gv`'s run that `status` ends, then prunes past the retention.
/// A certificate written already (a retried step) is kept as it is.
pub async fn write(
    gv: &GpuValidation,
    ctx: &Ctx,
    status: &GpuValidationStatus,
) -> Result<(), Error> {
    let Some(keep) = ctx.cfg.certificates.retention else {
        return Ok(());
    };
    let ns = &ctx.cfg.namespace;
    let pkcs8 = signing_key(&ctx.client, ns, &ctx.cfg.certificates.key_secret).await?;
    let results: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!(
        "{}={}",
        labels::VALIDATION,
        labels::node_value(&gv.name_any())
    );
    ctx.throttle.acquire().await;
    let run = results
        .list(&ListParams::default().labels(&selector))
        .await?;
    let signed = certificates::sign_run(gv, status, &run.items, &ctx.cfg.agent_image, &pkcs8)
        .map_err(|e| Error::Certificate(e.to_string()))?;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for i in &signed {
        let cm = certificates::config_map(gv, ns, i)?;
        ctx.throttle.acquire().await;
        match api.create(&pp, &cm).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    tracing::info!(validation = %gv.name_any(), certificates = signed.len(), "certificates written");
    prune(ctx, keep).await
}

/// The `GPUVAL_BASELINES` value for each of `nodes`' agents: its GPUs' baselines from the runs
/// its certificates record (metadata only, one list per [`certificates::NODES_PER_LIST`] nodes);
/// a node without history, or every node with certificates off, is left out. A list that
/// fails leaves its nodes out, logged: without its history a GPU is judged by its floors alone.
pub async fn baselines_for(ctx: &Ctx, nodes: &[String]) -> BTreeMap<String, String> {
    let settings = &ctx.cfg.certificates;
    if settings.retention.is_none() || settings.baseline_runs == 0 || nodes.is_empty() {
        return BTreeMap::new();
    }
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let mut metas: Vec<ObjectMeta> = Vec::new();
    for selector in certificates::node_selectors(nodes) {
        ctx.throttle.acquire().await;
        match api
            .list_metadata(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => metas.extend(list.items.into_iter().map(|m| m.metadata)),
            Err(e) => {
                tracing::warn!(error = %e, selector = %selector, "GPU baselines not read; these nodes are judged by their floors alone");
            }
        }
    }
    certificates::by_node(nodes, metas)
        .into_iter()
        .filter_map(|(node, metas)| {
            let env = certificates::baselines_env(
                &certificates::runs_of(&metas),
                settings.baseline_runs,
                settings.baseline_tolerance,
            )?;
            Some((node, env))
        })
        .collect()
}

async fn prune(ctx: &Ctx, keep: usize) -> Result<(), Error> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    ctx.throttle.acquire().await;
    let existing = api
        .list_metadata(&ListParams::default().labels(certificates::KIND_LABEL))
        .await?;
    let as_maps: Vec<ConfigMap> = existing
        .items
        .into_iter()
        .map(|m| ConfigMap {
            metadata: m.metadata,
            ..Default::default()
        })
        .collect();
    for name in certificates::to_prune(&as_maps, keep) {
        ctx.throttle.acquire().await;
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(certificate = %name, "certificate pruned (retention)"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
