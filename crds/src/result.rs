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
    category = "gpuval-all",
    namespaced,
    status = "NodeReport",
    derive = "PartialEq",
    printcolumn(name = "Validation", type_ = "string", json_path = ".spec.validation"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Verdict", type_ = "string", json_path = ".status.verdict"),
    printcolumn(name = "Action", type_ = "string", json_path = ".status.action"),
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
    #[schemars(length(max = 253), regex(pattern = crate::names::NODE_NAME_PATTERN))]
    pub validation: String,
    /// The validation's metadata.generation the agent ran.
    pub generation: i64,
    /// The node the agent ran on.
    #[schemars(length(max = 253), regex(pattern = crate::names::NODE_NAME_PATTERN))]
    pub node_name: String,
}

/// The part of a name that says which validation and which node:
/// `<validation>-<node>-<length of validation>`. The length makes it one-to-one: `a-b` on node
/// `c` gives `a-b-c-3`, `a` on node `b-c` gives `a-b-c-1` (read from the end, the length says
/// where the validation stops). Both names are DNS subdomains, so the length is the only
/// separator that cannot occur in them. Only the operator names results (it creates each with
/// the node's agent pod); the admission policy binds a result to that pod, not to its name.
pub fn run_node_key(validation: &str, node: &str) -> String {
    format!("{validation}-{node}-{}", validation.len())
}

/// The deterministic name of a node's result object for a validation: [`run_node_key`], or when
/// that passes 253 characters, its [`shortened`] form.
pub fn result_name(validation: &str, node: &str) -> String {
    shortened(
        run_node_key(validation, node),
        crate::names::DNS1123_SUBDOMAIN_MAX,
    )
}

/// The deterministic name of the agent pod of a validation's generation on a node:
/// `gpuval-<run_node_key>-g<generation>`, or when that passes 63 characters (a pod's name
/// becomes its hostname), its [`shortened`] form.
pub fn agent_pod_name(validation: &str, node: &str, generation: i64) -> String {
    shortened(
        format!("gpuval-{}-g{generation}", run_node_key(validation, node)),
        crate::names::DNS1123_LABEL_MAX,
    )
}

/// `name` when it has at most `max` characters, otherwise its head and 16 hex digits of a hash
/// of the whole, the head cut back to an alphanumeric so the name stays a DNS-1123 subdomain (a
/// cut that ended on `.` or `-` would leave `.-` or `--` before the hash).
pub fn shortened(name: String, max: usize) -> String {
    const HASH_HEX: usize = 16;
    if name.len() <= max {
        return name;
    }
    let hash = fnv1a(name.as_bytes());
    let keep = max.saturating_sub(HASH_HEX + 1);
    // Names are ASCII; a cut inside a multi-byte character moves back to its start.
    let cut = (0..=keep)
        .rev()
        .find(|i| name.is_char_boundary(*i))
        .unwrap_or(0);
    let head = name[..cut].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{hash:016x}")
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
        assert_eq!(result_name("quick", "gpu-0"), "quick-gpu-0-5");
        let long_node = "n".repeat(250);
        let a = result_name("quick", &long_node);
        assert!(a.len() <= 253);
        assert_eq!(a, result_name("quick", &long_node));
        assert_ne!(a, result_name("quick2", &long_node));
    }

    #[test]
    fn names_of_validations_and_nodes_that_read_alike_stay_apart() {
        // Joined with '-' alone, both pairs read `a-b-c`.
        assert_ne!(result_name("a-b", "c"), result_name("a", "b-c"));
        assert_ne!(agent_pod_name("a-b", "c", 1), agent_pod_name("a", "b-c", 1));
        assert_eq!(agent_pod_name("a-b", "c", 1), "gpuval-a-b-c-3-g1");
        // The length cannot be mistaken for a node's trailing number either.
        assert_ne!(result_name("a", "b-1"), result_name("a-b", "1"));
        let long = "n".repeat(80);
        let p = agent_pod_name("v", &long, 7);
        assert!(p.len() <= 63 && crate::names::is_dns1123_label(&p), "{p}");
        assert_ne!(p, agent_pod_name("v", &long, 8));
    }

    #[test]
    fn a_cut_that_lands_on_a_dot_or_dash_is_trimmed() {
        // "v-" (2) + 234 characters puts a '.' at index 235, the last one kept.
        for sep in ['.', '-'] {
            let node = format!("{}{sep}{}", "a".repeat(233), "b".repeat(40));
            let name = result_name("v", &node);
            assert!(name.len() <= 253, "{name}");
            assert!(crate::names::is_dns1123_subdomain(&name), "{name}");
            assert!(!name.contains(".-") && !name.contains("--"), "{name}");
        }
    }
}
