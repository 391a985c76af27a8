//! The operator's record of a running run ([`RunNodes`]): a line for every node of the run, in
//! node-name order, and indexes kept up to date line by line: the counts by verdict, the
//! reasons of the nodes that did not pass, which nodes have not passed (the status lists the
//! first of them), and the finished agents whose result is awaited. Changing a line costs
//! O(log N), so a reconcile that brings news of a few nodes works on those nodes only; the
//! whole record is built once, when the run starts or the operator recovers it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpuval_crds::{MAX_LISTED_NODES, MAX_REASONS, NodeStatus, NodeVerdict, Summary};

use super::summarize::{is_failed, reasons_of};
use super::view::PodView;

/// The record of one run (one spec generation).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunNodes {
    generation: i64,
    /// Sorted by name, one per node.
    lines: Vec<NodeStatus>,
    counts: Counts,
    /// Nodes that did not pass, by reason (see [`reasons_of`]; a node counts once per reason).
    reasons: HashMap<String, i32>,
    /// The same, most frequent first (ties by reason).
    ranked: BTreeSet<(Reverse<i32>, String)>,
    /// Positions of lines with a final verdict other than Passed.
    failed: BTreeSet<u32>,
    /// Positions of lines without a final verdict.
    unfinished: BTreeSet<u32>,
    /// Positions of nodes whose agent exited 0 and whose result is awaited, with that pod.
    awaiting: BTreeMap<u32, PodView>,
}

/// Lines by verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    pending: i32,
    running: i32,
    passed: i32,
    failed: i32,
}

impl RunNodes {
    /// The record of run `generation` over `lines` (sorted here; a node named twice keeps its
    /// first line).
    pub fn new(generation: i64, mut lines: Vec<NodeStatus>) -> Self {
        lines.sort_by(|a, b| a.name.cmp(&b.name));
        lines.dedup_by(|b, a| a.name == b.name);
        let mut r = RunNodes {
            generation,
            lines,
            ..Default::default()
        };
        r.reindex();
        r
    }

    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// Every node's line, by node name.
    pub fn lines(&self) -> &[NodeStatus] {
        &self.lines
    }

    /// Where node `name`'s line is.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.lines
            .binary_search_by(|l| l.name.as_str().cmp(name))
            .ok()
    }

    /// Replaces line `i` (its name stays), keeping the indexes. Finished agents awaited stay
    /// awaited only while the line is unfinished.
    pub fn set(&mut self, i: usize, mut line: NodeStatus) {
        line.name = std::mem::take(&mut self.lines[i].name);
        self.unindex(i);
        self.lines[i] = line;
        self.index(i);
    }

    /// Positions of the lines without a final verdict, in node order.
    pub fn unfinished(&self) -> Vec<usize> {
        self.unfinished.iter().map(|&i| i as usize).collect()
    }

    /// True once every node has a final verdict.
    pub fn all_final(&self) -> bool {
        self.unfinished.is_empty()
    }

    /// Positions of the nodes whose result is awaited, in node order.
    pub fn awaiting(&self) -> Vec<usize> {
        self.awaiting.keys().map(|&i| i as usize).collect()
    }

    /// The pod of node `i`, whose result is awaited.
    pub fn awaited_pod(&self, i: usize) -> Option<&PodView> {
        self.awaiting.get(&pos(i))
    }

    /// Marks node `i`'s result as awaited after its agent `pod` finished (None: not awaited).
    pub fn await_result(&mut self, i: usize, pod: Option<PodView>) {
        match pod {
            Some(p) if !self.lines[i].verdict.is_final() => {
                self.awaiting.insert(pos(i), p);
            }
            _ => {
                self.awaiting.remove(&pos(i));
            }
        }
    }

    /// True while some finished agent's result is awaited.
    pub fn is_awaiting(&self) -> bool {
        !self.awaiting.is_empty()
    }

    /// Lets `f` change any lines (not their names), then rebuilds the indexes (O(N)).
    pub fn edit_all<R>(&mut self, f: impl FnOnce(&mut [NodeStatus]) -> R) -> R {
        let out = f(&mut self.lines);
        self.reindex();
        out
    }

    /// Lends the lines to `f`, which only reads them (a step that may change lines uses
    /// [`RunNodes::edit_all`]; checked in debug builds).
    pub fn lend<R>(&mut self, f: impl FnOnce(&mut [NodeStatus]) -> R) -> R {
        #[cfg(debug_assertions)]
        let before = self.lines.clone();
        let out = f(&mut self.lines);
        #[cfg(debug_assertions)]
        assert!(self.lines == before, "a lent line changed: use edit_all");
        out
    }

    /// The counts by verdict (Failed, Error and DeadlineExceeded count as failed) and the
    /// [`MAX_REASONS`] most frequent reasons of the nodes that did not pass.
    pub fn summary(&self) -> Summary {
        let c = self.counts;
        Summary {
            selected: i32::try_from(self.lines.len()).unwrap_or(i32::MAX),
            pending: c.pending,
            running: c.running,
            passed: c.passed,
            failed: c.failed,
            reasons: self
                .ranked
                .iter()
                .take(MAX_REASONS)
                .map(|(Reverse(count), reason)| gpuval_crds::ReasonCount {
                    reason: reason.clone(),
                    count: *count,
                })
                .collect(),
        }
    }

    /// The lines the status shows: the nodes that have not passed, failed ones first, then the
    /// unfinished ones, in node order, at most [`MAX_LISTED_NODES`]; and how many more did not
    /// fit.
    pub fn listed(&self) -> (Vec<NodeStatus>, i32) {
        let shown: Vec<NodeStatus> = self
            .failed
            .iter()
            .chain(self.unfinished.iter())
            .take(MAX_LISTED_NODES)
            .map(|&i| self.lines[i as usize].clone())
            .collect();
        let more = (self.failed.len() + self.unfinished.len()).saturating_sub(shown.len());
        (shown, i32::try_from(more).unwrap_or(i32::MAX))
    }

    /// About how many bytes the record holds (lines, their strings, the indexes).
    pub fn approx_bytes(&self) -> usize {
        let heap = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
        let lines: usize = self
            .lines
            .iter()
            .map(|n| n.name.capacity() + heap(&n.message) + heap(&n.result))
            .sum();
        // A B-tree entry costs its key and value plus about a third more for the nodes.
        let set_entry = 4 * 4 / 3;
        let awaited = std::mem::size_of::<PodView>() + 64;
        self.lines.capacity() * std::mem::size_of::<NodeStatus>()
            + lines
            + (self.failed.len() + self.unfinished.len()) * set_entry
            + self.awaiting.len() * awaited
            + self
                .reasons
                .keys()
                .map(|r| 2 * r.capacity() + 48)
                .sum::<usize>()
    }

    fn reindex(&mut self) {
        self.counts = Counts::default();
        self.reasons.clear();
        self.ranked.clear();
        self.failed.clear();
        self.unfinished.clear();
        let lines = self.lines.len();
        self.awaiting.retain(|&i, _| (i as usize) < lines);
        for i in 0..lines {
            self.index(i);
        }
    }

    /// Counts line `i` in.
    fn index(&mut self, i: usize) {
        let verdict = self.lines[i].verdict;
        self.count(verdict, 1);
        if is_failed(verdict) {
            self.failed.insert(pos(i));
            for r in reasons_of(&self.lines[i]) {
                self.count_reason(r, 1);
            }
        } else if !verdict.is_final() {
            self.unfinished.insert(pos(i));
        }
        if verdict.is_final() {
            self.awaiting.remove(&pos(i));
        }
    }

    /// Counts line `i` out.
    fn unindex(&mut self, i: usize) {
        let verdict = self.lines[i].verdict;
        self.count(verdict, -1);
        if is_failed(verdict) {
            self.failed.remove(&pos(i));
            for r in reasons_of(&self.lines[i]) {
                self.count_reason(r, -1);
            }
        } else {
            self.unfinished.remove(&pos(i));
        }
    }

    /// Adds `by` to the count of `verdict` (Failed, Error and DeadlineExceeded count as
    /// failed).
    fn count(&mut self, verdict: NodeVerdict, by: i32) {
        let c = &mut self.counts;
        let n = match verdict {
            NodeVerdict::Pending => &mut c.pending,
            NodeVerdict::Running => &mut c.running,
            NodeVerdict::Passed => &mut c.passed,
            NodeVerdict::Failed | NodeVerdict::Error | NodeVerdict::DeadlineExceeded => {
                &mut c.failed
            }
        };
        *n += by;
    }

    /// Adds `by` to the count of `reason` (a count of 0 drops it).
    fn count_reason(&mut self, reason: String, by: i32) {
        let old = self.reasons.get(&reason).copied().unwrap_or(0);
        let new = old + by;
        if old > 0 {
            self.ranked.remove(&(Reverse(old), reason.clone()));
        }
        if new > 0 {
            self.ranked.insert((Reverse(new), reason.clone()));
            self.reasons.insert(reason, new);
        } else {
            self.reasons.remove(&reason);
        }
    }
}

/// A line's position as the indexes keep it (a run has far fewer than 2^32 nodes).
fn pos(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::reconcile::summarize;

    fn line(name: &str, verdict: NodeVerdict, message: Option<&str>) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            verdict,
            gpus: 8,
            message: message.map(str::to_string),
            result: None,
            codes: None,
            action: None,
            evidence: None,
        }
    }

    /// The record's counts and listing agree with the definitions over the whole slice.
    fn assert_agrees(r: &RunNodes) {
        assert_eq!(r.summary(), summarize::count(r.lines()));
        assert_eq!(r.listed(), summarize::listed(r.lines()));
        assert_eq!(r, &RunNodes::new(r.generation(), r.lines().to_vec()));
    }

    #[test]
    fn lines_are_kept_by_name_once_each() {
        use NodeVerdict::*;
        let r = RunNodes::new(
            3,
            vec![
                line("b", Pending, None),
                line("a", Passed, None),
                line("b", Failed, Some("x")),
            ],
        );
        let names: Vec<_> = r.lines().iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(r.lines()[1].verdict, Pending, "the first line of b is kept");
        assert_eq!(r.position("b"), Some(1));
        assert_eq!(r.position("c"), None);
        assert_eq!(r.generation(), 3);
        assert_agrees(&r);
    }

    #[test]
    fn changing_lines_keeps_counts_reasons_and_listing_true() {
        use NodeVerdict::*;
        let mut r = RunNodes::new(
            1,
            (0..120)
                .map(|i| line(&format!("n{i:03}"), Pending, None))
                .collect(),
        );
        assert_agrees(&r);
        for i in 0..120 {
            let next = match i % 4 {
                0 => line("ignored", Passed, None),
                1 => line("", Failed, Some(&format!("GPU{} memory: bad", i % 3))),
                2 => line("", Error, Some("agent pod failed: OOMKilled")),
                _ => line("", Running, None),
            };
            r.set(i, next);
            assert_eq!(r.lines()[i].name, format!("n{i:03}"), "names stay");
        }
        assert_agrees(&r);
        assert_eq!(r.summary().reasons[0].reason, "Error: agent pod failed");
        assert_eq!(r.summary().reasons[0].count, 30);
        // A failure that goes back (a fabric verdict rewritten) takes its reason with it.
        r.set(2, line("", Passed, None));
        r.set(1, line("", Running, None));
        assert_agrees(&r);
        assert!(!r.all_final());
        assert_eq!(r.listed().0.len(), MAX_LISTED_NODES);
    }

    #[test]
    fn an_awaited_result_is_forgotten_once_the_line_is_final() {
        use NodeVerdict::*;
        let mut r = RunNodes::new(1, vec![line("a", Running, None), line("b", Running, None)]);
        let pod = PodView {
            name: "pod-a".into(),
            node: "a".into(),
            ..Default::default()
        };
        r.await_result(0, Some(pod.clone()));
        assert!(r.is_awaiting());
        assert_eq!(r.awaiting(), [0]);
        assert_eq!(r.awaited_pod(0), Some(&pod));
        r.set(0, line("a", Error, Some("no result")));
        assert!(!r.is_awaiting());
        r.await_result(0, Some(pod));
        assert!(!r.is_awaiting(), "a finished node awaits nothing");
    }

    #[test]
    fn edits_of_every_line_rebuild_the_indexes() {
        use NodeVerdict::*;
        let mut r = RunNodes::new(1, vec![line("a", Passed, None), line("b", Passed, None)]);
        assert!(r.all_final());
        let changed = r.edit_all(|lines| {
            lines[1].verdict = Failed;
            lines[1].message = Some("fabric: slow".into());
            1
        });
        assert_eq!(changed, 1);
        assert_eq!(r.summary().failed, 1);
        assert_agrees(&r);
        assert!(r.approx_bytes() > 2 * std::mem::size_of::<NodeStatus>());
    }
}
