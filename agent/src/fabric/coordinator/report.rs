//! Rank 0's report of a bare-metal fabric test: JSON (`--output`) and the table it prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuval_crds::fabric::{FabricKind, FabricOutcome, FabricSpec};
use gpuval_fabric::{Conclusion, Round};
use serde::Serialize;

use super::{Options, verdict_words};

/// The whole test.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub passed: bool,
    /// The NCCL figures are simulated (tests and demos only); TCP figures are always real.
    pub simulated: bool,
    pub message: String,
    /// Bus bandwidth of the screening round's all-node group, GB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus_gbps: Option<f64>,
    /// The lowest throughput of a TCP pair that passed, Gb/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_min_gbps: Option<f64>,
    pub nodes: Vec<NodeLine>,
    pub rounds: Vec<RoundLine>,
    pub settings: FabricSpec,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLine {
    pub node: String,
    pub rank: usize,
    /// Its address as rank 0 saw it.
    pub address: String,
    /// Passed, Failed, Error, Suspect or Untested.
    pub verdict: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoundLine {
    pub round: i32,
    pub purpose: String,
    pub groups: Vec<GroupLine>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupLine {
    pub id: i32,
    pub kind: FabricKind,
    pub nodes: Vec<String>,
    /// Each member's outcome, by node (absent: it never reported).
    pub outcomes: BTreeMap<String, FabricOutcome>,
}

impl Report {
    /// `nodes`: (name, address) in rank order.
    pub fn new(
        opts: &Options,
        nodes: &[(String, String)],
        rounds: &[Round],
        outcomes: &BTreeMap<String, Vec<FabricOutcome>>,
        c: &Conclusion,
    ) -> Self {
        let node_lines = nodes
            .iter()
            .enumerate()
            .map(|(rank, (node, address))| {
                let (verdict, reason) = c.nodes.get(node).map_or(("Untested", None), verdict_words);
                NodeLine {
                    node: node.clone(),
                    rank,
                    address: address.clone(),
                    verdict: verdict.into(),
                    reason,
                }
            })
            .collect();
        let round_lines = rounds
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let number = i as i32 + 1;
                let groups = r
                    .groups
                    .iter()
                    .enumerate()
                    .map(|(id, g)| GroupLine {
                        id: id as i32,
                        kind: g.kind,
                        nodes: g.nodes.clone(),
                        outcomes: g
                            .nodes
                            .iter()
                            .filter_map(|n| {
                                let o = outcomes
                                    .get(n)?
                                    .iter()
                                    .find(|o| o.round == number && o.group == id as i32)?;
                                Some((n.clone(), o.clone()))
                            })
                            .collect(),
                    })
                    .collect();
                RoundLine {
                    round: number,
                    purpose: r.purpose.as_str().into(),
                    groups,
                }
            })
            .collect();
        Self {
            passed: c.passed,
            simulated: opts.simulated,
            message: c.message.clone(),
            bus_gbps: c.bus_gbps,
            tcp_min_gbps: c.tcp_min_gbps,
            nodes: node_lines,
            rounds: round_lines,
            settings: opts.spec.clone(),
        }
    }
}

/// The figures of one group, in words: the slowest member's, and any errors.
fn figures(g: &GroupLine) -> String {
    let all = || g.outcomes.values();
    let min = |f: fn(&FabricOutcome) -> Option<f64>| {
        all()
            .filter_map(f)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))))
    };
    let mut parts = Vec::new();
    match g.kind {
        FabricKind::Nccl => {
            if let Some(b) = min(|o| o.bus_gbps) {
                parts.push(format!("bus {b:.1} GB/s"));
            }
        }
        FabricKind::Tcp => {
            if let Some(s) = min(|o| o.send_gbps.zip(o.recv_gbps).map(|(s, r)| s.min(r))) {
                parts.push(format!("{s:.2} Gb/s each way"));
            }
            let rtt = all()
                .filter_map(|o| o.latency_micros)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            if let Some(l) = rtt {
                parts.push(format!("rtt {l:.0} us"));
            }
        }
    }
    let silent = g.nodes.len() - g.outcomes.len();
    if silent > 0 {
        parts.push(format!("{silent} member(s) never reported"));
    }
    for (n, o) in &g.outcomes {
        if let Some(e) = &o.error {
            parts.push(format!("{n}: {:?} {}", e.kind, e.message));
        }
    }
    parts.join("; ")
}

/// The table rank 0 prints.
pub fn table(r: &Report) -> String {
    let mut out = String::new();
    let verdict = if r.passed { "PASSED" } else { "FAILED" };
    let _ = writeln!(
        out,
        "fabric test {verdict}: {} nodes, {} round(s){}",
        r.nodes.len(),
        r.rounds.len(),
        if r.simulated {
            " (simulated backend: the NCCL figures are not real)"
        } else {
            ""
        }
    );
    let row = |out: &mut String, c: [&str; 6]| {
        let _ = writeln!(
            out,
            "{:<5} {:<8} {:<5} {:<5} {:<32} {}",
            c[0], c[1], c[2], c[3], c[4], c[5]
        );
    };
    row(
        &mut out,
        ["ROUND", "PURPOSE", "GROUP", "KIND", "NODES", "FIGURES"],
    );
    for round in &r.rounds {
        for g in &round.groups {
            let cells = [
                round.round.to_string(),
                round.purpose.clone(),
                g.id.to_string(),
                g.kind.as_str().to_string(),
                g.nodes.join(","),
                figures(g),
            ];
            row(&mut out, cells.each_ref().map(String::as_str));
        }
    }
    let _ = writeln!(out, "{:<24} {:<8} WHY", "NODE", "VERDICT");
    for n in &r.nodes {
        let _ = writeln!(
            out,
            "{:<24} {:<8} {}",
            n.node,
            n.verdict,
            n.reason.as_deref().unwrap_or("")
        );
    }
    let _ = writeln!(out, "{}", r.message);
    out
}
