//! The fabric test's planning, as pure functions shared by the operator (which plans rounds
//! through the API) and the bare-metal coordinator (`gpuval-agent fabric`, which plans them over
//! a TCP control channel).
//!
//! A fabric test is a sequence of rounds. The first screens everything at once: one NCCL group
//! over every node, and one TCP pair per node. When a group falls short, its members become
//! suspects, and later rounds narrow them down: suspects are paired with each other while no
//! node is proven good, then each is paired with a node that passed a group of the same kind.
//! A node is named only when it failed beside partners that were all proven good (or when it
//! failed on its own: its agent vanished, or its own side could not start); a node that passed
//! a group is never named, so a healthy node is never blamed.
//!
//! [`next`] takes the candidates, the settings and the history (the rounds planned so far and
//! every member's outcomes) and says what to do: plan a round, wait, or conclude. It keeps no
//! state, so a restarted operator decides the same from the same history.

pub mod evaluate;
#[cfg(any(test, feature = "model"))]
pub mod model;
pub mod plan;
pub mod settings;
#[cfg(test)]
mod tests;

pub use evaluate::{Evidence, History, NodeState, Standing};
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
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Screen => "screen",
            Purpose::Pairs => "pairs",
            Purpose::Confirm => "confirm",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Purpose::Screen, Purpose::Pairs, Purpose::Confirm]
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
