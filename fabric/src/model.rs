//! A model fabric for the tests of the planner and of the operator's fabric step (behind the
//! `model` feature; the planner never uses it): every node has an NCCL bus bandwidth, healthy
//! or slow, and a group measures what its slowest member gives; [`Fabric`] adds the failures
//! real hardware showed (errors that reach every peer, members that never join, bad links and
//! switch uplinks between healthy nodes).

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::fabric::{FabricError, FabricErrorKind};

/// A healthy node's bus bandwidth in the model, GB/s (above the tests' 350 GB/s floor).
pub const GOOD_GBPS: f64 = 380.0;
/// A slow node's bus bandwidth in the model, GB/s (below that floor).
pub const SLOW_GBPS: f64 = 120.0;

/// Each node's bus bandwidth, GB/s.
#[derive(Debug, Clone, Default)]
pub struct Bandwidths(pub BTreeMap<String, f64>);

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

/// A link or switch fault in the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Between {
    /// The link between two healthy nodes: a group holding both fails (`fails`: with errors on
    /// every member, as a dead link; else slow).
    Link { a: String, b: String, fails: bool },
    /// Nodes behind one switch whose uplink is bad: a group with members on both sides of it
    /// is slow; groups on one side are not.
    Trunk(BTreeSet<String>),
}

impl Between {
    /// Whether a group of `members` crosses this fault.
    pub fn crossed_by(&self, members: &[String]) -> bool {
        match self {
            Between::Link { a, b, .. } => members.contains(a) && members.contains(b),
            Between::Trunk(side) => {
                let inside = members.iter().filter(|m| side.contains(*m)).count();
                inside > 0 && inside < members.len()
            }
        }
    }
}

/// The words NCCL gives on a rank whose peer went away (seen on real H100s).
pub const PEER_CLOSED: &str = "ncclCommInitRank: remote process exited or there was a network \
     error (NCCL: socketProgress: Connection closed by remote peer)";
/// The words NCCL gives on a node without a usable interface.
pub const NO_INTERFACE: &str =
    "ncclCommInitRank: invalid usage (NET/Socket : no socket interface found)";

/// A model fabric with the failures real hardware showed: slow nodes, nodes whose NCCL cannot
/// start (every peer then reports the connection closed), members that never join, agents that
/// vanish, bad links between two healthy nodes, and bad switch uplinks shared by a subset.
#[derive(Debug, Clone, Default)]
pub struct Fabric {
    pub bw: Bandwidths,
    /// Their NCCL cannot start (no interface): a `Local` error.
    pub local: BTreeSet<String>,
    /// They never reach their group's rendezvous (and no one reaches theirs).
    pub never_join: BTreeSet<String>,
    /// Their agents are gone: no report at all.
    pub gone: BTreeSet<String>,
    pub between: Vec<Between>,
    /// Every member's words are replaced by words that say nothing of whose failure it is: the
    /// planner judges from the kinds alone, so nothing it concludes may change.
    pub reword: bool,
    /// The first healthy member of a broken group types the peer's failure as its own
    /// (`Local`), as an agent did on real hardware before its kinds were set at the NCCL call:
    /// a node whose own words are wrong is a suspect, and the rounds that pair it with cleared
    /// nodes must clear it again.
    pub mislabel: bool,
    /// So slow that a group holding them stalls: the first healthy member's sweep is stopped
    /// for its silence ([`SWEEP_STALLED`], `Stalled`), the others (the slow node too) say the
    /// group was aborted after that member failed (`Aborted`), as on 4x H200 with one node's
    /// sockets throttled to 400 MB/s.
    pub stall: BTreeSet<String>,
}

/// The words a healthy member's agent gave when its sweep stalled in a group holding a node
/// throttled to 400 MB/s (4x H200, 91c60b5).
pub const SWEEP_STALLED: &str = "the NCCL sweep process was killed: it reported nothing for 90s";

/// What one member of a modelled group reports (None: its agent is gone).
pub type Reported = Option<(Option<f64>, Option<FabricError>, Vec<String>)>;

impl Fabric {
    pub fn new(nodes: &[String], slow: &[usize]) -> Self {
        Fabric {
            bw: Bandwidths::new(nodes, slow),
            ..Fabric::default()
        }
    }

    /// The nodes at fault themselves (a healthy node behind a bad link or switch is not).
    pub fn faulty(&self) -> BTreeSet<String> {
        let slow = self
            .bw
            .0
            .iter()
            .filter(|(_, b)| **b < GOOD_GBPS)
            .map(|(n, _)| n.clone());
        slow.chain(self.local.iter().cloned())
            .chain(self.stall.iter().cloned())
            .chain(self.never_join.iter().cloned())
            .chain(self.gone.iter().cloned())
            .collect()
    }

    /// In a group that stalls, the member whose watchdog fires: the first that is not itself
    /// stalled (every member stalled: the first of them). None: the group does not stall.
    fn stalled_by<'m>(&self, members: &'m [String]) -> Option<&'m String> {
        if !members.iter().any(|m| self.stall.contains(m)) {
            return None;
        }
        members
            .iter()
            .find(|m| !self.stall.contains(*m))
            .or(members.first())
    }

    /// Each member's report for a group of `members` (rank order): bus bandwidth, error, and
    /// (on the host) the members that never joined.
    pub fn group(&self, members: &[String]) -> Vec<Reported> {
        let host_absent = members
            .first()
            .is_some_and(|h| self.never_join.contains(h) || self.gone.contains(h));
        let missing: Vec<String> = members
            .iter()
            .skip(1)
            .filter(|m| self.never_join.contains(*m) || self.gone.contains(*m))
            .cloned()
            .collect();
        let local = members.iter().any(|m| self.local.contains(m));
        let dead_link = self
            .between
            .iter()
            .any(|b| matches!(b, Between::Link { fails: true, .. }) && b.crossed_by(members));
        let slow_between = self
            .between
            .iter()
            .any(|b| !matches!(b, Between::Link { fails: true, .. }) && b.crossed_by(members));
        let stalled_by = self.stalled_by(members);
        let mut mislabelled = !self.mislabel;
        members
            .iter()
            .enumerate()
            .map(|(rank, n)| {
                if self.gone.contains(n) {
                    return None;
                }
                let reword = self.reword;
                let err = |kind, m: &str| {
                    let message = match reword {
                        true => format!("member {rank} reports a failure in other words"),
                        false => m.into(),
                    };
                    Some(FabricError { kind, message })
                };
                let never = |m: &str| err(FabricErrorKind::NeverJoined, m);
                let mut peer = |m: &str| match mislabelled {
                    true => err(FabricErrorKind::Peer, m),
                    false => {
                        mislabelled = true;
                        err(FabricErrorKind::Local, m)
                    }
                };
                if host_absent {
                    let e = if rank == 0 {
                        never("no member joined the rendezvous: they never came")
                    } else {
                        never("could not reach the rendezvous host: connection timed out")
                    };
                    let missing = if rank == 0 {
                        members[1..].to_vec()
                    } else {
                        vec![]
                    };
                    return Some((None, e, missing));
                }
                if rank == 0 && !missing.is_empty() {
                    return Some((None, never("member(s) never joined"), missing.clone()));
                }
                if self.never_join.contains(n) {
                    return Some((
                        None,
                        never("could not reach the rendezvous host: connection timed out"),
                        vec![],
                    ));
                }
                if !missing.is_empty() {
                    return Some((
                        None,
                        never("the host stopped the group: member(s) never joined"),
                        vec![],
                    ));
                }
                if self.local.contains(n) {
                    return Some((None, err(FabricErrorKind::Local, NO_INTERFACE), vec![]));
                }
                if local || dead_link {
                    return Some((None, peer(PEER_CLOSED), vec![]));
                }
                if let Some(first) = stalled_by.as_ref() {
                    if n == *first {
                        return Some((None, err(FabricErrorKind::Stalled, SWEEP_STALLED), vec![]));
                    }
                    let m = format!(
                        "aborted: member {first} of the group failed first, and this member stopped"
                    );
                    return Some((None, err(FabricErrorKind::Aborted, &m), vec![]));
                }
                let bus = if slow_between {
                    SLOW_GBPS
                } else {
                    self.bw.group(members)
                };
                Some((Some(bus), None, vec![]))
            })
            .collect()
    }
}
