//! Runs the node checks through a [`Backend`]: every GPU at once per check, NVML telemetry and
//! Xid events sampled the whole time, topology re-sampled so a link that drops mid-run is
//! caught; then judges everything into a [`NodeReport`].

pub mod nccl;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuval_crds::{Checks, GpuReport, IoResult, NodeReport, P2pResult, Thresholds, Verdict};

use crate::backend::{
    Backend, BackendError, ComputeOutcome, ComputeRequest, ErrorCounters, GpuInfo,
    HostTransferOutcome, HostTransferRequest, MemoryOutcome, MemoryRequest, P2pOutcome, P2pRequest,
    RunControl, TelemetrySample, TopologySnapshot,
};
use crate::io_check::{self, judge::Context as IoContext};
use crate::link_verdict::LinkErrorMoves;
use crate::{telemetry, topology, verdict::Judge};

const MIB: u64 = 1024 * 1024;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub checks: Checks,
    pub thresholds: Thresholds,
    /// Only these NVML indices (all GPUs when None).
    pub gpus: Option<Vec<u32>>,
    /// Kubernetes node name (or hostname) for the report.
    pub node: Option<String>,
    /// How often telemetry is sampled.
    pub sample_every: Duration,
    /// Seed of the peer-to-peer pair order (None: a new order each run).
    pub p2p_seed: Option<u64>,
    /// Where the io check writes (the admin-allowed node volume on Kubernetes, any path on
    /// bare metal). None: an io check reports an Error saying how to set it.
    pub io_dir: Option<PathBuf>,
    /// io engine settings that are not part of the spec.
    pub io_tuning: io_check::Tuning,
}

impl Plan {
    pub fn new(checks: Checks, thresholds: Thresholds) -> Self {
        Self {
            checks,
            thresholds,
            gpus: None,
            node: None,
            sample_every: Duration::from_millis(500),
            p2p_seed: None,
            io_dir: None,
            io_tuning: io_check::Tuning::default(),
        }
    }
}

/// Where progress lines go (stderr in the CLI; tests collect them).
pub type ProgressSink<'a> = &'a (dyn Fn(&str) + Sync);

/// Everything the sampler thread gathered.
#[derive(Default)]
struct Sampled {
    samples: HashMap<u32, Vec<TelemetrySample>>,
    xids: HashMap<u32, Vec<u64>>,
    topology_samples: i32,
    link_changes: Vec<String>,
}

pub fn run(
    backend: &dyn Backend,
    plan: &Plan,
    stop: &AtomicBool,
    sink: ProgressSink<'_>,
) -> NodeReport {
    let started_at = now_rfc3339();
    let mut report = NodeReport {
        simulated: backend.kind() == crate::backend::BackendKind::Simulated,
        backend: backend.kind().as_str().to_string(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        node: plan.node.clone(),
        started_at,
        ..Default::default()
    };
    let judge = Judge {
        checks: &plan.checks,
        thresholds: plan.thresholds.clone(),
    };

    let inventory = match backend.inventory() {
        Ok(inv) => inv,
        Err(e) => {
            report.verdict = Verdict::Error;
            report.failures = vec![format!("inventory: {e}")];
            report.io = io_alone(plan, stop, sink, report.simulated);
            report.failures.extend(io_failures(report.io.as_ref()));
            report.finished_at = now_rfc3339();
            return report;
        }
    };
    report.system = Some(inventory.system.clone());
    let gpus: Vec<GpuInfo> = inventory
        .gpus
        .into_iter()
        .filter(|g| plan.gpus.as_ref().is_none_or(|sel| sel.contains(&g.index)))
        .collect();
    sink(&format!(
        "{} GPU(s): {}{}",
        gpus.len(),
        gpus.first().map(|g| g.name.as_str()).unwrap_or("none"),
        if report.simulated {
            " [SIMULATED BACKEND]"
        } else {
            ""
        }
    ));

    let topo_before = if plan.checks.topology.is_some() {
        Some(backend.topology())
    } else {
        None
    };
    let counters_before: HashMap<u32, ErrorCounters> = gpus
        .iter()
        .filter_map(|g| backend.error_counters(g.index).ok().map(|c| (g.index, c)))
        .collect();

    let sampled = Mutex::new(Sampled::default());
    let sampler_stop = AtomicBool::new(false);
    let resample_every = plan
        .checks
        .topology
        .as_ref()
        .and_then(|t| t.resample_interval)
        .map(|d| d.as_std())
        .unwrap_or(Duration::from_secs(30));
    let run_started = Instant::now();
    let mut memory: HashMap<u32, Result<MemoryOutcome, BackendError>> = HashMap::new();
    let mut compute: HashMap<u32, Result<ComputeOutcome, BackendError>> = HashMap::new();
    let mut links = LinkRuns::default();
    let mut io_beside_burn: Option<IoResult> = None;

    std::thread::scope(|s| {
        let snap0 = topo_before.as_ref().and_then(|r| r.as_ref().ok());
        let (gpus_ref, sampled_ref, stop_ref, every) =
            (&gpus, &sampled, &sampler_stop, plan.sample_every);
        s.spawn(move || {
            sampler(
                backend,
                gpus_ref,
                every,
                resample_every,
                snap0,
                sampled_ref,
                stop_ref,
                run_started,
            )
        });

        if let Some(m) = &plan.checks.memory {
            let req = MemoryRequest {
                fraction: m.fraction,
                passes: m.passes.max(1) as u32,
                max_logged: 16,
            };
            memory = on_every_gpu(&gpus, stop, sink, "memory", |gpu, ctl| {
                backend.memory_test(gpu, &req, ctl)
            });
        }
        let io_thread = io_during_compute(plan, stop).then(|| {
            s.spawn(|| run_io(plan, stop, sink, io_context(true, false, report.simulated)))
        });
        if let Some(c) = &plan.checks.compute
            && !stop.load(Ordering::Relaxed)
        {
            let req = ComputeRequest {
                duration: c.duration.as_std(),
                dtypes: c.dtypes.clone(),
                matrix_size: c.matrix_size.max(256) as usize,
                transcendentals: c.transcendentals,
            };
            compute = on_every_gpu(&gpus, stop, sink, "compute", |gpu, ctl| {
                backend.compute_burn(gpu, &req, ctl)
            });
        }
        // Wait for io beside the burn here, so it never overlaps a later check (keep this
        // right after the compute block).
        io_beside_burn = io_thread.map(join_io);
        links = run_links(backend, plan, &gpus, stop, sink);
        sampler_stop.store(true, Ordering::Relaxed);
    });

    let mut sampled = sampled.into_inner().unwrap_or_else(|p| p.into_inner());
    let host_spec = plan.checks.host_transfer.clone().unwrap_or_default();
    let mut gpu_reports: Vec<GpuReport> = gpus
        .iter()
        .map(|g| {
            let after = backend.error_counters(g.index).ok();
            GpuReport {
                index: g.index as i32,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                pci_bus_id: Some(g.pci_bus_id.clone()),
                memory_total_mib: (g.memory_total_bytes >> 20) as i64,
                health: Some(g.health.clone()),
                memory: memory
                    .remove(&g.index)
                    .map(|r| Judge::judged(r, |o| judge.memory(g, &o))),
                compute: compute
                    .remove(&g.index)
                    .map(|r| Judge::judged(r, |o| judge.compute(g, &o))),
                host_transfer: links
                    .host
                    .remove(&g.index)
                    .map(|r| Judge::judged(r, |o| judge.host_transfer(g, &o, &host_spec))),
                telemetry: Some(telemetry::summarize(
                    sampled
                        .samples
                        .get(&g.index)
                        .map(Vec::as_slice)
                        .unwrap_or(&[]),
                    counters_before.get(&g.index).copied(),
                    after,
                    sampled.xids.get(&g.index).map(Vec::as_slice).unwrap_or(&[]),
                )),
                ..Default::default()
            }
        })
        .collect();
    judge.relative(&mut gpu_reports);
    judge.relative_host(&mut gpu_reports);
    for g in &mut gpu_reports {
        judge.gpu(g);
    }
    report.gpus = gpu_reports;

    report.topology = topo_before.map(|r| match r {
        Ok(snap) => {
            let mut t = topology::derive(&snap);
            t.samples = 1 + sampled.topology_samples;
            t.link_changes = std::mem::take(&mut sampled.link_changes);
            judge.topology(&gpus, t)
        }
        Err(e) => Judge::errored(&e),
    });
    report.p2p = links.p2p.map(|r| {
        let spec = plan.checks.p2p.clone().unwrap_or_default();
        match r {
            Ok(o) => judge.p2p(&gpus, &o, &spec, &links.link_errors),
            Err(e) => P2pResult {
                buffer_mib: spec.buffer_mib,
                iterations: spec.iterations,
                ..Judge::errored(&e)
            },
        }
    });
    report.io = io_beside_burn.or_else(|| io_alone(plan, stop, sink, report.simulated));
    judge.node(&mut report);
    if stop.load(Ordering::Relaxed) {
        report.verdict = Verdict::Error;
        report
            .failures
            .insert(0, "the run was stopped before it finished".into());
    }
    report.finished_at = now_rfc3339();
    report
}

/// What the link checks measured.
#[derive(Default)]
struct LinkRuns {
    p2p: Option<Result<P2pOutcome, BackendError>>,
    /// NVLink error counters that moved during the p2p check.
    link_errors: LinkErrorMoves,
    host: HashMap<u32, Result<HostTransferOutcome, BackendError>>,
}

/// Peer-to-peer (all pairs, one after another) then host transfers, each a node-wide
/// operation of the backend.
fn run_links(
    backend: &dyn Backend,
    plan: &Plan,
    gpus: &[GpuInfo],
    stop: &AtomicBool,
    sink: ProgressSink<'_>,
) -> LinkRuns {
    let mut out = LinkRuns::default();
    let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    if let Some(p) = &plan.checks.p2p
        && !stop.load(Ordering::Relaxed)
    {
        let req = P2pRequest {
            buffer_bytes: u64::try_from(p.buffer_mib.max(1)).unwrap_or(1) * MIB,
            iterations: u32::try_from(p.iterations.max(1)).unwrap_or(1),
            samples: 3,
            latency_copies: 100,
            chase_steps: 20_000,
            host_staged: p.host_staged,
            seed: plan.p2p_seed.unwrap_or_else(clock_seed),
        };
        if indices.len() < 2 {
            sink("[p2p] skipped: fewer than two GPUs");
            out.p2p = Some(Ok(P2pOutcome::default()));
        } else {
            let before: HashMap<u32, _> = indices
                .iter()
                .filter_map(|&g| backend.nvlink_errors(g).ok().map(|e| (g, e)))
                .collect();
            out.p2p = Some(on_node(stop, sink, "p2p", |ctl| {
                backend.p2p(&indices, &req, ctl)
            }));
            for &g in &indices {
                if let (Some(b), Ok(a)) = (before.get(&g), backend.nvlink_errors(g)) {
                    out.link_errors.add(g, b, &a);
                }
            }
        }
    }
    if let Some(h) = &plan.checks.host_transfer
        && !stop.load(Ordering::Relaxed)
    {
        let req = HostTransferRequest {
            buffer_bytes: u64::try_from(h.buffer_mib.max(1)).unwrap_or(1) * MIB,
            iterations: 8,
            samples: 3,
            pinned: h.pinned,
            pageable: h.pageable,
        };
        let results = on_node(stop, sink, "hostTransfer", |ctl| {
            Ok(backend.host_transfer(&indices, &req, ctl))
        });
        out.host = results.unwrap_or_default().into_iter().collect();
    }
    out
}

/// A seed that differs from run to run.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

/// Runs one node-wide operation with progress lines at most every 5 s.
fn on_node<T>(
    stop: &AtomicBool,
    sink: ProgressSink<'_>,
    check: &str,
    f: impl FnOnce(&RunControl<'_>) -> Result<T, BackendError>,
) -> Result<T, BackendError> {
    sink(&format!("[{check}] starting"));
    let started = Instant::now();
    let last = Mutex::new(None::<Instant>);
    let progress = |done: f64, note: &str| {
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            *last = Some(Instant::now());
            sink(&format!("[{check}] {:>3.0}% {note}", done * 100.0));
        }
    };
    let ctl = RunControl::new(stop, &progress);
    let r = f(&ctl);
    match &r {
        Ok(_) => sink(&format!(
            "[{check}] finished in {:.1}s",
            started.elapsed().as_secs_f64()
        )),
        Err(e) => sink(&format!("[{check}] error: {e}")),
    }
    r
}

// ---- io: file I/O on the host, not the GPUs: alone after the GPU checks, or on its own
// thread beside the compute burn (`duringCompute`). Its errors never stop the other checks.

/// True when the io check should run beside the compute burn.
fn io_during_compute(plan: &Plan, stop: &AtomicBool) -> bool {
    plan.checks.io.as_ref().is_some_and(|c| c.during_compute)
        && plan.checks.compute.is_some()
        && !stop.load(Ordering::Relaxed)
}

/// The io check run alone (None when it was not asked for).
fn io_alone(
    plan: &Plan,
    stop: &AtomicBool,
    sink: ProgressSink<'_>,
    simulated: bool,
) -> Option<IoResult> {
    let spec = plan.checks.io.as_ref()?;
    let wanted_beside_burn = spec.during_compute;
    Some(run_io(
        plan,
        stop,
        sink,
        io_context(false, wanted_beside_burn, simulated),
    ))
}

fn io_context(during_compute: bool, no_compute_to_join: bool, simulated: bool) -> IoContext {
    IoContext {
        during_compute,
        no_compute_to_join,
        simulated_backend: simulated,
    }
}

/// Runs the io check and judges it; an engine error becomes the result's Error.
fn run_io(plan: &Plan, stop: &AtomicBool, sink: ProgressSink<'_>, ctx: IoContext) -> IoResult {
    let spec = plan.checks.io.clone().unwrap_or_default();
    let Some(dir) = plan.io_dir.as_deref() else {
        let e = io_check::IoError::NoDirectory;
        sink(&format!("[io] error: {e}"));
        return io_check::judge::io_error(&spec, None, &e, ctx);
    };
    let req = plan
        .io_tuning
        .apply(io_check::IoRequest::from_spec(&spec, dir));
    sink(&format!(
        "[io] starting: {} files of {} in {} with {} workers{}",
        req.files,
        io_check::human(req.file_size),
        dir.display(),
        req.concurrency,
        if ctx.during_compute {
            ", beside the compute burn"
        } else {
            ""
        }
    ));
    let last = Mutex::new(None::<Instant>);
    let progress = |done: f64, note: &str| {
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            *last = Some(Instant::now());
            sink(&format!("[io] {:>3.0}% {note}", done * 100.0));
        }
    };
    match io_check::run(&req, &RunControl::new(stop, &progress)) {
        Ok(out) => {
            sink(&format!(
                "[io] done: write {:.0} MB/s, read {:.0} MB/s, {} bad words",
                out.write_mbps(),
                out.read_mbps(),
                out.mismatches
            ));
            io_check::judge::io(&spec, &out, ctx)
        }
        Err(e) => {
            sink(&format!("[io] error: {e}"));
            io_check::judge::io_error(&spec, Some(dir), &e, ctx)
        }
    }
}

fn join_io(h: std::thread::ScopedJoinHandle<'_, IoResult>) -> IoResult {
    h.join().unwrap_or_else(|_| IoResult {
        verdict: Verdict::Error,
        reasons: vec!["io: the io check panicked".into()],
        ..Default::default()
    })
}

/// The io result's Fail and Error reasons (for a report that is not judged further).
fn io_failures(io: Option<&IoResult>) -> Vec<String> {
    io.filter(|r| r.verdict.is_bad())
        .map(|r| r.reasons.clone())
        .unwrap_or_default()
}

/// Runs `f` on every GPU at once (one thread each), printing progress at most every 5 s per GPU.
fn on_every_gpu<T: Send>(
    gpus: &[GpuInfo],
    stop: &AtomicBool,
    sink: ProgressSink<'_>,
    check: &str,
    f: impl Fn(u32, &RunControl<'_>) -> Result<T, BackendError> + Sync,
) -> HashMap<u32, Result<T, BackendError>> {
    sink(&format!("[{check}] starting on {} GPU(s)", gpus.len()));
    let started = Instant::now();
    let results = Mutex::new(HashMap::new());
    std::thread::scope(|s| {
        for g in gpus {
            let (f, results) = (&f, &results);
            s.spawn(move || {
                let last = Mutex::new(None::<Instant>);
                let progress = |done: f64, note: &str| {
                    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                        *last = Some(Instant::now());
                        sink(&format!(
                            "[{check}] GPU{} {:>3.0}% {note}",
                            g.index,
                            done * 100.0
                        ));
                    }
                };
                let ctl = RunControl::new(stop, &progress);
                let r = f(g.index, &ctl);
                match &r {
                    Ok(_) => sink(&format!("[{check}] GPU{} done", g.index)),
                    Err(e) => sink(&format!("[{check}] GPU{} error: {e}", g.index)),
                }
                results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(g.index, r);
            });
        }
    });
    sink(&format!(
        "[{check}] finished in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    results.into_inner().unwrap_or_else(|p| p.into_inner())
}

#[allow(clippy::too_many_arguments)]
fn sampler(
    backend: &dyn Backend,
    gpus: &[GpuInfo],
    every: Duration,
    resample_every: Duration,
    snap0: Option<&TopologySnapshot>,
    out: &Mutex<Sampled>,
    stop: &AtomicBool,
    started: Instant,
) {
    let mut last_topo = Instant::now();
    let mut prev_snap = snap0.cloned();
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        let samples: Vec<_> = gpus
            .iter()
            .filter_map(|g| backend.sample(g.index).ok().map(|s| (g.index, s)))
            .collect();
        let xids = backend.poll_xid(Duration::ZERO);
        let mut changes = Vec::new();
        let mut resampled = false;
        if let Some(prev) = prev_snap.as_ref()
            && last_topo.elapsed() >= resample_every
        {
            last_topo = Instant::now();
            if let Ok(now) = backend.topology() {
                changes = topology::link_changes(prev, &now, started.elapsed().as_secs_f64());
                prev_snap = Some(now);
                resampled = true;
            }
        }
        {
            let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
            for (gpu, s) in samples {
                o.samples.entry(gpu).or_default().push(s);
            }
            for x in xids {
                o.xids.entry(x.gpu).or_default().push(x.xid);
            }
            o.link_changes.extend(changes);
            if resampled {
                o.topology_samples += 1;
            }
        }
        // Sleep in short steps so the end of the run is not delayed.
        while tick.elapsed() < every && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20).min(every));
        }
    }
}

/// Current time as RFC 3339 (UTC, seconds).
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Formats seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(secs: u64) -> String {
    i64::try_from(secs)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{SimBackend, SimSpec};
    use gpuval_crds::{ComputeCheck, IoCheck, MemoryCheck};

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
        let report = run(&SimBackend::new(spec), plan, &AtomicBool::new(false), &sink);
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

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000), "2026-11-18T11:06:40Z");
    }
}
