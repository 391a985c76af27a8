//! The fabric test's objects: the validation's rendezvous key Secret and its rounds.

use gpuval_crds::{FabricRoundSpec, GpuFabricRound, GpuValidation};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ResourceExt};

use super::{create_params, ignore_not_found};
use crate::context::{Ctx, Error};
use crate::{decide::fabric_key, decide::pod};

/// Creates the validation's fabric key Secret before its fabric pods, which mount it. One that
/// exists is kept when it is this validation's; an earlier validation's of the same name (still
/// being deleted with it) is deleted, and the step fails to be tried again.
pub async fn ensure_key(gv: &GpuValidation, ctx: &Ctx) -> Result<(), Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let key = fabric_key::new_key().map_err(Error::FabricKey)?;
    let secret = fabric_key::secret(gv, &ctx.cfg.namespace, key);
    let name = secret.name_any();
    let pp = create_params();
    ctx.throttle.acquire().await;
    match api.create(&pp, &secret).await {
        Ok(_) => {
            tracing::info!(validation = %gv.name_any(), secret = %name, "fabric rendezvous key created");
            return Ok(());
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.throttle.acquire().await;
    if fabric_key::belongs_to(&api.get(&name).await?, gv) {
        return Ok(());
    }
    ctx.throttle.acquire().await;
    ignore_not_found(
        api.delete(&name, &DeleteParams::background())
            .await
            .map(|_| ()),
    )?;
    Err(Error::FabricKey(format!(
        "the Secret {name} belongs to an earlier validation of the same name; it was deleted \
         and is made again on the next try"
    )))
}

/// Creates a fabric round (before the status that announces it; one that exists already is
/// fine: a retried step plans the same round under the same name).
pub async fn create_round(
    gv: &GpuValidation,
    ctx: &Ctx,
    spec: &FabricRoundSpec,
) -> Result<(), Error> {
    let api: Api<GpuFabricRound> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let round = pod::fabric_round(gv, spec);
    ctx.throttle.acquire().await;
    let pp = create_params();
    match api.create(&pp, &round).await {
        Ok(_) => {
            tracing::info!(validation = %gv.name_any(), round = spec.round, part = spec.shard, parts = spec.shards, purpose = %spec.purpose, groups = spec.groups.len(), "fabric round planned");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
