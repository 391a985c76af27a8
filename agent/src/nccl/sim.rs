//! The simulated node's NCCL (tests and demos only): deterministic curves from a latency plus
//! size-over-bandwidth model per GPU model, and planted faults (slow, wrong result on a rank,
//! hang, SHM fallback) that take the same paths as the real ones.
//!
//! The nccl check's simulated node and the training check's use it. The
//! simulated sweep takes the real sweep's way ([`super::run_with`]): a private run
//! directory under the temporary directory, a `libnccl.so` link in it to the NCCL the simulator
//! stands for (a runtime-only install, [`library`]; the link dangles, nothing loads it), and
//! each sweep in a child process of the agent behind the hidden `nccl-sweep` subcommand, under
//! the same silence limit. The request carries [`SimSweep`], so the child runs
//! [`sweep_process`] instead of NCCL: it finds the link on `LD_LIBRARY_PATH` as the loader
//! would, writes the `NCCL INFO` lines NCCL would to `NCCL_DEBUG_FILE` (the transport it
//! "chose": P2P, or SHM under `NCCL_P2P_DISABLE=1` or a planted fallback), and the agent reads
//! the transport from that file as it does for real.

use std::path::Path;
use std::time::{Duration, Instant};

use gpuval_crds::Collective;
use serde::{Deserialize, Serialize};

use super::bandwidth::{Layout, bus_factor, human_bytes};
use super::library::{self, Found};
use super::outcome::{
    Abort, AbortCause, CurveOutcome, NcclOutcome, Phase, RankMismatch, RowOutcome, SweepOutcome,
};
use super::request::{NcclRequest, SweepRequest};
use crate::backend::BackendError;
use crate::run_control::RunControl;

/// The NCCL version simulated nodes report.
pub const SIM_VERSION: &str = "2.28.3";
/// Where the simulated node's NCCL "is": no file is there, and the `libnccl.so` link the check
/// makes to it dangles (the simulator loads nothing).
pub const SIM_LIBRARY: &str = "/simulated/nccl/libnccl.so.2";
/// How often a simulated hang looks at the stop flag.
const HANG_POLL: Duration = Duration::from_millis(10);

/// A fault planted in the simulated check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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

/// What a sweep process of the simulated node simulates: the GPU model (`H100`, `H200`,
/// `A100`) and the planted faults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimSweep {
    pub model: String,
    pub faults: Vec<SimFault>,
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

/// The NCCL the simulated node finds: a runtime-only install (`libnccl.so.2` alone, as
/// Debian's `libnccl2`), which the check links as `libnccl.so` in each run directory.
pub fn library() -> Found {
    Found {
        path: Some(SIM_LIBRARY.into()),
        version: Some(format!("{SIM_VERSION}, simulated")),
        needs_link: true,
    }
}

/// Runs the simulated check on a node of `gpus` GPUs of `model` (`H100`, `H200`, `A100`): each
/// sweep in a child process of the agent, as on real GPUs.
pub fn run(
    gpus: u32,
    model: &str,
    faults: &[SimFault],
    req: &NcclRequest,
    ctl: &RunControl<'_>,
) -> Result<NcclOutcome, BackendError> {
    if (gpus as usize) < req.gpus.len() {
        return Err(BackendError::NoGpu(format!(
            "{} ranks asked for, the simulated node has {gpus} GPUs",
            req.gpus.len()
        )));
    }
    let mut req = req.clone();
    req.sweep.simulated = Some(SimSweep {
        model: model.to_string(),
        faults: faults.to_vec(),
    });
    let exe = crate::worker::agent_exe()?;
    super::run_with(&exe, &library(), &req, ctl)
}

/// The sweep process's side (behind `nccl-sweep`): finds `libnccl.so` on `LD_LIBRARY_PATH`
/// as the loader would, writes NCCL's log to `NCCL_DEBUG_FILE` and runs the sweep.
pub fn sweep_process(
    sim: &SimSweep,
    s: &SweepRequest,
    ctl: &RunControl<'_>,
) -> Result<SweepOutcome, BackendError> {
    let started = Instant::now();
    require_link(std::env::var("LD_LIBRARY_PATH").ok().as_deref())?;
    let p2p_off = std::env::var("NCCL_P2P_DISABLE").is_ok_and(|v| v.trim() == "1");
    let shm = p2p_off || sim.faults.contains(&SimFault::ShmFallback);
    if let Some(file) = std::env::var_os("NCCL_DEBUG_FILE") {
        write_log(Path::new(&file), &nccl_log(&sim.model, s.ranks, shm));
    }
    let mut out = sweep(sim, s, ctl, shm);
    out.seconds = started.elapsed().as_secs_f64();
    Ok(out)
}

/// The loader's view: a `libnccl.so` in one of the `LD_LIBRARY_PATH` directories (the link
/// the check made; its target need not exist), else the error the real sweep gives.
pub(crate) fn require_link(library_path: Option<&str>) -> Result<(), BackendError> {
    let linked = library_path
        .unwrap_or("")
        .split(':')
        .filter(|d| !d.is_empty())
        .any(|d| {
            Path::new(d)
                .join(library::DEV_NAME)
                .symlink_metadata()
                .is_ok()
        });
    if linked {
        Ok(())
    } else {
        Err(BackendError::MissingLibrary {
            library: format!("NCCL ({})", library::RUNTIME_NAME),
            hint: library::link_hint(Path::new(SIM_LIBRARY)),
        })
    }
}

/// Writes the log where NCCL would; NCCL itself goes on without its file, and so does this.
pub(crate) fn write_log(file: &Path, text: &str) {
    if let Err(e) = std::fs::write(file, text) {
        tracing::warn!(file = %file.display(), error = %e, "simulated NCCL: writing the debug file failed");
    }
}

/// The `NCCL INFO` lines NCCL writes of a communicator of `ranks` on one node: its version,
/// a ring over the ranks on every channel through the transport it chose, the channel count.
pub fn nccl_log(model: &str, ranks: u32, shm: bool) -> String {
    let (_, _, channels) = fabric(model, shm);
    let via = if shm {
        "SHM/direct/direct"
    } else {
        "P2P/CUMEM/read"
    };
    let pid = std::process::id();
    let line = |rank: u32, msg: &str| format!("gpuval-sim:{pid}:{pid} [{rank}] NCCL INFO {msg}\n");
    let n = ranks.max(1);
    let mut log = line(
        0,
        &format!("NCCL version {SIM_VERSION}+cuda12.8 (simulated)"),
    );
    if n > 1 {
        for channel in 0..channels {
            for k in 0..n {
                let to = (k + 1) % n;
                log.push_str(&line(
                    k,
                    &format!("Channel {channel:02}/0 : {k}[{k}] -> {to}[{to}] via {via}"),
                ));
            }
        }
    }
    for k in 0..n {
        log.push_str(&line(
            k,
            &format!("{channels} coll channels, {channels} collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer"),
        ));
    }
    log
}

/// One sweep of the simulated node, `shm` the transport.
pub(crate) fn sweep(
    sim: &SimSweep,
    s: &SweepRequest,
    ctl: &RunControl<'_>,
    shm: bool,
) -> SweepOutcome {
    let faults = &sim.faults;
    let ranks = u64::from(s.ranks.max(1));
    let (bw, lat_us, _) = fabric(&sim.model, shm);
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
        ..Default::default()
    };
    if faults.contains(&SimFault::Hang) {
        out.abort = Some(hang(s, ctl));
        return out;
    }
    for (i, &c) in s.collectives.iter().enumerate() {
        let rows = curve(
            s,
            c,
            ranks,
            bw * slow,
            lat_us,
            wrong_rank,
            &mut out.mismatches,
        );
        ctl.progress(
            (i + 1) as f64 / s.collectives.len() as f64,
            &format!("{c} simulated"),
        );
        out.curves.push(CurveOutcome {
            collective: c,
            rows,
        });
    }
    out
}

/// One collective's rows at `bus_gbps`, with the wrong elements of `wrong_rank`.
fn curve(
    s: &SweepRequest,
    c: Collective,
    ranks: u64,
    bus_gbps: f64,
    lat_us: f64,
    wrong_rank: Option<u32>,
    mismatches: &mut Vec<RankMismatch>,
) -> Vec<RowOutcome> {
    let mut rows = Vec::new();
    for &size in &s.sizes {
        let l = Layout::new(c, size, s.dtype.size(), ranks);
        if l.bytes() == 0 {
            continue;
        }
        let secs = seconds(&l, bus_gbps, lat_us);
        let in_place = l.has_in_place().then_some(secs * 1.01);
        let mut wrong = 0;
        if let Some(rank) = wrong_rank {
            let elements = (l.recv / 1000).max(1);
            let placements = if in_place.is_some() { 2 } else { 1 };
            wrong = elements * placements;
            for ip in [false, true].into_iter().take(placements as usize) {
                mismatches.push(RankMismatch {
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
    rows
}

/// Seconds per collective: the small-message time plus the bus traffic at the bus bandwidth.
fn seconds(l: &Layout, bus_gbps: f64, lat_us: f64) -> f64 {
    let bus_bytes = l.algorithm_bytes() as f64 * bus_factor(l.collective, l.ranks);
    lat_us * 1e-6 + bus_bytes / (bus_gbps.max(1e-3) * 1e9)
}

/// Blocks like a collective that never completes, until the timeout or a stop.
fn hang(s: &SweepRequest, ctl: &RunControl<'_>) -> Abort {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_names_the_transport_nccl_chose_as_nccl_writes_it() {
        let p2p = super::super::transport::parse(&nccl_log("H200", 2, false));
        assert_eq!(p2p.version.as_deref(), Some(SIM_VERSION));
        assert_eq!(p2p.channels, Some(24));
        assert_eq!(p2p.kinds(), ["P2P/CUMEM"]);
        assert_eq!(p2p.connections.len(), 48, "24 channels, a ring of two");
        let shm = super::super::transport::parse(&nccl_log("A100", 4, true));
        assert_eq!(
            (shm.kinds(), shm.channels),
            (vec!["SHM".to_string()], Some(16))
        );
        assert!(shm.warnings.is_empty());
    }

    #[test]
    fn the_sweep_process_needs_the_library_link_on_its_path() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = format!("/nonexistent:{}", dir.path().display());
        let e = require_link(Some(&path)).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("NCCL (libnccl.so.2) is not available")),
            "{e:?}"
        );
        library::make_link(&library(), dir.path()).expect("a dangling link is made");
        assert!(require_link(Some(&path)).is_ok());
        assert!(require_link(None).is_err());
        assert_eq!(
            library().describe(),
            "/simulated/nccl/libnccl.so.2 (2.28.3, simulated), linked as libnccl.so"
        );
    }
}
