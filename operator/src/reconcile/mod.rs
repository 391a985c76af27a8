//! The reconcile decision, as named pure steps: from a validation, what the cluster looks like
//! (nodes, this validation's pods and results) and the time, compute the next status and the
//! actions (pods to create or delete, results to delete, events, nodes to mark).
//!
//! A run is one spec generation. Its node set is resolved once, when the generation is first
//! seen, and kept in `status.nodes` ([`start`]); each node's verdict then follows its pod and
//! its result ([`advance`]); the verdicts add up to counts and a phase ([`summarize`]), which
//! set the kstatus conditions ([`kstatus`]); [`events`] says what to tell and when to look
//! again. [`next`] runs the steps in that order; the shell (`controller`) observes the cluster
//! into a [`World`] and applies the [`Step`].

pub mod advance;
pub mod clock;
pub mod events;
pub mod kstatus;
pub mod start;
pub mod summarize;
pub mod view;

use std::collections::BTreeMap;
use std::time::Duration;

use gpuval_crds::{GpuValidation, GpuValidationStatus, NodeStatus, NodeVerdict, Phase, Summary};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::selection::Selection;

pub use advance::RESULT_GRACE;
pub use clock::RunClock;
pub use events::{PlannedEvent, RUNNING_REQUEUE};
pub use view::{PodPhase, PodView, ResultView, World};

/// Longest node message kept in the validation status (the full report is in the result).
pub const MAX_MESSAGE: usize = 200;

/// Everything the shell should do.
#[derive(Debug, Clone, Default)]
pub struct Step {
    pub status: GpuValidationStatus,
    /// (node, gpus) that need an agent pod for this generation.
    pub create_pods: Vec<(String, i32)>,
    pub delete_pods: Vec<String>,
    pub delete_results: Vec<String>,
    pub events: Vec<PlannedEvent>,
    /// Nodes that just failed (for onFailure actions).
    pub newly_failed: Vec<String>,
    /// None: nothing to wait for (terminal); the controller's periodic resync still runs.
    pub requeue_after: Option<Duration>,
}

/// `s`, cut to [`MAX_MESSAGE`] bytes (with `...`) at a character boundary.
fn truncate(s: &str) -> String {
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Computes the next step at time `now`. `select` is called only when this generation has no
/// node set yet.
pub fn next(
    gv: &GpuValidation,
    world: &World,
    now: Timestamp,
    select: impl FnOnce() -> Selection,
) -> Step {
    let generation = gv.metadata.generation.unwrap_or(0);
    let now_t = Time(now);
    let previous = gv.status.clone().unwrap_or_default();
    let same_run = start::is_same_run(&previous, generation);
    let stale = start::leftovers(world, generation);
    let mut step = Step {
        delete_pods: stale.pods,
        delete_results: stale.results,
        ..Default::default()
    };

    if same_run && previous.phase.is_some_and(Phase::is_terminal) {
        // A finished run stays as it ended (a blocked one has no node lines to count again).
        step.status = previous;
        return step;
    }
    let mut status = if same_run {
        previous
    } else {
        match start::start_run(generation, &previous, &select(), &now_t) {
            start::RunStart::Blocked { status, event } => {
                step.events.push(event);
                step.status = status;
                return step;
            }
            start::RunStart::Started { status, event } => {
                step.events.push(event);
                status
            }
        }
    };

    let clock = RunClock::new(
        now,
        status.start_time.as_ref(),
        gv.spec.deadline_or_default(),
    );
    let waiting_for_result = advance_nodes(&mut status.nodes, world, generation, &clock, &mut step);

    let (phase, summary) = conclude(&mut status, generation, &now_t);
    if phase.is_terminal() {
        step.events.push(events::finished(phase, &summary));
    }
    step.requeue_after = events::requeue_after(phase, &clock, waiting_for_result);
    step.status = status;
    step
}

/// Sets the counts, the phase, the conditions and (once the run is over) the completion time
/// from the node lines of `status`.
fn conclude(status: &mut GpuValidationStatus, generation: i64, now: &Time) -> (Phase, Summary) {
    let summary = summarize::count(&status.nodes);
    let phase = summarize::phase_of(&summary);
    kstatus::set_for_phase(
        &mut status.conditions,
        phase,
        &summary,
        &status.nodes,
        generation,
        now,
    );
    if phase.is_terminal() {
        status.completion_time.get_or_insert_with(|| now.clone());
    }
    status.phase = Some(phase);
    status.summary = Some(summary.clone());
    (phase, summary)
}

/// Advances every node without a final verdict (see [`advance::advance_node`]), adding the
/// pods to create or delete, the nodes that failed and their events to `step`. Returns true
/// when a finished agent's result is awaited.
fn advance_nodes(
    nodes: &mut [NodeStatus],
    world: &World,
    generation: i64,
    clock: &RunClock,
    step: &mut Step,
) -> bool {
    let pods: BTreeMap<&str, &PodView> = world
        .pods
        .iter()
        .filter(|p| p.generation == generation)
        .map(|p| (p.node.as_str(), p))
        .collect();
    let results: BTreeMap<&str, &ResultView> = world
        .results
        .iter()
        .filter(|r| r.generation == generation)
        .map(|r| (r.node.as_str(), r))
        .collect();
    let mut waiting_for_result = false;
    for line in nodes.iter_mut().filter(|l| !l.verdict.is_final()) {
        let seen = advance::Seen {
            pod: pods.get(line.name.as_str()).copied(),
            result: results.get(line.name.as_str()).copied(),
            node_exists: world.nodes.contains(&line.name),
        };
        let next = advance::advance_node(line, seen, clock);
        *line = next.line;
        waiting_for_result |= next.waiting_for_result;
        match next.pod {
            Some(advance::PodChange::Create) => {
                step.create_pods.push((line.name.clone(), line.gpus))
            }
            Some(advance::PodChange::Delete(pod)) => step.delete_pods.push(pod),
            None => {}
        }
        if line.verdict.is_final() && line.verdict != NodeVerdict::Passed {
            step.newly_failed.push(line.name.clone());
            step.events.push(events::node_failed(line));
        }
    }
    waiting_for_result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::{SelectedNode, Selection};
    use gpuval_crds::conditions::{self, READY, RECONCILING, STALLED};
    use gpuval_crds::{GpuValidationSpec, Verdict};

    fn gv(generation: i64, status: Option<GpuValidationStatus>) -> GpuValidation {
        let mut g = GpuValidation::new("acceptance", crate::selection::tests::spec());
        g.metadata.generation = Some(generation);
        g.status = status;
        g
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + secs).unwrap()
    }

    fn two_nodes() -> Selection {
        Selection {
            selected: vec![
                SelectedNode {
                    name: "a".into(),
                    gpus: 8,
                },
                SelectedNode {
                    name: "b".into(),
                    gpus: 8,
                },
            ],
            ..Default::default()
        }
    }

    /// The cluster at `secs` into the run: both nodes exist.
    fn world(secs: i64, pods: Vec<PodView>, results: Vec<ResultView>) -> (Timestamp, World) {
        let w = World {
            nodes: ["a".into(), "b".into()].into(),
            pods,
            results,
        };
        (at(secs), w)
    }

    fn pod(node: &str, phase: PodPhase) -> PodView {
        PodView {
            name: format!("pod-{node}"),
            node: node.into(),
            generation: 1,
            phase,
            ..Default::default()
        }
    }

    fn result(node: &str, v: Verdict, summary: &str) -> ResultView {
        ResultView {
            name: format!("acceptance-{node}"),
            node: node.into(),
            generation: 1,
            verdict: v,
            summary: summary.into(),
        }
    }

    /// Feeds each step's status back in, as the API server would.
    fn run(steps: &[(Timestamp, World)]) -> Vec<Step> {
        let mut g = gv(1, None);
        let mut out = Vec::new();
        for (now, w) in steps {
            let s = next(&g, w, *now, two_nodes);
            g.status = Some(s.status.clone());
            out.push(s);
        }
        out
    }

    #[test]
    fn a_new_run_resolves_nodes_and_creates_one_pod_each() {
        let s = &run(&[world(0, vec![], vec![])])[0];
        assert_eq!(
            s.create_pods,
            vec![("a".to_string(), 8), ("b".to_string(), 8)]
        );
        assert_eq!(s.status.phase, Some(Phase::Pending));
        assert_eq!(s.status.observed_generation, Some(1));
        assert!(conditions::is_true(&s.status.conditions, RECONCILING));
        assert!(!conditions::is_true(&s.status.conditions, READY));
        assert_eq!(s.events[0].reason, "Started");
        assert!(s.requeue_after.is_some());
    }

    #[test]
    fn all_pass_gives_passed_and_ready() {
        let steps = run(&[
            world(0, vec![], vec![]),
            world(
                5,
                vec![pod("a", PodPhase::Running), pod("b", PodPhase::Running)],
                vec![],
            ),
            world(
                60,
                vec![pod("a", PodPhase::Succeeded), pod("b", PodPhase::Succeeded)],
                vec![
                    result("a", Verdict::Pass, ""),
                    result("b", Verdict::Warn, "GPU1 throttled"),
                ],
            ),
        ]);
        assert_eq!(steps[1].status.phase, Some(Phase::Running));
        assert!(
            steps[1].create_pods.is_empty(),
            "pods exist; nothing to create"
        );
        let last = &steps[2].status;
        assert_eq!(last.phase, Some(Phase::Passed));
        assert!(conditions::is_true(&last.conditions, READY));
        assert!(!conditions::is_true(&last.conditions, STALLED));
        assert_eq!(last.summary.as_ref().unwrap().passed, 2);
        assert!(last.completion_time.is_some());
        assert_eq!(steps[2].events.last().unwrap().reason, "Passed");
        assert_eq!(steps[2].requeue_after, None);
    }

    #[test]
    fn one_failing_node_fails_the_run_and_names_it() {
        let steps = run(&[
            world(0, vec![], vec![]),
            world(
                60,
                vec![pod("a", PodPhase::Succeeded), pod("b", PodPhase::Succeeded)],
                vec![
                    result("a", Verdict::Pass, ""),
                    result("b", Verdict::Fail, "GPU3 memory: 2 mismatched words"),
                ],
            ),
        ]);
        let s = &steps[1].status;
        assert_eq!(s.phase, Some(Phase::Failed));
        assert!(conditions::is_true(&s.conditions, STALLED));
        let stalled = conditions::find(&s.conditions, STALLED).unwrap();
        assert!(
            stalled.message.contains("b Failed: GPU3 memory"),
            "{}",
            stalled.message
        );
        assert_eq!(steps[1].newly_failed, vec!["b".to_string()]);
        assert!(
            steps[1]
                .events
                .iter()
                .any(|e| e.reason == "NodeFailed" && e.note.contains("GPU3"))
        );
    }

    #[test]
    fn a_failed_pod_is_an_error_with_its_reason_and_the_run_completes() {
        let mut p = pod("b", PodPhase::Failed);
        p.reason = Some("OOMKilled (exit code 137)".into());
        let steps = run(&[
            world(0, vec![], vec![]),
            world(
                30,
                vec![pod("a", PodPhase::Succeeded), p],
                vec![result("a", Verdict::Pass, "")],
            ),
        ]);
        let b = &steps[1].status.nodes[1];
        assert_eq!(b.verdict, NodeVerdict::Error);
        assert!(b.message.as_deref().unwrap().contains("OOMKilled"));
        assert_eq!(steps[1].status.phase, Some(Phase::Failed));
    }

    #[test]
    fn deadline_gives_deadline_exceeded_and_removes_pods() {
        let steps = run(&[
            world(0, vec![], vec![]),
            world(
                3601,
                vec![pod("a", PodPhase::Running), pod("b", PodPhase::Running)],
                vec![result("a", Verdict::Pass, "")],
            ),
        ]);
        let s = &steps[1];
        assert_eq!(s.status.nodes[1].verdict, NodeVerdict::DeadlineExceeded);
        assert_eq!(s.status.nodes[0].verdict, NodeVerdict::Passed);
        assert_eq!(s.delete_pods, vec!["pod-b".to_string()]);
        assert_eq!(s.status.phase, Some(Phase::Failed));
    }

    #[test]
    fn a_vanished_pod_or_node_is_an_error() {
        let mut w = world(40, vec![], vec![]);
        w.1.nodes.remove("b");
        let steps = run(&[
            world(0, vec![], vec![]),
            world(
                5,
                vec![pod("a", PodPhase::Running), pod("b", PodPhase::Running)],
                vec![],
            ),
            w,
        ]);
        assert_eq!(
            steps[2].status.nodes[0].verdict,
            NodeVerdict::Error,
            "pod a vanished"
        );
        assert!(
            steps[2].status.nodes[0]
                .message
                .as_deref()
                .unwrap()
                .contains("disappeared")
        );
        assert!(
            steps[2].status.nodes[1]
                .message
                .as_deref()
                .unwrap()
                .contains("node was deleted")
        );
    }

    #[test]
    fn succeeded_without_result_waits_then_errors() {
        let mut done = pod("a", PodPhase::Succeeded);
        done.finished_at = Some(at(10));
        let steps = run(&[
            world(0, vec![], vec![]),
            world(12, vec![done.clone(), pod("b", PodPhase::Running)], vec![]),
            world(45, vec![done, pod("b", PodPhase::Running)], vec![]),
        ]);
        assert_eq!(steps[1].status.nodes[0].verdict, NodeVerdict::Running);
        assert!(steps[1].requeue_after.unwrap() <= Duration::from_secs(5));
        assert_eq!(steps[2].status.nodes[0].verdict, NodeVerdict::Error);
    }

    #[test]
    fn the_same_world_twice_gives_the_same_status() {
        let w = world(
            5,
            vec![pod("a", PodPhase::Running), pod("b", PodPhase::Pending)],
            vec![],
        );
        let steps = run(&[world(0, vec![], vec![]), w.clone()]);
        let mut g = gv(1, Some(steps[1].status.clone()));
        let again = next(&g, &w.1, at(9), two_nodes);
        assert_eq!(
            again.status, steps[1].status,
            "no change, no new status (no reconcile storm)"
        );
        assert!(again.events.is_empty());
        g.status = Some(again.status);
    }

    #[test]
    fn a_new_generation_starts_over_and_cleans_up_the_old_run() {
        let first = run(&[world(0, vec![], vec![])]);
        let mut g = gv(2, Some(first[0].status.clone()));
        g.spec = GpuValidationSpec { ..g.spec.clone() };
        let old_pod = pod("a", PodPhase::Running);
        let old_result = result("b", Verdict::Pass, "");
        let (now, w) = world(10, vec![old_pod], vec![old_result]);
        let s = next(&g, &w, now, two_nodes);
        assert_eq!(s.status.observed_generation, Some(2));
        assert_eq!(s.delete_pods, vec!["pod-a".to_string()]);
        assert_eq!(s.delete_results, vec!["acceptance-b".to_string()]);
        assert_eq!(s.create_pods.len(), 2);
        assert!(
            s.status
                .nodes
                .iter()
                .all(|n| n.verdict == NodeVerdict::Pending)
        );
    }

    #[test]
    fn a_selection_that_matches_nothing_stalls() {
        let g = gv(1, None);
        let (now, w) = world(0, vec![], vec![]);
        let s = next(&g, &w, now, Selection::default);
        assert_eq!(s.status.phase, Some(Phase::Failed));
        let stalled = conditions::find(&s.status.conditions, STALLED).unwrap();
        assert_eq!(stalled.reason, "NoNodesSelected");
        assert!(s.create_pods.is_empty());
        assert_eq!(s.requeue_after, None);
    }
    #[test]
    fn a_blocked_run_stays_blocked() {
        let g = gv(1, None);
        let (now, w) = world(0, vec![], vec![]);
        let first = next(&g, &w, now, Selection::default);
        let g = gv(1, Some(first.status.clone()));
        let again = next(&g, &w, at(5), || {
            unreachable!("the node set is resolved once")
        });
        assert_eq!(again.status, first.status, "still Failed and Stalled");
        assert!(again.events.is_empty());
        assert_eq!(again.requeue_after, None);
    }

    #[test]
    fn a_finished_run_is_left_as_it_ended() {
        let done = |node| pod(node, PodPhase::Succeeded);
        let passed = |node| result(node, Verdict::Pass, "");
        let (now, w) = world(
            60,
            vec![done("a"), done("b")],
            vec![passed("a"), passed("b")],
        );
        let steps = run(&[world(0, vec![], vec![]), (now, w.clone())]);
        assert_eq!(steps[1].status.phase, Some(Phase::Passed));
        let g = gv(1, Some(steps[1].status.clone()));
        let again = next(&g, &w, at(900), two_nodes);
        assert_eq!(again.status, steps[1].status);
        assert!(again.events.is_empty(), "Passed is told once");
        assert_eq!(again.requeue_after, None);
    }
}
