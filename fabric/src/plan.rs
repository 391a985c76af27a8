//! The next step of a fabric test: plan a round, wait for the one running, or conclude.

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::fabric::{FabricKind, MAX_LISTED_SUSPECTS};

use crate::between::{self, BetweenFault};
use crate::evaluate::{Evaluation, History, NodeState, Standing, evaluate};
use crate::neighbours::Neighbours;
use crate::{Group, Purpose, Round, Settings};

/// What to do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start this round (its number is the history's length plus one).
    Plan(Round),
    /// The last round still has this many members to report.
    Wait { awaited: usize },
    /// The test is over.
    Done(Conclusion),
}

/// A node's fabric verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeFabric {
    Passed,
    /// Named at fault, with the reason.
    Failed(String),
    /// Its agent left or went silent.
    Error(String),
    /// Fell short beside nodes that were never cleared either: not named.
    Suspect(String),
    /// Never measured to an end: every group it was in was broken by a member that failed on
    /// its own, and no node was left to pair it with.
    Untested,
}

/// How the fabric test ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Conclusion {
    pub passed: bool,
    pub nodes: BTreeMap<String, NodeFabric>,
    /// Bus bandwidth of the screening round's all-node group (its slowest member), GB/s.
    pub bus_gbps: Option<f64>,
    /// The lowest throughput of a TCP pair that passed, Gb/s.
    pub tcp_min_gbps: Option<f64>,
    /// The member slowest to join the screening round, and its delay in seconds.
    pub slowest_join: Option<(String, f64)>,
    /// Faults between nodes that each passed elsewhere: a link, or the switching between two
    /// groups (no node is named for them).
    pub between: Vec<BetweenFault>,
    pub message: String,
}

impl Conclusion {
    /// Nodes named at fault (hardware evidence), in name order. A node whose report was lost
    /// is not among them ([`Conclusion::lost`]).
    pub fn failed(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, v)| matches!(v, NodeFabric::Failed(_)))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Nodes whose agent left or went silent (their report lost: infrastructure, not the
    /// node's fabric), in name order.
    pub fn lost(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, v)| matches!(v, NodeFabric::Error(_)))
            .map(|(n, _)| n.clone())
            .collect()
    }
    /// Suspects (at most [`MAX_LISTED_SUSPECTS`]) and how many more there are.
    pub fn suspects(&self) -> (Vec<String>, usize) {
        let all: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, v)| matches!(v, NodeFabric::Suspect(_)))
            .map(|(n, _)| n.clone())
            .collect();
        let more = all.len().saturating_sub(MAX_LISTED_SUSPECTS);
        (all.into_iter().take(MAX_LISTED_SUSPECTS).collect(), more)
    }
}

/// The next step for `candidates` (the nodes that passed their checks, in a stable order).
pub fn next(candidates: &[String], settings: &Settings, history: &History<'_>) -> Decision {
    if history.rounds.is_empty() {
        return Decision::Plan(screen(candidates, settings));
    }
    let awaited = history.awaited();
    if awaited > 0 && !history.last_round_expired {
        return Decision::Wait { awaited };
    }
    let ev = evaluate(candidates, settings, history);
    let rounds = history.rounds.len() as u32;
    let found = between::find(&ev);
    if settings.localize && rounds < settings.max_rounds {
        let mut round = localize(&ev, settings);
        let splits: Vec<Group> = found.iter().flat_map(|f| f.next_groups.clone()).collect();
        if !splits.is_empty() && round.groups.is_empty() {
            round.purpose = Purpose::Split;
        }
        round.groups.extend(splits);
        round.groups = waves(round.groups);
        if !round.groups.is_empty() {
            return Decision::Plan(round);
        }
    }
    let faults = found.into_iter().map(|f| f.fault).collect();
    Decision::Done(conclude(&ev, faults, settings, history))
}

/// Round 1: one NCCL group over every candidate, and one TCP pair per candidate (an odd one
/// out is paired with the first candidate).
fn screen(candidates: &[String], settings: &Settings) -> Round {
    let mut groups = Vec::new();
    if settings.nccl_min_bus_gbps.is_some() {
        groups.push(Group {
            kind: FabricKind::Nccl,
            nodes: candidates.to_vec(),
        });
    }
    if settings.tcp {
        groups.extend(pairs(candidates, FabricKind::Tcp));
        if candidates.len() % 2 == 1 && candidates.len() > 1 {
            groups.push(Group {
                kind: FabricKind::Tcp,
                nodes: vec![
                    candidates[0].clone(),
                    candidates[candidates.len() - 1].clone(),
                ],
            });
        }
    }
    Round {
        purpose: Purpose::Screen,
        groups,
    }
}

fn pairs(nodes: &[String], kind: FabricKind) -> Vec<Group> {
    nodes
        .chunks_exact(2)
        .map(|c| Group {
            kind,
            nodes: c.to_vec(),
        })
        .collect()
}

/// The next localizing round. A node whose standing is open (a suspect, or never measured to
/// an end) is paired, for each kind, with its nearest cleared nodes in name order (one below
/// and one above, or the two nearest on the one side that has any) and the cleared node
/// farthest from it (a node never measured needs only one partner), and with other nodes
/// not cleared either (the nearest first, a few a round, until it met each of them). Name order follows racks
/// where names do: a neighbour most likely shares the node's switch, so a fault between
/// switches does not make it look bad. Pairs already measured are not planned again.
fn localize(ev: &Evaluation, settings: &Settings) -> Round {
    let names: Vec<&String> = ev.states.keys().collect();
    let mut groups = Vec::new();
    let mut confirm = false;
    for kind in settings.kinds() {
        let near = Neighbours::new(ev, kind);
        let mut planned = BTreeSet::new();
        for (i, (name, s)) in ev.states.iter().enumerate() {
            let st = s.standing(kind).cloned().unwrap_or_default();
            if s.is_out() || !(is_suspect(name, s, kind, ev) || st.untested()) {
                continue;
            }
            let mut cleared = near.cleared(i);
            if st.untested() {
                cleared.truncate(1);
            }
            let mut want: Vec<(usize, usize)> = cleared.into_iter().map(|c| (c, i)).collect();
            confirm |= !want.is_empty();
            // Open nodes are paired with each other too, the nearest first, a few a round:
            // two healthy nodes cut off from the cleared ones by a bad switch clear each other.
            want.extend(
                near.open_near(i, OPEN_PARTNERS_PER_ROUND, |a| {
                    st.partners.contains(names[a])
                })
                .into_iter()
                .map(|a| (a.min(i), a.max(i))),
            );
            for (host, member) in want {
                let other = if host == i { member } else { host };
                if st.partners.contains(names[other])
                    || !planned.insert((host.min(member), host.max(member)))
                {
                    continue;
                }
                groups.push(Group {
                    kind,
                    nodes: vec![names[host].clone(), names[member].clone()],
                });
            }
        }
    }
    Round {
        purpose: if confirm {
            Purpose::Confirm
        } else {
            Purpose::Pairs
        },
        groups: waves(groups),
    }
}

/// How many other open nodes an open node is paired with in one round.
const OPEN_PARTNERS_PER_ROUND: usize = 2;

/// `groups` ordered in waves: each wave holds each node at most once, so a node in several
/// groups of a round (agents run them in order) never holds up a chain of others.
pub fn waves(groups: Vec<Group>) -> Vec<Group> {
    let mut busy: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    let mut wave_of = Vec::with_capacity(groups.len());
    for g in &groups {
        let taken: BTreeSet<usize> = g
            .nodes
            .iter()
            .filter_map(|n| busy.get(n.as_str()))
            .flatten()
            .copied()
            .collect();
        let w = (0..).find(|w| !taken.contains(w)).unwrap_or(0);
        for n in &g.nodes {
            busy.entry(n.as_str()).or_default().insert(w);
        }
        wave_of.push(w);
    }
    let mut ordered: Vec<(usize, Group)> = wave_of.into_iter().zip(groups).collect();
    ordered.sort_by_key(|(w, _)| *w);
    ordered.into_iter().map(|(_, g)| g).collect()
}

/// Short in a group of `kind`, never passed one, and not yet named.
fn is_suspect(node: &str, s: &NodeState, kind: FabricKind, ev: &Evaluation) -> bool {
    let Some(st) = s.standing(kind) else {
        return false;
    };
    !st.passed && !st.short.is_empty() && named_by(node, st, kind, ev).is_none()
}

/// Whether `node` fell short beside the cleared nodes [`Neighbours::cleared`] picks for it and
/// was paired with every other node not cleared either: only
/// then is it the one difference, rather than a fault between its switch and a partner's.
fn confirmed_by_neighbours(
    node: &str,
    st: &Standing,
    kind: FabricKind,
    ev: &Evaluation,
    damning: &[&crate::Evidence],
) -> bool {
    let Some(i) = ev.states.keys().position(|n| n == node) else {
        return false;
    };
    let names: Vec<&String> = ev.states.keys().collect();
    let near = Neighbours::new(ev, kind);
    let failed_beside = |c: usize| {
        damning
            .iter()
            .any(|e| e.members.len() == 2 && e.members.contains(names[c]))
    };
    let cleared = near.cleared(i);
    !damning.is_empty()
        && cleared.into_iter().all(failed_beside)
        && near
            .open_near(i, 1, |a| st.partners.contains(names[a]))
            .is_empty()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The groups that name this node: it fell short beside members that all passed elsewhere.
fn named_by(node: &str, st: &crate::Standing, kind: FabricKind, ev: &Evaluation) -> Option<String> {
    if st.passed {
        return None;
    }
    let cleared = |n: &String| {
        ev.states
            .get(n)
            .and_then(|s| s.standing(kind))
            .is_some_and(|s| s.passed)
    };
    // The groups it fell short in where it was the only difference: every other member was
    // cleared, and they passed as this very group less this node (a pair's partner did, on
    // its own, elsewhere).
    let damning: Vec<_> = st
        .short
        .iter()
        .filter(|e| {
            e.others(node).all(cleared)
                && (e.members.len() == 2
                    || ev
                        .passed
                        .contains(&(kind.as_str(), sorted(e.others(node).cloned().collect()))))
        })
        .collect();
    if damning.is_empty() || !confirmed_by_neighbours(node, st, kind, ev, &damning) {
        return None;
    }
    let first = damning.first()?;
    // Partners from the smallest groups first: a pair partner says the most.
    let mut by_size = damning.clone();
    by_size.sort_by_key(|e| e.members.len());
    let mut partners: Vec<&str> = Vec::new();
    for p in by_size
        .iter()
        .flat_map(|e| e.others(node).map(String::as_str))
    {
        if !partners.contains(&p) {
            partners.push(p);
        }
    }
    const NAMED_PARTNERS: usize = 3;
    let more = partners.len().saturating_sub(NAMED_PARTNERS);
    partners.truncate(NAMED_PARTNERS);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let kind_name = match kind {
        FabricKind::Nccl => "NCCL groups",
        FabricKind::Tcp => "TCP pairs",
    };
    Some(format!(
        "in {} of {} {kind_name} ({}); partners {}{more} passed elsewhere",
        damning.len(),
        st.short.len(),
        first.why,
        partners.join(", ")
    ))
}

fn verdict_of(node: &str, s: &NodeState, settings: &Settings, ev: &Evaluation) -> NodeFabric {
    if let Some(e) = &s.error {
        return NodeFabric::Error(e.clone());
    }
    let mut suspect = None;
    for kind in settings.kinds() {
        let Some(st) = s.standing(kind) else { continue };
        if let Some(why) = named_by(node, st, kind, ev) {
            return NodeFabric::Failed(why);
        }
        if !st.passed
            && let Some(e) = st.short.first()
        {
            suspect.get_or_insert_with(|| {
                NodeFabric::Suspect(format!(
                    "short in fabric round {} ({}) beside {}, none of them cleared",
                    e.round,
                    e.why,
                    e.others(node).cloned().collect::<Vec<_>>().join(", ")
                ))
            });
        } else if st.untested() {
            suspect.get_or_insert(NodeFabric::Untested);
        }
    }
    suspect.unwrap_or(NodeFabric::Passed)
}

fn conclude(
    ev: &Evaluation,
    between: Vec<BetweenFault>,
    settings: &Settings,
    history: &History<'_>,
) -> Conclusion {
    let states = &ev.states;
    let nodes: BTreeMap<String, NodeFabric> = states
        .iter()
        .map(|(n, s)| (n.clone(), verdict_of(n, s, settings, ev)))
        .collect();
    let (bus_gbps, slowest_join) = screening_figures(history);
    let mut c = Conclusion {
        passed: between.is_empty()
            && nodes
                .values()
                .all(|v| matches!(v, NodeFabric::Passed | NodeFabric::Untested)),
        nodes,
        between,
        bus_gbps,
        tcp_min_gbps: tcp_min(history, states),
        slowest_join,
        message: String::new(),
    };
    c.message = message(&c, history.rounds.len());
    c
}

/// The screening NCCL group's bus bandwidth (slowest member) and slowest joiner.
fn screening_figures(history: &History<'_>) -> (Option<f64>, Option<(String, f64)>) {
    let Some((id, g)) = history.rounds.first().and_then(|r| {
        r.groups
            .iter()
            .enumerate()
            .find(|(_, g)| g.kind == FabricKind::Nccl)
    }) else {
        return (None, None);
    };
    let outcomes: Vec<(&String, _)> = g
        .nodes
        .iter()
        .filter_map(|n| history.outcome(n, 1, id).map(|o| (n, o)))
        .collect();
    let bus = (outcomes.len() == g.nodes.len())
        .then(|| {
            outcomes
                .iter()
                .map(|(_, o)| o.bus_gbps)
                .collect::<Option<Vec<f64>>>()
        })
        .flatten()
        .map(|v| v.into_iter().fold(f64::INFINITY, f64::min));
    let slowest = outcomes
        .iter()
        .max_by(|a, b| a.1.join_seconds.total_cmp(&b.1.join_seconds))
        .map(|(n, o)| ((*n).clone(), o.join_seconds));
    (bus, slowest)
}

/// The lowest throughput either way of any TCP pair whose members both passed TCP.
fn tcp_min(history: &History<'_>, states: &BTreeMap<String, NodeState>) -> Option<f64> {
    let passed = |n: &String| {
        states
            .get(n)
            .and_then(|s| s.standing(FabricKind::Tcp))
            .is_some_and(|s| s.passed)
    };
    let mut min: Option<f64> = None;
    for (i, round) in history.rounds.iter().enumerate() {
        for (id, g) in round.groups.iter().enumerate() {
            if g.kind != FabricKind::Tcp || !g.nodes.iter().all(passed) {
                continue;
            }
            for n in &g.nodes {
                if let Some(o) = history.outcome(n, i as u32 + 1, id) {
                    for v in [o.send_gbps, o.recv_gbps].into_iter().flatten() {
                        min = Some(min.map_or(v, |m| m.min(v)));
                    }
                }
            }
        }
    }
    min
}

/// What fell short for the first of `nodes` (the measurement, its figure and floor, beside
/// whom), as ` (node: why)`; empty where it has no words.
fn first_why(c: &Conclusion, nodes: &[String]) -> String {
    let why = nodes.first().and_then(|n| match c.nodes.get(n) {
        Some(NodeFabric::Failed(w) | NodeFabric::Suspect(w)) => Some((n, w)),
        _ => None,
    });
    why.map(|(n, w)| format!(" ({n}: {w})")).unwrap_or_default()
}

fn message(c: &Conclusion, rounds: usize) -> String {
    let failed = c.failed();
    let (suspects, more) = c.suspects();
    let mut parts = Vec::new();
    if c.passed {
        parts.push(format!(
            "{} nodes passed in {rounds} round(s)",
            c.nodes.len()
        ));
    }
    if !failed.is_empty() {
        parts.push(format!(
            "{} node(s) at fault after {rounds} round(s): {}{}",
            failed.len(),
            failed.join(", "),
            first_why(c, &failed)
        ));
    }
    let lost = c.lost();
    if !lost.is_empty() {
        parts.push(format!(
            "report lost from {} node(s) (their agent left or went silent; not the fabric's fault): {}",
            lost.len(),
            lost.join(", ")
        ));
    }
    if !suspects.is_empty() {
        let extra = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        parts.push(format!(
            "not localized: {}{extra} fell short beside nodes never cleared{}",
            suspects.join(", "),
            first_why(c, &suspects)
        ));
    }
    for f in &c.between {
        parts.push(f.to_string());
    }
    let untested = c
        .nodes
        .values()
        .filter(|v| **v == NodeFabric::Untested)
        .count();
    if untested > 0 {
        parts.push(format!(
            "{untested} node(s) not measured: their groups were broken by a member at fault"
        ));
    }
    if let Some(bw) = c.bus_gbps {
        parts.push(format!("all-node bus bandwidth {bw:.1} GB/s"));
    }
    parts.join("; ")
}
