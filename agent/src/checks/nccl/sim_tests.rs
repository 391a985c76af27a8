//! The simulated node's NCCL ([`crate::nccl::sim`]) judged as the check judges it: the sweeps
//! run here rather than in child processes (the child way is tested in `agent/tests/`), each
//! sweep's transport read back from the log its process would write.

use std::time::{Duration, Instant};

use gpuval_crds::Collective;

use crate::backend::GpuInfo;
use crate::checks::nccl::judge::{JudgeContext, judge};
use crate::judge::testing::assert_any_contains;
use crate::nccl::outcome::{AbortCause, NcclOutcome};
use crate::nccl::request::NcclRequest;
use crate::nccl::sim::{SimFault, SimSweep, library, nccl_log, sweep};
use crate::run_control::RunControl;
use gpuval_crds::{GpuHealth, NcclCheck, Verdict};
use std::sync::atomic::AtomicBool;

fn request(spec: &NcclCheck, n: u32) -> NcclRequest {
    let gpus: Vec<GpuInfo> = (0..n)
        .map(|i| GpuInfo {
            index: i,
            uuid: format!("GPU-sim-{i}"),
            name: "NVIDIA H200 (simulated)".into(),
            pci_bus_id: String::new(),
            memory_total_bytes: 140 << 30,
            memory_free_bytes: 139 << 30,
            compute_capability: Some((9, 0)),
            health: GpuHealth::default(),
        })
        .collect();
    NcclRequest::from_spec(spec, &gpus)
}

/// The outcome the agent assembles, its sweeps run here instead of in child processes (the
/// child way is tested in `agent/tests/`): each sweep's transport is read back from the log
/// its process would write.
fn in_process(
    model: &str,
    faults: &[SimFault],
    req: &NcclRequest,
    ctl: &RunControl<'_>,
) -> NcclOutcome {
    let sim = SimSweep {
        model: model.into(),
        faults: faults.to_vec(),
    };
    let one = |p2p_off: bool| {
        let shm = p2p_off || faults.contains(&SimFault::ShmFallback);
        let mut o = sweep(&sim, &req.sweep, ctl, shm);
        let log = nccl_log(model, req.sweep.ranks, shm);
        o.transport = Some(crate::nccl::transport::parse(&log));
        Ok(o)
    };
    NcclOutcome {
        gpus: req.gpus.iter().map(|g| g.index).collect(),
        library: Some(library().describe()),
        sweep: one(false),
        p2p_off: req.transports.then(|| one(true)),
        notes: req.notes.clone(),
        seconds: 0.0,
    }
}

fn judged(spec: &NcclCheck, faults: &[SimFault]) -> gpuval_crds::NcclResult {
    let stop = AtomicBool::new(false);
    let ctl = RunControl::new(&stop, &|_, _| {});
    let out = in_process("H200", faults, &request(spec, 2), &ctl);
    judge(
        &JudgeContext {
            spec,
            nvlink: true,
            profile: Some("H200"),
            facts: &crate::link_floors::NO_FACTS,
            measured_p2p: None,
        },
        &out,
    )
}

#[test]
fn a_healthy_node_gives_deterministic_curves_that_pass() {
    let spec = super::judge::with_floors(300, 20);
    let a = judged(&spec, &[]);
    assert_eq!(a.verdict, Verdict::Pass, "{:?}", a.reasons);
    let again = judged(&spec, &[]);
    assert_eq!(a.sweep, again.sweep, "same request, same curves");
    let rows = &a.sweep.as_ref().expect("a sweep").curves[0].rows;
    assert_eq!(rows.len(), 16);
    let big = rows.last().expect("rows");
    assert!(
        big.busbw_gbps > 360.0 && big.busbw_gbps < 370.0,
        "{}",
        big.busbw_gbps
    );
    assert!(rows[0].time_micros < 10.0);
}

#[test]
fn a_slow_node_fails_its_floor() {
    let spec = NcclCheck {
        min_bus_bandwidth_gbps: Some(300),
        ..Default::default()
    };
    let r = judged(&spec, &[SimFault::Slow(0.5)]);
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.reasons[0].starts_with("nccl allReduce: bus bandwidth 18"),
        "{:?}",
        r.reasons
    );
}

#[test]
fn a_wrong_result_names_the_rank_collective_size_and_offset() {
    let r = judged(&NcclCheck::default(), &[SimFault::WrongResult { rank: 1 }]);
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(r.reasons[0].starts_with("nccl: GPU1 (rank 1) received 1 wrong element in allReduce 8 B out-of-place, first at byte offset 0x"), "{:?}", r.reasons);
    assert_eq!(crate::checks::nccl::judge::failed_gpus(&r), [1]);
}

#[test]
fn shm_fallback_fails_on_an_nvlink_node() {
    let r = judged(&NcclCheck::default(), &[SimFault::ShmFallback]);
    assert_eq!(r.verdict, Verdict::Fail);
    assert_any_contains(
        &r.reasons,
        "fell back from NVLink peer-to-peer: GPU0->GPU1 via SHM (24 connections)",
    );
}

#[test]
fn a_hang_is_an_error_within_the_timeout() {
    let spec = NcclCheck {
        timeout: "50ms".parse().expect("a duration"),
        ..Default::default()
    };
    let started = Instant::now();
    let r = judged(&spec, &[SimFault::Hang]);
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r.verdict, Verdict::Error);
    assert_eq!(
        r.reasons,
        [
            "nccl allReduce 8 B out-of-place (warm-up): not complete after 50ms on rank 0 (GPU0); the communicators were aborted"
        ]
    );
}

#[test]
fn a_stop_ends_a_hang_at_once() {
    let spec = NcclCheck {
        timeout: "1h".parse().expect("a duration"),
        ..Default::default()
    };
    let stop = AtomicBool::new(true);
    let ctl = RunControl::new(&stop, &|_, _| {});
    let started = Instant::now();
    let out = in_process("H100", &[SimFault::Hang], &request(&spec, 2), &ctl);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        out.sweep.ok().and_then(|s| s.abort).map(|a| a.cause),
        Some(AbortCause::Stopped)
    );
}

#[test]
fn transports_adds_a_p2p_off_sweep_on_shm() {
    let spec = NcclCheck {
        transports: true,
        collectives: Collective::ALL.to_vec(),
        ..Default::default()
    };
    let r = judged(&spec, &[]);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    let off = r.p2p_off.expect("a P2P-off sweep");
    assert_eq!(
        off.transport.map(|t| t.kinds),
        Some(vec!["SHM".to_string()])
    );
    assert_eq!(off.curves.len(), 5);
    let a2a = &off.curves[4];
    assert!(a2a.rows.iter().all(|r| r.in_place_time_micros.is_none()));
}
