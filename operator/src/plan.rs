//! The reconcile decision, as a pure function: from a validation, what the cluster looks like
//! (nodes, this validation's pods and results) and the time, compute the next status and the
//! actions (pods to create or delete, results to delete, events, nodes to mark).
//!
//! A run is one spec generation. Its node set is resolved once, when the generation is first
//! seen, and kept in `status.nodes`; each node's verdict then follows its pod and its result.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuval_crds::conditions::{self, READY, RECONCILING, STALLED};
use gpuval_crds::{
    GpuValidation, GpuValidationStatus, NodeStatus, NodeVerdict, Phase, Summary, Verdict,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::selection::Selection;

/// Longest node message kept in the validation status (the full report is in the result).
pub const MAX_MESSAGE: usize = 200;
/// How long a pod may sit Succeeded before a missing result counts as an error (the result
/// watch can trail the pod watch).
pub const RESULT_GRACE: Duration = Duration::from_secs(30);
/// Requeue while a run is in progress (watches can miss events).
pub const RUNNING_REQUEUE: Duration = Duration::from_secs(30);

/// One of this validation's agent pods, as far as the plan cares.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodView {
    pub name: String,
    pub node: String,
    pub generation: i64,
    /// Pending, Running, Succeeded, Failed, Unknown.
    pub phase: String,
    /// Why the pod failed or is stuck, in words (Evicted: ..., OOMKilled, exit code 137, ...).
    pub reason: Option<String>,
    pub deleting: bool,
    /// When the agent container finished (Succeeded/Failed pods).
    pub finished_at: Option<Timestamp>,
}

/// One of this validation's node results (metadata only: verdict label and summary annotation).
#[derive(Debug, Clone, PartialEq)]
pub struct ResultView {
    pub name: String,
    pub node: String,
    pub generation: i64,
    pub verdict: Verdict,
    pub summary: String,
}

/// What the cluster looks like now.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub now: Option<Timestamp>,
    /// Names of nodes that exist.
    pub nodes: BTreeSet<String>,
    pub pods: Vec<PodView>,
    pub results: Vec<ResultView>,
}

/// A Kubernetes event to publish about the validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

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

fn node_verdict_of(v: Verdict) -> NodeVerdict {
    match v {
        Verdict::Pass | Verdict::Warn | Verdict::Skipped => NodeVerdict::Passed,
        Verdict::Fail => NodeVerdict::Failed,
        Verdict::Error => NodeVerdict::Error,
    }
}

/// Computes the next step. `select` is called only when this generation has no node set yet.
pub fn next(gv: &GpuValidation, world: &World, select: impl FnOnce() -> Selection) -> Step {
    let now = world.now.unwrap_or_else(Timestamp::now);
    let now_t = Time(now);
    let generation = gv.metadata.generation.unwrap_or(0);
    let mut step = Step::default();
    let prev = gv.status.clone().unwrap_or_default();
    let same_run = prev.observed_generation == Some(generation) && prev.phase.is_some();

    // Anything left over from other generations goes.
    step.delete_pods = world
        .pods
        .iter()
        .filter(|p| p.generation != generation && !p.deleting)
        .map(|p| p.name.clone())
        .collect();
    step.delete_results = world
        .results
        .iter()
        .filter(|r| r.generation != generation)
        .map(|r| r.name.clone())
        .collect();

    let mut status = if same_run {
        prev.clone()
    } else {
        let sel = select();
        let mut s = GpuValidationStatus {
            observed_generation: Some(generation),
            conditions: prev.conditions.clone(),
            selection: Some(sel.describe()),
            ..Default::default()
        };
        if let Some((reason, message)) = sel.blocker() {
            s.phase = Some(Phase::Failed);
            s.summary = Some(Summary::default());
            s.completion_time = Some(now_t.clone());
            let (c, g) = (&mut s.conditions, Some(generation));
            conditions::set_condition(c, READY, false, reason, &message, g, &now_t);
            conditions::set_condition(c, RECONCILING, false, reason, &message, g, &now_t);
            conditions::set_condition(c, STALLED, true, reason, &message, g, &now_t);
            step.events.push(PlannedEvent {
                warning: true,
                reason,
                note: truncate(&message),
            });
            step.status = s;
            return step;
        }
        s.phase = Some(Phase::Pending);
        s.start_time = Some(now_t.clone());
        s.nodes = sel
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
        step.events.push(PlannedEvent {
            warning: false,
            reason: "Started",
            note: format!(
                "validating {} node(s), generation {generation}",
                s.nodes.len()
            ),
        });
        s
    };

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
    let deadline = gv.spec.deadline_or_default().as_std();
    let started = status.start_time.as_ref().map(|t| t.0).unwrap_or(now);
    let elapsed = now
        .duration_since(started)
        .try_into()
        .unwrap_or(Duration::ZERO);
    let past_deadline = elapsed >= deadline;
    let mut wait_for_result = false;

    for line in status.nodes.iter_mut() {
        if line.verdict.is_final() {
            continue;
        }
        let before = line.verdict;
        let pod = pods.get(line.name.as_str()).copied();
        if let Some(r) = results.get(line.name.as_str()) {
            line.verdict = node_verdict_of(r.verdict);
            line.message = (!r.summary.is_empty()).then(|| truncate(&r.summary));
            line.result = Some(r.name.clone());
        } else if past_deadline {
            line.verdict = NodeVerdict::DeadlineExceeded;
            line.message = Some(format!(
                "no verdict within the deadline ({})",
                gv.spec.deadline_or_default()
            ));
            if let Some(p) = pod.filter(|p| !p.deleting) {
                step.delete_pods.push(p.name.clone());
            }
        } else if !world.nodes.contains(&line.name) {
            line.verdict = NodeVerdict::Error;
            line.message = Some("the node was deleted before it reported".into());
        } else {
            match pod {
                None if before == NodeVerdict::Running => {
                    line.verdict = NodeVerdict::Error;
                    line.message = Some("the agent pod disappeared before it reported".into());
                }
                None => {
                    step.create_pods.push((line.name.clone(), line.gpus));
                    line.verdict = NodeVerdict::Pending;
                }
                Some(p) if p.deleting => {
                    line.verdict = NodeVerdict::Error;
                    line.message = Some("the agent pod was deleted before it reported".into());
                }
                Some(p) => match p.phase.as_str() {
                    "Running" => {
                        line.verdict = NodeVerdict::Running;
                        line.message = None;
                    }
                    "Succeeded" => {
                        let waited: Duration = p
                            .finished_at
                            .map(|f| now.duration_since(f).try_into().unwrap_or(Duration::ZERO))
                            .unwrap_or(Duration::ZERO);
                        if waited >= RESULT_GRACE {
                            line.verdict = NodeVerdict::Error;
                            line.message =
                                Some("the agent exited without storing its result".into());
                        } else {
                            line.verdict = NodeVerdict::Running;
                            wait_for_result = true;
                        }
                    }
                    "Failed" => {
                        line.verdict = NodeVerdict::Error;
                        line.message = Some(truncate(&format!(
                            "agent pod failed: {}",
                            p.reason.as_deref().unwrap_or("no reason given")
                        )));
                    }
                    _ => {
                        line.verdict = NodeVerdict::Pending;
                        line.message = p.reason.as_ref().map(|r| truncate(r));
                    }
                },
            }
        }
        if line.verdict.is_final() && !matches!(line.verdict, NodeVerdict::Passed) {
            step.newly_failed.push(line.name.clone());
            step.events.push(PlannedEvent {
                warning: true,
                reason: "NodeFailed",
                note: truncate(&format!(
                    "{}: {:?}: {}",
                    line.name,
                    line.verdict,
                    line.message.as_deref().unwrap_or("")
                )),
            });
        }
    }

    // Summary, phase and conditions.
    let mut sum = Summary {
        selected: status.nodes.len() as i32,
        ..Default::default()
    };
    for n in &status.nodes {
        match n.verdict {
            NodeVerdict::Pending => sum.pending += 1,
            NodeVerdict::Running => sum.running += 1,
            NodeVerdict::Passed => sum.passed += 1,
            NodeVerdict::Failed | NodeVerdict::Error | NodeVerdict::DeadlineExceeded => {
                sum.failed += 1
            }
        }
    }
    let done = sum.passed + sum.failed;
    let all_final = done == sum.selected;
    let was_terminal = same_run && prev.phase.is_some_and(Phase::is_terminal);
    let phase = if all_final {
        if sum.failed == 0 {
            Phase::Passed
        } else {
            Phase::Failed
        }
    } else if sum.running > 0 || done > 0 {
        Phase::Running
    } else {
        Phase::Pending
    };
    status.phase = Some(phase);
    status.summary = Some(sum.clone());
    let g = Some(generation);
    let progress = format!(
        "{done}/{} node(s) done, {} passed, {} failed",
        sum.selected, sum.passed, sum.failed
    );
    let c = &mut status.conditions;
    match phase {
        Phase::Passed => {
            let msg = format!("all {} node(s) passed", sum.selected);
            conditions::set_condition(c, READY, true, "Passed", &msg, g, &now_t);
            conditions::set_condition(c, RECONCILING, false, "Passed", &msg, g, &now_t);
            conditions::set_condition(c, STALLED, false, "Passed", "", g, &now_t);
        }
        Phase::Failed => {
            let first: Vec<String> = status
                .nodes
                .iter()
                .filter(|n| n.verdict.is_final() && n.verdict != NodeVerdict::Passed)
                .take(3)
                .map(|n| {
                    format!(
                        "{} {:?}: {}",
                        n.name,
                        n.verdict,
                        n.message.as_deref().unwrap_or("")
                    )
                })
                .collect();
            let msg = truncate(&format!(
                "{} of {} node(s) failed; {}",
                sum.failed,
                sum.selected,
                first.join("; ")
            ));
            conditions::set_condition(c, READY, false, "NodesFailed", &msg, g, &now_t);
            conditions::set_condition(c, RECONCILING, false, "NodesFailed", &progress, g, &now_t);
            conditions::set_condition(c, STALLED, true, "NodesFailed", &msg, g, &now_t);
        }
        Phase::Pending | Phase::Running => {
            let reason = if phase == Phase::Running {
                "Running"
            } else {
                "Pending"
            };
            conditions::set_condition(c, READY, false, reason, &progress, g, &now_t);
            conditions::set_condition(c, RECONCILING, true, reason, &progress, g, &now_t);
            conditions::set_condition(c, STALLED, false, reason, "", g, &now_t);
        }
    }
    if phase.is_terminal() {
        if status.completion_time.is_none() {
            status.completion_time = Some(now_t.clone());
        }
        if !was_terminal {
            step.events.push(PlannedEvent {
                warning: phase == Phase::Failed,
                reason: if phase == Phase::Passed {
                    "Passed"
                } else {
                    "Failed"
                },
                note: truncate(&progress),
            });
        }
        step.requeue_after = None;
    } else {
        let to_deadline = deadline.saturating_sub(elapsed) + Duration::from_secs(1);
        let mut after = RUNNING_REQUEUE.min(to_deadline);
        if wait_for_result {
            after = after.min(Duration::from_secs(5));
        }
        step.requeue_after = Some(after);
    }
    step.status = status;
    step
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::{SelectedNode, Selection};
    use gpuval_crds::GpuValidationSpec;

    fn gv(generation: i64, status: Option<GpuValidationStatus>) -> GpuValidation {
        let mut g = GpuValidation::new("acceptance", crate::selection::tests::spec());
        g.metadata.generation = Some(generation);
        g.status = status;
        g
    }

    fn at(secs: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(1_790_000_000 + secs).unwrap())
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

    fn world(secs: i64, pods: Vec<PodView>, results: Vec<ResultView>) -> World {
        World {
            now: at(secs),
            nodes: ["a".into(), "b".into()].into(),
            pods,
            results,
        }
    }

    fn pod(node: &str, phase: &str) -> PodView {
        PodView {
            name: format!("pod-{node}"),
            node: node.into(),
            generation: 1,
            phase: phase.into(),
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
    fn run(steps: &[World]) -> Vec<Step> {
        let mut g = gv(1, None);
        let mut out = Vec::new();
        for w in steps {
            let s = next(&g, w, two_nodes);
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
            world(5, vec![pod("a", "Running"), pod("b", "Running")], vec![]),
            world(
                60,
                vec![pod("a", "Succeeded"), pod("b", "Succeeded")],
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
                vec![pod("a", "Succeeded"), pod("b", "Succeeded")],
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
        let mut p = pod("b", "Failed");
        p.reason = Some("OOMKilled (exit code 137)".into());
        let steps = run(&[
            world(0, vec![], vec![]),
            world(
                30,
                vec![pod("a", "Succeeded"), p],
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
                vec![pod("a", "Running"), pod("b", "Running")],
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
        w.nodes.remove("b");
        let steps = run(&[
            world(0, vec![], vec![]),
            world(5, vec![pod("a", "Running"), pod("b", "Running")], vec![]),
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
        let mut done = pod("a", "Succeeded");
        done.finished_at = at(10);
        let steps = run(&[
            world(0, vec![], vec![]),
            world(12, vec![done.clone(), pod("b", "Running")], vec![]),
            world(45, vec![done, pod("b", "Running")], vec![]),
        ]);
        assert_eq!(steps[1].status.nodes[0].verdict, NodeVerdict::Running);
        assert!(steps[1].requeue_after.unwrap() <= Duration::from_secs(5));
        assert_eq!(steps[2].status.nodes[0].verdict, NodeVerdict::Error);
    }

    #[test]
    fn the_same_world_twice_gives_the_same_status() {
        let w = world(5, vec![pod("a", "Running"), pod("b", "Pending")], vec![]);
        let steps = run(&[world(0, vec![], vec![]), w.clone()]);
        let mut g = gv(1, Some(steps[1].status.clone()));
        let again = next(&g, &World { now: at(9), ..w }, two_nodes);
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
        let old_pod = pod("a", "Running");
        let old_result = result("b", Verdict::Pass, "");
        let s = next(&g, &world(10, vec![old_pod], vec![old_result]), two_nodes);
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
        let s = next(&g, &world(0, vec![], vec![]), Selection::default);
        assert_eq!(s.status.phase, Some(Phase::Failed));
        let stalled = conditions::find(&s.status.conditions, STALLED).unwrap();
        assert_eq!(stalled.reason, "NoNodesSelected");
        assert!(s.create_pods.is_empty());
        assert_eq!(s.requeue_after, None);
    }
}
