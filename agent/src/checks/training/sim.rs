//! The simulated training step (tests and demos only): deterministic step times from the GPU
//! model's GEMM rate and NVLink bandwidth, checksums that agree unless a corruption is
//! planted, and the faults the simulator's spec plants: `fail=training@G` (GPU G's weights
//! change in the middle of the run), `slow=training@G:F` (the all-reduce runs at F of its
//! speed, so the backward pass no longer hides it), `error=training@G`, `fabric=hang`, and
//! `hang=training@G` (GPU G's replica never joins the communicator: the others wait in its
//! setup until the watchdog ends the run, with the words the real engine's watchdog uses).
//!
//! The step takes the real one's way ([`super::child::run_job`]): a private run directory under
//! the temporary directory with the `libnccl.so` link of the simulated NCCL
//! ([`crate::nccl::sim::library`]), a child process of the agent behind the hidden
//! `training-run` subcommand under the same silence limit, NCCL's log file in the run directory.
//! The job carries [`SimTraining`], so the child runs [`step_process`] instead of the engine; a
//! planted hang holds the child until the step timeout (`fabric=hang`: the step's deadline
//! aborts it) or the watchdog's timeout plus grace (`hang=training@G`: the child ends itself
//! with what it knows), or until the agent stops it.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::outcome::{Comparison, TrainingOutcome};
use super::request::{Corruption, ELEMENT, Job, TrainingRequest};
use crate::backend::BackendError;
use crate::backend::GpuInfo;
use crate::backend::sim::{FabricFault, SimBackend, SimCheck, listed};
use crate::nccl::sim::SIM_VERSION;
use crate::run_control::RunControl;
use crate::worker::serve::Bail;

/// Share of the GEMM rate a training step sustains (smaller GEMMs, activations, update).
const STEP_EFFICIENCY: f64 = 0.82;
/// All-reduce bus bandwidth over NVLink, GB/s.
const BUS_GBPS: f64 = 370.0;
/// Share of the backward pass the all-reduce can hide behind (the rest is the last buckets).
const HIDEABLE: f64 = 0.9;
/// How often a simulated hang looks at the stop flag.
const HANG_POLL: Duration = Duration::from_millis(10);

/// What the training process of the simulated node simulates: the figures of the node, with
/// the faults its spec plants, worked out by the check from the simulator's spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimTraining {
    /// GEMM rate one GPU sustains in a step, TFLOP/s.
    pub tflops: f64,
    /// The all-reduce's bus bandwidth, GB/s (`slow=training@G:F` applied).
    pub bus_gbps: f64,
    /// `fabric=hang`: step 1 never finishes, and the step's deadline aborts the communicator.
    pub hang: bool,
    /// `hang=training@G`: NVML indices of the GPUs whose replicas never join.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Vec<u32>,
}

/// Runs the simulated step on `gpus` of the simulated node, in a child process of the agent.
pub fn run(
    b: &SimBackend,
    gpus: &[GpuInfo],
    req: &TrainingRequest,
    ctl: &RunControl<'_>,
) -> Result<TrainingOutcome, BackendError> {
    for g in gpus {
        b.begin(SimCheck::Training, g.index)?;
    }
    let spec = b.spec();
    let mut req = req.clone();
    if req.corrupt.is_none() {
        req.corrupt = gpus
            .iter()
            .find(|g| listed(&spec.fail, SimCheck::Training, g.index))
            .map(|g| Corruption {
                gpu: g.index,
                step: req.total_steps().div_ceil(2),
            });
    }
    let slow = gpus
        .iter()
        .map(|g| spec.slowdown(SimCheck::Training, g.index))
        .fold(1.0, f64::min);
    let sim = SimTraining {
        tflops: spec.model.tflops(gpuval_crds::Dtype::Bf16) * STEP_EFFICIENCY,
        bus_gbps: BUS_GBPS * slow,
        hang: spec.fabric.contains(&FabricFault::Hang),
        absent: gpus
            .iter()
            .filter(|g| listed(&spec.hang, SimCheck::Training, g.index))
            .map(|g| g.index)
            .collect(),
    };
    let job = Job {
        req,
        gpus: gpus.to_vec(),
        simulated: Some(sim),
    };
    let exe = crate::worker::agent_exe()?;
    super::child::run_job(&exe, &crate::nccl::sim::library(), &job, ctl)
}

/// The training process's side (behind `training-run`): finds `libnccl.so` as the loader
/// would, opens NCCL's log file as NCCL does, and runs the step, or hangs as planted.
pub fn step_process(
    sim: &SimTraining,
    job: &Job,
    ctl: &RunControl<'_>,
    bail: Bail<'_, TrainingOutcome>,
) -> Result<TrainingOutcome, BackendError> {
    crate::nccl::sim::require_link(std::env::var("LD_LIBRARY_PATH").ok().as_deref())?;
    if let Some(file) = std::env::var_os("NCCL_DEBUG_FILE") {
        // At NCCL_DEBUG=WARN a healthy run logs nothing; the file is opened all the same.
        crate::nccl::sim::write_log(std::path::Path::new(&file), "");
    }
    let req = &job.req;
    if let Some(e) = never_joined(&sim.absent, &job.gpus, req) {
        // As the engine's watchdog: the host call outlived the step timeout and its grace, so
        // the process answers with what it knows and ends.
        if !wait(req.timeout + super::engine::STUCK_GRACE, ctl) {
            return Err(BackendError::Stopped);
        }
        bail(Err(e.clone()));
        return Err(e);
    }
    let mut out = simulate(req, &job.gpus, sim.tflops, sim.bus_gbps);
    if sim.hang {
        if !wait(req.timeout, ctl) {
            return Err(BackendError::Stopped);
        }
        out.overlapped = vec![Vec::new(); job.gpus.len()];
        out.comparisons.clear();
        out.error = Some(format!(
            "step 1 did not finish within {:.0}s; the communicator was aborted",
            req.timeout.as_secs_f64()
        ));
    }
    Ok(out)
}

/// Waits `how_long` like a call that never returns; false when a stop ended the wait.
fn wait(how_long: Duration, ctl: &RunControl<'_>) -> bool {
    let deadline = Instant::now() + how_long;
    while !ctl.stopped() && Instant::now() < deadline {
        std::thread::sleep(HANG_POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
    !ctl.stopped()
}

/// The replicas of `absent` GPUs never joined: the error the real watchdog ends the run with,
/// after the step timeout and its grace.
fn never_joined(absent: &[u32], gpus: &[GpuInfo], req: &TrainingRequest) -> Option<BackendError> {
    let ranks: Vec<(u32, u32)> = gpus.iter().zip(0u32..).map(|(g, r)| (r, g.index)).collect();
    let (absent, inside): (Vec<_>, Vec<_>) =
        ranks.into_iter().partition(|(_, g)| absent.contains(g));
    if absent.is_empty() {
        return None;
    }
    let seconds = (req.timeout + super::engine::STUCK_GRACE).as_secs_f64();
    Some(BackendError::Other(super::stuck::message(
        super::stuck::INIT_CALL,
        seconds,
        &inside,
        &absent,
    )))
}

/// The figures of a node of `gpus` reaching `tflops` per GPU and `bus_gbps` in the all-reduce.
pub fn simulate(
    req: &TrainingRequest,
    gpus: &[GpuInfo],
    tflops: f64,
    bus_gbps: f64,
) -> TrainingOutcome {
    let n = gpus.len().max(1) as f64;
    let compute = req.flops_per_step() / (tflops * 1e12);
    let backward = compute * 2.0 / 3.0;
    let grad_bytes = (req.parameters() * ELEMENT) as f64;
    let comm = grad_bytes * 2.0 * (n - 1.0) / n / (bus_gbps * 1e9);
    let last_bucket = comm / req.buckets().len().max(1) as f64;
    let exposed = (comm - backward * HIDEABLE).max(last_bucket);
    let jitter = |i: usize, rank: usize| 1.0 + 0.002 * ((i * 7 + rank * 3) % 5) as f64;
    let steps = req.steps as usize;
    let series = |base: f64, rank: usize| (0..steps).map(|i| base * jitter(i, rank)).collect();
    let ranks = gpus.len();
    TrainingOutcome {
        gpus: gpus.iter().map(|g| g.index).collect(),
        single: series(compute * 0.985, 0),
        compute_only: (0..ranks).map(|r| series(compute, r)).collect(),
        overlapped: (0..ranks).map(|r| series(compute + exposed, r)).collect(),
        comparisons: comparisons(req, gpus),
        nccl_version: Some(format!("{SIM_VERSION} (simulated)")),
        error: None,
        notes: vec![
            "simulated: step times from a model of the GPU and NVLink, not measured (run by the agent's training process)".into(),
        ],
        seconds: (compute * 2.0 + compute + exposed) * f64::from(req.total_steps()),
    }
}

/// The checksums the replicas would report: equal, except the corrupted GPU's from the
/// planted step on.
fn comparisons(req: &TrainingRequest, gpus: &[GpuInfo]) -> Vec<Comparison> {
    (1..=req.total_steps())
        .filter(|s| req.compares_after(*s))
        .map(|step| Comparison {
            step,
            checksums: gpus
                .iter()
                .map(|g| {
                    let base = u64::from(step).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    match req.corrupt {
                        Some(c) if c.gpu == g.index && step >= c.step => base ^ 0x10000,
                        _ => base,
                    }
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::testing::h200;
    use gpuval_crds::TrainingCheck;

    #[test]
    fn a_planted_corruption_shows_from_its_step_on() {
        let mut req = TrainingRequest::from_spec(&TrainingCheck::default());
        req.corrupt = Some(Corruption { gpu: 2, step: 12 });
        let gpus: Vec<_> = (0..4).map(h200).collect();
        let o = simulate(&req, &gpus, 640.0, 370.0);
        let steps: Vec<u32> = o.comparisons.iter().map(|c| c.step).collect();
        assert_eq!(steps, [10, 20, 30, 33]);
        assert!(
            o.comparisons[0]
                .checksums
                .iter()
                .all(|s| *s == o.comparisons[0].checksums[0])
        );
        let second = &o.comparisons[1].checksums;
        assert_ne!(second[2], second[0]);
        assert_eq!(second[1], second[0]);
    }

    #[test]
    fn a_slow_all_reduce_is_exposed() {
        let req = TrainingRequest::from_spec(&TrainingCheck::default());
        let gpus: Vec<_> = (0..8).map(h200).collect();
        let healthy = simulate(&req, &gpus, 640.0, 370.0);
        let slow = simulate(&req, &gpus, 640.0, 370.0 * 0.05);
        let gap = |o: &TrainingOutcome| o.overlapped[0][0] - o.compute_only[0][0];
        assert!(gap(&healthy) < 0.01 * healthy.compute_only[0][0] * 2.0);
        assert!(gap(&slow) > 10.0 * gap(&healthy));
    }
}
