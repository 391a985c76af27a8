//! The fabric step through [`super::super::next`]: a run whose nodes passed their checks, its
//! rounds created and their outcomes fed back as agents would write them.

use gpuval_crds::fabric::{FabricNccl, FabricOutcome, FabricPhase, FabricSpec};
use gpuval_crds::{Collective, GpuValidation, NodeVerdict, Phase, Verdict};
use gpuval_fabric::model::Fabric;
use k8s_openapi::jiff::Timestamp;

use crate::decide::reconcile::{PodPhase, PodView, ResultView, RoundView, RunNodes, World, next};
use crate::decide::selection::Selection;

const FLOOR: i32 = 350;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_790_000_000 + secs).unwrap()
}

fn validation(generation: i64) -> GpuValidation {
    let mut spec = crate::decide::selection::tests::spec();
    spec.fabric = Some(FabricSpec {
        nccl: Some(FabricNccl {
            collective: Collective::AllReduce,
            bytes: 1 << 30,
            iterations: 20,
            min_bus_bandwidth_gbps: FLOOR,
            expect_transport: None,
            rails: Vec::new(),
        }),
        ..Default::default()
    });
    let mut g = GpuValidation::new("acceptance", spec);
    g.metadata.generation = Some(generation);
    g
}

/// The part size the tests' rounds are cut at.
const PART_BYTES: usize = 200;

/// A cluster of `n` nodes whose agents passed their checks and stay up, and the bandwidth each
/// node's fabric gives.
struct Cluster {
    gv: GpuValidation,
    world: World,
    bw: Fabric,
    /// The fabric of a rail's groups, where it differs from `bw`.
    rail_bw: std::collections::BTreeMap<String, Fabric>,
    record: Option<RunNodes>,
    now: i64,
}

impl Cluster {
    fn new(n: usize, slow: &[usize]) -> Self {
        let names: Vec<String> = (0..n).map(|i| format!("gpu-{i}")).collect();
        let world = World {
            nodes: names.iter().cloned().collect(),
            pods: names
                .iter()
                .enumerate()
                .map(|(i, node)| PodView {
                    name: format!("pod-{node}"),
                    node: node.clone(),
                    generation: 1,
                    phase: PodPhase::Running,
                    ip: Some(format!("10.0.0.{i}")),
                    ..Default::default()
                })
                .collect(),
            results: names
                .iter()
                .map(|node| ResultView::passed(format!("acceptance-{node}"), node, 1))
                .collect(),
            rounds: Vec::new(),
            fabric_port: 0,
            pending_limit: None,
        };
        Cluster {
            gv: validation(1),
            world,
            bw: Fabric::new(&names, slow),
            rail_bw: Default::default(),
            record: None,
            now: 0,
        }
    }

    fn selection(&self) -> Selection {
        Selection::of_nodes(self.world.nodes.iter().cloned(), 8)
    }

    /// One reconcile: the step's status becomes the validation's, its round the cluster's.
    fn step(&mut self) -> crate::decide::reconcile::Step {
        self.now += 1;
        let sel = self.selection();
        let mut s = next(
            &self.gv,
            &self.world,
            at(self.now),
            self.record.take(),
            || sel,
        );
        self.record = s.record.take();
        self.gv.status = Some(s.status.clone());
        if let Some(r) = &s.create_round {
            // As the operator writes them: in parts (small ones here, so every test sees
            // rounds of several objects).
            for part in gpuval_crds::fabric_shard::shard(r, PART_BYTES) {
                self.world.rounds.push(RoundView::from(&part));
            }
        }
        s
    }

    /// Every member of the newest round reports, as agents do.
    fn measure(&mut self) {
        // The newest round, put together from its parts.
        let Some(round) = super::rounds_of(&self.world, 1).into_iter().last() else {
            return;
        };
        for g in &round.groups {
            let bw = g
                .rail
                .as_ref()
                .and_then(|r| self.rail_bw.get(r))
                .unwrap_or(&self.bw);
            for (n, rep) in g.nodes.iter().zip(bw.group(&g.nodes)) {
                let Some((bus_gbps, error, missing)) = rep else {
                    continue;
                };
                let r = self
                    .world
                    .results
                    .iter_mut()
                    .find(|r| &r.node == n)
                    .unwrap();
                r.fabric.push(FabricOutcome {
                    round: round.number as i32,
                    group: g.id,
                    bus_gbps,
                    error,
                    missing,
                    ..Default::default()
                });
            }
        }
    }

    /// Reconciles and measures until the run is over; returns the rounds planned.
    fn run(&mut self) -> usize {
        for _ in 0..20 {
            let s = self.step();
            if s.status.phase.is_some_and(Phase::is_terminal) {
                return super::rounds_of(&self.world, 1)
                    .iter()
                    .filter(|r| !r.end)
                    .count();
            }
            self.measure();
        }
        panic!("no verdict after 20 reconciles");
    }

    fn fabric(&self) -> gpuval_crds::fabric::FabricStatus {
        self.gv.status.as_ref().unwrap().fabric.clone().unwrap()
    }
}

#[test]
fn healthy_nodes_pass_the_fabric_in_one_round_and_agents_are_told_to_leave() {
    let mut c = Cluster::new(4, &[]);
    let first = c.step();
    let round = first.create_round.as_ref().expect("round 1");
    assert_eq!(round.round, 1);
    assert_eq!(round.groups.len(), 1);
    assert_eq!(round.groups[0].rendezvous, "10.0.0.0:29400");
    assert_eq!(
        first.status.phase,
        Some(Phase::Running),
        "not over while the fabric runs"
    );
    assert_eq!(c.fabric().phase, FabricPhase::Running);
    assert_eq!(c.run(), 1);
    let status = c.gv.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Passed));
    assert_eq!(c.fabric().phase, FabricPhase::Passed);
    assert_eq!(c.fabric().bus_bandwidth_gbps, Some(380.0));
    assert!(
        c.world.rounds.last().unwrap().end,
        "the end marker is planned"
    );
}

#[test]
fn the_slow_node_is_named_failed_and_acted_on() {
    let mut c = Cluster::new(8, &[5]);
    let mut newly_failed = Vec::new();
    for _ in 0..20 {
        let s = c.step();
        newly_failed.extend(s.newly_failed.clone());
        if s.status.phase.is_some_and(Phase::is_terminal) {
            break;
        }
        c.measure();
    }
    let status = c.gv.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(newly_failed, vec!["gpu-5".to_string()]);
    assert_eq!(c.fabric().failed_nodes, vec!["gpu-5".to_string()]);
    let line = status.nodes.iter().find(|l| l.name == "gpu-5").unwrap();
    assert_eq!(line.verdict, NodeVerdict::Failed);
    let msg = line.message.as_deref().unwrap();
    assert!(msg.starts_with("fabric: in "), "{msg}");
    assert!(
        msg.contains("NCCL groups (NCCL bus bandwidth 120.0 GB/s below 350); partners gpu-"),
        "{msg}"
    );
    assert!(msg.ends_with("passed elsewhere"), "{msg}");
    assert_eq!(status.summary.unwrap().failed, 1, "no other node is blamed");
}

#[test]
fn an_unlocalized_shortfall_fails_the_validation_without_blaming_a_node() {
    let mut c = Cluster::new(2, &[0, 1]);
    c.run();
    let status = c.gv.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Failed));
    // No node was cleared: none counts as passed (`kubectl get` says `Failed 2 0 2`), and
    // none is blamed on hardware evidence.
    let summary = status.summary.as_ref().unwrap();
    assert_eq!((summary.passed, summary.failed), (0, 2));
    assert!(c.fabric().failed_nodes.is_empty());
    for line in &status.nodes {
        assert_eq!(line.verdict, NodeVerdict::Error, "{line:?}");
        assert_eq!(
            line.evidence,
            Some(gpuval_crds::Evidence::NoEvidence),
            "{line:?}"
        );
        assert!(
            line.message
                .as_deref()
                .unwrap_or_default()
                .contains("could neither clear nor name"),
            "{line:?}"
        );
    }
    assert_eq!(c.fabric().suspects.len(), 2);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "FabricFailed");
    assert!(ready.message.contains("not localized"), "{}", ready.message);
}

#[test]
fn a_member_that_never_reports_times_out_and_the_others_go_on() {
    let mut c = Cluster::new(3, &[]);
    c.step();
    // Everyone but gpu-2 reports; its pod stays Running but silent.
    c.measure();
    for r in &mut c.world.results {
        if r.node == "gpu-2" {
            r.fabric.clear();
        }
    }
    let waiting = c.step();
    assert_eq!(waiting.create_round, None);
    assert!(c.fabric().message.unwrap().contains("waiting for 1"));
    c.now += 301;
    let next = c.step();
    let round = next.create_round.expect("the others re-tested");
    assert_eq!(
        round.groups[0].nodes,
        vec!["gpu-0".to_string(), "gpu-1".to_string()]
    );
    c.measure();
    c.run();
    let status = c.gv.status.clone().unwrap();
    let line = status.nodes.iter().find(|l| l.name == "gpu-2").unwrap();
    assert_eq!(line.verdict, NodeVerdict::Error);
    assert!(
        line.message
            .as_deref()
            .unwrap()
            .contains("no fabric report")
    );
    // A lost report is infrastructure everywhere: not named at fault, so no view or metric
    // that reads `failedNodes` shows the node as failed on its fabric.
    assert_eq!(line.evidence, Some(gpuval_crds::Evidence::Infrastructure));
    assert!(c.fabric().failed_nodes.is_empty(), "{:?}", c.fabric());
    let fin = gpuval_crds::final_line(&c.gv, "gpu-2", None, gpuval_crds::Trust::default())
        .expect("a final line");
    assert_eq!(fin.evidence, gpuval_crds::Evidence::Infrastructure);
    assert!(!fin.failed_on_hardware());
}

#[test]
fn a_node_that_failed_its_checks_is_left_out_and_one_left_skips_the_fabric() {
    let mut c = Cluster::new(2, &[]);
    c.world.results[1].verdict = Verdict::Fail;
    c.world.pods[1].phase = PodPhase::Succeeded;
    let s = c.step();
    assert_eq!(c.fabric().phase, FabricPhase::Skipped);
    assert!(s.create_round.unwrap().end, "agents are told to leave");
    assert_eq!(s.status.phase, Some(Phase::Failed));
}

#[test]
fn a_local_failure_names_that_node_and_not_the_peer_that_saw_it() {
    // As on real H100s: gpu-1 has no interface, and a healthy peer reports the closed
    // connection (typed Peer by its agent).
    let mut c = Cluster::new(4, &[]);
    c.bw.local.insert("gpu-1".into());
    c.run();
    assert_eq!(c.fabric().failed_nodes, vec!["gpu-1".to_string()]);
    let status = c.gv.status.clone().unwrap();
    assert_eq!(status.summary.unwrap().failed, 1);
    let line = status.nodes.iter().find(|l| l.name == "gpu-1").unwrap();
    assert!(
        line.message
            .as_deref()
            .unwrap()
            .contains("no socket interface"),
        "{line:?}"
    );
}

#[test]
fn the_next_round_starts_at_the_first_fatal_report_not_at_the_timeout() {
    let mut c = Cluster::new(4, &[]);
    c.bw.local.insert("gpu-3".into());
    let first = c.step();
    assert!(first.create_round.is_some());
    c.measure();
    // Only gpu-3 (no interface) and the group's host have reported; the others are still
    // stopping.
    for r in &mut c.world.results {
        if r.node != "gpu-3" && r.node != "gpu-0" {
            r.fabric.clear();
        }
    }
    let started = c.now;
    let s = c.step();
    let round = s
        .create_round
        .expect("round 2 planned on the first fatal report");
    assert_eq!(round.round, 2);
    assert!(
        c.now - started < 5,
        "decided within a reconcile, not after the 300 s timeout"
    );
    c.measure();
    c.run();
    assert_eq!(c.fabric().failed_nodes, vec!["gpu-3".to_string()]);
}

#[test]
fn a_round_in_parts_counts_only_once_every_part_is_there() {
    let mut c = Cluster::new(40, &[]);
    let first = c.step();
    let r = first.create_round.expect("round 1");
    let parts = gpuval_crds::fabric_shard::shard(&r, PART_BYTES);
    assert!(parts.len() > 2, "{} parts", parts.len());
    // One part is lost (the operator stopped while creating them): the round is planned again,
    // whole and under the same number, and the names that exist already are kept.
    c.world.rounds.retain(|v| v.shard != 1);
    let again = c.step();
    let r2 = again.create_round.expect("round 1 again");
    assert_eq!((r2.round, r2.groups.len()), (r.round, r.groups.len()));
    c.world.rounds.retain(|v| v.number != 1);
    for part in gpuval_crds::fabric_shard::shard(&r2, PART_BYTES) {
        c.world.rounds.push(RoundView::from(&part));
    }
    c.measure();
    c.run();
    assert_eq!(c.fabric().phase, FabricPhase::Passed, "{:?}", c.fabric());
}

/// A ports report as an agent writes it: one InfiniBand port per node, `down` ones failing.
fn ports(
    device: &str,
    down: bool,
    symbol_errors_rose: bool,
) -> gpuval_crds::fabric_ports::PortsReport {
    use gpuval_crds::fabric_ports::{PortFinding, PortReading, PortSeverity, PortsReport};
    let mut findings = Vec::new();
    if down {
        findings.push(PortFinding {
            severity: PortSeverity::Fail,
            device: device.into(),
            port: 1,
            message: format!("{device}/1 (InfiniBand): state DOWN (not ACTIVE)"),
        });
    }
    if symbol_errors_rose {
        findings.push(PortFinding {
            severity: PortSeverity::Warn,
            device: device.into(),
            port: 1,
            message: format!(
                "{device}/1 (InfiniBand): symbol_error rose by 4 during the fabric rounds"
            ),
        });
    }
    PortsReport {
        ports: vec![PortReading {
            device: device.into(),
            port: 1,
            state: if down { "DOWN" } else { "ACTIVE" }.into(),
            phys_state: if down { "Disabled" } else { "LinkUp" }.into(),
            rate_gbps: Some(400.0),
            link_layer: "InfiniBand".into(),
            counters: Default::default(),
        }],
        findings,
    }
}

#[test]
fn a_node_whose_port_failed_is_named_with_the_port_though_its_rounds_passed() {
    let mut c = Cluster::new(4, &[]);
    for r in &mut c.world.results {
        let n: usize = r.node.trim_start_matches("gpu-").parse().unwrap();
        r.ports = Some(ports("mlx5_1", n == 2, n == 1));
    }
    c.run();
    let status = c.gv.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Failed));
    let fabric = c.fabric();
    assert_eq!(fabric.phase, FabricPhase::Failed);
    assert_eq!(fabric.failed_nodes, vec!["gpu-2".to_string()]);
    let line = status.nodes.iter().find(|l| l.name == "gpu-2").unwrap();
    assert_eq!(line.verdict, NodeVerdict::Failed);
    assert_eq!(
        line.message.as_deref(),
        Some("fabric: port mlx5_1/1 (InfiniBand): state DOWN (not ACTIVE)")
    );
    // Rising error counters warn: the node is listed, not failed.
    let p = fabric.ports.expect("the ports line");
    assert_eq!((p.nodes, p.ports, p.infiniband, p.roce), (4, 4, 4, 0));
    assert_eq!(
        p.failing,
        ["gpu-2: mlx5_1/1 (InfiniBand): state DOWN (not ACTIVE)"]
    );
    assert_eq!(p.warning_count, 1);
    assert!(
        p.warnings[0].starts_with("gpu-1: mlx5_1/1"),
        "{:?}",
        p.warnings
    );
    assert_eq!(p.min_rate_gbps, Some(400.0));
    assert_eq!(status.summary.unwrap().failed, 1, "no other node is blamed");
    assert!(fabric.message.unwrap().contains("ports failed on gpu-2"));
}

#[test]
fn nodes_without_rdma_ports_have_no_ports_line_and_healthy_ports_pass() {
    let mut c = Cluster::new(3, &[]);
    c.run();
    assert_eq!(c.fabric().phase, FabricPhase::Passed);
    assert!(c.fabric().ports.is_none());
    let mut c = Cluster::new(3, &[]);
    for r in &mut c.world.results {
        r.ports = Some(ports("mlx5_0", false, false));
    }
    c.run();
    assert_eq!(c.fabric().phase, FabricPhase::Passed);
    let p = c.fabric().ports.unwrap();
    assert_eq!((p.nodes, p.failing_count, p.warning_count), (3, 0, 0));
}

/// A cluster tested rail by rail, with `slow` nodes slow on `rail` alone.
fn railed(n: usize, rails: &[&str], rail: &str, slow: &[usize]) -> Cluster {
    let mut c = Cluster::new(n, &[]);
    let names: Vec<String> = (0..n).map(|i| format!("gpu-{i}")).collect();
    c.rail_bw
        .insert(rail.to_string(), Fabric::new(&names, slow));
    if let Some(nccl) = c.gv.spec.fabric.as_mut().and_then(|f| f.nccl.as_mut()) {
        nccl.rails = rails.iter().map(|r| r.to_string()).collect();
    }
    c
}

#[test]
fn rails_are_screened_at_once_each_group_on_its_own_hca() {
    let mut c = railed(4, &["mlx5_0", "mlx5_1"], "mlx5_1", &[]);
    let first = c.step();
    let round = first.create_round.expect("round 1");
    let rails: Vec<Option<&str>> = round.groups.iter().map(|g| g.rail.as_deref()).collect();
    assert_eq!(rails, [Some("mlx5_0"), Some("mlx5_1")]);
    assert!(round.groups.iter().all(|g| g.nodes.len() == 4));
    // The two groups meet at the same host on ports of their own.
    assert_ne!(round.groups[0].rendezvous, round.groups[1].rendezvous);
    c.measure();
    c.run();
    assert_eq!(c.fabric().phase, FabricPhase::Passed);
    assert_eq!(c.fabric().rounds, 1);
}

#[test]
fn a_node_slow_on_one_rail_is_named_with_that_rail_and_no_other_node_is() {
    let mut c = railed(8, &["mlx5_0", "mlx5_1", "mlx5_2"], "mlx5_2", &[5]);
    let mut planned_rails = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let s = c.step();
        if let Some(r) = &s.create_round {
            planned_rails.extend(r.groups.iter().filter_map(|g| g.rail.clone()));
        }
        if s.status.phase.is_some_and(Phase::is_terminal) {
            break;
        }
        c.measure();
    }
    let status = c.gv.status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(c.fabric().failed_nodes, vec!["gpu-5".to_string()]);
    let line = status.nodes.iter().find(|l| l.name == "gpu-5").unwrap();
    let msg = line.message.as_deref().unwrap();
    assert!(msg.starts_with("fabric: rail mlx5_2: in "), "{msg}");
    assert_eq!(status.summary.unwrap().failed, 1, "no other node is blamed");
    // Localizing rounds ran on the bad rail; the others were done after screening.
    assert!(planned_rails.contains("mlx5_2"));
    let later: Vec<_> = c
        .world
        .rounds
        .iter()
        .filter(|r| r.number > 1 && !r.end)
        .flat_map(|r| r.groups.iter().map(|g| g.rail.clone()))
        .collect();
    assert!(!later.is_empty());
    assert!(
        later.iter().all(|r| r.as_deref() == Some("mlx5_2")),
        "{later:?}"
    );
    let message = c.fabric().message.unwrap();
    assert!(
        message.starts_with("rail mlx5_2: 1 node(s) at fault after 3 round(s): gpu-5"),
        "{message}"
    );
    assert!(message.contains("passed: mlx5_0, mlx5_1"), "{message}");
}
