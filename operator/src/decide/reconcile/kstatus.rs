//! The kstatus conditions (`Ready`, `Reconciling`, `Stalled`), each with the generation it
//! describes, so that GitOps tools and `kubectl wait` can follow a run.

use gpuval_crds::conditions::{READY, RECONCILING, STALLED, set_condition};
use gpuval_crds::{NodeStatus, NodeVerdict, Phase, Summary};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::{summarize, truncate};

/// Failed nodes named in the Stalled and Ready messages of a failed run.
const NAMED_FAILURES: usize = 3;

/// What the Ready condition of a run with simulated results says.
pub const SIMULATED_NOTE: &str =
    "simulated: results from the simulated GPU backend say nothing about real GPUs";

/// Adds [`SIMULATED_NOTE`] to the Ready condition's message (once).
pub fn mark_simulated(conditions: &mut [Condition]) {
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == READY)
        && !c.message.contains(SIMULATED_NOTE)
    {
        c.message = if c.message.is_empty() {
            SIMULATED_NOTE.to_string()
        } else {
            format!("{} ({SIMULATED_NOTE})", c.message)
        };
    }
}

/// Sets the three conditions to the same (status, reason) pattern.
fn set_all(
    conditions: &mut Vec<Condition>,
    [ready, reconciling, stalled]: [(bool, &str); 3],
    reason: &str,
    generation: i64,
    now: &Time,
) {
    let g = Some(generation);
    set_condition(conditions, READY, ready.0, reason, ready.1, g, now);
    set_condition(
        conditions,
        RECONCILING,
        reconciling.0,
        reason,
        reconciling.1,
        g,
        now,
    );
    set_condition(conditions, STALLED, stalled.0, reason, stalled.1, g, now);
}

/// The run cannot start: not ready, not reconciling, stalled, all for `reason`.
pub fn set_blocked(
    conditions: &mut Vec<Condition>,
    reason: &str,
    message: &str,
    generation: i64,
    now: &Time,
) {
    let states = [(false, message), (false, message), (true, message)];
    set_all(conditions, states, reason, generation, now);
}

/// Sets the conditions for a run in `phase` with counts `sum`: Ready once every node passed,
/// Reconciling while the run goes on (its progress, and how many nodes' agents ended with
/// their results still `awaiting` the operator's look: at thousands of nodes that can be a
/// while), Stalled once a node failed (naming the first few).
pub fn set_for_phase(
    conditions: &mut Vec<Condition>,
    phase: Phase,
    sum: &Summary,
    nodes: &[NodeStatus],
    awaiting: usize,
    generation: i64,
    now: &Time,
) {
    let mut progress = summarize::progress(sum);
    if awaiting > 0 {
        progress.push_str(&format!(
            "; {awaiting} agent(s) ended, their results awaiting the operator's check"
        ));
    }
    match phase {
        Phase::Passed => {
            let msg = format!("all {} node(s) passed", sum.selected);
            let states = [(true, msg.as_str()), (false, msg.as_str()), (false, "")];
            set_all(conditions, states, "Passed", generation, now);
        }
        Phase::Failed => {
            let msg = failure_message(sum, nodes);
            let states = [
                (false, msg.as_str()),
                (false, progress.as_str()),
                (true, msg.as_str()),
            ];
            set_all(conditions, states, "NodesFailed", generation, now);
        }
        Phase::Pending | Phase::Running => {
            let states = [
                (false, progress.as_str()),
                (true, progress.as_str()),
                (false, ""),
            ];
            set_all(conditions, states, phase.as_str(), generation, now);
        }
    }
}

/// Every node passed its checks but the fabric between them did not, and no node could be
/// named: not ready, stalled, with the fabric's own message.
pub fn set_fabric_failed(
    conditions: &mut Vec<Condition>,
    message: &str,
    generation: i64,
    now: &Time,
) {
    let msg = truncate(&format!("fabric: {message}"));
    let states = [(false, msg.as_str()), (false, ""), (true, msg.as_str())];
    set_all(conditions, states, "FabricFailed", generation, now);
}

/// `2 of 8 node(s) failed; gpu-3 Failed: GPU5 memory: ...; gpu-6 Error: ...`: the nodes the
/// hardware failed named before those that could not be measured (Error) or ran out of time.
fn failure_message(sum: &Summary, nodes: &[NodeStatus]) -> String {
    let mut failed: Vec<&NodeStatus> = nodes
        .iter()
        .filter(|n| n.verdict.is_final() && n.verdict != NodeVerdict::Passed)
        .collect();
    failed.sort_by_key(|n| n.verdict != NodeVerdict::Failed);
    let first: Vec<String> = failed
        .into_iter()
        .take(NAMED_FAILURES)
        .map(|n| {
            format!(
                "{} {}: {}",
                n.name,
                n.verdict,
                n.message.as_deref().unwrap_or("")
            )
        })
        .collect();
    truncate(&format!(
        "{} of {} node(s) failed; {}",
        sum.failed,
        sum.selected,
        first.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::conditions::{find, is_true};
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::from_second(1_790_000_000).unwrap())
    }

    fn line(name: &str, verdict: NodeVerdict, message: &str) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            verdict,
            message: (!message.is_empty()).then(|| message.into()),
            ..Default::default()
        }
    }

    /// (status, reason, message, observedGeneration) of a condition.
    fn cond<'a>(c: &'a [Condition], type_: &str) -> (&'a str, &'a str, &'a str, Option<i64>) {
        let c = find(c, type_).unwrap();
        (&c.status, &c.reason, &c.message, c.observed_generation)
    }

    /// A summary of `selected` nodes, `running` of them running and `passed` passed.
    fn counts(selected: i32, running: i32, passed: i32) -> Summary {
        Summary {
            selected,
            running,
            passed,
            ..Default::default()
        }
    }

    /// The conditions `set_for_phase` writes into an empty list.
    fn conditions(
        phase: Phase,
        sum: &Summary,
        nodes: &[NodeStatus],
        generation: i64,
    ) -> Vec<Condition> {
        let mut c = Vec::new();
        set_for_phase(&mut c, phase, sum, nodes, 0, generation, &now());
        c
    }

    /// Condition `type_` reads `want`, and the other two kstatus conditions are not true.
    fn only_true(c: &[Condition], type_: &str, want: (&str, &str, &str, Option<i64>)) {
        assert_eq!(cond(c, type_), want);
        for other in [READY, RECONCILING, STALLED]
            .into_iter()
            .filter(|t| *t != type_)
        {
            assert!(!is_true(c, other), "{other} is true beside {type_}");
        }
    }

    #[test]
    fn a_blocked_run_is_stalled_and_not_reconciling() {
        let mut c = Vec::new();
        set_blocked(&mut c, "NodeNotFound", "ghost is missing", 4, &now());
        only_true(
            &c,
            STALLED,
            ("True", "NodeNotFound", "ghost is missing", Some(4)),
        );
    }

    #[test]
    fn a_running_run_is_reconciling_with_its_progress() {
        let c = conditions(Phase::Running, &counts(2, 1, 1), &[], 2);
        let progress = "1/2 node(s) done, 1 passed, 0 failed".to_string();
        only_true(&c, RECONCILING, ("True", "Running", &progress, Some(2)));
        assert_eq!(
            cond(&c, READY),
            ("False", "Running", progress.as_str(), Some(2))
        );
    }

    /// Every agent ended, no result looked at yet (10,000 nodes: issue 55): the progress says
    /// so, not only `0/N done`.
    #[test]
    fn agents_that_ended_with_results_awaiting_their_check_are_said() {
        let mut c = Vec::new();
        set_for_phase(&mut c, Phase::Running, &counts(3, 3, 0), &[], 3, 1, &now());
        let (_, _, message, _) = cond(&c, RECONCILING);
        assert_eq!(
            message,
            "0/3 node(s) done, 0 passed, 0 failed; 3 agent(s) ended, their results awaiting the operator's check"
        );
    }

    #[test]
    fn a_passed_run_is_ready() {
        let c = conditions(Phase::Passed, &counts(2, 0, 2), &[], 1);
        only_true(
            &c,
            READY,
            ("True", "Passed", "all 2 node(s) passed", Some(1)),
        );
    }

    #[test]
    fn a_simulated_run_says_so_in_its_ready_message_once() {
        let mut c = conditions(Phase::Passed, &counts(2, 0, 2), &[], 1);
        mark_simulated(&mut c);
        mark_simulated(&mut c);
        let (status, _, message, _) = cond(&c, READY);
        assert_eq!(status, "True");
        assert_eq!(message, format!("all 2 node(s) passed ({SIMULATED_NOTE})"));
    }

    #[test]
    fn a_failed_run_names_its_first_three_failed_nodes() {
        let nodes = [
            line("a", NodeVerdict::Passed, ""),
            line("b", NodeVerdict::Failed, "GPU3 memory: 2 mismatched words"),
            line("c", NodeVerdict::DeadlineExceeded, "late"),
            line("d", NodeVerdict::Error, "pod failed"),
            line("e", NodeVerdict::Error, "node deleted"),
        ];
        let sum = summarize::count(&nodes);
        let c = conditions(Phase::Failed, &sum, &nodes, 1);
        let (status, reason, message, _) = cond(&c, STALLED);
        assert_eq!((status, reason), ("True", "NodesFailed"));
        assert_eq!(
            message,
            "4 of 5 node(s) failed; b Failed: GPU3 memory: 2 mismatched words; \
             c DeadlineExceeded: late; d Error: pod failed"
        );
        assert_eq!(cond(&c, READY).2, message);
        assert_eq!(
            cond(&c, RECONCILING).2,
            "5/5 node(s) done, 1 passed, 4 failed"
        );
    }

    #[test]
    fn hardware_failures_are_named_before_nodes_that_could_not_be_measured() {
        let nodes = [
            line("a", NodeVerdict::Error, "no directory for the io check"),
            line("b", NodeVerdict::Error, "no directory for the io check"),
            line("c", NodeVerdict::Error, "no directory for the io check"),
            line("z", NodeVerdict::Failed, "GPU1 memory: 2 mismatched words"),
        ];
        let sum = summarize::count(&nodes);
        let c = conditions(Phase::Failed, &sum, &nodes, 1);
        let message = cond(&c, STALLED).2;
        assert!(
            message.starts_with("4 of 4 node(s) failed; z Failed: GPU1 memory"),
            "{message}"
        );
    }
}
