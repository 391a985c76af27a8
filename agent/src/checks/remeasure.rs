//! A performance figure that falls short (below its floor or far below its peers) is measured
//! once more before it fails, so one noisy sample does not fail a healthy GPU: the registry
//! ([`super::Planned::remeasure`]) measures the check again and judges it like the first time;
//! here, the rules for which results the second measurement decides. A result that also failed
//! on anything else (corrupted data, an error) keeps its first measurement: that failure stands.

use gpuval_crds::{GpuReport, Reason, Verdict};

use crate::judge::{CheckResult, Code, Says, Severity};

/// Where a per-GPU check keeps its result in a GPU's report.
pub type Slot<R> = fn(&mut GpuReport) -> &mut Option<R>;

/// True when `r` failed and every reason that failed it is a performance figure.
pub fn short_on_performance_only<R: CheckResult>(r: &R) -> bool {
    r.verdict() == Verdict::Fail
        && r.reasons()
            .iter()
            .filter(|x| x.severity >= Severity::Error)
            .all(|x| x.code.is_performance())
}

/// True when any GPU's result in `slot` fell short on performance only.
pub fn any_gpu_short<R: CheckResult>(gpus: &mut [GpuReport], slot: Slot<R>) -> bool {
    gpus.iter_mut()
        .any(|g| slot(g).as_ref().is_some_and(short_on_performance_only))
}

/// The note a result decided by a second measurement carries: `GPU3 memory: the first
/// measurement fell short (3100 GB/s < 3600 GB/s (H200 profile)); a second measurement
/// decided: it passed` (or `: it fell short too`).
pub fn note(what: &str, first: &[Reason], second: Verdict) -> Reason {
    let short: Vec<&str> = first
        .iter()
        .filter(|r| r.code.is_performance() && r.severity >= Severity::Error)
        .map(|r| r.message.as_str())
        .collect();
    let outcome = match second {
        Verdict::Pass | Verdict::Warn | Verdict::Skipped => "it passed",
        Verdict::Fail => "it fell short too",
        Verdict::Error => "it could not measure",
    };
    Code::SecondMeasurement.says(format!(
        "{what}: the first measurement fell short ({}); a second measurement decided: {outcome}",
        short.join("; ")
    ))
}

/// Puts the second measurement's result (from `second`, the same GPUs in the same order) in
/// place of each first result in `slot` that fell short on performance only, with its note.
/// Returns how many results it replaced.
pub fn replace_gpu_results<R: CheckResult>(
    report: &mut [GpuReport],
    second: &mut [GpuReport],
    slot: Slot<R>,
    check: &str,
) -> usize {
    let mut replaced = 0;
    for (first, again) in report.iter_mut().zip(second.iter_mut()) {
        let index = first.index;
        let Some(old) = slot(first).take_if(|r| short_on_performance_only(r)) else {
            continue;
        };
        let what = format!("GPU{index} {check}");
        let mut new = slot(again).take().unwrap_or_else(|| missing(&what));
        let second = new.verdict();
        new.worsen(note(&what, old.reasons(), second));
        *slot(first) = Some(new);
        replaced += 1;
    }
    replaced
}

/// The result of a second measurement that did not come back: an Error, never a pass.
fn missing<R: CheckResult>(what: &str) -> R {
    let mut r = R::default();
    r.set_outcome(
        Verdict::Error,
        vec![
            Code::MeasurementMissing
                .says(format!("{what}: the second measurement did not come back")),
        ],
    );
    r
}

/// The node-level version: `first` takes `second` when it fell short on performance only.
pub fn replace_node_result<R: CheckResult>(
    first: &mut Option<R>,
    second: Option<R>,
    check: &str,
) -> bool {
    let Some(old) = first.take_if(|r| short_on_performance_only(r)) else {
        return false;
    };
    let mut new = second.unwrap_or_else(|| missing(check));
    let verdict = new.verdict();
    new.worsen(note(check, old.reasons(), verdict));
    *first = Some(new);
    true
}

#[cfg(test)]
mod tests {
    use gpuval_crds::MemoryResult;

    use super::*;

    fn memory(verdict: Verdict, reasons: Vec<Reason>, gbps: f64) -> Option<MemoryResult> {
        Some(MemoryResult {
            verdict,
            reasons,
            gbps,
            ..Default::default()
        })
    }

    fn gpu(index: i32, m: Option<MemoryResult>) -> GpuReport {
        GpuReport {
            index,
            memory: m,
            ..Default::default()
        }
    }

    fn slot(g: &mut GpuReport) -> &mut Option<MemoryResult> {
        &mut g.memory
    }

    #[test]
    fn only_results_short_on_performance_alone_take_the_second_measurement() {
        let slow =
            || Code::MemoryBandwidthLow.says("GPU? memory: 3100 GB/s < 3600 GB/s (H200 profile)");
        let mut first = vec![
            gpu(0, memory(Verdict::Pass, vec![], 4300.0)),
            gpu(1, memory(Verdict::Fail, vec![slow()], 3100.0)),
            gpu(
                2,
                memory(
                    Verdict::Fail,
                    vec![
                        slow(),
                        Code::MemoryMismatch.says("GPU2 memory: 1 mismatched word"),
                    ],
                    3100.0,
                ),
            ),
        ];
        assert!(any_gpu_short(&mut first, slot));
        let mut second = vec![
            gpu(0, memory(Verdict::Fail, vec![slow()], 3000.0)),
            gpu(1, memory(Verdict::Pass, vec![], 4290.0)),
            gpu(2, memory(Verdict::Pass, vec![], 4290.0)),
        ];
        assert_eq!(
            replace_gpu_results(&mut first, &mut second, slot, "memory"),
            1
        );
        let m = |i: usize| first[i].memory.clone().unwrap();
        assert_eq!(
            (m(0).verdict, m(0).gbps),
            (Verdict::Pass, 4300.0),
            "a pass stands"
        );
        assert_eq!(
            (m(1).verdict, m(1).gbps),
            (Verdict::Pass, 4290.0),
            "the second decides"
        );
        assert_eq!(m(1).reasons.len(), 1);
        assert_eq!(m(1).reasons[0].code, Code::SecondMeasurement);
        assert_eq!(
            m(1).reasons[0].message,
            "GPU1 memory: the first measurement fell short (GPU? memory: 3100 GB/s < 3600 GB/s (H200 profile)); a second measurement decided: it passed"
        );
        assert_eq!(
            m(2).verdict,
            Verdict::Fail,
            "corruption is never measured away"
        );
        assert!(!any_gpu_short(&mut first, slot));
    }

    #[test]
    fn a_second_shortfall_fails_with_both_said() {
        let mut first = Some(MemoryResult {
            verdict: Verdict::Fail,
            reasons: vec![Code::MemoryBandwidthLow.says("GPU0 memory: 3000 GB/s < 3600 GB/s")],
            ..Default::default()
        });
        let second = Some(MemoryResult {
            verdict: Verdict::Fail,
            reasons: vec![Code::MemoryBandwidthLow.says("GPU0 memory: 3050 GB/s < 3600 GB/s")],
            ..Default::default()
        });
        assert!(replace_node_result(&mut first, second, "GPU0 memory"));
        let r = first.unwrap();
        assert_eq!(r.verdict, Verdict::Fail);
        let codes: Vec<Code> = r.reasons.iter().map(|x| x.code).collect();
        assert_eq!(codes, [Code::MemoryBandwidthLow, Code::SecondMeasurement]);
        assert!(r.reasons[0].message.contains("3050"));
        assert!(
            r.reasons[1]
                .message
                .ends_with("a second measurement decided: it fell short too")
        );

        let mut lost = Some(MemoryResult {
            verdict: Verdict::Fail,
            reasons: vec![Code::MemoryBandwidthLow.says("GPU0 memory: 3000 GB/s < 3600 GB/s")],
            ..Default::default()
        });
        assert!(replace_node_result(&mut lost, None, "GPU0 memory"));
        let r = lost.unwrap();
        assert_eq!(
            r.verdict,
            Verdict::Error,
            "a lost second measurement is never a pass"
        );
        assert_eq!(r.reasons[0].code, Code::MeasurementMissing);
    }
}
