//! `GpuNodeResult`: one node's full report for one validation run, written by that node's agent,
//! owned by the validation (deleted with it).

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::report::NodeReport;

/// The identity of a node result: which validation run and which node.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpuval.io",
    version = "v1alpha1",
    kind = "GpuNodeResult",
    plural = "gpunoderesults",
    shortname = "gpuresult",
    category = "gpuval",
    namespaced,
    status = "NodeReport",
    derive = "PartialEq",
    printcolumn(name = "Validation", type_ = "string", json_path = ".spec.validation"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Verdict", type_ = "string", json_path = ".status.verdict"),
    printcolumn(name = "Simulated", type_ = "boolean", json_path = ".status.simulated"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self.validation == oldSelf.validation && self.nodeName == oldSelf.nodeName && self.generation >= oldSelf.generation").message("a GpuNodeResult keeps its validation and node, and its generation only moves forward"))]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeResultSpec {
    /// The GpuValidation this result belongs to.
    #[schemars(length(min = 1, max = 253))]
    pub validation: String,
    /// The validation's metadata.generation the agent ran.
    pub generation: i64,
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
}

/// The deterministic name of a node's result object for a validation.
pub fn result_name(validation: &str, node: &str) -> String {
    let name = format!("{validation}-{node}");
    if name.len() <= 253 {
        return name;
    }
    // Keep it a valid object name: truncate and add a stable hash of the full name.
    let hash = fnv1a(name.as_bytes());
    format!("{}-{hash:016x}", &name[..253 - 17])
}

/// 64-bit FNV-1a: the stable hash behind shortened names and label values.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_names_are_deterministic_and_bounded() {
        assert_eq!(result_name("quick", "gpu-0"), "quick-gpu-0");
        let long_node = "n".repeat(250);
        let a = result_name("quick", &long_node);
        assert!(a.len() <= 253);
        assert_eq!(a, result_name("quick", &long_node));
        assert_ne!(a, result_name("quick2", &long_node));
    }
}
