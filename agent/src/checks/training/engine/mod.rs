//! The training step on real GPUs, in a child process of the agent (`super::child`): one
//! thread per replica, one NCCL communicator over every GPU (the NCCL check's communicator
//! code), three phases run in turn so that every figure of the run is measured in the same run:
//! 1. the compute-only step on the first GPU alone (the one-GPU throughput);
//! 2. the compute-only step on every GPU at once (what the step costs without communication);
//! 3. the step with the all-reduce overlapping the backward pass and the SGD update, the
//!    replicas' weight checksums compared every `checksumEvery` steps and after the last.
//!
//! Each step is timed between two events on the replica's compute stream; the host waits for
//! it with a deadline (the spec's timeout), and a step that misses it aborts the communicator
//! of every replica. A replica stuck inside a host NCCL call (`ncclCommInitRank` waiting for a
//! replica that never joins) cannot be aborted from its thread: when such a call outlives the
//! timeout, the watchdog answers with the ranks inside it and those that never came, and ends
//! the process, which frees the GPUs.

pub mod kernels;
pub mod replica;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;

use self::replica::{Mode, Replica};
use super::outcome::{Comparison, TrainingOutcome};
use super::request::{Job, TrainingRequest};
use super::stuck::{self, INIT_CALL};
use crate::backend::cuda::kernels::{Blas, require_blas};
use crate::backend::{BackendError, GpuInfo};
use crate::nccl::engine::comm::{self, Comm};
use crate::nccl::engine::sync::{InCall, Interrupted, Shared, WaitError, wait_for};
use crate::nccl::library;
use crate::run_control::RunControl;
use crate::worker::serve::Bail;

const WATCH_TICK: Duration = Duration::from_millis(20);
/// How much longer than the step timeout a host NCCL call may block before the watchdog ends
/// the process.
pub const STUCK_GRACE: Duration = Duration::from_secs(5);
/// After a stop request, how long a host NCCL call may block before the watchdog ends it.
const STUCK_AFTER_STOP: Duration = Duration::from_secs(1);

/// Test hook, read only here: the replica of this rank never calls `ncclCommInitRank`, as a
/// GPU that never joins would, so the others wait inside it until the watchdog ends the
/// process. Only in agents built with the `test-hooks` feature ([`crate::test_hooks`]).
pub const HANG_INIT_ENV: &str = "GPUVAL_TRAINING_TEST_HANG_INIT";

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
    /// The rank that plays a GPU that never joins (test hook).
    hang_init: Option<u32>,
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

/// Runs the three phases over the job's GPUs (rank order; rank r is CUDA device r of this
/// process).
pub fn run(
    job: &Job,
    ctl: &RunControl<'_>,
    bail: Bail<'_, TrainingOutcome>,
) -> Result<TrainingOutcome, BackendError> {
    let started = Instant::now();
    let Job { req, gpus, .. } = job;
    library::require_driver()?;
    library::require_loadable()?;
    let version = comm::version();
    library::require_version(version.as_deref())?;
    require_blas(Blas::Only)?;
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
        hang_init: hang_init_rank(),
        error: Mutex::new(None),
    };
    let ranks = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
    let measured: Vec<Measured> = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .zip(0u32..)
            .map(|(g, rank)| {
                let run = &run;
                s.spawn(move || replica_thread(run, g, (rank, ranks)))
            })
            .collect();
        let mut bailed = false;
        while !handles.iter().all(|h| h.is_finished()) {
            if ctl.stopped() {
                stop.store(true, Ordering::Relaxed);
            }
            let limit = if ctl.stopped() {
                STUCK_AFTER_STOP
            } else {
                req.timeout + STUCK_GRACE
            };
            if !bailed && let Some(e) = stuck_error(&shared, limit, gpus) {
                bailed = true;
                bail(Err(e));
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

/// The rank [`HANG_INIT_ENV`] names, when the hook is built in and set.
fn hang_init_rank() -> Option<u32> {
    let v = crate::test_hooks::value(HANG_INIT_ENV)?;
    match v.trim().parse() {
        Ok(rank) => {
            tracing::warn!(
                env = HANG_INIT_ENV,
                rank,
                "test hook: a replica will never join"
            );
            Some(rank)
        }
        Err(_) => {
            tracing::warn!(env = HANG_INIT_ENV, value = %v, "test hook ignored: expected a rank");
            None
        }
    }
}

/// The error that ends the run when a replica has been inside one host NCCL call for longer
/// than `limit` ([`stuck::message`]).
fn stuck_error(shared: &Shared<'_>, limit: Duration, gpus: &[GpuInfo]) -> Option<BackendError> {
    let (rank, call) = shared.stuck(limit)?;
    let calls = shared.calls();
    let ranks = |keep: &dyn Fn(&Option<InCall>) -> bool| -> Vec<(u32, u32)> {
        calls
            .iter()
            .zip(0u32..)
            .filter(|(c, _)| keep(c))
            .map(|(_, r)| (r, gpus.get(r as usize).map_or(r, |g| g.index)))
            .collect()
    };
    let inside = ranks(&|c| c.as_ref().is_some_and(|c| c.what == call.what));
    let absent = ranks(&|c| c.is_none());
    tracing::error!(
        rank,
        call = call.what,
        "a replica is stuck in a host NCCL call"
    );
    let secs = call.since.elapsed().as_secs_f64();
    Some(BackendError::Other(stuck::message(
        call.what, secs, &inside, &absent,
    )))
}

/// Refuses a model that does not fit in every GPU's free memory, saying what to lower.
pub fn require_memory(gpus: &[GpuInfo], req: &TrainingRequest) -> Result<(), BackendError> {
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
fn replica_thread(run: &Run<'_>, g: &GpuInfo, (rank, ranks): (u32, u32)) -> Measured {
    let mut out = Measured::default();
    let opened = CudaContext::new(rank as usize)
        .map_err(|e| format!("open a CUDA context on GPU {}: {e}", g.index))
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
    if run.hang_init == Some(rank) {
        // Plays a GPU that never joins: the others wait in ncclCommInitRank for it.
        while run.shared.interrupted().is_none() {
            std::thread::sleep(WATCH_TICK);
        }
        return out;
    }
    let joined = in_call(run, rank, INIT_CALL, || Comm::init(ranks, run.id, rank));
    match joined {
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
                if let Err(e) = in_call(run, rank, "ncclCommDestroy", || c.destroy()) {
                    tracing::warn!(rank, error = %e, "destroying the training communicator failed");
                }
            }
            Err(Stop::Failed(e)) => {
                run.fail(rank, e);
                in_call(run, rank, "ncclCommAbort", || c.abort());
            }
            Err(Stop::Interrupted) => in_call(run, rank, "ncclCommAbort", || c.abort()),
        }
    }
    out
}

/// Runs `f`, a host NCCL call, with the rank marked as inside `what` for the watchdog.
fn in_call<T>(run: &Run<'_>, rank: u32, what: &'static str, f: impl FnOnce() -> T) -> T {
    let since = Instant::now();
    run.shared.in_call(
        rank,
        Some(InCall {
            what,
            since,
            step: None,
        }),
    );
    let r = f();
    run.shared.in_call(rank, None);
    r
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
    match mode {
        Mode::Overlapped => in_call(run, rep.rank, "ncclAllReduce", || {
            rep.queue_step(mode, seed)
        })?,
        Mode::ComputeOnly => rep.queue_step(mode, seed)?,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuInfo {
        crate::judge::testing::h200(index)
    }

    fn inside(shared: &Shared<'_>, rank: u32, what: &'static str, ago: Duration) {
        let since = Instant::now().checked_sub(ago).expect("a past instant");
        shared.in_call(
            rank,
            Some(InCall {
                what,
                since,
                step: None,
            }),
        );
    }

    #[test]
    fn a_replica_that_never_joins_is_named_beside_those_left_waiting() {
        let stop = AtomicBool::new(false);
        let shared = Shared::new(3, &stop);
        let gpus = [gpu(4), gpu(5), gpu(6)];
        let limit = Duration::from_secs(2);
        inside(&shared, 0, INIT_CALL, Duration::from_secs(1));
        assert!(
            stuck_error(&shared, limit, &gpus).is_none(),
            "within the limit"
        );
        inside(&shared, 0, INIT_CALL, Duration::from_secs(3));
        inside(&shared, 2, INIT_CALL, Duration::from_secs(3));
        let msg = stuck_error(&shared, limit, &gpus)
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains(
                "ncclCommInitRank did not return within 3s on rank 0 (GPU 4), rank 2 (GPU 6)"
            ),
            "{msg}"
        );
        assert!(
            msg.contains("rank 1 (GPU 5) never joined"),
            "the replica that never came is the one named to look at: {msg}"
        );
        assert!(
            msg.ends_with("the training process ended to free the GPUs"),
            "{msg}"
        );
    }

    #[test]
    fn a_step_stuck_on_the_host_is_named_with_its_call() {
        let stop = AtomicBool::new(false);
        let shared = Shared::new(2, &stop);
        inside(&shared, 1, "ncclAllReduce", Duration::from_secs(3));
        let msg = stuck_error(&shared, Duration::from_secs(2), &[gpu(0), gpu(1)])
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.starts_with("ncclAllReduce did not return within 3s on rank 1 (GPU 1)"),
            "{msg}"
        );
        assert!(
            !msg.contains("never joined"),
            "only setup has absentees: {msg}"
        );
    }
}
