//! The memory check's rules: mismatches (with the patterns that found them and the bits that
//! flipped), throughput against the floor, free memory at start, how much was tested, and rows
//! remapped or pages retired while the test ran.

use gpuval_crds::{MemoryCheck, MemoryPattern, MemoryResult, PatternResult, RowHealth};

use super::bits::describe;
use super::{MemoryOutcome, PatternOutcome};
use crate::backend::GpuInfo;
use crate::judge::{Code, Judge, Reason, Says, gbps_of, measured, plural, to_i64, verdict_of};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Below this share of total memory free at start, another process holds the GPU.
const MIN_FREE_SHARE: f64 = 0.9;
/// A test that covered less than this share of the fraction asked for fails.
const MIN_TESTED_SHARE: f64 = 0.9;

impl Judge<'_> {
    /// Judges one GPU's memory test: mismatches, throughput, free memory at start, how much of
    /// it was tested, and rows remapped or pages retired during the test.
    pub fn memory(&self, gpu: &GpuInfo, out: &MemoryOutcome) -> MemoryResult {
        let spec = self.checks.memory.clone().unwrap_or_default();
        let (gbps, rate_of) = rate(out);
        let bit_flips = out.bits.report();
        let mut reasons: Vec<Reason> = Vec::new();
        reasons.extend(mismatch_reason(gpu.index, out, &spec));
        reasons.extend(self.memory_rate_reason(gpu, gbps, rate_of, &spec));
        reasons.extend(free_memory_reason(gpu, out));
        reasons.extend(tested_share_reason(gpu.index, out, spec.fraction));
        reasons.extend(row_findings(
            gpu.index,
            out.rows_before.as_ref(),
            out.rows_after.as_ref(),
        ));
        let seconds = out.fill_seconds
            + out.verify_seconds
            + out
                .patterns
                .iter()
                .filter(|p| p.pattern != MemoryPattern::Address)
                .map(|p| p.seconds)
                .sum::<f64>();
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
            patterns: out.patterns.iter().map(pattern_result).collect(),
            bit_flips,
            rows_before: out.rows_before.clone(),
            rows_after: out.rows_after.clone(),
        }
    }

    fn memory_rate_reason(
        &self,
        gpu: &GpuInfo,
        gbps: f64,
        rate_of: &str,
        spec: &MemoryCheck,
    ) -> Option<Reason> {
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
                "GPU{} memory{rate_of}: {gbps:.0} GB/s < {floor:.0} GB/s ({source})",
                gpu.index
            ))
        })
    }
}

/// The rate the floor applies to: the address pattern's fill+verify (what the profiles'
/// floors were measured with), else every pattern's bytes over their time; and how the reason
/// names it (nothing for the address pattern).
fn rate(out: &MemoryOutcome) -> (f64, &'static str) {
    let address = out.fill_seconds + out.verify_seconds;
    if address > 0.0 || out.patterns.is_empty() {
        let bytes = out.bytes_written.saturating_add(out.bytes_read);
        return (gbps_of(bytes, address), "");
    }
    let bytes = out.patterns.iter().map(|p| p.bytes).sum();
    let seconds = out.patterns.iter().map(|p| p.seconds).sum();
    (gbps_of(bytes, seconds), " (every pattern)")
}

fn pattern_result(p: &PatternOutcome) -> PatternResult {
    PatternResult {
        pattern: p.pattern,
        passes: i32::try_from(p.passes).unwrap_or(i32::MAX),
        mismatches: to_i64(p.mismatches),
        gbps: gbps_of(p.bytes, p.seconds),
        seconds: p.seconds,
    }
}

/// `GPU2 memory: 5 mismatched words (first at offset 0x…) in movingInversions 3, random 2; bit
/// 13 5× 0→1 (stuck at 1)`.
fn mismatch_reason(gpu: u32, out: &MemoryOutcome, spec: &MemoryCheck) -> Option<Reason> {
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
    let found_by: Vec<String> = out
        .patterns
        .iter()
        .filter(|p| p.mismatches > 0)
        .map(|p| format!("{} {}", p.pattern, p.mismatches))
        .collect();
    let by = if out.patterns.len() > 1 && !found_by.is_empty() {
        format!(" in {}", found_by.join(", "))
    } else {
        String::new()
    };
    let bits = out
        .bits
        .report()
        .map(|b| format!("; {}", describe(&b)))
        .unwrap_or_default();
    Some(Code::MemoryMismatch.says(format!(
        "GPU{gpu} memory: {} mismatched word{}{first}{limit}{by}{bits}",
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

/// Rows remapped or pages retired while the test ran: a failed remapping fails the GPU (it
/// has no spare row left); a new remapping or retirement is a Warn that says to reset the GPU
/// (the spare row takes over at the next reset). What was already so before the test is the
/// GPU health's to report.
pub(super) fn row_findings(
    gpu: u32,
    before: Option<&RowHealth>,
    after: Option<&RowHealth>,
) -> Vec<Reason> {
    let (Some(b), Some(a)) = (before, after) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let newly = |f: fn(&RowHealth) -> Option<bool>| f(a) == Some(true) && f(b) != Some(true);
    if newly(|r| r.remap_failure) {
        found.push(Code::RowRemapFailure.says(format!(
            "GPU{gpu} memory: a row remapping failed during the test (no spare row left); the GPU needs service"
        )));
    }
    let grew = |f: fn(&RowHealth) -> Option<i64>| match (f(b), f(a)) {
        (Some(x), Some(y)) if y > x => y - x,
        _ => 0,
    };
    let (cor, unc) = (
        grew(|r| r.remapped_correctable),
        grew(|r| r.remapped_uncorrectable),
    );
    if cor + unc > 0 || newly(|r| r.remap_pending) {
        found.push(Code::MemoryRowsRemapped.says(format!(
            "GPU{gpu} memory: {} row{} remapped during the test ({cor} after correctable, {unc} after uncorrectable errors); reset the GPU to apply the remapping",
            cor + unc,
            plural(cor + unc)
        )));
    }
    let pages = grew(|r| r.retired_single_bit) + grew(|r| r.retired_double_bit);
    if pages > 0 || newly(|r| r.retire_pending) {
        found.push(Code::MemoryPagesRetired.says(format!(
            "GPU{gpu} memory: {pages} page{} retired during the test; reset the GPU to retire them",
            plural(pages)
        )));
    }
    found
}

/// The table's REMAPPED ROWS cell: `0 → 1 (pending)`, or a dash where NVML gave no rows.
pub(super) fn rows_cell(before: Option<&RowHealth>, after: Option<&RowHealth>) -> String {
    let rows = |r: &RowHealth| match (r.remapped_correctable, r.remapped_uncorrectable) {
        (None, None) => None,
        (c, u) => Some(c.unwrap_or(0) + u.unwrap_or(0)),
    };
    let (b, a) = (before.and_then(rows), after.and_then(rows));
    let Some(a_rows) = a else {
        return String::from("-");
    };
    let mut s = match b {
        Some(b_rows) => format!("{b_rows} → {a_rows}"),
        None => a_rows.to_string(),
    };
    if after.is_some_and(|r| r.remap_pending == Some(true)) {
        s.push_str(" (pending)");
    }
    if after.is_some_and(|r| r.remap_failure == Some(true)) {
        s.push_str(" (failed)");
    }
    s
}
