//! A model fabric for the tests of the planner and of the operator's fabric step (behind the
//! `model` feature; the planner never uses it): every node has an NCCL bus bandwidth, healthy
//! or slow, and a group measures what its slowest member gives.

use std::collections::BTreeMap;

/// A healthy node's bus bandwidth in the model, GB/s (above the tests' 350 GB/s floor).
pub const GOOD_GBPS: f64 = 380.0;
/// A slow node's bus bandwidth in the model, GB/s (below that floor).
pub const SLOW_GBPS: f64 = 120.0;

/// Each node's bus bandwidth, GB/s.
#[derive(Debug, Clone, Default)]
pub struct Bandwidths(BTreeMap<String, f64>);

impl Bandwidths {
    /// `nodes` at [`GOOD_GBPS`], but for those at the indices `slow`, at [`SLOW_GBPS`].
    pub fn new(nodes: &[String], slow: &[usize]) -> Self {
        let of = |i: usize| {
            if slow.contains(&i) {
                SLOW_GBPS
            } else {
                GOOD_GBPS
            }
        };
        Bandwidths(
            nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), of(i)))
                .collect(),
        )
    }

    /// What a group of `members` measures: its slowest member's bandwidth. Panics on a member
    /// the model does not know (a test's mistake).
    pub fn group(&self, members: &[String]) -> f64 {
        members
            .iter()
            .map(|n| self.0[n])
            .fold(f64::INFINITY, f64::min)
    }
}
