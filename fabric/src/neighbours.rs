//! Who is near whom in name order, for one fabric kind: the nodes a suspect is confirmed
//! beside (the cleared ones) and the open ones it is paired with. Both the planner and the
//! between-nodes reading use it.

use std::collections::BTreeSet;

use gpuval_crds::fabric::FabricKind;

use crate::evaluate::Evaluation;

/// Who is near whom in name order, for one kind.
pub(crate) struct Neighbours {
    cleared: BTreeSet<usize>,
    /// Nodes still in the test and not cleared.
    open: BTreeSet<usize>,
}

impl Neighbours {
    pub(crate) fn new(ev: &Evaluation, kind: FabricKind) -> Self {
        let mut open = BTreeSet::new();
        let mut cleared = BTreeSet::new();
        for (i, s) in ev.states.values().enumerate() {
            if s.is_out() {
                continue;
            }
            if s.standing(kind).is_some_and(|s| s.passed) {
                cleared.insert(i);
            } else {
                open.insert(i);
            }
        }
        Self { cleared, open }
    }

    /// The cleared nodes `i` is confirmed beside: the nearest below it and the nearest above
    /// it (or the two nearest on the one side that has any), and the one farthest from it, so
    /// that a switch boundary next to it cannot decide alone.
    pub(crate) fn cleared(&self, i: usize) -> Vec<usize> {
        let mut below = self.cleared.range(..i).rev().copied();
        let mut above = self.cleared.range(i + 1..).copied();
        let mut picks: Vec<usize> = match (below.next(), above.next()) {
            (Some(b), Some(a)) => vec![b, a],
            (Some(b), None) => [Some(b), below.next()].into_iter().flatten().collect(),
            (None, Some(a)) => [Some(a), above.next()].into_iter().flatten().collect(),
            (None, None) => Vec::new(),
        };
        // Both ends of the cleared nodes, the farther first: a fault between two switches and
        // another on a link near the node can together cover its neighbours and one far end,
        // never both ends as well (two coincident faults between nodes once named a healthy
        // node beside the neighbours and the one far end it was confirmed with).
        let ends: Vec<usize> = match (self.cleared.first(), self.cleared.last()) {
            (Some(&f), Some(&l)) if i.abs_diff(f) >= i.abs_diff(l) => vec![f, l],
            (Some(&f), Some(&l)) => vec![l, f],
            _ => Vec::new(),
        };
        for end in ends {
            if !picks.contains(&end) {
                picks.push(end);
            }
        }
        picks
    }

    /// The nearest cleared node below `i`, other than `not`.
    pub(crate) fn below(&self, i: usize, not: usize) -> Option<usize> {
        self.cleared.range(..i).rev().copied().find(|c| *c != not)
    }

    /// The nearest cleared node above `i`, other than `not`.
    pub(crate) fn above(&self, i: usize, not: usize) -> Option<usize> {
        self.cleared.range(i + 1..).copied().find(|c| *c != not)
    }

    /// Up to `limit` other nodes still in the test and not cleared, nearest to `i` first,
    /// leaving out those `skip` says (a scan outward, not a sort: thousands of nodes are open
    /// after a failed screening round).
    pub(crate) fn open_near(
        &self,
        i: usize,
        limit: usize,
        skip: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        let mut below = self
            .open
            .range(..i)
            .rev()
            .copied()
            .filter(|j| !skip(*j))
            .peekable();
        let mut above = self
            .open
            .range(i + 1..)
            .copied()
            .filter(|j| !skip(*j))
            .peekable();
        let mut out = Vec::new();
        while out.len() < limit {
            let next = match (below.peek(), above.peek()) {
                (Some(b), Some(a)) if i - b <= a - i => below.next(),
                (_, Some(_)) => above.next(),
                (Some(_), None) => below.next(),
                (None, None) => None,
            };
            match next {
                Some(j) => out.push(j),
                None => break,
            }
        }
        out
    }
}
