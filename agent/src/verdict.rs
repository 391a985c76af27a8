//! Judging: turns what the backend measured into verdicts with reasons in plain words, at each
//! level (check, GPU, node). Pure functions of the figures, the spec and the model profiles.
//!
//! Order of use: [`Judge::memory`] and [`Judge::compute`] per GPU (or [`Judge::check_error`]
//! where a check could not run), [`Judge::topology`], then [`Judge::relative`] over all GPUs,
//! then [`Judge::node`] (which also runs [`Judge::gpu`] on every GPU).

use std::cmp::Reverse;
use std::collections::BTreeMap;

use gpuval_crds::{
    Checks, ComputeCheck, ComputeResult, Dtype, GemmResult, GpuHealth, GpuReport, MemoryCheck,
    MemoryResult, NodeReport, TelemetrySummary, Thresholds, TopologyReport, TranscendentalResult,
    Verdict,
};

use crate::backend::{
    BackendError, ComputeOutcome, GemmOutcome, GpuInfo, MemoryOutcome, TranscendentalOutcome,
};
use crate::profiles::{ModelProfile, profile_for};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Below this share of total memory free at start, another process holds the GPU.
const MIN_FREE_SHARE: f64 = 0.9;
/// A test that covered less than this share of the fraction asked for fails.
const MIN_TESTED_SHARE: f64 = 0.9;
/// How many failure reasons a node report carries.
const MAX_NODE_FAILURES: usize = 5;
/// Throttle reasons that point at hardware or cooling trouble (a Warn).
const WARN_THROTTLES: [&str; 4] = [
    "HwSlowdown",
    "HwThermalSlowdown",
    "HwPowerBrakeSlowdown",
    "SwThermalSlowdown",
];

/// A reason with how bad it is.
type Finding = (Verdict, String);

/// A check's result in the report: it carries a verdict and the reasons for it.
pub trait CheckOutcome: Default {
    fn set_outcome(&mut self, verdict: Verdict, reasons: Vec<String>);
}

macro_rules! check_outcome {
    ($($t:ty),*) => {$(
        impl CheckOutcome for $t {
            fn set_outcome(&mut self, verdict: Verdict, reasons: Vec<String>) {
                self.verdict = verdict;
                self.reasons = reasons;
            }
        }
    )*};
}

check_outcome!(
    MemoryResult,
    ComputeResult,
    TopologyReport,
    gpuval_crds::HostTransferResult,
    gpuval_crds::P2pResult
);

/// Judges results against the spec's checks and thresholds and the model profiles.
pub struct Judge<'a> {
    pub checks: &'a Checks,
    pub thresholds: Thresholds,
}

impl Judge<'_> {
    /// Judges one GPU's memory test: mismatches, fill+verify throughput, free memory at start
    /// and how much of it was tested.
    pub fn memory(&self, gpu: &GpuInfo, out: &MemoryOutcome) -> MemoryResult {
        let spec = self.checks.memory.clone().unwrap_or_default();
        let seconds = out.fill_seconds + out.verify_seconds;
        let gbps = gbps_of(out.bytes_written.saturating_add(out.bytes_read), seconds);
        let mut reasons = Vec::new();
        reasons.extend(memory_mismatch_reason(gpu.index, out, &spec));
        reasons.extend(self.memory_rate_reason(gpu, gbps, &spec));
        reasons.extend(free_memory_reason(gpu, out));
        reasons.extend(tested_share_reason(gpu.index, out, spec.fraction));
        MemoryResult {
            verdict: fail_if_any(&reasons),
            reasons,
            tested_gib: out.bytes_tested as f64 / GIB,
            fraction: spec.fraction,
            passes: i32::try_from(out.passes).unwrap_or(i32::MAX),
            fill_gbps: gbps_of(out.bytes_written, out.fill_seconds),
            verify_gbps: gbps_of(out.bytes_read, out.verify_seconds),
            gbps,
            mismatches: to_i64(out.mismatches),
            first_mismatches: out.first_mismatches.clone(),
            seconds,
        }
    }

    /// Judges one GPU's compute burn: result mismatches and TFLOP/s per data type, and the
    /// transcendental kernel's mismatches.
    pub fn compute(&self, gpu: &GpuInfo, out: &ComputeOutcome) -> ComputeResult {
        let spec = self.checks.compute.clone().unwrap_or_default();
        let profile = self.profile(&gpu.name);
        let mut reasons = Vec::new();
        let mut gemms = Vec::with_capacity(out.gemms.len());
        for g in &out.gemms {
            reasons.extend(gemm_reasons(gpu.index, g, &spec, profile));
            gemms.push(gemm_result(g));
        }
        let transcendental = out.transcendental.as_ref().map(|t| {
            if t.mismatches > 0 {
                reasons.push(format!(
                    "GPU{} transcendental: {} elements differed from the first run",
                    gpu.index, t.mismatches
                ));
            }
            transcendental_result(t)
        });
        ComputeResult {
            verdict: fail_if_any(&reasons),
            reasons,
            seconds: out.seconds,
            matrix_size: spec.matrix_size,
            gemms,
            transcendental,
        }
    }

    /// The verdict and reason of a check that could not run.
    pub fn check_error(err: &BackendError) -> (Verdict, Vec<String>) {
        (Verdict::Error, vec![err.to_string()])
    }

    /// The result of a check that could not run: Error, with the backend's reason.
    pub fn errored<R: CheckOutcome>(err: &BackendError) -> R {
        let (verdict, reasons) = Self::check_error(err);
        let mut r = R::default();
        r.set_outcome(verdict, reasons);
        r
    }

    /// `ok` of what the backend measured, or [`Judge::errored`] when it could not measure.
    pub fn judged<O, R: CheckOutcome>(
        measured: Result<O, BackendError>,
        ok: impl FnOnce(O) -> R,
    ) -> R {
        match measured {
            Ok(o) => ok(o),
            Err(e) => Self::errored(&e),
        }
    }

    /// Judges the topology: NVLink between every pair where required, active link counts, and
    /// link state changes during the run. Keeps the report's own verdict and reasons.
    pub fn topology(&self, gpus: &[GpuInfo], mut report: TopologyReport) -> TopologyReport {
        let spec = self.checks.topology.clone().unwrap_or_default();
        // A model profile's NVLink expectation needs peers: a lone GPU (a one-GPU VM of an SXM
        // part, say) has nothing to link to. An explicit requireNvlink or minActiveLinks in the
        // spec still applies.
        let require = spec.require_nvlink.unwrap_or_else(|| {
            gpus.len() > 1
                && gpus
                    .iter()
                    .any(|g| self.profile(&g.name).is_some_and(|p| p.require_nvlink))
        });
        let mut reasons = Vec::new();
        if require {
            reasons.extend(non_nvlink_pairs(&report));
        }
        for gpu in gpus {
            reasons.extend(self.link_count_reason(gpu, &report, require, spec.min_active_links));
        }
        reasons.extend(
            report
                .link_changes
                .iter()
                .map(|c| format!("NVLink state changed during the run: {c}")),
        );
        if !reasons.is_empty() {
            report.verdict = report.verdict.max(Verdict::Fail);
            push_unique(&mut report.reasons, reasons);
        }
        report
    }

    /// The relative rule: a GPU more than `relativeTolerancePercent` below the median of the
    /// other GPUs (memory GB/s, TFLOP/s per data type) fails that check. Needs no profile.
    pub fn relative(&self, gpus: &mut [GpuReport]) {
        let tolerance = f64::from(self.thresholds.relative_tolerance_percent.clamp(1, 90)) / 100.0;
        let memory: Vec<Option<f64>> = gpus.iter().map(memory_gbps).collect();
        for (i, value, median) in outliers(&memory, tolerance) {
            let index = gpus[i].index;
            if let Some(m) = gpus[i].memory.as_mut() {
                let why = below_peers(index, "memory", value, "GB/s", median);
                m.verdict = m.verdict.max(Verdict::Fail);
                push_unique(&mut m.reasons, [why]);
            }
        }
        for dtype in Dtype::ALL {
            let tflops: Vec<Option<f64>> = gpus.iter().map(|g| gemm_tflops(g, dtype)).collect();
            for (i, value, median) in outliers(&tflops, tolerance) {
                let index = gpus[i].index;
                if let Some(c) = gpus[i].compute.as_mut() {
                    let why = below_peers(index, dtype.as_str(), value, "TFLOP/s", median);
                    c.verdict = c.verdict.max(Verdict::Fail);
                    push_unique(&mut c.reasons, [why]);
                }
            }
        }
    }

    /// One GPU's verdict: the worst of its memory, compute, telemetry and health, with every
    /// reason collected into `reasons`. Keeps a verdict or reasons already set.
    pub fn gpu(&self, gpu: &mut GpuReport) {
        let findings = gpu_findings(gpu);
        let worst = findings
            .iter()
            .map(|(v, _)| *v)
            .max()
            .unwrap_or(Verdict::Pass);
        gpu.verdict = [
            gpu.verdict,
            worst,
            gpu.memory.as_ref().map_or(Verdict::Pass, |m| m.verdict),
            gpu.compute.as_ref().map_or(Verdict::Pass, |c| c.verdict),
            gpu.host_transfer
                .as_ref()
                .map_or(Verdict::Pass, |h| h.verdict),
        ]
        .into_iter()
        .max()
        .unwrap_or(Verdict::Pass);
        push_unique(&mut gpu.reasons, findings.into_iter().map(|(_, r)| r));
    }

    /// The node's verdict: the worst of its GPUs (judged here with [`Judge::gpu`]), its
    /// topology, its p2p and its io check; `failures` gets the first Fail and Error reasons, worst first.
    pub fn node(&self, report: &mut NodeReport) {
        for gpu in &mut report.gpus {
            self.gpu(gpu);
        }
        let findings = node_findings(report);
        let worst = findings
            .iter()
            .flatten()
            .map(|(v, _)| *v)
            .max()
            .unwrap_or(Verdict::Pass);
        let gpus = report.gpus.iter().map(|g| g.verdict).max();
        let topology = report.topology.as_ref().map(|t| t.verdict);
        let p2p = report.p2p.as_ref().map(|p| p.verdict);
        let io = report.io.as_ref().map(|i| i.verdict);
        report.verdict = [Some(report.verdict), Some(worst), gpus, topology, p2p, io]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(Verdict::Pass);
        push_unique(&mut report.failures, worst_first(findings));
        report.failures.truncate(MAX_NODE_FAILURES);
    }

    fn profile(&self, gpu_name: &str) -> Option<&'static ModelProfile> {
        profile_for(self.thresholds.profile, gpu_name)
    }

    /// The model profile that applies to a GPU of this name (spec setting or Auto).
    pub(crate) fn profile_of(&self, gpu_name: &str) -> Option<&'static ModelProfile> {
        self.profile(gpu_name)
    }

    fn memory_rate_reason(&self, gpu: &GpuInfo, gbps: f64, spec: &MemoryCheck) -> Option<String> {
        let (floor, source) = match spec.min_gbps {
            Some(v) => (f64::from(v), "spec minGbps".to_string()),
            None => {
                let p = self.profile(&gpu.name)?;
                (p.memory_min_gbps, format!("{} profile", p.name))
            }
        };
        (gbps < floor).then(|| {
            format!(
                "GPU{} memory: {gbps:.0} GB/s < {floor:.0} GB/s ({source})",
                gpu.index
            )
        })
    }

    fn link_count_reason(
        &self,
        gpu: &GpuInfo,
        report: &TopologyReport,
        require: bool,
        min_active_links: Option<i32>,
    ) -> Option<String> {
        let (expected, source) = match min_active_links {
            Some(n) => (i64::from(n), "spec minActiveLinks".to_string()),
            None if require => {
                let p = self.profile(&gpu.name)?;
                (i64::from(p.nvlink_links?), format!("{} profile", p.name))
            }
            None => return None,
        };
        let state = report
            .nvlinks
            .iter()
            .find(|l| i64::from(l.gpu) == i64::from(gpu.index));
        let active = state.map_or(0, |l| i64::from(l.active));
        if active >= expected {
            return None;
        }
        let have = match state {
            Some(l) => format!("{active} of {} NVLink links active", l.total),
            None => "no NVLink link state".to_string(),
        };
        Some(format!(
            "GPU{}: {have}, expected {expected} ({source})",
            gpu.index
        ))
    }
}

fn memory_mismatch_reason(gpu: u32, out: &MemoryOutcome, spec: &MemoryCheck) -> Option<String> {
    let allowed = spec
        .max_mismatches
        .map_or(0, |m| u64::try_from(m).unwrap_or(0));
    if out.mismatches <= allowed {
        return None;
    }
    let first = out
        .first_mismatches
        .first()
        .map(|m| format!(" (first at offset {:#x})", m.offset))
        .unwrap_or_default();
    let limit = if allowed > 0 {
        format!(", more than the {allowed} allowed")
    } else {
        String::new()
    };
    Some(format!(
        "GPU{gpu} memory: {} mismatched word{}{first}{limit}",
        out.mismatches,
        plural(out.mismatches)
    ))
}

fn free_memory_reason(gpu: &GpuInfo, out: &MemoryOutcome) -> Option<String> {
    let total = if out.total_bytes > 0 {
        out.total_bytes
    } else {
        gpu.memory_total_bytes
    } as f64;
    let free = out.free_bytes_before as f64;
    (total > 0.0 && free < MIN_FREE_SHARE * total).then(|| {
        format!(
            "GPU{}: only {:.0}% of memory free at start ({:.1} of {:.1} GiB); another process holds GPU memory",
            gpu.index,
            (100.0 * free / total).floor(),
            free / GIB,
            total / GIB
        )
    })
}

fn tested_share_reason(gpu: u32, out: &MemoryOutcome, asked: f64) -> Option<String> {
    if out.free_bytes_before == 0 || asked <= 0.0 {
        return None;
    }
    let tested = out.bytes_tested as f64 / out.free_bytes_before as f64;
    (tested < MIN_TESTED_SHARE * asked).then(|| {
        format!(
            "GPU{gpu} memory: tested {:.1} GiB, {:.0}% of free memory, well below the {:.0}% asked for",
            out.bytes_tested as f64 / GIB,
            100.0 * tested,
            100.0 * asked
        )
    })
}

fn gemm_reasons(
    gpu: u32,
    g: &GemmOutcome,
    spec: &ComputeCheck,
    profile: Option<&ModelProfile>,
) -> Vec<String> {
    let mut reasons = Vec::new();
    if g.mismatches > 0 {
        reasons.push(format!(
            "GPU{gpu} {}: {} mismatched element{} in {} result comparisons (max relative error {:.2e})",
            g.dtype,
            g.mismatches,
            plural(g.mismatches),
            g.comparisons,
            g.max_rel_error
        ));
    }
    let floor = match spec.min_tflops.as_ref().and_then(|t| t.get(g.dtype)) {
        Some(v) => Some((f64::from(v), "spec minTflops".to_string())),
        None => profile.and_then(|p| {
            p.tflops_min(g.dtype)
                .map(|v| (v, format!("{} profile", p.name)))
        }),
    };
    if let Some((floor, source)) = floor {
        let tflops = g.tflops();
        if tflops < floor {
            reasons.push(format!(
                "GPU{gpu} {}: {tflops:.0} TFLOP/s < {floor:.0} TFLOP/s ({source})",
                g.dtype
            ));
        }
    }
    reasons
}

fn gemm_result(g: &GemmOutcome) -> GemmResult {
    GemmResult {
        dtype: g.dtype,
        tflops: g.tflops(),
        iterations: to_i64(g.iterations),
        mismatches: to_i64(g.mismatches),
        max_rel_error: g.max_rel_error,
        seconds: g.wall_seconds,
    }
}

/// `elements` is taken as the elements of one iteration.
fn transcendental_result(t: &TranscendentalOutcome) -> TranscendentalResult {
    let total = t.elements as f64 * t.iterations as f64;
    TranscendentalResult {
        gelems_per_second: if t.seconds > 0.0 {
            total / t.seconds / 1e9
        } else {
            0.0
        },
        iterations: to_i64(t.iterations),
        mismatches: to_i64(t.mismatches),
    }
}

/// Every GPU pair whose matrix cell is not NVLink (`NV#`), named once per pair.
fn non_nvlink_pairs(report: &TopologyReport) -> Vec<String> {
    let n = report.matrix.len();
    let label = |i: usize| {
        report
            .gpus
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("GPU{i}"))
    };
    let cell = |i: usize, j: usize| report.matrix.get(i).and_then(|row| row.get(j));
    let mut reasons = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            let bad = [cell(i, j), cell(j, i)]
                .into_iter()
                .find(|c| !c.is_some_and(|c| c.starts_with("NV")));
            if let Some(c) = bad {
                let how = c.map_or("nothing known", String::as_str);
                reasons.push(format!(
                    "{} and {} are connected by {how}, not NVLink",
                    label(i),
                    label(j)
                ));
            }
        }
    }
    reasons
}

fn memory_gbps(g: &GpuReport) -> Option<f64> {
    g.memory
        .as_ref()
        .filter(|m| measured(m.verdict))
        .map(|m| m.gbps)
        .filter(|v| v.is_finite() && *v > 0.0)
}

fn gemm_tflops(g: &GpuReport, dtype: Dtype) -> Option<f64> {
    g.compute
        .as_ref()
        .filter(|c| measured(c.verdict))
        .and_then(|c| c.gemms.iter().find(|r| r.dtype == dtype))
        .map(|r| r.tflops)
        .filter(|v| v.is_finite() && *v > 0.0)
}

/// A check that ran (its figures mean something).
fn measured(v: Verdict) -> bool {
    !matches!(v, Verdict::Skipped | Verdict::Error)
}

/// `(position, value, median of the others)` of every value more than `tolerance` (a share)
/// below the median of the other values; positions without a value are neither judged nor
/// counted as peers.
pub(crate) fn outliers(values: &[Option<f64>], tolerance: f64) -> Vec<(usize, f64, f64)> {
    let mut found = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let Some(v) = *v else { continue };
        let peers: Vec<f64> = values
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, p)| *p)
            .collect();
        if let Some(m) = median(peers)
            && v < m * (1.0 - tolerance)
        {
            found.push((i, v, m));
        }
    }
    found
}

/// The median (mean of the middle two for an even count); None for no values.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

fn below_peers(gpu: i32, what: &str, value: f64, unit: &str, median: f64) -> String {
    below_peers_named(&format!("GPU{gpu}"), what, value, unit, median, "its peers")
}

/// `GPU1->GPU3 unidirectional: 120 GB/s is 69% below the other pairs (median 392)`.
pub(crate) fn below_peers_named(
    name: &str,
    what: &str,
    value: f64,
    unit: &str,
    median: f64,
    peers: &str,
) -> String {
    let percent = (1.0 - value / median) * 100.0;
    format!("{name} {what}: {value:.0} {unit} is {percent:.0}% below {peers} (median {median:.0})")
}

/// Every reason of one GPU with its severity: its checks', telemetry's and health's.
fn gpu_findings(gpu: &GpuReport) -> Vec<Finding> {
    let mut found = Vec::new();
    if let Some(m) = &gpu.memory {
        found.extend(m.reasons.iter().map(|r| (m.verdict, r.clone())));
    }
    if let Some(c) = &gpu.compute {
        found.extend(c.reasons.iter().map(|r| (c.verdict, r.clone())));
    }
    if let Some(h) = &gpu.host_transfer {
        found.extend(h.reasons.iter().map(|r| (h.verdict, r.clone())));
    }
    if let Some(t) = &gpu.telemetry {
        found.extend(telemetry_findings(gpu.index, t));
    }
    if let Some(h) = &gpu.health {
        found.extend(health_findings(gpu.index, h));
    }
    found
}

fn telemetry_findings(gpu: i32, t: &TelemetrySummary) -> Vec<Finding> {
    let mut found = Vec::new();
    if let Some(n) = t.ecc_uncorrected_delta.filter(|n| *n > 0) {
        found.push((
            Verdict::Fail,
            format!(
                "GPU{gpu}: {n} uncorrectable ECC error{} during the run",
                plural(n)
            ),
        ));
    }
    let mut xids: BTreeMap<i64, usize> = BTreeMap::new();
    for x in &t.xid_events {
        *xids.entry(*x).or_default() += 1;
    }
    for (xid, count) in xids {
        let times = if count > 1 {
            format!(" ({count} times)")
        } else {
            String::new()
        };
        found.push((
            Verdict::Fail,
            format!("GPU{gpu}: Xid {xid} during the run{times}"),
        ));
    }
    let throttles: Vec<&str> = t
        .throttle_reasons
        .iter()
        .map(String::as_str)
        .filter(|r| WARN_THROTTLES.contains(r))
        .collect();
    if !throttles.is_empty() {
        found.push((
            Verdict::Warn,
            format!(
                "GPU{gpu}: clocks throttled during the run ({})",
                throttles.join(", ")
            ),
        ));
    }
    found
}

fn health_findings(gpu: i32, h: &GpuHealth) -> Vec<Finding> {
    let mut found = Vec::new();
    if h.remapped_rows_failure == Some(true) {
        found.push((
            Verdict::Fail,
            format!("GPU{gpu}: row remapping failed; the GPU needs service"),
        ));
    }
    if h.remapped_rows_pending == Some(true) {
        found.push((
            Verdict::Fail,
            format!("GPU{gpu}: a row remapping is pending; reset the GPU to apply it"),
        ));
    }
    if let Some(n) = h.remapped_rows_uncorrectable.filter(|n| *n > 0) {
        found.push((
            Verdict::Warn,
            format!(
                "GPU{gpu}: {n} row{} remapped after uncorrectable errors",
                plural(n)
            ),
        ));
    }
    if let (Some(now), Some(max)) = (h.pcie_gen, h.pcie_max_gen)
        && now < max
    {
        found.push((
            Verdict::Warn,
            format!("GPU{gpu}: PCIe link at Gen{now}, below its maximum Gen{max}"),
        ));
    }
    if let (Some(now), Some(max)) = (h.pcie_width, h.pcie_max_width)
        && now < max
    {
        found.push((
            Verdict::Warn,
            format!("GPU{gpu}: PCIe link at x{now}, below its maximum x{max}"),
        ));
    }
    found
}

/// Every reason of the node with its severity, grouped by source: no GPUs, each GPU, the
/// topology, the io check.
fn node_findings(report: &NodeReport) -> Vec<Vec<Finding>> {
    let mut found = Vec::new();
    if report.gpus.is_empty() {
        found.push(vec![(Verdict::Error, "no GPUs found".to_string())]);
    }
    for gpu in &report.gpus {
        let known = gpu_findings(gpu);
        let other: Vec<Finding> = gpu
            .reasons
            .iter()
            .filter(|r| !known.iter().any(|(_, k)| k == *r))
            .map(|r| (gpu.verdict, r.clone()))
            .collect();
        found.push(known.into_iter().chain(other).collect());
    }
    if let Some(t) = &report.topology {
        found.push(t.reasons.iter().map(|r| (t.verdict, r.clone())).collect());
    }
    if let Some(p) = &report.p2p {
        found.push(p.reasons.iter().map(|r| (p.verdict, r.clone())).collect());
    }
    if let Some(io) = &report.io {
        found.push(io.reasons.iter().map(|r| (io.verdict, r.clone())).collect());
    }
    found
}

/// The Fail and Error reasons, Error first; within a severity, each source's first reason
/// before any source's second, so one GPU with many failures does not hide the others.
fn worst_first(sources: Vec<Vec<Finding>>) -> Vec<String> {
    let mut ranked: Vec<(Verdict, usize, String)> = Vec::new();
    for source in sources {
        let mut seen: BTreeMap<Verdict, usize> = BTreeMap::new();
        for (verdict, reason) in source.into_iter().filter(|(v, _)| v.is_bad()) {
            let rank = seen.entry(verdict).or_default();
            ranked.push((verdict, *rank, reason));
            *rank += 1;
        }
    }
    ranked.sort_by_key(|(v, rank, _)| (Reverse(*v), *rank));
    ranked.into_iter().map(|(_, _, r)| r).collect()
}

pub(crate) fn push_unique(into: &mut Vec<String>, reasons: impl IntoIterator<Item = String>) {
    for r in reasons {
        if !into.contains(&r) {
            into.push(r);
        }
    }
}

pub(crate) fn fail_if_any(reasons: &[String]) -> Verdict {
    if reasons.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail
    }
}

/// Bytes per second in GB/s (1e9); 0 without a time.
fn gbps_of(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

fn plural<T: PartialEq + From<u8>>(n: T) -> &'static str {
    if n == T::from(1) { "" } else { "s" }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use gpuval_crds::{Mismatch, NvlinkState, Profile, Stat, TflopsThresholds, TopologyCheck};

    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn gpu(index: u32, name: &str) -> GpuInfo {
        let total = 143_771 * MIB;
        GpuInfo {
            index,
            uuid: format!("GPU-test-{index}"),
            name: name.to_string(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            memory_total_bytes: total,
            memory_free_bytes: total - 600 * MIB,
            compute_capability: Some((9, 0)),
            health: GpuHealth::default(),
        }
    }

    fn h200(index: u32) -> GpuInfo {
        gpu(index, "NVIDIA H200")
    }

    /// A memory outcome at `gbps` combined, testing `share` of `free` bytes.
    fn memory_outcome(gbps: f64, total: u64, free: u64, share: f64) -> MemoryOutcome {
        let tested = (free as f64 * share) as u64;
        let bytes = tested * 2;
        let seconds = bytes as f64 / (gbps * 1e9);
        MemoryOutcome {
            total_bytes: total,
            free_bytes_before: free,
            bytes_tested: tested,
            fill_seconds: seconds,
            verify_seconds: seconds,
            bytes_written: bytes,
            bytes_read: bytes,
            passes: 1,
            ..Default::default()
        }
    }

    fn healthy_memory(gbps: f64) -> MemoryOutcome {
        let g = h200(0);
        memory_outcome(gbps, g.memory_total_bytes, g.memory_free_bytes, 0.95)
    }

    fn gemm(dtype: Dtype, tflops: f64) -> GemmOutcome {
        GemmOutcome {
            dtype,
            flops: tflops * 1e12 * 10.0,
            gemm_seconds: 10.0,
            iterations: 1000,
            comparisons: 1000,
            mismatches: 0,
            max_rel_error: 0.0,
            wall_seconds: 10.5,
        }
    }

    fn compute_outcome(gemms: &[(Dtype, f64)]) -> ComputeOutcome {
        ComputeOutcome {
            gemms: gemms.iter().map(|(d, t)| gemm(*d, *t)).collect(),
            transcendental: Some(TranscendentalOutcome {
                elements: 1 << 20,
                seconds: 1.0,
                iterations: 1000,
                mismatches: 0,
            }),
            seconds: 30.0,
        }
    }

    fn judge(checks: &Checks, profile: Profile) -> Judge<'_> {
        Judge {
            checks,
            thresholds: Thresholds {
                profile,
                relative_tolerance_percent: 15,
            },
        }
    }

    fn memory_checks(spec: MemoryCheck) -> Checks {
        Checks {
            memory: Some(spec),
            ..Default::default()
        }
    }

    // ---- memory ----

    #[test]
    fn memory_passes_above_profile_floor() {
        let checks = memory_checks(MemoryCheck::default());
        let r = judge(&checks, Profile::Auto).memory(&h200(0), &healthy_memory(4000.0));
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        assert!((r.gbps - 4000.0).abs() < 0.01);
        assert!((r.fill_gbps - 4000.0).abs() < 0.01);
        assert!((r.verify_gbps - 4000.0).abs() < 0.01);
        assert!((r.tested_gib - 133.0).abs() < 1.0, "{}", r.tested_gib);
        assert_eq!((r.fraction, r.passes, r.mismatches), (0.95, 1, 0));
    }

    #[test]
    fn memory_mismatches_fail() {
        let checks = memory_checks(MemoryCheck::default());
        let mut out = healthy_memory(4000.0);
        out.mismatches = 2;
        out.first_mismatches = vec![Mismatch {
            offset: 0x1a2b_3c40,
            expected: "0x0".into(),
            actual: "0x1".into(),
        }];
        let r = judge(&checks, Profile::Auto).memory(&h200(3), &out);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec!["GPU3 memory: 2 mismatched words (first at offset 0x1a2b3c40)"]
        );
        assert_eq!(r.first_mismatches.len(), 1);
    }

    #[test]
    fn memory_mismatches_within_allowance_pass() {
        let checks = memory_checks(MemoryCheck {
            max_mismatches: Some(5),
            ..Default::default()
        });
        let mut out = healthy_memory(4000.0);
        out.mismatches = 5;
        let r = judge(&checks, Profile::Auto).memory(&h200(0), &out);
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        out.mismatches = 6;
        let r = judge(&checks, Profile::Auto).memory(&h200(0), &out);
        assert_eq!(
            r.reasons,
            vec!["GPU0 memory: 6 mismatched words, more than the 5 allowed"]
        );
    }

    #[test]
    fn memory_throughput_below_profile_floor_fails() {
        let checks = memory_checks(MemoryCheck::default());
        let r = judge(&checks, Profile::Auto).memory(&h200(1), &healthy_memory(3000.0));
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec!["GPU1 memory: 3000 GB/s < 3400 GB/s (H200 profile)"]
        );
    }

    #[test]
    fn memory_spec_floor_overrides_profile() {
        let spec = MemoryCheck {
            min_gbps: Some(2000),
            ..Default::default()
        };
        let checks = memory_checks(spec);
        let r = judge(&checks, Profile::Auto).memory(&h200(1), &healthy_memory(3000.0));
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        let r = judge(&checks, Profile::Auto).memory(&h200(1), &healthy_memory(1500.0));
        assert_eq!(
            r.reasons,
            vec!["GPU1 memory: 1500 GB/s < 2000 GB/s (spec minGbps)"]
        );
    }

    #[test]
    fn memory_without_profile_has_no_floor() {
        let checks = memory_checks(MemoryCheck::default());
        let l40s = gpu(0, "NVIDIA L40S");
        let r = judge(&checks, Profile::Auto).memory(&l40s, &healthy_memory(500.0));
        assert_eq!(r.verdict, Verdict::Pass);
        let r = judge(&checks, Profile::None).memory(&h200(0), &healthy_memory(500.0));
        assert_eq!(r.verdict, Verdict::Pass);
    }

    #[test]
    fn memory_held_by_another_process_fails() {
        let checks = memory_checks(MemoryCheck::default());
        let gib = 1u64 << 30;
        let total = (143.8 * gib as f64) as u64;
        let free = (87.1 * gib as f64) as u64;
        let out = memory_outcome(4000.0, total, free, 0.95);
        let r = judge(&checks, Profile::Auto).memory(&h200(2), &out);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec![
                "GPU2: only 60% of memory free at start (87.1 of 143.8 GiB); another process holds GPU memory"
            ]
        );
        let out = memory_outcome(4000.0, total, total / 100 * 91, 0.95);
        let r = judge(&checks, Profile::Auto).memory(&h200(2), &out);
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    }

    #[test]
    fn memory_tested_well_below_fraction_fails() {
        let checks = memory_checks(MemoryCheck::default());
        let g = h200(4);
        let out = memory_outcome(4000.0, g.memory_total_bytes, g.memory_free_bytes, 0.5);
        let r = judge(&checks, Profile::Auto).memory(&g, &out);
        assert_eq!(r.verdict, Verdict::Fail);
        assert!(
            r.reasons[0].starts_with("GPU4 memory: tested 69.9 GiB, 50% of free memory"),
            "{:?}",
            r.reasons
        );
        assert!(r.reasons[0].ends_with("well below the 95% asked for"));
        let out = memory_outcome(4000.0, g.memory_total_bytes, g.memory_free_bytes, 0.9);
        let r = judge(&checks, Profile::Auto).memory(&g, &out);
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    }

    // ---- compute ----

    fn compute_checks(spec: ComputeCheck) -> Checks {
        Checks {
            compute: Some(spec),
            ..Default::default()
        }
    }

    #[test]
    fn compute_passes_above_floors() {
        let checks = compute_checks(ComputeCheck::default());
        let out = compute_outcome(&[(Dtype::Bf16, 780.0), (Dtype::Fp32, 50.0)]);
        let r = judge(&checks, Profile::Auto).compute(&h200(0), &out);
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        assert_eq!(r.gemms.len(), 2);
        assert!((r.gemms[0].tflops - 780.0).abs() < 1e-6);
        assert_eq!(
            (r.matrix_size, r.seconds, r.gemms[0].seconds),
            (8192, 30.0, 10.5)
        );
        let t = r.transcendental.expect("transcendental result");
        assert!((t.gelems_per_second - (1u64 << 20) as f64 * 1000.0 / 1e9).abs() < 1e-9);
    }

    #[test]
    fn compute_below_profile_floor_fails() {
        let checks = compute_checks(ComputeCheck::default());
        let out = compute_outcome(&[(Dtype::Bf16, 512.0), (Dtype::Tf32, 400.0)]);
        let r = judge(&checks, Profile::Auto).compute(&h200(1), &out);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec!["GPU1 bf16: 512 TFLOP/s < 600 TFLOP/s (H200 profile)"]
        );
    }

    #[test]
    fn compute_spec_floor_overrides_profile() {
        let spec = ComputeCheck {
            min_tflops: Some(TflopsThresholds {
                bf16: Some(600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let checks = compute_checks(spec);
        let out = compute_outcome(&[(Dtype::Bf16, 612.0)]);
        let r = judge(&checks, Profile::Auto).compute(&h200(1), &out);
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        let out = compute_outcome(&[(Dtype::Bf16, 590.0)]);
        let r = judge(&checks, Profile::None).compute(&h200(1), &out);
        assert_eq!(
            r.reasons,
            vec!["GPU1 bf16: 590 TFLOP/s < 600 TFLOP/s (spec minTflops)"]
        );
    }

    #[test]
    fn compute_mismatches_fail() {
        let checks = compute_checks(ComputeCheck::default());
        let mut out = compute_outcome(&[(Dtype::Fp16, 780.0)]);
        out.gemms[0].mismatches = 3;
        out.gemms[0].max_rel_error = 0.5;
        let r = judge(&checks, Profile::Auto).compute(&h200(5), &out);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec![
                "GPU5 fp16: 3 mismatched elements in 1000 result comparisons (max relative error 5.00e-1)"
            ]
        );
        assert_eq!(r.gemms[0].mismatches, 3);
    }

    #[test]
    fn transcendental_mismatches_fail() {
        let checks = compute_checks(ComputeCheck::default());
        let mut out = compute_outcome(&[(Dtype::Bf16, 780.0)]);
        if let Some(t) = out.transcendental.as_mut() {
            t.mismatches = 7;
        }
        let r = judge(&checks, Profile::Auto).compute(&h200(2), &out);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec!["GPU2 transcendental: 7 elements differed from the first run"]
        );
    }

    #[test]
    fn check_error_is_an_error_verdict() {
        let (v, reasons) =
            Judge::check_error(&BackendError::gpu(1, "memory test", "out of memory"));
        assert_eq!(v, Verdict::Error);
        assert_eq!(reasons, vec!["GPU1: memory test: out of memory"]);
    }

    // ---- topology ----

    fn topo(n: usize, cell: &str, active: i32) -> TopologyReport {
        TopologyReport {
            gpus: (0..n).map(|i| format!("GPU{i}")).collect(),
            matrix: (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| if i == j { "X".into() } else { cell.into() })
                        .collect()
                })
                .collect(),
            nvlinks: (0..n)
                .map(|i| NvlinkState {
                    gpu: i as i32,
                    active,
                    total: 18,
                    version: Some(4),
                    remote: Some("NVSwitch".into()),
                })
                .collect(),
            samples: 3,
            ..Default::default()
        }
    }

    fn topo_checks(spec: TopologyCheck) -> Checks {
        Checks {
            topology: Some(spec),
            ..Default::default()
        }
    }

    fn h200s(n: u32) -> Vec<GpuInfo> {
        (0..n).map(h200).collect()
    }

    #[test]
    fn topology_full_nvlink_passes() {
        let checks = topo_checks(TopologyCheck::default());
        let r = judge(&checks, Profile::Auto).topology(&h200s(4), topo(4, "NV18", 18));
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    }

    #[test]
    fn a_single_gpu_is_not_held_to_the_profiles_nvlink_count() {
        let checks = topo_checks(TopologyCheck::default());
        let mut t = topo(1, "NV18", 0);
        t.nvlinks[0].total = 0;
        let r = judge(&checks, Profile::Auto).topology(&h200s(1), t.clone());
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        let explicit = topo_checks(TopologyCheck {
            min_active_links: Some(4),
            ..Default::default()
        });
        let r = judge(&explicit, Profile::Auto).topology(&h200s(1), t);
        assert_eq!(
            r.verdict,
            Verdict::Fail,
            "an explicit minActiveLinks still applies"
        );
    }

    #[test]
    fn topology_pair_without_nvlink_fails() {
        let checks = topo_checks(TopologyCheck::default());
        let mut t = topo(4, "NV18", 18);
        t.matrix[0][3] = "SYS".into();
        t.matrix[3][0] = "SYS".into();
        let r = judge(&checks, Profile::Auto).topology(&h200s(4), t);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec!["GPU0 and GPU3 are connected by SYS, not NVLink"]
        );
    }

    #[test]
    fn topology_missing_links_fail() {
        let checks = topo_checks(TopologyCheck::default());
        let mut t = topo(4, "NV18", 18);
        t.nvlinks[2].active = 17;
        let r = judge(&checks, Profile::Auto).topology(&h200s(4), t.clone());
        assert_eq!(
            r.reasons,
            vec!["GPU2: 17 of 18 NVLink links active, expected 18 (H200 profile)"]
        );
        let checks = topo_checks(TopologyCheck {
            min_active_links: Some(16),
            ..Default::default()
        });
        let r = judge(&checks, Profile::Auto).topology(&h200s(4), t);
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    }

    #[test]
    fn topology_link_change_fails() {
        let checks = topo_checks(TopologyCheck::default());
        let mut t = topo(2, "NV18", 18);
        t.link_changes = vec!["GPU1 link 4 went down at +93s".into()];
        let r = judge(&checks, Profile::None).topology(&h200s(2), t);
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(
            r.reasons,
            vec!["NVLink state changed during the run: GPU1 link 4 went down at +93s"]
        );
    }

    #[test]
    fn topology_without_nvlink_requirement_passes_pcie() {
        let checks = topo_checks(TopologyCheck::default());
        let gpus: Vec<GpuInfo> = (0..4).map(|i| gpu(i, "NVIDIA L40S")).collect();
        let r = judge(&checks, Profile::Auto).topology(&gpus, topo(4, "NODE", 0));
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        let off = topo_checks(TopologyCheck {
            require_nvlink: Some(false),
            ..Default::default()
        });
        let r = judge(&off, Profile::Auto).topology(&h200s(4), topo(4, "SYS", 0));
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        let on = topo_checks(TopologyCheck {
            require_nvlink: Some(true),
            ..Default::default()
        });
        let r = judge(&on, Profile::Auto).topology(&gpus, topo(2, "PIX", 0));
        assert_eq!(
            r.reasons,
            vec!["GPU0 and GPU1 are connected by PIX, not NVLink"]
        );
    }

    // ---- relative ----

    fn report_with(index: i32, gbps: f64, bf16: f64) -> GpuReport {
        GpuReport {
            index,
            name: "NVIDIA L40S".into(),
            memory: Some(MemoryResult {
                gbps,
                ..Default::default()
            }),
            compute: Some(ComputeResult {
                gemms: vec![GemmResult {
                    dtype: Dtype::Bf16,
                    tflops: bf16,
                    iterations: 1,
                    mismatches: 0,
                    max_rel_error: 0.0,
                    seconds: 1.0,
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn verdicts(gpus: &[GpuReport]) -> Vec<(Verdict, Verdict)> {
        gpus.iter()
            .map(|g| {
                let m = g.memory.as_ref().map_or(Verdict::Skipped, |m| m.verdict);
                let c = g.compute.as_ref().map_or(Verdict::Skipped, |c| c.verdict);
                (m, c)
            })
            .collect()
    }

    #[test]
    fn relative_flags_slow_gpu_among_eight_without_profile() {
        let checks = Checks::default();
        let mut gpus: Vec<GpuReport> = (0..8)
            .map(|i| report_with(i, 4000.0 + i as f64, 780.0))
            .collect();
        gpus[3].compute = report_with(3, 0.0, 560.0).compute;
        if let Some(m) = gpus[6].memory.as_mut() {
            m.gbps = 3000.0;
        }
        judge(&checks, Profile::None).relative(&mut gpus);
        let c = gpus[3].compute.as_ref().expect("compute");
        assert_eq!(c.verdict, Verdict::Fail);
        assert_eq!(
            c.reasons,
            vec!["GPU3 bf16: 560 TFLOP/s is 28% below its peers (median 780)"]
        );
        let m = gpus[6].memory.as_ref().expect("memory");
        assert_eq!(
            m.reasons,
            vec!["GPU6 memory: 3000 GB/s is 25% below its peers (median 4003)"]
        );
        let bad: Vec<usize> = verdicts(&gpus)
            .iter()
            .enumerate()
            .filter(|(_, (m, c))| m.is_bad() || c.is_bad())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(bad, vec![3, 6]);
    }

    #[test]
    fn relative_with_two_gpus_flags_only_the_slower() {
        let checks = Checks::default();
        let mut gpus = vec![report_with(0, 4000.0, 780.0), report_with(1, 4000.0, 560.0)];
        judge(&checks, Profile::None).relative(&mut gpus);
        assert_eq!(
            verdicts(&gpus),
            vec![
                (Verdict::Pass, Verdict::Pass),
                (Verdict::Pass, Verdict::Fail)
            ]
        );
        let mut close = vec![report_with(0, 4000.0, 780.0), report_with(1, 3500.0, 700.0)];
        judge(&checks, Profile::None).relative(&mut close);
        assert_eq!(verdicts(&close), vec![(Verdict::Pass, Verdict::Pass); 2]);
    }

    #[test]
    fn relative_needs_a_peer_and_skips_errored_checks() {
        let checks = Checks::default();
        let mut one = vec![report_with(0, 10.0, 1.0)];
        judge(&checks, Profile::None).relative(&mut one);
        assert_eq!(verdicts(&one), vec![(Verdict::Pass, Verdict::Pass)]);

        let mut gpus = vec![report_with(0, 4000.0, 780.0), report_with(1, 0.0, 0.0)];
        if let Some(c) = gpus[1].compute.as_mut() {
            c.verdict = Verdict::Error;
        }
        judge(&checks, Profile::None).relative(&mut gpus);
        assert_eq!(
            verdicts(&gpus),
            vec![
                (Verdict::Pass, Verdict::Pass),
                (Verdict::Pass, Verdict::Error)
            ]
        );
    }

    // ---- gpu ----

    #[test]
    fn gpu_takes_worst_of_checks_telemetry_and_health() {
        let checks = Checks::default();
        let j = judge(&checks, Profile::Auto);
        let mut clean = report_with(0, 4000.0, 780.0);
        clean.telemetry = Some(TelemetrySummary {
            samples: 3,
            temperature_c: Some(Stat {
                min: 30.0,
                mean: 50.0,
                max: 70.0,
            }),
            throttle_reasons: vec!["SwPowerCap".into()],
            ecc_uncorrected_delta: Some(0),
            ..Default::default()
        });
        clean.health = Some(GpuHealth {
            pcie_gen: Some(5),
            pcie_max_gen: Some(5),
            remapped_rows_uncorrectable: Some(0),
            ..Default::default()
        });
        j.gpu(&mut clean);
        assert_eq!(clean.verdict, Verdict::Pass, "{:?}", clean.reasons);

        let mut xid = clean.clone();
        if let Some(t) = xid.telemetry.as_mut() {
            t.xid_events = vec![79];
        }
        j.gpu(&mut xid);
        assert_eq!(xid.verdict, Verdict::Fail);
        assert_eq!(xid.reasons, vec!["GPU0: Xid 79 during the run"]);

        let mut ecc = clean.clone();
        if let Some(t) = ecc.telemetry.as_mut() {
            t.ecc_uncorrected_delta = Some(2);
        }
        j.gpu(&mut ecc);
        assert_eq!(
            ecc.reasons,
            vec!["GPU0: 2 uncorrectable ECC errors during the run"]
        );

        let mut hot = clean.clone();
        if let Some(t) = hot.telemetry.as_mut() {
            t.throttle_reasons.push("HwThermalSlowdown".into());
        }
        j.gpu(&mut hot);
        assert_eq!(hot.verdict, Verdict::Warn);
        assert_eq!(
            hot.reasons,
            vec!["GPU0: clocks throttled during the run (HwThermalSlowdown)"]
        );
    }

    #[test]
    fn gpu_health_rules() {
        let checks = Checks::default();
        let j = judge(&checks, Profile::Auto);
        let with = |h: GpuHealth| {
            let mut g = GpuReport {
                index: 1,
                health: Some(h),
                ..Default::default()
            };
            j.gpu(&mut g);
            (g.verdict, g.reasons)
        };
        let (v, r) = with(GpuHealth {
            remapped_rows_pending: Some(true),
            ..Default::default()
        });
        assert_eq!((v, r.len()), (Verdict::Fail, 1));
        let (v, _) = with(GpuHealth {
            remapped_rows_failure: Some(true),
            ..Default::default()
        });
        assert_eq!(v, Verdict::Fail);
        let (v, r) = with(GpuHealth {
            remapped_rows_uncorrectable: Some(2),
            ..Default::default()
        });
        assert_eq!(v, Verdict::Warn);
        assert_eq!(r, vec!["GPU1: 2 rows remapped after uncorrectable errors"]);
        let (v, r) = with(GpuHealth {
            pcie_gen: Some(4),
            pcie_max_gen: Some(5),
            pcie_width: Some(8),
            pcie_max_width: Some(16),
            ..Default::default()
        });
        assert_eq!(v, Verdict::Warn);
        assert_eq!(
            r,
            vec![
                "GPU1: PCIe link at Gen4, below its maximum Gen5",
                "GPU1: PCIe link at x8, below its maximum x16"
            ]
        );
        let (v, r) = with(GpuHealth {
            remapped_rows_pending: Some(false),
            remapped_rows_failure: Some(false),
            pcie_gen: Some(5),
            pcie_max_gen: Some(5),
            ..Default::default()
        });
        assert_eq!((v, r.len()), (Verdict::Pass, 0));
    }

    #[test]
    fn gpu_is_idempotent() {
        let checks = Checks::default();
        let j = judge(&checks, Profile::Auto);
        let mut g = report_with(2, 4000.0, 780.0);
        if let Some(m) = g.memory.as_mut() {
            m.verdict = Verdict::Fail;
            m.reasons = vec!["GPU2 memory: 1 mismatched word".into()];
        }
        j.gpu(&mut g);
        j.gpu(&mut g);
        assert_eq!(g.verdict, Verdict::Fail);
        assert_eq!(g.reasons, vec!["GPU2 memory: 1 mismatched word"]);
    }

    // ---- node ----

    #[test]
    fn node_passes_when_everything_passes() {
        let checks = Checks::default();
        let mut report = NodeReport {
            gpus: (0..2).map(|i| report_with(i, 4000.0, 780.0)).collect(),
            topology: Some(TopologyReport::default()),
            ..Default::default()
        };
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(report.verdict, Verdict::Pass);
        assert!(report.failures.is_empty());
    }

    #[test]
    fn node_failures_worst_first_and_capped() {
        let checks = Checks::default();
        let mut gpus: Vec<GpuReport> = (0..8).map(|i| report_with(i, 4000.0, 780.0)).collect();
        for g in gpus.iter_mut().take(6) {
            let i = g.index;
            if let Some(c) = g.compute.as_mut() {
                c.verdict = Verdict::Fail;
                c.reasons = vec![format!("GPU{i} bf16: slow")];
            }
        }
        if let Some(m) = gpus[7].memory.as_mut() {
            m.verdict = Verdict::Error;
            m.reasons = vec!["GPU7: memory test: out of memory".into()];
        }
        gpus[7].health = Some(GpuHealth {
            pcie_gen: Some(3),
            pcie_max_gen: Some(5),
            ..Default::default()
        });
        let mut report = NodeReport {
            gpus,
            topology: Some(TopologyReport {
                verdict: Verdict::Fail,
                reasons: vec!["GPU0 and GPU1 are connected by SYS, not NVLink".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(report.verdict, Verdict::Error);
        assert_eq!(report.failures.len(), 5);
        assert_eq!(report.failures[0], "GPU7: memory test: out of memory");
        assert_eq!(report.failures[1], "GPU0 bf16: slow");
        assert_eq!(report.failures[4], "GPU3 bf16: slow");
        assert!(report.failures.iter().all(|f| !f.contains("PCIe")));
        assert_eq!(report.gpus[7].verdict, Verdict::Error);
        assert_eq!(report.gpus[7].reasons.len(), 2);
    }

    #[test]
    fn node_failures_spread_over_sources() {
        let checks = Checks::default();
        let mut gpus: Vec<GpuReport> = (0..3).map(|i| report_with(i, 4000.0, 780.0)).collect();
        if let Some(c) = gpus[0].compute.as_mut() {
            c.verdict = Verdict::Fail;
            c.reasons = (0..6).map(|k| format!("GPU0 reason {k}")).collect();
        }
        if let Some(m) = gpus[2].memory.as_mut() {
            m.verdict = Verdict::Fail;
            m.reasons = vec!["GPU2 memory reason".into()];
        }
        let mut report = NodeReport {
            gpus,
            topology: Some(TopologyReport {
                verdict: Verdict::Fail,
                reasons: vec!["topology reason".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(
            report.failures,
            vec![
                "GPU0 reason 0",
                "GPU2 memory reason",
                "topology reason",
                "GPU0 reason 1",
                "GPU0 reason 2"
            ]
        );
    }

    #[test]
    fn node_topology_failure_fails_node() {
        let checks = Checks::default();
        let mut report = NodeReport {
            gpus: vec![report_with(0, 4000.0, 780.0)],
            topology: Some(TopologyReport {
                verdict: Verdict::Fail,
                reasons: vec!["GPU0: 17 of 18 NVLink links active".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(report.verdict, Verdict::Fail);
        assert_eq!(report.failures, vec!["GPU0: 17 of 18 NVLink links active"]);
    }

    #[test]
    fn node_io_failure_or_error_reaches_the_node() {
        let checks = Checks::default();
        for (verdict, reason) in [
            (
                Verdict::Fail,
                "io: write 812 MB/s < 1000 MB/s (spec minWriteMbps)",
            ),
            (Verdict::Error, "io: io directory /data does not exist"),
        ] {
            let mut report = NodeReport {
                gpus: vec![report_with(0, 4000.0, 780.0)],
                io: Some(gpuval_crds::IoResult {
                    verdict,
                    reasons: vec![reason.into()],
                    ..Default::default()
                }),
                ..Default::default()
            };
            judge(&checks, Profile::Auto).node(&mut report);
            assert_eq!(report.verdict, verdict);
            assert_eq!(report.failures, vec![reason]);
            assert_eq!(report.gpus[0].verdict, Verdict::Pass);
        }
    }

    #[test]
    fn node_without_gpus_is_an_error() {
        let checks = Checks::default();
        let mut report = NodeReport::default();
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(report.verdict, Verdict::Error);
        assert_eq!(report.failures, vec!["no GPUs found"]);
    }
}
