//! Operator configuration (flags and environment; see `main.rs`). Validated once at start.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Toleration;

/// What the operator needs to build agent pods and run.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// Namespace of the agent pods and node results (the operator's own).
    pub namespace: String,
    pub agent_image: String,
    pub agent_image_pull_policy: Option<String>,
    pub agent_service_account: String,
    /// Tolerations added to every agent pod (GPU nodes are often tainted).
    pub tolerations: Vec<Toleration>,
    /// Host directory mounted into agent pods for the I/O check, if any. Must lie inside one of
    /// `io_allowed_paths`: the administrator decides where agents may write, never a validation.
    pub io_host_path: Option<PathBuf>,
    pub io_allowed_paths: Vec<PathBuf>,
    /// Run agents privileged (only where an administrator opts in).
    pub agent_privileged: bool,
    /// Extra environment for agent pods (for example GPUVAL_SIMULATE in demos and tests).
    pub agent_env: Vec<(String, String)>,
    /// Reconciles at once.
    pub concurrency: u16,
    /// Agent pods one reconcile creates at once.
    pub pod_create_concurrency: usize,
    /// Writes a second to the API server (pods, results, status); 0: no limit.
    pub api_qps: f64,
    /// Writes allowed at once above `api_qps` before the limit applies.
    pub api_burst: u32,
    /// Longest random delay an agent waits before it writes its result (spreads the writes of
    /// agents that finish together); zero: none.
    pub agent_result_jitter: std::time::Duration,
    /// A process that is not the agent's on a GPU under test is a Warn, not a Fail (the
    /// administrator shares GPUs on purpose): `GPUVAL_ALLOW_SHARED_GPUS` in agent pods.
    pub agent_allow_shared_gpus: bool,
    /// Agent pods mount the kubelet's PodResources socket (read-only) and run as uid 0 with no
    /// capabilities, so that a busy GPU's finding names the pods that hold it.
    pub agent_pod_resources: bool,
    /// The time schedules and admission decide with: the system clock, or one a test moves.
    pub clock: crate::settings::clock::Clock,
    /// What gives agent pods the fabric for `spec.fabric` (the administrator's, never a
    /// validation's).
    pub fabric: FabricPods,
    /// Test-only, no flag: results of the simulated backend act on Nodes (labels, the
    /// `GpuValidated` condition, taints) as real ones would, so that tests on kwok nodes can
    /// assert node actions. Off, a simulated result is never evidence about a node.
    pub simulated_acts_on_nodes: bool,
    /// Admission taint keys a schedule may name besides gpuval's own (`gpuval.io/...`): gpuval
    /// removes that taint from nodes that pass, so only the administrator may widen the list
    /// (Helm values `operator.admission.allowedTaintKeys`).
    pub admission_taint_keys: Vec<String>,
    /// How agent pods get their GPUs: the device plugin's extended resource, Dynamic Resource
    /// Allocation, or per node whichever it offers (`--gpu-allocation`).
    pub allocation: crate::settings::allocation_config::Allocation,
    /// Acceptance certificates written when a run ends.
    pub certificates: CertificateSettings,
    /// Two hardware failures of a node (or of one of its GPUs) within this window make it a
    /// repeat offender ([`crate::decide::node_marks`]); zero: not counted.
    pub repeat_failure_window: std::time::Duration,
    /// How long an agent pod may stay Pending (unscheduled, its image not pulled, its
    /// container not created) before its node's line ends as trouble that says what to fix,
    /// well before the run's deadline (`--agent-pending-limit`); None: only the deadline.
    pub agent_pending_limit: Option<std::time::Duration>,
    /// Who writes node taints: gpuval (`spec.onFailure: Taint`, admission), or the cluster's
    /// own controller reading the `GpuValidated` condition (`--node-taints=cluster`).
    pub node_taints: NodeTaints,
    /// The PriorityClass agent pods carry (`--agent-priority-class`; None: the cluster's
    /// default), so that the administrator decides whether tenants' work preempts them.
    pub agent_priority_class: Option<String>,
    /// After this many final lines in a row without hardware evidence (busy, infrastructure,
    /// configuration, no evidence), a node's `GpuValidated` turns `Unknown` with the reason and
    /// the time of its last hardware evidence (`--unknown-after-non-evidence`); 0: never (a
    /// node busy with its tenants' work is normal).
    pub unknown_after_non_evidence: u32,
}

/// Who writes node taints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodeTaints {
    /// gpuval: the `spec.onFailure` taint, admission's taint removal and failure taint.
    #[default]
    Gpuval,
    /// The cluster's own controller (the Node Readiness Controller, Cluster API
    /// MachineHealthCheck, medik8s NodeHealthCheck) reads the `GpuValidated` condition; gpuval
    /// writes conditions, labels and DRA device taints only, never a node taint.
    Cluster,
}

impl NodeTaints {
    /// `gpuval` or `cluster` (`--node-taints`).
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        match s.trim() {
            "gpuval" => Ok(NodeTaints::Gpuval),
            "cluster" => Ok(NodeTaints::Cluster),
            other => Err(ConfigError::NodeTaints(other.to_string())),
        }
    }

    /// True when gpuval may write node taints.
    pub fn by_gpuval(self) -> bool {
        self == NodeTaints::Gpuval
    }
}

/// The default limit on an agent pod's time Pending: ten minutes, well before any deadline
/// a burn-in allows and well after a healthy pull and schedule.
pub const AGENT_PENDING_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// The default repeat-offender window: a week.
pub const REPEAT_FAILURE_WINDOW: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 3600);

/// Where the certificate signing key is and how many certificates are kept.
#[derive(Debug, Clone, PartialEq)]
pub struct CertificateSettings {
    /// The Secret (in the operator namespace) holding the ed25519 key under `private.pem`:
    /// the administrator's, or generated on first use when absent.
    pub key_secret: String,
    /// Certificates kept per node (and per validation name), newest first; None: none written.
    pub retention: Option<usize>,
    /// Passing runs of a GPU its baseline is the median of (0: no baselines).
    pub baseline_runs: usize,
    /// How far below its own baseline a GPU's figure may fall before it is a Warn (fraction).
    pub baseline_tolerance: f64,
    /// Objects per page when the run's results and the certificates are listed.
    pub page: u32,
    /// How a run's certificates are tried again after an API error.
    pub retry: crate::services::certificate_retry::RetryPolicy,
}

impl Default for CertificateSettings {
    fn default() -> Self {
        Self {
            key_secret: "gpuval-certificate-key".into(),
            retention: Some(20),
            baseline_runs: gpuval_crds::baseline::DEFAULT_RUNS,
            baseline_tolerance: gpuval_crds::baseline::DEFAULT_TOLERANCE,
            page: crate::services::paged::PAGE,
            retry: crate::services::certificate_retry::RetryPolicy::default(),
        }
    }
}

/// Pod settings for validations with `spec.fabric`: host networking (RDMA NICs, no overlay),
/// extra device resources (`rdma/ib=1`) and capabilities (`IPC_LOCK` to pin RDMA memory).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FabricPods {
    pub host_network: bool,
    /// (resource name, quantity) requested and limited on the agent container.
    pub resources: Vec<(String, String)>,
    pub capabilities: Vec<String>,
    /// The first rendezvous port: group `id` of a round meets on `port + 2 * id` (its NCCL
    /// bootstrap one above); 0: [`gpuval_crds::fabric::RENDEZVOUS_PORT`].
    pub port: u16,
}

/// The capabilities a fabric test may add: pinning memory for RDMA, raw sockets for RoCE
/// tooling. Anything else is refused at start.
pub const FABRIC_CAPABILITIES: [&str; 2] = ["IPC_LOCK", "NET_RAW"];

/// Parses `--fabric-resource NAME=QUANTITY` (e.g. `rdma/ib=1`).
pub fn parse_resource(s: &str) -> Result<(String, String), ConfigError> {
    let (name, qty) = s
        .split_once('=')
        .ok_or_else(|| ConfigError::FabricResource(s.to_string()))?;
    let valid_name = name.contains('/')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._/".contains(c));
    let valid_qty = !qty.is_empty() && qty.chars().all(|c| c.is_ascii_digit());
    if !valid_name || !valid_qty || name.starts_with("nvidia.com/gpu") {
        return Err(ConfigError::FabricResource(s.to_string()));
    }
    Ok((name.to_string(), qty.to_string()))
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            namespace: "gpuval-system".into(),
            agent_image: "ghcr.io/gpuval/gpuval-agent:latest".into(),
            agent_image_pull_policy: None,
            agent_service_account: "gpuval-agent".into(),
            tolerations: Vec::new(),
            io_host_path: None,
            io_allowed_paths: Vec::new(),
            agent_privileged: false,
            agent_env: Vec::new(),
            concurrency: 8,
            pod_create_concurrency: 32,
            api_qps: 0.0,
            api_burst: 100,
            agent_result_jitter: std::time::Duration::ZERO,
            agent_allow_shared_gpus: false,
            agent_pod_resources: false,
            fabric: FabricPods::default(),
            clock: crate::settings::clock::Clock::system(),
            repeat_failure_window: REPEAT_FAILURE_WINDOW,
            agent_pending_limit: Some(AGENT_PENDING_LIMIT),
            node_taints: NodeTaints::Gpuval,
            agent_priority_class: None,
            unknown_after_non_evidence: 0,
            simulated_acts_on_nodes: false,
            admission_taint_keys: Vec::new(),
            allocation: crate::settings::allocation_config::Allocation::default(),
            certificates: CertificateSettings::default(),
        }
    }
}

impl OperatorConfig {
    /// True when the operator gives every agent the simulated backend (`GPUVAL_SIMULATE`, or
    /// `GPUVAL_BACKEND=simulated`, in its agent environment): none of their results is
    /// evidence about a real node.
    pub fn agents_simulated(&self) -> bool {
        use gpuval_crds::agent_env::{BACKEND, SIMULATE};
        self.agent_env.iter().any(|(k, v)| {
            (k == SIMULATE && !v.trim().is_empty())
                || (k == BACKEND && v.trim().eq_ignore_ascii_case("simulated"))
        })
    }
}

/// A configuration the operator refuses to start with.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "--io-host-path {path} is not inside any --io-allowed-path ({allowed}); add its parent to the allowlist or pick an allowed directory"
    )]
    IoPathNotAllowed { path: String, allowed: String },
    #[error("--io-host-path {0} must be an absolute path without `..`")]
    IoPathNotAbsolute(String),
    #[error("invalid toleration '{0}': write KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule")]
    Toleration(String),
    #[error("invalid --agent-env '{0}': write NAME=VALUE")]
    Env(String),
    #[error("--agent-image must not be empty")]
    NoImage,
    #[error(
        "invalid --fabric-resource '{0}': write DOMAIN/NAME=COUNT for a device resource such as rdma/ib=1 (GPUs are requested already)"
    )]
    FabricResource(String),
    #[error(
        "--fabric-capability {0} is not allowed: only IPC_LOCK and NET_RAW (use --agent-privileged where more is needed)"
    )]
    FabricCapability(String),
    #[error(
        "{flag} {value:?} is not a DNS subdomain (lowercase alphanumerics, '-' and '.', e.g. gpu.nvidia.com): name the DRA driver's device class and driver as its DeviceClass and ResourceSlices spell them"
    )]
    DraName { flag: &'static str, value: String },
    #[error(
        "invalid --node-taints {0:?}: write gpuval (gpuval taints failed nodes and untaints admitted ones) or cluster (the cluster's own controller, such as the Node Readiness Controller, taints nodes from the GpuValidated condition)"
    )]
    NodeTaints(String),
    #[error(
        "--agent-priority-class {0:?} is not a PriorityClass name (a DNS subdomain: lowercase alphanumerics, '-' and '.')"
    )]
    PriorityClass(String),
}

impl OperatorConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.agent_image.trim().is_empty() {
            return Err(ConfigError::NoImage);
        }
        if let Some(c) = self
            .fabric
            .capabilities
            .iter()
            .find(|c| !FABRIC_CAPABILITIES.contains(&c.as_str()))
        {
            return Err(ConfigError::FabricCapability(c.clone()));
        }
        let dra = &self.allocation;
        for (flag, value) in [
            ("--dra-device-class", &dra.device_class),
            ("--dra-driver", &dra.driver),
        ] {
            if !gpuval_crds::names::is_dns1123_subdomain(value) {
                return Err(ConfigError::DraName {
                    flag,
                    value: value.clone(),
                });
            }
        }
        if let Some(pc) = self
            .agent_priority_class
            .as_ref()
            .filter(|pc| !gpuval_crds::names::is_dns1123_subdomain(pc))
        {
            return Err(ConfigError::PriorityClass(pc.clone()));
        }
        if let Some(p) = &self.io_host_path {
            if !p.is_absolute()
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(ConfigError::IoPathNotAbsolute(p.display().to_string()));
            }
            if !self.io_allowed_paths.iter().any(|a| p.starts_with(a)) {
                return Err(ConfigError::IoPathNotAllowed {
                    path: p.display().to_string(),
                    allowed: self
                        .io_allowed_paths
                        .iter()
                        .map(|a| a.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        Ok(())
    }
}

/// Parses `KEY[=VALUE][:EFFECT]` into a toleration (operator Exists when no value).
pub fn parse_toleration(s: &str) -> Result<Toleration, ConfigError> {
    let (kv, effect) = match s.rsplit_once(':') {
        Some((kv, e)) if matches!(e, "NoSchedule" | "PreferNoSchedule" | "NoExecute") => {
            (kv, Some(e.to_string()))
        }
        Some(_) => return Err(ConfigError::Toleration(s.into())),
        None => (s, None),
    };
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(ConfigError::Toleration(s.into()));
    }
    Ok(Toleration {
        key: Some(key.into()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
        value,
        effect,
        toleration_seconds: None,
    })
}

/// Parses `NAME=VALUE`.
pub fn parse_env(s: &str) -> Result<(String, String), ConfigError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.into(), v.into())),
        _ => Err(ConfigError::Env(s.into())),
    }
}

/// True when `path` is inside one of `allowed`.
pub fn path_allowed(path: &Path, allowed: &[PathBuf]) -> bool {
    allowed.iter().any(|a| path.starts_with(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dra_names_must_be_dns_subdomains() {
        let mut c = OperatorConfig::default();
        assert!(c.validate().is_ok());
        c.allocation.device_class = "GPU Class".into();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--dra-device-class \"GPU Class\""), "{e}");
        c.allocation.device_class = "gpu.nvidia.com".into();
        c.allocation.driver = String::new();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("--dra-driver")
        );
    }

    #[test]
    fn io_path_must_be_in_the_allowlist() {
        let mut c = OperatorConfig {
            io_host_path: Some("/var/lib/gpuval/io".into()),
            ..Default::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::IoPathNotAllowed { .. })
        ));
        c.io_allowed_paths = vec!["/var/lib/gpuval".into()];
        c.validate().unwrap();
        c.io_host_path = Some("/var/lib/gpuval/../../etc".into());
        assert!(matches!(
            c.validate(),
            Err(ConfigError::IoPathNotAbsolute(_))
        ));
        c.io_host_path = Some("relative".into());
        assert!(c.validate().is_err());
    }

    #[test]
    fn tolerations_parse() {
        let t = parse_toleration("nvidia.com/gpu:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_deref(), t.operator.as_deref(), t.effect.as_deref()),
            (Some("nvidia.com/gpu"), Some("Exists"), Some("NoSchedule"))
        );
        let t = parse_toleration("kwok.x-k8s.io/node=fake:NoSchedule").unwrap();
        assert_eq!(
            (t.value.as_deref(), t.operator.as_deref()),
            (Some("fake"), Some("Equal"))
        );
        assert!(parse_toleration(":NoSchedule").is_err());
        assert!(parse_toleration("a:Sometimes").is_err());
        assert_eq!(parse_env("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(parse_env("=x").is_err());
    }
}
