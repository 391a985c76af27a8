//! The memory check on the simulated backend (tests and demos only).
use gpuval_crds::Mismatch;

use super::{MemoryOutcome, MemoryRequest};
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
        // Each pass writes and verifies a pattern and its inverse.
        let bytes = tested.saturating_mul(2 * u64::from(passes));
        let gbps = self.spec.model.memory_gbps()
            * (1.0 + 0.02 * jitter(gpu, 1))
            * self.spec.slowdown(SimCheck::Memory, gpu);
        let fail = listed(&self.spec.fail, SimCheck::Memory, gpu);
        let mismatches = if fail { 3 + u64::from(gpu % 4) } else { 0 };
        MemoryOutcome {
            total_bytes: self.total_bytes(),
            free_bytes_before: free,
            bytes_tested: tested,
            fill_seconds: bytes as f64 / (gbps * 0.96 * 1e9),
            verify_seconds: bytes as f64 / (gbps * 1.04 * 1e9),
            bytes_written: bytes,
            bytes_read: bytes,
            passes,
            mismatches,
            first_mismatches: mismatch_list(gpu, tested, mismatches, req.max_logged),
        }
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

/// The first `max_logged` of `count` bad words, spread over the tested block.
fn mismatch_list(gpu: u32, tested: u64, count: u64, max_logged: usize) -> Vec<Mismatch> {
    let shown = count.min(max_logged as u64);
    (0..shown)
        .map(|k| {
            let offset = (tested / (count + 1)).saturating_mul(k + 1) & !7;
            let expected = 0xA5A5_A5A5_0000_0000u64 | (offset >> 3);
            let actual = expected ^ (1u64 << ((u64::from(gpu) * 7 + k * 13) % 64));
            Mismatch {
                offset: i64::try_from(offset).unwrap_or(i64::MAX),
                expected: format!("{expected:#018x}"),
                actual: format!("{actual:#018x}"),
            }
        })
        .collect()
}
