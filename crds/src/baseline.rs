//! Each GPU held to its own past: from a GPU's earlier runs (the figures its certificates
//! carry), its baseline is the median of each figure over its last N passing runs; a new run
//! more than a tolerance below its own baseline is a Warn ([`Code::BelowOwnBaseline`]) even
//! where it clears the model's floor. Pure: the operator reads the history and hands the
//! baselines to the agent ([`crate::agent_env::BASELINES`]), the agent judges with them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::reason::{Code, Reason};
use crate::report::GpuReport;

/// Passing runs a baseline is the median of, by default.
pub const DEFAULT_RUNS: usize = 5;
/// How far below its baseline a figure may fall before it is a Warn, by default (a fraction).
pub const DEFAULT_TOLERANCE: f64 = 0.10;

/// One GPU's figures in one earlier run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuRun {
    pub uuid: String,
    /// RFC 3339: when the run ended (orders the history).
    pub finished_at: String,
    /// The GPU passed that run (only passing runs make a baseline).
    pub passed: bool,
    pub figures: BTreeMap<String, f64>,
}

/// One GPU's baseline: each figure's median over its last passing runs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuBaseline {
    pub uuid: String,
    /// The runs the medians are over.
    pub runs: usize,
    pub figures: BTreeMap<String, f64>,
}

/// What the agent is handed: each GPU's baseline and the tolerance.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Baselines {
    pub tolerance: f64,
    pub gpus: Vec<GpuBaseline>,
}

/// A GPU report's run, as the history records it. A run that passed only with a
/// [`Code::BelowOwnBaseline`] Warn does not count as passing, so a GPU that degrades does not
/// drag its own baseline down with it.
pub fn gpu_run(g: &GpuReport, finished_at: &str) -> GpuRun {
    GpuRun {
        uuid: g.uuid.clone(),
        finished_at: finished_at.to_string(),
        passed: g.verdict.passes() && !g.reasons.iter().any(|r| r.code == Code::BelowOwnBaseline),
        figures: crate::certificate::gpu_figures(g),
    }
}

/// Each GPU's baseline from `history` (any order): the median of each figure over the GPU's
/// newest `runs` passing runs. A GPU without a passing run has none.
pub fn baselines(history: &[GpuRun], runs: usize, tolerance: f64) -> Baselines {
    let mut by_gpu: BTreeMap<&str, Vec<&GpuRun>> = BTreeMap::new();
    for r in history.iter().filter(|r| r.passed) {
        by_gpu.entry(r.uuid.as_str()).or_default().push(r);
    }
    let gpus = by_gpu
        .into_iter()
        .map(|(uuid, mut rs)| {
            rs.sort_by(|a, b| b.finished_at.cmp(&a.finished_at));
            rs.truncate(runs.max(1));
            let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for r in &rs {
                for (k, v) in &r.figures {
                    values.entry(k.clone()).or_default().push(*v);
                }
            }
            GpuBaseline {
                uuid: uuid.to_string(),
                runs: rs.len(),
                figures: values
                    .into_iter()
                    .map(|(k, mut v)| (k, median(&mut v)))
                    .collect(),
            }
        })
        .collect();
    Baselines { tolerance, gpus }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The Warns of GPU `g` against its own baseline in `b`: one per figure more than the tolerance
/// below its median, naming the figure and both values.
pub fn judge(g: &GpuReport, b: &Baselines) -> Vec<Reason> {
    let Some(base) = b.gpus.iter().find(|x| x.uuid == g.uuid) else {
        return Vec::new();
    };
    crate::certificate::gpu_figures(g)
        .into_iter()
        .filter_map(|(figure, now)| {
            let was = *base.figures.get(&figure)?;
            (was > 0.0 && now < was * (1.0 - b.tolerance)).then(|| {
                Reason::new(
                    Code::BelowOwnBaseline,
                    format!(
                    "GPU{} {figure}: {now:.1}, {:.1}% below its own baseline {was:.1} (median of its last {} passing run(s); tolerance {:.0}%)",
                    g.index,
                    (1.0 - now / was) * 100.0,
                    base.runs,
                    b.tolerance * 100.0
                ),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{MemoryResult, Verdict};

    fn run(uuid: &str, at: &str, passed: bool, gbps: f64) -> GpuRun {
        GpuRun {
            uuid: uuid.into(),
            finished_at: at.into(),
            passed,
            figures: BTreeMap::from([("memory.gbps".to_string(), gbps)]),
        }
    }

    fn gpu(uuid: &str, gbps: f64) -> GpuReport {
        GpuReport {
            index: 3,
            uuid: uuid.into(),
            memory: Some(MemoryResult {
                gbps,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_baseline_is_the_median_of_the_newest_passing_runs() {
        let history = [
            run("a", "2026-01-01", true, 1000.0), // oldest: beyond the newest 3
            run("a", "2026-01-02", true, 3000.0),
            run("a", "2026-01-03", false, 10.0), // failed: not counted
            run("a", "2026-01-04", true, 3100.0),
            run("a", "2026-01-05", true, 2900.0),
            run("b", "2026-01-05", false, 5.0),
        ];
        let b = baselines(&history, 3, 0.1);
        assert_eq!(b.gpus.len(), 1, "b never passed: no baseline");
        assert_eq!(b.gpus[0].runs, 3);
        assert_eq!(b.gpus[0].figures.get("memory.gbps"), Some(&3000.0));
        let even = baselines(&history[..2], 5, 0.1);
        assert_eq!(even.gpus[0].figures.get("memory.gbps"), Some(&2000.0));
    }

    #[test]
    fn a_figure_more_than_the_tolerance_below_its_own_baseline_warns_naming_both_values() {
        let b = baselines(&[run("a", "t", true, 3000.0)], 5, 0.1);
        assert!(
            judge(&gpu("a", 2750.0), &b).is_empty(),
            "8% below: within 10%"
        );
        assert!(judge(&gpu("other", 100.0), &b).is_empty(), "no history");
        let r = judge(&gpu("a", 2600.0), &b);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].code, Code::BelowOwnBaseline);
        assert_eq!(r[0].severity.verdict(), Verdict::Warn);
        assert!(
            r[0].message.contains("memory.gbps: 2600.0"),
            "{}",
            r[0].message
        );
        assert!(r[0].message.contains("baseline 3000.0"), "{}", r[0].message);
    }
}
