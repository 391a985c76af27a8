//! The memory check: a fraction of each GPU's free memory tested with memtest-style patterns
//! (an address-dependent pattern and its inverse, moving inversions, a random number sequence),
//! every word verified on the GPU; throughput, mismatches with their addresses and the bits
//! that flipped, remapped rows and retired pages before and after, and whether another process
//! held memory at start.

pub mod bits;
mod cuda;
mod judge;
pub mod row;
mod sim;
#[cfg(test)]
mod tests;

pub use cuda::selftest;

crate::check_result!(gpuval_crds::MemoryResult);

use gpuval_crds::{GpuReport, MemoryCheck, MemoryPattern, Mismatch, NodeReport, RowHealth};

use self::bits::BitTally;
use crate::backend::Backend;
use crate::check::given;
use crate::check::{GpuCheck, JudgeGpu, Measurement, OnGpu};
use crate::judge::{Code, Judge, ran};
use crate::text::{columns, dash, indent};

/// Memory check parameters for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryRequest {
    /// Fraction of free memory to allocate and test.
    pub fraction: f64,
    /// Passes of each pattern (each address pass writes and verifies a pattern and then its
    /// bitwise inverse, with a new seed).
    pub passes: u32,
    /// How many mismatches to record with their address.
    pub max_logged: usize,
    /// The patterns, in order.
    pub patterns: Vec<MemoryPattern>,
}

/// One pattern's passes on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct PatternOutcome {
    pub pattern: MemoryPattern,
    pub passes: u32,
    /// Bytes written plus bytes read, and the device time of the kernels that moved them.
    pub bytes: u64,
    pub seconds: f64,
    /// Mismatched 32-bit words.
    pub mismatches: u64,
}

/// What a memory test measured on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemoryOutcome {
    pub total_bytes: u64,
    pub free_bytes_before: u64,
    pub bytes_tested: u64,
    /// Seconds spent in the address pattern's fill kernels and verify kernels (device-timed).
    pub fill_seconds: f64,
    pub verify_seconds: f64,
    /// Bytes written by the address pattern's fills and read by its verifies, over all passes.
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub passes: u32,
    /// Mismatched 32-bit words over every pattern and pass.
    pub mismatches: u64,
    pub first_mismatches: Vec<Mismatch>,
    /// Each pattern that ran, in order.
    pub patterns: Vec<PatternOutcome>,
    /// Which bits of the wrong words flipped.
    pub bits: BitTally,
    /// Remapped rows and retired pages before and after (None where they could not be read).
    pub rows_before: Option<RowHealth>,
    pub rows_after: Option<RowHealth>,
}

/// The memory check as its spec asks for it.
pub struct Memory {
    pub request: MemoryRequest,
}

impl Memory {
    pub fn from_spec(spec: &MemoryCheck) -> Self {
        let mut patterns: Vec<MemoryPattern> = Vec::new();
        for p in &spec.patterns {
            if !patterns.contains(p) {
                patterns.push(*p);
            }
        }
        if patterns.is_empty() {
            patterns.push(MemoryPattern::Address);
        }
        Self {
            request: MemoryRequest {
                fraction: spec.fraction,
                passes: u32::try_from(spec.passes.max(1)).unwrap_or(1),
                max_logged: 16,
                patterns,
            },
        }
    }
}

impl GpuCheck for Memory {
    const NAME: &'static str = "memory";
    type Outcome = MemoryOutcome;

    fn measure(&self, on: &OnGpu<'_>) -> Measurement<MemoryOutcome> {
        let &OnGpu { backend, gpu, ctl } = on;
        match backend {
            Backend::Cuda(b) => {
                let rows_before = b.nvml.rows(gpu.index).ok();
                let out = b.on_gpu(gpu.index, |ctx, k| {
                    cuda::run(ctx, gpu.index, k, &self.request, ctl)
                })?;
                Ok(MemoryOutcome {
                    rows_before,
                    rows_after: b.nvml.rows(gpu.index).ok(),
                    ..out
                })
            }
            Backend::Simulated(b) => b.memory_test(gpu.index, &self.request, ctl),
        }
    }

    fn judge(&self, on: &JudgeGpu<'_>, measured: Measurement<MemoryOutcome>, into: &mut GpuReport) {
        into.memory = Some(Judge::judged(measured, |o| on.judge.memory(on.gpu, &o)));
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
    /// Passes of each pattern.
    #[arg(long)]
    pub memory_passes: Option<i32>,
    /// Patterns (comma-separated): address, movingInversions, random (default all three).
    #[arg(long, value_delimiter = ',')]
    pub memory_patterns: Option<Vec<MemoryPattern>>,
}

impl Flags {
    /// Applies the flags that were given to the check's settings.
    pub fn apply(&self, spec: &mut MemoryCheck) {
        let Self {
            memory_fraction,
            memory_passes,
            memory_patterns,
        } = self;
        given(&mut spec.fraction, memory_fraction);
        given(&mut spec.passes, memory_passes);
        given(&mut spec.patterns, memory_patterns);
    }
}

/// The GPU table's MEMORY cell: `133.0 GiB 4344 GB/s 0 bad`.
pub fn cell(m: &gpuval_crds::MemoryResult) -> String {
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

/// Each pattern's mismatches and rate per GPU, the bits that flipped and the remapped rows
/// before and after, when more than the address pattern ran or something changed.
pub fn section(report: &NodeReport) -> String {
    let tested: Vec<(&GpuReport, &gpuval_crds::MemoryResult)> = report
        .gpus
        .iter()
        .filter_map(|g| g.memory.as_ref().map(|m| (g, m)))
        .filter(|(_, m)| m.patterns.len() > 1 || m.bit_flips.is_some() || m.rows_after.is_some())
        .collect();
    if tested.is_empty() {
        return String::new();
    }
    let mut header = vec!["GPU".to_string()];
    header.extend(["ADDRESS", "MOVING INVERSIONS", "RANDOM"].map(String::from));
    header.extend(["FLIPPED BITS", "REMAPPED ROWS"].map(String::from));
    let mut rows = vec![header];
    for (g, m) in tested {
        let mut row = vec![g.index.to_string()];
        for p in MemoryPattern::ALL {
            row.push(
                m.patterns
                    .iter()
                    .find(|r| r.pattern == p)
                    .map_or_else(dash, |r| format!("{} bad {:.0} GB/s", r.mismatches, r.gbps)),
            );
        }
        row.push(m.bit_flips.as_ref().map_or_else(dash, bits::describe));
        row.push(judge::rows_cell(
            m.rows_before.as_ref(),
            m.rows_after.as_ref(),
        ));
        rows.push(row);
    }
    format!("memory patterns:\n{}", indent(&columns(&rows)))
}
