//! Each GPU's PCIe link, judged by the host transfer check: the generation and width it runs at
//! while transfers are in flight against what the GPU and its slot support (and an expectation
//! the spec may set for every node), and the replay and AER counters over the run (read before
//! the first GPU check and after the host transfers).

use gpuval_crds::{PcieCheck, PcieResult};

use crate::backend::PcieReading;
use crate::judge::{Code, Reason, Says, plural};

/// Defaults of the spec's `pcie` limits.
pub const DEFAULT_MAX_REPLAYS: u64 = 8;
pub const DEFAULT_MAX_CORRECTABLE: u64 = 8;
pub const DEFAULT_MAX_UNCORRECTABLE: u64 = 0;

/// One GPU's PCIe readings: before the run, while transfers were in flight, and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PcieOutcome {
    pub before: Option<PcieReading>,
    pub under_load: Option<PcieReading>,
    pub after: Option<PcieReading>,
}

/// The counter's growth between two readings (None where either is missing, or where it went
/// down: the driver was reloaded in between).
fn delta(
    before: Option<&PcieReading>,
    after: Option<&PcieReading>,
    f: fn(&PcieReading) -> Option<u64>,
) -> Option<u64> {
    let (b, a) = (f(before?)?, f(after?)?);
    a.checked_sub(b)
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

fn i32_of(v: Option<u32>) -> Option<i32> {
    v.and_then(|v| i32::try_from(v).ok())
}

fn i64_of(v: Option<u64>) -> Option<i64> {
    v.and_then(|v| i64::try_from(v).ok())
}

/// The report's view of the readings and the findings on them.
pub fn judge(gpu: u32, p: &PcieOutcome, spec: &PcieCheck) -> (PcieResult, Vec<Reason>) {
    let link = p.under_load.or(p.after);
    let (before, after) = (p.before.as_ref(), p.after.as_ref());
    let replays = delta(before, after, |r| r.replays);
    let correctable = delta(before, after, |r| r.correctable);
    let uncorrectable = sum(
        delta(before, after, |r| r.nonfatal),
        delta(before, after, |r| r.fatal),
    );
    let mut found = Vec::new();
    if let Some(l) = &link {
        found.extend(link_findings(gpu, l, spec));
    }
    let limit = |v: Option<i64>, d: u64| v.and_then(|v| u64::try_from(v).ok()).unwrap_or(d);
    found.extend(counter_finding(
        gpu,
        "replay",
        replays,
        limit(spec.max_replays, DEFAULT_MAX_REPLAYS),
        (Some(Code::PcieReplays), Code::PcieReplaysOverLimit),
    ));
    found.extend(counter_finding(
        gpu,
        "correctable error",
        correctable,
        limit(spec.max_correctable_errors, DEFAULT_MAX_CORRECTABLE),
        (
            Some(Code::PcieCorrectableErrors),
            Code::PcieCorrectableOverLimit,
        ),
    ));
    found.extend(counter_finding(
        gpu,
        "uncorrectable error",
        uncorrectable,
        limit(spec.max_uncorrectable_errors, DEFAULT_MAX_UNCORRECTABLE),
        (None, Code::PcieUncorrectableErrors),
    ));
    let result = PcieResult {
        link_gen: i32_of(link.and_then(|l| l.link_gen)),
        link_width: i32_of(link.and_then(|l| l.link_width)),
        max_gen: i32_of(link.and_then(|l| l.max_gen)),
        max_width: i32_of(link.and_then(|l| l.max_width)),
        gpu_max_gen: i32_of(link.and_then(|l| l.gpu_max_gen)),
        replays: i64_of(replays),
        replays_total: i64_of(after.and_then(|a| a.replays)),
        correctable_errors: i64_of(correctable),
        uncorrectable_errors: i64_of(uncorrectable),
    };
    (result, found)
}

/// The link under load: below what the GPU and slot allow (Fail), a slot that holds the GPU
/// below its own maximum generation (Warn), below the spec's expectation (Fail).
fn link_findings(gpu: u32, l: &PcieReading, spec: &PcieCheck) -> Vec<Reason> {
    let mut found = Vec::new();
    let name = |g: Option<u32>, w: Option<u32>| {
        [g.map(|g| format!("Gen{g}")), w.map(|w| format!("x{w}"))]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let now = name(l.link_gen, l.link_width);
    let gen_short = matches!((l.link_gen, l.max_gen), (Some(n), Some(m)) if n < m);
    let width_short = matches!((l.link_width, l.max_width), (Some(n), Some(m)) if n < m);
    if gen_short || width_short {
        found.push(Code::PcieLinkBelowCapability.says(format!(
            "GPU{gpu} PCIe: {now} under load, below the {} the GPU and its slot support",
            name(l.max_gen, l.max_width)
        )));
    }
    if let (Some(slot), Some(own)) = (l.max_gen, l.gpu_max_gen)
        && slot < own
    {
        found.push(Code::PcieSlotBelowGpu.says(format!(
            "GPU{gpu} PCIe: the slot allows Gen{slot}; the GPU supports Gen{own}"
        )));
    }
    let expected_gen = spec.expect_gen.and_then(|g| u32::try_from(g).ok());
    let expected_width = spec.expect_width.and_then(|w| u32::try_from(w).ok());
    let below =
        |now: Option<u32>, want: Option<u32>| matches!((now, want), (Some(n), Some(w)) if n < w);
    if below(l.link_gen, expected_gen) || below(l.link_width, expected_width) {
        found.push(Code::PcieLinkBelowExpected.says(format!(
            "GPU{gpu} PCIe: {now} under load, expected {} (spec pcie)",
            name(expected_gen.or(l.link_gen), expected_width.or(l.link_width))
        )));
    }
    found
}

/// More than `limit` of a counter over the run is a reason of the second code (a Fail); fewer but
/// some is one of the first, where there is one (a Warn).
fn counter_finding(
    gpu: u32,
    what: &str,
    n: Option<u64>,
    limit: u64,
    (below, over): (Option<Code>, Code),
) -> Option<Reason> {
    let n = n.filter(|n| *n > 0)?;
    let text = |tail: String| {
        format!(
            "GPU{gpu} PCIe: {n} {what}{} during the run{tail}",
            plural(n)
        )
    };
    if n > limit {
        Some(over.says(text(format!(", more than the {limit} allowed"))))
    } else {
        below.map(|code| code.says(text(String::new())))
    }
}

#[cfg(test)]
mod tests {
    use gpuval_crds::Verdict;

    use super::*;

    fn gen5() -> PcieReading {
        PcieReading {
            link_gen: Some(5),
            link_width: Some(16),
            max_gen: Some(5),
            max_width: Some(16),
            gpu_max_gen: Some(5),
            replays: Some(100),
            correctable: Some(0),
            nonfatal: Some(0),
            fatal: Some(0),
        }
    }

    fn outcome(under: PcieReading, after: PcieReading) -> PcieOutcome {
        PcieOutcome {
            before: Some(gen5()),
            under_load: Some(under),
            after: Some(after),
        }
    }

    fn reasons(found: &[Reason]) -> Vec<(Verdict, &str)> {
        found
            .iter()
            .map(|r| (r.severity.verdict(), r.message.as_str()))
            .collect()
    }

    #[test]
    fn a_healthy_link_passes_and_reports_its_figures() {
        let (r, found) = judge(3, &outcome(gen5(), gen5()), &PcieCheck::default());
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(
            (r.link_gen, r.link_width, r.max_gen),
            (Some(5), Some(16), Some(5))
        );
        assert_eq!((r.replays, r.replays_total), (Some(0), Some(100)));
        assert_eq!(
            (r.correctable_errors, r.uncorrectable_errors),
            (Some(0), Some(0))
        );
    }

    #[test]
    fn a_link_trained_down_under_load_fails() {
        let slow = PcieReading {
            link_gen: Some(4),
            link_width: Some(8),
            ..gen5()
        };
        let (_, found) = judge(3, &outcome(slow, gen5()), &PcieCheck::default());
        assert_eq!(
            reasons(&found),
            [(
                Verdict::Fail,
                "GPU3 PCIe: Gen4 x8 under load, below the Gen5 x16 the GPU and its slot support"
            )]
        );
    }

    #[test]
    fn a_slot_below_the_gpu_warns_and_the_spec_expectation_fails() {
        let slot4 = PcieReading {
            link_gen: Some(4),
            max_gen: Some(4),
            ..gen5()
        };
        let (_, found) = judge(1, &outcome(slot4, gen5()), &PcieCheck::default());
        assert_eq!(
            reasons(&found),
            [(
                Verdict::Warn,
                "GPU1 PCIe: the slot allows Gen4; the GPU supports Gen5"
            )]
        );
        let spec = PcieCheck {
            expect_gen: Some(5),
            ..Default::default()
        };
        let (_, found) = judge(1, &outcome(slot4, gen5()), &spec);
        assert_eq!(
            reasons(&found).last().copied(),
            Some((
                Verdict::Fail,
                "GPU1 PCIe: Gen4 x16 under load, expected Gen5 x16 (spec pcie)"
            ))
        );
        // a link at or above the expectation is fine
        let spec = PcieCheck {
            expect_gen: Some(4),
            expect_width: Some(16),
            ..Default::default()
        };
        let (_, found) = judge(1, &outcome(gen5(), gen5()), &spec);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn replays_warn_then_fail_past_the_limit() {
        let after = |replays| PcieReading {
            replays: Some(replays),
            ..gen5()
        };
        let (r, found) = judge(2, &outcome(gen5(), after(103)), &PcieCheck::default());
        assert_eq!(r.replays, Some(3));
        assert_eq!(
            reasons(&found),
            [(Verdict::Warn, "GPU2 PCIe: 3 replays during the run")]
        );
        let (_, found) = judge(2, &outcome(gen5(), after(140)), &PcieCheck::default());
        assert_eq!(
            reasons(&found),
            [(
                Verdict::Fail,
                "GPU2 PCIe: 40 replays during the run, more than the 8 allowed"
            )]
        );
        let spec = PcieCheck {
            max_replays: Some(50),
            ..Default::default()
        };
        let (_, found) = judge(2, &outcome(gen5(), after(140)), &spec);
        assert_eq!(
            (found[0].code, found[0].severity.verdict()),
            (Code::PcieReplays, Verdict::Warn)
        );
        // a counter that went down (driver reloaded) says nothing
        let (r, found) = judge(2, &outcome(gen5(), after(5)), &PcieCheck::default());
        assert_eq!((r.replays, found.len()), (None, 0));
    }

    #[test]
    fn aer_errors_count_where_nvml_has_them() {
        let after = PcieReading {
            correctable: Some(2),
            nonfatal: Some(1),
            fatal: None,
            ..gen5()
        };
        let (r, found) = judge(0, &outcome(gen5(), after), &PcieCheck::default());
        assert_eq!(
            (r.correctable_errors, r.uncorrectable_errors),
            (Some(2), Some(1))
        );
        assert_eq!(
            reasons(&found),
            [
                (
                    Verdict::Warn,
                    "GPU0 PCIe: 2 correctable errors during the run"
                ),
                (
                    Verdict::Fail,
                    "GPU0 PCIe: 1 uncorrectable error during the run, more than the 0 allowed"
                ),
            ]
        );
        let none = PcieReading {
            correctable: None,
            nonfatal: None,
            fatal: None,
            ..gen5()
        };
        let p = PcieOutcome {
            before: Some(none),
            under_load: Some(none),
            after: Some(none),
        };
        let (r, found) = judge(0, &p, &PcieCheck::default());
        assert_eq!((r.correctable_errors, r.uncorrectable_errors), (None, None));
        assert!(found.is_empty());
    }
}
