//! A GPU's verdict from its checks, telemetry and health, and the node's from its GPUs, its
//! node-level checks and its facts: the worst of them. The node keeps its first Fail and Error
//! reasons (worst first) and its first warnings, and the one action that covers them. The
//! spec's severity overrides are applied here, to every reason, before anything is counted.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use gpuval_crds::Evidence;
use gpuval_crds::reason::action_of;
use gpuval_crds::xid::XidSeen;
use gpuval_crds::{GpuHealth, GpuReport, NodeReport, TelemetrySummary, Verdict};

use crate::checks::{apply_overrides, gpu_results, node_results};
use crate::judge::{
    CheckResult, Code, Judge, Reason, Says, Severity, plural, push_unique, verdict_of,
};

/// How many failure (and warning) reasons a node report carries.
const MAX_NODE_FAILURES: usize = 5;

impl Judge<'_> {
    /// One GPU's verdict: the worst of its checks' results and of every reason it carries
    /// (its checks', its telemetry's and health's, and those node-level checks gave it), with
    /// the overrides applied. Idempotent.
    pub fn gpu(&self, gpu: &mut GpuReport) {
        burn_power_into_telemetry(gpu);
        let mut found: Vec<Reason> = gpu_results(gpu)
            .into_iter()
            .flat_map(|(_, reasons)| reasons.iter().cloned())
            .collect();
        if let Some(t) = &gpu.telemetry {
            found.extend(telemetry_findings(gpu.index, t));
        }
        if let Some(h) = &gpu.health {
            found.extend(health_findings(gpu.index, h));
        }
        self.overrides.apply(&mut found);
        self.overrides.apply(&mut gpu.reasons);
        push_unique(&mut gpu.reasons, found);
        gpu.verdict = gpu_results(gpu)
            .into_iter()
            .map(|(v, _)| v)
            .chain([verdict_of(&gpu.reasons)])
            .max()
            .unwrap_or(Verdict::Pass);
    }

    /// The node's verdict: the worst of its GPUs (judged here with [`Judge::gpu`]), its
    /// node-level checks and its facts; `failures` gets the first Fail and Error reasons, worst
    /// first, `warnings` the first warnings, and `action` the most drastic action among the
    /// failures (or, without any, the warnings).
    pub fn node(&self, report: &mut NodeReport) {
        apply_overrides(report, &self.overrides);
        if let Some(f) = report.facts.as_mut() {
            f.apply_overrides(&self.overrides);
        }
        for gpu in &mut report.gpus {
            self.gpu(gpu);
        }
        let sources = node_sources(report);
        let worst = sources
            .iter()
            .flatten()
            .map(|r| r.severity.verdict())
            .max()
            .unwrap_or(Verdict::Pass);
        let gpus = report.gpus.iter().map(|g| g.verdict).max();
        let checks = node_results(report)
            .into_iter()
            .map(|(v, _)| v)
            .chain(report.facts.iter().map(|f| f.verdict))
            .max();
        report.verdict = [Some(report.verdict), Some(worst), gpus, checks]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(Verdict::Pass);
        push_unique(
            &mut report.failures,
            spread(&sources, |s| s >= Severity::Error),
        );
        report.failures.truncate(MAX_NODE_FAILURES);
        push_unique(
            &mut report.warnings,
            spread(&sources, |s| s == Severity::Warn),
        );
        report.warnings.truncate(MAX_NODE_FAILURES);
        report.action = if report.failures.is_empty() {
            action_of(&report.warnings)
        } else {
            action_of(&report.failures)
        };
    }
}

/// One source for a GPU's highest power draw: the compute check's samples (taken during the
/// burn) are samples of the run too, so the telemetry's range takes their highest where the
/// run's own sampler saw less (a sampler that missed the burn's peak would otherwise contradict
/// the burn's figures on the same page). Idempotent.
fn burn_power_into_telemetry(gpu: &mut GpuReport) {
    let burn = gpu
        .compute
        .as_ref()
        .and_then(|c| c.power.as_ref())
        .filter(|p| p.samples > 0)
        .map(|p| p.max_w);
    if let (Some(max), Some(stat)) = (
        burn,
        gpu.telemetry.as_mut().and_then(|t| t.power_w.as_mut()),
    ) {
        stat.max = stat.max.max(max);
    }
}

/// The reasons of a GPU's telemetry: uncorrectable ECC errors, every Xid seen (with its
/// meaning and NVIDIA's resolution: a fatal one fails the GPU, any other warns), and clocks
/// slowed by hardware or heat.
fn telemetry_findings(gpu: i32, t: &TelemetrySummary) -> Vec<Reason> {
    let mut found = Vec::new();
    if let Some(n) = t.ecc_uncorrected_delta.filter(|n| *n > 0) {
        found.push(Code::EccUncorrectable.says(format!(
            "GPU{gpu}: {n} uncorrectable ECC error{} during the run",
            plural(n)
        )));
    }
    let xids: Vec<XidSeen> = if t.xids.is_empty() {
        // A report summarized before Xids carried their meaning.
        let mut counts: BTreeMap<i64, i64> = BTreeMap::new();
        for x in &t.xid_events {
            *counts.entry(*x).or_default() += 1;
        }
        counts
            .into_iter()
            .map(|(x, n)| XidSeen::new(x, n))
            .collect()
    } else {
        t.xids.clone()
    };
    found.extend(xids.iter().map(|x| x.reason(gpu)));
    let throttles: Vec<&str> = t
        .throttle_reasons
        .iter()
        .map(String::as_str)
        .filter(|r| gpuval_crds::depth::is_slowdown(r))
        .collect();
    if !throttles.is_empty() {
        found.push(Code::ClockThrottled.says(format!(
            "GPU{gpu}: clocks throttled during the run ({})",
            throttles.join(", ")
        )));
    }
    found
}

fn health_findings(gpu: i32, h: &GpuHealth) -> Vec<Reason> {
    let mut found = Vec::new();
    if h.remapped_rows_failure == Some(true) {
        found.push(Code::RowRemapFailure.says(format!(
            "GPU{gpu}: row remapping failed; the GPU needs service"
        )));
    }
    if h.remapped_rows_pending == Some(true) {
        found.push(Code::RowRemapPending.says(format!(
            "GPU{gpu}: a row remapping is pending; reset the GPU to apply it"
        )));
    }
    if let Some(n) = h.remapped_rows_uncorrectable.filter(|n| *n > 0) {
        found.push(Code::RowsRemapped.says(format!(
            "GPU{gpu}: {n} row{} remapped after uncorrectable errors",
            plural(n)
        )));
    }
    if let (Some(now), Some(max)) = (h.pcie_gen, h.pcie_max_gen)
        && now < max
    {
        found.push(Code::PcieLinkDegraded.says(format!(
            "GPU{gpu}: PCIe link at Gen{now}, below its maximum Gen{max}"
        )));
    }
    if let (Some(now), Some(max)) = (h.pcie_width, h.pcie_max_width)
        && now < max
    {
        found.push(Code::PcieLinkDegraded.says(format!(
            "GPU{gpu}: PCIe link at x{now}, below its maximum x{max}"
        )));
    }
    found
}

/// Every reason of the node, grouped by source: no GPUs, the node's facts and checks, each GPU.
fn node_sources(report: &NodeReport) -> Vec<Vec<Reason>> {
    let mut sources = Vec::new();
    if report.gpus.is_empty() && report.facts.as_ref().is_none_or(|f| !f.verdict.is_bad()) {
        sources.push(vec![Code::NoGpus.says("no GPUs found")]);
    }
    sources.extend(report.facts.iter().map(|f| f.reasons.clone()));
    sources.extend(report.gpus.iter().map(|g| g.reasons.clone()));
    sources.extend(node_results(report).into_iter().map(|(_, r)| r.to_vec()));
    sources
}

/// The reasons whose severity `keep` takes, worst first; within a severity, hardware findings
/// before busy, infrastructure and configuration ones (so that the cap on the listed failures
/// never hides a hardware code behind busy GPUs), then each source's first reason before any
/// source's second, so one GPU with many failures does not hide the others.
fn spread(sources: &[Vec<Reason>], keep: impl Fn(Severity) -> bool) -> Vec<Reason> {
    let mut ranked: Vec<(Severity, Evidence, usize, &Reason)> = Vec::new();
    for source in sources {
        let mut seen: BTreeMap<Severity, usize> = BTreeMap::new();
        for r in source.iter().filter(|r| keep(r.severity)) {
            let rank = seen.entry(r.severity).or_default();
            ranked.push((r.severity, r.code.evidence(), *rank, r));
            *rank += 1;
        }
    }
    ranked.sort_by_key(|(s, evidence, rank, _)| (Reverse(*s), *evidence, *rank));
    ranked.into_iter().map(|(_, _, _, r)| r.clone()).collect()
}

#[cfg(test)]
mod tests {
    use gpuval_crds::{
        Checks, ComputeResult, Dtype, GemmResult, MemoryResult, Profile, Stat, TopologyReport,
    };

    use super::*;
    use crate::judge::testing::judge;

    fn fail(code: Code, m: impl Into<String>) -> Reason {
        code.says(m)
    }

    // ---- relative ----

    /// A node report of `gpus` whose topology check failed for `reason`.
    fn topology_failed(gpus: Vec<GpuReport>, reason: Reason) -> NodeReport {
        NodeReport {
            gpus,
            topology: Some(TopologyReport {
                verdict: Verdict::Fail,
                reasons: vec![reason],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

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

    /// The relative rule over `gpus`, with the default checks and no model profile.
    fn relative(gpus: &mut [GpuReport]) {
        crate::checks::compare_gpus(&judge(&Checks::default(), Profile::None), gpus);
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
        let mut gpus: Vec<GpuReport> = (0..8)
            .map(|i| report_with(i, 4000.0 + i as f64, 780.0))
            .collect();
        gpus[3].compute = report_with(3, 0.0, 560.0).compute;
        if let Some(m) = gpus[6].memory.as_mut() {
            m.gbps = 3000.0;
        }
        relative(&mut gpus);
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
        let mut gpus = vec![report_with(0, 4000.0, 780.0), report_with(1, 4000.0, 560.0)];
        relative(&mut gpus);
        assert_eq!(
            verdicts(&gpus),
            vec![
                (Verdict::Pass, Verdict::Pass),
                (Verdict::Pass, Verdict::Fail)
            ]
        );
        let mut close = vec![report_with(0, 4000.0, 780.0), report_with(1, 3500.0, 700.0)];
        relative(&mut close);
        assert_eq!(verdicts(&close), vec![(Verdict::Pass, Verdict::Pass); 2]);
    }

    #[test]
    fn relative_needs_a_peer_and_skips_errored_checks() {
        let mut one = vec![report_with(0, 10.0, 1.0)];
        relative(&mut one);
        assert_eq!(verdicts(&one), vec![(Verdict::Pass, Verdict::Pass)]);

        let mut gpus = vec![report_with(0, 4000.0, 780.0), report_with(1, 0.0, 0.0)];
        if let Some(c) = gpus[1].compute.as_mut() {
            c.verdict = Verdict::Error;
        }
        relative(&mut gpus);
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
        assert_eq!(
            xid.reasons,
            vec![
                "GPU0: Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: the GPU has fallen off the bus) during the run; NVIDIA's catalogue: reboot the node"
            ]
        );
        assert_eq!(xid.reasons[0].action, gpuval_crds::Action::RebootNode);

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
            m.reasons = vec![fail(Code::MemoryMismatch, "GPU2 memory: 1 mismatched word")];
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
                c.reasons = vec![fail(Code::ComputeSlow, format!("GPU{i} bf16: slow"))];
            }
        }
        if let Some(m) = gpus[7].memory.as_mut() {
            m.verdict = Verdict::Error;
            m.reasons = vec![fail(
                Code::CheckCouldNotRun,
                "GPU7: memory test: out of memory",
            )];
        }
        gpus[7].health = Some(GpuHealth {
            pcie_gen: Some(3),
            pcie_max_gen: Some(5),
            ..Default::default()
        });
        let mut report = topology_failed(
            gpus,
            fail(
                Code::NvlinkNotConnected,
                "GPU0 and GPU1 are connected by SYS, not NVLink",
            ),
        );
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(
            report.verdict,
            Verdict::Fail,
            "a hardware Fail beats an Error"
        );
        assert_eq!(report.failures.len(), 5);
        assert_eq!(report.failures[0], "GPU0 bf16: slow");
        assert_eq!(report.failures[4], "GPU4 bf16: slow");
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
            c.reasons = (0..6)
                .map(|k| fail(Code::ComputeSlow, format!("GPU0 reason {k}")))
                .collect();
        }
        if let Some(m) = gpus[2].memory.as_mut() {
            m.verdict = Verdict::Fail;
            m.reasons = vec![fail(Code::MemoryMismatch, "GPU2 memory reason")];
        }
        let mut report = topology_failed(gpus, fail(Code::NvlinkNotConnected, "topology reason"));
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
        let mut report = topology_failed(
            vec![report_with(0, 4000.0, 780.0)],
            fail(
                Code::NvlinkLinksInactive,
                "GPU0: 17 of 18 NVLink links active",
            ),
        );
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(report.verdict, Verdict::Fail);
        assert_eq!(report.failures, vec!["GPU0: 17 of 18 NVLink links active"]);
    }

    #[test]
    fn node_io_failure_or_error_reaches_the_node() {
        let checks = Checks::default();
        for (verdict, code, reason) in [
            (
                Verdict::Fail,
                Code::IoSlow,
                "io: write 812 MB/s < 1000 MB/s (spec minWriteMbps)",
            ),
            (
                Verdict::Error,
                Code::IoError,
                "io: io directory /data does not exist",
            ),
        ] {
            let mut report = NodeReport {
                gpus: vec![report_with(0, 4000.0, 780.0)],
                io: Some(gpuval_crds::IoResult {
                    verdict,
                    reasons: vec![fail(code, reason)],
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
    fn a_node_with_a_hardware_fail_and_an_error_leads_with_the_fail() {
        let checks = Checks::default();
        let mut gpus = vec![report_with(0, 4000.0, 780.0), report_with(1, 4000.0, 780.0)];
        if let Some(m) = gpus[1].memory.as_mut() {
            m.verdict = Verdict::Fail;
            m.reasons = vec![fail(
                Code::MemoryMismatch,
                "GPU1 memory: 2 mismatched words",
            )];
        }
        let io_error = "no directory for the io check: set the Helm value agent.io.hostPath";
        let mut report = NodeReport {
            gpus,
            io: Some(gpuval_crds::IoResult {
                verdict: Verdict::Error,
                reasons: vec![fail(Code::IoError, io_error)],
                ..Default::default()
            }),
            ..Default::default()
        };
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(report.verdict, Verdict::Fail);
        assert_eq!(
            report.failures,
            vec!["GPU1 memory: 2 mismatched words", io_error]
        );
        assert_eq!(report.action, gpuval_crds::reason::Action::ReplaceHardware);
    }

    /// Five busy GPUs (Errors of the Busy category) and a hardware Error beside them: the cap
    /// on the listed failures keeps the hardware code, so the node's line is hardware.
    #[test]
    fn the_failure_list_never_hides_a_hardware_code_behind_busy_ones() {
        let checks = Checks::default();
        let mut gpus: Vec<GpuReport> = (0..6).map(|i| report_with(i, 4000.0, 780.0)).collect();
        for g in gpus.iter_mut().take(5) {
            let busy = format!("GPU{} was busy with other work", g.index);
            g.reasons.push(fail(Code::GpuBusy, busy));
        }
        let aborted = "nccl allReduce: the collective hung; the communicators were aborted";
        let mut report = NodeReport {
            gpus,
            nccl: Some(gpuval_crds::NcclResult {
                verdict: Verdict::Error,
                reasons: vec![fail(Code::NcclAborted, aborted)],
                ..Default::default()
            }),
            ..Default::default()
        };
        judge(&checks, Profile::Auto).node(&mut report);
        assert_eq!(report.failures.len(), MAX_NODE_FAILURES);
        assert_eq!(report.failures[0], aborted, "{:#?}", report.failures);
        assert_eq!(
            gpuval_crds::Evidence::of_codes(&report.codes()),
            gpuval_crds::Evidence::Hardware,
            "{}",
            report.codes()
        );
    }

    #[test]
    fn the_runs_highest_power_is_never_below_the_burns() {
        let mut g = report_with(0, 4000.0, 780.0);
        g.telemetry = Some(TelemetrySummary {
            samples: 10,
            power_w: Some(gpuval_crds::Stat {
                min: 80.0,
                mean: 300.0,
                max: 422.0,
            }),
            ..Default::default()
        });
        if let Some(c) = g.compute.as_mut() {
            c.power = Some(gpuval_crds::depth::PowerResult {
                samples: 40,
                median_w: 651.0,
                max_w: 690.0,
                ..Default::default()
            });
        }
        let checks = Checks::default();
        let judge = judge(&checks, Profile::Auto);
        judge.gpu(&mut g);
        judge.gpu(&mut g);
        let p = g.telemetry.and_then(|t| t.power_w).expect("power");
        assert_eq!((p.min, p.mean, p.max), (80.0, 300.0, 690.0));
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
