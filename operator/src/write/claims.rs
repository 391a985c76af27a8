//! The DRA claim template of a validation's generation.

use gpuval_crds::GpuValidation;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, ResourceExt};

use super::create_params;
use crate::context::{Ctx, Error};
use crate::decide::claims;
use crate::decide::reconcile::PlannedEvent;

/// Creates the claim template of the validation's generation before its DRA pods, which name
/// it (one that exists already is fine). The API server compiles `spec.dra.selector` here: a
/// refusal is a Warning event on the validation (`ClaimTemplateRefused`, with the server's
/// message) and fails the step, which is tried again when the validation changes (or after
/// [`crate::wiring`]'s long wait for a final error).
pub async fn ensure_template(gv: &GpuValidation, ctx: &Ctx) -> Result<(), Error> {
    let api: Api<ResourceClaimTemplate> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let template = claims::claim_template(gv, &ctx.cfg.allocation, &ctx.cfg.namespace);
    let pp = create_params();
    ctx.throttle.acquire().await;
    match api.create(&pp, &template).await {
        Ok(_) => {
            tracing::info!(validation = %gv.name_any(), template = %template.name_any(), class = %ctx.cfg.allocation.device_class, "DRA claim template created");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 422 => {
            let note = format!(
                "the API server refused the ResourceClaimTemplate {} (check spec.dra.selector): {}",
                template.name_any(),
                s.message
            );
            let refused = PlannedEvent::new(true, "ClaimTemplateRefused", note.clone());
            super::events::publish(gv, ctx, std::slice::from_ref(&refused)).await;
            Err(Error::ClaimTemplate {
                note,
                source: kube::Error::Api(s),
            })
        }
        Err(e) => Err(e.into()),
    }
}
