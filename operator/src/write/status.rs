//! A validation's or a schedule's status, by server-side apply.

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};

use crate::context::{Ctx, Error, FIELD_MANAGER};

/// Writes `status` to the cluster-scoped object `name` of kind `K` (a validation or a
/// schedule) through server-side apply.
pub async fn write<K>(name: &str, ctx: &Ctx, status: &impl serde::Serialize) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let api: Api<K> = Api::all(ctx.client.clone());
    ctx.throttle.acquire().await;
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}
