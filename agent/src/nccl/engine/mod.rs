//! The real sweep, in this process: one communicator over every visible GPU
//! (`ncclCommInitRank` with a shared unique id), one thread and one stream per rank, a
//! spinning barrier between the ranks before each timed batch. Each rank times its batch with
//! device events; a size's time is the slowest rank's, as nccl-tests takes it.
//!
//! NCCL reads its environment once per process, so this runs in a child process that the
//! check starts with the environment it wants (see `child.rs`); the GPUs are the child's
//! visible devices in rank order.

pub mod comm;
pub mod kernels;
pub mod rank;
pub mod sync;

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;

use self::rank::{RankError, RankSetup, SetupError, StepRecord};
use self::sync::{InCall, Shared};
use super::bandwidth::{Layout, human_bytes};
use super::library;
use super::outcome::{Abort, AbortCause, CurveOutcome, RankMismatch, RowOutcome, SweepOutcome};
use super::request::SweepRequest;
use crate::backend::{BackendError, Side};

/// Test hook, read only here: the rank with this number never joins a collective, so the
/// others hang until the timeout aborts the communicator.
pub const SKIP_RANK_ENV: &str = "GPUVAL_NCCL_TEST_SKIP_RANK";

/// Progress reports: share done (0..=1) and a note.
pub type Progress<'a> = crate::worker::serve::Progress<'a>;

/// What the sweep process does when a rank is stuck inside a host NCCL call (NCCL blocks the
/// host while it connects to a peer, and such a call cannot be aborted from its own thread):
/// report what is known and end the process, which frees the GPUs. Called at most once.
pub type Bail<'a> = crate::worker::serve::Bail<'a, SweepOutcome>;

/// How much longer than the collective timeout a host call may block before the bail.
const STUCK_GRACE: Duration = Duration::from_secs(5);
/// After a stop request, how long a host call may block before the bail.
const STUCK_AFTER_STOP: Duration = Duration::from_secs(1);
const WATCH_TICK: Duration = Duration::from_millis(50);

/// Runs the sweep over the first `req.ranks` visible GPUs.
pub fn run(
    req: &SweepRequest,
    stop: &AtomicBool,
    progress: Progress<'_>,
    bail: Bail<'_>,
) -> Result<SweepOutcome, BackendError> {
    let started = Instant::now();
    let Prepared { version, ptx, id } = prepare(req)?;
    let ranks = req.ranks.max(1);
    let skip = skip_rank();
    let shared = Shared::new(ranks as usize, stop);
    let total = total_steps(req);
    let records: Mutex<Vec<Vec<StepRecord>>> = Mutex::new(vec![Vec::new(); ranks as usize]);
    let on_step = |rank: u32, rec: &StepRecord| {
        let mut all = records.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mine) = all.get_mut(rank as usize) {
            mine.push(rec.clone());
        }
        if rank == 0 {
            let done = all.first().map_or(0, Vec::len);
            progress(done as f64 / total.max(1) as f64, &step_note(req, rec));
        }
    };
    progress(
        0.0,
        &format!(
            "{ranks} ranks: NCCL {} communicator",
            version.as_deref().unwrap_or("?")
        ),
    );
    let ended: Vec<Result<(), RankError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let setup = RankSetup {
                    rank,
                    req,
                    id,
                    ptx: &ptx,
                    shared: &shared,
                    skip: skip == Some(rank),
                    on_step: &on_step,
                };
                s.spawn(move || rank::run(setup).1)
            })
            .collect();
        let mut bailed = false;
        while !handles.iter().all(|h| h.is_finished()) {
            let stopping = stop.load(std::sync::atomic::Ordering::Relaxed);
            let limit = if stopping {
                STUCK_AFTER_STOP
            } else {
                req.timeout() + STUCK_GRACE
            };
            if !bailed && let Some((rank, call)) = shared.stuck(limit) {
                bailed = true;
                let done = records.lock().unwrap_or_else(|p| p.into_inner()).clone();
                // An abort already under way (stuck in ncclCommAbort, say) keeps its reason.
                let reported = match shared.reason() {
                    Some(a) => Ok(SweepOutcome {
                        nccl_version: version.clone(),
                        abort: Some(a),
                        ..assemble(&done)
                    }),
                    None => stuck_outcome(req, &done, rank, &call, stopping, version.clone()),
                };
                bail(reported);
            }
            std::thread::sleep(WATCH_TICK);
        }
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(RankError::Setup(SetupError::own("a rank thread panicked")))
                })
            })
            .collect()
    });
    if let Some(e) = setup_failure(&ended) {
        return Err(e);
    }
    let done = records.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut outcome = assemble(&done);
    outcome.nccl_version = version;
    outcome.abort = shared.reason();
    outcome.seconds = started.elapsed().as_secs_f64();
    Ok(outcome)
}

/// The sweep's error when a rank's setup failed: one of this node's ranks failing on its own
/// side makes it this node's failure, else the first rank's failure (a peer's) stands.
fn setup_failure(ended: &[Result<(), RankError>]) -> Option<BackendError> {
    let failed: Vec<&SetupError> = ended
        .iter()
        .filter_map(|r| match r {
            Err(RankError::Setup(e)) => Some(e),
            _ => None,
        })
        .collect();
    let e = failed
        .iter()
        .find(|e| e.side == Side::Own)
        .or(failed.first())?;
    Some(BackendError::CollectiveSetup {
        message: format!("NCCL sweep could not start: {}", e.message),
        side: e.side,
    })
}

/// What every rank starts from.
struct Prepared {
    version: Option<String>,
    ptx: String,
    id: cudarc::nccl::sys::ncclUniqueId,
}

/// Checks the libraries (no cudarc call may panic) and the GPUs, compiles the check kernels
/// and makes the communicator's unique id.
fn prepare(req: &SweepRequest) -> Result<Prepared, BackendError> {
    library::require_driver()?;
    library::require_loadable()?;
    let version = comm::version();
    library::require_version(version.as_deref())?;
    let ranks = req.ranks.max(1);
    let visible = CudaContext::device_count()
        .map_err(|e| BackendError::NoGpu(format!("cuDeviceGetCount: {e}")))?;
    if i64::from(visible) < i64::from(ranks) {
        return Err(BackendError::NoGpu(format!(
            "{ranks} ranks asked for, {visible} GPUs visible"
        )));
    }
    let cc = CudaContext::new(0)
        .and_then(|c| c.compute_capability())
        .map_err(|e| BackendError::gpu(0, "read compute capability", e))?;
    let ptx = kernels::compile(Some(cc))?;
    let id = comm::unique_id().map_err(|e| BackendError::Other(e.to_string()))?;
    Ok(Prepared { version, ptx, id })
}

/// What is reported when a rank is stuck in a host NCCL call.
fn stuck_outcome(
    req: &SweepRequest,
    done: &[Vec<StepRecord>],
    rank: u32,
    call: &InCall,
    stopping: bool,
    version: Option<String>,
) -> Result<SweepOutcome, BackendError> {
    let secs = call.since.elapsed().as_secs_f64();
    let Some((collective, bytes, in_place, phase)) = call.step else {
        return Err(BackendError::Hung(format!(
            "rank {rank}: {} did not return within {secs:.0}s; the sweep process ended to free the GPUs",
            call.what
        )));
    };
    let cause = if stopping {
        AbortCause::Stopped
    } else {
        AbortCause::Timeout {
            seconds: req.timeout().as_secs_f64(),
        }
    };
    let mut out = assemble(done);
    out.nccl_version = version;
    out.abort = Some(Abort {
        collective,
        bytes,
        in_place,
        phase,
        rank,
        cause,
    });
    Ok(out)
}

/// The test hook's rank, if set.
fn skip_rank() -> Option<u32> {
    let v = crate::test_hooks::value(SKIP_RANK_ENV)?;
    let rank = v.trim().parse().ok();
    if rank.is_some() {
        tracing::warn!(
            env = SKIP_RANK_ENV,
            rank = v.trim(),
            "test hook: a rank will never join a collective"
        );
    }
    rank
}

fn total_steps(req: &SweepRequest) -> usize {
    req.collectives
        .iter()
        .flat_map(|c| {
            req.sizes
                .iter()
                .map(move |s| Layout::new(*c, *s, req.dtype.size(), u64::from(req.world_size())))
        })
        .filter(|l| l.bytes() > 0)
        .map(|l| if l.has_in_place() { 2 } else { 1 })
        .sum()
}

fn step_note(req: &SweepRequest, rec: &StepRecord) -> String {
    let l = Layout::new(
        rec.collective,
        rec.bytes,
        req.dtype.size(),
        u64::from(req.world_size()),
    );
    format!(
        "{} {} {}: {:.1} GB/s busbw",
        rec.collective,
        human_bytes(rec.bytes),
        if rec.in_place {
            "in-place"
        } else {
            "out-of-place"
        },
        l.busbw_gbps(rec.seconds)
    )
}

/// Rows from every rank's steps: the steps all ranks finished, the slowest rank's time, wrong
/// elements summed, and a mismatch entry per rank that received wrong elements.
pub fn assemble(results: &[Vec<StepRecord>]) -> SweepOutcome {
    let finished = results.iter().map(Vec::len).min().unwrap_or(0);
    let mut out = SweepOutcome::default();
    for i in 0..finished {
        let per_rank: Vec<&StepRecord> = results.iter().filter_map(|s| s.get(i)).collect();
        let Some(first) = per_rank.first() else {
            continue;
        };
        let slowest = per_rank.iter().map(|r| r.seconds).fold(0.0, f64::max);
        let wrong: u64 = per_rank.iter().map(|r| r.wrong).sum();
        for (rank, r) in per_rank.iter().enumerate() {
            if r.wrong > 0 {
                out.mismatches.push(RankMismatch {
                    rank: rank as u32,
                    collective: r.collective,
                    bytes: r.bytes,
                    in_place: r.in_place,
                    elements: r.wrong,
                    first_offset: r.first_wrong.unwrap_or(0),
                });
            }
        }
        add_to_curve(&mut out.curves, first, slowest, wrong);
    }
    out
}

fn add_to_curve(curves: &mut Vec<CurveOutcome>, rec: &StepRecord, seconds: f64, wrong: u64) {
    if curves.last().is_none_or(|c| c.collective != rec.collective) {
        curves.push(CurveOutcome {
            collective: rec.collective,
            rows: Vec::new(),
        });
    }
    let Some(curve) = curves.last_mut() else {
        return;
    };
    if !rec.in_place || curve.rows.last().is_none_or(|r| r.bytes != rec.bytes) {
        curve.rows.push(RowOutcome {
            bytes: rec.bytes,
            count: rec.count,
            ..Default::default()
        });
    }
    if let Some(row) = curve.rows.last_mut() {
        if rec.in_place {
            row.in_place_seconds = Some(seconds);
        } else {
            row.seconds = seconds;
        }
        row.wrong += wrong;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::{Collective, NcclDtype};

    fn rec(
        collective: Collective,
        bytes: u64,
        in_place: bool,
        seconds: f64,
        wrong: u64,
    ) -> StepRecord {
        StepRecord {
            collective,
            bytes,
            count: bytes / 2,
            in_place,
            seconds,
            wrong,
            first_wrong: (wrong > 0).then_some(64),
        }
    }

    fn req() -> SweepRequest {
        SweepRequest {
            ranks: 2,
            collectives: vec![Collective::AllReduce, Collective::AllToAll],
            sizes: vec![8, 1 << 20],
            dtype: NcclDtype::Bf16,
            iterations: 20,
            warmup: 5,
            timeout_ms: 1000,
            world: None,
            simulated: None,
        }
    }

    #[test]
    fn rows_take_the_slowest_rank_and_name_the_rank_with_wrong_data() {
        let r0 = vec![
            rec(Collective::AllReduce, 8, false, 10e-6, 0),
            rec(Collective::AllReduce, 8, true, 11e-6, 0),
            rec(Collective::AllToAll, 1 << 20, false, 50e-6, 0),
        ];
        let r1 = vec![
            rec(Collective::AllReduce, 8, false, 12e-6, 0),
            rec(Collective::AllReduce, 8, true, 9e-6, 3),
            rec(Collective::AllToAll, 1 << 20, false, 40e-6, 0),
        ];
        let out = assemble(&[r0, r1]);
        assert_eq!(out.curves.len(), 2);
        let row = &out.curves[0].rows[0];
        assert_eq!(
            (row.bytes, row.seconds, row.in_place_seconds, row.wrong),
            (8, 12e-6, Some(11e-6), 3)
        );
        assert_eq!(out.curves[1].rows[0].in_place_seconds, None);
        assert_eq!(out.mismatches.len(), 1);
        assert_eq!(
            (
                out.mismatches[0].rank,
                out.mismatches[0].in_place,
                out.mismatches[0].first_offset
            ),
            (1, true, 64)
        );
    }

    #[test]
    fn an_aborted_sweep_keeps_what_every_rank_finished() {
        let r0 = vec![
            rec(Collective::AllReduce, 8, false, 1e-5, 0),
            rec(Collective::AllReduce, 8, true, 1e-5, 0),
        ];
        let r1 = vec![rec(Collective::AllReduce, 8, false, 1e-5, 0)];
        let out = assemble(&[r0, r1]);
        assert_eq!(out.curves[0].rows.len(), 1);
        assert_eq!(out.curves[0].rows[0].in_place_seconds, None);
        // 2 sizes of all-reduce (both placements) and 1 of all-to-all (8 B has no per-rank data).
        assert_eq!(total_steps(&req()), 5);
    }
}
