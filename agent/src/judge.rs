//! The judging vocabulary every check shares: the [`Judge`] context (spec, thresholds, model
//! profiles, severity overrides), the [`CheckResult`] trait of report results, the relative
//! rule ([`outliers`]), and the small helpers for reasons and figures. Each check's own rules
//! live in its folder under `checks/`; the runner's aggregation into GPU and node verdicts in
//! `runner::aggregate`.
//!
//! A reason is always made with its code (`Reason::new(Code::MemoryMismatch, ...)`, or
//! [`Says::says`]): the code gives its default severity and action, and a result's verdict is
//! the worst its reasons' severities give ([`verdict_of`]).

use gpuval_crds::reason::Overrides;
pub use gpuval_crds::reason::{Code, Reason, Severity, verdict_of};
use gpuval_crds::{Checks, Thresholds, Verdict};

use crate::backend::BackendError;
use crate::profiles::{ModelProfile, profile_for};

/// `Code::X.says(message)`: a reason of this code with its default severity and action.
pub trait Says {
    fn says(self, message: impl Into<String>) -> Reason;
}

impl Says for Code {
    fn says(self, message: impl Into<String>) -> Reason {
        Reason::new(self, message)
    }
}

/// A check's result in the report: it carries a verdict and the reasons for it.
pub trait CheckResult: Default {
    fn verdict(&self) -> Verdict;
    fn set_verdict(&mut self, verdict: Verdict);
    fn reasons(&self) -> &[Reason];
    fn reasons_mut(&mut self) -> &mut Vec<Reason>;

    fn set_outcome(&mut self, verdict: Verdict, reasons: Vec<Reason>) {
        self.set_verdict(verdict);
        *self.reasons_mut() = reasons;
    }

    /// Adds `reason` once, and raises the verdict to at least what its severity gives.
    fn worsen(&mut self, reason: Reason) {
        let v = self.verdict().max(reason.severity.verdict());
        self.set_verdict(v);
        push_unique(self.reasons_mut(), [reason]);
    }

    /// Applies the spec's severity overrides to the reasons; where one changed, the verdict
    /// becomes what the reasons now give (a Skipped or Error result keeps its verdict: an
    /// override never turns a check that could not measure into a pass).
    fn apply_overrides(&mut self, overrides: &Overrides) {
        if !overrides.apply(self.reasons_mut()) {
            return;
        }
        if !matches!(self.verdict(), Verdict::Skipped | Verdict::Error) {
            let v = verdict_of(self.reasons());
            self.set_verdict(v);
        }
    }
}

/// A check's result behind `dyn`: what a pass over every result of a report sees.
pub trait AnyResult {
    fn verdict(&self) -> Verdict;
    fn set_verdict(&mut self, verdict: Verdict);
    fn reasons_mut(&mut self) -> &mut Vec<Reason>;
    /// [`CheckResult::apply_overrides`].
    fn overridden(&mut self, overrides: &Overrides);
}

impl<T: CheckResult> AnyResult for T {
    fn verdict(&self) -> Verdict {
        CheckResult::verdict(self)
    }
    fn set_verdict(&mut self, verdict: Verdict) {
        CheckResult::set_verdict(self, verdict);
    }
    fn reasons_mut(&mut self) -> &mut Vec<Reason> {
        CheckResult::reasons_mut(self)
    }
    fn overridden(&mut self, overrides: &Overrides) {
        CheckResult::apply_overrides(self, overrides);
    }
}

/// Implements [`CheckResult`] for report types with `verdict` and `reasons` fields.
#[macro_export]
macro_rules! check_result {
    ($($t:ty),*) => {$(
        impl $crate::judge::CheckResult for $t {
            fn verdict(&self) -> gpuval_crds::Verdict {
                self.verdict
            }
            fn set_verdict(&mut self, verdict: gpuval_crds::Verdict) {
                self.verdict = verdict;
            }
            fn reasons(&self) -> &[gpuval_crds::Reason] {
                &self.reasons
            }
            fn reasons_mut(&mut self) -> &mut Vec<gpuval_crds::Reason> {
                &mut self.reasons
            }
        }
    )*};
}

/// Judges results against the spec's checks and thresholds and the model profiles.
pub struct Judge<'a> {
    pub checks: &'a Checks,
    pub thresholds: Thresholds,
    /// `spec.severityOverrides`.
    pub overrides: Overrides,
}

impl Judge<'_> {
    /// The verdict and reason of a check that could not run: a missing library, a stop, or
    /// anything else that kept it from measuring.
    pub fn check_error(err: &BackendError) -> (Verdict, Vec<Reason>) {
        (Verdict::Error, vec![error_reason(err)])
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
        code: Code,
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
                r.worsen(code.says(why));
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

/// The reason of a backend error: a missing library, a stop, or a check that could not run.
pub fn error_reason(err: &BackendError) -> Reason {
    let code = match err {
        BackendError::MissingLibrary { .. } => Code::LibraryMissing,
        BackendError::TempDir { .. } => Code::TempDirUnusable,
        BackendError::Stopped => Code::RunStopped,
        BackendError::NoGpu(_) => Code::NoGpus,
        BackendError::Gpu { .. }
        | BackendError::NoSuchGpu(_)
        | BackendError::CollectiveSetup { .. }
        | BackendError::Silent(_)
        | BackendError::Hung(_)
        | BackendError::Other(_) => Code::CheckCouldNotRun,
    };
    code.says(err.to_string())
}

/// [`error_reason`] with its message under a heading: `inventory: no NVIDIA GPU visible`.
pub fn error_reason_in(what: &str, err: &BackendError) -> Reason {
    let r = error_reason(err);
    Reason {
        message: format!("{what}: {}", r.message),
        ..r
    }
}

/// Adds each reason that is not there yet, in order.
pub fn push_unique<T: PartialEq>(into: &mut Vec<T>, reasons: impl IntoIterator<Item = T>) {
    for r in reasons {
        if !into.contains(&r) {
            into.push(r);
        }
    }
}

/// `Some(value)` when it is a figure that was measured (finite and above zero), else None: a
/// missing figure is never compared with a floor (it is an Error, see [`Code::MeasurementMissing`]).
pub fn measured(value: f64) -> Option<f64> {
    (value.is_finite() && value > 0.0).then_some(value)
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

    /// Asserts a Fail verdict whose reasons' messages are exactly `want`.
    pub fn assert_fails_with(verdict: Verdict, reasons: &[gpuval_crds::Reason], want: &[&str]) {
        assert_eq!(verdict, Verdict::Fail, "{reasons:?}");
        assert_eq!(reasons, want);
    }

    /// Lines to look through: reasons, notes, failures, log lines.
    pub trait Lines: std::ops::Deref<Target = str> + std::fmt::Debug {}
    impl<T: std::ops::Deref<Target = str> + std::fmt::Debug> Lines for T {}

    fn assert_any(lines: &[impl Lines], how: String, matches: impl Fn(&str) -> bool) {
        assert!(lines.iter().any(|l| matches(l)), "none {how}: {lines:#?}");
    }

    /// Asserts that one of `lines` contains `fragment`.
    pub fn assert_any_contains(lines: &[impl Lines], fragment: &str) {
        assert_any(lines, format!("contains {fragment:?}"), |l| {
            l.contains(fragment)
        });
    }

    /// Asserts that one of `lines` starts with `prefix`.
    pub fn assert_any_starts_with(lines: &[impl Lines], prefix: &str) {
        assert_any(lines, format!("starts with {prefix:?}"), |l| {
            l.starts_with(prefix)
        });
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

    /// A whole run of `checks` (default thresholds) on the simulated backend of spec `sim`.
    pub fn simulated_run(sim: &str, checks: Checks) -> gpuval_crds::NodeReport {
        use crate::backend::{Backend, sim::SimBackend};
        let backend = Backend::Simulated(SimBackend::new(sim.parse().expect("sim spec")));
        let plan = crate::runner::Plan::new(checks, Thresholds::default());
        crate::runner::run(
            &backend,
            &plan,
            &std::sync::atomic::AtomicBool::new(false),
            &|_| {},
        )
    }

    /// A judge with this profile and a 15% relative tolerance.
    pub fn judge(checks: &Checks, profile: Profile) -> Judge<'_> {
        Judge {
            checks,
            thresholds: Thresholds {
                profile,
                relative_tolerance_percent: 15,
                remeasure: true,
            },
            overrides: Default::default(),
        }
    }
}

#[cfg(test)]
mod median_tests {
    use super::median;

    #[test]
    fn the_middle_value_of_an_odd_count_the_mean_of_the_middle_two_none_without_values() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
