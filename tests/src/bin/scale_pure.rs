//! Pure scale benchmark of the operator's reconcile steps (not a test; no API server): one
//! validation over N simulated nodes, driven through the reconcile steps as the controller
//! drives them (each step's status and record fed back). The run starts and every agent runs
//! (steps that see everything); then results arrive as news ([`next_on_news`]: the nodes that
//! changed), one a reconcile early, half way and late in the run, and 100 a reconcile; the
//! last result concludes the run (the final aggregation). Also timed: a step that sees
//! everything half way (the controller's periodic look at everything) and one that recovers
//! the run with no record (a restarted operator). Reported per size: CPU time of each (the
//! thread's CPU clock; the steps do no I/O), how much of the final step freeing the record
//! takes, the status size, the record's bytes per node, and
//! whether a news step before the last asked for everything (it must not; the last one reads
//! every pod and result by design, for the fleet's versions and the fabric test, and its time
//! includes building that view).
//!
//!   cargo build --release -p gpuval-tests --bin scale_pure
//!   target/release/scale_pure --nodes 1000,10000,50000 --out bench/results/scale-pure.json
//!
//! Two nodes in a hundred fail (with a summary like a real one), so the status lists failures
//! and counts reasons.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::time::Duration;

use gpuval_crds::{Action, GpuValidation, GpuValidationSpec, Phase, Verdict};
use gpuval_operator::decide::reconcile::{
    News, PodPhase, PodView, ResultFacts, ResultView, RunNodes, Step, World, next, next_on_news,
};
use gpuval_operator::decide::selection::Selection;
use gpuval_tests::bench::{Args, Column, Error, ms, node_name, print_header, print_row, start};
use k8s_openapi::jiff::Timestamp;

/// Single-result reconciles timed at each point (the median is reported).
const SAMPLES: usize = 200;
/// Results one reconcile brings in the batched measurement (results that arrive while a
/// reconcile runs or within the controller's debounce are handled by one reconcile).
const BATCH: usize = 100;
/// Steps of [`BATCH`] results timed.
const BATCHES: usize = 3;

/// Node `i`'s result: two in a hundred fail with a summary like a real report's.
fn result(i: usize) -> ResultView {
    let node = node_name(i);
    let (verdict, summary, facts) = if i % 50 == 7 {
        let gpu = i % 8;
        (
            Verdict::Fail,
            format!(
                "GPU{gpu} memory: 12 mismatched words at 0x7f3a00000000; GPU{gpu} compute: \
                 1.9 TFLOP/s below the 0.9 × expected floor"
            ),
            ResultFacts {
                codes: "MemoryMismatch,ComputeSlow".to_string(),
                action: Action::ReplaceHardware,
                versions: Default::default(),
                simulated: true,
            },
        )
    } else {
        (Verdict::Pass, String::new(), ResultFacts::default())
    };
    ResultView {
        name: format!("bench-{node}"),
        node,
        generation: 1,
        verdict,
        summary,
        fabric: Vec::new(),
        ports: None,
        facts,
    }
}

/// Node `i`'s agent pod, running.
fn pod(i: usize) -> PodView {
    let node = node_name(i);
    PodView {
        name: format!("gpuval-bench-{node}"),
        node,
        generation: 1,
        phase: PodPhase::Running,
        ..Default::default()
    }
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Drives one validation: each step's status and record fed back, as the controller does.
struct Driver {
    gv: GpuValidation,
    record: Option<RunNodes>,
    selection: Selection,
    start: Timestamp,
    /// The cluster as a whole (every pod and result so far).
    world: World,
    /// News steps that asked for everything.
    asked_for_everything: Cell<usize>,
}

impl Driver {
    fn at(&self, secs: u64) -> Timestamp {
        self.start + Duration::from_secs(secs)
    }

    /// A step that sees everything (`keep_record`: false for a restarted operator).
    fn everything(&mut self, secs: u64, keep_record: bool) -> (Step, Duration) {
        let record = self.record.take().filter(|_| keep_record);
        let selection = &self.selection;
        let t = thread_cpu();
        let step = next(&self.gv, &self.world, self.at(secs), record, || {
            selection.clone()
        });
        let took = thread_cpu().saturating_sub(t);
        (self.keep(step), took)
    }

    /// Results of `nodes` arrive; one step takes them in as news.
    fn results(&mut self, nodes: std::ops::Range<usize>, secs: u64) -> (Step, Duration) {
        let results: Vec<ResultView> = nodes.clone().map(result).collect();
        self.world.results.extend(results.iter().cloned());
        let news = News {
            nodes: nodes.clone().map(node_name).collect::<BTreeSet<_>>(),
            world: World {
                nodes: nodes.clone().map(node_name).collect(),
                pods: nodes.map(pod).collect(),
                results,
                ..Default::default()
            },
        };
        let record = self.record.take();
        let (selection, world, asked) = (&self.selection, &self.world, &self.asked_for_everything);
        let t = thread_cpu();
        let step = next_on_news(
            &self.gv,
            &news,
            self.start + Duration::from_secs(secs),
            record,
            || {
                asked.set(asked.get() + 1);
                world.clone()
            },
            || selection.clone(),
        );
        let took = thread_cpu().saturating_sub(t);
        (self.keep(step), took)
    }

    fn keep(&mut self, mut step: Step) -> Step {
        self.record = step.record.take();
        self.gv.status = Some(step.status.clone());
        step
    }

    /// Times `samples` news steps that each bring `batch` more results from `*next`; returns
    /// the median CPU time per result.
    fn per_result(&mut self, next: &mut usize, batch: usize, samples: usize) -> Duration {
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let (_, took) = self.results(*next..*next + batch, 30);
            *next += batch;
            times.push(took / u32::try_from(batch).unwrap_or(u32::MAX));
        }
        median(times)
    }

    /// Brings the results of `from..to` in steps of 1,000 (not timed).
    fn fill(&mut self, from: usize, to: usize) {
        let mut i = from;
        while i < to {
            let end = (i + 1_000).min(to);
            self.results(i..end, 30);
            i = end;
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The validation and its driver over `n` nodes, before the first step.
fn driver(n: usize) -> Result<Driver, Error> {
    let spec: GpuValidationSpec = serde_json::from_value(serde_json::json!({
        "checks": {"memory": {}}
    }))?;
    let mut gv = GpuValidation::new("bench", spec);
    gv.metadata.generation = Some(1);
    Ok(Driver {
        gv,
        record: None,
        selection: Selection::of_nodes((0..n).map(node_name), 8),
        start: start()?,
        world: World {
            nodes: (0..n).map(node_name).collect(),
            ..Default::default()
        },
        asked_for_everything: Cell::new(0),
    })
}

/// Runs one validation over `n` nodes and reports its figures as JSON.
fn bench(n: usize) -> Result<serde_json::Value, Error> {
    let least = 2 * (SAMPLES + BATCHES * BATCH);
    if n < least {
        return Err(Error::Usage(format!("{n} nodes: use at least {least}")));
    }
    let mut d = driver(n)?;
    let (first, t_first) = d.everything(0, true);
    let running_status_bytes = serde_json::to_vec(&first.status)?.len();
    d.world.pods = (0..n).map(pod).collect();
    let (_, t_running) = d.everything(5, true);
    let record_bytes = d.record.as_ref().map_or(0, RunNodes::approx_bytes);

    let mut next = 0;
    let t_early = d.per_result(&mut next, 1, SAMPLES);
    let t_batched = d.per_result(&mut next, BATCH, BATCHES);
    d.fill(next, n / 2);
    next = n / 2;
    let t_half = d.per_result(&mut next, 1, SAMPLES);
    let (_, t_resync) = d.everything(30, true);
    let (_, t_recover) = d.everything(30, false);
    d.fill(next, n - 1 - SAMPLES);
    next = n - 1 - SAMPLES;
    let t_late = d.per_result(&mut next, 1, SAMPLES);
    // The final step frees the run's record; how long that alone takes.
    let copy = d.record.clone();
    let t = thread_cpu();
    drop(copy);
    let t_free = thread_cpu().saturating_sub(t);
    let asked_before_final = d.asked_for_everything.get();
    let (last, t_final) = d.results(n - 1..n, 41);
    // The step that gives the last node its verdict reads every pod and result, by design
    // (the fleet's versions and the fabric test need them all).
    let final_read_everything = d.asked_for_everything.get() > asked_before_final;

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
        "one_result_early_ms": ms(t_early),
        "one_result_half_way_ms": ms(t_half),
        "one_result_late_ms": ms(t_late),
        "per_result_in_batches_of_100_ms": ms(t_batched),
        "final_aggregation_ms": ms(t_final),
        "freeing_the_record_ms": ms(t_free),
        "everything_half_way_ms": ms(t_resync),
        "recovery_half_way_ms": ms(t_recover),
        "news_steps_that_asked_for_everything": asked_before_final,
        "final_step_read_everything": final_read_everything,
        "status_bytes_running": running_status_bytes,
        "status_bytes_final": serde_json::to_vec(&last.status)?.len(),
        "listed_nodes": last.status.nodes.len(),
        "nodes_not_listed": last.status.nodes_not_listed,
        "passed": sum.passed,
        "failed": sum.failed,
        "top_reason": sum.reasons.first().map(|r| format!("{} ({})", r.reason, r.count)),
        "record_bytes_per_node": (record_bytes as f64 / n as f64).round(),
    }))
}

/// Peak resident memory of this process, MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// The printed table's columns.
const COLUMNS: &[Column] = &[
    ("nodes", "nodes", ""),
    ("first_step_ms", "first step", " ms"),
    ("all_running_step_ms", "all running", " ms"),
    ("one_result_early_ms", "1 result (early)", " ms"),
    ("one_result_half_way_ms", "1 result (half way)", " ms"),
    ("one_result_late_ms", "1 result (late)", " ms"),
    (
        "per_result_in_batches_of_100_ms",
        "per result, 100 a step",
        " ms",
    ),
    ("final_aggregation_ms", "final aggregation", " ms"),
    (
        "freeing_the_record_ms",
        "of which freeing the record",
        " ms",
    ),
    ("everything_half_way_ms", "everything (half way)", " ms"),
    ("recovery_half_way_ms", "recovery (half way)", " ms"),
    ("status_bytes_final", "status (final)", " B"),
    ("record_bytes_per_node", "record/node", " B"),
];

fn run() -> Result<(), Error> {
    let a = Args::from_env(&[1_000, 10_000, 50_000])?;
    let mut rows = Vec::new();
    print_header(COLUMNS);
    for &n in &a.sizes {
        let r = bench(n)?;
        print_row(COLUMNS, &r);
        if r["news_steps_that_asked_for_everything"] != 0 {
            return Err(Error::Run(format!(
                "{n} nodes: a news step asked for everything: {}",
                r["news_steps_that_asked_for_everything"]
            )));
        }
        rows.push(r);
    }
    println!("peak RSS of this process: {:.1} MiB", peak_rss_mib());
    a.write(&serde_json::json!({
        "sizes": rows,
        "peak_rss_mib": (peak_rss_mib() * 10.0).round() / 10.0,
    }))
}

fn main() {
    gpuval_tests::bench::main("scale_pure", run);
}
