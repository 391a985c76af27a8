//! The fabric test's planning, as pure functions shared by the operator (which plans rounds
//! through the API) and the bare-metal coordinator (`gpuval-agent fabric`, which plans them over
//! a TCP control channel).
//!
//! A fabric test is a sequence of rounds. The first screens everything at once: one NCCL group
//! over every node, and one TCP pair per node. When a group falls short, its members become
//! suspects (an error that a peer's failure explains, such as a connection closed by a peer
//! that exited, makes the group suspect, never the member that saw it: each error's typed kind,
//! [`gpuval_crds::fabric::FabricErrorKind`], says which, and its words are never read); a
//! member whose own side could not start is the only suspect of its group. Later rounds pair
//! each open node with its neighbours in name order and then with cleared nodes near and far
//! from it. A node is named only when it failed beside each of those cleared partners and met
//! every other open node, so that it is the one difference; a node that passed a group is never
//! named. A group that failed although each member passed elsewhere is a fault between nodes
//! (a link, or a switch between two groups: [`between`]), found by splitting it, and names no
//! node.
//!
//! [`next`] takes the candidates, the settings and the history (the rounds planned so far and
//! every member's outcomes) and says what to do: plan a round, wait, or conclude. It keeps no
//! state, so a restarted operator decides the same from the same history.

pub mod between;
pub mod evaluate;
#[cfg(any(test, feature = "model"))]
pub mod model;
pub mod neighbours;
pub mod plan;
#[cfg(test)]
mod property;
pub mod settings;
#[cfg(test)]
mod tests;

pub use between::BetweenFault;
pub use evaluate::{Evaluation, Evidence, GroupFailure, History, NodeState, Standing};
pub use plan::{Conclusion, Decision, NodeFabric, next};
pub use settings::Settings;

use gpuval_crds::fabric::FabricKind;

/// Why a round was planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Round 1: everything at once.
    Screen,
    /// Suspects paired with each other (no node proven good yet).
    Pairs,
    /// Each suspect paired with a node proven good.
    Confirm,
    /// A group that failed although each member passed elsewhere, split into parts (or its
    /// parts joined two by two) to find the fault between them.
    Split,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Screen => "screen",
            Purpose::Pairs => "pairs",
            Purpose::Confirm => "confirm",
            Purpose::Split => "split",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Purpose::Screen,
            Purpose::Pairs,
            Purpose::Confirm,
            Purpose::Split,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }
}

/// A group of a round: its id is its index in the round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub kind: FabricKind,
    /// Members in rank order; the first hosts the rendezvous.
    pub nodes: Vec<String>,
}

/// A planned round (numbered from 1 by its place in the history).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    pub purpose: Purpose,
    pub groups: Vec<Group>,
}
