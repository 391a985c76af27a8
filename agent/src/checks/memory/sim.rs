//! The memory check on the simulated backend (tests and demos only). `fail=memory@N` gives GPU N
//! one bit stuck at 1: each pattern finds a few words with that bit read as 1 where 0 was
//! written.
use gpuval_crds::{MemoryPattern, Mismatch, RowHealth};

use super::{MemoryOutcome, MemoryRequest, PatternOutcome};
use crate::backend::BackendError;
use crate::backend::sim::{MIB, SimBackend, SimCheck, jitter, listed, spend};
use crate::run_control::RunControl;

impl SimBackend {
    pub(crate) fn memory_outcome(&self, gpu: u32, req: &MemoryRequest) -> MemoryOutcome {
        let free = self.free_bytes();
        let share = if req.fraction.is_finite() {
            req.fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let tested = ((free as f64 * share) as u64) / MIB * MIB;
        let passes = req.passes.max(1);
        let gbps = self.spec.model.memory_gbps()
            * (1.0 + 0.02 * jitter(gpu, 1))
            * self.spec.slowdown(SimCheck::Memory, gpu);
        let stuck = listed(&self.spec.fail, SimCheck::Memory, gpu).then_some((gpu * 7 + 5) % 32);
        let mut out = MemoryOutcome {
            total_bytes: self.total_bytes(),
            free_bytes_before: free,
            bytes_tested: tested,
            passes,
            rows_before: Some(healthy_rows()),
            rows_after: Some(healthy_rows()),
            ..Default::default()
        };
        for &pattern in &req.patterns {
            let p = pattern_outcome(pattern, gpu, tested, passes, gbps, stuck.is_some());
            if pattern == MemoryPattern::Address {
                // Each pass writes and verifies a pattern and its inverse.
                let bytes = tested.saturating_mul(2 * u64::from(passes));
                out.fill_seconds = bytes as f64 / (gbps * 0.96 * 1e9);
                out.verify_seconds = bytes as f64 / (gbps * 1.04 * 1e9);
                out.bytes_written = bytes;
                out.bytes_read = bytes;
            }
            out.mismatches += p.mismatches;
            out.patterns.push(p);
        }
        if let Some(bit) = stuck {
            for _ in 0..out.mismatches {
                out.bits.add_word(0, 1 << bit);
            }
            out.first_mismatches = mismatch_list(tested, out.mismatches, req.max_logged, bit);
        }
        out
    }

    pub(crate) fn memory_test(
        &self,
        gpu: u32,
        req: &MemoryRequest,
        ctl: &RunControl<'_>,
    ) -> Result<MemoryOutcome, BackendError> {
        self.begin(SimCheck::Memory, gpu)?;
        spend(
            ctl,
            self.short_wall(),
            |done| done,
            "memory fill and verify",
        )?;
        let out = self.memory_outcome(gpu, req);
        ctl.progress(1.0, &format!("{} mismatches", out.mismatches));
        Ok(out)
    }
}

/// One pattern's passes: bytes moved per pass (address: pattern and inverse, each filled and
/// verified; moving inversions: eleven words, each filled, then read and rewritten twice;
/// random: like address) at `gbps`; a GPU with a stuck bit shows a few wrong words in each.
fn pattern_outcome(
    pattern: MemoryPattern,
    gpu: u32,
    tested: u64,
    passes: u32,
    gbps: f64,
    stuck: bool,
) -> PatternOutcome {
    let (per_pass, rate, bad) = match pattern {
        MemoryPattern::Address => (4, 1.0, 3 + u64::from(gpu % 4)),
        MemoryPattern::MovingInversions => (11 * 5, 0.97, 2),
        MemoryPattern::Random => (4, 0.95, 1),
    };
    let bytes = tested.saturating_mul(per_pass * u64::from(passes));
    PatternOutcome {
        pattern,
        passes,
        bytes,
        seconds: bytes as f64 / (gbps * rate * 1e9),
        mismatches: if stuck { bad } else { 0 },
    }
}

/// Remapped rows of a healthy Hopper GPU: none, nothing pending; no retired pages (Hopper remaps
/// rows instead).
fn healthy_rows() -> RowHealth {
    RowHealth {
        remapped_correctable: Some(0),
        remapped_uncorrectable: Some(0),
        remap_pending: Some(false),
        remap_failure: Some(false),
        ..Default::default()
    }
}

/// The first `max_logged` of `count` bad words, spread over the tested block, each with `bit`
/// read as 1.
fn mismatch_list(tested: u64, count: u64, max_logged: usize, bit: u32) -> Vec<Mismatch> {
    let shown = count.min(max_logged as u64);
    (0..shown)
        .map(|k| {
            let offset = (tested / (count + 1)).saturating_mul(k + 1) & !3;
            let expected = ((offset >> 2) as u32).wrapping_mul(0x9e37_79b1) & !(1 << bit);
            Mismatch {
                offset: i64::try_from(offset).unwrap_or(i64::MAX),
                expected: format!("{expected:#010x}"),
                actual: format!("{:#010x}", expected | 1 << bit),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_gpu_shows_one_bit_stuck_at_one_in_every_pattern() {
        let b = SimBackend::new("gpus=4,fail=memory@2".parse().expect("spec"));
        let req = crate::checks::memory::Memory::from_spec(&Default::default()).request;
        let out = b.memory_outcome(2, &req);
        assert_eq!(out.patterns.len(), 3);
        assert!(out.patterns.iter().all(|p| p.mismatches > 0));
        let flips = out.bits.report().expect("flips");
        assert_eq!(flips.bits.len(), 1);
        assert_eq!(flips.bits[0].bit, 19);
        assert_eq!(
            (flips.stuck_at_one, flips.stuck_at_zero),
            (out.mismatches as i64, 0)
        );
        let m = &out.first_mismatches[0];
        let (e, a) = (
            u32::from_str_radix(&m.expected[2..], 16).expect("hex"),
            u32::from_str_radix(&m.actual[2..], 16).expect("hex"),
        );
        assert_eq!(e ^ a, 1 << 19);
        let healthy = b.memory_outcome(1, &req);
        assert_eq!(healthy.mismatches, 0);
        assert!(healthy.bits.is_empty());
    }
}
