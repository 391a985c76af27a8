//! Pure scale benchmark of the operator's reconcile steps (not a test; no API server): one
//! validation over N simulated nodes, driven through `reconcile::next` as the controller drives
//! it (each step's status and record fed back). Measures, per size: the first step (node set
//! resolved, N pods to create), a reconcile that brings one result early in the run and one
//! half way through, the final aggregation (the last result arrives and the run concludes),
//! the status size, and the bytes the operator's run record holds per node.
//!
//!   cargo build --release -p gpuval-tests --bin scale_pure
//!   target/release/scale_pure --nodes 1000,10000,50000 --out bench/results/scale-pure.json
//!
//! Two nodes in a hundred fail (with a summary like a real one), so the status lists failures
//! and counts reasons. Times are wall-clock on one thread (the steps do no I/O, so CPU time).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpuval_crds::{GpuValidation, GpuValidationSpec, NodeStatus, Phase, Verdict};
use gpuval_operator::reconcile::{PodPhase, PodView, ResultView, RunNodes, Step, World, next};
use gpuval_operator::selection::{SelectedNode, Selection};
use k8s_openapi::jiff::Timestamp;

/// Single-result reconciles timed at each point (the median is reported).
const SAMPLES: usize = 50;
/// Results one reconcile brings in the batched measurement (results that arrive while a
/// reconcile runs or within the controller's debounce are handled by one reconcile).
const BATCH: usize = 100;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0}")]
    Usage(String),
    #[error("building the validation: {0}")]
    Spec(#[from] serde_json::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Run(String),
}

struct Args {
    sizes: Vec<usize>,
    out: Option<PathBuf>,
}

fn args() -> Result<Args, Error> {
    let mut a = Args {
        sizes: vec![1_000, 10_000, 50_000],
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it
            .next()
            .ok_or_else(|| Error::Usage(format!("{flag} needs a value")))?;
        match flag.as_str() {
            "--nodes" => {
                a.sizes = v
                    .split(',')
                    .map(|s| s.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| Error::Usage(format!("--nodes: {e}")))?;
            }
            "--out" => a.out = Some(PathBuf::from(v)),
            other => return Err(Error::Usage(format!("unknown flag {other}"))),
        }
    }
    Ok(a)
}

fn node_name(i: usize) -> String {
    format!("gpu-node-{i:05}")
}

/// Node `i`'s result: two in a hundred fail with a summary like a real report's.
fn result(i: usize) -> ResultView {
    let node = node_name(i);
    let (verdict, summary) = if i % 50 == 7 {
        let gpu = i % 8;
        (
            Verdict::Fail,
            format!(
                "GPU{gpu} memory: 12 mismatched words at 0x7f3a00000000; GPU{gpu} compute: \
                 1.9 TFLOP/s below the 0.9 × expected floor"
            ),
        )
    } else {
        (Verdict::Pass, String::new())
    };
    ResultView {
        name: format!("bench-{node}"),
        node,
        generation: 1,
        verdict,
        summary,
        fabric: Vec::new(),
        facts: Default::default(),
    }
}

/// One reconcile: the step from the current validation and world, fed back as the controller
/// does; returns the step and how long `next` took.
struct Driver {
    gv: GpuValidation,
    record: Option<RunNodes>,
    selection: Selection,
    start: Timestamp,
}

impl Driver {
    fn step(&mut self, world: &World, secs: i64) -> (Step, Duration) {
        let now = self.start + std::time::Duration::from_secs(secs.unsigned_abs());
        let record = self.record.take();
        let selection = &self.selection;
        let t = Instant::now();
        let mut step = next(&self.gv, world, now, record, || selection.clone());
        let took = t.elapsed();
        self.record = step.record.take();
        self.gv.status = Some(step.status.clone());
        (step, took)
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Bytes the run record holds per node: the line and its strings' heap.
fn record_bytes_per_node(record: Option<&RunNodes>) -> f64 {
    let Some(r) = record else { return 0.0 };
    let heap = |s: &Option<String>| s.as_ref().map_or(0, String::capacity);
    let total: usize = r
        .lines()
        .iter()
        .map(|n: &NodeStatus| {
            std::mem::size_of::<NodeStatus>()
                + n.name.capacity()
                + heap(&n.message)
                + heap(&n.result)
        })
        .sum();
    total as f64 / r.lines().len().max(1) as f64
}

/// Times `samples` reconciles that each bring `batch` more results; returns the median time
/// per result.
fn results_in_batches(
    d: &mut Driver,
    world: &mut World,
    next_result: &mut usize,
    batch: usize,
    samples: usize,
) -> Duration {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        world
            .results
            .extend((*next_result..*next_result + batch).map(result));
        *next_result += batch;
        times.push(d.step(world, 30).1 / u32::try_from(batch).unwrap_or(u32::MAX));
    }
    median(times)
}

/// Runs one validation over `n` nodes and reports its figures as JSON.
fn bench(n: usize) -> Result<serde_json::Value, Error> {
    if n < 1_000 {
        return Err(Error::Usage(format!("{n} nodes: use at least 1000")));
    }
    let spec: GpuValidationSpec = serde_json::from_value(serde_json::json!({
        "checks": {"memory": {}}
    }))?;
    let mut gv = GpuValidation::new("bench", spec);
    gv.metadata.generation = Some(1);
    let selection = Selection {
        selected: (0..n)
            .map(|i| SelectedNode {
                name: node_name(i),
                gpus: 8,
            })
            .collect(),
        ..Default::default()
    };
    let mut world = World {
        nodes: (0..n).map(node_name).collect(),
        ..Default::default()
    };
    let mut d = Driver {
        gv,
        record: None,
        selection,
        start: Timestamp::from_second(1_790_000_000).map_err(|e| Error::Run(e.to_string()))?,
    };
    let (first, t_first) = d.step(&world, 0);
    let running_status_bytes = serde_json::to_vec(&first.status)?.len();
    world.pods = first
        .create_pods
        .iter()
        .map(|(node, _)| PodView {
            name: format!("gpuval-bench-{node}"),
            node: node.clone(),
            generation: 1,
            phase: PodPhase::Running,
            ..Default::default()
        })
        .collect();
    let (_, t_running) = d.step(&world, 5);
    let record_bytes = record_bytes_per_node(d.record.as_ref());

    let mut next_result = 0;
    let t_early = results_in_batches(&mut d, &mut world, &mut next_result, 1, SAMPLES);
    world.results.extend((next_result..n / 4).map(result));
    next_result = n / 4;
    let t_batched = results_in_batches(&mut d, &mut world, &mut next_result, BATCH, 5);
    world.results.extend((next_result..n / 2).map(result));
    next_result = n / 2;
    d.step(&world, 30);
    let t_half = results_in_batches(&mut d, &mut world, &mut next_result, 1, SAMPLES);
    world.results.extend((next_result..n - 1).map(result));
    d.step(&world, 40);
    world.results.push(result(n - 1));
    let (last, t_final) = d.step(&world, 41);

    if last.status.phase != Some(Phase::Failed) {
        return Err(Error::Run(format!(
            "{n} nodes: expected Failed (2% fail), got {:?}",
            last.status.phase
        )));
    }
    let sum = last.status.summary.clone().unwrap_or_default();
    Ok(serde_json::json!({
        "nodes": n,
        "first_step_ms": ms(t_first),
        "all_running_step_ms": ms(t_running),
        "one_result_reconcile_early_ms": ms(t_early),
        "one_result_reconcile_half_way_ms": ms(t_half),
        "per_result_in_batches_of_100_ms": ms(t_batched),
        "final_aggregation_ms": ms(t_final),
        "status_bytes_running": running_status_bytes,
        "status_bytes_final": serde_json::to_vec(&last.status)?.len(),
        "listed_nodes": last.status.nodes.len(),
        "nodes_not_listed": last.status.nodes_not_listed,
        "passed": sum.passed,
        "failed": sum.failed,
        "top_reason": sum.reasons.first().map(|r| format!("{} ({})", r.reason, r.count)),
        "record_bytes_per_node": record_bytes.round(),
    }))
}

/// Milliseconds to the microsecond.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1000.0
}

fn run() -> Result<(), Error> {
    let a = args()?;
    let mut rows = Vec::new();
    println!(
        "| nodes | first step | all running | reconcile, 1 result (early) | reconcile, 1 result (half way) | per result, 100 a reconcile | final aggregation | status (final) | record/node |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for n in a.sizes {
        let r = bench(n)?;
        println!(
            "| {} | {} ms | {} ms | {} ms | {} ms | {} ms | {} ms | {} B | {} B |",
            r["nodes"],
            r["first_step_ms"],
            r["all_running_step_ms"],
            r["one_result_reconcile_early_ms"],
            r["one_result_reconcile_half_way_ms"],
            r["per_result_in_batches_of_100_ms"],
            r["final_aggregation_ms"],
            r["status_bytes_final"],
            r["record_bytes_per_node"],
        );
        rows.push(r);
    }
    if let Some(path) = a.out {
        let body = serde_json::to_string_pretty(&rows)?;
        std::fs::write(&path, body).map_err(|source| Error::Write { path, source })?;
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("scale_pure: {e}");
        std::process::exit(1);
    }
}
