//! The shared runner: inventory, the node's facts (a wrong GPU count fails the node before
//! anything long runs), the telemetry and topology sampler, the checks' measuring pass in the
//! rows' order, the judging pass with the relative rules, a second measurement of the
//! performance figures that fell short, and the GPU and node verdicts, into one [`NodeReport`].

pub mod aggregate;
pub mod busy;
pub mod facts;
#[cfg(test)]
mod health_tests;
pub mod processes;
mod sampler;
#[cfg(test)]
pub(crate) mod sim_tests;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use gpuval_crds::reason::Overrides;
use gpuval_crds::{GpuReport, NodeReport, Verdict};

use crate::backend::{Backend, BackendKind, GpuInfo, Inventory};
use crate::check::{JudgeNode, Stage};
use crate::checks::Planned;
use crate::judge::{Code, Judge, Says, error_reason_in};
use crate::run_control::ProgressSink;
use crate::{report, telemetry};

pub use crate::checks::Plan;
use busy::BusyLog;
use processes::{Owner, Phase, Sightings};
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
    let mut planned = Planned::new(plan, simulated);
    let judge = Judge {
        checks: &plan.checks,
        thresholds: plan.thresholds.clone(),
        overrides: Overrides::new(&plan.overrides),
    };
    let inventory = match backend.platform().inventory() {
        Ok(inv) => inv,
        Err(e) => {
            let stage = Stage {
                backend,
                gpus: &[],
                stop,
                sink,
            };
            let on = JudgeNode {
                judge: &judge,
                gpus: &[],
            };
            planned.without_gpus(&stage, &on, &mut report);
            return report::could_not_run(report, error_reason_in("inventory", &e));
        }
    };
    let fail_fast = node_facts(backend, plan, &inventory, &mut report);
    let gpus = selected(inventory, plan);
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
    if fail_fast {
        if let Some(r) = report.facts.as_ref().and_then(|f| f.reasons.first()) {
            sink(&format!("[facts] {r}"));
        }
        judge.node(&mut report);
        report.finished_at = report::now_rfc3339();
        return report;
    }
    let stage = Stage {
        backend,
        gpus: &gpus,
        stop,
        sink,
    };
    measure_and_judge(&mut planned, &stage, plan, &judge, &mut report);
    if !stop.load(Ordering::Relaxed) {
        planned.require_results(&mut report);
    }
    if let Some(b) = &plan.baselines {
        for g in &mut report.gpus {
            let below = gpuval_crds::baseline::judge(g, b);
            crate::judge::push_unique(&mut g.reasons, below);
        }
    }
    judge.node(&mut report);
    if stop.load(Ordering::Relaxed) {
        report.verdict = Verdict::Error;
        report.failures.insert(
            0,
            Code::RunStopped.says("the run was stopped before it finished"),
        );
        report.action = gpuval_crds::reason::action_of(&report.failures);
    }
    report.finished_at = report::now_rfc3339();
    report
}

/// Judges the node's facts into `report` (its GPUs' mode reasons wait in their skeletons):
/// true when the node fails before the checks (a wrong GPU count or bus id).
fn node_facts(
    backend: &Backend,
    plan: &Plan,
    inventory: &Inventory,
    report: &mut NodeReport,
) -> bool {
    let mut system = inventory.system.clone();
    if system.nccl_version.is_none() && matches!(backend, Backend::Cuda(_)) {
        system.nccl_version = crate::nccl::library::locate().ok().and_then(|f| f.version);
    }
    let judged = facts::judge(
        plan,
        &inventory.gpus,
        &inventory.hidden,
        &facts::CudaDevices::from_env(),
        &system,
    );
    report.system = Some(system);
    report.gpus = inventory
        .gpus
        .iter()
        .filter(|g| plan.gpus.as_ref().is_none_or(|sel| sel.contains(&g.index)))
        .map(skeleton)
        .collect();
    for (gpu, reason) in judged.gpu_reasons {
        if let Some(g) = report
            .gpus
            .iter_mut()
            .find(|g| i64::from(g.index) == i64::from(gpu))
        {
            g.reasons.push(reason);
        }
    }
    report.facts = Some(judged.facts);
    judged.fail_fast
}

/// `--gpus` names each GPU once: a GPU listed twice would be tested as two ranks of one
/// communicator and its figures counted twice, so the list is refused with the repeats named.
pub fn check_unique(asked: &[u32]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    let repeated: std::collections::BTreeSet<u32> =
        asked.iter().copied().filter(|i| !seen.insert(*i)).collect();
    if repeated.is_empty() {
        return Ok(());
    }
    let list =
        |it: &mut dyn Iterator<Item = &u32>| it.map(u32::to_string).collect::<Vec<_>>().join(",");
    Err(format!(
        "--gpus {}: GPU {} is listed more than once; name each GPU once (--gpus {})",
        list(&mut asked.iter()),
        list(&mut repeated.iter()),
        list(&mut seen.iter())
    ))
}

/// Refuses a `--gpus` selection that names a GPU the host does not have (bad input, not a node
/// without GPUs): the message names the indices it has.
pub fn check_selection(asked: &[u32], have: &[GpuInfo]) -> Result<(), String> {
    let missing: Vec<String> = asked
        .iter()
        .filter(|i| !have.iter().any(|g| g.index == **i))
        .map(u32::to_string)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let has = if have.is_empty() {
        "none that CUDA can see".to_string()
    } else {
        have.iter()
            .map(|g| g.index.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(format!(
        "--gpus {}: this host has no GPU {}; its GPUs are {has} (NVML's numbering, as nvidia-smi \
         shows it)",
        asked
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        missing.join(", ")
    ))
}

/// The inventoried GPUs the plan selects.
fn selected(inventory: Inventory, plan: &Plan) -> Vec<GpuInfo> {
    inventory
        .gpus
        .into_iter()
        .filter(|g| plan.gpus.as_ref().is_none_or(|sel| sel.contains(&g.index)))
        .collect()
}

/// The measuring pass with the sampler running beside it: the first topology reading, error
/// counters, every check in the rows' order, the judging of every check but the topology,
/// and a second measurement of the performance figures that fell short (when the spec asks,
/// the default); then the topology with what the sampler's re-reads found, and each GPU's
/// telemetry.
fn measure_and_judge(
    planned: &mut Planned,
    stage: &Stage<'_>,
    plan: &Plan,
    judge: &Judge<'_>,
    report: &mut NodeReport,
) {
    let platform = stage.backend.platform();
    let on = JudgeNode {
        judge,
        gpus: stage.gpus,
    };
    let mut topology = planned.first_topology(stage);
    planned.prepare(stage);
    let planned = &*planned;
    let counters_before: Vec<_> = stage
        .gpus
        .iter()
        .map(|g| platform.error_counters(g.index).ok())
        .collect();
    let owner = Owner::this_process(platform);
    let mut foreign = Sightings::default();
    foreign.read(platform, stage.gpus, &owner, Phase::Before);
    let busy = Mutex::new(BusyLog::default());
    let window = idle_window(stage.backend);
    let probe = |when: &str| busy::probe_idle(platform, stage.gpus, when, window, &busy);
    let sampled = Mutex::new(Sampled::default());
    let sampler_stop = AtomicBool::new(false);
    let started = Instant::now();
    let first = topology
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
            owner: &owner,
            busy: &busy,
        };
        let (sampled, sampler_stop) = (&sampled, &sampler_stop);
        s.spawn(move || sampler.run(sampled, sampler_stop, started));
        let pending = planned.measure(stage, &|next| probe(&format!("before {next}")));
        probe("after the checks");
        Planned::judge(&on, pending, report);
        if plan.thresholds.remeasure && !stage.stopped() {
            remeasure(planned, stage, &on, report, &|| {
                probe("before the second measurement")
            });
        }
        sampler_stop.store(true, Ordering::Relaxed);
    });
    let mut sampled = sampled.into_inner().unwrap_or_else(|p| p.into_inner());
    // Xids that came after the sampler's last look.
    for x in platform.poll_xid(std::time::Duration::ZERO) {
        sampled.xids.entry(x.gpu).or_default().push(x.xid);
    }
    if let Some(Ok(t)) = topology.as_mut() {
        t.resamples = sampled.topology_samples;
        t.link_changes = std::mem::take(&mut sampled.link_changes);
    }
    planned.judge_topology(&on, topology, report);
    add_telemetry(stage, &sampled, &mut report.gpus, counters_before);
    foreign.merge(std::mem::take(&mut sampled.processes));
    foreign.read(platform, stage.gpus, &owner, Phase::After);
    foreign.judge(plan.allow_shared_gpus, &mut report.gpus);
    let busy = busy.into_inner().unwrap_or_else(|p| p.into_inner());
    busy.judge(
        plan.allow_shared_gpus,
        plan.pod_resources.as_ref(),
        &mut report.gpus,
    );
    busy::excuse_sharing(report, plan.allow_shared_gpus);
}

/// How long an idle probe collects utilisation samples: none on the simulated backend, whose
/// readings do not change with time.
fn idle_window(backend: &Backend) -> std::time::Duration {
    match backend {
        Backend::Cuda(_) => busy::IDLE_WINDOW,
        Backend::Simulated(_) => std::time::Duration::ZERO,
    }
}

/// The second measurement of what fell short on performance alone, on the same GPUs (a
/// simulated node as a second measurement sees it: its `flaky=` faults gone).
fn remeasure(
    planned: &Planned,
    stage: &Stage<'_>,
    on: &JudgeNode<'_>,
    report: &mut NodeReport,
    probe: &dyn Fn(),
) {
    let second = match stage.backend {
        Backend::Simulated(b) => Some(Backend::Simulated(b.second_measurement())),
        Backend::Cuda(_) => None,
    };
    let again_stage = Stage {
        backend: second.as_ref().unwrap_or(stage.backend),
        ..*stage
    };
    if any_performance_failure(report) {
        probe();
    }
    let again = planned.remeasure(&again_stage, on, report);
    if !again.is_empty() {
        (stage.sink)(&format!(
            "[remeasure] measured again: {} (a figure fell short)",
            again.join(", ")
        ));
    }
}

/// True when a check's result has a performance figure that fell short (what the second
/// measurement may measure again).
fn any_performance_failure(report: &NodeReport) -> bool {
    let short = |(_, reasons): &crate::checks::Found<'_>| {
        reasons
            .iter()
            .any(|r| r.code.is_performance() && r.severity >= crate::judge::Severity::Fail)
    };
    report
        .gpus
        .iter()
        .any(|g| crate::checks::gpu_results(g).iter().any(short))
        || crate::checks::node_results(report).iter().any(short)
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
