//! The run as a whole: node counts, the reasons nodes did not pass, the phase they add up to,
//! and the bounded list of node lines the status shows. [`count`] and [`listed`] define them
//! over a run's lines; the run's record ([`super::record`]) keeps the same figures up to date
//! line by line, and its tests hold it to these definitions.

use std::cmp::Reverse;
use std::collections::HashMap;

use gpuval_crds::reason::{Code, Severity};

use gpuval_crds::{
    MAX_LISTED_NODES, MAX_REASONS, NodeStatus, NodeVerdict, Phase, ReasonCount, Summary,
};

/// Longest reason (the verdict and the first words of the message) in `summary.reasons`.
const MAX_REASON: usize = 80;

/// Counts the node lines by verdict (Failed, Error and DeadlineExceeded count as failed) and
/// the most frequent reasons of the nodes that did not pass.
pub fn count(nodes: &[NodeStatus]) -> Summary {
    let mut sum = Summary {
        selected: i32::try_from(nodes.len()).unwrap_or(i32::MAX),
        ..Default::default()
    };
    for n in nodes {
        match n.verdict {
            NodeVerdict::Pending => sum.pending += 1,
            NodeVerdict::Running => sum.running += 1,
            NodeVerdict::Passed => sum.passed += 1,
            NodeVerdict::Failed | NodeVerdict::Error | NodeVerdict::DeadlineExceeded => {
                sum.failed += 1
            }
        }
    }
    sum.reasons = top_reasons(nodes);
    sum
}

/// A failed node's reasons: one per code of its findings (`Fail: MemoryMismatch`,
/// `Error: IoError`, each with the code's severity, the worst first) so that the summary counts
/// every kind of finding, not only the first; a node without codes (its pod failed, it ran out
/// of time) has one: its verdict and its message up to the first `:`, e.g.
/// `Error: agent pod failed`.
pub fn reasons_of(line: &NodeStatus) -> Vec<String> {
    let mut coded: Vec<(Severity, String)> = line
        .codes
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| match c.parse::<Code>() {
            Ok(code) => (code.severity(), format!("{}: {c}", code.severity())),
            Err(_) => (Severity::Info, c.to_string()),
        })
        .collect();
    coded.sort_by_key(|(severity, _)| Reverse(*severity));
    let mut reasons: Vec<String> = Vec::with_capacity(coded.len());
    for (_, r) in coded {
        if !reasons.contains(&r) {
            reasons.push(gpuval_crds::text::shorten(&r, MAX_REASON));
        }
    }
    if reasons.is_empty() {
        reasons.push(reason_of(line));
    }
    reasons
}

/// A node's reason from its verdict and its message up to the first `:` (the check or the
/// cause, without the per-GPU detail), e.g. `Error: agent pod failed`.
fn reason_of(line: &NodeStatus) -> String {
    let head = line
        .message
        .as_deref()
        .and_then(|m| m.split(':').next())
        .map(str::trim)
        .filter(|h| !h.is_empty());
    let r = match head {
        Some(h) => format!("{}: {h}", line.verdict),
        None => line.verdict.to_string(),
    };
    gpuval_crds::text::shorten(&r, MAX_REASON)
}

/// The [`MAX_REASONS`] most frequent reasons among nodes with a final verdict other than
/// Passed, the most frequent first (ties by name).
fn top_reasons(nodes: &[NodeStatus]) -> Vec<ReasonCount> {
    let mut by_reason: HashMap<String, i32> = HashMap::new();
    for n in nodes.iter().filter(|n| is_failed(n.verdict)) {
        for r in reasons_of(n) {
            *by_reason.entry(r).or_default() += 1;
        }
    }
    let mut reasons: Vec<ReasonCount> = by_reason
        .into_iter()
        .map(|(reason, count)| ReasonCount { reason, count })
        .collect();
    reasons.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    reasons.truncate(MAX_REASONS);
    reasons
}

/// A final verdict other than Passed.
pub fn is_failed(v: NodeVerdict) -> bool {
    v.is_final() && v != NodeVerdict::Passed
}

/// The node lines the status shows: the nodes that have not passed, failed ones first, then
/// those still pending or running, in node order, at most [`MAX_LISTED_NODES`]; and how many
/// more did not fit.
pub fn listed(nodes: &[NodeStatus]) -> (Vec<NodeStatus>, i32) {
    let failed = nodes.iter().filter(|n| is_failed(n.verdict));
    let waiting = nodes.iter().filter(|n| !n.verdict.is_final());
    let shown: Vec<NodeStatus> = failed
        .chain(waiting)
        .take(MAX_LISTED_NODES)
        .cloned()
        .collect();
    let not_passed = nodes
        .iter()
        .filter(|n| n.verdict != NodeVerdict::Passed)
        .count();
    let more = not_passed.saturating_sub(shown.len());
    (shown, i32::try_from(more).unwrap_or(i32::MAX))
}

/// Nodes with a final verdict.
pub fn done(sum: &Summary) -> i32 {
    sum.passed + sum.failed
}

/// The phase the counts add up to: Passed or Failed once every node has its verdict, Running
/// once any agent runs or any node is done, Pending before.
pub fn phase_of(sum: &Summary) -> Phase {
    let done = done(sum);
    if done == sum.selected {
        if sum.failed == 0 {
            Phase::Passed
        } else {
            Phase::Failed
        }
    } else if sum.running > 0 || done > 0 {
        Phase::Running
    } else {
        Phase::Pending
    }
}

/// The run's progress in words, e.g. `3/8 node(s) done, 2 passed, 1 failed`.
pub fn progress(sum: &Summary) -> String {
    format!(
        "{}/{} node(s) done, {} passed, {} failed",
        done(sum),
        sum.selected,
        sum.passed,
        sum.failed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(verdicts: &[NodeVerdict]) -> Vec<NodeStatus> {
        verdicts
            .iter()
            .enumerate()
            .map(|(i, v)| NodeStatus {
                name: format!("n{i}"),
                verdict: *v,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn every_bad_final_verdict_counts_as_failed() {
        use NodeVerdict::*;
        let sum = count(&lines(&[
            Pending,
            Running,
            Running,
            Passed,
            Failed,
            Error,
            DeadlineExceeded,
        ]));
        assert_eq!(
            sum,
            Summary {
                selected: 7,
                pending: 1,
                running: 2,
                passed: 1,
                failed: 3,
                reasons: vec![
                    ReasonCount {
                        reason: "DeadlineExceeded".into(),
                        count: 1
                    },
                    ReasonCount {
                        reason: "Error".into(),
                        count: 1
                    },
                    ReasonCount {
                        reason: "Failed".into(),
                        count: 1
                    },
                ],
            }
        );
        assert_eq!(progress(&sum), "4/7 node(s) done, 1 passed, 3 failed");
    }

    #[test]
    fn the_phase_follows_the_counts() {
        use NodeVerdict::*;
        let phase = |v: &[NodeVerdict]| phase_of(&count(&lines(v)));
        assert_eq!(phase(&[Pending, Pending]), Phase::Pending);
        assert_eq!(phase(&[Running, Pending]), Phase::Running);
        assert_eq!(phase(&[Passed, Pending]), Phase::Running, "one done");
        assert_eq!(phase(&[Passed, Passed]), Phase::Passed);
        assert_eq!(phase(&[Passed, Error]), Phase::Failed);
        assert_eq!(phase(&[]), Phase::Passed, "nothing left to wait for");
    }

    fn failed(name: &str, verdict: NodeVerdict, message: &str) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            verdict,
            message: Some(message.into()),
            ..Default::default()
        }
    }

    #[test]
    fn reasons_group_by_verdict_and_first_words_most_frequent_first() {
        use NodeVerdict::*;
        let mut nodes = vec![
            failed("a", Failed, "GPU3 memory: 2 mismatched words"),
            failed("b", Error, "agent pod failed: OOMKilled (exit code 137)"),
            failed("c", Error, "agent pod failed: Evicted: low on memory"),
            failed("d", Passed, "GPU1 throttled: 3 times"),
            failed("e", Running, "agent pod failed: not yet"),
        ];
        for i in 0..20 {
            nodes.push(failed(&format!("x{i}"), Failed, &format!("check{i}: bad")));
        }
        let sum = count(&nodes);
        assert_eq!(sum.reasons.len(), MAX_REASONS);
        assert_eq!(
            sum.reasons[0],
            ReasonCount {
                reason: "Error: agent pod failed".into(),
                count: 2
            },
            "passing and running nodes have no reason"
        );
        assert_eq!(reasons_of(&nodes[0]), ["Failed: GPU3 memory"]);
        let long = failed("l", Failed, &"é".repeat(100));
        assert!(reasons_of(&long)[0].len() <= MAX_REASON);
    }

    #[test]
    fn every_code_of_a_node_is_counted_the_worst_first() {
        use NodeVerdict::*;
        let mut mixed = failed(
            "a",
            Failed,
            "GPU1 memory: 2 mismatched words; no io directory",
        );
        mixed.codes = Some("IoError,MemoryMismatch".into());
        let mut io = failed("b", Error, "no io directory");
        io.codes = Some("IoError".into());
        assert_eq!(
            reasons_of(&mixed),
            ["Fail: MemoryMismatch", "Error: IoError"]
        );
        let sum = count(&[mixed, io.clone(), io]);
        let counted: Vec<(&str, i32)> = sum
            .reasons
            .iter()
            .map(|r| (r.reason.as_str(), r.count))
            .collect();
        assert_eq!(
            counted,
            [("Error: IoError", 3), ("Fail: MemoryMismatch", 1)]
        );
    }

    #[test]
    fn only_nodes_that_did_not_pass_are_listed_failed_first_up_to_the_cap() {
        use NodeVerdict::*;
        let (shown, more) = listed(&lines(&[Passed, Running, Failed, Passed, Pending]));
        let names: Vec<_> = shown.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, vec!["n2", "n1", "n4"]);
        assert_eq!(more, 0);

        let many: Vec<NodeVerdict> = (0..2 * MAX_LISTED_NODES + 30)
            .map(|i| if i % 2 == 0 { Error } else { Passed })
            .chain(std::iter::repeat_n(Pending, 40))
            .collect();
        let (shown, more) = listed(&lines(&many));
        assert_eq!(shown.len(), MAX_LISTED_NODES);
        assert!(
            shown.iter().all(|n| n.verdict == Error),
            "failed ones first"
        );
        let not_passed = MAX_LISTED_NODES + 15 + 40;
        assert_eq!(more as usize, not_passed - MAX_LISTED_NODES);
    }
}
