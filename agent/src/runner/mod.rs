//! The shared runner: inventory, the telemetry and topology sampler, the checks' measuring
//! pass in the registry's order, the judging pass, the relative rules and the GPU and node
//! verdicts, into one [`NodeReport`].

pub mod aggregate;
mod sampler;
#[cfg(test)]
pub(crate) mod sim_tests;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use gpuval_crds::{GpuReport, NodeReport, Verdict};

use crate::backend::{Backend, BackendKind, GpuInfo, Inventory};
use crate::check::Stage;
use crate::checks::{Measured, Planned};
use crate::judge::Judge;
use crate::run_control::ProgressSink;
use crate::{report, telemetry};

pub use crate::checks::Plan;
use sampler::{Sampled, Sampler};

/// Runs the plan's checks on the backend's GPUs and judges them. Never fails: what could not
/// run is an Error in the report, with the reason.
pub fn run(
    backend: &Backend,
    plan: &Plan,
    stop: &AtomicBool,
    sink: ProgressSink<'_>,
) -> NodeReport {
    let simulated = backend.kind() == BackendKind::Simulated;
    let mut report = report::started(backend.kind(), plan.node.clone());
    let planned = Planned::new(plan, simulated);
    let inventory = match backend.platform().inventory() {
        Ok(inv) => inv,
        Err(e) => {
            let stage = Stage {
                backend,
                gpus: &[],
                stop,
                sink,
            };
            report.io = planned.io_only(&stage);
            return report::could_not_run(report, format!("inventory: {e}"));
        }
    };
    let gpus = selected(inventory, plan, &mut report);
    sink(&format!(
        "{} GPU(s): {}{}",
        gpus.len(),
        gpus.first().map(|g| g.name.as_str()).unwrap_or("none"),
        if simulated {
            " [SIMULATED BACKEND]"
        } else {
            ""
        }
    ));
    let stage = Stage {
        backend,
        gpus: &gpus,
        stop,
        sink,
    };
    let (measured, sampled) = measure(&planned, &stage, plan);
    let judge = Judge {
        checks: &plan.checks,
        thresholds: plan.thresholds.clone(),
    };
    report.gpus = gpus.iter().map(skeleton).collect();
    add_telemetry(&stage, &sampled, &mut report.gpus, measured.counters_before);
    let mut m = measured.checks;
    if let Some(Ok(t)) = m.topology.as_mut() {
        t.resamples = sampled.topology_samples;
        t.link_changes = sampled.link_changes;
    }
    planned.judge(&judge, &gpus, m, &mut report);
    judge.node(&mut report);
    if stop.load(Ordering::Relaxed) {
        report.verdict = Verdict::Error;
        report
            .failures
            .insert(0, "the run was stopped before it finished".into());
    }
    report.finished_at = report::now_rfc3339();
    report
}

/// The inventoried GPUs the plan selects; the report gets the system facts.
fn selected(inventory: Inventory, plan: &Plan, report: &mut NodeReport) -> Vec<GpuInfo> {
    report.system = Some(inventory.system);
    inventory
        .gpus
        .into_iter()
        .filter(|g| plan.gpus.as_ref().is_none_or(|sel| sel.contains(&g.index)))
        .collect()
}

/// What the measuring pass gathered besides the checks' own outcomes.
struct MeasuredRun {
    checks: Measured,
    counters_before: Vec<Option<crate::backend::ErrorCounters>>,
}

/// The measuring pass: the first topology reading, error counters, then every check in the
/// registry's order with the sampler running beside them.
fn measure(planned: &Planned, stage: &Stage<'_>, plan: &Plan) -> (MeasuredRun, Sampled) {
    let platform = stage.backend.platform();
    let mut checks = Measured::default();
    checks.topology = planned.first_topology(stage);
    let counters_before = stage
        .gpus
        .iter()
        .map(|g| platform.error_counters(g.index).ok())
        .collect();
    let sampled = Mutex::new(Sampled::default());
    let sampler_stop = AtomicBool::new(false);
    let started = Instant::now();
    let first = checks
        .topology
        .as_ref()
        .and_then(|r| r.as_ref().ok())
        .map(|t| t.snapshot.clone());
    std::thread::scope(|s| {
        let sampler = Sampler {
            platform,
            gpus: stage.gpus,
            every: plan.sample_every,
            resample_every: planned.resample_every(),
            first_topology: first.as_ref(),
        };
        let (sampled, sampler_stop) = (&sampled, &sampler_stop);
        s.spawn(move || sampler.run(sampled, sampler_stop, started));
        planned.measure(stage, &mut checks);
        sampler_stop.store(true, Ordering::Relaxed);
    });
    let sampled = sampled.into_inner().unwrap_or_else(|p| p.into_inner());
    (
        MeasuredRun {
            checks,
            counters_before,
        },
        sampled,
    )
}

/// A GPU's report before any check is judged into it.
fn skeleton(g: &GpuInfo) -> GpuReport {
    GpuReport {
        index: i32::try_from(g.index).unwrap_or(i32::MAX),
        uuid: g.uuid.clone(),
        name: g.name.clone(),
        pci_bus_id: Some(g.pci_bus_id.clone()),
        memory_total_mib: i64::try_from(g.memory_total_bytes >> 20).unwrap_or(i64::MAX),
        health: Some(g.health.clone()),
        ..Default::default()
    }
}

/// Each GPU's telemetry summary: samples, Xids and the ECC counters before and after.
fn add_telemetry(
    stage: &Stage<'_>,
    sampled: &Sampled,
    reports: &mut [GpuReport],
    before: Vec<Option<crate::backend::ErrorCounters>>,
) {
    let platform = stage.backend.platform();
    for ((g, r), before) in stage.gpus.iter().zip(reports.iter_mut()).zip(before) {
        let samples = sampled
            .samples
            .get(&g.index)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let xids = sampled.xids.get(&g.index).map(Vec::as_slice).unwrap_or(&[]);
        let after = platform.error_counters(g.index).ok();
        r.telemetry = Some(telemetry::summarize(samples, before, after, xids));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{SimBackend, SimSpec};
    use gpuval_crds::{Checks, ComputeCheck, IoCheck, MemoryCheck, Thresholds};

    fn io_plan(dir: &std::path::Path, compute: bool, during_compute: bool) -> Plan {
        let checks = Checks {
            memory: Some(MemoryCheck::default()),
            compute: compute.then(|| ComputeCheck {
                duration: "1s".parse().expect("a duration"),
                ..Default::default()
            }),
            io: Some(IoCheck {
                file_size_mib: 2,
                files: 2,
                concurrency: 2,
                during_compute,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut plan = Plan::new(checks, Thresholds::default());
        plan.io_dir = Some(dir.to_path_buf());
        plan
    }

    fn run_sim(plan: &Plan) -> (NodeReport, Vec<String>) {
        let spec: SimSpec = "gpus=2,timescale=0.2".parse().expect("a sim spec");
        let lines = Mutex::new(Vec::new());
        let sink = |l: &str| lines.lock().expect("lines").push(l.to_string());
        let backend = Backend::Simulated(SimBackend::new(spec));
        let report = run(&backend, plan, &AtomicBool::new(false), &sink);
        (report, lines.into_inner().expect("lines"))
    }

    #[test]
    fn io_runs_beside_the_burn_when_asked() {
        let d = tempfile::tempdir().expect("a temp dir");
        let (report, lines) = run_sim(&io_plan(d.path(), true, true));
        let io = report.io.expect("an io result");
        assert_eq!(io.verdict, Verdict::Pass, "{:?}", io.reasons);
        assert!(io.during_compute);
        assert_eq!(io.notes[0], "ran while the compute burn ran");
        assert!(
            io.notes[1].contains("only the GPU figures"),
            "{:?}",
            io.notes
        );
        let at = |prefix: &str| lines.iter().position(|l| l.starts_with(prefix));
        let io_start = at("[io] starting").expect("io started");
        let burn_end = at("[compute] finished").expect("burn finished");
        assert!(io_start < burn_end, "{lines:?}");
        assert!(lines[io_start].ends_with(", beside the compute burn"));
        assert_eq!(report.verdict, Verdict::Pass, "{:?}", report.failures);
        assert_eq!(std::fs::read_dir(d.path()).expect("dir").count(), 0);
    }

    #[test]
    fn io_runs_alone_after_the_gpu_checks_otherwise() {
        let d = tempfile::tempdir().expect("a temp dir");
        // duringCompute without a compute check: alone, and said so
        let (report, lines) = run_sim(&io_plan(d.path(), false, true));
        let io = report.io.expect("an io result");
        assert!(!io.during_compute);
        assert!(
            io.notes[0].contains("no compute check ran"),
            "{:?}",
            io.notes
        );
        let at = |prefix: &str| {
            lines
                .iter()
                .position(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix:?} in {lines:?}"))
        };
        assert!(at("[memory] finished") < at("[io] starting"), "{lines:?}");
    }

    #[test]
    fn an_io_error_leaves_the_gpu_checks_alone() {
        let d = tempfile::tempdir().expect("a temp dir");
        let mut plan = io_plan(&d.path().join("missing"), true, true);
        plan.checks.memory = Some(MemoryCheck::default());
        let (report, _) = run_sim(&plan);
        let io = report.io.expect("an io result");
        assert_eq!(io.verdict, Verdict::Error);
        assert!(report.gpus.iter().all(|g| g.verdict == Verdict::Pass));
        assert_eq!(report.verdict, Verdict::Error);
        assert_eq!(report.failures, io.reasons);
    }
}
