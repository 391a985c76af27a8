//! What a run of the training step measured, on real GPUs or on the simulated node, before
//! judging.

use serde::{Deserialize, Serialize};

/// The replicas' weight checksums after one step, in rank order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// Steps completed (from 1, warm-up included).
    pub step: u32,
    pub checksums: Vec<u64>,
}

/// The three phases' step times and the replicas' checksums.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingOutcome {
    /// NVML index of each rank's GPU, in rank order.
    pub gpus: Vec<u32>,
    /// Seconds per timed compute-only step of rank 0 alone (the others idle).
    pub single: Vec<f64>,
    /// Seconds per timed compute-only step, per rank, every GPU at once.
    pub compute_only: Vec<Vec<f64>>,
    /// Seconds per timed step with the all-reduce overlapping the backward pass, per rank.
    pub overlapped: Vec<Vec<f64>>,
    pub comparisons: Vec<Comparison>,
    pub nccl_version: Option<String>,
    /// What ended the run early (a hang aborted, an NCCL or CUDA error), if anything.
    pub error: Option<String>,
    pub notes: Vec<String>,
    pub seconds: f64,
}
