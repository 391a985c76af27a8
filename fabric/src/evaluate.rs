//! What the rounds so far say of each node: which groups it passed, in which it fell short and
//! beside whom, and whether it failed on its own.

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::fabric::{FabricKind, FabricOutcome};

use crate::{Group, Purpose, Round, Settings};

/// Everything the planner knows: the rounds planned so far (round `n` is `rounds[n - 1]`), each
/// node's outcomes, the nodes whose agents are gone, and whether the last round ran out of time.
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    pub rounds: &'a [Round],
    pub outcomes: &'a BTreeMap<String, Vec<FabricOutcome>>,
    pub gone: &'a BTreeSet<String>,
    pub last_round_expired: bool,
}

impl History<'_> {
    /// The outcome `node` reported for group `group` of round `round`.
    pub fn outcome(&self, node: &str, round: u32, group: usize) -> Option<&FabricOutcome> {
        self.outcomes
            .get(node)?
            .iter()
            .find(|o| i64::from(o.round) == i64::from(round) && i64::from(o.group) == group as i64)
    }

    /// Members of the last round that neither reported nor left, in groups whose outcome is
    /// not known yet (see [`History::failed_early`]).
    pub fn awaited(&self) -> usize {
        let Some(last) = self.rounds.last() else {
            return 0;
        };
        let round = self.rounds.len() as u32;
        last.groups
            .iter()
            .enumerate()
            .filter(|(id, g)| !self.failed_early(round, *id, g))
            .flat_map(|(id, g)| g.nodes.iter().map(move |n| (id, n)))
            .filter(|(id, n)| !self.gone.contains(*n) && self.outcome(n, round, *id).is_none())
            .count()
    }

    /// Whether group `id` of `round` is over before all its members reported: a member
    /// reported an error (the group cannot pass) and its host reported too (or is gone), so
    /// its rendezvous is over and the members still running are being stopped.
    pub fn failed_early(&self, round: u32, id: usize, group: &Group) -> bool {
        let Some(host) = group.nodes.first() else {
            return false;
        };
        let host_done = self.gone.contains(host) || self.outcome(host, round, id).is_some();
        host_done
            && group.nodes.iter().any(|n| {
                self.outcome(n, round, id)
                    .is_some_and(|o| o.error.is_some())
            })
    }
}

impl Evidence {
    /// The members other than `node`.
    pub fn others<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        self.members.iter().filter(move |n| n.as_str() != node)
    }
}

/// One group a node fell short in.
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence {
    pub round: u32,
    pub kind: FabricKind,
    /// What was short, in words: the measurement, its figure and its floor
    /// (`NCCL bus bandwidth 312.0 GB/s below 350`).
    pub why: String,
    /// Every member of the group, this node included (shared by all members' evidence, so a
    /// screening group of N nodes costs N pointers, not N² names).
    pub members: std::sync::Arc<Vec<String>>,
}

/// A node's record for one kind of group.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Standing {
    /// It was in a group of this kind that passed.
    pub passed: bool,
    /// The groups of this kind it was in that fell short.
    pub short: Vec<Evidence>,
    /// Its smallest group that fell short had only two members.
    pub paired: bool,
    /// It was in a group that a member broke on its own (which says nothing of the others).
    pub interrupted: bool,
    /// The nodes it was paired with (groups of two that ended, whatever their outcome).
    pub partners: BTreeSet<String>,
}

impl Standing {
    /// Never measured to an end: its groups were all broken by other members.
    pub fn untested(&self) -> bool {
        !self.passed && self.short.is_empty() && self.interrupted
    }
}

/// What the rounds say of one node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeState {
    /// Its agent vanished or never reported: an error of that node.
    pub error: Option<String>,
    pub kinds: BTreeMap<&'static str, Standing>,
}

impl NodeState {
    pub fn standing(&self, kind: FabricKind) -> Option<&Standing> {
        self.kinds.get(kind.as_str())
    }

    /// Out of the test: its agent is gone or silent.
    pub fn is_out(&self) -> bool {
        self.error.is_some()
    }
}

/// A group that did not pass: the raw material for faults between nodes (a group that failed
/// although every member of it passed elsewhere).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupFailure {
    pub round: u32,
    /// Why its round was planned.
    pub purpose: Purpose,
    pub id: usize,
    pub kind: FabricKind,
    pub why: String,
    pub members: std::sync::Arc<Vec<String>>,
}

/// What the rounds say: each node's state, and every group that did not pass.
#[derive(Debug, Clone, Default)]
pub struct Evaluation {
    pub states: BTreeMap<String, NodeState>,
    pub failures: Vec<GroupFailure>,
    /// Every group that passed, by kind, as its sorted member list.
    pub passed: BTreeSet<(&'static str, Vec<String>)>,
}

/// Every node's state after the rounds of `history`.
pub fn evaluate(candidates: &[String], settings: &Settings, history: &History<'_>) -> Evaluation {
    let mut e = Evaluation {
        states: candidates
            .iter()
            .map(|n| (n.clone(), NodeState::default()))
            .collect(),
        ..Evaluation::default()
    };
    for (i, round) in history.rounds.iter().enumerate() {
        let number = i as u32 + 1;
        for (id, group) in round.groups.iter().enumerate() {
            judge_group(number, id, group, settings, history, &mut e);
        }
    }
    e
}

/// The members' outcomes of one group, and the group's own verdict. A member that failed on
/// its own side (a local error, or absent from a rendezvous others reached) carries the
/// group's failure as evidence against it alone and the others are not judged; otherwise a
/// failing group is evidence against every member (the group is suspect, not one member).
fn judge_group(
    round: u32,
    id: usize,
    group: &Group,
    settings: &Settings,
    history: &History<'_>,
    e: &mut Evaluation,
) {
    let outcomes: Vec<Option<&FabricOutcome>> = group
        .nodes
        .iter()
        .map(|n| history.outcome(n, round, id))
        .collect();
    let complete = outcomes.iter().all(Option::is_some);
    let is_last = round as usize == history.rounds.len();
    let early = history.failed_early(round, id, group);
    if !complete && is_last && !history.last_round_expired && !early {
        // Still running (members missing only because they have not reported yet) unless
        // their agents are gone.
        if group
            .nodes
            .iter()
            .zip(&outcomes)
            .any(|(n, o)| o.is_none() && !history.gone.contains(n))
        {
            return;
        }
    }
    let Blame { errors, own } = blame(round, group, &outcomes, history, early);
    for (node, why) in &errors {
        if let Some(s) = e.states.get_mut(node) {
            s.error.get_or_insert_with(|| why.clone());
        }
    }
    let short = if errors.is_empty() && own.is_empty() {
        shortfall(group.kind, &outcomes, settings)
    } else {
        own.first()
            .map(|(_, w)| w.clone())
            .or_else(|| errors.first().map(|(n, w)| format!("{n}: {w}")))
    };
    if let [a, b] = group.nodes.as_slice() {
        for (me, other) in [(a, b), (b, a)] {
            if let Some(s) = e.states.get_mut(me) {
                let st = s.kinds.entry(group.kind.as_str()).or_default();
                st.partners.insert(other.clone());
            }
        }
    }
    let members = std::sync::Arc::new(group.nodes.clone());
    let Some(why) = short else {
        let mut sorted = group.nodes.clone();
        sorted.sort();
        e.passed.insert((group.kind.as_str(), sorted));
        for node in &group.nodes {
            if let Some(s) = e.states.get_mut(node) {
                s.kinds.entry(group.kind.as_str()).or_default().passed = true;
            }
        }
        return;
    };
    if errors.is_empty() {
        e.failures.push(GroupFailure {
            round,
            purpose: history.rounds[round as usize - 1].purpose,
            id,
            kind: group.kind,
            why: why.clone(),
            members: members.clone(),
        });
    }
    let accused: Vec<(&String, String)> = if own.is_empty() && errors.is_empty() {
        group.nodes.iter().map(|n| (n, why.clone())).collect()
    } else {
        own.iter().map(|(n, w)| (n, w.clone())).collect()
    };
    for node in &group.nodes {
        let Some(state) = e.states.get_mut(node) else {
            continue;
        };
        let standing = state.kinds.entry(group.kind.as_str()).or_default();
        match accused.iter().find(|(n, _)| *n == node) {
            Some((_, w)) => {
                standing.paired |= group.nodes.len() == 2;
                standing.short.push(Evidence {
                    round,
                    kind: group.kind,
                    why: w.clone(),
                    members: members.clone(),
                });
            }
            None => standing.interrupted = true,
        }
    }
}

/// Who a group's failure points at.
struct Blame {
    /// Members gone or silent: errors of those nodes, out of the test.
    errors: Vec<(String, String)>,
    /// Members whose own side failed (a local error, or absent from a rendezvous that other
    /// members reached), with their words: suspects until confirmed beside good nodes.
    own: Vec<(String, String)>,
}

/// Members that failed on their own in this group: gone, silent, an error of its own kind
/// ([`gpuval_crds::fabric::FabricErrorKind::is_own`]; the words are never read), or missing
/// from a rendezvous that other members reached.
fn blame(
    round: u32,
    group: &Group,
    outcomes: &[Option<&FabricOutcome>],
    history: &History<'_>,
    early: bool,
) -> Blame {
    let host_report = outcomes.first().copied().flatten();
    let missing: &[String] = host_report.map_or(&[], |o| o.missing.as_slice());
    let someone_joined = missing.len() + 1 < group.nodes.len();
    let mut b = Blame {
        errors: Vec::new(),
        own: Vec::new(),
    };
    for (node, outcome) in group.nodes.iter().zip(outcomes) {
        match outcome {
            None if history.gone.contains(node) => b.errors.push((
                node.clone(),
                format!("its agent left during fabric round {round}"),
            )),
            // The group failed on another member's error: this one was stopped, not silent.
            None if early => {}
            None => b.errors.push((
                node.clone(),
                format!("no fabric report within round {round}'s timeout"),
            )),
            Some(o) => match &o.error {
                Some(e) if e.kind.is_own() => b
                    .own
                    .push((node.clone(), format!("fabric round {round}: {}", e.message))),
                _ if missing.contains(node) && someone_joined => b.own.push((
                    node.clone(),
                    format!(
                        "could not reach the rendezvous on {} in fabric round {round}, which {} other member(s) reached",
                        group.nodes[0],
                        group.nodes.len() - 1 - missing.len()
                    ),
                )),
                _ => {}
            },
        }
    }
    b
}

/// Why a group whose members all reported falls short of the floors (None: it passed).
fn shortfall(
    kind: FabricKind,
    outcomes: &[Option<&FabricOutcome>],
    settings: &Settings,
) -> Option<String> {
    let reports: Vec<&FabricOutcome> = outcomes.iter().flatten().copied().collect();
    if let Some(e) = reports.iter().find_map(|o| o.error.as_ref()) {
        return Some(e.message.clone());
    }
    let min = |f: fn(&FabricOutcome) -> Option<f64>| {
        reports
            .iter()
            .map(|o| f(o))
            .collect::<Option<Vec<f64>>>()
            .map(|v| v.into_iter().fold(f64::INFINITY, f64::min))
    };
    match kind {
        FabricKind::Nccl => {
            let floor = settings.nccl_min_bus_gbps?;
            match min(|o| o.bus_gbps) {
                None => Some("no bus bandwidth reported".into()),
                Some(bw) if bw < floor => {
                    Some(format!("NCCL bus bandwidth {bw:.1} GB/s below {floor}"))
                }
                Some(_) => None,
            }
        }
        FabricKind::Tcp => tcp_shortfall(&reports, settings),
    }
}

fn tcp_shortfall(reports: &[&FabricOutcome], settings: &Settings) -> Option<String> {
    let mut worst = f64::INFINITY;
    for o in reports {
        match (o.send_gbps, o.recv_gbps) {
            (Some(s), Some(r)) => worst = worst.min(s).min(r),
            _ => return Some("no TCP throughput reported".into()),
        }
    }
    if let Some(floor) = settings.tcp_min_gbps
        && worst < floor
    {
        return Some(format!("TCP {worst:.2} Gb/s below {floor}"));
    }
    let latency = reports
        .iter()
        .filter_map(|o| o.latency_micros)
        .fold(0.0, f64::max);
    if let Some(limit) = settings.tcp_max_latency_micros
        && latency > limit
    {
        return Some(format!("TCP round trip {latency:.0} us above {limit}"));
    }
    None
}
