//! The compute burn on the simulated backend (tests and demos only).
use gpuval_crds::Dtype;

use super::{ComputeOutcome, ComputeRequest, GemmOutcome, TranscendentalOutcome};
use crate::backend::BackendError;
use crate::backend::sim::{SimBackend, SimCheck, jitter, listed, spend};
use crate::run_control::RunControl;

impl SimBackend {
    pub(crate) fn gemm_outcome(
        &self,
        gpu: u32,
        dtype: Dtype,
        seconds: f64,
        n: usize,
    ) -> GemmOutcome {
        let tflops = self.spec.model.tflops(dtype)
            * (1.0 + 0.015 * jitter(gpu, 10 + dtype as u64))
            * self.spec.slowdown(SimCheck::Compute, gpu);
        let per_gemm = 2.0 * (n.max(1) as f64).powi(3);
        let iterations = ((tflops * 1e12 * seconds * 0.95 / per_gemm) as u64).max(1);
        let flops = iterations as f64 * per_gemm;
        let fail = listed(&self.spec.fail, SimCheck::Compute, gpu);
        GemmOutcome {
            dtype,
            flops,
            gemm_seconds: flops / (tflops * 1e12),
            iterations,
            comparisons: iterations,
            mismatches: if fail { 5 + dtype as u64 } else { 0 },
            max_rel_error: if fail { 0.25 } else { 0.0 },
            wall_seconds: seconds,
        }
    }

    pub(crate) fn transcendental_outcome(&self, seconds: f64) -> TranscendentalOutcome {
        const ELEMENTS: u64 = 1 << 26;
        let seconds = seconds * 0.05;
        let iterations =
            ((self.spec.model.gelems() * 1e9 * seconds / ELEMENTS as f64) as u64).max(1);
        TranscendentalOutcome {
            elements: ELEMENTS,
            seconds: iterations as f64 * ELEMENTS as f64 / (self.spec.model.gelems() * 1e9),
            iterations,
            mismatches: 0,
        }
    }

    pub(crate) fn compute_burn(
        &self,
        gpu: u32,
        req: &ComputeRequest,
        ctl: &RunControl<'_>,
    ) -> Result<ComputeOutcome, BackendError> {
        self.begin(SimCheck::Compute, gpu)?;
        let count = req.dtypes.len().max(1);
        let share = req.duration / u32::try_from(count).unwrap_or(u32::MAX);
        let mut gemms = Vec::with_capacity(req.dtypes.len());
        for (i, &dtype) in req.dtypes.iter().enumerate() {
            let g = self.gemm_outcome(gpu, dtype, share.as_secs_f64(), req.matrix_size);
            let note = format!("{dtype} {:.0} TFLOP/s", g.tflops());
            let overall = |done: f64| (i as f64 + done) / count as f64;
            spend(ctl, self.scaled(share), overall, &note)?;
            gemms.push(g);
        }
        let seconds = req.duration.as_secs_f64();
        Ok(ComputeOutcome {
            gemms,
            transcendental: req
                .transcendentals
                .then(|| self.transcendental_outcome(seconds)),
            seconds,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn backend(spec: &str) -> SimBackend {
        SimBackend::new(spec.parse().expect("valid spec"))
    }

    fn memory_request() -> crate::checks::memory::MemoryRequest {
        crate::checks::memory::MemoryRequest {
            fraction: 0.95,
            passes: 1,
            max_logged: 4,
        }
    }

    fn compute_request(seconds: u64) -> ComputeRequest {
        ComputeRequest {
            duration: std::time::Duration::from_secs(seconds),
            dtypes: Dtype::ALL.to_vec(),
            matrix_size: 8192,
            transcendentals: true,
        }
    }

    #[test]
    fn timescale_spends_time_with_progress_and_stops() {
        let b = backend("gpus=1,timescale=0.01");
        let calls = AtomicUsize::new(0);
        let last = Mutex::new(0.0f64);
        let progress = |done: f64, _: &str| {
            calls.fetch_add(1, Ordering::Relaxed);
            *last.lock().unwrap_or_else(|e| e.into_inner()) = done;
        };
        let stop = AtomicBool::new(false);
        let ctl = RunControl::new(&stop, &progress);
        let start = std::time::Instant::now();
        let out = b.compute_burn(0, &compute_request(20), &ctl).expect("burn");
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(calls.load(Ordering::Relaxed) >= 4);
        assert_eq!(*last.lock().unwrap_or_else(|e| e.into_inner()), 1.0);
        assert_eq!(out.gemms.len(), 4);

        stop.store(true, Ordering::Relaxed);
        assert!(matches!(
            b.compute_burn(0, &compute_request(20), &ctl),
            Err(BackendError::Stopped)
        ));
        assert!(matches!(
            b.memory_test(0, &memory_request(), &ctl),
            Err(BackendError::Stopped)
        ));
    }

    #[test]
    fn timescale_zero_returns_at_once() {
        let b = backend("gpus=1");
        let stop = AtomicBool::new(false);
        let ctl = RunControl::new(&stop, &|_, _| {});
        let start = std::time::Instant::now();
        let out = b
            .compute_burn(0, &compute_request(3600), &ctl)
            .expect("burn");
        assert!(start.elapsed() < Duration::from_millis(100));
        assert!(out.gemms[0].tflops() > 700.0);
        assert_eq!(out.seconds, 3600.0);
    }
}
