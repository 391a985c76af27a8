//! The compute check: a sustained GEMM burn (bf16, fp16, tf32, fp32) on every GPU at once with
//! every result slot cross-checked, plus an elementwise transcendental kernel; TFLOP/s per data
//! type; power drawn against the enforced limit and clocks lost to hardware or thermal slowdowns
//! during the burn; optionally a power pulse (load and idle in turn) after it, with the results
//! checked again and the power swing reported.

mod cuda;
pub mod power;
pub mod row;
mod sim;
#[cfg(test)]
mod tests;

crate::check_result!(gpuval_crds::ComputeResult);

use std::time::{Duration, Instant};

use gpuval_crds::{
    ComputeCheck, ComputeResult, Dtype, GemmResult, GpuReport, NodeReport, PulseSpec,
    TranscendentalResult,
};

use self::power::{PowerOutcome, PulseOutcome, judge_power, judge_pulse};
use crate::backend::{Backend, GpuInfo};
use crate::check::given;
use crate::check::{GpuCheck, JudgeGpu, Measurement, OnGpu};
use crate::judge::{Code, Judge, Reason, Says, measured, plural, ran, to_i64, verdict_of};
use crate::profiles::ModelProfile;
use crate::text::{columns, dash, indent};

/// Compute burn parameters for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeRequest {
    /// Total burn time; split evenly among the dtypes.
    pub duration: Duration,
    pub dtypes: Vec<Dtype>,
    pub matrix_size: usize,
    pub transcendentals: bool,
    /// The power pulse after the burn, when asked for.
    pub pulse: Option<PulseRequest>,
}

/// Load and idle in turn, half a period each, for `duration`; cycles start on multiples of the
/// period from `epoch`, the same for every GPU of the node.
#[derive(Debug, Clone, PartialEq)]
pub struct PulseRequest {
    pub period: Duration,
    pub duration: Duration,
    pub epoch: Instant,
}

/// One dtype's burn on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmOutcome {
    pub dtype: Dtype,
    /// Floating-point operations done by the timed GEMMs (2·n³ each).
    pub flops: f64,
    /// Device-timed seconds of the GEMM batches.
    pub gemm_seconds: f64,
    pub iterations: u64,
    /// Result slots compared with the first one, and elements that differed beyond tolerance.
    pub comparisons: u64,
    pub mismatches: u64,
    pub max_rel_error: f64,
    pub wall_seconds: f64,
}

impl GemmOutcome {
    /// A burn of `dtype` that has timed and compared nothing yet.
    pub fn nothing(dtype: Dtype) -> Self {
        Self {
            dtype,
            flops: 0.0,
            gemm_seconds: 0.0,
            iterations: 0,
            comparisons: 0,
            mismatches: 0,
            max_rel_error: 0.0,
            wall_seconds: 0.0,
        }
    }

    pub fn tflops(&self) -> f64 {
        if self.gemm_seconds > 0.0 {
            self.flops / self.gemm_seconds / 1e12
        } else {
            0.0
        }
    }
}

/// The elementwise transcendental kernel on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TranscendentalOutcome {
    /// Elements per run (each element does many sin/exp rounds); the rate is elements × iterations / seconds.
    pub elements: u64,
    pub seconds: f64,
    pub iterations: u64,
    pub mismatches: u64,
}

/// What a compute burn measured on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ComputeOutcome {
    pub gemms: Vec<GemmOutcome>,
    pub transcendental: Option<TranscendentalOutcome>,
    pub seconds: f64,
    /// Power limits and the samples taken during the burn and the pulse.
    pub power: PowerOutcome,
    pub pulse: Option<PulseOutcome>,
}

/// The compute check as its spec asks for it.
pub struct Compute {
    pub request: ComputeRequest,
}

impl Compute {
    pub fn from_spec(spec: &ComputeCheck) -> Self {
        Self {
            request: ComputeRequest {
                duration: spec.duration.as_std(),
                dtypes: spec.dtypes.clone(),
                matrix_size: usize::try_from(spec.matrix_size.max(256)).unwrap_or(256),
                transcendentals: spec.transcendentals,
                pulse: spec.pulse.as_ref().map(|p| PulseRequest {
                    period: p.period.as_std(),
                    duration: p.duration.as_std(),
                    epoch: Instant::now(),
                }),
            },
        }
    }
}

impl GpuCheck for Compute {
    const NAME: &'static str = "compute";
    type Outcome = ComputeOutcome;

    fn measure(&self, on: &OnGpu<'_>) -> Measurement<ComputeOutcome> {
        let &OnGpu { backend, gpu, ctl } = on;
        match backend {
            Backend::Cuda(b) => cuda::measure(b, gpu.index, &self.request, ctl),
            Backend::Simulated(b) => b.compute_burn(gpu.index, &self.request, ctl),
        }
    }

    fn judge(
        &self,
        on: &JudgeGpu<'_>,
        measured: Measurement<ComputeOutcome>,
        into: &mut GpuReport,
    ) {
        into.compute = Some(Judge::judged(measured, |o| on.judge.compute(on.gpu, &o)));
    }

    /// The relative rule per data type: a GPU far below its peers' TFLOP/s fails.
    fn compare(&self, judge: &Judge<'_>, gpus: &mut [GpuReport]) {
        for dtype in Dtype::ALL {
            judge.relative_per_gpu(
                gpus,
                Code::ComputeSlow,
                dtype.as_str(),
                "TFLOP/s",
                |g| gemm_tflops(g, dtype),
                |g| g.compute.as_mut(),
            );
        }
    }
}

impl Judge<'_> {
    /// Judges one GPU's compute burn: result mismatches and TFLOP/s per data type, the
    /// transcendental kernel's mismatches, power and clocks during the burn, and the pulse.
    pub fn compute(&self, gpu: &GpuInfo, out: &ComputeOutcome) -> ComputeResult {
        let spec = self.checks.compute.clone().unwrap_or_default();
        let profile = self.profile_of(&gpu.name);
        let mut reasons = Vec::new();
        let mut gemms = Vec::with_capacity(out.gemms.len());
        for g in &out.gemms {
            reasons.extend(gemm_reasons(gpu.index, g, &spec, profile));
            gemms.push(gemm_result(g));
        }
        let transcendental = out.transcendental.as_ref().map(|t| {
            if t.mismatches > 0 {
                reasons.push(Code::ComputeMismatch.says(format!(
                    "GPU{} transcendental: {} elements differed from the first run",
                    gpu.index, t.mismatches
                )));
            }
            transcendental_result(t)
        });
        let power = judge_power(gpu.index, &out.power, &spec, profile, &mut reasons);
        let pulse = out
            .pulse
            .as_ref()
            .map(|p| judge_pulse(gpu.index, p, &out.power, &mut reasons));
        ComputeResult {
            verdict: verdict_of(&reasons),
            reasons,
            seconds: out.seconds,
            matrix_size: spec.matrix_size,
            gemms,
            transcendental,
            power,
            pulse,
        }
    }
}

fn gemm_reasons(
    gpu: u32,
    g: &GemmOutcome,
    spec: &ComputeCheck,
    profile: Option<&ModelProfile>,
) -> Vec<Reason> {
    let mut reasons = Vec::new();
    if g.mismatches > 0 {
        reasons.push(Code::ComputeMismatch.says(format!(
            "GPU{gpu} {}: {} mismatched element{} in {} result comparisons (max relative error {:.2e})",
            g.dtype,
            g.mismatches,
            plural(g.mismatches),
            g.comparisons,
            g.max_rel_error
        )));
    }
    let floor = match spec.min_tflops.as_ref().and_then(|t| t.get(g.dtype)) {
        Some(v) => Some((f64::from(v), "spec minTflops".to_string())),
        None => profile.and_then(|p| {
            p.tflops_min(g.dtype)
                .map(|v| (v, format!("{} profile", p.name)))
        }),
    };
    if let Some((floor, source)) = floor {
        match measured(g.tflops()) {
            None => reasons.push(Code::MeasurementMissing.says(format!(
                "GPU{gpu} {}: no TFLOP/s were measured (the {source} floor cannot be checked)",
                g.dtype
            ))),
            Some(tflops) if tflops < floor => reasons.push(Code::ComputeSlow.says(format!(
                "GPU{gpu} {}: {tflops:.0} TFLOP/s < {floor:.0} TFLOP/s ({source})",
                g.dtype
            ))),
            Some(_) => {}
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

fn gemm_tflops(g: &GpuReport, dtype: Dtype) -> Option<f64> {
    g.compute
        .as_ref()
        .filter(|c| ran(c.verdict))
        .and_then(|c| c.gemms.iter().find(|r| r.dtype == dtype))
        .map(|r| r.tflops)
        .filter(|v| v.is_finite() && *v > 0.0)
}

/// Command-line flags of the compute check.
#[derive(clap::Args, Debug, Clone, Default)]
#[group(skip)]
pub struct Flags {
    /// Compute burn duration, like 60s, 5m, 1h.
    #[arg(long)]
    pub duration: Option<gpuval_crds::Duration>,
    /// GEMM data types (comma-separated): bf16, fp16, tf32, fp32.
    #[arg(long, value_delimiter = ',')]
    pub dtypes: Option<Vec<Dtype>>,
    /// GEMM matrix size (a multiple of 256).
    #[arg(long)]
    pub matrix_size: Option<i32>,
    /// Leave out the transcendental (sin/exp) kernel.
    #[arg(long)]
    pub no_transcendentals: bool,
    /// Lowest share of the enforced power limit the burn's median sample must reach (0 to 1;
    /// default: the model profile's, 0.75 on H100, H200, A100; 0: not judged).
    #[arg(long)]
    pub min_power_fraction: Option<f64>,
    /// Largest share of the burn's samples with clocks slowed by hardware or thermal limits
    /// (0 to 1, default 0.05).
    #[arg(long)]
    pub max_slowdown_fraction: Option<f64>,
    /// After the burn, alternate load and idle with this period (like 1s, 500ms).
    #[arg(long)]
    pub pulse_period: Option<gpuval_crds::Duration>,
    /// How long the pulse runs (like 60s); either pulse flag turns the pulse on.
    #[arg(long)]
    pub pulse_duration: Option<gpuval_crds::Duration>,
}

impl Flags {
    /// Applies the flags that were given to the check's settings.
    pub fn apply(&self, spec: &mut ComputeCheck) {
        let Self {
            duration,
            dtypes,
            matrix_size,
            no_transcendentals,
            min_power_fraction,
            max_slowdown_fraction,
            pulse_period,
            pulse_duration,
        } = self;
        given(&mut spec.duration, duration);
        given(&mut spec.dtypes, dtypes);
        given(&mut spec.matrix_size, matrix_size);
        spec.transcendentals &= !*no_transcendentals;
        if min_power_fraction.is_some() {
            spec.min_power_fraction = *min_power_fraction;
        }
        if max_slowdown_fraction.is_some() {
            spec.max_slowdown_fraction = *max_slowdown_fraction;
        }
        if pulse_period.is_some() || pulse_duration.is_some() {
            let pulse = spec.pulse.get_or_insert_with(PulseSpec::default);
            given(&mut pulse.period, pulse_period);
            given(&mut pulse.duration, pulse_duration);
        }
    }
}

/// Power during the burn and the pulse, per GPU, when sampled.
pub fn section(report: &NodeReport) -> String {
    let sampled: Vec<&GpuReport> = report
        .gpus
        .iter()
        .filter(|g| g.compute.as_ref().is_some_and(|c| c.power.is_some()))
        .collect();
    if sampled.is_empty() {
        return String::new();
    }
    let mut rows = vec![
        [
            "GPU",
            "MEDIAN W",
            "LIMIT W",
            "SHARE",
            "SLOWED",
            "THROTTLE REASONS",
            "PULSE SWING W",
            "PULSE CHECK",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in sampled {
        let Some(c) = &g.compute else { continue };
        let Some(p) = &c.power else { continue };
        let reasons: Vec<String> = p
            .throttle
            .iter()
            .map(|t| format!("{} {:.0}%", t.reason, 100.0 * t.fraction))
            .collect();
        let (swing, check) = match &c.pulse {
            Some(u) => (
                u.swing_w.map_or_else(dash, |w| format!("{w:.0}")),
                format!("{} bad of {}", u.mismatches, u.comparisons),
            ),
            None => (dash(), dash()),
        };
        rows.push(vec![
            g.index.to_string(),
            format!("{:.0}", p.median_w),
            p.limit_w.map_or_else(dash, |l| format!("{l:.0}")),
            p.fraction
                .map_or_else(dash, |f| format!("{:.0}%", 100.0 * f)),
            format!("{:.0}%", 100.0 * p.slowdown_fraction),
            if reasons.is_empty() {
                dash()
            } else {
                reasons.join(", ")
            },
            swing,
            check,
        ]);
    }
    format!("power during the burn:\n{}", indent(&columns(&rows)))
}

/// The GPU table's COMPUTE cell: `bf16 681 fp16 671`.
pub fn cell(c: &ComputeResult) -> String {
    if c.gemms.is_empty() {
        return c.verdict.to_string();
    }
    c.gemms
        .iter()
        .map(|g| format!("{} {:.0}", g.dtype, g.tflops))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The headline's parts, one per data type: `bf16 677-682 TFLOP/s`.
pub fn headline(report: &NodeReport) -> Vec<String> {
    let gemms = || {
        report
            .gpus
            .iter()
            .flat_map(|g| g.compute.iter().flat_map(|c| &c.gemms))
    };
    let mut dtypes: Vec<Dtype> = Vec::new();
    for gm in gemms() {
        if !dtypes.contains(&gm.dtype) {
            dtypes.push(gm.dtype);
        }
    }
    dtypes
        .into_iter()
        .map(|d| {
            let v: Vec<f64> = gemms()
                .filter(|gm| gm.dtype == d)
                .map(|gm| gm.tflops)
                .collect();
            format!("{d} {} TFLOP/s", crate::text::span(&v, 0))
        })
        .collect()
}
