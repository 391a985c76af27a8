//! The training step on real GPUs, in the agent's process: one thread per replica, one NCCL
//! communicator over every GPU (the NCCL check's communicator code), three phases run in
//! turn so that every figure of the run is measured in the same run:
//! 1. the compute-only step on the first GPU alone (the one-GPU throughput);
//! 2. the compute-only step on every GPU at once (what the step costs without communication);
//! 3. the step with the all-reduce overlapping the backward pass and the SGD update, the
//!    replicas' weight checksums compared every `checksumEvery` steps and after the last.
//!
//! Each step is timed between two events on the replica's compute stream; the host waits for
//! it with a deadline (the spec's timeout), and a step that misses it aborts the communicator
//! of every replica.

pub mod kernels;
pub mod replica;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use self::replica::{Mode, Replica};
use super::outcome::{Comparison, TrainingOutcome};
use super::request::TrainingRequest;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::kernels::{Blas, require_blas};
use crate::backend::{BackendError, GpuInfo};
use crate::checks::nccl::engine::comm::{self, Comm};
use crate::checks::nccl::engine::sync::{Interrupted, Shared, WaitError, wait_for};
use crate::checks::nccl::library;
use crate::run_control::RunControl;

const WATCH_TICK: Duration = Duration::from_millis(20);

/// What one replica measured.
#[derive(Debug, Default)]
struct Measured {
    single: Vec<f64>,
    compute_only: Vec<f64>,
    overlapped: Vec<f64>,
    checksums: Vec<(u32, u64)>,
}

/// What the replica threads share besides the barrier.
struct Run<'a> {
    req: &'a TrainingRequest,
    ptx: &'a str,
    id: cudarc::nccl::sys::ncclUniqueId,
    shared: &'a Shared<'a>,
    ctl: &'a RunControl<'a>,
    /// The first error of any replica.
    error: Mutex<Option<String>>,
}

impl Run<'_> {
    fn fail(&self, rank: u32, why: String) {
        let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_none() {
            *e = Some(format!("rank {rank}: {why}"));
        }
        drop(e);
        self.shared.abort_setup();
    }
}

/// Runs the three phases over `gpus` (rank order).
pub fn run(
    backend: &CudaBackend,
    gpus: &[GpuInfo],
    req: &TrainingRequest,
    ctl: &RunControl<'_>,
) -> Result<TrainingOutcome, BackendError> {
    let started = Instant::now();
    library::require_driver()?;
    library::require_loadable()?;
    let version = comm::version();
    library::require_version(version.as_deref())?;
    require_blas(Blas::Only)?;
    require_memory(gpus, req)?;
    let cc = gpus.first().and_then(|g| g.compute_capability);
    let ptx = kernels::compile(cc)?;
    let id = comm::unique_id().map_err(|e| BackendError::Other(e.to_string()))?;
    let stop = AtomicBool::new(false);
    let shared = Shared::new(gpus.len(), &stop);
    let run = Run {
        req,
        ptx: &ptx,
        id,
        shared: &shared,
        ctl,
        error: Mutex::new(None),
    };
    let ranks = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
    let measured: Vec<Measured> = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .zip(0u32..)
            .map(|(g, rank)| {
                let run = &run;
                s.spawn(move || replica_thread(run, backend, g, (rank, ranks)))
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            if ctl.stopped() {
                stop.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(WATCH_TICK);
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    if ctl.stopped() {
        return Err(BackendError::Stopped);
    }
    let error = run.error.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(assemble(gpus, measured, version, error, started))
}

/// Refuses a model that does not fit in every GPU's free memory, saying what to lower.
fn require_memory(gpus: &[GpuInfo], req: &TrainingRequest) -> Result<(), BackendError> {
    let need = req.bytes_per_gpu();
    match gpus.iter().find(|g| g.memory_free_bytes < need + (1 << 30)) {
        Some(g) => Err(BackendError::gpu(
            g.index,
            "fit the training model",
            format!(
                "it needs {:.1} GiB and the GPU has {:.1} GiB free: lower layers, hiddenSize or batchSize",
                need as f64 / f64::from(1u32 << 30),
                g.memory_free_bytes as f64 / f64::from(1u32 << 30)
            ),
        )),
        None => Ok(()),
    }
}

/// The figures of every replica, over the steps all of them finished.
fn assemble(
    gpus: &[GpuInfo],
    measured: Vec<Measured>,
    version: Option<String>,
    error: Option<String>,
    started: Instant,
) -> TrainingOutcome {
    let compared = measured
        .iter()
        .map(|m| m.checksums.len())
        .min()
        .unwrap_or(0);
    let comparisons = (0..compared)
        .filter_map(|i| {
            let step = measured.first()?.checksums.get(i)?.0;
            Some(Comparison {
                step,
                checksums: measured.iter().map(|m| m.checksums[i].1).collect(),
            })
        })
        .collect();
    let single = measured
        .first()
        .map(|m| m.single.clone())
        .unwrap_or_default();
    let (compute_only, overlapped) = measured
        .into_iter()
        .map(|m| (m.compute_only, m.overlapped))
        .unzip();
    TrainingOutcome {
        gpus: gpus.iter().map(|g| g.index).collect(),
        single,
        compute_only,
        overlapped,
        comparisons,
        nccl_version: version,
        error,
        notes: vec![
            "steps timed with device events on each GPU's compute stream; a step's time is the slowest GPU's".into(),
        ],
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// One replica's thread: opens it, joins the communicator, runs the phases, and ends with
/// the communicator destroyed (or aborted on any failure).
fn replica_thread(
    run: &Run<'_>,
    backend: &CudaBackend,
    g: &GpuInfo,
    (rank, ranks): (u32, u32),
) -> Measured {
    let mut out = Measured::default();
    let opened = backend
        .context(g.index)
        .map_err(|e| e.to_string())
        .and_then(|ctx| Replica::open((rank, ranks), g.index, ctx, run.ptx, run.req));
    let mut rep = match opened.and_then(|r| r.init_weights().map(|_| r)) {
        Ok(r) => r,
        Err(e) => {
            run.fail(rank, e);
            return out;
        }
    };
    if run.shared.barrier().is_err() {
        return out;
    }
    match Comm::init(ranks, run.id, rank) {
        Ok(c) => rep.comm = Some(c),
        Err(e) => {
            run.fail(rank, e.to_string());
            return out;
        }
    }
    let ended = phases(run, &rep, &mut out);
    if let Some(c) = rep.comm.take() {
        match ended {
            Ok(()) => {
                if let Err(e) = c.destroy() {
                    tracing::warn!(rank, error = %e, "destroying the training communicator failed");
                }
            }
            Err(Stop::Failed(e)) => {
                run.fail(rank, e);
                c.abort();
            }
            Err(Stop::Interrupted) => c.abort(),
        }
    }
    out
}

/// Why a replica stopped before the end.
enum Stop {
    Failed(String),
    /// Another replica failed, or the run was stopped.
    Interrupted,
}

impl From<String> for Stop {
    fn from(e: String) -> Self {
        Stop::Failed(e)
    }
}

fn phases(run: &Run<'_>, rep: &Replica, out: &mut Measured) -> Result<(), Stop> {
    let req = run.req;
    let total = req.total_steps();
    let all = 3.0 * f64::from(total);
    let barrier = || run.shared.barrier().map_err(|_| Stop::Interrupted);
    barrier()?;
    if rep.rank == 0 {
        for s in 1..=total {
            let t = step(run, rep, Mode::ComputeOnly, s)?;
            keep(req, s, t, &mut out.single);
            progress(run, rep, f64::from(s) / all, "one GPU alone", t);
        }
    }
    barrier()?;
    for s in 1..=total {
        let t = step(run, rep, Mode::ComputeOnly, s)?;
        keep(req, s, t, &mut out.compute_only);
        progress(run, rep, f64::from(total + s) / all, "compute only", t);
    }
    barrier()?;
    for s in 1..=total {
        let t = step(run, rep, Mode::Overlapped, s)?;
        keep(req, s, t, &mut out.overlapped);
        if req.corrupt.is_some_and(|c| c.gpu == rep.gpu && c.step == s) {
            tracing::warn!(
                gpu = rep.gpu,
                step = s,
                "test hook: flipping one weight bit"
            );
            rep.perturb()?;
        }
        if req.compares_after(s) {
            out.checksums.push((s, rep.checksum()?));
        }
        progress(
            run,
            rep,
            f64::from(2 * total + s) / all,
            "with all-reduce",
            t,
        );
    }
    Ok(())
}

fn keep(req: &TrainingRequest, step: u32, seconds: f64, into: &mut Vec<f64>) {
    if step > req.warmup {
        into.push(seconds);
    }
}

fn progress(run: &Run<'_>, rep: &Replica, done: f64, phase: &str, seconds: f64) {
    if rep.rank == 0 {
        run.ctl
            .progress(done, &format!("{phase}: {:.1} ms a step", seconds * 1e3));
    }
}

/// Queues one step, waits for it with the deadline, and returns its device time.
fn step(run: &Run<'_>, rep: &Replica, mode: Mode, s: u32) -> Result<f64, Stop> {
    let seed = (u64::from(s) << 16) ^ (u64::from(rep.rank) << 40) ^ mode_salt(mode);
    rep.queue_step(mode, seed)?;
    let deadline = Instant::now() + run.req.timeout;
    let done = || rep.end.try_is_complete().map_err(|e| e.to_string());
    let failed = || rep.comm.as_ref().and_then(Comm::async_error);
    match wait_for(run.shared, deadline, done, failed) {
        Ok(()) => Ok(rep.step_seconds()?),
        Err(WaitError::Timeout) => Err(Stop::Failed(format!(
            "step {s} ({}) did not finish within {:.0}s; the communicators were aborted",
            mode_name(mode),
            run.req.timeout.as_secs_f64()
        ))),
        Err(WaitError::Failed(e)) => Err(Stop::Failed(format!("step {s}: {e}"))),
        Err(WaitError::Interrupted(Interrupted::Aborted | Interrupted::Stopped)) => {
            Err(Stop::Interrupted)
        }
    }
}

fn mode_salt(mode: Mode) -> u64 {
    match mode {
        Mode::ComputeOnly => 0x1000,
        Mode::Overlapped => 0x2000,
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::ComputeOnly => "compute only",
        Mode::Overlapped => "with all-reduce",
    }
}
