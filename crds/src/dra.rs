//! `spec.dra`: how a validation narrows the GPUs Dynamic Resource Allocation gives its agents.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The longest CEL selector the API server accepts in a device request (10 KiB).
pub const MAX_SELECTOR_BYTES: u32 = 10 * 1024;

/// On nodes whose GPUs are allocated through Dynamic Resource Allocation
/// (`resource.k8s.io/v1`), which of them the agent claims. Absent: every GPU of the
/// operator's device class on the node. Ignored on nodes that use the `nvidia.com/gpu`
/// extended resource.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DraSpec {
    /// A CEL expression on the devices' attributes, added to the claim's request (for
    /// example `device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"`).
    /// The agent claims every GPU of the node that matches (`allocationMode: All`); the API
    /// server compiles the expression when the operator creates the claim template, and a
    /// mistake is reported in the validation's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_SELECTOR_BYTES))]
    pub selector: Option<String>,
}
