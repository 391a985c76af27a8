//! The fabric step: once every node has its verdict from its own checks, the nodes that passed
//! (their agents stay up for it) measure the fabric between them in rounds the planner
//! ([`gpuval_fabric::next`]) lays out. Each round is a `GpuFabricRound` object; the agents'
//! outcomes come back in their results' annotations. The step keeps no state of its own: the
//! rounds and outcomes in the cluster are the history, so a restarted operator goes on where
//! it was.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuval_crds::fabric::{
    FabricGroup, FabricPhase, FabricRoundSpec, FabricSpec, FabricStatus, RENDEZVOUS_PORT,
};
use gpuval_crds::{Evidence, NodeStatus, NodeVerdict};
use gpuval_fabric::{Conclusion, History, NodeFabric, Round};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::clock::RunClock;
use super::events::PlannedEvent;
use super::fabric_rails::{self, Joint, RailRound};
use super::truncate;
use super::view::{RoundView, World};

/// What the fabric step decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FabricStep {
    pub status: Option<FabricStatus>,
    /// A round to create (the end marker included).
    pub round: Option<FabricRoundSpec>,
    /// Nodes the fabric test failed (their lines are updated in place).
    pub newly_failed: Vec<String>,
    pub events: Vec<PlannedEvent>,
    /// Look again within this long (the running round's timeout).
    pub requeue: Option<Duration>,
}

/// Everything the step reads.
pub struct Inputs<'a> {
    pub spec: &'a FabricSpec,
    pub validation: &'a str,
    pub generation: i64,
    pub previous: Option<&'a FabricStatus>,
    pub world: &'a World,
    pub clock: &'a RunClock,
}

/// The fabric step of validation `gv`'s run (None when it has no `spec.fabric`), from the
/// status it has so far.
pub fn for_run(
    gv: &gpuval_crds::GpuValidation,
    world: &World,
    status: &gpuval_crds::GpuValidationStatus,
    clock: &RunClock,
    nodes: &mut [NodeStatus],
) -> Option<FabricStep> {
    let spec = gv.spec.fabric.as_ref()?;
    let inp = Inputs {
        spec,
        validation: gv.metadata.name.as_deref().unwrap_or_default(),
        generation: gv.metadata.generation.unwrap_or(0),
        previous: status.fabric.as_ref(),
        world,
        clock,
    };
    Some(advance(&inp, nodes))
}

/// Advances the fabric test of a run whose node lines are `nodes`.
pub fn advance(inp: &Inputs<'_>, nodes: &mut [NodeStatus]) -> FabricStep {
    let mut step = FabricStep::default();
    let rounds = rounds_of(inp.world, inp.generation);
    if let Some(prev) = inp.previous.filter(|p| p.phase.is_terminal()) {
        step.status = Some(prev.clone());
        if !rounds.iter().any(|r| r.end) {
            step.round = Some(end_round(inp, rounds.len()));
        }
        return step;
    }
    if nodes.iter().any(|l| !l.verdict.is_final()) {
        step.status = Some(status(FabricPhase::Waiting, 0, 0, None));
        return step;
    }
    let planned: Vec<&RoundView> = rounds.iter().filter(|r| !r.end).collect();
    let candidates = candidates(&planned, nodes, inp);
    if candidates.len() < 2 {
        let msg = format!(
            "{} node(s) passed their checks with their agent still up: the fabric test needs two",
            candidates.len()
        );
        step.status = Some(status(FabricPhase::Skipped, candidates.len(), 0, Some(msg)));
        step.round = Some(end_round(inp, planned.len()));
        return step;
    }
    if inp.clock.past_deadline() {
        let msg = format!(
            "the deadline passed during fabric round {}; nodes not named",
            planned.len()
        );
        step.status = Some(status(
            FabricPhase::Failed,
            candidates.len(),
            planned.len(),
            Some(msg),
        ));
        step.round = Some(end_round(inp, planned.len()));
        return step;
    }
    let gpus: BTreeMap<String, i32> = nodes.iter().map(|l| (l.name.clone(), l.gpus)).collect();
    decide(inp, &planned, &candidates, &gpus, nodes, &mut step);
    step
}

/// Runs the planner on the history and turns its decision into the step.
fn decide(
    inp: &Inputs<'_>,
    planned: &[&RoundView],
    candidates: &[String],
    gpus: &BTreeMap<String, i32>,
    nodes: &mut [NodeStatus],
    step: &mut FabricStep,
) {
    let outcomes = outcomes(inp.world, inp.generation);
    let gone = gone(inp.world, inp.generation, candidates);
    let expired = planned
        .last()
        .is_some_and(|r| inp.clock.since(r.started) >= r.timeout);
    let streams = fabric_rails::streams(inp.spec);
    let decisions = streams
        .iter()
        .map(|stream| {
            let h = fabric_rails::history(stream, planned, &outcomes);
            let history = History {
                rounds: &h.rounds,
                outcomes: &h.outcomes,
                gone: &gone,
                last_round_expired: !h.last_is_latest || expired,
            };
            (
                stream,
                gpuval_fabric::next(candidates, &stream.settings, &history),
            )
        })
        .collect();
    let n = candidates.len();
    let reports = ports_of(inp.world, inp.generation, candidates);
    match fabric_rails::combine(decisions) {
        Joint::Plan(RailRound { round, rails }) => {
            let number = planned.len() + 1;
            let msg = format!("round {number} ({}) of {n} nodes", round.purpose.as_str());
            step.status = Some(status(FabricPhase::Running, n, number, Some(msg)));
            step.round = Some(round_spec(inp, number, &round, &rails, gpus));
            let note = format!(
                "fabric round {number} ({}): {} group(s)",
                round.purpose.as_str(),
                round.groups.len()
            );
            step.events
                .push(PlannedEvent::new(false, "FabricRound", note));
            step.requeue = Some(inp.spec.round_timeout_or_default().as_std());
        }
        Joint::Wait { awaited } => {
            let number = planned.len();
            let msg = format!("round {number}: waiting for {awaited} member(s)");
            step.status = Some(status(FabricPhase::Running, n, number, Some(msg)));
            step.requeue = planned.last().map(|r| {
                r.timeout.saturating_sub(inp.clock.since(r.started)) + Duration::from_secs(1)
            });
        }
        Joint::Done(mut c) => {
            port_failures(&mut c, &reports);
            step.status = Some(concluded(&c, n, planned.len()));
            apply_verdicts(&c, nodes, step);
            step.round = Some(end_round(inp, planned.len()));
            let reason = if c.passed {
                "FabricPassed"
            } else {
                "FabricFailed"
            };
            step.events
                .push(PlannedEvent::new(!c.passed, reason, truncate(&c.message)));
        }
    }
    if let Some(s) = step.status.as_mut() {
        s.ports = summarize_ports(&reports);
    }
}

/// The ports reports of the fabric's candidates, by node.
fn ports_of<'w>(
    world: &'w World,
    generation: i64,
    candidates: &[String],
) -> Vec<(&'w str, &'w gpuval_crds::fabric_ports::PortsReport)> {
    world
        .results_of(generation)
        .filter(|r| candidates.contains(&r.node))
        .filter_map(|r| Some((r.node.as_str(), r.ports.as_ref()?)))
        .collect()
}

fn summarize_ports(
    reports: &[(&str, &gpuval_crds::fabric_ports::PortsReport)],
) -> Option<gpuval_crds::fabric_ports::FabricPortsStatus> {
    gpuval_crds::fabric_ports::summarize(reports.iter().copied())
}

/// A port that failed on a node is that node's own fault, whatever the rounds found: the node
/// is named with the port (a node the rounds already named keeps their words, the port added).
fn port_failures(c: &mut Conclusion, reports: &[(&str, &gpuval_crds::fabric_ports::PortsReport)]) {
    let mut named = Vec::new();
    for (node, report) in reports {
        let words: Vec<&str> = report.failures().map(|f| f.message.as_str()).collect();
        if words.is_empty() {
            continue;
        }
        let port = format!("port {}", words.join("; port "));
        let why = match c.nodes.get(*node) {
            Some(NodeFabric::Failed(why)) => format!("{why}; {port}"),
            _ => port,
        };
        c.nodes.insert((*node).to_string(), NodeFabric::Failed(why));
        named.push(*node);
    }
    if named.is_empty() {
        return;
    }
    c.passed = false;
    c.message.push_str(&format!(
        "; InfiniBand/RoCE ports failed on {}",
        named.join(", ")
    ));
}

fn status(
    phase: FabricPhase,
    nodes: usize,
    rounds: usize,
    message: Option<String>,
) -> FabricStatus {
    FabricStatus {
        phase,
        nodes: i32::try_from(nodes).unwrap_or(i32::MAX),
        rounds: i32::try_from(rounds).unwrap_or(i32::MAX),
        bus_bandwidth_gbps: None,
        tcp_min_gbps: None,
        failed_nodes: Vec::new(),
        suspects: Vec::new(),
        ports: None,
        message: message.map(|m| truncate(&m)),
    }
}

fn concluded(c: &Conclusion, nodes: usize, rounds: usize) -> FabricStatus {
    let phase = if c.passed {
        FabricPhase::Passed
    } else {
        FabricPhase::Failed
    };
    let mut failed = c.failed();
    failed.truncate(gpuval_crds::fabric::MAX_LISTED_SUSPECTS);
    let mut message = c.message.clone();
    if let Some((node, secs)) = &c.slowest_join {
        message.push_str(&format!("; slowest to join: {node} ({secs:.1}s)"));
    }
    FabricStatus {
        bus_bandwidth_gbps: c.bus_gbps.map(|b| (b * 10.0).round() / 10.0),
        tcp_min_gbps: c.tcp_min_gbps.map(|b| (b * 100.0).round() / 100.0),
        failed_nodes: failed,
        suspects: c.suspects().0,
        ..status(phase, nodes, rounds, Some(message))
    }
}

/// Node lines of the nodes the fabric test failed become Failed on hardware evidence (named),
/// Error on infrastructure (the agent's report lost), or Error on no evidence (a suspect the
/// test could neither clear nor name): a node the fabric did not clear is never counted as
/// passed, and only a named one is blamed.
fn apply_verdicts(c: &Conclusion, nodes: &mut [NodeStatus], step: &mut FabricStep) {
    for line in nodes.iter_mut() {
        let (verdict, evidence, why) = match c.nodes.get(&line.name) {
            Some(NodeFabric::Failed(why)) => (NodeVerdict::Failed, Evidence::Hardware, why.clone()),
            Some(NodeFabric::Suspect(why)) => (
                NodeVerdict::Error,
                Evidence::NoEvidence,
                format!(
                    "{why}; the fabric test could neither clear nor name this node: rerun the validation"
                ),
            ),
            Some(NodeFabric::Error(why)) => (
                NodeVerdict::Error,
                Evidence::Infrastructure,
                format!(
                    "{why}; its fabric report was lost (the agent left or could not write it): rerun the validation"
                ),
            ),
            _ => continue,
        };
        line.verdict = verdict;
        line.evidence = Some(evidence);
        line.message = Some(truncate(&format!("fabric: {why}")));
        step.newly_failed.push(line.name.clone());
        step.events.push(super::events::node_failed(line));
    }
}

/// This generation's rounds, by number, each put together from its parts (a round whose parts
/// are not all there yet is left out: planned again, it is created under the same names).
fn rounds_of(world: &World, generation: i64) -> Vec<RoundView> {
    let mut parts: BTreeMap<(u32, bool), Vec<&RoundView>> = BTreeMap::new();
    for r in world.rounds.iter().filter(|r| r.generation == generation) {
        parts.entry((r.number, r.end)).or_default().push(r);
    }
    parts
        .into_values()
        .filter_map(|mut ps| {
            ps.sort_by_key(|p| p.shard);
            ps.dedup_by_key(|p| p.shard);
            let head = ps.first()?;
            if ps.len() != usize::try_from(head.shards.max(1)).unwrap_or(1) {
                return None;
            }
            let groups = gpuval_crds::fabric_shard::merge_groups(
                i32::try_from(head.number).unwrap_or(i32::MAX),
                ps.iter().map(|p| p.groups.as_slice()),
            );
            match groups {
                Ok(groups) => Some(RoundView {
                    groups,
                    shard: 0,
                    shards: 1,
                    ..(*head).clone()
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "fabric round parts do not fit together");
                    None
                }
            }
        })
        .collect()
}

/// The nodes in the test: round 1's members once it exists (so that the set stays what it was
/// when the test began), before that the nodes that passed with their agent still running.
fn candidates(planned: &[&RoundView], nodes: &[NodeStatus], inp: &Inputs<'_>) -> Vec<String> {
    if let Some(first) = planned.first() {
        let mut seen = BTreeSet::new();
        return first
            .groups
            .iter()
            .flat_map(|g| g.nodes.iter())
            .filter(|n| seen.insert(n.as_str()))
            .cloned()
            .collect();
    }
    let running: BTreeSet<&str> = inp
        .world
        .running_of(inp.generation)
        .filter(|p| p.ip.is_some())
        .map(|p| p.node.as_str())
        .collect();
    let mut c: Vec<String> = nodes
        .iter()
        .filter(|l| l.verdict == NodeVerdict::Passed && running.contains(l.name.as_str()))
        .map(|l| l.name.clone())
        .collect();
    c.sort();
    c
}

fn outcomes(
    world: &World,
    generation: i64,
) -> BTreeMap<String, Vec<gpuval_crds::fabric::FabricOutcome>> {
    world
        .results_of(generation)
        .filter(|r| !r.fabric.is_empty())
        .map(|r| (r.node.clone(), r.fabric.clone()))
        .collect()
}

/// Candidates whose agent is no longer running.
fn gone(world: &World, generation: i64, candidates: &[String]) -> BTreeSet<String> {
    let running: BTreeSet<&str> = world
        .running_of(generation)
        .map(|p| p.node.as_str())
        .collect();
    candidates
        .iter()
        .filter(|n| !running.contains(n.as_str()))
        .cloned()
        .collect()
}

/// The round object for planned round `number`: each group meets at its first member's pod IP,
/// on a port of its own among the groups meeting at that address (`--fabric-port + 2 * k` for
/// the k-th of them, so that groups sharing an address in a test on one host do not collide,
/// and ports stay in range at any node count; the port above is the group's NCCL bootstrap).
fn round_spec(
    inp: &Inputs<'_>,
    number: usize,
    round: &Round,
    rails: &[Option<String>],
    gpus: &BTreeMap<String, i32>,
) -> FabricRoundSpec {
    let ips: BTreeMap<&str, &str> = inp
        .world
        .pods_of(inp.generation)
        .filter_map(|p| Some((p.node.as_str(), p.ip.as_deref()?)))
        .collect();
    let mut at_address: BTreeMap<&str, u32> = BTreeMap::new();
    let groups = round
        .groups
        .iter()
        .enumerate()
        .map(|(id, g)| {
            let host = ips.get(g.nodes[0].as_str()).copied().unwrap_or("0.0.0.0");
            let base = match inp.world.fabric_port {
                0 => RENDEZVOUS_PORT,
                p => p,
            };
            // Counted per address, then kept inside the port range.
            let k = at_address.entry(host).or_default();
            let port = gpuval_crds::fabric::group_port(base, *k as usize);
            *k += 1;
            FabricGroup {
                id: id as i32,
                kind: g.kind,
                nodes: g.nodes.clone(),
                rendezvous: format!("{host}:{port}"),
                gpus: g
                    .nodes
                    .iter()
                    .map(|n| gpus.get(n).copied().unwrap_or(0))
                    .collect(),
                first: 0,
                size: 0,
                rail: rails.get(id).cloned().flatten(),
            }
        })
        .collect();
    FabricRoundSpec {
        groups,
        ..base_round(inp, number, round.purpose.as_str())
    }
}

/// The marker that ends the fabric test: agents leave when they see it.
fn end_round(inp: &Inputs<'_>, planned: usize) -> FabricRoundSpec {
    FabricRoundSpec {
        end: true,
        ..base_round(inp, planned + 1, "end")
    }
}

fn base_round(inp: &Inputs<'_>, number: usize, purpose: &str) -> FabricRoundSpec {
    FabricRoundSpec {
        validation: inp.validation.to_string(),
        generation: inp.generation,
        round: i32::try_from(number).unwrap_or(i32::MAX),
        purpose: purpose.to_string(),
        started: Time(inp.clock.now),
        timeout_seconds: inp.spec.round_timeout_or_default().as_std().as_secs() as i64,
        end: false,
        groups: Vec::new(),
        shard: 0,
        shards: 1,
    }
}

#[cfg(test)]
#[path = "fabric_tests.rs"]
mod tests;
