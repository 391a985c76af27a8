//! The judging vocabulary every check shares: the [`Judge`] context (spec, thresholds, model
//! profiles), the [`CheckResult`] trait of report results, the relative rule ([`outliers`]),
//! and the small helpers for reasons and figures. Each check's own rules live in its folder
//! under `checks/`; the runner's aggregation into GPU and node verdicts in `runner::aggregate`.

use gpuval_crds::{Checks, Thresholds, Verdict};

use crate::backend::BackendError;
use crate::profiles::{ModelProfile, profile_for};

/// A check's result in the report: it carries a verdict and the reasons for it.
pub trait CheckResult: Default {
    fn verdict(&self) -> Verdict;
    fn reasons(&self) -> &[String];
    fn set_outcome(&mut self, verdict: Verdict, reasons: Vec<String>);
    /// Raises the verdict to at least `verdict` and adds `reason` once.
    fn worsen(&mut self, verdict: Verdict, reason: String);
}

/// Implements [`CheckResult`] for report types with `verdict` and `reasons` fields.
#[macro_export]
macro_rules! check_result {
    ($($t:ty),*) => {$(
        impl $crate::judge::CheckResult for $t {
            fn verdict(&self) -> gpuval_crds::Verdict {
                self.verdict
            }
            fn reasons(&self) -> &[String] {
                &self.reasons
            }
            fn set_outcome(&mut self, verdict: gpuval_crds::Verdict, reasons: Vec<String>) {
                self.verdict = verdict;
                self.reasons = reasons;
            }
            fn worsen(&mut self, verdict: gpuval_crds::Verdict, reason: String) {
                self.verdict = self.verdict.max(verdict);
                $crate::judge::push_unique(&mut self.reasons, [reason]);
            }
        }
    )*};
}

/// Judges results against the spec's checks and thresholds and the model profiles.
pub struct Judge<'a> {
    pub checks: &'a Checks,
    pub thresholds: Thresholds,
}

impl Judge<'_> {
    /// The verdict and reason of a check that could not run.
    pub fn check_error(err: &BackendError) -> (Verdict, Vec<String>) {
        (Verdict::Error, vec![err.to_string()])
    }

    /// The result of a check that could not run: Error, with the backend's reason.
    pub fn errored<R: CheckResult>(err: &BackendError) -> R {
        let (verdict, reasons) = Self::check_error(err);
        let mut r = R::default();
        r.set_outcome(verdict, reasons);
        r
    }

    /// `ok` of what the backend measured, or [`Judge::errored`] when it could not measure.
    pub fn judged<O, R: CheckResult>(
        measured: Result<O, BackendError>,
        ok: impl FnOnce(O) -> R,
    ) -> R {
        match measured {
            Ok(o) => ok(o),
            Err(e) => Self::errored(&e),
        }
    }

    /// The model profile that applies to a GPU of this name (spec setting or Auto).
    pub fn profile_of(&self, gpu_name: &str) -> Option<&'static ModelProfile> {
        profile_for(self.thresholds.profile, gpu_name)
    }

    /// The relative rule's tolerance as a share (`relativeTolerancePercent`, clamped to 1..90).
    pub fn tolerance(&self) -> f64 {
        f64::from(self.thresholds.relative_tolerance_percent.clamp(1, 90)) / 100.0
    }

    /// The relative rule over one figure of every GPU (None where the GPU has no such figure):
    /// each GPU more than the tolerance below the median of the others gets a Fail with
    /// `GPU2 memory: 3100 GB/s is 27% below its peers (median 4300)` on the result `pick` gives.
    pub fn relative_per_gpu<R: CheckResult>(
        &self,
        gpus: &mut [gpuval_crds::GpuReport],
        what: &str,
        unit: &str,
        figure: impl Fn(&gpuval_crds::GpuReport) -> Option<f64>,
        pick: impl Fn(&mut gpuval_crds::GpuReport) -> Option<&mut R>,
    ) {
        let values: Vec<Option<f64>> = gpus.iter().map(&figure).collect();
        for (i, value, median) in outliers(&values, self.tolerance()) {
            let name = format!("GPU{}", gpus[i].index);
            if let Some(r) = pick(&mut gpus[i]) {
                let why = below_peers_named(&name, what, value, unit, median, "its peers");
                r.worsen(Verdict::Fail, why);
            }
        }
    }
}

/// A check that ran (its figures mean something), as opposed to one skipped or in error.
pub fn ran(v: Verdict) -> bool {
    !matches!(v, Verdict::Skipped | Verdict::Error)
}

/// `(position, value, median of the others)` of every value more than `tolerance` (a share)
/// below the median of the other values; positions without a value are neither judged nor
/// counted as peers.
pub fn outliers(values: &[Option<f64>], tolerance: f64) -> Vec<(usize, f64, f64)> {
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
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// `GPU1->GPU3 unidirectional: 120 GB/s is 69% below the other pairs (median 392)`.
pub fn below_peers_named(
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

/// Adds each reason that is not there yet, in order.
pub fn push_unique(into: &mut Vec<String>, reasons: impl IntoIterator<Item = String>) {
    for r in reasons {
        if !into.contains(&r) {
            into.push(r);
        }
    }
}

/// Fail when there is any reason, else Pass.
pub fn fail_if_any(reasons: &[String]) -> Verdict {
    if reasons.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail
    }
}

/// Bytes per second in GB/s (1e9); 0 without a time.
pub fn gbps_of(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

/// `""` for one, `"s"` otherwise.
pub fn plural<T: PartialEq + From<u8>>(n: T) -> &'static str {
    if n == T::from(1) { "" } else { "s" }
}

/// A count for the report (saturating).
pub fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `v` rounded to `decimals` decimals (keeps stored reports small and readable).
pub fn round_to(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

/// Fixtures shared by the checks' judge tests.
#[cfg(test)]
pub mod testing {
    use gpuval_crds::{Checks, GpuHealth, Profile, Thresholds, Verdict};

    use super::Judge;
    use crate::backend::GpuInfo;

    /// Asserts a Fail verdict whose reasons are exactly `want`.
    pub fn assert_fails_with(verdict: Verdict, reasons: &[String], want: &[&str]) {
        assert_eq!(verdict, Verdict::Fail, "{reasons:?}");
        assert_eq!(reasons, want);
    }

    /// Default settings with what `set` changes.
    pub fn checks_with(set: impl FnOnce(&mut Checks)) -> Checks {
        let mut checks = Checks::default();
        set(&mut checks);
        checks
    }

    const MIB: u64 = 1024 * 1024;

    /// A GPU of this name with 143,771 MiB, all but 600 MiB free.
    pub fn gpu(index: u32, name: &str) -> GpuInfo {
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

    pub fn h200(index: u32) -> GpuInfo {
        gpu(index, "NVIDIA H200")
    }

    /// A judge with this profile and a 15% relative tolerance.
    pub fn judge(checks: &Checks, profile: Profile) -> Judge<'_> {
        Judge {
            checks,
            thresholds: Thresholds {
                profile,
                relative_tolerance_percent: 15,
            },
        }
    }
}
