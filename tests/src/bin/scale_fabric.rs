//! Pure scale benchmark of the fabric test's orchestration (not a test; no API server): one
//! validation whose N nodes all passed their checks, driven through `reconcile::next` as the
//! controller drives it; each planned round is answered at once by every member (a model
//! fabric: two nodes give 120 GB/s against a 350 GB/s floor, the others 380, and TCP pairs
//! 40 Gb/s), so what is measured is the operator's own work: rounds used, the time of each
//! reconcile that plans a round or concludes, and the largest objects it writes (a round
//! object, the validation status) or reads (one node's outcomes annotation).
//!
//!   cargo build --release -p gpuval-tests --bin scale_fabric
//!   target/release/scale_fabric --nodes 1000,2000,10000 --out bench/results/scale-fabric.json

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricOutcome, FabricPhase, FabricRoundSpec};
use gpuval_crds::{GpuValidation, GpuValidationSpec, NodeVerdict, Phase};
use gpuval_operator::decide::reconcile::{
    PodPhase, PodView, ResultView, RoundView, RunNodes, Step, World, next,
};
use gpuval_operator::decide::selection::Selection;
use gpuval_tests::bench::{Args, Column, Error, ms, node_name, print_header, print_row, start};
use k8s_openapi::jiff::Timestamp;

/// The model fabric: which nodes are slow.
fn slow(n: usize) -> [usize; 2] {
    [n / 7, n - n / 3]
}

struct Driver {
    gv: GpuValidation,
    world: World,
    record: Option<RunNodes>,
    selection: Selection,
    start: Timestamp,
    secs: i64,
    bw: Vec<f64>,
    largest_round: usize,
    /// The most objects one round was written as.
    most_parts: usize,
}

impl Driver {
    fn step(&mut self) -> (Step, Duration) {
        self.secs += 1;
        let now = self.start + k8s_openapi::jiff::SignedDuration::from_secs(self.secs);
        let sel = self.selection.clone();
        let t = Instant::now();
        let mut s = next(&self.gv, &self.world, now, self.record.take(), move || sel);
        let took = t.elapsed();
        self.record = s.record.take();
        self.gv.status = Some(s.status.clone());
        (s, took)
    }

    /// Adds the round to the cluster and every member's outcome to its result.
    fn answer(&mut self, r: &FabricRoundSpec) -> Result<(), Error> {
        // As the operator writes it: in parts of at most 64 KiB.
        let parts = gpuval_crds::fabric_shard::shard(r, gpuval_crds::fabric_shard::MAX_PART_BYTES);
        self.most_parts = self.most_parts.max(parts.len());
        for part in &parts {
            let object = gpuval_operator::decide::pod::fabric_round(&self.gv, part);
            self.largest_round = self.largest_round.max(serde_json::to_vec(&object)?.len());
            self.world.rounds.push(RoundView::from(part));
        }
        let index: BTreeMap<&str, usize> = self
            .world
            .results
            .iter()
            .enumerate()
            .map(|(i, res)| (res.node.as_str(), i))
            .collect();
        let mut add: Vec<(usize, FabricOutcome)> = Vec::new();
        for g in &r.groups {
            let idx: Vec<usize> = g
                .nodes
                .iter()
                .map(|n| index.get(n.as_str()).copied())
                .collect::<Option<_>>()
                .ok_or_else(|| Error::Run("a member without a result".into()))?;
            let bus = idx
                .iter()
                .map(|i| self.bw[*i])
                .fold(f64::INFINITY, f64::min);
            let tcp = if bus < 350.0 { 2.0 } else { 40.0 };
            for i in idx {
                let mut o = FabricOutcome {
                    round: r.round,
                    group: g.id,
                    ..Default::default()
                };
                match g.kind {
                    gpuval_crds::fabric::FabricKind::Nccl => o.bus_gbps = Some(bus),
                    gpuval_crds::fabric::FabricKind::Tcp => {
                        (o.send_gbps, o.recv_gbps, o.latency_micros) =
                            (Some(tcp), Some(tcp), Some(25.0));
                    }
                }
                add.push((i, o));
            }
        }
        for (i, o) in add {
            self.world.results[i].fabric.push(o);
        }
        Ok(())
    }
}

fn driver(n: usize) -> Result<Driver, Error> {
    let spec: GpuValidationSpec = serde_json::from_value(serde_json::json!({
        "checks": {"memory": {}},
        "fabric": {"nccl": {"minBusBandwidthGbps": 350}, "tcp": {"minGbps": 10}}
    }))?;
    let mut gv = GpuValidation::new("bench", spec);
    gv.metadata.generation = Some(1);
    let names: Vec<String> = (0..n).map(node_name).collect();
    let bad = slow(n);
    Ok(Driver {
        gv,
        world: World {
            nodes: names.iter().cloned().collect(),
            pods: names
                .iter()
                .enumerate()
                .map(|(i, node)| PodView {
                    name: format!("gpuval-bench-{node}"),
                    node: node.clone(),
                    generation: 1,
                    phase: PodPhase::Running,
                    ip: Some(format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)),
                    ..Default::default()
                })
                .collect(),
            results: names
                .iter()
                .map(|node| ResultView::passed(format!("bench-{node}"), node, 1))
                .collect(),
            rounds: Vec::new(),
            fabric_port: 0,
            pending_limit: None,
        },
        record: None,
        selection: Selection::of_nodes(names.iter().cloned(), 8),
        start: start()?,
        secs: 0,
        bw: (0..n)
            .map(|i| if bad.contains(&i) { 120.0 } else { 380.0 })
            .collect(),
        largest_round: 0,
        most_parts: 0,
    })
}

/// Runs the fabric test over `n` nodes to its verdict and reports its figures.
fn bench(n: usize) -> Result<serde_json::Value, Error> {
    let mut d = driver(n)?;
    let mut plan_ms = Vec::new();
    let mut total = Duration::ZERO;
    let mut last = None;
    for _ in 0..40 {
        let (s, took) = d.step();
        total += took;
        if let Some(r) = s.create_round.clone() {
            if !r.end {
                plan_ms.push(ms(took));
            }
            d.answer(&r)?;
        }
        if s.status.phase.is_some_and(Phase::is_terminal) {
            last = Some((s, took));
            break;
        }
    }
    let (last, t_final) = last.ok_or_else(|| Error::Run(format!("{n}: no verdict")))?;
    let fabric = last
        .status
        .fabric
        .clone()
        .ok_or_else(|| Error::Run("no fabric status".into()))?;
    let want: Vec<String> = slow(n).iter().map(|i| node_name(*i)).collect();
    if fabric.phase != FabricPhase::Failed || fabric.failed_nodes != want {
        return Err(Error::Run(format!(
            "{n} nodes: expected {want:?} named, got {:?} ({:?})",
            fabric.failed_nodes, fabric.message
        )));
    }
    let blamed = last
        .status
        .nodes
        .iter()
        .filter(|l| l.verdict == NodeVerdict::Failed)
        .count();
    let annotation = d
        .world
        .results
        .iter()
        .map(|r| serde_json::to_vec(&r.fabric).map(|v| v.len()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    Ok(serde_json::json!({
        "nodes": n,
        "rounds": fabric.rounds,
        "named": fabric.failed_nodes,
        "nodes_failed_in_status": blamed,
        "plan_reconcile_ms": plan_ms,
        "final_reconcile_ms": ms(t_final),
        "operator_cpu_ms_all_fabric_reconciles": ms(total),
        "largest_round_object_bytes": d.largest_round,
        "most_objects_in_a_round": d.most_parts,
        "status_bytes_final": serde_json::to_vec(&last.status)?.len(),
        "largest_outcomes_annotation_bytes": annotation,
    }))
}

/// The printed table's columns.
const COLUMNS: &[Column] = &[
    ("nodes", "nodes", ""),
    ("rounds", "rounds", ""),
    ("named", "named", ""),
    ("plan_reconcile_ms", "reconcile per planned round", " ms"),
    ("final_reconcile_ms", "final reconcile", " ms"),
    (
        "operator_cpu_ms_all_fabric_reconciles",
        "all fabric reconciles",
        " ms",
    ),
    ("largest_round_object_bytes", "largest round object", " B"),
    ("most_objects_in_a_round", "objects in a round (most)", ""),
    ("status_bytes_final", "status", " B"),
    (
        "largest_outcomes_annotation_bytes",
        "largest outcomes annotation",
        " B",
    ),
];

fn run() -> Result<(), Error> {
    let a = Args::from_env(&[1_000, 2_000, 10_000])?;
    let mut rows = Vec::new();
    print_header(COLUMNS);
    for &n in &a.sizes {
        let r = bench(n)?;
        print_row(COLUMNS, &r);
        rows.push(r);
    }
    a.write(&rows)
}

fn main() {
    gpuval_tests::bench::main("scale_fabric", run);
}
