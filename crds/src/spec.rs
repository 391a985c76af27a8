//! `GpuValidation`: the spec (which nodes, which checks, thresholds, deadline, node actions).
//!
//! Validation lives in the schema itself (bounds, enums, patterns and CEL rules), so the API
//! server rejects a bad spec with a message that names the field.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::kinds::Dtype;
use crate::{Duration, duration::DurationRange, names, rules, status::GpuValidationStatus};

/// The largest integer a JSON number holds exactly (2^53 - 1): the bound of the `i64` fields.
pub const MAX_EXACT_INTEGER: i64 = (1 << 53) - 1;

/// A validation run over a set of GPU nodes: the operator starts one agent pod per selected
/// node, each agent runs the checks below on every GPU of its node, and the status gives a
/// verdict per node and for the whole validation.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpuval.io",
    version = "v1alpha1",
    kind = "GpuValidation",
    plural = "gpuvalidations",
    shortname = "gpuval",
    category = "gpuval-all",
    status = "GpuValidationStatus",
    derive = "PartialEq",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        json_path = ".status.summary.selected"
    ),
    printcolumn(
        name = "Passed",
        type_ = "integer",
        json_path = ".status.summary.passed"
    ),
    printcolumn(
        name = "Failed",
        type_ = "integer",
        json_path = ".status.summary.failed"
    ),
    printcolumn(name = "Simulated", type_ = "boolean", json_path = ".status.simulated"),
    printcolumn(
        name = "Reason",
        type_ = "string",
        priority = 1,
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason"
    ),
    printcolumn(
        name = "First-Node",
        type_ = "string",
        priority = 1,
        description = "The first node that did not pass (failed nodes are listed first)",
        json_path = ".status.nodes[0].name"
    ),
    printcolumn(
        name = "Fabric",
        type_ = "string",
        priority = 1,
        description = "The fabric test between nodes: its phase",
        json_path = ".status.fabric.phase"
    ),
    printcolumn(
        name = "Fabric-Named",
        type_ = "string",
        priority = 1,
        description = "The nodes the fabric test named at fault",
        json_path = ".status.fabric.failedNodes"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        priority = 1,
        description = "The Ready condition's message: why the run passed, failed or waits (also when it failed before any node ran)",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = rules::deadline_covers_burn(),
    validation = rules::io_during_compute_needs_compute()
)]
#[serde(rename_all = "camelCase")]
pub struct GpuValidationSpec {
    /// Nodes to validate, by label. With neither nodeSelector nor nodeNames, every node that
    /// advertises allocatable `nvidia.com/gpu` is selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::selector::schema")]
    pub node_selector: Option<LabelSelector>,

    /// Nodes to validate, by name (each once). Combined with nodeSelector, a node must match both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NODE_NAMES))]
    #[x_kube(merge_strategy = ListMerge::Set, validation = rules::node_names_total())]
    pub node_names: Vec<NodeName>,

    /// The checks to run on every selected node; a check runs when its section is present.
    pub checks: Checks,

    /// How results are judged: the model profile and the relative rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<Thresholds>,

    /// The longest the whole run may take; nodes without a verdict by then get
    /// DeadlineExceeded and their pods are removed. Default 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = DEADLINE_RANGE.rule())]
    pub deadline: Option<Duration>,

    /// What to do to a node that fails (default: nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,

    /// The fabric test between nodes, after the node checks, over the nodes that passed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<crate::fabric::FabricSpec>,

    /// What every node should look like (GPU count, bus ids, persistence, ECC and MIG modes),
    /// checked before the long checks: a wrong GPU count fails the node at once. Absent: the
    /// count comes from the node's capacity, ECC should be on and MIG off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<crate::facts::Expect>,

    /// On nodes whose GPUs come through Dynamic Resource Allocation: which of them the agent
    /// claims (a CEL selector). Absent: all of the node's GPUs of the operator's device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<crate::dra::DraSpec>,

    /// Raise or lower the severity of reasons by their code (`{code: RowsRemapped, severity:
    /// Fail}`); each code at most once. Codes that mean a check could not measure cannot be
    /// overridden.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_SEVERITY_OVERRIDES))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["code".into()]))]
    pub severity_overrides: Vec<crate::reason::SeverityOverride>,
}

impl GpuValidationSpec {
    /// The deadline in force (the default is one hour).
    pub fn deadline_or_default(&self) -> Duration {
        self.deadline.unwrap_or(DEFAULT_DEADLINE)
    }

    /// `spec.expect`, or its defaults.
    pub fn expect_or_default(&self) -> crate::facts::Expect {
        self.expect.clone().unwrap_or_default()
    }
}

/// The most entries `spec.severityOverrides` may have.
pub const MAX_SEVERITY_OVERRIDES: usize = 64;

pub use crate::duration::DEFAULT_DEADLINE;
/// The range of `spec.deadline`.
pub const DEADLINE_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(30), Duration::from_secs(720 * 3600));
/// The range of `spec.checks.compute.duration`.
pub const BURN_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(10), Duration::from_secs(168 * 3600));
/// The range of `spec.checks.topology.resampleInterval`.
pub const RESAMPLE_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(1), Duration::from_secs(3600));
/// The most entries `spec.nodeNames` may have (their total size is bounded too:
/// [`rules::MAX_NODE_NAMES_CHARS`]).
pub const MAX_NODE_NAMES: usize = 5000;

/// A Kubernetes node name (a DNS-1123 subdomain).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(transparent)]
pub struct NodeName(pub String);

crate::schema_inline::inline_schema!(NodeName, |_| schemars::json_schema!({
    "type": "string",
    "maxLength": names::DNS1123_SUBDOMAIN_MAX,
    "pattern": names::NODE_NAME_PATTERN,
    "description": "A node name (lower-case DNS-1123 subdomain).",
}));

/// The checks of a validation. Each present section enables that check with its settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = rules::at_least_one_check())]
#[serde(rename_all = "camelCase")]
pub struct Checks {
    /// GPU interconnect topology (like `nvidia-smi topo -m`), NVLink states, re-sampled during the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologyCheck>,
    /// Fill a fraction of each GPU's free memory with address-dependent, moving-inversion and random patterns and verify every word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryCheck>,
    /// A sustained GEMM and transcendental burn on every GPU at once, results cross-checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<ComputeCheck>,
    /// NVLink/PCIe peer-to-peer bandwidth and latency for every ordered GPU pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p: Option<P2pCheck>,
    /// Host-to-device and device-to-host bandwidth, pinned and pageable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_transfer: Option<HostTransferCheck>,
    /// Heavy file I/O on the node volume the administrator allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoCheck>,
    /// Collectives over every GPU of the node through NCCL, verified, with the transport NCCL chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<crate::nccl::NcclCheck>,
    /// A synthetic data-parallel training step over every GPU of the node: throughput, exposed communication, scaling, replicas compared bit for bit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<crate::training::TrainingCheck>,
}

/// Topology check settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologyCheck {
    /// Fail unless every GPU pair is connected by NVLink (default: what the GPU model's profile
    /// expects, for example true on H100/H200 SXM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_nvlink: Option<bool>,
    /// The fewest active NVLink links each GPU must have (default: the model profile's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 64))]
    pub min_active_links: Option<i32>,
    /// How often the link states are re-sampled while other checks run (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = RESAMPLE_RANGE.rule())]
    pub resample_interval: Option<Duration>,
}

/// Memory check settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryCheck {
    /// The fraction of each GPU's free memory to test, greater than 0 and at most 1.
    #[serde(default = "default_memory_fraction")]
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true, "maximum" = 1))]
    pub fraction: f64,
    /// How many fill-and-verify passes, each with a new seed and its bitwise inverse.
    #[serde(default = "default_passes")]
    #[schemars(range(min = 1, max = 1000))]
    pub passes: i32,
    /// Mismatched words tolerated before the GPU fails (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_EXACT_INTEGER))]
    pub max_mismatches: Option<i64>,
    /// Lowest acceptable fill+verify throughput in GB/s, of the address pattern (of every
    /// pattern together when it does not run); default: the model profile's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub min_gbps: Option<i32>,
    /// The patterns to run, in turn, each `passes` times (default all three: address,
    /// movingInversions, random; the memtest tests DCGM runs at its level 4).
    #[serde(default = "default_patterns")]
    #[schemars(length(min = 1, max = 3))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub patterns: Vec<crate::depth::MemoryPattern>,
}

impl Default for MemoryCheck {
    fn default() -> Self {
        Self {
            fraction: default_memory_fraction(),
            passes: default_passes(),
            max_mismatches: None,
            min_gbps: None,
            patterns: default_patterns(),
        }
    }
}

fn default_patterns() -> Vec<crate::depth::MemoryPattern> {
    crate::depth::MemoryPattern::ALL.to_vec()
}

fn default_memory_fraction() -> f64 {
    0.95
}
fn default_passes() -> i32 {
    1
}

/// Compute burn settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ComputeCheck {
    /// How long the burn runs on every GPU (default 5m, at least 10s).
    #[serde(default = "default_burn_duration")]
    #[x_kube(validation = BURN_RANGE.rule())]
    pub duration: Duration,
    /// GEMM data types to burn, in turn (default bf16).
    #[serde(default = "default_dtypes")]
    #[schemars(length(min = 1, max = 4))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub dtypes: Vec<Dtype>,
    /// Square matrix size n for the n×n×n GEMMs (default 8192).
    #[serde(default = "default_matrix_size")]
    #[schemars(range(min = 256, max = 32768), extend("multipleOf" = 256))]
    pub matrix_size: i32,
    /// Also run the elementwise sin/exp kernel between GEMMs (default true).
    #[serde(default = "default_true")]
    pub transcendentals: bool,
    /// Lowest acceptable TFLOP/s per data type (default: the model profile's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tflops: Option<TflopsThresholds>,
    /// The lowest share of its enforced power limit a GPU must draw during the burn (the median
    /// of the samples; default: the model profile's, 0.75 on H100, H200 and A100; 0 turns the
    /// rule off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_power_fraction: Option<f64>,
    /// The largest share of the burn's samples that may show clocks slowed by hardware or
    /// thermal limits (HwSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown, SwThermalSlowdown)
    /// before the GPU fails (default 0.05). A GPU at its power cap (SwPowerCap) is healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max_slowdown_fraction: Option<f64>,
    /// After the burn, alternate full load and idle (fast power swings that trip weak power
    /// delivery), then check the GPU still computes correctly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulse: Option<crate::depth::PulseSpec>,
}

impl Default for ComputeCheck {
    fn default() -> Self {
        Self {
            duration: default_burn_duration(),
            dtypes: default_dtypes(),
            matrix_size: default_matrix_size(),
            transcendentals: true,
            min_tflops: None,
            min_power_fraction: None,
            max_slowdown_fraction: None,
            pulse: None,
        }
    }
}

fn default_burn_duration() -> Duration {
    Duration::from_secs(300)
}
fn default_dtypes() -> Vec<Dtype> {
    vec![Dtype::Bf16]
}
fn default_matrix_size() -> i32 {
    8192
}
fn default_true() -> bool {
    true
}

/// Per-dtype TFLOP/s floors.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TflopsThresholds {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub bf16: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub fp16: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub tf32: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub fp32: Option<i32>,
}

impl TflopsThresholds {
    pub fn get(&self, d: Dtype) -> Option<i32> {
        match d {
            Dtype::Bf16 => self.bf16,
            Dtype::Fp16 => self.fp16,
            Dtype::Tf32 => self.tf32,
            Dtype::Fp32 => self.fp32,
        }
    }
}

/// Peer-to-peer check settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = rules::p2p_bidirectional_not_below_unidirectional())]
#[serde(rename_all = "camelCase")]
pub struct P2pCheck {
    /// Size of each copy in MiB (default 512).
    #[serde(default = "default_p2p_buffer")]
    #[schemars(range(min = 1, max = 16384))]
    pub buffer_mib: i32,
    /// Timed copies per sample (default 16).
    #[serde(default = "default_iterations")]
    #[schemars(range(min = 1, max = 10000))]
    pub iterations: i32,
    /// Also measure each pair with peer access off (host-staged copies).
    #[serde(default)]
    pub host_staged: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub min_unidirectional_gbps: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub min_bidirectional_gbps: Option<i32>,
    /// Highest acceptable small-copy latency in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_latency_micros: Option<i32>,
}

impl Default for P2pCheck {
    fn default() -> Self {
        Self {
            buffer_mib: default_p2p_buffer(),
            iterations: default_iterations(),
            host_staged: false,
            min_unidirectional_gbps: None,
            min_bidirectional_gbps: None,
            max_latency_micros: None,
        }
    }
}

fn default_p2p_buffer() -> i32 {
    512
}
fn default_iterations() -> i32 {
    16
}

/// Host transfer check settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = rules::host_transfer_measures_something())]
#[serde(rename_all = "camelCase")]
pub struct HostTransferCheck {
    /// Size of each copy in MiB (default 256).
    #[serde(default = "default_host_buffer")]
    #[schemars(range(min = 1, max = 65536))]
    pub buffer_mib: i32,
    /// Measure with pinned (page-locked) host memory (default true).
    #[serde(default = "default_true")]
    pub pinned: bool,
    /// Measure with ordinary pageable host memory (default true).
    #[serde(default = "default_true")]
    pub pageable: bool,
    /// Lowest acceptable pinned bandwidth, each direction, in GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub min_pinned_gbps: Option<i32>,
    /// Limits of each GPU's PCIe link (always judged; these change the defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<crate::depth::PcieCheck>,
}

impl Default for HostTransferCheck {
    fn default() -> Self {
        Self {
            buffer_mib: default_host_buffer(),
            pinned: true,
            pageable: true,
            min_pinned_gbps: None,
            pcie: None,
        }
    }
}

fn default_host_buffer() -> i32 {
    256
}

/// File I/O check settings. Where the files go is set by the administrator (Helm values), never here.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IoCheck {
    /// Size of each file in MiB (default 1024).
    #[serde(default = "default_file_size")]
    #[schemars(range(min = 1, max = 1048576))]
    pub file_size_mib: i32,
    /// Number of files written then read back (default 4).
    #[serde(default = "default_files")]
    #[schemars(range(min = 1, max = 10000))]
    pub files: i32,
    /// Concurrent writers and readers (default 4).
    #[serde(default = "default_files")]
    #[schemars(range(min = 1, max = 256))]
    pub concurrency: i32,
    /// Use O_DIRECT where the filesystem allows it (default true).
    #[serde(default = "default_true")]
    pub direct_io: bool,
    /// Run while the compute burn runs instead of alone (needs checks.compute).
    #[serde(default)]
    pub during_compute: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub min_write_mbps: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub min_read_mbps: Option<i32>,
}

impl Default for IoCheck {
    fn default() -> Self {
        Self {
            file_size_mib: default_file_size(),
            files: default_files(),
            concurrency: default_files(),
            direct_io: true,
            during_compute: false,
            min_write_mbps: None,
            min_read_mbps: None,
        }
    }
}

fn default_file_size() -> i32 {
    1024
}
fn default_files() -> i32 {
    4
}

/// Which built-in model expectations apply.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Profile {
    /// Pick by the GPU's reported name; GPUs of unknown models get relative checks only.
    #[default]
    Auto,
    H100,
    H200,
    A100,
    /// No model expectations: explicit thresholds and the relative rule only.
    None,
}

/// How results are judged.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Thresholds {
    /// Built-in expectations per GPU model (default Auto).
    #[serde(default)]
    pub profile: Profile,
    /// A GPU (or link) more than this many percent below the median of its peers in the same
    /// run fails, even where no model profile exists (default 15).
    #[serde(default = "default_relative")]
    #[schemars(range(min = 1, max = 90))]
    pub relative_tolerance_percent: i32,
    /// Measure a performance figure that falls short (below its floor or its peers) once more
    /// before it fails; the second measurement decides, and the report says so (default true).
    #[serde(default = "default_true")]
    pub remeasure: bool,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            profile: Profile::Auto,
            relative_tolerance_percent: default_relative(),
            remeasure: true,
        }
    }
}

fn default_relative() -> i32 {
    15
}

/// What to do to a node that fails.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NodeAction {
    /// Report only.
    #[default]
    None,
    /// Label the node `gpuval.io/failed=<validation>`.
    Label,
    /// Taint the node `gpuval.io/failed=<validation>:NoSchedule`.
    Taint,
}

/// Node action settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OnFailure {
    #[serde(default)]
    pub action: NodeAction,
}
