//! The planner against random faults: slow nodes, nodes whose NCCL cannot start (half the time
//! with a healthy peer typing it as its own), members that never join, agents that vanish, bad
//! links and bad switch uplinks, on 4 to 1,000 nodes and thousands of seeds, half of them with
//! every member's words replaced. No healthy node may ever
//! be named, every fault must fail the test, the same faults in other words conclude the same,
//! and the rounds used are recorded.

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::fabric::FabricOutcome;

use crate::model::{Between, Fabric};
use crate::{Conclusion, Decision, History, Round, Settings, next};

/// splitmix64: a small deterministic generator (no dependency, same sequence everywhere).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn settings() -> Settings {
    Settings {
        nccl_min_bus_gbps: Some(350.0),
        tcp: false,
        tcp_min_gbps: None,
        tcp_max_latency_micros: None,
        localize: true,
        max_rounds: 12,
    }
}

/// A random fault set: each node is used by at most one fault (a node with two bad links is
/// indistinguishable, pair by pair, from a bad node).
fn plant(nodes: &[String], rng: &mut Rng) -> Fabric {
    let n = nodes.len();
    let mut m = Fabric::new(nodes, &[]);
    // Stalls come from a stream of their own, so the fault sets of the other kinds stay those
    // the test has always drawn.
    let mut stalls = Rng(rng.0 ^ 0x57a1_1ed0_0000_0001);
    m.reword = rng.chance(50);
    m.mislabel = rng.chance(50);
    let mut used = BTreeSet::new();
    let faults = rng.below(4.min(n / 2) + 1);
    for _ in 0..faults {
        let i = rng.below(n);
        if !used.insert(i) {
            continue;
        }
        let node = nodes[i].clone();
        match rng.below(6) {
            0 => {
                m.bw = crate::model::Bandwidths::new(nodes, &slow_of(&m, nodes, i));
            }
            1 => {
                m.local.insert(node);
            }
            2 => {
                m.never_join.insert(node);
            }
            3 => {
                m.gone.insert(node);
            }
            4 => {
                let j = rng.below(n);
                if used.insert(j) {
                    m.between.push(Between::Link {
                        a: node,
                        b: nodes[j].clone(),
                        fails: rng.chance(50),
                    });
                }
            }
            _ if m.between.iter().any(|b| matches!(b, Between::Trunk(_))) => {}
            _ => {
                // A contiguous block behind one switch (one per fault set) (2..n-2 nodes), not overlapping others.
                let len = 2 + rng.below((n - 3).max(1));
                let start = rng.below(n - len.min(n - 2) + 1).min(n - len);
                let block: Vec<usize> = (start..start + len).collect();
                if block.iter().all(|b| !used.contains(b)) && len <= n - 2 {
                    used.extend(block.iter().copied());
                    m.between.push(Between::Trunk(
                        block.iter().map(|b| nodes[*b].clone()).collect(),
                    ));
                }
            }
        }
    }
    if stalls.chance(25) {
        let i = stalls.below(n);
        if used.insert(i) {
            m.stall.insert(nodes[i].clone());
        }
    }
    m
}

/// The indices of the slow nodes so far, and `i`.
fn slow_of(m: &Fabric, nodes: &[String], i: usize) -> Vec<usize> {
    let slow = m.faulty();
    nodes
        .iter()
        .enumerate()
        .filter(|(j, n)| {
            *j == i
                || (slow.contains(*n)
                    && !m.local.contains(*n)
                    && !m.never_join.contains(*n)
                    && !m.stall.contains(*n)
                    && !m.gone.contains(*n))
        })
        .map(|(j, _)| j)
        .collect()
}

fn drive(nodes: &[String], m: &Fabric, s: &Settings) -> (Conclusion, usize) {
    let mut rounds: Vec<Round> = Vec::new();
    let mut outcomes: BTreeMap<String, Vec<FabricOutcome>> = BTreeMap::new();
    loop {
        let h = History {
            rounds: &rounds,
            outcomes: &outcomes,
            gone: &m.gone,
            last_round_expired: false,
        };
        match next(nodes, s, &h) {
            Decision::Plan(r) => {
                let number = rounds.len() as i32 + 1;
                for (id, g) in r.groups.iter().enumerate() {
                    for (n, rep) in g.nodes.iter().zip(m.group(&g.nodes)) {
                        let Some((bus_gbps, error, missing)) = rep else {
                            continue;
                        };
                        outcomes.entry(n.clone()).or_default().push(FabricOutcome {
                            round: number,
                            group: id as i32,
                            bus_gbps,
                            error,
                            missing,
                            ..Default::default()
                        });
                    }
                }
                rounds.push(r);
                assert!(
                    rounds.len() <= s.max_rounds as usize,
                    "over the round limit"
                );
            }
            Decision::Wait { awaited } => panic!("waiting for {awaited} with every report in"),
            Decision::Done(c) => return (c, rounds.len()),
        }
    }
}

/// A healthy node that every other healthy node fails beside (its only companions are
/// faulty, the rest sit across a bad switch): no test can tell it from a faulty node.
fn cut_off(m: &Fabric, nodes: &[String], node: &String) -> bool {
    let faulty = m.faulty();
    nodes
        .iter()
        .filter(|n| *n != node && !faulty.contains(*n))
        .all(|n| {
            m.between
                .iter()
                .any(|b| b.crossed_by(&[node.clone(), n.clone()]))
        })
}

/// Runs `seeds` random fault sets on `lo..=hi` nodes; returns the rounds used, by count.
fn run(lo: usize, hi: usize, seeds: u64) -> BTreeMap<usize, usize> {
    let mut used = BTreeMap::new();
    for seed in 0..seeds {
        let mut rng = Rng(seed ^ ((lo as u64) << 40));
        let n = lo + rng.below(hi - lo + 1);
        let nodes: Vec<String> = (0..n).map(|i| format!("n{i:04}")).collect();
        let m = plant(&nodes, &mut rng);
        let (c, rounds) = drive(&nodes, &m, &settings());
        let faulty = m.faulty();
        for named in c.failed() {
            assert!(
                faulty.contains(&named) || cut_off(&m, &nodes, &named),
                "seed {seed}, {n} nodes: healthy {named} named ({}); planted {:?} {:?} local {:?} \
                 never {:?} gone {:?}",
                c.message,
                faulty,
                m.between,
                m.local,
                m.never_join,
                m.gone
            );
        }
        let planted = !faulty.is_empty() || !m.between.is_empty();
        assert_eq!(c.passed, !planted, "seed {seed}, {n} nodes: {}", c.message);
        if seed % 4 == 0 {
            // The planner reads kinds, never words: the same faults in other words conclude
            // the same.
            let reworded = Fabric {
                reword: !m.reword,
                ..m.clone()
            };
            let (other, _) = drive(&nodes, &reworded, &settings());
            assert_eq!(
                (other.passed, other.failed(), other.suspects()),
                (c.passed, c.failed(), c.suspects()),
                "seed {seed}, {n} nodes: reworded: {} / {}",
                other.message,
                c.message
            );
        }
        *used.entry(rounds).or_default() += 1;
    }
    used
}

#[test]
fn no_healthy_node_is_ever_named_on_4_to_32_nodes() {
    let used = run(4, 32, 3000);
    eprintln!("rounds used (rounds: runs) on 4..32 nodes: {used:?}");
}

#[test]
fn no_healthy_node_is_ever_named_on_33_to_200_nodes() {
    let used = run(33, 200, 300);
    eprintln!("rounds used (rounds: runs) on 33..200 nodes: {used:?}");
}

#[test]
fn no_healthy_node_is_ever_named_on_201_to_1000_nodes() {
    let used = run(201, 1000, 30);
    eprintln!("rounds used (rounds: runs) on 201..1000 nodes: {used:?}");
}
