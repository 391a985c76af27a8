//! The small kinds every part of the API names: the verdict of a check, a GPU or a node
//! ([`Verdict`]), the evidence a finding rests on ([`Evidence`]), a matrix data type
//! ([`Dtype`]), a bandwidth floor ([`BandwidthFloor`]). Below the report, the spec and the status, which all use them.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The outcome of a check, a GPU or a node. Ordered from best to worst so `max` combines: a
/// measured hardware Fail is worse than an Error (a check that could not measure).
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
)]
pub enum Verdict {
    /// Not run (not asked for, or not applicable on this node).
    Skipped,
    #[default]
    Pass,
    /// Passed, with something worth a look (a throttle reason, a figure near its floor).
    Warn,
    /// Could not run (missing library, allocation refused, internal error): not a hardware verdict.
    /// Worse than a pass, but a hardware Fail found beside it leads.
    Error,
    /// Ran, and the hardware fell short: the worst, so a fault found beside an Error leads.
    Fail,
}

crate::spelling::api_spelling!(Verdict {
    Skipped => "Skipped",
    Pass => "Pass",
    Warn => "Warn",
    Fail => "Fail",
    Error => "Error",
});

impl Verdict {
    /// Whether a node with this verdict passed (warnings and skipped checks pass).
    pub fn passes(self) -> bool {
        matches!(self, Verdict::Pass | Verdict::Warn | Verdict::Skipped)
    }

    /// True for Fail and Error.
    pub fn is_bad(self) -> bool {
        matches!(self, Verdict::Fail | Verdict::Error)
    }
}

/// What kind of evidence a node's finding is.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum Evidence {
    /// The node's hardware was measured: a pass, or a fault of the GPUs, the node or its
    /// fabric. The only category that acts on a node.
    Hardware,
    /// A GPU was busy with other work: its figures were not judged (free it and rerun).
    Busy,
    /// The cluster, not the node: an image that cannot be pulled, a pod evicted, preempted or
    /// never scheduled, a node gone, API errors, a lost fabric report, a deadline with no
    /// result.
    Infrastructure,
    /// The installation's settings (an io check without a host path, a library the image
    /// lacks, an agent container that cannot be created).
    Configuration,
    /// What a validation's spec expects of the node (`spec.expect`: a GPU count, bus ids, a
    /// mode), not a measured fault: the line says so and takes no action on the node (fix the
    /// spec, or look at the node).
    Spec,
    /// Nothing about the node: a simulated result, a result without a report, an agent that
    /// ended without one.
    NoEvidence,
}

crate::spelling::api_spelling!(Evidence {
    Hardware => "Hardware",
    Busy => "Busy",
    Infrastructure => "Infrastructure",
    Configuration => "Configuration",
    Spec => "Spec",
    NoEvidence => "NoEvidence",
});

impl Evidence {
    /// True only for [`Evidence::Hardware`]: the one category that may taint a node, label it
    /// Fail, set `GpuValidated=False`, keep it out at admission or sign a failed certificate.
    pub fn acts_on_node(self) -> bool {
        self == Evidence::Hardware
    }
}

/// A matrix-multiply data type.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    Fp16,
    Tf32,
    Fp32,
}

crate::spelling::api_spelling!(Dtype {
    Bf16 => "bf16",
    Fp16 => "fp16",
    Tf32 => "tf32",
    Fp32 => "fp32",
});

impl std::str::FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dtype::ALL
            .into_iter()
            .find(|d| d.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown dtype {s:?}: use one of bf16, fp16, tf32, fp32"))
    }
}

/// A bandwidth floor in force and its source: the spec, a model profile, or what the node is
/// (`0.70 × NVLink 4 × 18 links through NVSwitch (NVML) (450 GB/s one way)`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BandwidthFloor {
    /// What the floor applies to (`unidirectional`, `pinned per direction`, `allReduce`).
    pub what: String,
    pub gbps: f64,
    pub source: String,
}
