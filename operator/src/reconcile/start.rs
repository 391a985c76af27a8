//! The start of a run: a new spec generation resolves its node set once and records it, and
//! whatever earlier generations left behind goes.

use gpuval_crds::{GpuValidationStatus, NodeStatus, NodeVerdict, Phase, Summary};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::events::{self, PlannedEvent};
use super::kstatus;
use super::view::World;
use crate::selection::Selection;

/// How a new generation's run begins.
#[derive(Debug, Clone, PartialEq)]
pub enum RunStart {
    /// The node set is recorded in the status; every node waits for its agent pod.
    Started {
        status: GpuValidationStatus,
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
    status.nodes = selection
        .selected
        .iter()
        .map(|n| NodeStatus {
            name: n.name.clone(),
            verdict: NodeVerdict::Pending,
            gpus: n.gpus,
            message: None,
            result: None,
        })
        .collect();
    let event = events::started(status.nodes.len(), generation);
    RunStart::Started { status, event }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::view::{PodView, ResultView};
    use crate::selection::SelectedNode;
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
        let sel = Selection {
            selected: vec![
                SelectedNode {
                    name: "a".into(),
                    gpus: 8,
                },
                SelectedNode {
                    name: "b".into(),
                    gpus: 4,
                },
            ],
            excluded: vec![("c".into(), "cordoned".into())],
            ..Default::default()
        };
        let RunStart::Started { status, event } = start_run(2, &earlier_status(), &sel, &now())
        else {
            panic!("two nodes can run");
        };
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.phase, Some(Phase::Pending));
        assert_eq!(status.start_time, Some(now()));
        assert_eq!(status.completion_time, None);
        assert_eq!(status.selection, Some(sel.describe()));
        let nodes: Vec<_> = status
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.gpus, n.verdict))
            .collect();
        assert_eq!(
            nodes,
            vec![
                ("a", 8, NodeVerdict::Pending),
                ("b", 4, NodeVerdict::Pending)
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
}
