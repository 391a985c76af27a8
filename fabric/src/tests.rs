//! The planner driven to its end against a model fabric: each node has a bandwidth, a group
//! measures its slowest member, and the tests check who is named and in how many rounds.

use std::collections::{BTreeMap, BTreeSet};

use gpuval_crds::fabric::{FabricErrorKind, FabricKind, FabricOutcome};

use crate::model::{Bandwidths, GOOD_GBPS};
use crate::{Decision, History, NodeFabric, Purpose, Round, Settings, next};

const FLOOR: f64 = 350.0;

fn settings() -> Settings {
    Settings {
        nccl_min_bus_gbps: Some(FLOOR),
        tcp: false,
        tcp_min_gbps: None,
        tcp_max_latency_micros: None,
        localize: true,
        max_rounds: 8,
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i:04}")).collect()
}

/// A model cluster: per-node bandwidth, nodes that fail on their own, nodes whose agents left.
#[derive(Default)]
struct Model {
    bw: Bandwidths,
    local_fault: BTreeSet<String>,
    gone: BTreeSet<String>,
}

impl Model {
    fn new(nodes: &[String], slow: &[usize]) -> Self {
        Model {
            bw: Bandwidths::new(nodes, slow),
            ..Model::default()
        }
    }

    /// Every member's outcome of one round, as agents would report them.
    fn measure(&self, number: u32, round: &Round, out: &mut BTreeMap<String, Vec<FabricOutcome>>) {
        for (id, g) in round.groups.iter().enumerate() {
            let broken = g
                .nodes
                .iter()
                .any(|n| self.local_fault.contains(n) || self.gone.contains(n));
            let bus = self.bw.group(&g.nodes);
            for n in &g.nodes {
                if self.gone.contains(n) {
                    continue;
                }
                let mut o = FabricOutcome {
                    round: number as i32,
                    group: id as i32,
                    ..Default::default()
                };
                if self.local_fault.contains(n) {
                    o.error = Some(gpuval_crds::fabric::FabricError {
                        kind: FabricErrorKind::Local,
                        message: "NCCL could not start: no socket interface".into(),
                    });
                } else if broken {
                    o.error = Some(gpuval_crds::fabric::FabricError {
                        kind: FabricErrorKind::Peer,
                        message: "a member left".into(),
                    });
                } else {
                    o.bus_gbps = Some(bus);
                }
                out.entry(n.clone()).or_default().push(o);
            }
        }
    }
}

/// Runs the planner to its conclusion; returns it with the rounds used.
fn drive(nodes: &[String], model: &Model, s: &Settings) -> (crate::Conclusion, Vec<Round>) {
    let mut rounds: Vec<Round> = Vec::new();
    let mut outcomes = BTreeMap::new();
    for _ in 0..20 {
        let h = History {
            rounds: &rounds,
            outcomes: &outcomes,
            gone: &model.gone,
            last_round_expired: false,
        };
        match next(nodes, s, &h) {
            Decision::Plan(r) => {
                model.measure(rounds.len() as u32 + 1, &r, &mut outcomes);
                rounds.push(r);
            }
            Decision::Wait { awaited } => panic!("waiting for {awaited} with every outcome in"),
            Decision::Done(c) => return (c, rounds),
        }
    }
    panic!("no conclusion after 20 rounds");
}

fn failed_names(c: &crate::Conclusion) -> Vec<String> {
    c.failed()
}

#[test]
fn a_healthy_cluster_passes_in_one_round() {
    let nodes = names(8);
    let (c, rounds) = drive(&nodes, &Model::new(&nodes, &[]), &settings());
    assert!(c.passed, "{c:?}");
    assert_eq!(rounds.len(), 1);
    assert_eq!(rounds[0].purpose, Purpose::Screen);
    assert_eq!(c.bus_gbps, Some(GOOD_GBPS));
    assert!(c.message.contains("8 nodes passed"), "{}", c.message);
}

#[test]
fn one_slow_node_among_eight_is_named_and_no_other() {
    let nodes = names(8);
    let (c, rounds) = drive(&nodes, &Model::new(&nodes, &[5]), &settings());
    assert!(!c.passed);
    assert_eq!(failed_names(&c), vec![nodes[5].clone()]);
    assert_eq!(rounds.len(), 3, "screen, pairs, confirm");
    let NodeFabric::Failed(why) = &c.nodes[&nodes[5]] else {
        panic!("{:?}", c.nodes[&nodes[5]]);
    };
    assert!(why.contains("120.0 GB/s below 350"), "{why}");
    assert!(why.contains("passed elsewhere"), "{why}");
    // Its pair partner in round 2 fell short with it but passed beside a good node.
    assert_eq!(c.nodes[&nodes[4]], NodeFabric::Passed);
    assert_eq!(c.suspects().0, Vec::<String>::new());
}

#[test]
fn two_bad_nodes_among_sixteen_even_when_paired_together() {
    let nodes = names(16);
    for bad in [[3, 11], [6, 7]] {
        let (c, rounds) = drive(&nodes, &Model::new(&nodes, &bad), &settings());
        let want: Vec<String> = bad.iter().map(|i| nodes[*i].clone()).collect();
        assert_eq!(failed_names(&c), want, "bad {bad:?}");
        assert!(rounds.len() <= 3, "{} rounds", rounds.len());
    }
}

#[test]
fn a_thousand_nodes_with_two_bad_ones_are_named_within_six_rounds() {
    let nodes = names(1000);
    let (c, rounds) = drive(&nodes, &Model::new(&nodes, &[17, 640]), &settings());
    assert_eq!(
        failed_names(&c),
        vec![nodes[17].clone(), nodes[640].clone()]
    );
    assert!(rounds.len() <= 6, "{} rounds", rounds.len());
    // Round 2 pairs everybody; round 3 confirms only the suspects.
    assert_eq!(rounds[1].groups.len(), 500);
    assert_eq!(rounds[2].groups.len(), 4);
}

#[test]
fn two_nodes_below_the_floor_are_suspects_not_blamed() {
    let nodes = names(2);
    let (c, rounds) = drive(&nodes, &Model::new(&nodes, &[0, 1]), &settings());
    assert!(!c.passed);
    assert!(failed_names(&c).is_empty(), "nobody is proven at fault");
    assert_eq!(c.suspects().0, nodes);
    assert_eq!(rounds.len(), 1, "nothing to pair them with");
    assert!(c.message.contains("not localized"), "{}", c.message);
}

#[test]
fn a_node_failing_on_its_own_is_named_and_the_rest_retested() {
    let nodes = names(6);
    let mut m = Model::new(&nodes, &[]);
    m.local_fault.insert(nodes[2].clone());
    let (c, _) = drive(&nodes, &m, &settings());
    assert_eq!(failed_names(&c), vec![nodes[2].clone()]);
    let NodeFabric::Failed(why) = &c.nodes[&nodes[2]] else {
        panic!()
    };
    assert!(why.contains("no socket interface"), "{why}");
    for (i, n) in nodes.iter().enumerate().filter(|(i, _)| *i != 2) {
        assert_eq!(
            c.nodes[n],
            NodeFabric::Passed,
            "node {i} re-tested and passed"
        );
    }
}

#[test]
fn a_vanished_agent_is_that_nodes_error_and_the_test_goes_on() {
    let nodes = names(4);
    let mut m = Model::new(&nodes, &[]);
    m.gone.insert(nodes[1].clone());
    let (c, _) = drive(&nodes, &m, &settings());
    assert_eq!(
        c.nodes[&nodes[1]],
        NodeFabric::Error("its agent left during fabric round 1".into())
    );
    for n in [&nodes[0], &nodes[2], &nodes[3]] {
        assert_eq!(c.nodes[n], NodeFabric::Passed);
    }
}

#[test]
fn without_localizing_one_round_decides_and_names_nobody() {
    let nodes = names(8);
    let s = Settings {
        localize: false,
        ..settings()
    };
    let (c, rounds) = drive(&nodes, &Model::new(&nodes, &[5]), &s);
    assert_eq!(rounds.len(), 1);
    assert!(!c.passed);
    assert!(failed_names(&c).is_empty());
    assert_eq!(c.suspects().0.len(), 8);
}

#[test]
fn the_planner_waits_for_reports_then_times_members_out() {
    let nodes = names(3);
    let s = settings();
    let rounds = vec![Round {
        purpose: Purpose::Screen,
        groups: vec![crate::Group {
            kind: FabricKind::Nccl,
            nodes: nodes.clone(),
        }],
    }];
    let mut outcomes = BTreeMap::new();
    Model::new(&nodes, &[]).measure(1, &rounds[0], &mut outcomes);
    outcomes.remove(&nodes[2]);
    let gone = BTreeSet::new();
    let mut h = History {
        rounds: &rounds,
        outcomes: &outcomes,
        gone: &gone,
        last_round_expired: false,
    };
    assert_eq!(next(&nodes, &s, &h), Decision::Wait { awaited: 1 });
    h.last_round_expired = true;
    let Decision::Plan(r) = next(&nodes, &s, &h) else {
        panic!("the others are re-tested");
    };
    assert_eq!(r.groups.len(), 1);
    assert_eq!(r.groups[0].nodes, vec![nodes[0].clone(), nodes[1].clone()]);
}

#[test]
fn tcp_pairs_cover_every_node_and_name_the_slow_one() {
    let nodes = names(5);
    let s = Settings {
        nccl_min_bus_gbps: None,
        tcp: true,
        tcp_min_gbps: Some(10.0),
        ..settings()
    };
    let mut rounds: Vec<Round> = Vec::new();
    let mut outcomes: BTreeMap<String, Vec<FabricOutcome>> = BTreeMap::new();
    let gone = BTreeSet::new();
    let slow = &nodes[3];
    for _ in 0..6 {
        let h = History {
            rounds: &rounds,
            outcomes: &outcomes,
            gone: &gone,
            last_round_expired: false,
        };
        match next(&nodes, &s, &h) {
            Decision::Plan(r) => {
                let number = rounds.len() as i32 + 1;
                for (id, g) in r.groups.iter().enumerate() {
                    let rate = if g.nodes.contains(slow) { 2.5 } else { 40.0 };
                    for n in &g.nodes {
                        outcomes.entry(n.clone()).or_default().push(FabricOutcome {
                            round: number,
                            group: id as i32,
                            send_gbps: Some(rate),
                            recv_gbps: Some(rate),
                            latency_micros: Some(30.0),
                            ..Default::default()
                        });
                    }
                }
                if rounds.is_empty() {
                    let covered: BTreeSet<&String> =
                        r.groups.iter().flat_map(|g| &g.nodes).collect();
                    assert_eq!(covered.len(), 5, "every node in a pair");
                }
                rounds.push(r);
            }
            Decision::Wait { .. } => panic!("all reported"),
            Decision::Done(c) => {
                assert_eq!(c.failed(), vec![slow.clone()]);
                assert_eq!(c.tcp_min_gbps, Some(40.0));
                return;
            }
        }
    }
    panic!("no conclusion");
}
