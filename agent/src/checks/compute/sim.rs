//! The compute burn on the simulated backend (tests and demos only): at the power cap, unless a
//! `throttle=` fault slows the clocks; a pulse swings between load and idle power.
use gpuval_crds::Dtype;

use super::power::{Phase, PowerOutcome, PowerSample, PulseOutcome, SLOWDOWN_REASONS};
use super::{ComputeOutcome, ComputeRequest, GemmOutcome, PulseRequest, TranscendentalOutcome};
use crate::backend::sim::{SimBackend, SimCheck, jitter, listed, spend};
use crate::backend::{BackendError, PowerReading};
use crate::run_control::RunControl;

/// Most power samples of a simulated burn (one per simulated half second).
const MAX_SAMPLES: u64 = 600;

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
        let mut power = self.power_outcome(gpu, seconds);
        let pulse = match &req.pulse {
            Some(p) => {
                spend(ctl, self.scaled(p.duration), |d| d, "pulse")?;
                Some(self.pulse_outcome(gpu, p, &mut power))
            }
            None => None,
        };
        Ok(ComputeOutcome {
            gemms,
            transcendental: req
                .transcendentals
                .then(|| self.transcendental_outcome(seconds)),
            seconds,
            power,
            pulse,
        })
    }

    /// Samples of a burn of `seconds`: at the power cap (`SwPowerCap`), about 93% of the limit;
    /// samples slowed by a planted hardware slowdown draw 55%.
    pub(crate) fn power_outcome(&self, gpu: u32, seconds: f64) -> PowerOutcome {
        let (_, _, limit) = self.spec.model.clocks_power();
        let n = ((seconds * 2.0) as u64).clamp(10, MAX_SAMPLES);
        let samples = (0..n)
            .map(|i| {
                let planted = self.throttled(gpu, i);
                let slowed = planted.is_some_and(|r| SLOWDOWN_REASONS.contains(&r));
                let share = if slowed { 0.55 } else { 0.93 };
                let mut throttle = Vec::new();
                if !slowed {
                    throttle.push("SwPowerCap".to_string());
                }
                throttle.extend(planted.map(str::to_string));
                sample(
                    Phase::Burn,
                    limit * share + 8.0 * jitter(gpu, 50 + i),
                    throttle,
                )
            })
            .collect();
        PowerOutcome {
            limit_w: Some(limit),
            default_limit_w: Some(limit),
            samples,
            pulse_range: None,
        }
    }

    /// The pulse: two samples at load and two at idle per cycle; `fail=compute@N` gives wrong
    /// results after it too.
    pub(crate) fn pulse_outcome(
        &self,
        gpu: u32,
        req: &PulseRequest,
        power: &mut PowerOutcome,
    ) -> PulseOutcome {
        let limit = power.limit_w.unwrap_or(700.0);
        let period = req.period.as_secs_f64().max(1e-3);
        let cycles = ((req.duration.as_secs_f64() / period) as u64).max(1);
        for c in 0..cycles.min(MAX_SAMPLES / 4) {
            for (k, phase, share) in [
                (0, Phase::PulseLoad, 0.9),
                (1, Phase::PulseLoad, 0.92),
                (2, Phase::PulseIdle, 0.14),
                (3, Phase::PulseIdle, 0.12),
            ] {
                let w = limit * share + 5.0 * jitter(gpu, 900 + 4 * c + k);
                let s = sample(phase, w, Vec::new());
                power.see_pulse(&s.reading);
                power.samples.push(s);
            }
        }
        let fail = listed(&self.spec.fail, SimCheck::Compute, gpu);
        PulseOutcome {
            period_seconds: period,
            seconds: req.duration.as_secs_f64(),
            cycles,
            comparisons: cycles * 3,
            mismatches: if fail { 4 } else { 0 },
            max_rel_error: if fail { 0.25 } else { 0.0 },
        }
    }
}

fn sample(phase: Phase, watts: f64, throttle: Vec<String>) -> PowerSample {
    PowerSample {
        phase,
        reading: PowerReading {
            average_w: Some(watts),
            instant_w: Some(watts),
            throttle,
        },
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
            patterns: gpuval_crds::MemoryPattern::ALL.to_vec(),
        }
    }

    fn compute_request(seconds: u64) -> ComputeRequest {
        ComputeRequest {
            duration: std::time::Duration::from_secs(seconds),
            dtypes: Dtype::ALL.to_vec(),
            matrix_size: 8192,
            transcendentals: true,
            pulse: None,
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
