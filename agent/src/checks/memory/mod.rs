//! The memory check: a fraction of each GPU's free memory filled with an address-dependent
//! pattern and its inverse, every word verified on the GPU; fill+verify throughput, mismatches
//! with their addresses, and whether another process held memory at start.

mod cuda;
mod sim;
#[cfg(test)]
mod tests;

pub use cuda::selftest;

crate::check_result!(gpuval_crds::MemoryResult);

use gpuval_crds::{GpuReport, MemoryCheck, MemoryResult, Mismatch, NodeReport};

use crate::backend::{Backend, BackendError, GpuInfo};
use crate::check::GpuCheck;
use crate::config::given;
use crate::judge::{Code, Judge, Reason, Says, gbps_of, measured, plural, ran, to_i64, verdict_of};
use crate::run_control::RunControl;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Below this share of total memory free at start, another process holds the GPU.
const MIN_FREE_SHARE: f64 = 0.9;
/// A test that covered less than this share of the fraction asked for fails.
const MIN_TESTED_SHARE: f64 = 0.9;

/// Memory check parameters for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryRequest {
    /// Fraction of free memory to allocate and test.
    pub fraction: f64,
    /// Each pass writes and verifies a pattern and then its bitwise inverse, with a new seed.
    pub passes: u32,
    /// How many mismatches to record with their address.
    pub max_logged: usize,
}

/// What a memory test measured on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemoryOutcome {
    pub total_bytes: u64,
    pub free_bytes_before: u64,
    pub bytes_tested: u64,
    /// Seconds spent in fill kernels and verify kernels (device-timed).
    pub fill_seconds: f64,
    pub verify_seconds: f64,
    /// Bytes written by fills and read by verifies, over all passes.
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub passes: u32,
    /// Mismatched 32-bit words over all passes.
    pub mismatches: u64,
    pub first_mismatches: Vec<Mismatch>,
}

/// The memory check as its spec asks for it.
pub struct Memory {
    pub request: MemoryRequest,
}

impl Memory {
    pub fn from_spec(spec: &MemoryCheck) -> Self {
        Self {
            request: MemoryRequest {
                fraction: spec.fraction,
                passes: u32::try_from(spec.passes.max(1)).unwrap_or(1),
                max_logged: 16,
            },
        }
    }
}

impl GpuCheck for Memory {
    const NAME: &'static str = "memory";
    type Outcome = MemoryOutcome;

    fn measure(
        &self,
        backend: &Backend,
        gpu: &GpuInfo,
        ctl: &RunControl<'_>,
    ) -> Result<MemoryOutcome, BackendError> {
        match backend {
            Backend::Cuda(b) => b.on_gpu(gpu.index, |ctx, k| {
                cuda::run(ctx, gpu.index, k, &self.request, ctl)
            }),
            Backend::Simulated(b) => b.memory_test(gpu.index, &self.request, ctl),
        }
    }

    fn judge(
        &self,
        judge: &Judge<'_>,
        gpu: &GpuInfo,
        measured: Result<MemoryOutcome, BackendError>,
        into: &mut GpuReport,
    ) {
        into.memory = Some(Judge::judged(measured, |o| judge.memory(gpu, &o)));
    }

    fn compare(&self, judge: &Judge<'_>, gpus: &mut [GpuReport]) {
        judge.relative_per_gpu(
            gpus,
            Code::MemoryBandwidthLow,
            "memory",
            "GB/s",
            memory_gbps,
            |g| g.memory.as_mut(),
        );
    }
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
            verdict: verdict_of(&reasons),
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

    fn memory_rate_reason(&self, gpu: &GpuInfo, gbps: f64, spec: &MemoryCheck) -> Option<Reason> {
        let (floor, source) = match spec.min_gbps {
            Some(v) => (f64::from(v), "spec minGbps".to_string()),
            None => {
                let p = self.profile_of(&gpu.name)?;
                (p.memory_min_gbps, format!("{} profile", p.name))
            }
        };
        let Some(gbps) = measured(gbps) else {
            return Some(Code::MeasurementMissing.says(format!(
                "GPU{} memory: no throughput was measured (the {source} floor cannot be checked)",
                gpu.index
            )));
        };
        (gbps < floor).then(|| {
            Code::MemoryBandwidthLow.says(format!(
                "GPU{} memory: {gbps:.0} GB/s < {floor:.0} GB/s ({source})",
                gpu.index
            ))
        })
    }
}

fn memory_mismatch_reason(gpu: u32, out: &MemoryOutcome, spec: &MemoryCheck) -> Option<Reason> {
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
    Some(Code::MemoryMismatch.says(format!(
        "GPU{gpu} memory: {} mismatched word{}{first}{limit}",
        out.mismatches,
        plural(out.mismatches)
    )))
}

fn free_memory_reason(gpu: &GpuInfo, out: &MemoryOutcome) -> Option<Reason> {
    let total = if out.total_bytes > 0 {
        out.total_bytes
    } else {
        gpu.memory_total_bytes
    } as f64;
    let free = out.free_bytes_before as f64;
    (total > 0.0 && free < MIN_FREE_SHARE * total).then(|| {
        Code::MemoryBusy.says(format!(
            "GPU{}: only {:.0}% of memory free at start ({:.1} of {:.1} GiB); another process holds GPU memory",
            gpu.index,
            (100.0 * free / total).floor(),
            free / GIB,
            total / GIB
        ))
    })
}

fn tested_share_reason(gpu: u32, out: &MemoryOutcome, asked: f64) -> Option<Reason> {
    if out.free_bytes_before == 0 || asked <= 0.0 {
        return None;
    }
    let tested = out.bytes_tested as f64 / out.free_bytes_before as f64;
    (tested < MIN_TESTED_SHARE * asked).then(|| {
        Code::MemoryUndertested.says(format!(
            "GPU{gpu} memory: tested {:.1} GiB, {:.0}% of free memory, well below the {:.0}% asked for",
            out.bytes_tested as f64 / GIB,
            100.0 * tested,
            100.0 * asked
        ))
    })
}

/// A GPU's memory GB/s where its memory check ran.
fn memory_gbps(g: &GpuReport) -> Option<f64> {
    g.memory
        .as_ref()
        .filter(|m| ran(m.verdict))
        .map(|m| m.gbps)
        .filter(|v| v.is_finite() && *v > 0.0)
}

/// Command-line flags of the memory check.
#[derive(clap::Args, Debug, Clone, Default)]
#[group(skip)]
pub struct Flags {
    /// Fraction of each GPU's free memory to test (0 < f ≤ 1).
    #[arg(long)]
    pub memory_fraction: Option<f64>,
    /// Passes of pattern and inverse.
    #[arg(long)]
    pub memory_passes: Option<i32>,
}

impl Flags {
    /// Applies the flags that were given to the check's settings.
    pub fn apply(&self, spec: &mut MemoryCheck) {
        let Self {
            memory_fraction,
            memory_passes,
        } = self;
        given(&mut spec.fraction, memory_fraction);
        given(&mut spec.passes, memory_passes);
    }
}

/// The GPU table's MEMORY cell: `133.0 GiB 4344 GB/s 0 bad`.
pub fn cell(m: &MemoryResult) -> String {
    if m.tested_gib <= 0.0 {
        return m.verdict.to_string();
    }
    format!(
        "{:.1} GiB {:.0} GB/s {} bad",
        m.tested_gib, m.gbps, m.mismatches
    )
}

/// The headline's part: `memory 4336-4338 GB/s`.
pub fn headline(report: &NodeReport) -> Vec<String> {
    let memory: Vec<f64> = report
        .gpus
        .iter()
        .filter_map(|g| g.memory.as_ref().map(|m| m.gbps))
        .filter(|v| *v > 0.0)
        .collect();
    if memory.is_empty() {
        return Vec::new();
    }
    vec![format!("memory {} GB/s", crate::text::span(&memory, 0))]
}
