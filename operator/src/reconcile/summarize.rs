//! The run as a whole: node counts and the phase they add up to.

use gpuval_crds::{NodeStatus, NodeVerdict, Phase, Summary};

/// Counts the node lines by verdict (Failed, Error and DeadlineExceeded count as failed).
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
    sum
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
}
