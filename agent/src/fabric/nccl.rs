//! The real NCCL group across nodes: this node's GPUs as ranks of one communicator over every
//! member's GPUs, through the NCCL check's engine in a child process. The child gets
//! `NCCL_COMM_ID` (the group host's address, one port above the rendezvous): NCCL's own
//! bootstrap then needs no MPI and no exchanged id; the host's rank 0 opens it.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use gpuval_crds::fabric::{FabricError, FabricErrorKind, FabricNccl, NcclTransport};
use gpuval_crds::{NcclDtype, NodeReport};

use super::{Assignment, NcclFigures};
use crate::backend::{BackendError, Side};
use crate::nccl::bandwidth::Layout;
use crate::nccl::outcome::{AbortCause, SweepOutcome};
use crate::nccl::request::{NcclRequest, RankGpu, SweepRequest, WorldSlot};
use crate::nccl::transport::{TransportClass, TransportSummary};
use crate::run_control::RunControl;

/// Untimed collectives before the timed ones.
const WARMUP: u32 = 5;
/// The longest one batch of collectives may take (NCCL aborts the communicator then).
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the sweep process may stay silent while it starts (kernel compilation and the
/// communicator's setup: seconds when every member is there).
const SETUP_ALLOWANCE: Duration = Duration::from_secs(30);

/// The engine's request for this member of `a`: its GPUs are ranks
/// `first_rank..first_rank + gpus` of the group's `world` ranks.
pub fn request(
    a: &Assignment,
    settings: &FabricNccl,
    gpus: &[RankGpu],
    member_gpus: &[u32],
    env: &[(String, String)],
) -> Result<NcclRequest, FabricError> {
    let local = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
    let planned = member_gpus.get(a.rank).copied();
    if planned.is_some_and(|p| p != local) {
        return Err(local_error(format!(
            "this node has {local} GPU(s) but the round counts {} for it",
            planned.unwrap_or(0)
        )));
    }
    let counts: Vec<u32> = if member_gpus.len() == a.nodes.len() {
        member_gpus.to_vec()
    } else {
        // No counts in the plan: every member is taken to have as many GPUs as this one.
        vec![local; a.nodes.len()]
    };
    let first_rank: u32 = counts.iter().take(a.rank).sum();
    let size: u32 = counts.iter().sum();
    let mut vars = env.to_vec();
    vars.push(("NCCL_COMM_ID".into(), bootstrap_address(&a.rendezvous)?));
    let timeout = a
        .deadline
        .saturating_duration_since(Instant::now())
        .min(BATCH_TIMEOUT);
    Ok(NcclRequest {
        gpus: gpus.to_vec(),
        sweep: SweepRequest {
            ranks: local,
            collectives: vec![settings.collective],
            sizes: vec![u64::try_from(settings.bytes).unwrap_or(1 << 30)],
            dtype: NcclDtype::Bf16,
            iterations: u32::try_from(settings.iterations.max(1)).unwrap_or(1),
            warmup: WARMUP,
            timeout_ms: u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1000),
            world: Some(WorldSlot { size, first_rank }),
            simulated: None,
        },
        transports: false,
        log_dir: None,
        notes: Vec::new(),
        env: vars,
        setup_allowance: Some(SETUP_ALLOWANCE),
    })
}

/// `host:port` of NCCL's bootstrap: the rendezvous host, one port up.
pub fn bootstrap_address(rendezvous: &str) -> Result<String, FabricError> {
    let bad = || {
        local_error(format!(
            "the rendezvous address {rendezvous:?} is not host:port"
        ))
    };
    let (host, port) = rendezvous.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let next = port.checked_add(1).ok_or_else(bad)?;
    Ok(format!("{host}:{next}"))
}

fn local_error(message: String) -> FabricError {
    fabric_error(FabricErrorKind::Local, message)
}

fn fabric_error(kind: FabricErrorKind, message: String) -> FabricError {
    FabricError { kind, message }
}

/// Runs the request in a sweep process and reads this member's bus bandwidth; setting `stop`
/// ends the sweep process (another member of the group failed).
pub fn run(
    req: &NcclRequest,
    expect: Option<NcclTransport>,
    stop: &AtomicBool,
) -> Result<NcclFigures, FabricError> {
    let progress = |_: f64, note: &str| tracing::debug!(note, "fabric NCCL");
    let ctl = RunControl::new(stop, &progress);
    let out = crate::nccl::run(req, &ctl).map_err(|e| local_error(e.to_string()))?;
    match out.sweep {
        Ok(s) => {
            check_transport(expect, s.transport.as_ref())?;
            figures(req, &s)
        }
        Err(e) => Err(sweep_failed(&e)),
    }
}

/// What a sweep process that gave no figures says of this member, by the error's kind (never
/// its words): NCCL's setup on the side its result put it on; a sweep stopped for silence
/// stalled; a setup that never returned waited for its peers; anything else is this side's.
pub fn sweep_failed(e: &BackendError) -> FabricError {
    let kind = match e {
        BackendError::CollectiveSetup {
            side: Side::Peer, ..
        } => FabricErrorKind::Peer,
        BackendError::Silent(_) => FabricErrorKind::Stalled,
        BackendError::Hung(_) => FabricErrorKind::Timeout,
        BackendError::Stopped => FabricErrorKind::Aborted,
        BackendError::CollectiveSetup {
            side: Side::Own, ..
        }
        | BackendError::MissingLibrary { .. }
        | BackendError::NoGpu(_)
        | BackendError::Gpu { .. }
        | BackendError::NoSuchGpu(_)
        | BackendError::TempDir { .. }
        | BackendError::Other(_) => FabricErrorKind::Local,
    };
    fabric_error(kind, e.to_string())
}

/// The kind of a sweep that was cut short: its collectives timed out (waiting on a peer), NCCL
/// reported an error on the communicator (on the side its result and words put it), a CUDA call
/// failed on this side, or it was stopped.
fn abort_kind(cause: &AbortCause) -> FabricErrorKind {
    match cause {
        AbortCause::Timeout { .. } => FabricErrorKind::Timeout,
        AbortCause::NcclError {
            side: Side::Peer, ..
        } => FabricErrorKind::Peer,
        AbortCause::NcclError {
            side: Side::Own, ..
        } => FabricErrorKind::Local,
        AbortCause::Cuda { .. } => FabricErrorKind::Local,
        AbortCause::Stopped => FabricErrorKind::Aborted,
    }
}

/// Whether this node's ranks used the transport the validation expects between nodes (read
/// from NCCL's log of the run): a rank that used another fails this node, named with what it
/// used. Without a log to read, nothing can be told (a warning).
pub fn check_transport(
    expect: Option<NcclTransport>,
    summary: Option<&TransportSummary>,
) -> Result<(), FabricError> {
    let Some(want) = expect else {
        return Ok(());
    };
    let net: Vec<&crate::nccl::transport::Connection> = summary
        .map(|s| {
            s.connections
                .iter()
                .filter(|c| c.class == TransportClass::Net)
                .collect()
        })
        .unwrap_or_default();
    if net.is_empty() {
        tracing::warn!(
            expected = want.nccl_name(),
            "fabric NCCL: no network channel in NCCL's log; the transport is not checked"
        );
        return Ok(());
    }
    let mut other: Vec<(&str, u32)> = net
        .iter()
        .filter(|c| !c.via.starts_with(want.nccl_name()))
        .map(|c| (c.via.as_str(), c.from))
        .collect();
    if other.is_empty() {
        return verbs_link_layer(want, summary);
    }
    other.sort_unstable();
    other.dedup();
    let used: Vec<String> = other
        .iter()
        .map(|(via, rank)| format!("rank {rank} used {via}"))
        .collect();
    Err(local_error(format!(
        "NCCL between nodes: {} where fabric.nccl.expectTransport is {want:?} ({})",
        used.join(", "),
        want.nccl_name()
    )))
}

/// With IB or RoCE expected and NCCL on its verbs transport: whether the devices it opened
/// have that link layer (NCCL's channel lines say `NET/IB` for both; its `NET/IB : Using` line
/// tells them apart). Nothing to tell without that line.
fn verbs_link_layer(
    want: NcclTransport,
    summary: Option<&TransportSummary>,
) -> Result<(), FabricError> {
    let layer = match want {
        NcclTransport::IB => "IB",
        NcclTransport::RoCE => "RoCE",
        NcclTransport::Socket => return Ok(()),
    };
    let devices = summary.map(|s| s.ib_devices.as_slice()).unwrap_or_default();
    let other: Vec<String> = devices
        .iter()
        .filter(|(_, l)| l != layer)
        .map(|(d, l)| format!("{d} is {l}"))
        .collect();
    if other.is_empty() {
        return Ok(());
    }
    Err(local_error(format!(
        "NCCL's verbs devices: {} where fabric.nccl.expectTransport is {want:?}",
        other.join(", ")
    )))
}

/// This member's figures from its sweep: wrong data is this node's fault; an abort (a
/// timeout, an error NCCL reported) is the group's.
fn figures(req: &NcclRequest, s: &SweepOutcome) -> Result<NcclFigures, FabricError> {
    if let Some(m) = s.mismatches.first() {
        return Err(local_error(format!(
            "{} wrong element(s) received on this node's GPU rank {} ({})",
            m.elements, m.rank, m.collective
        )));
    }
    if let Some(a) = &s.abort {
        return Err(fabric_error(
            abort_kind(&a.cause),
            format!(
                "the collective was aborted: {:?} at rank {}",
                a.cause, a.rank
            ),
        ));
    }
    let sweep = &req.sweep;
    let row = s
        .curves
        .first()
        .and_then(|c| c.rows.last())
        .ok_or_else(|| {
            fabric_error(
                FabricErrorKind::Timeout,
                "the collective gave no timing".into(),
            )
        })?;
    let collective = sweep
        .collectives
        .first()
        .copied()
        .unwrap_or(gpuval_crds::Collective::AllReduce);
    let layout = Layout::new(
        collective,
        row.bytes,
        sweep.dtype.size(),
        u64::from(sweep.world_size()),
    );
    Ok(NcclFigures {
        bus_gbps: layout.busbw_gbps(row.seconds),
        seconds: s.seconds,
    })
}

/// Whether the GPU with NVML `index` and `uuid` is among `CUDA_VISIBLE_DEVICES` (indices or
/// UUIDs, comma-separated; unset: every GPU).
pub fn is_visible(visible: Option<&str>, index: u32, uuid: &str) -> bool {
    let Some(list) = visible else {
        return true;
    };
    list.split(',').map(str::trim).any(|v| {
        v.parse::<u32>().is_ok_and(|i| i == index) || (!v.is_empty() && uuid.starts_with(v))
    })
}

/// The real runner of a node whose checks produced `report`.
pub struct RealNccl {
    gpus: Vec<RankGpu>,
}

impl RealNccl {
    pub fn from_report(report: &NodeReport) -> Self {
        Self {
            gpus: report
                .gpus
                .iter()
                .map(|g| RankGpu {
                    index: u32::try_from(g.index).unwrap_or(0),
                    uuid: g.uuid.clone(),
                })
                .collect(),
        }
    }

    pub fn new(gpus: Vec<RankGpu>) -> Self {
        Self { gpus }
    }

    /// Runs this member's part of the group `a`.
    pub fn run_group(
        &self,
        a: &Assignment,
        settings: &FabricNccl,
        member_gpus: &[u32],
        env: &[(String, String)],
        stop: &AtomicBool,
    ) -> Result<NcclFigures, FabricError> {
        if self.gpus.is_empty() {
            return Err(local_error("this node has no GPU to take part with".into()));
        }
        let req = request(a, settings, &self.gpus, member_gpus, env)?;
        run(&req, settings.expect_transport, stop)
    }
}

impl super::NcclGroup for RealNccl {
    fn run(
        &self,
        a: &Assignment,
        settings: &FabricNccl,
        env: &[(String, String)],
        link: &mut super::rendezvous::Link,
    ) -> Result<NcclFigures, FabricError> {
        // NCCL's own bootstrap (NCCL_COMM_ID) carries the communicator; the control channel
        // stops every member as soon as one fails.
        super::watch::together(a, link, |stop| {
            self.run_group(a, settings, &a.gpus, env, stop)
        })
    }
    fn simulated(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::Collective;
    use gpuval_crds::fabric::FabricKind;

    fn assignment(rank: usize) -> Assignment {
        Assignment {
            round: 1,
            group: 0,
            kind: FabricKind::Nccl,
            nodes: vec!["a".into(), "b".into(), "c".into()],
            rank,
            rendezvous: "10.1.2.3:29400".into(),
            gpus: Vec::new(),
            deadline: Instant::now() + Duration::from_secs(600),
            rail: None,
        }
    }

    fn gpus(n: u32) -> Vec<RankGpu> {
        (0..n)
            .map(|i| RankGpu {
                index: i,
                uuid: format!("GPU-{i}"),
            })
            .collect()
    }

    fn settings() -> FabricNccl {
        FabricNccl {
            collective: Collective::AllReduce,
            bytes: 1 << 30,
            iterations: 20,
            min_bus_bandwidth_gbps: 350,
            expect_transport: None,
            rails: Vec::new(),
        }
    }

    #[test]
    fn a_member_takes_its_slot_of_the_world_and_the_bootstrap_port_above() {
        let env = [("NCCL_IB_HCA".to_string(), "mlx5".to_string())];
        let r = request(&assignment(1), &settings(), &gpus(8), &[8, 8, 4], &env).unwrap();
        assert_eq!(
            r.sweep.world,
            Some(WorldSlot {
                size: 20,
                first_rank: 8
            })
        );
        assert_eq!(r.sweep.ranks, 8);
        assert_eq!(r.sweep.global_rank(3), 11);
        assert_eq!(r.sweep.sizes, vec![1 << 30]);
        assert!(
            r.env
                .contains(&("NCCL_COMM_ID".into(), "10.1.2.3:29401".into()))
        );
        assert!(r.env.contains(&env[0]));
        // Without counts in the plan, every member is taken to be like this one.
        let r = request(&assignment(2), &settings(), &gpus(2), &[], &[]).unwrap();
        assert_eq!(
            r.sweep.world,
            Some(WorldSlot {
                size: 6,
                first_rank: 4
            })
        );
    }

    #[test]
    fn a_node_with_other_gpus_than_planned_fails_on_its_own() {
        let e = request(&assignment(0), &settings(), &gpus(7), &[8, 8, 8], &[]).unwrap_err();
        assert_eq!(e.kind, FabricErrorKind::Local);
        assert!(e.message.contains("7 GPU(s)"), "{}", e.message);
    }

    #[test]
    fn visible_devices_pick_the_ranks_gpus() {
        assert!(is_visible(None, 3, "GPU-abc"));
        assert!(is_visible(Some("1"), 1, "GPU-abc"));
        assert!(!is_visible(Some("1"), 0, "GPU-abc"));
        assert!(is_visible(Some("0, GPU-ab"), 5, "GPU-abc"));
        assert!(!is_visible(Some(""), 0, "GPU-abc"));
    }

    #[test]
    fn a_sweep_that_failed_is_judged_by_its_kind_not_its_words() {
        let kind = |e: BackendError| sweep_failed(&e).kind;
        // Whatever the words, the kind decides.
        for words in [
            "remote process exited",
            "no interface found",
            "anything at all",
        ] {
            let setup = |side| BackendError::CollectiveSetup {
                message: words.into(),
                side,
            };
            assert_eq!(kind(setup(Side::Peer)), FabricErrorKind::Peer, "{words}");
            assert_eq!(kind(setup(Side::Own)), FabricErrorKind::Local, "{words}");
            assert_eq!(
                kind(BackendError::Silent(words.into())),
                FabricErrorKind::Stalled
            );
            assert_eq!(
                kind(BackendError::Hung(words.into())),
                FabricErrorKind::Timeout
            );
            assert_eq!(
                kind(BackendError::Other(words.into())),
                FabricErrorKind::Local
            );
        }
        assert_eq!(kind(BackendError::Stopped), FabricErrorKind::Aborted);
        assert_eq!(
            abort_kind(&AbortCause::Timeout { seconds: 60.0 }),
            FabricErrorKind::Timeout
        );
        assert_eq!(
            abort_kind(&AbortCause::Cuda {
                message: "x".into()
            }),
            FabricErrorKind::Local
        );
        let nccl = |side| AbortCause::NcclError {
            message: "x".into(),
            side,
        };
        assert_eq!(abort_kind(&nccl(Side::Peer)), FabricErrorKind::Peer);
        assert_eq!(abort_kind(&nccl(Side::Own)), FabricErrorKind::Local);
    }

    #[test]
    fn a_rank_that_fell_back_to_sockets_is_named_with_what_it_used() {
        let log = "h:1:2 [0] NCCL INFO Channel 00/0 : 3[0] -> 4[0] [send] via NET/Socket/0\n\
                   h:1:2 [0] NCCL INFO Channel 01/0 : 3[0] -> 4[0] [send] via NET/Socket/0\n\
                   h:1:2 [1] NCCL INFO Channel 00/0 : 2[1] -> 3[0] via P2P/CUMEM/read\n";
        let summary = crate::nccl::transport::parse(log);
        let e = check_transport(Some(NcclTransport::IB), Some(&summary)).unwrap_err();
        assert_eq!(e.kind, FabricErrorKind::Local);
        assert!(
            e.message.contains("rank 3 used NET/Socket"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("expectTransport is IB (NET/IB)"),
            "{}",
            e.message
        );
        // What was expected, or nothing expected, or nothing to read: no failure.
        assert!(check_transport(Some(NcclTransport::Socket), Some(&summary)).is_ok());
        assert!(check_transport(None, Some(&summary)).is_ok());
        assert!(check_transport(Some(NcclTransport::RoCE), None).is_ok());
        let ib = crate::nccl::transport::parse(
            "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n",
        );
        assert!(check_transport(Some(NcclTransport::RoCE), Some(&ib)).is_ok());
        assert!(check_transport(Some(NcclTransport::Socket), Some(&ib)).is_err());
    }

    #[test]
    fn ib_and_roce_are_told_apart_by_the_devices_nccl_opened() {
        let log = "h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1:0/RoCE [RO]; OOB eth0:10.0.0.1<0>\n\
                   h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n";
        let summary = crate::nccl::transport::parse(log);
        assert_eq!(
            summary.ib_devices,
            [
                ("mlx5_0:1".to_string(), "IB".to_string()),
                ("mlx5_1:1".to_string(), "RoCE".to_string())
            ]
        );
        let e = check_transport(Some(NcclTransport::IB), Some(&summary)).unwrap_err();
        assert_eq!(e.kind, FabricErrorKind::Local);
        assert!(
            e.message
                .contains("mlx5_1:1 is RoCE where fabric.nccl.expectTransport is IB"),
            "{}",
            e.message
        );
        let e = check_transport(Some(NcclTransport::RoCE), Some(&summary)).unwrap_err();
        assert!(e.message.contains("mlx5_0:1 is IB"), "{}", e.message);
        let ib_only = crate::nccl::transport::parse(
            "h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>\n\
             h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n",
        );
        assert!(check_transport(Some(NcclTransport::IB), Some(&ib_only)).is_ok());
        assert!(check_transport(Some(NcclTransport::RoCE), Some(&ib_only)).is_err());
    }

    #[test]
    fn bad_rendezvous_addresses_are_named() {
        assert_eq!(bootstrap_address("[::1]:29400").unwrap(), "[::1]:29401");
        for bad in ["nohost", "h:port", "h:65535"] {
            let e = bootstrap_address(bad).unwrap_err();
            assert!(e.message.contains(bad), "{}", e.message);
        }
    }
}
