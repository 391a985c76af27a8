//! The `training` check: a synthetic data-parallel training step on every GPU of a node
//! (transformer-like MLP blocks, bf16 GEMMs forward and backward, gradients bucketed and
//! all-reduced through NCCL while the backward pass runs, a plain SGD update), its step time,
//! throughput, exposed communication and scaling efficiency, and every replica's weights
//! compared bit for bit to catch silent data corruption. [`TrainingCheck`] is its spec section,
//! [`TrainingResult`] its report section.
//!
//! The section is node-wide today (one data-parallel group over the node's GPUs); the same
//! settings are meant to drive one group across nodes once the fabric phase runs it.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Duration, kinds::Verdict};

/// The element type of the weights, activations and gradients.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum TrainingDtype {
    #[default]
    Bf16,
}

crate::spelling::api_spelling!(TrainingDtype {
    Bf16 => "bf16",
});

/// The bounds of `spec.checks.training.timeout`.
pub const TRAINING_TIMEOUT_RANGE: crate::duration::DurationRange =
    crate::duration::DurationRange::new(Duration::from_secs(1), Duration::from_secs(3600));

/// Training check settings. The defaults (8 blocks of hidden size 4096, 8 × 1024 tokens per
/// GPU, about 1.1 G parameters, about 53 TFLOP a step per GPU) keep an H100 or H200 busy for
/// tens of milliseconds a step.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingCheck {
    /// Width of the residual stream (default 4096); a multiple of 64.
    #[serde(default = "default_hidden")]
    #[schemars(range(min = 64, max = 32768), extend("multipleOf" = 64))]
    pub hidden_size: i32,
    /// Width of each block's inner layer as a multiple of the hidden size (default 4).
    #[serde(default = "default_ffn")]
    #[schemars(range(min = 1, max = 16))]
    pub ffn_multiplier: i32,
    /// Blocks (each an up projection, an activation and a down projection; default 8).
    #[serde(default = "default_layers")]
    #[schemars(range(min = 1, max = 256))]
    pub layers: i32,
    /// Sequences per GPU per step (default 8).
    #[serde(default = "default_batch")]
    #[schemars(range(min = 1, max = 4096))]
    pub batch_size: i32,
    /// Tokens per sequence (default 1024).
    #[serde(default = "default_sequence")]
    #[schemars(range(min = 1, max = 131072))]
    pub sequence_length: i32,
    /// Element type (bf16).
    #[serde(default)]
    pub dtype: TrainingDtype,
    /// Gradient bucket size in MiB, as DDP's `bucket_cap_mb` (default 25): a bucket is
    /// all-reduced as soon as every gradient in it is computed; a gradient larger than the cap
    /// is a bucket of its own.
    #[serde(default = "default_bucket")]
    #[schemars(range(min = 1, max = 4096))]
    pub bucket_mib: i32,
    /// Timed steps (default 30).
    #[serde(default = "default_steps")]
    #[schemars(range(min = 1, max = 100000))]
    pub steps: i32,
    /// Untimed steps before the timed ones (default 3).
    #[serde(default = "default_warmup")]
    #[schemars(range(min = 0, max = 1000))]
    pub warmup_steps: i32,
    /// Compare the replicas' weight checksums every this many steps (default 10), and always
    /// after the last step.
    #[serde(default = "default_checksum_every")]
    #[schemars(range(min = 1, max = 100000))]
    pub checksum_every: i32,
    /// How long one step may take before the communicator is aborted and the check reports
    /// Error (default 120s).
    #[serde(default = "default_timeout")]
    #[x_kube(validation = TRAINING_TIMEOUT_RANGE.rule())]
    pub timeout: Duration,
    /// Lowest acceptable samples (sequences) per second per GPU with communication on (no
    /// default: it depends on the shapes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.001, max = 1000000.0))]
    pub min_samples_per_second_per_gpu: Option<f64>,
    /// Lowest acceptable scaling efficiency: N-GPU throughput ÷ (N × one-GPU throughput), both
    /// measured in the same run (default 0.85).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_scaling_efficiency: Option<f64>,
    /// Highest acceptable share of the step spent in communication the backward pass did not
    /// hide: (step time − compute-only step time) ÷ step time (default 0.15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max_exposed_comm_fraction: Option<f64>,
}

/// The scaling efficiency floor when the spec sets none.
pub const DEFAULT_MIN_SCALING_EFFICIENCY: f64 = 0.85;
/// The exposed communication ceiling when the spec sets none.
pub const DEFAULT_MAX_EXPOSED_COMM_FRACTION: f64 = 0.15;

impl Default for TrainingCheck {
    fn default() -> Self {
        Self {
            hidden_size: default_hidden(),
            ffn_multiplier: default_ffn(),
            layers: default_layers(),
            batch_size: default_batch(),
            sequence_length: default_sequence(),
            dtype: TrainingDtype::default(),
            bucket_mib: default_bucket(),
            steps: default_steps(),
            warmup_steps: default_warmup(),
            checksum_every: default_checksum_every(),
            timeout: default_timeout(),
            min_samples_per_second_per_gpu: None,
            min_scaling_efficiency: None,
            max_exposed_comm_fraction: None,
        }
    }
}

fn default_hidden() -> i32 {
    4096
}
fn default_ffn() -> i32 {
    4
}
fn default_layers() -> i32 {
    8
}
fn default_batch() -> i32 {
    8
}
fn default_sequence() -> i32 {
    1024
}
fn default_bucket() -> i32 {
    25
}
fn default_steps() -> i32 {
    30
}
fn default_warmup() -> i32 {
    3
}
fn default_checksum_every() -> i32 {
    10
}
fn default_timeout() -> Duration {
    Duration::from_secs(120)
}

/// The training check of a node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingResult {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    /// NVML index of each replica's GPU, in rank order.
    pub gpus: Vec<i32>,
    /// The model and step as run.
    pub shape: TrainingShape,
    /// Timed steps with communication (the figures below are over these).
    pub steps: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<TrainingFigures>,
    /// Weight checksums compared across replicas, and the first divergence found.
    pub replicas: TrainingReplicas,
    /// NCCL's version and library file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_version: Option<String>,
    /// Facts about how the figures were taken (not verdict reasons).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// The synthetic model and its gradient buckets.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingShape {
    pub hidden_size: i32,
    pub ffn_multiplier: i32,
    pub layers: i32,
    pub batch_size: i32,
    pub sequence_length: i32,
    pub dtype: TrainingDtype,
    /// Weights per replica.
    pub parameters: i64,
    /// GEMM floating-point operations of one step on one GPU (forward and backward).
    pub flops_per_step: f64,
    pub bucket_mib: i32,
    /// Gradient buckets all-reduced per step.
    pub buckets: i32,
}

/// Step figures (times in milliseconds, medians unless named otherwise).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingFigures {
    /// A step with the all-reduce overlapping the backward pass (the slowest replica's).
    pub step_millis: f64,
    pub step_millis_p99: f64,
    /// The same step on every GPU at once with no communication.
    pub compute_only_step_millis: f64,
    /// The compute-only step on one GPU while the others idle.
    pub single_gpu_step_millis: f64,
    pub samples_per_second_per_gpu: f64,
    pub samples_per_second: f64,
    pub single_gpu_samples_per_second: f64,
    /// Communication the backward pass did not hide: step − compute-only step.
    pub exposed_comm_millis: f64,
    /// exposed ÷ step.
    pub exposed_comm_fraction: f64,
    /// N-GPU throughput ÷ (N × one-GPU throughput).
    pub scaling_efficiency: f64,
    /// GEMM TFLOP/s per GPU over the step with communication.
    pub tflops_per_gpu: f64,
    /// Each GPU's compute-only step (the same order as `gpus`), for the rule across GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compute_only_step_millis_per_gpu: Vec<f64>,
}

/// The replicas compared.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingReplicas {
    /// Checksum comparisons made (every `checksumEvery` steps and after the last).
    pub comparisons: i32,
    /// Every replica held the same weights at every comparison.
    pub identical: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub divergence: Option<TrainingDivergence>,
}

/// The first comparison where the replicas' weights differed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainingDivergence {
    /// Steps completed when the checksums were compared (counting warm-up steps).
    pub step: i32,
    /// NVML indices of the GPUs whose weights differ from the majority; every GPU of the group
    /// when no majority exists (two replicas, or a tie).
    pub gpus: Vec<i32>,
    /// True when a majority of the replicas agreed, so `gpus` are the ones at fault.
    pub majority: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_an_empty_section() {
        let c: TrainingCheck = serde_json::from_str("{}").expect("an empty training section");
        assert_eq!(c, TrainingCheck::default());
        assert_eq!((c.hidden_size, c.layers, c.bucket_mib), (4096, 8, 25));
        assert_eq!(c.timeout, Duration::from_secs(120));
        let bad = serde_json::from_str::<TrainingCheck>(r#"{"dtype":"fp8"}"#);
        assert!(bad.is_err());
    }
}
