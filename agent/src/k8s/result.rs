//! The node's `GpuNodeResult`: its labels, summary and object, and storing it with retries
//! until the run's deadline.

use std::collections::BTreeMap;
use std::time::Instant;

use gpuval_crds::result::result_name;
use gpuval_crds::{
    Action, GpuNodeResult, GpuNodeResultSpec, GpuValidation, NodeReport, Verdict, labels,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};

use crate::api_retry::{Backoff, Budget, FIRST_BACKOFF, seed_of};

use super::*;

/// The server-side-apply field manager of this node's agent. Field managers are limited to
/// 128 characters, so a long node name goes in its short label form.
pub fn field_manager(node: &str) -> String {
    format!("gpuval-agent/{}", labels::node_value(node))
}

/// The result's summary annotation (the operator copies it into the validation's node
/// status): the report's failures joined with `"; "`, or the key figures when there are none.
pub fn summary(report: &NodeReport) -> String {
    if report.failures.is_empty() {
        crate::render::headline(report)
    } else {
        let messages: Vec<&str> = report.failures.iter().map(|r| r.message.as_str()).collect();
        messages.join("; ")
    }
}

/// The labels of a node result.
pub fn result_labels(env: &AgentEnv, verdict: Verdict, action: Action) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::VALIDATION.to_string(),
            labels::node_value(&env.validation),
        ),
        (labels::NODE.to_string(), labels::node_value(&env.node)),
        (labels::GENERATION.to_string(), env.generation.to_string()),
        (labels::VERDICT.to_string(), verdict.as_str().to_string()),
        (labels::ACTION.to_string(), action.as_str().to_string()),
        (
            labels::MANAGED_BY_KEY.to_string(),
            labels::MANAGED_BY.to_string(),
        ),
    ])
}

/// The result object as the agent applies it (without status: that goes to the subresource).
pub fn result_object(env: &AgentEnv, report: &NodeReport) -> GpuNodeResult {
    let owner = OwnerReference {
        api_version: GpuValidation::api_version(&()).into_owned(),
        kind: GpuValidation::kind(&()).into_owned(),
        name: env.validation.clone(),
        uid: env.validation_uid.clone(),
        controller: Some(false),
        block_owner_deletion: Some(false),
    };
    let mut result_labels = result_labels(env, report.verdict, report.action);
    if report.simulated {
        // The operator never takes a simulated result as evidence about the node.
        result_labels.insert(labels::SIMULATED.to_string(), "true".to_string());
    }
    GpuNodeResult {
        metadata: ObjectMeta {
            name: Some(result_name(&env.validation, &env.node)),
            namespace: Some(env.namespace.clone()),
            labels: Some(result_labels),
            annotations: Some(
                [
                    (labels::SUMMARY, summary(report)),
                    (labels::CODES, report.codes()),
                    (labels::VERSIONS, report.versions().annotation()),
                    // The full node name (the label may hold its shortened form).
                    (labels::NODE, env.node.clone()),
                    // Who wrote it: the operator counts only its current pod's result.
                    (labels::POD, env.pod_name.clone()),
                    (labels::POD_UID, env.pod_uid.clone().unwrap_or_default()),
                ]
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            ),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: GpuNodeResultSpec {
            validation: env.validation.clone(),
            generation: env.generation,
            node_name: env.node.clone(),
        },
        status: None,
    }
}

/// The body of the status apply: apiVersion, kind and the whole report.
pub fn status_patch(report: &NodeReport) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": GpuNodeResult::api_version(&()),
        "kind": GpuNodeResult::kind(&()),
        "status": report,
    })
}

/// Why the result was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The validation is gone or moved on: this pod's result must not be written.
    #[error("{0}")]
    Stale(String),
    #[error(transparent)]
    Api(#[from] kube::Error),
}

impl StoreError {
    fn is_transient(&self) -> bool {
        matches!(self, StoreError::Api(e) if is_transient(e))
    }
}

/// Stores the result, trying again after transient errors (backoff with jitter, at most
/// [`MAX_STORE_BACKOFF`] apart) until `deadline`, the run's.
pub(super) async fn store_until(
    client: Client,
    env: &AgentEnv,
    report: &NodeReport,
    deadline: Instant,
) -> Result<(), StoreError> {
    let backoff = Backoff::new(FIRST_BACKOFF, MAX_STORE_BACKOFF, seed_of(&env.pod_name));
    crate::api_retry::retry(
        "store the result",
        Budget::Until(deadline),
        backoff,
        StoreError::is_transient,
        || store(client.clone(), env, report),
    )
    .await
}

/// One try: reads the validation again (nothing is written once it has moved on), then
/// applies the result object and its status.
pub(super) async fn store(
    client: Client,
    env: &AgentEnv,
    report: &NodeReport,
) -> Result<(), StoreError> {
    let validations: Api<GpuValidation> = Api::all(client.clone());
    let Some(current) = validations.get_opt(&env.validation).await? else {
        return Err(StoreError::Stale(format!(
            "GpuValidation {} no longer exists",
            env.validation
        )));
    };
    if let Some(why) = stale_reason(env, &current) {
        return Err(StoreError::Stale(why));
    }
    let api: Api<GpuNodeResult> = Api::namespaced(client, &env.namespace);
    let name = result_name(&env.validation, &env.node);
    let pp = PatchParams::apply(&field_manager(&env.node)).force();
    let object = result_object(env, report);
    api.patch(&name, &pp, &Patch::Apply(&object)).await?;
    let status = status_patch(report);
    api.patch_status(&name, &pp, &Patch::Apply(&status)).await?;
    Ok(())
}
