//! `GpuValidation` status: phase, kstatus conditions, counts and a compact line per node.
//! Full per-node detail lives in `GpuNodeResult` objects so this object stays small.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Where a validation stands.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash,
)]
pub enum Phase {
    /// Accepted; nodes not resolved or pods not started yet.
    #[default]
    Pending,
    /// Agent pods are running.
    Running,
    /// Every selected node passed.
    Passed,
    /// At least one node failed, errored or ran out of time, or the spec cannot be run.
    Failed,
}

impl Phase {
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Passed | Phase::Failed)
    }
}

/// One node's verdict in the validation status.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash,
)]
pub enum NodeVerdict {
    /// Pod not started yet.
    #[default]
    Pending,
    /// Agent running.
    Running,
    /// Every check passed (possibly with warnings).
    Passed,
    /// A check failed on this node.
    Failed,
    /// The agent could not produce a verdict (pod failed, evicted, node gone, ...).
    Error,
    /// No verdict before spec.deadline.
    DeadlineExceeded,
}

impl NodeVerdict {
    pub fn is_final(self) -> bool {
        !matches!(self, NodeVerdict::Pending | NodeVerdict::Running)
    }
}

/// Observed state of a validation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuValidationStatus {
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// kstatus conditions: Ready, Reconciling, Stalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
    /// Why nodes were or were not selected, in plain words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<String>,
    /// One compact line per selected node; detail is in the GpuNodeResult named in `result`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub nodes: Vec<NodeStatus>,
}

/// Counts of nodes by state.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub selected: i32,
    pub pending: i32,
    pub running: i32,
    pub passed: i32,
    /// Failed, Error and DeadlineExceeded together.
    pub failed: i32,
}

/// One node's line in the validation status.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub name: String,
    pub verdict: NodeVerdict,
    /// GPUs on the node (allocatable nvidia.com/gpu).
    #[serde(default)]
    pub gpus: i32,
    /// The first failures in plain words, or why there is no verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Name of the GpuNodeResult with the full report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
}
