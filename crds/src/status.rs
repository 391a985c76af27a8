//! `GpuValidation` status: phase, kstatus conditions, counts by verdict and by reason, and a
//! line for each node that has not passed, up to [`MAX_LISTED_NODES`]. Passing nodes are only
//! counted; full per-node detail lives in `GpuNodeResult` objects (labelled with their verdict),
//! so this object stays the same size however many nodes a validation covers.

use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::Verdict;
pub use crate::spelling::UnknownValue;
pub(crate) use crate::spelling::api_spelling;
use crate::spelling::parse_named;

/// Most node lines in `status.nodes`; the rest are counted in `status.nodesNotListed`.
pub const MAX_LISTED_NODES: usize = 50;
/// Most reasons in `status.summary.reasons` (the most frequent first).
pub const MAX_REASONS: usize = 10;

/// `FromStr` of an [`api_spelling!`] enum: the exact API name, else [`UnknownValue`] naming
/// `kind` and the choices.
macro_rules! parsed_by_name {
    ($ty:ident, $kind:literal) => {
        impl FromStr for $ty {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                parse_named(s, &$ty::ALL, $ty::as_str, $kind)
            }
        }
    };
}

/// Where a validation stands.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
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

api_spelling!(Phase {
    Pending => "Pending",
    Running => "Running",
    Passed => "Passed",
    Failed => "Failed",
});

impl Phase {
    /// True for Passed and Failed: the run of this generation is over.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Passed | Phase::Failed)
    }
}

parsed_by_name!(Phase, "phase");

/// One node's verdict in the validation status.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
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

api_spelling!(NodeVerdict {
    Pending => "Pending",
    Running => "Running",
    Passed => "Passed",
    Failed => "Failed",
    Error => "Error",
    DeadlineExceeded => "DeadlineExceeded",
});

impl NodeVerdict {
    /// True once the node has its verdict for this run (anything but Pending and Running).
    pub fn is_final(self) -> bool {
        !matches!(self, NodeVerdict::Pending | NodeVerdict::Running)
    }
}

parsed_by_name!(NodeVerdict, "node verdict");

// Parses a node result's verdict as the agent writes it (the `gpuval.io/verdict` label).
parsed_by_name!(Verdict, "verdict");

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
    /// A line for each node that has not passed (failed ones first, then those still waiting
    /// or running), at most 50; passing nodes are only counted in `summary`. Detail is in the
    /// GpuNodeResult named in `result` (`kubectl get gpunoderesults -l gpuval.io/verdict=Fail`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub nodes: Vec<NodeStatus>,
    /// Nodes that have not passed but did not fit in `nodes` ("and N more").
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nodes_not_listed: i32,
    /// The fabric test between nodes (when `spec.fabric` asks for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<crate::fabric::FabricStatus>,
    /// The fleet's driver, VBIOS, CUDA and NCCL versions across the nodes that reported, with
    /// the nodes that differ from the majority (a Warn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<crate::facts::FleetStatus>,
    /// True once a result of this run came from the simulated GPU backend (tests and demos):
    /// its verdicts say nothing about real GPUs and never act on Nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<bool>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
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
    /// Why nodes did not pass, the most frequent first (at most 10), with how many nodes each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<ReasonCount>,
}

/// How many nodes did not pass for one reason.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReasonCount {
    /// A code of the nodes' findings with its severity (`Fail: MemoryMismatch`; a node counts
    /// once for each of its codes), or for a node without codes its verdict and the first words
    /// of its message (`Error: agent pod failed`).
    pub reason: String,
    pub count: i32,
}

/// One node's line in the validation status (and the operator's record of a node while a run
/// goes on).
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
    /// The codes of the node's first failures (`MemoryMismatch,XidFatal`), worst first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codes: Option<String>,
    /// What to do about the node (the most drastic action its failures recommend), when
    /// there is something to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<crate::reason::Action>,
    /// Name of the GpuNodeResult with the full report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// What kind of evidence a final verdict rests on: only `Hardware` acts on the node
    /// (taint, `gpuval.io/verdict=Fail`, `GpuValidated=False`, admission's failure taint);
    /// `Busy`, `Infrastructure`, `Configuration`, `Spec` (what `spec.expect` asks for, not a
    /// measured fault) and `NoEvidence` say what to fix in `message` and leave the node as it
    /// was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::kinds::Evidence>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API name of a value: what serde writes, without the quotes.
    fn api_name(v: impl Serialize) -> String {
        match serde_json::to_value(v) {
            Ok(serde_json::Value::String(s)) => s,
            other => panic!("expected a string, got {other:?}"),
        }
    }

    /// Every value's name is what serde writes, what `Display` writes, and parses back.
    fn names_round_trip<T>(all: &[T], as_str: fn(T) -> &'static str)
    where
        T: Copy
            + Serialize
            + std::fmt::Display
            + FromStr<Err = UnknownValue>
            + PartialEq
            + std::fmt::Debug,
    {
        for &v in all {
            assert_eq!(as_str(v), api_name(v));
            assert_eq!(v.to_string(), as_str(v));
            assert_eq!(as_str(v).parse::<T>(), Ok(v));
        }
    }

    #[test]
    fn phase_names_match_the_api_and_parse_back() {
        names_round_trip(&Phase::ALL, Phase::as_str);
    }

    #[test]
    fn node_verdict_names_match_the_api_and_parse_back() {
        names_round_trip(&NodeVerdict::ALL, NodeVerdict::as_str);
    }

    #[test]
    fn verdict_names_parse_back() {
        names_round_trip(&Verdict::ALL, Verdict::as_str);
    }

    #[test]
    fn unknown_names_are_refused_with_the_choices() {
        let e = "passed".parse::<Phase>().expect_err("names are exact");
        assert_eq!(e.kind, "phase");
        assert_eq!(e.value, "passed");
        assert_eq!(
            e.to_string(),
            "unknown phase 'passed': use one of Pending, Running, Passed, Failed"
        );
        assert!("Timeout".parse::<NodeVerdict>().is_err());
        assert!("".parse::<Verdict>().is_err());
    }
}
