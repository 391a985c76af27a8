//! The simulated NCCL check (tests and demos only): deterministic curves from a latency plus
//! size-over-bandwidth model per GPU model, and planted faults (slow, wrong result on a rank,
//! hang, SHM fallback) that take the same paths as the real ones.

use std::time::{Duration, Instant};

use gpuval_crds::Collective;

use crate::backend::BackendError;
use crate::nccl::bandwidth::{Layout, bus_factor, human_bytes};
use crate::nccl::outcome::{
    Abort, AbortCause, CurveOutcome, NcclOutcome, Phase, RankMismatch, RowOutcome, SweepOutcome,
};
use crate::nccl::request::NcclRequest;
use crate::nccl::transport::{Connection, TransportClass, TransportSummary};
use crate::run_control::RunControl;

/// The NCCL version simulated nodes report.
pub const SIM_VERSION: &str = "2.28.3";
/// How often a simulated hang looks at the stop flag.
const HANG_POLL: Duration = Duration::from_millis(10);

/// A fault planted in the simulated check.
#[derive(Debug, Clone, PartialEq)]
pub enum SimFault {
    /// Bus bandwidth scaled by this factor.
    Slow(f64),
    /// This rank receives wrong elements in every collective.
    WrongResult { rank: u32 },
    /// The first collective never completes: blocks until the timeout (or a stop), then the
    /// communicators are aborted and the check reports Error.
    Hang,
    /// The communicator connects the GPUs through host shared memory instead of NVLink.
    ShmFallback,
}

/// Link figures of a model: (bus bandwidth GB/s, small-message time µs, channels).
fn fabric(model: &str, shm: bool) -> (f64, f64, u32) {
    let (bw, lat, channels) = match model.to_ascii_uppercase().as_str() {
        m if m.contains("A100") => (230.0, 11.0, 16),
        _ => (370.0, 9.0, 24),
    };
    if shm {
        (21.0, 15.0, channels)
    } else {
        (bw, lat, channels)
    }
}

/// Runs the simulated check on a node of `gpus` GPUs of `model` (`H100`, `H200`, `A100`).
pub fn run(
    gpus: u32,
    model: &str,
    faults: &[SimFault],
    req: &NcclRequest,
    ctl: &RunControl<'_>,
) -> Result<NcclOutcome, BackendError> {
    let started = Instant::now();
    if (gpus as usize) < req.gpus.len() {
        return Err(BackendError::NoGpu(format!(
            "{} ranks asked for, the simulated node has {gpus} GPUs",
            req.gpus.len()
        )));
    }
    let main = sweep(model, faults, req, ctl, false);
    let p2p_off = req.transports.then(|| sweep(model, faults, req, ctl, true));
    Ok(NcclOutcome {
        gpus: req.gpus.iter().map(|g| g.index).collect(),
        library: Some(format!("libnccl.so.2 ({SIM_VERSION}, simulated)")),
        sweep: main,
        p2p_off,
        notes: req.notes.clone(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn sweep(
    model: &str,
    faults: &[SimFault],
    req: &NcclRequest,
    ctl: &RunControl<'_>,
    p2p_off: bool,
) -> Result<SweepOutcome, BackendError> {
    let s = &req.sweep;
    let ranks = u64::from(s.ranks.max(1));
    let shm = p2p_off || faults.contains(&SimFault::ShmFallback);
    let (bw, lat_us, channels) = fabric(model, shm);
    let slow: f64 = faults
        .iter()
        .filter_map(|f| {
            if let SimFault::Slow(x) = f {
                Some(*x)
            } else {
                None
            }
        })
        .product();
    let wrong_rank = faults.iter().find_map(|f| {
        if let SimFault::WrongResult { rank } = f {
            Some(*rank)
        } else {
            None
        }
    });
    let mut out = SweepOutcome {
        nccl_version: Some(SIM_VERSION.into()),
        transport: Some(transport(s.ranks, channels, shm)),
        ..Default::default()
    };
    if faults.contains(&SimFault::Hang) {
        out.abort = Some(hang(req, ctl));
        return Ok(out);
    }
    for (i, &c) in s.collectives.iter().enumerate() {
        let mut rows = Vec::new();
        for &size in &s.sizes {
            let l = Layout::new(c, size, s.dtype.size(), ranks);
            if l.bytes() == 0 {
                continue;
            }
            let secs = seconds(&l, bw * slow, lat_us);
            let in_place = l.has_in_place().then_some(secs * 1.01);
            let mut wrong = 0;
            if let Some(rank) = wrong_rank {
                let elements = (l.recv / 1000).max(1);
                wrong = elements * if in_place.is_some() { 2 } else { 1 };
                for ip in [false, true]
                    .into_iter()
                    .take(if in_place.is_some() { 2 } else { 1 })
                {
                    out.mismatches.push(RankMismatch {
                        rank,
                        collective: c,
                        bytes: l.bytes(),
                        in_place: ip,
                        elements,
                        first_offset: (l.recv / 3) * l.element,
                    });
                }
            }
            rows.push(RowOutcome {
                bytes: l.bytes(),
                count: l.count,
                seconds: secs,
                in_place_seconds: in_place,
                wrong,
            });
        }
        ctl.progress(
            (i + 1) as f64 / s.collectives.len() as f64,
            &format!("{c} simulated"),
        );
        out.curves.push(CurveOutcome {
            collective: c,
            rows,
        });
    }
    Ok(out)
}

/// Seconds per collective: the small-message time plus the bus traffic at the bus bandwidth.
fn seconds(l: &Layout, bus_gbps: f64, lat_us: f64) -> f64 {
    let bus_bytes = l.algorithm_bytes() as f64 * bus_factor(l.collective, l.ranks);
    lat_us * 1e-6 + bus_bytes / (bus_gbps.max(1e-3) * 1e9)
}

/// Blocks like a collective that never completes, until the timeout or a stop.
fn hang(req: &NcclRequest, ctl: &RunControl<'_>) -> Abort {
    let s = &req.sweep;
    let timeout = s.timeout();
    let deadline = Instant::now() + timeout;
    while !ctl.stopped() && Instant::now() < deadline {
        std::thread::sleep(HANG_POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
    let collective = s
        .collectives
        .first()
        .copied()
        .unwrap_or(Collective::AllReduce);
    let bytes = s
        .sizes
        .iter()
        .map(|b| Layout::new(collective, *b, s.dtype.size(), u64::from(s.ranks)).bytes())
        .find(|b| *b > 0)
        .unwrap_or(0);
    let cause = if ctl.stopped() {
        AbortCause::Stopped
    } else {
        AbortCause::Timeout {
            seconds: timeout.as_secs_f64(),
        }
    };
    tracing::debug!(collective = %collective, bytes = %human_bytes(bytes), "simulated hang ended");
    Abort {
        collective,
        bytes,
        in_place: false,
        phase: Phase::WarmUp,
        rank: 0,
        cause,
    }
}

/// A ring over the ranks on every channel, as NCCL would log it.
fn transport(ranks: u32, channels: u32, shm: bool) -> TransportSummary {
    let (via, class) = if shm {
        ("SHM", TransportClass::Shm)
    } else {
        ("P2P/CUMEM", TransportClass::P2p)
    };
    let n = ranks.max(1);
    let connections = if n < 2 {
        Vec::new()
    } else {
        (0..channels)
            .flat_map(|channel| {
                (0..n).map(move |k| Connection {
                    channel,
                    from: k,
                    to: (k + 1) % n,
                    via: via.to_string(),
                    class,
                })
            })
            .collect()
    };
    TransportSummary {
        version: Some(SIM_VERSION.into()),
        channels: Some(channels),
        connections,
        warnings: Vec::new(),
        ib_devices: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::GpuInfo;
    use crate::checks::nccl::judge::{JudgeContext, judge};
    use crate::judge::testing::assert_any_contains;
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

    fn judged(spec: &NcclCheck, faults: &[SimFault]) -> gpuval_crds::NcclResult {
        let stop = AtomicBool::new(false);
        let ctl = RunControl::new(&stop, &|_, _| {});
        let out = run(2, "H200", faults, &request(spec, 2), &ctl).expect("a simulated outcome");
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
        let spec = super::super::judge::with_floors(300, 20);
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
        let out = run(2, "H100", &[SimFault::Hang], &request(&spec, 2), &ctl).expect("an outcome");
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
}
