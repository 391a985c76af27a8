//! `gpuval-agent k8s`: the agent as the operator runs it, one pod per GPU node.
//!
//! The pod's environment says which validation run and node this is (see
//! [`gpuval_crds::agent_env`]). The agent reads the `GpuValidation`, runs its checks on this
//! node, and stores the report in the `GpuNodeResult` the operator created for this pod (bound
//! to it: [`gpuval_crds::binding`]; agents never create results): first the report's labels and
//! annotations (a merge patch, which never creates), then the status subresource with
//! server-side apply (the whole [`gpuval_crds::NodeReport`]). A GPU failure is a verdict, not a
//! crash: the agent exits 0 once the result is stored, whatever it says.
//!
//! Once the checks end, the report is kept in memory and in `GPUVAL_STATE_DIR` (see
//! [`crate::saved_result`]) and stored with retries, backoff and jitter until the run's
//! deadline ([`crate::api_retry`]): an API server that restarts or a network that drops for a
//! while delays the result, it does not lose it. Before each try the agent reads the
//! validation again and writes nothing once it has moved on (a stale writer never overwrites a
//! newer run's result). A result the operator has not created yet is waited for, up to
//! [`RESULT_CREATE_WAIT`]; one bound to another pod or closed is refused by the admission policy
//! with its reason, which the agent reports.
//!
//! Exit codes: 0 result stored, or nothing to do (the validation is gone or has moved on to a
//! newer generation: the operator replaces stale pods); 1 the result could not be stored
//! (the reason also goes to `/dev/termination-log`); 2 bad environment; 143 stopped by
//! SIGTERM/SIGINT (checks stopped, GPUs freed, no result).
//!
//! By step: the pod's environment (`env.rs`), the flow itself here (read the validation, run or
//! take the saved result, stay for the fabric, store), the steps between (`steps.rs`), and the
//! result object and its storing (`result.rs`).

mod env;
mod result;
mod steps;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpuval_crds::Verdict;
use gpuval_crds::result::result_name;
use kube::Client;
use tokio::sync::watch;

pub use crate::api_retry::is_transient;
use crate::api_retry::seed_of;
use crate::render;

pub use self::env::{AgentEnv, EnvError, result_delay};
use self::result::store_until;
pub use self::result::{
    RESULT_CREATE_WAIT, StoreError, field_manager, report_meta, report_metadata, status_patch,
    summary,
};
use self::steps::{read_validation, run_deadline, saved_or_run, stay_for_fabric};

/// The longest pause between two tries to store the result (while the API server is away).
pub const MAX_STORE_BACKOFF: Duration = Duration::from_secs(8);
/// How long the agent keeps trying to read its validation at start.
pub const START_READ_BUDGET: Duration = Duration::from_secs(600);
/// Where Kubernetes takes a failed container's message from (its `terminationMessagePath`).
const TERMINATION_LOG: &str = "/dev/termination-log";

/// Exit code after SIGTERM/SIGINT (128 + SIGTERM), as a shell reports it.
pub const EXIT_TERMINATED: u8 = 143;

/// How a `k8s` run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The result is stored (whatever the verdict).
    Stored(Verdict),
    /// Nothing to do: the validation is gone or this pod was made for another generation.
    Stale(String),
    /// Could not reach or use the API before the checks (configuration, credentials).
    NoClient(String),
    /// The checks ran (or could not) but their result could not be stored.
    NotStored(String),
    /// SIGTERM or SIGINT: checks stopped, no result written.
    Terminated,
}

impl Outcome {
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Stored(_) | Outcome::Stale(_) => 0,
            Outcome::NotStored(_) => 1,
            Outcome::NoClient(_) => 2,
            Outcome::Terminated => EXIT_TERMINATED,
        }
    }
}

/// Runs the whole flow: read the validation, run the checks, store the result. SIGTERM and
/// SIGINT stop it at any point; during the checks, the agent first waits until they have
/// stopped and freed the GPUs.
pub async fn run(env: AgentEnv) -> Outcome {
    let stop = Arc::new(AtomicBool::new(false));
    let signalled = match watch_signals(stop.clone()) {
        Ok(rx) => rx,
        Err(e) => return Outcome::NoClient(format!("install signal handlers: {e}")),
    };
    let outcome = flow(env, stop, signalled).await;
    if let Outcome::NotStored(why) | Outcome::NoClient(why) = &outcome {
        termination_message(why);
    }
    outcome
}

/// Leaves `why` where Kubernetes reads a failed container's message from, when the container
/// has that file (a pod does; a process run by hand does not).
fn termination_message(why: &str) {
    let path = std::path::Path::new(TERMINATION_LOG);
    if path.exists()
        && let Err(e) = std::fs::write(path, why)
    {
        tracing::debug!(error = %e, "could not write the termination message");
    }
}

/// Sets `stop` and flips the returned channel on the first SIGTERM or SIGINT.
fn watch_signals(stop: Arc<AtomicBool>) -> std::io::Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::warn!(
            signal = which,
            "stopping: the checks are told to stop, no result is written"
        );
        stop.store(true, Ordering::SeqCst);
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// Resolves once a signal has arrived (never, if the signal task ended without one).
async fn signalled(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn flow(env: AgentEnv, stop: Arc<AtomicBool>, mut sig: watch::Receiver<bool>) -> Outcome {
    tracing::info!(
        validation = %env.validation,
        generation = env.generation,
        node = %env.node,
        pod = %env.pod_name,
        namespace = %env.namespace,
        "gpuval agent starting"
    );
    let client = tokio::select! {
        c = Client::try_default() => match c {
            Ok(c) => c,
            Err(e) => return Outcome::NoClient(format!("kubernetes client: {e}")),
        },
        () = signalled(&mut sig) => return Outcome::Terminated,
    };
    let validation = tokio::select! {
        v = read_validation(&client, &env) => match v {
            Ok(v) => v,
            Err(outcome) => return outcome,
        },
        () = signalled(&mut sig) => return Outcome::Terminated,
    };
    let report = match saved_or_run(&env, &validation, stop.clone(), &mut sig).await {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    print!("{}", render::table(&report));

    let name = result_name(&env.validation, &env.node);
    let delay = result_delay(env.result_jitter, seed_of(&env.pod_name));
    if !delay.is_zero() {
        tracing::info!(
            delay_ms = delay.as_millis() as u64,
            "spreading the result write"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = signalled(&mut sig) => return Outcome::Terminated,
        }
    }
    let deadline = run_deadline(&validation);
    let stored = tokio::select! {
        r = store_until(client.clone(), &env, &report, deadline) => r,
        () = signalled(&mut sig) => return Outcome::Terminated,
    };
    match stored {
        Ok(()) => {}
        Err(StoreError::Stale(why)) => {
            tracing::info!(reason = %why, "the run moved on while the checks ran; no result written");
            return Outcome::Stale(why);
        }
        Err(e @ StoreError::NotCreated(_)) => return Outcome::NotStored(e.to_string()),
        Err(StoreError::Api(e)) => {
            return Outcome::NotStored(format!(
                "could not store GpuNodeResult {}/{name} (transient errors are retried until the run's deadline): {e}",
                env.namespace
            ));
        }
    }
    tracing::info!(result = %name, namespace = %env.namespace, verdict = %report.verdict, "result stored");
    tokio::select! {
        () = stay_for_fabric(client, &env, &validation, &report, name) => {}
        () = signalled(&mut sig) => return Outcome::Terminated,
    }
    Outcome::Stored(report.verdict)
}

#[cfg(test)]
mod tests;
