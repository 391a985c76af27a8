//! `gpuval-agent k8s`: the agent as the operator runs it, one pod per GPU node.
//!
//! The pod's environment says which validation run and node this is (see
//! [`gpuval_crds::agent_env`]). The agent reads the `GpuValidation`, runs its checks on this
//! node, and stores the report as a `GpuNodeResult` with server-side apply: first the object
//! (labels, summary annotation, owner reference, spec), then the status subresource (the whole
//! [`NodeReport`]). A GPU failure is a verdict, not a crash: the agent exits 0 once the result
//! is stored, whatever it says.
//!
//! Once the checks end, the report is kept in memory and in `GPUVAL_STATE_DIR` (see
//! [`crate::saved_result`]) and stored with retries, backoff and jitter until the run's
//! deadline ([`crate::api_retry`]): an API server that restarts or a network that drops for a
//! while delays the result, it does not lose it. Before each try the agent reads the
//! validation again and writes nothing once it has moved on (a stale writer never overwrites a
//! newer run's result). The result names the pod that wrote it (`gpuval.io/pod-uid`), so the
//! operator can ignore results that are not its current pod's.
//!
//! Exit codes: 0 result stored, or nothing to do (the validation is gone or has moved on to a
//! newer generation: the operator replaces stale pods); 1 the result could not be stored
//! (the reason also goes to `/dev/termination-log`); 2 bad environment; 143 stopped by
//! SIGTERM/SIGINT (checks stopped, GPUs freed, no result).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuval_crds::facts::CountSource;
use gpuval_crds::result::result_name;
use gpuval_crds::{
    Action, GpuNodeResult, GpuNodeResultSpec, GpuValidation, NodeReport, Verdict, agent_env, labels,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource};
use tokio::sync::watch;

pub use crate::api_retry::is_transient;
use crate::api_retry::{Backoff, Budget, FIRST_BACKOFF, seed_of};
use crate::backend::sim::SimSpec;
use crate::backend::{self, BackendChoice, BackendError};
use crate::runner::{self, Plan};
use crate::saved_result::{self, SavedResult};
use crate::{render, report};

/// The longest pause between two tries to store the result (while the API server is away).
pub const MAX_STORE_BACKOFF: Duration = Duration::from_secs(8);
/// How long the agent keeps trying to read its validation at start.
pub const START_READ_BUDGET: Duration = Duration::from_secs(600);
/// Where Kubernetes takes a failed container's message from (its `terminationMessagePath`).
const TERMINATION_LOG: &str = "/dev/termination-log";

/// Exit code after SIGTERM/SIGINT (128 + SIGTERM), as a shell reports it.
pub const EXIT_TERMINATED: u8 = 143;

/// A missing or unusable environment variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("environment variable {0} is not set (the operator sets it on the agent pod)")]
    Missing(&'static str),
    #[error("environment variable {name}={value:?} is invalid: {why}")]
    Invalid {
        name: &'static str,
        value: String,
        why: String,
    },
}

impl EnvError {
    /// The variable this error is about.
    pub fn variable(&self) -> &'static str {
        match self {
            EnvError::Missing(name) | EnvError::Invalid { name, .. } => name,
        }
    }
}

/// The agent pod's assignment, from its environment.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentEnv {
    pub validation: String,
    pub generation: i64,
    pub validation_uid: String,
    pub node: String,
    pub namespace: String,
    pub pod_name: String,
    /// `POD_UID` (downward API), written on the result; None when the pod does not set it.
    pub pod_uid: Option<String>,
    pub backend: BackendChoice,
    /// Where the io check writes (`GPUVAL_IO_DIR`: the operator mounts the admin's host path
    /// there); None when the admin set none.
    pub io_dir: Option<PathBuf>,
    /// The longest random delay before the result is written (`GPUVAL_RESULT_JITTER_MS`);
    /// zero when unset.
    pub result_jitter: Duration,
    /// Where the result is kept until stored (`GPUVAL_STATE_DIR`); None: in memory only.
    pub state_dir: Option<PathBuf>,
    /// The GPU count the operator found for this node and where it came from
    /// (`GPUVAL_EXPECTED_GPUS`, `GPUVAL_EXPECTED_GPUS_FROM`).
    pub expected_gpus: Option<(i32, CountSource)>,
    /// `GPUVAL_ALLOW_SHARED_GPUS=true`: the administrator allows processes that are not the
    /// agent's on the GPUs (a Warn, not a Fail).
    pub allow_shared_gpus: bool,
}

impl AgentEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, EnvError> {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the variables through `get` (the environment, or a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let required = |name: &'static str| -> Result<String, EnvError> {
            match get(name) {
                Some(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
                _ => Err(EnvError::Missing(name)),
            }
        };
        let invalid = |name: &'static str, value: &str, why: &str| EnvError::Invalid {
            name,
            value: value.to_string(),
            why: why.to_string(),
        };
        let object_name = |name: &'static str| -> Result<String, EnvError> {
            let v = required(name)?;
            check_dns_subdomain(&v).map_err(|why| invalid(name, &v, why))?;
            Ok(v)
        };

        let validation = object_name(agent_env::VALIDATION)?;
        let generation_text = required(agent_env::GENERATION)?;
        let generation = match generation_text.parse::<i64>() {
            Ok(g) if g >= 1 => g,
            Ok(_) => {
                return Err(invalid(
                    agent_env::GENERATION,
                    &generation_text,
                    "a generation is a whole number of at least 1",
                ));
            }
            Err(_) => {
                return Err(invalid(
                    agent_env::GENERATION,
                    &generation_text,
                    "not a whole number",
                ));
            }
        };
        let validation_uid = required(agent_env::VALIDATION_UID)?;
        let node = object_name(agent_env::NODE_NAME)?;
        let namespace = required(agent_env::POD_NAMESPACE)?;
        if namespace.len() > 63
            || check_dns_subdomain(&namespace).is_err()
            || namespace.contains('.')
        {
            return Err(invalid(
                agent_env::POD_NAMESPACE,
                &namespace,
                "not a namespace name (lower-case letters, digits and '-', at most 63)",
            ));
        }
        let pod_name = object_name(agent_env::POD_NAME)?;

        let simulate = get(agent_env::SIMULATE).filter(|s| !s.trim().is_empty());
        let backend_name = get(agent_env::BACKEND).filter(|s| !s.trim().is_empty());
        let backend = match (backend_name.as_deref().map(str::trim), simulate) {
            (_, Some(spec)) => {
                let parsed: SimSpec = spec
                    .parse()
                    .map_err(|e| invalid(agent_env::SIMULATE, &spec, &format!("{e}")))?;
                BackendChoice::Simulated(parsed)
            }
            (None, None) => BackendChoice::Cuda,
            (Some(b), None) if b.eq_ignore_ascii_case("cuda") => BackendChoice::Cuda,
            (Some(b), None) if b.eq_ignore_ascii_case("simulated") => {
                BackendChoice::Simulated(SimSpec::default())
            }
            (Some(b), None) => {
                return Err(invalid(agent_env::BACKEND, b, "use cuda or simulated"));
            }
        };

        let optional = |name: &str| {
            get(name)
                .map(|d| d.trim().to_string())
                .filter(|d| !d.is_empty())
        };
        let io_dir = optional(agent_env::IO_DIR).map(PathBuf::from);
        let state_dir = optional(agent_env::STATE_DIR).map(PathBuf::from);
        let pod_uid = optional(agent_env::POD_UID);
        let allow_shared_gpus = optional(agent_env::ALLOW_SHARED_GPUS)
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");

        let result_jitter = result_jitter(&get)?;
        let expected_gpus = expected_gpus(&get)?;

        Ok(Self {
            validation,
            generation,
            validation_uid,
            node,
            namespace,
            pod_name,
            pod_uid,
            backend,
            io_dir,
            result_jitter,
            state_dir,
            expected_gpus,
            allow_shared_gpus,
        })
    }
}

/// `GPUVAL_EXPECTED_GPUS` (a count from 1) and `GPUVAL_EXPECTED_GPUS_FROM` (`Spec`,
/// `Capacity` or `Label`; default `Capacity`), both optional.
fn expected_gpus(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<(i32, CountSource)>, EnvError> {
    let name = agent_env::EXPECTED_GPUS;
    let Some(text) = get(name).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let invalid = |name: &'static str, value: &str, why: &str| EnvError::Invalid {
        name,
        value: value.to_string(),
        why: why.to_string(),
    };
    let count = match text.trim().parse::<i32>() {
        Ok(n) if n >= 1 => n,
        _ => {
            return Err(invalid(
                name,
                &text,
                "a GPU count is a whole number of at least 1",
            ));
        }
    };
    let from = match get(agent_env::EXPECTED_GPUS_FROM).filter(|v| !v.trim().is_empty()) {
        None => CountSource::Capacity,
        Some(f) => CountSource::parse(f.trim()).ok_or_else(|| {
            invalid(
                agent_env::EXPECTED_GPUS_FROM,
                &f,
                "use Spec, Capacity or Label",
            )
        })?,
    };
    Ok(Some((count, from)))
}

/// `GPUVAL_RESULT_JITTER_MS` (milliseconds, optional): the longest delay before the result
/// is written.
fn result_jitter(get: impl Fn(&str) -> Option<String>) -> Result<Duration, EnvError> {
    let name = agent_env::RESULT_JITTER_MS;
    let Some(text) = get(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
    else {
        return Ok(Duration::ZERO);
    };
    text.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| EnvError::Invalid {
            name,
            value: text.clone(),
            why: "not a whole number of milliseconds".to_string(),
        })
}

/// How long to wait before writing the result: uniform in `[0, max]`, drawn from `seed`
/// (the shell seeds it with the pod's name, so agents that finish together spread their
/// writes, and a restarted pod waits as long as before).
pub fn result_delay(max: Duration, seed: u64) -> Duration {
    let Ok(max_ms) = u64::try_from(max.as_millis()) else {
        return max;
    };
    if max_ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(mix(seed) % (max_ms + 1))
}

/// The splitmix64 finaliser: neighbouring seeds give unrelated values.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A lower-case DNS-1123 subdomain (object and node names).
fn check_dns_subdomain(s: &str) -> Result<(), &'static str> {
    if s.len() > 253 {
        return Err("longer than 253 characters");
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("not a lower-case DNS-1123 name (letters, digits, '-' and '.')")
    }
}

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
        Err(StoreError::Api(e)) => {
            return Outcome::NotStored(format!(
                "could not store GpuNodeResult {}/{name} before the run's deadline: {e}",
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

/// Reads the validation (retrying while the API server is away, for up to
/// [`START_READ_BUDGET`]); an outcome instead when there is nothing to do or no way to read it.
async fn read_validation(client: &Client, env: &AgentEnv) -> Result<GpuValidation, Outcome> {
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
fn saved_identity(env: &AgentEnv, report: NodeReport) -> SavedResult {
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
async fn saved_or_run(
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
async fn stay_for_fabric(
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
    let left =
        crate::fabric::rounds::take_part(&member, spec, nccl, run_deadline(validation)).await;
    tracing::info!(?left, "left the fabric test");
}

/// When the run's deadline passes, as an instant of this process (from the validation's start
/// time, or from now when it has none).
fn run_deadline(validation: &GpuValidation) -> std::time::Instant {
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
fn start_checks(
    env: &AgentEnv,
    validation: &GpuValidation,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<NodeReport> {
    let mut plan = Plan::from_spec(&validation.spec);
    plan.expected_gpus = env.expected_gpus;
    plan.node = Some(env.node.clone());
    plan.io_dir = env.io_dir.clone();
    plan.allow_shared_gpus = env.allow_shared_gpus;
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
fn backend_error_report(plan: &Plan, choice: &BackendChoice, e: &BackendError) -> NodeReport {
    let kind = match choice {
        BackendChoice::Cuda => backend::BackendKind::Cuda,
        BackendChoice::Simulated(_) => backend::BackendKind::Simulated,
    };
    report::could_not_run(
        report::started(kind, plan.node.clone()),
        crate::judge::error_reason_in("GPU backend", e),
    )
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
async fn store_until(
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
async fn store(client: Client, env: &AgentEnv, report: &NodeReport) -> Result<(), StoreError> {
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn base_env() -> HashMap<&'static str, String> {
        HashMap::from([
            (agent_env::VALIDATION, "quick".to_string()),
            (agent_env::GENERATION, "3".to_string()),
            (agent_env::VALIDATION_UID, "0b9a-uid".to_string()),
            (agent_env::NODE_NAME, "gpu-node-1".to_string()),
            (agent_env::POD_NAMESPACE, "gpuval-system".to_string()),
            (agent_env::POD_NAME, "quick-gpu-node-1-abcde".to_string()),
            (agent_env::POD_UID, "pod-uid-7".to_string()),
        ])
    }

    fn parse(vars: &HashMap<&'static str, String>) -> Result<AgentEnv, EnvError> {
        AgentEnv::from_lookup(|k| vars.get(k).cloned())
    }

    fn env() -> AgentEnv {
        parse(&base_env()).expect("base env parses")
    }

    #[test]
    fn complete_env_parses_with_cuda_by_default() {
        let e = env();
        assert_eq!(e.validation, "quick");
        assert_eq!(e.generation, 3);
        assert_eq!(e.node, "gpu-node-1");
        assert_eq!(e.namespace, "gpuval-system");
        assert_eq!(e.backend, BackendChoice::Cuda);
        assert_eq!(e.io_dir, None);
        assert_eq!(e.pod_uid.as_deref(), Some("pod-uid-7"));
        assert_eq!(e.state_dir, None);
        let mut vars = base_env();
        vars.remove(agent_env::POD_UID);
        vars.insert(agent_env::STATE_DIR, "/var/lib/gpuval-agent".to_string());
        let e = parse(&vars).expect("POD_UID is optional");
        assert_eq!(e.pod_uid, None);
        assert_eq!(e.state_dir, Some(PathBuf::from("/var/lib/gpuval-agent")));
    }

    #[test]
    fn io_dir_comes_from_the_environment() {
        let mut vars = base_env();
        vars.insert(agent_env::IO_DIR, "/var/lib/gpuval-io".to_string());
        assert_eq!(
            parse(&vars).unwrap().io_dir,
            Some(PathBuf::from("/var/lib/gpuval-io"))
        );
        vars.insert(agent_env::IO_DIR, "  ".to_string());
        assert_eq!(parse(&vars).unwrap().io_dir, None);
    }

    #[test]
    fn the_result_jitter_is_optional_and_a_bad_one_is_named() {
        let mut vars = base_env();
        assert_eq!(parse(&vars).unwrap().result_jitter, Duration::ZERO);
        vars.insert(agent_env::RESULT_JITTER_MS, "2500".to_string());
        assert_eq!(
            parse(&vars).unwrap().result_jitter,
            Duration::from_millis(2500)
        );
        vars.insert(agent_env::RESULT_JITTER_MS, "2s".to_string());
        let err = parse(&vars).expect_err("milliseconds only");
        assert_eq!(err.variable(), agent_env::RESULT_JITTER_MS);
    }

    #[test]
    fn result_delays_stay_within_the_bound_spread_out_and_repeat_per_seed() {
        let max = Duration::from_secs(10);
        assert_eq!(result_delay(Duration::ZERO, 42), Duration::ZERO);
        let delays: Vec<Duration> = (0..1000)
            .map(|i| result_delay(max, seed_of(&format!("gpuval-quick-node-{i}"))))
            .collect();
        assert!(delays.iter().all(|d| *d <= max));
        let first_half = delays.iter().filter(|d| **d < max / 2).count();
        assert!(
            (400..=600).contains(&first_half),
            "about half wait less than half the bound: {first_half}"
        );
        let buckets: std::collections::BTreeSet<u128> =
            delays.iter().map(|d| d.as_millis() / 1000).collect();
        assert_eq!(buckets.len(), 10, "every second of the window is used");
        assert_eq!(result_delay(max, 7), result_delay(max, 7));
    }

    #[test]
    fn every_missing_variable_is_named() {
        for name in [
            agent_env::VALIDATION,
            agent_env::GENERATION,
            agent_env::VALIDATION_UID,
            agent_env::NODE_NAME,
            agent_env::POD_NAMESPACE,
            agent_env::POD_NAME,
        ] {
            for value in [None, Some("  ")] {
                let mut vars = base_env();
                match value {
                    None => vars.remove(name),
                    Some(v) => vars.insert(name, v.to_string()),
                };
                let err = parse(&vars).expect_err(name);
                assert_eq!(err, EnvError::Missing(name));
                let text = err.to_string();
                assert!(text.contains(name), "{text}");
                assert!(!text.contains('\n'), "one line: {text}");
            }
        }
    }

    #[test]
    fn invalid_values_are_named_with_the_reason() {
        let cases = [
            (agent_env::GENERATION, "three", "not a whole number"),
            (agent_env::GENERATION, "0", "at least 1"),
            (agent_env::NODE_NAME, "GPU_Node", "DNS-1123"),
            (agent_env::VALIDATION, "a..b", "DNS-1123"),
            (agent_env::POD_NAMESPACE, "gpuval.system", "namespace"),
            (agent_env::BACKEND, "rocm", "cuda or simulated"),
            (agent_env::SIMULATE, "gpus=lots", ""),
        ];
        for (name, value, why) in cases {
            let mut vars = base_env();
            vars.insert(name, value.to_string());
            let err = parse(&vars).expect_err(name);
            assert_eq!(err.variable(), name);
            let text = err.to_string();
            assert!(
                text.contains(name) && text.contains(value) && text.contains(why),
                "{text}"
            );
        }
    }

    #[test]
    fn simulate_implies_the_simulated_backend() {
        let mut vars = base_env();
        vars.insert(agent_env::SIMULATE, "gpus=2,fail=memory@1".to_string());
        let e = parse(&vars).expect("parses");
        let BackendChoice::Simulated(spec) = e.backend else {
            panic!("expected simulated, got {:?}", e.backend);
        };
        assert_eq!(spec.gpus, 2);

        let mut vars = base_env();
        vars.insert(agent_env::BACKEND, "Simulated".to_string());
        assert_eq!(
            parse(&vars).expect("parses").backend,
            BackendChoice::Simulated(SimSpec::default())
        );
        vars.insert(agent_env::BACKEND, "cuda".to_string());
        assert_eq!(parse(&vars).expect("parses").backend, BackendChoice::Cuda);
    }

    fn report(verdict: Verdict, failures: &[&str]) -> NodeReport {
        NodeReport {
            simulated: true,
            backend: "simulated".into(),
            agent_version: "0.1.0".into(),
            node: Some("gpu-node-1".into()),
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: "2026-01-01T00:01:00Z".into(),
            verdict,
            failures: failures
                .iter()
                .map(|s| gpuval_crds::Reason::new(gpuval_crds::Code::Unclassified, *s))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn labels_and_summary() {
        let e = env();
        let l = result_labels(&e, Verdict::Fail, Action::ResetGpu);
        assert_eq!(l["gpuval.io/validation"], "quick");
        assert_eq!(l["gpuval.io/node"], "gpu-node-1");
        assert_eq!(l["gpuval.io/generation"], "3");
        assert_eq!(l["gpuval.io/verdict"], "Fail");
        assert_eq!(l["app.kubernetes.io/managed-by"], "gpuval-operator");
        assert_eq!(l["gpuval.io/action"], "ResetGpu");
        assert_eq!(l.len(), 6);

        assert_eq!(
            summary(&report(Verdict::Fail, &["GPU3: memory", "GPU5: slow"])),
            "GPU3: memory; GPU5: slow"
        );
        let passed = report(Verdict::Pass, &[]);
        assert_eq!(summary(&passed), crate::render::headline(&passed));
        assert!(summary(&passed).ends_with("no GPUs"));
        for v in [Verdict::Pass, Verdict::Warn, Verdict::Error] {
            assert_eq!(
                result_labels(&e, v, Action::None)["gpuval.io/verdict"],
                v.as_str()
            );
        }
    }

    #[test]
    fn long_node_names_are_hashed_in_labels_and_kept_in_spec() {
        let mut vars = base_env();
        let node = format!("{}gpu", "rack-17.row-4.hall-b.datacenter-west.".repeat(3));
        assert!(node.len() > 63);
        vars.insert(agent_env::NODE_NAME, node.clone());
        let e = parse(&vars).expect("a long node name is valid");
        let r = report(Verdict::Pass, &[]);
        let obj = result_object(&e, &r);
        let label = &obj.metadata.labels.as_ref().expect("labels")["gpuval.io/node"];
        assert!(label.len() <= 63, "{label}");
        assert_eq!(label, &labels::node_value(&node));
        assert_ne!(label, &node);
        assert_eq!(obj.spec.node_name, node);
        assert_eq!(
            obj.metadata.name.as_deref(),
            Some(result_name("quick", &node).as_str())
        );
        let fm = field_manager(&node);
        assert!(fm.len() <= 128, "field managers are at most 128 characters");
        assert_eq!(fm, format!("gpuval-agent/{label}"));
        assert_eq!(field_manager("gpu-node-1"), "gpuval-agent/gpu-node-1");
    }

    #[test]
    fn result_object_json_shape() {
        let e = env();
        let r = report(Verdict::Fail, &["GPU3: memory: 12 mismatched words"]);
        let v = serde_json::to_value(result_object(&e, &r)).expect("serialises");
        let expected = serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1",
            "kind": "GpuNodeResult",
            "metadata": {
                "name": "quick-gpu-node-1",
                "namespace": "gpuval-system",
                "labels": {
                    "app.kubernetes.io/managed-by": "gpuval-operator",
                    "gpuval.io/generation": "3",
                    "gpuval.io/node": "gpu-node-1",
                    "gpuval.io/validation": "quick",
                    "gpuval.io/verdict": "Fail",
                    "gpuval.io/action": "None",
                    "gpuval.io/simulated": "true",
                },
                "annotations": {
                    "gpuval.io/summary": "GPU3: memory: 12 mismatched words",
                    "gpuval.io/node": "gpu-node-1",
                    "gpuval.io/codes": "Unclassified",
                    "gpuval.io/pod": "quick-gpu-node-1-abcde",
                    "gpuval.io/pod-uid": "pod-uid-7",
                },
                "ownerReferences": [{
                    "apiVersion": "gpuval.io/v1alpha1",
                    "kind": "GpuValidation",
                    "name": "quick",
                    "uid": "0b9a-uid",
                    "controller": false,
                    "blockOwnerDeletion": false,
                }],
            },
            "spec": {"validation": "quick", "generation": 3, "nodeName": "gpu-node-1"},
        });
        assert_eq!(v, expected);

        let s = status_patch(&r);
        assert_eq!(s["apiVersion"], "gpuval.io/v1alpha1");
        assert_eq!(s["kind"], "GpuNodeResult");
        assert_eq!(s["status"]["verdict"], "Fail");
        assert_eq!(s["status"]["simulated"], true);
        assert_eq!(s.as_object().map(|o| o.len()), Some(3));
    }

    fn validation(uid: &str, generation: i64) -> GpuValidation {
        let mut v = GpuValidation::new(
            "quick",
            serde_json::from_value(serde_json::json!({"checks": {"memory": {}}})).expect("spec"),
        );
        v.metadata.uid = Some(uid.into());
        v.metadata.generation = Some(generation);
        v
    }

    #[test]
    fn stale_pods_are_recognised() {
        let e = env();
        assert_eq!(stale_reason(&e, &validation("0b9a-uid", 3)), None);
        let newer = stale_reason(&e, &validation("0b9a-uid", 4)).expect("stale");
        assert!(newer.contains("generation 4"), "{newer}");
        let recreated = stale_reason(&e, &validation("other-uid", 3)).expect("stale");
        assert!(recreated.contains("recreated"), "{recreated}");
    }

    #[test]
    fn exit_codes() {
        assert_eq!(Outcome::Stored(Verdict::Fail).exit_code(), 0);
        assert_eq!(Outcome::Stale(String::new()).exit_code(), 0);
        assert_eq!(Outcome::NotStored(String::new()).exit_code(), 1);
        assert_eq!(Outcome::NoClient(String::new()).exit_code(), 2);
        assert_eq!(Outcome::Terminated.exit_code(), 143);
    }

    #[test]
    fn transient_errors() {
        let status = |code| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(is_transient(&status(503)));
        assert!(is_transient(&status(429)));
        assert!(!is_transient(&status(404)));
        assert!(!is_transient(&status(422)));
        assert!(!is_transient(&status(403)));
    }
}
