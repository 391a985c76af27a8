//! Judging the NCCL check: a hang or NCCL error is Error (naming collective, size and rank);
//! a wrong element fails the GPU that received it (rank, collective, size, first bad offset);
//! a communicator that fell back to SHM or the network on a node whose topology shows NVLink
//! fails; bus bandwidth at the largest size under the floor, or time at the smallest size over
//! the limit, fails. The floor is the spec's, else the measured profile table's, else the
//! node's own ([`crate::link_floors`]: its measured p2p, or its NVLink or PCIe links), so any
//! model and GPU count has one; the report lists each floor with its source.

use gpuval_crds::{
    BandwidthFloor, Collective, NcclCheck, NcclCurve, NcclLink, NcclMismatch, NcclResult, NcclRow,
    NcclSweep, NcclTransport, Verdict,
};

use crate::backend::BackendError;
use crate::judge::{Code, Reason, Says, verdict_of};
use crate::link_floors::LinkFacts;
use crate::nccl::bandwidth::{Layout, human_bytes};
use crate::nccl::outcome::{Abort, AbortCause, NcclOutcome, SweepOutcome};
use crate::nccl::transport::{TransportClass, TransportSummary};

/// Bus bandwidth floors at the largest size of the default sweep (4 GiB), GB/s, by model
/// profile, GPU count and collective: set from the 2×H200 measurement
/// (`bench/results/2026-11-23-h200x2-nccl/`: 282–349 GB/s at 4 GiB over two runs), about 80 % of
/// the lowest healthy figure.
pub const PROFILE_FLOORS: &[(&str, usize, Collective, f64)] = &[
    ("H200", 2, Collective::AllReduce, 225.0),
    ("H200", 2, Collective::AllGather, 225.0),
    ("H200", 2, Collective::ReduceScatter, 225.0),
];
/// A profile floor applies only to a sweep that reaches this size.
const FLOOR_MIN_BYTES: u64 = 1 << 30;
/// Mismatch reasons listed one by one before the rest are counted.
const MAX_MISMATCH_REASONS: usize = 4;
/// Mismatch entries kept in the report.
const MAX_MISMATCHES: usize = 16;

/// What the judge needs besides the figures.
#[derive(Debug, Clone, Copy)]
pub struct JudgeContext<'a> {
    pub spec: &'a NcclCheck,
    /// The topology shows NVLink between every pair of the check's GPUs (or their model
    /// profile requires it): a communicator on SHM or the network fails.
    pub nvlink: bool,
    /// The model profile in force (`H200`), for the built-in floors.
    pub profile: Option<&'a str>,
    /// The node's links and its measured p2p one-way median, where floors come from when no
    /// profile floor covers this model and GPU count.
    pub facts: &'a LinkFacts,
    pub measured_p2p: Option<f64>,
}

/// The built-in floor for a collective on `ranks` GPUs of a profile.
pub fn profile_floor(profile: &str, ranks: usize, c: Collective) -> Option<f64> {
    PROFILE_FLOORS
        .iter()
        .find(|(p, n, coll, _)| *p == profile && *n == ranks && *coll == c)
        .map(|f| f.3)
}

/// Judges what the check measured.
pub fn judge(ctx: &JudgeContext<'_>, out: &NcclOutcome) -> NcclResult {
    let gpus: Vec<i32> = out.gpus.iter().map(|g| *g as i32).collect();
    let mut r = base(ctx.spec);
    r.gpus = gpus.clone();
    r.library = out.library.clone();
    r.notes = out.notes.clone();
    r.seconds = out.seconds;
    let mut findings: Vec<Reason> = Vec::new();
    match &out.sweep {
        Ok(s) => {
            r.nccl_version = version_of(s);
            r.floors = s
                .curves
                .iter()
                .filter_map(|c| {
                    let last = c.rows.last()?;
                    let (gbps, source) = floor_for(ctx, c.collective, gpus.len(), last.bytes)?;
                    Some(BandwidthFloor {
                        what: c.collective.to_string(),
                        gbps,
                        source,
                    })
                })
                .collect();
            r.sweep = Some(sweep_result(s, &gpus, ctx));
            findings.extend(sweep_findings(ctx, s, &gpus, false));
            if ctx.nvlink {
                findings.extend(
                    fallback_reason(s.transport.as_ref(), &gpus)
                        .map(|m| Code::NcclTransportFallback.says(m)),
                );
            }
            findings.extend(
                threshold_reasons(ctx, s, &gpus)
                    .into_iter()
                    .map(|m| Code::NcclBandwidthLow.says(m)),
            );
            r.mismatches.extend(mismatches(s, &gpus, false));
        }
        Err(e) => findings.push(crate::judge::error_reason_in("nccl", e)),
    }
    match &out.p2p_off {
        Some(Ok(s)) => {
            r.p2p_off = Some(sweep_result(s, &gpus, ctx));
            findings.extend(sweep_findings(ctx, s, &gpus, true));
            r.mismatches.extend(mismatches(s, &gpus, true));
            r.notes.push("the P2P-off sweep is checked for hangs and wrong results, not against bandwidth floors".into());
        }
        Some(Err(e)) => findings.push(crate::judge::error_reason_in("nccl (P2P off)", e)),
        None => {}
    }
    r.mismatches.truncate(MAX_MISMATCHES);
    r.verdict = verdict_of(&findings);
    r.reasons = findings;
    r
}

/// The result of a check that could not run.
pub fn errored(spec: &NcclCheck, err: &BackendError) -> NcclResult {
    NcclResult {
        verdict: Verdict::Error,
        reasons: vec![crate::judge::error_reason_in("nccl", err)],
        ..base(spec)
    }
}

/// The result of a check that does not apply (one GPU: nothing to communicate with).
pub fn skipped(spec: &NcclCheck, why: &str) -> NcclResult {
    NcclResult {
        verdict: Verdict::Skipped,
        notes: vec![why.to_string()],
        ..base(spec)
    }
}

/// NVML indices of the GPUs that received wrong elements (their GPU verdict should fail).
pub fn failed_gpus(r: &NcclResult) -> Vec<i32> {
    let mut g: Vec<i32> = r.mismatches.iter().map(|m| m.gpu).collect();
    g.sort_unstable();
    g.dedup();
    g
}

fn base(spec: &NcclCheck) -> NcclResult {
    NcclResult {
        dtype: spec.dtype,
        iterations: spec.iterations,
        warmup_iterations: spec.warmup_iterations,
        ..Default::default()
    }
}

fn version_of(s: &SweepOutcome) -> Option<String> {
    s.transport
        .as_ref()
        .and_then(|t| t.version.clone())
        .or_else(|| s.nccl_version.clone())
}

fn gpu_of(gpus: &[i32], rank: u32) -> i32 {
    gpus.get(rank as usize).copied().unwrap_or(rank as i32)
}

fn sweep_result(s: &SweepOutcome, gpus: &[i32], ctx: &JudgeContext<'_>) -> NcclSweep {
    let ranks = gpus.len().max(1) as u64;
    let elt = ctx.spec.dtype.size();
    let curves = s
        .curves
        .iter()
        .map(|c| NcclCurve {
            collective: c.collective,
            rows: c
                .rows
                .iter()
                .map(|row| {
                    let l = Layout::new(c.collective, row.bytes, elt, ranks);
                    let ip = row.in_place_seconds;
                    NcclRow {
                        bytes: row.bytes as i64,
                        count: row.count as i64,
                        time_micros: row.seconds * 1e6,
                        algbw_gbps: l.algbw_gbps(row.seconds),
                        busbw_gbps: l.busbw_gbps(row.seconds),
                        in_place_time_micros: ip.map(|t| t * 1e6),
                        in_place_algbw_gbps: ip.map(|t| l.algbw_gbps(t)),
                        in_place_busbw_gbps: ip.map(|t| l.busbw_gbps(t)),
                        wrong: row.wrong as i64,
                    }
                })
                .collect(),
        })
        .collect();
    NcclSweep {
        transport: s.transport.as_ref().map(|t| transport_result(t, gpus)),
        curves,
        error: s.abort.as_ref().map(|a| abort_reason(a, gpus)),
    }
}

fn transport_result(t: &TransportSummary, gpus: &[i32]) -> NcclTransport {
    NcclTransport {
        channels: t.channels.map(|c| c as i32),
        kinds: t.kinds(),
        links: t
            .links()
            .into_iter()
            .map(|((from, to, via), n)| NcclLink {
                from: gpu_of(gpus, from),
                to: gpu_of(gpus, to),
                via,
                connections: n as i32,
            })
            .collect(),
    }
}

/// `allReduce 256 MiB in-place (timed): not complete after 60s on rank 1 (GPU1); the
/// communicators were aborted`.
pub fn abort_reason(a: &Abort, gpus: &[i32]) -> String {
    let what = format!(
        "{} {} {} ({})",
        a.collective,
        human_bytes(a.bytes),
        if a.in_place {
            "in-place"
        } else {
            "out-of-place"
        },
        a.phase.as_str()
    );
    let who = format!("rank {} (GPU{})", a.rank, gpu_of(gpus, a.rank));
    match &a.cause {
        AbortCause::Timeout { seconds } => format!(
            "{what}: not complete after {} on {who}; the communicators were aborted",
            seconds_text(*seconds)
        ),
        AbortCause::NcclError { message, .. } => {
            format!("{what}: NCCL error on {who}: {message}; the communicators were aborted")
        }
        AbortCause::Cuda { message } => format!("{what}: CUDA error on {who}: {message}"),
        AbortCause::Stopped => format!("{what}: stopped before it finished"),
    }
}

/// `60s`, or `50ms` under a second.
fn seconds_text(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.0}s")
    } else {
        format!("{:.0}ms", s * 1e3)
    }
}

/// Error for an aborted sweep; Fail for each rank's wrong elements.
fn sweep_findings(
    _ctx: &JudgeContext<'_>,
    s: &SweepOutcome,
    gpus: &[i32],
    p2p_off: bool,
) -> Vec<Reason> {
    let tag = if p2p_off { "nccl (P2P off)" } else { "nccl" };
    let mut found = Vec::new();
    if let Some(a) = &s.abort {
        found.push(Code::NcclAborted.says(format!("{tag} {}", abort_reason(a, gpus))));
    }
    for m in s.mismatches.iter().take(MAX_MISMATCH_REASONS) {
        found.push(Code::NcclWrongResult.says(format!(
                "{tag}: GPU{} (rank {}) received {} wrong element{} in {} {} {}, first at byte offset {:#x}",
                gpu_of(gpus, m.rank),
                m.rank,
                m.elements,
                if m.elements == 1 { "" } else { "s" },
                m.collective,
                human_bytes(m.bytes),
                if m.in_place { "in-place" } else { "out-of-place" },
                m.first_offset
            )));
    }
    let more = s.mismatches.len().saturating_sub(MAX_MISMATCH_REASONS);
    if more > 0 {
        found.push(Code::NcclWrongResult.says(format!(
            "{tag}: {more} more collective{} with wrong elements",
            if more == 1 { "" } else { "s" }
        )));
    }
    found
}

fn mismatches(s: &SweepOutcome, gpus: &[i32], p2p_off: bool) -> Vec<NcclMismatch> {
    s.mismatches
        .iter()
        .map(|m| NcclMismatch {
            rank: m.rank as i32,
            gpu: gpu_of(gpus, m.rank),
            collective: m.collective.to_string(),
            bytes: m.bytes as i64,
            in_place: m.in_place,
            p2p_off,
            elements: m.elements as i64,
            first_offset: m.first_offset as i64,
        })
        .collect()
}

/// A communicator that used SHM or the network between GPUs the topology links by NVLink.
pub fn fallback_reason(t: Option<&TransportSummary>, gpus: &[i32]) -> Option<String> {
    let t = t?;
    let mut counts: std::collections::BTreeMap<(u32, u32, &str), u32> =
        std::collections::BTreeMap::new();
    for c in t
        .connections
        .iter()
        .filter(|c| matches!(c.class, TransportClass::Shm | TransportClass::Net))
    {
        *counts.entry((c.from, c.to, c.via.as_str())).or_insert(0) += 1;
    }
    let mut pairs: Vec<String> = counts
        .into_iter()
        .map(|((from, to, via), n)| {
            format!(
                "GPU{}->GPU{} via {via} ({n} connection{})",
                gpu_of(gpus, from),
                gpu_of(gpus, to),
                if n == 1 { "" } else { "s" }
            )
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let total = pairs.len();
    pairs.truncate(3);
    let more = if total > 3 {
        format!(" and {} more", total - 3)
    } else {
        String::new()
    };
    Some(format!(
        "nccl: the communicator fell back from NVLink peer-to-peer: {}{more}, although the topology shows NVLink (peer access disabled, NCCL_P2P_DISABLE/NCCL_P2P_LEVEL set, or the fabric manager down?)",
        pairs.join(", ")
    ))
}

/// Collectives whose bus bandwidth tracks the links' one-way rate (nccl-tests' bus factor makes
/// them comparable across GPU counts); broadcast and all-to-all get a floor only from the spec.
const LINK_BOUND: [Collective; 3] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
];

/// The bus bandwidth floor of a collective whose sweep ended at `bytes`, and its source: the
/// spec's, else the measured profile table's, else from the node itself (its measured p2p, or
/// its NVLink or PCIe links); only for a sweep that reaches [`FLOOR_MIN_BYTES`].
fn floor_for(
    ctx: &JudgeContext<'_>,
    c: Collective,
    ranks: usize,
    bytes: u64,
) -> Option<(f64, String)> {
    if let Some(v) = ctx.spec.min_bus_bandwidth_gbps {
        return Some((f64::from(v), "spec minBusBandwidthGbps".to_string()));
    }
    if bytes < FLOOR_MIN_BYTES || !LINK_BOUND.contains(&c) {
        return None;
    }
    if let Some(f) = ctx
        .profile
        .and_then(|p| profile_floor(p, ranks, c).map(|f| (f, format!("{p} profile, {ranks} GPUs"))))
    {
        return Some(f);
    }
    let gpus: Vec<u32> = ctx.facts.gpus.keys().copied().collect();
    ctx.facts
        .nccl_floor(&gpus, ctx.measured_p2p)
        .map(|f| (f.gbps, f.source))
}

/// Bus bandwidth at the largest size and time at the smallest, against the spec or profile.
fn threshold_reasons(ctx: &JudgeContext<'_>, s: &SweepOutcome, gpus: &[i32]) -> Vec<String> {
    let ranks = gpus.len();
    let elt = ctx.spec.dtype.size();
    let mut reasons = Vec::new();
    for c in &s.curves {
        let (Some(first), Some(last)) = (c.rows.first(), c.rows.last()) else {
            continue;
        };
        if let Some((floor, source)) = floor_for(ctx, c.collective, ranks, last.bytes) {
            let busbw =
                Layout::new(c.collective, last.bytes, elt, ranks as u64).busbw_gbps(last.seconds);
            if busbw < floor {
                reasons.push(format!(
                    "nccl {}: bus bandwidth {busbw:.1} GB/s at {} < {floor:.0} GB/s ({source})",
                    c.collective,
                    human_bytes(last.bytes)
                ));
            }
        }
        if let Some(max) = ctx.spec.max_small_latency_micros {
            let us = first.seconds * 1e6;
            if us > f64::from(max) {
                reasons.push(format!(
                    "nccl {}: {us:.1} us per collective at {} > {max} us (spec maxSmallLatencyMicros)",
                    c.collective,
                    human_bytes(first.bytes)
                ));
            }
        }
    }
    reasons
}

/// Settings with a bus-bandwidth floor and a small-size latency ceiling (for tests).
#[cfg(test)]
pub(super) fn with_floors(min_bus_gbps: i32, max_small_micros: i32) -> NcclCheck {
    NcclCheck {
        min_bus_bandwidth_gbps: Some(min_bus_gbps),
        max_small_latency_micros: Some(max_small_micros),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::outcome::{CurveOutcome, Phase, RankMismatch, RowOutcome};
    use crate::nccl::transport;

    const GIB: u64 = 1 << 30;

    fn curve(c: Collective, small_us: f64, big_busbw: f64) -> CurveOutcome {
        // 2 ranks, bf16: all-reduce busbw = algbw; seconds = bytes / 1e9 / busbw.
        let l = Layout::new(c, 4 * GIB, 2, 2);
        let factor = crate::nccl::bandwidth::bus_factor(c, 2);
        let secs = l.algorithm_bytes() as f64 / 1e9 / (big_busbw / factor);
        CurveOutcome {
            collective: c,
            rows: vec![
                RowOutcome {
                    bytes: 8,
                    count: 4,
                    seconds: small_us * 1e-6,
                    in_place_seconds: Some(small_us * 1e-6),
                    wrong: 0,
                },
                RowOutcome {
                    bytes: 4 * GIB,
                    count: l.count,
                    seconds: secs,
                    in_place_seconds: Some(secs),
                    wrong: 0,
                },
            ],
        }
    }

    fn outcome(sweep: SweepOutcome) -> NcclOutcome {
        NcclOutcome {
            gpus: vec![0, 1],
            library: Some("libnccl.so.2 (2.28.3)".into()),
            sweep: Ok(sweep),
            p2p_off: None,
            notes: vec![],
            seconds: 3.0,
        }
    }

    fn p2p_log() -> TransportSummary {
        transport::parse(
            "h:1:1 [0] NCCL INFO NCCL version 2.28.3+cuda13.0\nh:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\nh:1:1 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read\n",
        )
    }

    fn healthy() -> SweepOutcome {
        SweepOutcome {
            curves: vec![curve(Collective::AllReduce, 20.0, 360.0)],
            transport: Some(p2p_log()),
            ..Default::default()
        }
    }

    fn ctx(spec: &NcclCheck) -> JudgeContext<'_> {
        JudgeContext {
            spec,
            nvlink: true,
            profile: Some("H200"),
            facts: &crate::link_floors::NO_FACTS,
            measured_p2p: None,
        }
    }

    /// A sweep over `ranks` GPUs whose largest size (4 GiB) runs at `busbw`.
    fn sweep_of(ranks: u64, c: Collective, busbw: f64) -> NcclOutcome {
        let l = Layout::new(c, 4 * GIB, 2, ranks);
        let factor = crate::nccl::bandwidth::bus_factor(c, ranks);
        let secs = l.algorithm_bytes() as f64 / 1e9 / (busbw / factor);
        let row = RowOutcome {
            bytes: 4 * GIB,
            count: l.count,
            seconds: secs,
            in_place_seconds: Some(secs),
            wrong: 0,
        };
        NcclOutcome {
            gpus: (0..ranks as u32).collect(),
            sweep: Ok(SweepOutcome {
                curves: vec![CurveOutcome {
                    collective: c,
                    rows: vec![row],
                }],
                transport: Some(p2p_log()),
                ..Default::default()
            }),
            ..outcome(healthy())
        }
    }

    /// `ranks` Hopper GPUs, 18 NVLink 4 links each to the NVSwitches, on PCIe Gen5 x16.
    fn hopper_facts(ranks: u32) -> LinkFacts {
        use crate::link_floors::{GpuLinks, NvlinkFact};
        LinkFacts {
            gpus: (0..ranks)
                .map(|i| {
                    let link = NvlinkFact {
                        generation: Some(4),
                        to_switch: true,
                        remote_bus_id: None,
                    };
                    let links = GpuLinks {
                        bus_id: format!("00000000:{:02x}:00.0", 0x18 + i),
                        nvlinks: vec![link; 18],
                        pcie: Some((5, 16)),
                    };
                    (i, links)
                })
                .collect(),
        }
    }

    /// No profile table entry covers an H100 with 4 or 8 GPUs: the floor comes from the links
    /// NVML reports, so collectives at half speed fail and healthy ones pass.
    #[test]
    fn an_h100_node_of_4_or_8_gpus_at_half_speed_fails_on_its_link_floor() {
        let spec = NcclCheck::default();
        for ranks in [4u32, 8] {
            let facts = hopper_facts(ranks);
            let cx = JudgeContext {
                spec: &spec,
                nvlink: true,
                profile: Some("H100"),
                facts: &facts,
                measured_p2p: None,
            };
            for c in LINK_BOUND {
                let healthy = judge(&cx, &sweep_of(u64::from(ranks), c, 360.0));
                assert_eq!(
                    healthy.verdict,
                    Verdict::Pass,
                    "{ranks} {c}: {:?}",
                    healthy.reasons
                );
                assert_eq!(healthy.floors.len(), 1);
                assert_eq!(healthy.floors[0].gbps, 225.0);
                assert!(healthy.floors[0].source.contains("NVLink 4 × 18 links"));
                let half = judge(&cx, &sweep_of(u64::from(ranks), c, 180.0));
                assert_eq!(half.verdict, Verdict::Fail, "{ranks} {c}");
                assert!(
                    half.reasons
                        .iter()
                        .any(|r| r.message.contains("< 225 GB/s (0.50 × NVLink 4")),
                    "{:?}",
                    half.reasons
                );
            }
        }
    }

    /// Where the p2p check passed in the same run, the node's own one-way rate sets the floor.
    #[test]
    fn the_nodes_measured_p2p_sets_the_floor_when_no_profile_entry_does() {
        let spec = NcclCheck::default();
        let facts = hopper_facts(4);
        let cx = JudgeContext {
            spec: &spec,
            nvlink: true,
            profile: None,
            facts: &facts,
            measured_p2p: Some(392.0),
        };
        let r = judge(&cx, &sweep_of(4, Collective::AllReduce, 200.0));
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(
            r.floors[0].source.contains("measured p2p"),
            "{:?}",
            r.floors
        );
        assert_eq!(r.floors[0].gbps, 215.6);
        // Broadcast and all-to-all are held only to a spec floor.
        let r = judge(&cx, &sweep_of(4, Collective::AllToAll, 50.0));
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        assert!(r.floors.is_empty());
    }

    #[test]
    fn a_healthy_sweep_passes_with_nccl_tests_figures() {
        let spec = with_floors(300, 50);
        let r = judge(&ctx(&spec), &outcome(healthy()));
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        assert_eq!(r.nccl_version.as_deref(), Some("2.28.3"));
        let sweep = r.sweep.expect("a sweep");
        let row = &sweep.curves[0].rows[1];
        assert!((row.busbw_gbps - 360.0).abs() < 1e-6 && (row.algbw_gbps - 360.0).abs() < 1e-6);
        assert_eq!(sweep.curves[0].rows[0].time_micros, 20.0);
        let t = sweep.transport.expect("a transport");
        assert_eq!(t.kinds, ["P2P/CUMEM"]);
        assert_eq!(
            (t.links[0].from, t.links[0].to, t.links[0].connections),
            (0, 1, 1)
        );
    }

    #[test]
    fn slow_and_laggy_sweeps_fail_against_the_spec() {
        let spec = with_floors(300, 30);
        let mut s = healthy();
        s.curves = vec![curve(Collective::AllReduce, 45.0, 120.0)];
        let r = judge(&ctx(&spec), &outcome(s));
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            [
                "nccl allReduce: bus bandwidth 120.0 GB/s at 4 GiB < 300 GB/s (spec minBusBandwidthGbps)",
                "nccl allReduce: 45.0 us per collective at 8 B > 30 us (spec maxSmallLatencyMicros)",
            ]
        );
    }

    #[test]
    fn a_wrong_element_fails_naming_rank_collective_size_and_offset() {
        let mut s = healthy();
        s.mismatches = vec![RankMismatch {
            rank: 1,
            collective: Collective::AllGather,
            bytes: 256 << 20,
            in_place: true,
            elements: 3,
            first_offset: 0x1f40,
        }];
        let r = judge(&ctx(&NcclCheck::default()), &outcome(s));
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            [
                "nccl: GPU1 (rank 1) received 3 wrong elements in allGather 256 MiB in-place, first at byte offset 0x1f40"
            ]
        );
        assert_eq!(failed_gpus(&r), [1]);
        assert_eq!(r.mismatches[0].collective, "allGather");
    }

    #[test]
    fn a_hang_is_an_error_naming_collective_size_and_rank() {
        let mut s = healthy();
        s.abort = Some(Abort {
            collective: Collective::AllReduce,
            bytes: 8,
            in_place: false,
            phase: Phase::WarmUp,
            rank: 0,
            cause: AbortCause::Timeout { seconds: 5.0 },
        });
        let r = judge(&ctx(&NcclCheck::default()), &outcome(s));
        assert_eq!(r.verdict, Verdict::Error);
        assert_eq!(
            r.reasons,
            [
                "nccl allReduce 8 B out-of-place (warm-up): not complete after 5s on rank 0 (GPU0); the communicators were aborted"
            ]
        );
        assert!(r.sweep.and_then(|s| s.error).is_some());
    }

    #[test]
    fn shm_on_an_nvlink_node_fails_and_is_fine_without_nvlink() {
        let mut s = healthy();
        s.transport = Some(transport::parse(
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\nh:1:1 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct\n",
        ));
        let spec = NcclCheck::default();
        let r = judge(&ctx(&spec), &outcome(s.clone()));
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(r.reasons[0].starts_with("nccl: the communicator fell back from NVLink peer-to-peer: GPU0->GPU1 via SHM (2 connections)"), "{:?}", r.reasons);
        let pcie = JudgeContext {
            nvlink: false,
            ..ctx(&spec)
        };
        assert_eq!(judge(&pcie, &outcome(s)).verdict, Verdict::Pass);
    }

    #[test]
    fn the_p2p_off_sweep_is_reported_but_not_held_to_floors() {
        let spec = NcclCheck {
            min_bus_bandwidth_gbps: Some(300),
            transports: true,
            ..Default::default()
        };
        let mut o = outcome(healthy());
        let mut off = healthy();
        off.curves = vec![curve(Collective::AllReduce, 30.0, 40.0)];
        off.transport = Some(transport::parse(
            "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n",
        ));
        o.p2p_off = Some(Ok(off));
        let r = judge(&ctx(&spec), &o);
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        assert_eq!(
            r.p2p_off.and_then(|s| s.transport).map(|t| t.kinds),
            Some(vec!["SHM".to_string()])
        );
        o.p2p_off = Some(Err(BackendError::Other("boom".into())));
        assert_eq!(judge(&ctx(&spec), &o).reasons, ["nccl (P2P off): boom"]);
    }

    #[test]
    fn the_h200_profile_floor_applies_to_a_full_sweep() {
        let spec = NcclCheck::default();
        let mut s = healthy();
        s.curves = vec![curve(Collective::AllReduce, 20.0, 150.0)];
        let r = judge(&ctx(&spec), &outcome(s.clone()));
        assert_eq!(
            r.reasons,
            ["nccl allReduce: bus bandwidth 150.0 GB/s at 4 GiB < 225 GB/s (H200 profile, 2 GPUs)"]
        );
        let none = JudgeContext {
            profile: None,
            ..ctx(&spec)
        };
        assert_eq!(judge(&none, &outcome(s)).verdict, Verdict::Pass);
        assert_eq!(profile_floor("H100", 2, Collective::AllReduce), None);
    }

    #[test]
    fn a_missing_library_is_an_error_and_one_gpu_is_skipped() {
        let spec = NcclCheck::default();
        let e = BackendError::MissingLibrary {
            library: "NCCL (libnccl.so.2)".into(),
            hint: "install it".into(),
        };
        let r = errored(&spec, &e);
        assert_eq!(
            (r.verdict, r.reasons[0].message.as_str()),
            (
                Verdict::Error,
                "nccl: NCCL (libnccl.so.2) is not available: install it"
            )
        );
        assert_eq!(skipped(&spec, "one GPU").verdict, Verdict::Skipped);
    }
}
