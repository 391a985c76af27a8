//! The pod's environment: which validation run, node and pod this is, read and checked once.

use std::path::PathBuf;
use std::time::Duration;

use gpuval_crds::agent_env;
use gpuval_crds::facts::CountSource;

use crate::backend::BackendChoice;
use crate::backend::sim::SimSpec;

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
    /// The GPUs the pod's DRA claim should give it (`GPUVAL_DRA_GPU_UUIDS`); None off DRA.
    pub dra_gpu_uuids: Option<Vec<String>>,
    /// `GPUVAL_ALLOW_SHARED_GPUS=true`: the administrator allows processes that are not the
    /// agent's on the GPUs (a Warn, not a Fail).
    pub allow_shared_gpus: bool,
    /// The validation's fabric rendezvous key (`GPUVAL_FABRIC_KEY_FILE`: the operator mounts
    /// its Secret there in fabric agent pods); None when the pod names none.
    pub fabric_key_file: Option<PathBuf>,
    /// Each GPU's baseline from its own earlier runs (`GPUVAL_BASELINES`, JSON); None when
    /// the pod names none.
    pub baselines: Option<gpuval_crds::baseline::Baselines>,
    /// The kubelet's PodResources socket (`GPUVAL_POD_RESOURCES_SOCKET`), where mounted.
    pub pod_resources_socket: Option<PathBuf>,
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

        let backend = backend_choice(&get)?;

        let optional = |name: &str| {
            get(name)
                .map(|d| d.trim().to_string())
                .filter(|d| !d.is_empty())
        };
        let io_dir = optional(agent_env::IO_DIR).map(PathBuf::from);
        let state_dir = optional(agent_env::STATE_DIR).map(PathBuf::from);
        let pod_uid = optional(agent_env::POD_UID);
        let fabric_key_file = optional(agent_env::FABRIC_KEY_FILE).map(PathBuf::from);
        let pod_resources_socket = optional(agent_env::POD_RESOURCES_SOCKET).map(PathBuf::from);
        let allow_shared_gpus = optional(agent_env::ALLOW_SHARED_GPUS)
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");

        let baselines = optional(agent_env::BASELINES)
            .map(|v| {
                serde_json::from_str(&v).map_err(|e| EnvError::Invalid {
                    name: agent_env::BASELINES,
                    value: v.clone(),
                    why: format!("not the operator's baselines JSON: {e}"),
                })
            })
            .transpose()?;
        let result_jitter = result_jitter(&get)?;
        let expected_gpus = expected_gpus(&get)?;
        let dra_gpu_uuids = dra_gpu_uuids(&get);

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
            dra_gpu_uuids,
            allow_shared_gpus,
            fabric_key_file,
            baselines,
            pod_resources_socket,
        })
    }
}

/// The backend `GPUVAL_SIMULATE` (a simulated spec string, tests and demos only) or
/// `GPUVAL_BACKEND` (`cuda`, the default, or `simulated`) asks for.
pub(super) fn backend_choice(
    get: impl Fn(&str) -> Option<String>,
) -> Result<BackendChoice, EnvError> {
    let invalid = |name: &'static str, value: &str, why: &str| EnvError::Invalid {
        name,
        value: value.to_string(),
        why: why.to_string(),
    };
    let simulate = get(agent_env::SIMULATE).filter(|s| !s.trim().is_empty());
    let backend_name = get(agent_env::BACKEND).filter(|s| !s.trim().is_empty());
    Ok(match (backend_name.as_deref().map(str::trim), simulate) {
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
        (Some(b), None) => return Err(invalid(agent_env::BACKEND, b, "use cuda or simulated")),
    })
}

/// `GPUVAL_EXPECTED_GPUS` (a count from 1) and `GPUVAL_EXPECTED_GPUS_FROM` (`Spec`,
/// `Capacity` or `Label`; default `Capacity`), both optional.
pub(super) fn expected_gpus(
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

/// `GPUVAL_DRA_GPU_UUIDS`: comma-separated GPU UUIDs (blanks dropped); None when unset or
/// empty.
pub(super) fn dra_gpu_uuids(get: impl Fn(&str) -> Option<String>) -> Option<Vec<String>> {
    let list: Vec<String> = get(agent_env::DRA_GPU_UUIDS)?
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect();
    (!list.is_empty()).then_some(list)
}

/// `GPUVAL_RESULT_JITTER_MS` (milliseconds, optional): the longest delay before the result
/// is written.
pub(super) fn result_jitter(get: impl Fn(&str) -> Option<String>) -> Result<Duration, EnvError> {
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
pub(super) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A lower-case DNS-1123 subdomain (object and node names).
pub(super) fn check_dns_subdomain(s: &str) -> Result<(), &'static str> {
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
