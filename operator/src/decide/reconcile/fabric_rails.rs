//! Rail by rail (`spec.fabric.nccl.rails`): each rail is a fabric test of its own, planned by
//! the same planner on its own part of the history, so a fault on one rail is localized among
//! that rail's groups and named with the rail. Without rails the whole test is one stream and
//! nothing here changes it.
//!
//! With rails, the streams are: the TCP pairs (when `spec.fabric.tcp` is set; they use the IP
//! network, not a rail), then one stream of NCCL groups per rail. A round holds the groups every
//! stream plans for it; each stream sees only its own groups, renumbered as if the others were
//! not there (its rounds without any of its groups left out), so the planner's rules hold as
//! they are. The round's outcome waits for every stream; the test ends when every stream is done.

use std::collections::BTreeMap;

use gpuval_crds::fabric::{FabricGroup, FabricOutcome, FabricSpec};
use gpuval_fabric::{Conclusion, Decision, Group, NodeFabric, Purpose, Round, Settings};

use super::view::RoundView;

/// One independently planned part of the fabric test.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    /// The rail its NCCL groups test (None: every HCA at once, or the TCP pairs).
    pub rail: Option<String>,
    pub settings: Settings,
}

impl Stream {
    fn holds(&self, g: &FabricGroup) -> bool {
        g.rail == self.rail
    }

    /// `rail mlx5_1: ` before a message of a rail's stream.
    fn prefix(&self) -> String {
        self.rail
            .as_ref()
            .map(|r| format!("rail {r}: "))
            .unwrap_or_default()
    }
}

/// The streams of `spec`: one without rails.
pub fn streams(spec: &FabricSpec) -> Vec<Stream> {
    let all = Settings::from_spec(spec);
    let rails = spec
        .nccl
        .as_ref()
        .map(|n| n.rails.as_slice())
        .unwrap_or_default();
    if rails.is_empty() {
        return vec![Stream {
            rail: None,
            settings: all,
        }];
    }
    let mut out = Vec::new();
    if all.tcp {
        out.push(Stream {
            rail: None,
            settings: Settings {
                nccl_min_bus_gbps: None,
                ..all.clone()
            },
        });
    }
    out.extend(rails.iter().map(|r| Stream {
        rail: Some(r.clone()),
        settings: Settings {
            tcp: false,
            tcp_min_gbps: None,
            tcp_max_latency_micros: None,
            ..all.clone()
        },
    }));
    out
}

/// One stream's part of the history, numbered as the planner numbers it.
#[derive(Debug, Default)]
pub struct StreamHistory {
    pub rounds: Vec<Round>,
    pub outcomes: BTreeMap<String, Vec<FabricOutcome>>,
    /// Its last round is the test's latest round (else that round of its is long over).
    pub last_is_latest: bool,
}

/// `stream`'s rounds among `planned` (in order) and its members' outcomes of them.
pub fn history(
    stream: &Stream,
    planned: &[&RoundView],
    outcomes: &BTreeMap<String, Vec<FabricOutcome>>,
) -> StreamHistory {
    let mut h = StreamHistory::default();
    // (round number, group id) in the test -> (round number, group index) in the stream.
    let mut local: BTreeMap<(i64, i64), (i32, i32)> = BTreeMap::new();
    for (i, r) in planned.iter().enumerate() {
        let mine: Vec<&FabricGroup> = r.groups.iter().filter(|g| stream.holds(g)).collect();
        if mine.is_empty() {
            continue;
        }
        let number = i32::try_from(h.rounds.len() + 1).unwrap_or(i32::MAX);
        for (k, g) in mine.iter().enumerate() {
            let k = i32::try_from(k).unwrap_or(i32::MAX);
            local.insert((i64::from(r.number), i64::from(g.id)), (number, k));
        }
        h.rounds.push(Round {
            purpose: Purpose::parse(&r.purpose).unwrap_or(Purpose::Confirm),
            groups: mine
                .iter()
                .map(|g| Group {
                    kind: g.kind,
                    nodes: g.nodes.clone(),
                })
                .collect(),
        });
        h.last_is_latest = i + 1 == planned.len();
    }
    for (node, list) in outcomes {
        let mine: Vec<FabricOutcome> = list
            .iter()
            .filter_map(|o| {
                let (round, group) = local.get(&(i64::from(o.round), i64::from(o.group)))?;
                Some(FabricOutcome {
                    round: *round,
                    group: *group,
                    ..o.clone()
                })
            })
            .collect();
        if !mine.is_empty() {
            h.outcomes.insert(node.clone(), mine);
        }
    }
    h
}

/// A round's groups, each with the rail it tests.
#[derive(Debug, Clone, PartialEq)]
pub struct RailRound {
    pub round: Round,
    /// One per group of `round`.
    pub rails: Vec<Option<String>>,
}

/// What the streams decide together: wait while any waits, plan the groups of every stream that
/// plans, and end when every stream is done.
#[derive(Debug, Clone, PartialEq)]
pub enum Joint {
    Plan(RailRound),
    Wait { awaited: usize },
    Done(Conclusion),
}

/// Combines the streams' decisions (in the order of [`streams`]).
pub fn combine(decisions: Vec<(&Stream, Decision)>) -> Joint {
    let awaited: usize = decisions
        .iter()
        .map(|(_, d)| match d {
            Decision::Wait { awaited } => *awaited,
            _ => 0,
        })
        .sum();
    if decisions
        .iter()
        .any(|(_, d)| matches!(d, Decision::Wait { .. }))
    {
        return Joint::Wait { awaited };
    }
    let mut plan: Option<RailRound> = None;
    let mut done = Vec::new();
    for (stream, d) in decisions {
        match d {
            Decision::Plan(round) => {
                let p = plan.get_or_insert_with(|| RailRound {
                    round: Round {
                        purpose: round.purpose,
                        groups: Vec::new(),
                    },
                    rails: Vec::new(),
                });
                p.rails
                    .extend(round.groups.iter().map(|_| stream.rail.clone()));
                p.round.groups.extend(round.groups);
            }
            Decision::Done(c) => done.push((stream, c)),
            Decision::Wait { .. } => {}
        }
    }
    match plan {
        Some(p) => Joint::Plan(p),
        None => Joint::Done(merge(done)),
    }
}

/// How bad a node's fabric verdict is, for keeping the worst over the rails.
fn rank(v: &NodeFabric) -> u8 {
    match v {
        NodeFabric::Passed => 0,
        NodeFabric::Untested => 1,
        NodeFabric::Suspect(_) => 2,
        NodeFabric::Error(_) => 3,
        NodeFabric::Failed(_) => 4,
    }
}

fn with_prefix(v: NodeFabric, prefix: &str) -> NodeFabric {
    match v {
        NodeFabric::Failed(w) => NodeFabric::Failed(format!("{prefix}{w}")),
        NodeFabric::Error(w) => NodeFabric::Error(format!("{prefix}{w}")),
        NodeFabric::Suspect(w) => NodeFabric::Suspect(format!("{prefix}{w}")),
        other => other,
    }
}

/// Joins two verdicts of one node: the worse stays; two of the same kind keep both reasons.
fn join(a: NodeFabric, b: NodeFabric) -> NodeFabric {
    match (a, b) {
        (NodeFabric::Failed(x), NodeFabric::Failed(y)) => NodeFabric::Failed(format!("{x}; {y}")),
        (NodeFabric::Error(x), NodeFabric::Error(y)) => NodeFabric::Error(format!("{x}; {y}")),
        (NodeFabric::Suspect(x), NodeFabric::Suspect(y)) => {
            NodeFabric::Suspect(format!("{x}; {y}"))
        }
        (a, b) if rank(&b) > rank(&a) => b,
        (a, _) => a,
    }
}

/// One conclusion of the streams' (a single stream's unchanged).
fn merge(mut done: Vec<(&Stream, Conclusion)>) -> Conclusion {
    if done.len() == 1
        && let Some((_, c)) = done.pop()
    {
        return c;
    }
    let mut out = Conclusion {
        passed: true,
        nodes: BTreeMap::new(),
        bus_gbps: None,
        tcp_min_gbps: None,
        slowest_join: None,
        between: Vec::new(),
        message: String::new(),
    };
    let mut messages = Vec::new();
    let mut passed = Vec::new();
    for (stream, c) in done {
        let prefix = stream.prefix();
        out.passed &= c.passed;
        if c.passed {
            passed.push(
                stream
                    .rail
                    .clone()
                    .unwrap_or_else(|| "the TCP pairs".into()),
            );
        } else {
            messages.push(format!("{prefix}{}", c.message));
        }
        for (node, v) in c.nodes {
            let v = with_prefix(v, &prefix);
            let joined = match out.nodes.remove(&node) {
                Some(held) => join(held, v),
                None => v,
            };
            out.nodes.insert(node, joined);
        }
        out.bus_gbps = min(out.bus_gbps, c.bus_gbps);
        out.tcp_min_gbps = min(out.tcp_min_gbps, c.tcp_min_gbps);
        if let Some((node, secs)) = c.slowest_join
            && out.slowest_join.as_ref().is_none_or(|(_, s)| secs > *s)
        {
            out.slowest_join = Some((node, secs));
        }
        out.between.extend(c.between);
    }
    // What failed first and whole (the status keeps a bounded message); then what passed.
    if !passed.is_empty() {
        messages.push(format!("passed: {}", passed.join(", ")));
    }
    out.message = messages.join("; ");
    out
}

fn min(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}
