//! Judging the topology: NVLink between every pair where required, active link counts, and
//! link state changes during the run.

use gpuval_crds::TopologyReport;

use crate::backend::GpuInfo;
use crate::judge::{Code, Judge, Reason, Says, push_unique, verdict_of};

impl Judge<'_> {
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
                    .any(|g| self.profile_of(&g.name).is_some_and(|p| p.require_nvlink))
        });
        let mut reasons = Vec::new();
        if require {
            reasons.extend(non_nvlink_pairs(&report));
        }
        for gpu in gpus {
            reasons.extend(self.link_count_reason(gpu, &report, require, spec.min_active_links));
        }
        reasons.extend(report.link_changes.iter().map(|c| {
            Code::NvlinkLinkChanged.says(format!("NVLink state changed during the run: {c}"))
        }));
        if !reasons.is_empty() {
            report.verdict = report.verdict.max(verdict_of(&reasons));
            push_unique(&mut report.reasons, reasons);
        }
        report
    }

    fn link_count_reason(
        &self,
        gpu: &GpuInfo,
        report: &TopologyReport,
        require: bool,
        min_active_links: Option<i32>,
    ) -> Option<Reason> {
        let (expected, source) = match min_active_links {
            Some(n) => (i64::from(n), "spec minActiveLinks".to_string()),
            None if require => {
                let p = self.profile_of(&gpu.name)?;
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
        Some(Code::NvlinkLinksInactive.says(format!(
            "GPU{}: {have}, expected {expected} ({source})",
            gpu.index
        )))
    }
}

/// Every GPU pair whose matrix cell is not NVLink (`NV#`), named once per pair.
fn non_nvlink_pairs(report: &TopologyReport) -> Vec<Reason> {
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
                reasons.push(Code::NvlinkNotConnected.says(format!(
                    "{} and {} are connected by {how}, not NVLink",
                    label(i),
                    label(j)
                )));
            }
        }
    }
    reasons
}

#[cfg(test)]
mod tests {
    use gpuval_crds::{Checks, NvlinkState, Profile, TopologyCheck, Verdict};

    use super::*;
    use crate::judge::testing::{assert_fails_with, checks_with, gpu, h200, judge};

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
        checks_with(|c| c.topology = Some(spec))
    }

    /// `t` on `n` H200s, judged with default topology settings under `profile`.
    fn default_judged(profile: Profile, n: u32, t: TopologyReport) -> TopologyReport {
        judge(&topo_checks(TopologyCheck::default()), profile).topology(&h200s(n), t)
    }

    fn h200s(n: u32) -> Vec<GpuInfo> {
        (0..n).map(h200).collect()
    }

    #[test]
    fn topology_full_nvlink_passes() {
        let r = default_judged(Profile::Auto, 4, topo(4, "NV18", 18));
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    }

    #[test]
    fn a_single_gpu_is_not_held_to_the_profiles_nvlink_count() {
        let mut t = topo(1, "NV18", 0);
        t.nvlinks[0].total = 0;
        let r = default_judged(Profile::Auto, 1, t.clone());
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
        let mut t = topo(4, "NV18", 18);
        t.matrix[0][3] = "SYS".into();
        t.matrix[3][0] = "SYS".into();
        let r = default_judged(Profile::Auto, 4, t);
        assert_fails_with(
            r.verdict,
            &r.reasons,
            &["GPU0 and GPU3 are connected by SYS, not NVLink"],
        );
    }

    #[test]
    fn topology_missing_links_fail() {
        let mut t = topo(4, "NV18", 18);
        t.nvlinks[2].active = 17;
        let r = default_judged(Profile::Auto, 4, t.clone());
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
        let mut t = topo(2, "NV18", 18);
        t.link_changes = vec!["GPU1 link 4 went down at +93s".into()];
        let r = default_judged(Profile::None, 2, t);
        assert_fails_with(
            r.verdict,
            &r.reasons,
            &["NVLink state changed during the run: GPU1 link 4 went down at +93s"],
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
}
