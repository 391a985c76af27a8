//! The next step of a fabric test: plan a round, wait for the one running, or conclude.

use std::collections::BTreeMap;

use gpuval_crds::fabric::{FabricKind, MAX_LISTED_SUSPECTS};

use crate::evaluate::{History, NodeState, evaluate};
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
    pub message: String,
}

impl Conclusion {
    /// Nodes named at fault or in error, in name order.
    pub fn failed(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, v)| matches!(v, NodeFabric::Failed(_) | NodeFabric::Error(_)))
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
    let states = evaluate(candidates, settings, history);
    let rounds = history.rounds.len() as u32;
    if settings.localize && rounds < settings.max_rounds {
        let round = localize(&states, settings);
        if !round.groups.is_empty() {
            return Decision::Plan(round);
        }
    }
    Decision::Done(conclude(&states, settings, history))
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

/// The next localizing round: for each kind, every suspect beside a node proven good (the good
/// node hosts the rendezvous); suspects for whom no good node is left this round and that were
/// only ever short in larger groups are paired with each other.
fn localize(states: &BTreeMap<String, NodeState>, settings: &Settings) -> Round {
    let mut groups = Vec::new();
    let mut confirm = false;
    for kind in settings.kinds() {
        let standing = |s: &NodeState| s.standing(kind).cloned().unwrap_or_default();
        let mut good = states
            .iter()
            .filter(|(_, s)| !s.is_out() && standing(s).passed)
            .map(|(n, _)| n.clone());
        let suspects: Vec<(&String, bool)> = states
            .iter()
            .filter(|(n, s)| {
                !s.is_out() && (is_suspect(n, s, kind, states) || standing(s).untested())
            })
            .map(|(n, s)| (n, standing(s).paired))
            .collect();
        let mut unpaired = Vec::new();
        for (node, paired) in suspects {
            match good.next() {
                Some(g) => {
                    confirm = true;
                    groups.push(Group {
                        kind,
                        nodes: vec![g, node.clone()],
                    });
                }
                None if !paired => unpaired.push(node.clone()),
                None => {}
            }
        }
        groups.extend(pairs(&unpaired, kind));
    }
    Round {
        purpose: if confirm {
            Purpose::Confirm
        } else {
            Purpose::Pairs
        },
        groups,
    }
}

/// Short in a group of `kind`, never passed one, and not yet named: some group it was short in
/// had a member not proven good.
fn is_suspect(
    node: &str,
    s: &NodeState,
    kind: FabricKind,
    states: &BTreeMap<String, NodeState>,
) -> bool {
    let Some(st) = s.standing(kind) else {
        return false;
    };
    !st.passed && !st.short.is_empty() && named_by(node, st, kind, states).is_none()
}

/// The groups that name this node: it fell short beside members that all passed elsewhere.
fn named_by(
    node: &str,
    st: &crate::Standing,
    kind: FabricKind,
    states: &BTreeMap<String, NodeState>,
) -> Option<String> {
    if st.passed {
        return None;
    }
    let cleared = |n: &String| {
        states
            .get(n)
            .and_then(|s| s.standing(kind))
            .is_some_and(|s| s.passed)
    };
    let damning: Vec<_> = st
        .short
        .iter()
        .filter(|e| e.others(node).all(cleared))
        .collect();
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
        "in {} of {} {kind_name} {}; partners {}{more} passed elsewhere",
        damning.len(),
        st.short.len(),
        first.why,
        partners.join(", ")
    ))
}

fn verdict_of(
    node: &str,
    s: &NodeState,
    settings: &Settings,
    states: &BTreeMap<String, NodeState>,
) -> NodeFabric {
    if let Some(e) = &s.error {
        return NodeFabric::Error(e.clone());
    }
    if let Some(f) = &s.fault {
        return NodeFabric::Failed(f.clone());
    }
    let mut suspect = None;
    for kind in settings.kinds() {
        let Some(st) = s.standing(kind) else { continue };
        if let Some(why) = named_by(node, st, kind, states) {
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
    states: &BTreeMap<String, NodeState>,
    settings: &Settings,
    history: &History<'_>,
) -> Conclusion {
    let nodes: BTreeMap<String, NodeFabric> = states
        .iter()
        .map(|(n, s)| (n.clone(), verdict_of(n, s, settings, states)))
        .collect();
    let (bus_gbps, slowest_join) = screening_figures(history);
    let mut c = Conclusion {
        passed: nodes
            .values()
            .all(|v| matches!(v, NodeFabric::Passed | NodeFabric::Untested)),
        nodes,
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
            "{} node(s) at fault after {rounds} round(s): {}",
            failed.len(),
            failed.join(", ")
        ));
    }
    if !suspects.is_empty() {
        let extra = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        parts.push(format!(
            "not localized: {}{extra} fell short beside nodes never cleared",
            suspects.join(", ")
        ));
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
