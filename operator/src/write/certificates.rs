//! The shell side of certificates ([`crate::decide::certificates`] decides): the signing key (the
//! administrator's Secret, or one generated on first use and kept in that Secret) with its public
//! half published in a ConfigMap; once a run's terminal status is stored, the run's results read
//! (in pages), the certificates written as ConfigMaps (once; tried again with backoff after an
//! API error, see [`crate::services::certificate_retry`]), and the oldest pruned past the retention.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpuval_crds::seal;
use gpuval_crds::{GpuNodeResult, GpuValidation, GpuValidationStatus, labels};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, ResourceExt};
use ring::rand::SystemRandom;
use ring::signature::Ed25519KeyPair;

use crate::context::{Ctx, Error, FIELD_MANAGER};
use crate::decide::certificates::{self, PRIVATE_KEY_DATA, PUBLIC_KEY_CONFIGMAP};
use crate::services::certificate_retry::{AfterFailure, RunId, Turn};
use crate::services::paged;

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
        .ok_or_else(|| Error::Certificate {
            what: format!(
                "the Secret {namespace}/{secret} has no {PRIVATE_KEY_DATA}: store an ed25519 PKCS#8 PEM under that key (openssl genpkey -algorithm ed25519)"
            ),
            source: None,
        })?;
    let pkcs8 = seal::private_key_from_pem(&pem)
        .map_err(|e| Error::certificate(format!("the Secret {namespace}/{secret}: {e}"), e))?;
    publish_public_key(client, namespace, &pkcs8).await?;
    Ok(pkcs8)
}

async fn create_key_secret(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
) -> Result<Secret, Error> {
    let pkcs8 =
        Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).map_err(|_| Error::Certificate {
            // ring's error says nothing more (it is opaque on purpose).
            what: "the system's random number generator failed".into(),
            source: None,
        })?;
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
    let public = seal::public_key_of(pkcs8).map_err(|e| Error::certificate(e.to_string(), e))?;
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

/// The certificates of `gv`'s run, once its terminal `status` is stored (the caller's
/// promise: the reconcile calls this after the status write): written once, in order (each
/// node's, the validation's last), tried again after an API error with the backoff of
/// `--certificate` settings ([`crate::services::certificate_retry`]), given up with a Warning event
/// (`CertificateNotWritten`) after the last try or a refusal another try cannot change. Returns
/// how soon the reconcile should come back for the next try, when one is due.
pub async fn after_terminal(
    gv: &GpuValidation,
    ctx: &Ctx,
    status: &GpuValidationStatus,
) -> Option<Duration> {
    let settings = &ctx.cfg.certificates;
    let generation = gv.metadata.generation.unwrap_or(0);
    let ended = status.phase.is_some_and(|p| p.is_terminal())
        && status.observed_generation == Some(generation);
    if settings.retention.is_none() || !ended {
        return None;
    }
    if gv.metadata.deletion_timestamp.is_some() {
        // Its results are being deleted with it: certificates from what is left would be
        // partial.
        tracing::warn!(validation = %gv.name_any(), generation, "validation deleted before its certificates were written; none written");
        return None;
    }
    let run = RunId {
        uid: gv.metadata.uid.clone().unwrap_or_default(),
        generation,
    };
    let failed = match ctx.certificates.turn(&run, Instant::now()) {
        Turn::Nothing => return None,
        Turn::Later(pause) => return Some(pause),
        Turn::Try { failed } => failed,
    };
    let live = ctx.validations.state();
    ctx.certificates
        .keep_live(|uid| live.iter().any(|v| v.metadata.uid.as_deref() == Some(uid)));
    let outcome = write(gv, ctx, status).await;
    settle(gv, ctx, &run, failed + 1, outcome).await
}

/// Notes what try number `tried` of `run` came to; the pause before the next when one is due.
async fn settle(
    gv: &GpuValidation,
    ctx: &Ctx,
    run: &RunId,
    tried: u32,
    outcome: Result<Written, Error>,
) -> Option<Duration> {
    let validation = gv.name_any();
    let generation = run.generation;
    let e = match outcome {
        Ok(w) => {
            ctx.certificates.written(run);
            match w {
                Written::Now(n) => {
                    tracing::info!(%validation, generation, certificates = n, tries = tried, "certificates written");
                }
                Written::Before => {
                    tracing::debug!(%validation, generation, "certificates found written; not rewritten");
                }
            }
            return None;
        }
        Err(e) => e,
    };
    let policy = &ctx.cfg.certificates.retry;
    let note = if e.is_transient() {
        match ctx.certificates.failed(run, Instant::now(), policy) {
            AfterFailure::RetryIn(pause) => {
                tracing::warn!(%validation, generation, tries = tried, retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX), error = %e, "certificates not written; trying again");
                return Some(pause);
            }
            AfterFailure::GiveUp { tries } => {
                crate::decide::reconcile::events::certificate_gave_up(tries, &e.to_string())
            }
        }
    } else {
        ctx.certificates.give_up(run);
        match &e {
            Error::Certificate { what, .. } => {
                crate::decide::reconcile::events::certificate_not_written(what)
            }
            other => crate::decide::reconcile::events::certificate_refused(&other.to_string()),
        }
    };
    tracing::warn!(%validation, generation, tries = tried, error = %e, "no certificates written; given up");
    let told = crate::decide::reconcile::PlannedEvent::new(true, "CertificateNotWritten", note);
    crate::write::events::publish(gv, ctx, &[told]).await;
    None
}

/// What a successful try found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The run's certificates were written now (this many).
    Now(usize),
    /// The run's certificates were there already (the validation's, written last, exists).
    Before,
}

/// One try: the run's certificates, unless the validation's (written last) is there already;
/// then the oldest pruned past the retention (a prune that fails is logged and left to the
/// next run).
async fn write(
    gv: &GpuValidation,
    ctx: &Ctx,
    status: &GpuValidationStatus,
) -> Result<Written, Error> {
    let settings = &ctx.cfg.certificates;
    let Some(keep) = settings.retention else {
        return Ok(Written::Before);
    };
    let ns = &ctx.cfg.namespace;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let validation = gv.name_any();
    let uid = gv.metadata.uid.clone().unwrap_or_default();
    let generation = gv.metadata.generation.unwrap_or(0);
    let summary = certificates::name(&validation, &uid, generation, None);
    if maps.get_opt(&summary).await?.is_some() {
        return Ok(Written::Before);
    }
    let pkcs8 = signing_key(&ctx.client, ns, &settings.key_secret).await?;
    let results = run_results(ctx, &validation).await?;
    let image = certificates::AgentImage {
        configured: ctx.cfg.agent_image.clone(),
        ran: ctx
            .pods
            .owned_by(&uid)
            .into_iter()
            .filter(|p| p.generation == generation)
            .filter_map(|p| Some((p.node, p.image_id?)))
            .collect(),
    };
    let signed = certificates::sign_run(gv, status, &results, &image, &pkcs8)
        .map_err(|e| Error::certificate(e.to_string(), e))?;
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for i in &signed {
        create_once(ctx, &maps, &pp, &certificates::config_map(gv, ns, i)?).await?;
    }
    if let Err(e) = prune(ctx, keep).await {
        tracing::warn!(%validation, error = %e, "certificates past the retention not pruned; the next run's end prunes them");
    }
    Ok(Written::Now(signed.len()))
}

/// The results of validation `validation`, listed [`CertificateSettings::page`] at a time.
///
/// [`CertificateSettings::page`]: crate::settings::config::CertificateSettings::page
async fn run_results(ctx: &Ctx, validation: &str) -> Result<Vec<GpuNodeResult>, Error> {
    let api: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let selector = format!("{}={}", labels::VALIDATION, labels::node_value(validation));
    let base = ListParams::default().labels(&selector);
    let page = ctx.cfg.certificates.page;
    Ok(paged::all_pages("the run's results", &base, page, |p| {
        let api = api.clone();
        async move {
            ctx.throttle.acquire().await;
            api.list(&p).await
        }
    })
    .await?)
}

/// Creates certificate `cm`; one that exists already (an earlier try wrote it) is kept as it
/// is, never rewritten. A 409 is taken for "exists" only once the certificate is read back.
async fn create_once(
    ctx: &Ctx,
    api: &Api<ConfigMap>,
    pp: &PostParams,
    cm: &ConfigMap,
) -> Result<(), Error> {
    ctx.throttle.acquire().await;
    match api.create(pp, cm).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let name = cm.metadata.name.as_deref().unwrap_or_default();
            match api.get_opt(name).await? {
                Some(_) => Ok(()),
                None => Err(Error::Kube(kube::Error::Api(s))),
            }
        }
        Err(e) => Err(e.into()),
    }
}

async fn prune(ctx: &Ctx, keep: usize) -> Result<(), Error> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let base = ListParams::default().labels(certificates::KIND_LABEL);
    let existing = paged::all_pages("the certificates", &base, ctx.cfg.certificates.page, |p| {
        let api = api.clone();
        async move {
            ctx.throttle.acquire().await;
            api.list_metadata(&p).await
        }
    })
    .await?;
    let as_maps: Vec<ConfigMap> = existing
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

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        Error::Kube(kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        })))
    }

    #[test]
    fn throttling_conflicts_and_server_trouble_are_tried_again_refusals_are_not() {
        for code in [408, 409, 410, 429, 500, 503, 504] {
            assert!(api(code).is_transient(), "{code}");
        }
        for code in [400, 403, 404, 422] {
            assert!(!api(code).is_transient(), "{code}");
        }
        let lost = Error::Kube(kube::Error::Service("connection reset".into()));
        assert!(lost.is_transient());
        let bad = gpuval_crds::seal::private_key_from_pem("no key").expect_err("not a PEM");
        let key = Error::certificate("the Secret gpuval-system/k", bad);
        assert!(!key.is_transient(), "a key that cannot sign is final");
        let cause = std::error::Error::source(&key).map(ToString::to_string);
        assert!(
            cause.as_deref().is_some_and(|c| c.contains("PEM")),
            "the cause is kept: {cause:?}"
        );
    }
}
