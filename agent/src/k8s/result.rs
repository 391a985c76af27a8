//! The node's `GpuNodeResult`: the report's labels, summary and status, and storing them with
//! retries until the run's deadline into the result the operator created for this pod (bound
//! to it: [`gpuval_crds::binding`]).

use std::time::{Duration, Instant};

use gpuval_crds::result::result_name;
use gpuval_crds::result_meta::ReportMeta;
use gpuval_crds::{GpuNodeResult, GpuValidation, NodeReport, labels};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};

use super::steps::stale_reason;
use super::{AgentEnv, MAX_STORE_BACKOFF, is_transient};
use crate::api_retry::{Backoff, Budget, FIRST_BACKOFF, seed_of};

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

/// What the agent's report puts on its result's metadata ([`ReportMeta`]: the labels and
/// annotations every reader reads through the same type).
pub fn report_meta(report: &NodeReport) -> ReportMeta {
    ReportMeta {
        verdict: report.verdict,
        action: report.action,
        // The operator never takes a simulated result as evidence about the node.
        simulated: report.simulated,
        summary: summary(report),
        codes: report.codes(),
        versions: report.versions(),
    }
}

/// The merge patch of the result's metadata that carries the report's labels and annotations
/// (the only ones the agent may set: the operator made the rest when it created the result, see
/// [`gpuval_crds::binding`]). It names nothing of the result's binding (run, node, pod), which
/// the admission policy keeps an agent from changing; being a merge patch, it never creates the
/// result (a missing one is a 404).
pub fn report_metadata(report: &NodeReport) -> serde_json::Value {
    let meta = report_meta(report);
    serde_json::json!({
        "metadata": {
            "labels": meta.labels(),
            "annotations": meta.annotations(),
        },
    })
}

/// The body of the status apply: apiVersion, kind and the whole report.
pub fn status_patch(report: &NodeReport) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": GpuNodeResult::api_version(&()),
        "kind": GpuNodeResult::kind(&()),
        "status": report,
    })
}

/// How long the agent waits for the operator to create its result (it does so right after
/// the pod, long before the checks end): a result still missing after this is an error.
pub const RESULT_CREATE_WAIT: Duration = Duration::from_secs(300);

/// Why the result was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The validation is gone or moved on: this pod's result must not be written.
    #[error("{0}")]
    Stale(String),
    /// The operator has not created this pod's result (yet).
    #[error(
        "GpuNodeResult {0} does not exist: the operator creates it right after the agent pod, and agents may not create results; check that the operator runs and that its Role lets it create gpunoderesults, then rerun the validation"
    )]
    NotCreated(String),
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
    // A result the operator has not created yet is waited for, within its own bound.
    let created_by = Instant::now() + RESULT_CREATE_WAIT;
    let retried = |e: &StoreError| match e {
        StoreError::NotCreated(_) => Instant::now() < created_by,
        other => other.is_transient(),
    };
    crate::api_retry::retry(
        "store the result",
        Budget::Until(deadline),
        backoff,
        retried,
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
    let manager = field_manager(&env.node);
    let merge = PatchParams {
        field_manager: Some(manager.clone()),
        ..Default::default()
    };
    match api
        .patch(&name, &merge, &Patch::Merge(&report_metadata(report)))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Err(StoreError::NotCreated(format!("{}/{name}", env.namespace)));
        }
        other => other?,
    };
    let status = status_patch(report);
    let apply = PatchParams::apply(&manager).force();
    api.patch_status(&name, &apply, &Patch::Apply(&status))
        .await?;
    Ok(())
}
