//! The steps of the flow between reading the validation and storing the result: the saved
//! result or a new run of the checks, staying for the fabric, the run's deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuval_crds::{GpuValidation, NodeReport};
use kube::{Api, Client};
use tokio::sync::watch;

use crate::api_retry::{Backoff, Budget, FIRST_BACKOFF, seed_of};
use crate::backend::{self, BackendChoice, BackendError};
use crate::pod_resources::PodResources;
use crate::report;
use crate::runner::{self, Plan};
use crate::saved_result::{self, SavedResult};

use super::{
    AgentEnv, MAX_STORE_BACKOFF, Outcome, START_READ_BUDGET, field_manager, is_transient, signalled,
};

/// Reads the validation (retrying while the API server is away, for up to
/// [`START_READ_BUDGET`]); an outcome instead when there is nothing to do or no way to read it.
pub(super) async fn read_validation(
    client: &Client,
    env: &AgentEnv,
) -> Result<GpuValidation, Outcome> {
    let validations: Api<GpuValidation> = Api::all(client.clone());
    let budget = Budget::Until(Instant::now() + START_READ_BUDGET);
    let backoff = Backoff::new(FIRST_BACKOFF, MAX_STORE_BACKOFF, seed_of(&env.pod_name));
    let got = crate::api_retry::retry(
        "get the GpuValidation",
        budget,
        backoff,
        is_transient,
        || validations.get_opt(&env.validation),
    )
    .await;
    let validation = match got {
        Ok(Some(v)) => v,
        Ok(None) => {
            tracing::info!(validation = %env.validation, "the validation is gone; nothing to do");
            return Err(Outcome::Stale(format!(
                "GpuValidation {} no longer exists",
                env.validation
            )));
        }
        Err(e) => {
            return Err(Outcome::NotStored(format!(
                "get GpuValidation {}: {e}",
                env.validation
            )));
        }
    };
    if let Some(why) = stale_reason(env, &validation) {
        tracing::info!(validation = %env.validation, reason = %why, "stale pod; exiting without a result");
        return Err(Outcome::Stale(why));
    }
    Ok(validation)
}

/// What identifies this pod's run in the state directory.
pub(super) fn saved_identity(env: &AgentEnv, report: NodeReport) -> SavedResult {
    SavedResult {
        validation_uid: env.validation_uid.clone(),
        generation: env.generation,
        pod_name: env.pod_name.clone(),
        pod_uid: env.pod_uid.clone(),
        report,
    }
}

/// This pod's report: the one it saved before (an agent started again in the same pod), or
/// the checks' (then saved to the state directory, when there is one).
pub(super) async fn saved_or_run(
    env: &AgentEnv,
    validation: &GpuValidation,
    stop: Arc<AtomicBool>,
    sig: &mut watch::Receiver<bool>,
) -> Result<NodeReport, Outcome> {
    let wanted = saved_identity(env, NodeReport::default());
    if let Some(dir) = &env.state_dir
        && let Some(report) = saved_result::load(dir, &wanted)
    {
        tracing::info!(dir = %dir.display(), verdict = %report.verdict, "storing the result this pod saved before; not running the checks again");
        return Ok(report);
    }
    tracing::info!(validation = %env.validation, "running the checks");
    let mut checks = start_checks(env, validation, stop.clone());
    let joined = tokio::select! {
        r = &mut checks => r,
        () = signalled(sig) => {
            // The stop flag is set: the checks stop at their next step and free the GPUs.
            let _ = checks.await;
            return Err(Outcome::Terminated);
        }
    };
    let report = match joined {
        Ok(r) => r,
        Err(e) => {
            return Err(Outcome::NotStored(format!(
                "the checks did not finish: {e}"
            )));
        }
    };
    if stop.load(Ordering::SeqCst) {
        return Err(Outcome::Terminated);
    }
    if let Some(dir) = &env.state_dir {
        match saved_result::save(dir, &saved_identity(env, report.clone())) {
            Ok(path) => {
                tracing::info!(path = %path.display(), "result kept on the pod's filesystem until stored")
            }
            Err(e) => tracing::warn!(error = %e, "result kept in memory only"),
        }
    }
    Ok(report)
}

/// A node that passed a validation with `spec.fabric` stays for the fabric test, until the
/// operator ends it or the run's deadline passes.
pub(super) async fn stay_for_fabric(
    client: Client,
    env: &AgentEnv,
    validation: &GpuValidation,
    report: &NodeReport,
    result: String,
) {
    let Some(spec) = validation.spec.fabric.as_ref() else {
        return;
    };
    if !report.verdict.passes() {
        return;
    }
    let member = crate::fabric::rounds::Member {
        client,
        namespace: &env.namespace,
        validation: &env.validation,
        generation: env.generation,
        node: &env.node,
        result,
        field_manager: field_manager(&env.node),
    };
    let nccl = crate::fabric::group_runner(&env.backend, report);
    // In a pod the rendezvous needs the validation's key: without it, no group is joined.
    let auth = crate::fabric::member_key::from_env(env.fabric_key_file.as_deref(), true);
    let left =
        crate::fabric::rounds::take_part(&member, spec, (nccl, auth), run_deadline(validation))
            .await;
    tracing::info!(?left, "left the fabric test");
}

/// When the run's deadline passes, as an instant of this process (from the validation's start
/// time, or from now when it has none).
pub(super) fn run_deadline(validation: &GpuValidation) -> std::time::Instant {
    let total = validation.spec.deadline_or_default().as_std();
    let spent = validation
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .and_then(|t| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(t.0)
                .try_into()
                .ok()
        })
        .unwrap_or(Duration::ZERO);
    std::time::Instant::now() + total.saturating_sub(spent)
}

/// Why this pod should not run, if it should not: the validation was replaced (another uid)
/// or its spec changed (another generation).
pub fn stale_reason(env: &AgentEnv, validation: &GpuValidation) -> Option<String> {
    let meta = &validation.metadata;
    if meta
        .uid
        .as_deref()
        .is_some_and(|uid| uid != env.validation_uid)
    {
        return Some(format!(
            "GpuValidation {} was recreated (uid {} is not {})",
            env.validation,
            meta.uid.as_deref().unwrap_or(""),
            env.validation_uid
        ));
    }
    match meta.generation {
        Some(g) if g != env.generation => Some(format!(
            "GpuValidation {} is at generation {g}; this pod was made for generation {}",
            env.validation, env.generation
        )),
        _ => None,
    }
}

/// Starts the checks on a blocking thread. When the stop flag is set (a signal), the checks
/// stop at their next step, free the GPUs, and the task ends.
pub(super) fn start_checks(
    env: &AgentEnv,
    validation: &GpuValidation,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<NodeReport> {
    let mut plan = Plan::from_spec(&validation.spec);
    plan.expected_gpus = env.expected_gpus;
    plan.dra_gpu_uuids = env.dra_gpu_uuids.clone();
    plan.node = Some(env.node.clone());
    plan.io_dir = env.io_dir.clone();
    plan.allow_shared_gpus = env.allow_shared_gpus;
    plan.baselines = env.baselines.clone();
    plan.pod_resources = env.pod_resources_socket.clone().map(|socket| PodResources {
        socket,
        own_pod: Some(format!("{}/{}", env.namespace, env.pod_name)),
    });
    let choice = env.backend.clone();
    tokio::task::spawn_blocking(move || {
        let backend = match backend::open(&choice) {
            Ok(b) => b,
            Err(e) => return backend_error_report(&plan, &choice, &e),
        };
        runner::run(&backend, &plan, &stop, &|line| eprintln!("{line}"))
    })
}

/// The report of a node whose GPU backend could not start: an Error verdict with the reason.
pub(super) fn backend_error_report(
    plan: &Plan,
    choice: &BackendChoice,
    e: &BackendError,
) -> NodeReport {
    let kind = match choice {
        BackendChoice::Cuda => backend::BackendKind::Cuda,
        BackendChoice::Simulated(_) => backend::BackendKind::Simulated,
    };
    report::could_not_run(
        report::started(kind, plan.node.clone()),
        crate::judge::error_reason_in("GPU backend", e),
    )
}
