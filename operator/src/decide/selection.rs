//! Which nodes a validation runs on (pure). Resolved once per spec generation and recorded in
//! status, so nodes that join later do not change a run in progress.

use std::collections::BTreeSet;

use gpuval_crds::{GPU_RESOURCE, GpuValidationSpec};
use k8s_openapi::api::core::v1::Node;
use kube::core::{Selector, SelectorExt};

/// A node the run will cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectedNode {
    pub name: String,
    /// Allocatable `nvidia.com/gpu`.
    pub gpus: i32,
}

/// The condition and event reason of a run the installation cannot carry out (see
/// [`Selection::not_configured`]).
pub const NOT_CONFIGURED: &str = "NotConfigured";

/// The outcome of resolving a spec against the cluster's nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selection {
    pub selected: Vec<SelectedNode>,
    /// Nodes that matched the selector or names but cannot run the agent, with the reason.
    pub excluded: Vec<(String, String)>,
    /// Names in spec.nodeNames with no Node object.
    pub missing: Vec<String>,
    /// The spec itself cannot be resolved (an invalid selector).
    pub invalid: Option<String>,
    /// The installation cannot run a check the spec asks for (see
    /// [`crate::decide::reconcile::preflight`]): the message naming the Helm values to set.
    pub not_configured: Option<String>,
}

impl Selection {
    /// Every node of `names` selected, each with `gpus` GPUs; nothing excluded, missing or
    /// invalid.
    pub fn of_nodes<S: Into<String>>(names: impl IntoIterator<Item = S>, gpus: i32) -> Selection {
        Selection {
            selected: names
                .into_iter()
                .map(|n| SelectedNode {
                    name: n.into(),
                    gpus,
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Why the run cannot start, if it cannot: (condition reason, message).
    pub fn blocker(&self) -> Option<(&'static str, String)> {
        if let Some(e) = &self.invalid {
            return Some(("InvalidSpec", e.clone()));
        }
        if let Some(e) = &self.not_configured {
            return Some((NOT_CONFIGURED, e.clone()));
        }
        if !self.missing.is_empty() {
            return Some((
                "NodeNotFound",
                format!(
                    "spec.nodeNames names nodes that do not exist: {}",
                    self.missing.join(", ")
                ),
            ));
        }
        if self.selected.is_empty() {
            return Some((
                "NoNodesSelected",
                format!("no node can run the validation: {}", self.describe()),
            ));
        }
        None
    }

    /// One line for `status.selection`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} node(s) selected", self.selected.len());
        if !self.excluded.is_empty() {
            let shown: Vec<String> = self
                .excluded
                .iter()
                .take(10)
                .map(|(n, why)| format!("{n} ({why})"))
                .collect();
            s.push_str(&format!("; not selected: {}", shown.join(", ")));
            if self.excluded.len() > 10 {
                s.push_str(&format!(" and {} more", self.excluded.len() - 10));
            }
        }
        if self.selected.is_empty() && self.excluded.is_empty() {
            s.push_str("; no node matches spec.nodeSelector/nodeNames");
        }
        s
    }
}

/// Allocatable GPUs of a node (0 when absent or unparsable).
pub fn allocatable_gpus(node: &Node) -> i32 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(GPU_RESOURCE))
        .and_then(|q| q.0.parse::<i32>().ok())
        .unwrap_or(0)
}

fn is_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Resolves `spec` against `nodes`: a node is a candidate when it matches nodeSelector (if set)
/// and is named in nodeNames (if set); a candidate is selected unless it is cordoned or has no
/// allocatable `nvidia.com/gpu`. With neither field set, every node advertising GPUs is a
/// candidate and nodes without GPUs are not listed as excluded.
pub fn select(spec: &GpuValidationSpec, nodes: &[Node]) -> Selection {
    let none = format!("no allocatable {GPU_RESOURCE}");
    select_with(spec, nodes, &allocatable_gpus, &none)
}

/// [`select`] with the GPUs each node offers counted by `gpus_of` (the extended resource, or
/// the GPUs of its Dynamic Resource Allocation slices), `no_gpus` saying why a node offering
/// none is not selected.
pub fn select_with(
    spec: &GpuValidationSpec,
    nodes: &[Node],
    gpus_of: &dyn Fn(&Node) -> i32,
    no_gpus: &str,
) -> Selection {
    let mut out = Selection::default();
    let selector = match spec
        .node_selector
        .clone()
        .map(Selector::try_from)
        .transpose()
    {
        Ok(s) => s,
        Err(e) => {
            out.invalid = Some(format!("spec.nodeSelector is invalid: {e}"));
            return out;
        }
    };
    let names: BTreeSet<&str> = spec.node_names.iter().map(|n| n.0.as_str()).collect();
    let targeted = selector.is_some() || !names.is_empty();
    let existing: BTreeSet<&str> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    out.missing = names
        .iter()
        .filter(|n| !existing.contains(*n))
        .map(|n| n.to_string())
        .collect();

    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for node in sorted {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        if !is_candidate(node, name, selector.as_ref(), &names) {
            continue;
        }
        let gpus = gpus_of(node);
        if gpus <= 0 {
            if targeted {
                out.excluded.push((name.to_string(), no_gpus.to_string()));
            }
            continue;
        }
        if is_cordoned(node) {
            out.excluded.push((name.to_string(), "cordoned".into()));
            continue;
        }
        out.selected.push(SelectedNode {
            name: name.to_string(),
            gpus,
        });
    }
    if !targeted {
        out.excluded.extend(without_gpus(nodes, gpus_of, no_gpus));
    }
    out
}

/// Whether a change of `node` may change the run of a validation with `spec` that is not over.
/// `held` says whether its run holds the node (the nodes of a run are fixed once selected);
/// None where no run of it is known (still selecting, or not seen since the operator started):
/// then the node matters where the spec could select it (see [`could_select`]).
pub fn node_matters(spec: &GpuValidationSpec, held: Option<bool>, node: &Node) -> bool {
    held.unwrap_or_else(|| could_select(spec, node))
}

/// Whether `spec`'s nodeSelector (if set) and nodeNames (if set) take `node` as a candidate,
/// whatever its GPUs and cordon say now (both may change); never with an invalid selector.
pub fn could_select(spec: &GpuValidationSpec, node: &Node) -> bool {
    let Some(name) = node.metadata.name.as_deref() else {
        return false;
    };
    let Ok(selector) = spec
        .node_selector
        .clone()
        .map(Selector::try_from)
        .transpose()
    else {
        return false;
    };
    let names: BTreeSet<&str> = spec.node_names.iter().map(|n| n.0.as_str()).collect();
    is_candidate(node, name, selector.as_ref(), &names)
}

/// True when node `name` matches `selector` (if any) and is among `names` (if any).
fn is_candidate(
    node: &Node,
    name: &str,
    selector: Option<&Selector>,
    names: &BTreeSet<&str>,
) -> bool {
    let empty = Default::default();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    selector.is_none_or(|s| s.matches(labels)) && (names.is_empty() || names.contains(name))
}

/// Why GPU-less nodes are absent, in aggregate (to keep status small): none when every node
/// has GPUs.
fn without_gpus(
    nodes: &[Node],
    gpus_of: &dyn Fn(&Node) -> i32,
    no_gpus: &str,
) -> Option<(String, String)> {
    let without = nodes.iter().filter(|n| gpus_of(n) <= 0).count();
    (without > 0).then(|| (format!("{without} node(s)"), no_gpus.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpuval_crds::{Checks, MemoryCheck, NodeName};
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    pub fn node(name: &str, gpus: i32, labels: &[(&str, &str)], cordoned: bool) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n.spec = Some(NodeSpec {
            unschedulable: Some(cordoned),
            ..Default::default()
        });
        let mut alloc = std::collections::BTreeMap::new();
        if gpus > 0 {
            alloc.insert(GPU_RESOURCE.to_string(), Quantity(gpus.to_string()));
        }
        n.status = Some(NodeStatus {
            allocatable: Some(alloc),
            ..Default::default()
        });
        n
    }

    pub fn spec() -> GpuValidationSpec {
        GpuValidationSpec {
            node_selector: None,
            node_names: vec![],
            checks: Checks {
                memory: Some(MemoryCheck::default()),
                ..Default::default()
            },
            thresholds: None,
            deadline: None,
            on_failure: None,
            fabric: None,
            expect: None,
            dra: None,
            severity_overrides: Vec::new(),
        }
    }

    fn cluster() -> Vec<Node> {
        vec![
            node("gpu-a", 8, &[("pool", "h200")], false),
            node("gpu-b", 8, &[("pool", "h200")], false),
            node("gpu-c", 8, &[("pool", "h100")], true),
            node("cpu-0", 0, &[("pool", "h200")], false),
        ]
    }

    fn names(s: &Selection) -> Vec<&str> {
        s.selected.iter().map(|n| n.name.as_str()).collect()
    }

    #[test]
    fn a_node_matters_to_the_runs_that_hold_it_and_to_the_specs_that_could_select_it() {
        let mut pool = spec();
        pool.node_selector = Some(LabelSelector {
            match_labels: Some([("pool".to_string(), "h200".to_string())].into()),
            ..Default::default()
        });
        let h200 = node("gpu-a", 8, &[("pool", "h200")], false);
        let h100 = node("gpu-c", 8, &[("pool", "h100")], false);
        assert!(node_matters(&pool, None, &h200), "a spec still selecting");
        assert!(!node_matters(&pool, None, &h100), "a node it cannot select");
        assert!(node_matters(&pool, Some(true), &h100), "its run holds it");
        assert!(
            !node_matters(&pool, Some(false), &h200),
            "a run's nodes are fixed"
        );
        assert!(
            node_matters(&spec(), None, &h100),
            "no selector: every node"
        );
        let mut named = spec();
        named.node_names = vec![NodeName("gpu-c".into())];
        assert!(node_matters(&named, None, &h100) && !node_matters(&named, None, &h200));
        let mut invalid = spec();
        invalid.node_selector = Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "pool".into(),
                operator: "Bogus".into(),
                values: None,
            }]),
            ..Default::default()
        });
        assert!(!node_matters(&invalid, None, &h200), "an invalid selector");
    }

    #[test]
    fn default_selects_schedulable_gpu_nodes() {
        let s = select(&spec(), &cluster());
        assert_eq!(names(&s), ["gpu-a", "gpu-b"]);
        assert_eq!(s.selected[0].gpus, 8);
        assert!(s.excluded.contains(&("gpu-c".into(), "cordoned".into())));
        assert!(s.describe().contains("gpu-c (cordoned)"));
        assert!(s.blocker().is_none());
    }

    #[test]
    fn a_node_with_gpus_only_in_dra_slices_is_selected_with_their_count() {
        use crate::decide::reconcile::allocation::{self, Allocation, DraInventory, tests as dra};
        let slices = [dra::slice(
            allocation::DEFAULT_DRIVER,
            "cpu-0",
            "cpu-0",
            1,
            vec![dra::device("gpu-0", Some("GPU-0"), Some("gpu"))],
        )];
        let inv = DraInventory::from_slices(allocation::DEFAULT_DRIVER, &slices);
        let a = Allocation::default();
        let gpus_of = |n: &Node| {
            allocation::decide(&a, n.metadata.name.as_deref().unwrap_or(""), &inv).gpus(n)
        };
        let s = select_with(
            &spec(),
            &cluster(),
            &gpus_of,
            &allocation::no_gpus_reason(&a),
        );
        assert_eq!(names(&s), ["cpu-0", "gpu-a", "gpu-b"]);
        assert_eq!((s.selected[0].gpus, s.selected[1].gpus), (1, 8));
        assert_eq!(names(&select(&spec(), &cluster())), ["gpu-a", "gpu-b"]);
    }

    #[test]
    fn selector_and_names_must_both_match() {
        let mut sp = spec();
        sp.node_selector = Some(LabelSelector {
            match_labels: Some([("pool".to_string(), "h200".to_string())].into()),
            ..Default::default()
        });
        let s = select(&sp, &cluster());
        assert_eq!(names(&s), ["gpu-a", "gpu-b"]);
        assert!(
            s.excluded
                .iter()
                .any(|(n, why)| n == "cpu-0" && why.contains("nvidia.com/gpu"))
        );
        sp.node_names = vec![NodeName("gpu-b".into())];
        assert_eq!(names(&select(&sp, &cluster())), ["gpu-b"]);
    }

    #[test]
    fn missing_names_and_empty_selections_block_the_run() {
        let mut sp = spec();
        sp.node_names = vec![NodeName("gpu-a".into()), NodeName("ghost".into())];
        let (reason, msg) = select(&sp, &cluster()).blocker().unwrap();
        assert_eq!(reason, "NodeNotFound");
        assert!(msg.contains("ghost"));

        sp.node_names = vec![NodeName("cpu-0".into())];
        let (reason, msg) = select(&sp, &cluster()).blocker().unwrap();
        assert_eq!(reason, "NoNodesSelected");
        assert!(
            msg.contains("cpu-0 (no allocatable nvidia.com/gpu)"),
            "{msg}"
        );
    }

    #[test]
    fn an_invalid_selector_is_reported_not_retried() {
        let mut sp = spec();
        sp.node_selector = Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "pool".into(),
                operator: "Sometimes".into(),
                values: None,
            }]),
            ..Default::default()
        });
        let (reason, msg) = select(&sp, &cluster()).blocker().unwrap();
        assert_eq!(reason, "InvalidSpec");
        assert!(msg.contains("spec.nodeSelector"));
    }
}
