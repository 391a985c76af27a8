//! The start of a run: a new spec generation resolves its node set once and records it, and
//! whatever earlier generations left behind goes.

use std::collections::BTreeMap;

use gpuval_crds::{GpuValidationStatus, NodeStatus, NodeVerdict, Phase, Summary};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::events::{self, PlannedEvent};
use super::kstatus;
use super::view::World;
use crate::decide::selection::Selection;

/// How a new generation's run begins.
#[derive(Debug, Clone, PartialEq)]
pub enum RunStart {
    /// The node set is recorded (in `nodes`, the operator's record of the run); every node
    /// waits for its agent pod.
    Started {
        status: GpuValidationStatus,
        nodes: Vec<NodeStatus>,
        event: PlannedEvent,
    },
    /// The spec cannot run (invalid selector, unknown node names, no node): the run is
    /// Failed and Stalled at once.
    Blocked {
        status: GpuValidationStatus,
        event: PlannedEvent,
    },
}

/// True when `previous` already describes a run of `generation`.
pub fn is_same_run(previous: &GpuValidationStatus, generation: i64) -> bool {
    previous.observed_generation == Some(generation) && previous.phase.is_some()
}

/// Pods and results made for other generations (by name), to delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Pods of other generations not already being deleted.
    pub pods: Vec<String>,
    pub results: Vec<String>,
}

/// What earlier (or later) generations left in `world`.
pub fn leftovers(world: &World, generation: i64) -> Leftovers {
    Leftovers {
        pods: world
            .pods
            .iter()
            .filter(|p| p.generation != generation && !p.deleting)
            .map(|p| p.name.clone())
            .collect(),
        results: world
            .results
            .iter()
            .filter(|r| r.generation != generation)
            .map(|r| r.name.clone())
            .collect(),
    }
}

/// Starts the run of `generation` on `selection`, keeping the previous status's conditions
/// (so their transition times stay meaningful).
pub fn start_run(
    generation: i64,
    previous: &GpuValidationStatus,
    selection: &Selection,
    now: &Time,
) -> RunStart {
    let mut status = GpuValidationStatus {
        observed_generation: Some(generation),
        conditions: previous.conditions.clone(),
        selection: Some(selection.describe()),
        ..Default::default()
    };
    if let Some((reason, message)) = selection.blocker() {
        status.phase = Some(Phase::Failed);
        status.summary = Some(Summary::default());
        status.completion_time = Some(now.clone());
        kstatus::set_blocked(&mut status.conditions, reason, &message, generation, now);
        let event = events::blocked(reason, &message);
        return RunStart::Blocked { status, event };
    }
    status.phase = Some(Phase::Pending);
    status.start_time = Some(now.clone());
    let nodes: Vec<NodeStatus> = selection
        .selected
        .iter()
        .map(|n| pending(&n.name, n.gpus))
        .collect();
    let event = events::started(nodes.len(), generation);
    RunStart::Started {
        status,
        nodes,
        event,
    }
}

/// A node waiting for its agent pod.
fn pending(name: &str, gpus: i32) -> NodeStatus {
    NodeStatus {
        name: name.to_string(),
        verdict: NodeVerdict::Pending,
        gpus,
        message: None,
        result: None,
        codes: None,
        action: None,
        evidence: None,
    }
}

/// Rebuilds the record of a running run of `generation` when the operator holds none (it
/// restarted): the node lines `previous` lists (with their verdicts), every node with a pod or
/// a result of this generation (their state follows from the pod and result again), and, while
/// fewer nodes are known than the run selected (pods not all created when the operator
/// stopped), the first others of `selection`, the node set resolved again. GPU counts come
/// from `selection` (0 for a node it no longer selects: such a node has its pod already).
pub fn recover(
    previous: &GpuValidationStatus,
    world: &World,
    generation: i64,
    selection: &Selection,
) -> Vec<NodeStatus> {
    let gpus: BTreeMap<&str, i32> = selection
        .selected
        .iter()
        .map(|n| (n.name.as_str(), n.gpus))
        .collect();
    let gpus_of = |name: &str| gpus.get(name).copied().unwrap_or(0);
    let mut known: BTreeMap<String, NodeStatus> = previous
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.clone()))
        .collect();
    let of_run = world
        .pods_of(generation)
        .map(|p| p.node.as_str())
        .chain(world.results_of(generation).map(|r| r.node.as_str()));
    for node in of_run {
        known
            .entry(node.to_string())
            .or_insert_with(|| pending(node, gpus_of(node)));
    }
    let selected = previous.summary.as_ref().map_or(0, |s| s.selected);
    for n in &selection.selected {
        if known.len() >= usize::try_from(selected).unwrap_or(0) {
            break;
        }
        known
            .entry(n.name.clone())
            .or_insert_with(|| pending(&n.name, n.gpus));
    }
    for line in known.values_mut().filter(|l| l.gpus == 0) {
        line.gpus = gpus_of(&line.name);
    }
    known.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::reconcile::view::{PodView, ResultView};
    use gpuval_crds::Verdict;
    use gpuval_crds::conditions::{STALLED, find, is_true};
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::from_second(1_790_000_000).unwrap())
    }

    fn earlier_status() -> GpuValidationStatus {
        let mut conditions = Vec::new();
        kstatus::set_blocked(&mut conditions, "InvalidSpec", "bad selector", 1, &now());
        GpuValidationStatus {
            observed_generation: Some(1),
            phase: Some(Phase::Failed),
            conditions,
            ..Default::default()
        }
    }

    #[test]
    fn a_run_is_the_same_only_for_a_recorded_generation_with_a_phase() {
        let prev = earlier_status();
        assert!(is_same_run(&prev, 1));
        assert!(!is_same_run(&prev, 2));
        let no_phase = GpuValidationStatus {
            phase: None,
            ..prev
        };
        assert!(!is_same_run(&no_phase, 1));
    }

    #[test]
    fn leftovers_are_other_generations_not_already_going() {
        let pod = |name: &str, generation, deleting| PodView {
            name: name.into(),
            generation,
            deleting,
            ..Default::default()
        };
        let result = |name: &str, generation| ResultView {
            name: name.into(),
            node: "n".into(),
            generation,
            verdict: Verdict::Pass,
            summary: String::new(),
            fabric: Vec::new(),
            ports: None,
            facts: Default::default(),
        };
        let world = World {
            pods: vec![
                pod("old", 1, false),
                pod("going", 1, true),
                pod("new", 2, false),
            ],
            results: vec![result("r-old", 1), result("r-new", 2)],
            ..Default::default()
        };
        assert_eq!(
            leftovers(&world, 2),
            Leftovers {
                pods: vec!["old".into()],
                results: vec!["r-old".into()],
            }
        );
    }

    #[test]
    fn a_started_run_records_every_selected_node_as_pending() {
        let mut sel = selected(&["a", "b"]);
        sel.selected[1].gpus = 4;
        sel.excluded = vec![("c".into(), "cordoned".into())];
        let RunStart::Started {
            status,
            nodes,
            event,
        } = start_run(2, &earlier_status(), &sel, &now())
        else {
            panic!("two nodes can run");
        };
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.phase, Some(Phase::Pending));
        assert_eq!(status.start_time, Some(now()));
        assert_eq!(status.completion_time, None);
        assert_eq!(status.selection, Some(sel.describe()));
        assert!(status.nodes.is_empty(), "the phase step lists nodes");
        assert_eq!(
            lines(&nodes),
            [
                ("a", NodeVerdict::Pending, 8),
                ("b", NodeVerdict::Pending, 4)
            ]
        );
        assert!(
            find(&status.conditions, STALLED).is_some(),
            "earlier conditions are kept for the phase step to update"
        );
        assert_eq!(event.note, "validating 2 node(s), generation 2");
    }

    #[test]
    fn a_blocked_run_fails_at_once_and_stalls_with_the_reason() {
        let sel = Selection {
            missing: vec!["ghost".into()],
            ..Default::default()
        };
        let RunStart::Blocked { status, event } =
            start_run(3, &GpuValidationStatus::default(), &sel, &now())
        else {
            panic!("a missing node blocks the run");
        };
        assert_eq!(status.phase, Some(Phase::Failed));
        assert_eq!(status.completion_time, Some(now()));
        assert!(status.nodes.is_empty());
        let stalled = find(&status.conditions, STALLED).unwrap();
        assert_eq!(stalled.reason, "NodeNotFound");
        assert_eq!(stalled.observed_generation, Some(3));
        assert!(is_true(&status.conditions, STALLED));
        assert!(event.warning);
        assert_eq!(event.reason, "NodeNotFound");
        assert!(event.note.contains("ghost"));
    }

    /// (name, verdict, GPUs) of each node line.
    fn lines(nodes: &[NodeStatus]) -> Vec<(&str, NodeVerdict, i32)> {
        nodes
            .iter()
            .map(|n| (n.name.as_str(), n.verdict, n.gpus))
            .collect()
    }

    fn selected(names: &[&str]) -> Selection {
        Selection::of_nodes(names.iter().copied(), 8)
    }

    #[test]
    fn a_run_is_recovered_from_listed_lines_pods_results_then_the_selection() {
        let previous = GpuValidationStatus {
            observed_generation: Some(2),
            phase: Some(Phase::Running),
            summary: Some(Summary {
                selected: 4,
                ..Default::default()
            }),
            nodes: vec![NodeStatus {
                name: "c".into(),
                verdict: NodeVerdict::Error,
                message: Some("the node was deleted before it reported".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let world = World {
            pods: vec![
                PodView {
                    node: "a".into(),
                    generation: 2,
                    ..Default::default()
                },
                PodView {
                    node: "old".into(),
                    generation: 1,
                    ..Default::default()
                },
            ],
            results: vec![ResultView {
                name: "v-b".into(),
                node: "b".into(),
                generation: 2,
                verdict: Verdict::Pass,
                summary: String::new(),
                fabric: Vec::new(),
                ports: None,
                facts: Default::default(),
            }],
            ..Default::default()
        };
        // A node joined since the start ("aa"): only one more is needed, so "e" is not taken.
        let nodes = recover(&previous, &world, 2, &selected(&["a", "aa", "b", "e"]));
        assert_eq!(
            lines(&nodes),
            [
                ("a", NodeVerdict::Pending, 8),
                ("aa", NodeVerdict::Pending, 8),
                ("b", NodeVerdict::Pending, 8),
                ("c", NodeVerdict::Error, 0),
            ]
        );
    }

    #[test]
    fn a_run_with_every_pod_created_is_recovered_without_the_selection() {
        let previous = GpuValidationStatus {
            summary: Some(Summary {
                selected: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let world = World {
            pods: vec![PodView {
                node: "a".into(),
                generation: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        let nodes = recover(&previous, &world, 1, &selected(&["z"]));
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].name, "a");
    }
}
