//! The compute check's judging rules.

use std::sync::mpsc;

use gpuval_crds::{Profile, TflopsThresholds, Verdict};

use super::power::{Phase, PhaseCell, PowerSample, next_cycle_start, watch};
use super::*;
use crate::backend::PowerReading;
use crate::judge::testing::{assert_any_starts_with, assert_fails_with, checks_with, h200, judge};

fn gemm(dtype: Dtype, tflops: f64) -> GemmOutcome {
    GemmOutcome {
        dtype,
        flops: tflops * 1e12 * 10.0,
        gemm_seconds: 10.0,
        iterations: 1000,
        comparisons: 1000,
        mismatches: 0,
        max_rel_error: 0.0,
        wall_seconds: 10.5,
    }
}

fn sample(phase: Phase, watts: f64, throttle: &[&str]) -> PowerSample {
    PowerSample {
        phase,
        reading: PowerReading {
            average_w: Some(watts),
            instant_w: Some(watts + 1.0),
            throttle: throttle.iter().map(|t| t.to_string()).collect(),
        },
    }
}

/// `n` burn samples at `watts` against a 700 W limit, at the power cap.
fn power_at(watts: f64, n: usize) -> PowerOutcome {
    PowerOutcome {
        limit_w: Some(700.0),
        default_limit_w: Some(700.0),
        samples: (0..n)
            .map(|_| sample(Phase::Burn, watts, &["SwPowerCap"]))
            .collect(),
        pulse_range: None,
    }
}

fn compute_outcome(gemms: &[(Dtype, f64)]) -> ComputeOutcome {
    ComputeOutcome {
        gemms: gemms.iter().map(|(d, t)| gemm(*d, *t)).collect(),
        transcendental: Some(TranscendentalOutcome {
            elements: 1 << 20,
            seconds: 1.0,
            iterations: 1000,
            mismatches: 0,
        }),
        seconds: 30.0,
        power: power_at(660.0, 40),
        pulse: None,
    }
}

/// GPU `gpu` of an H200 node judged on `out` under `spec`, with the H200 profile or none.
fn judged_with(
    spec: ComputeCheck,
    profile: Profile,
    gpu: u32,
    out: &ComputeOutcome,
) -> ComputeResult {
    judge(&checks_with(|c| c.compute = Some(spec)), profile).compute(&h200(gpu), out)
}

/// [`judged_with`] the default spec and the H200 profile.
fn judged(gpu: u32, out: &ComputeOutcome) -> ComputeResult {
    judged_with(ComputeCheck::default(), Profile::Auto, gpu, out)
}

#[test]
fn compute_passes_above_floors() {
    let out = compute_outcome(&[(Dtype::Bf16, 780.0), (Dtype::Fp32, 50.0)]);
    let r = judged(0, &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    assert_eq!(r.gemms.len(), 2);
    assert!((r.gemms[0].tflops - 780.0).abs() < 1e-6);
    assert_eq!(
        (r.matrix_size, r.seconds, r.gemms[0].seconds),
        (8192, 30.0, 10.5)
    );
    let t = r.transcendental.expect("transcendental result");
    assert!((t.gelems_per_second - (1u64 << 20) as f64 * 1000.0 / 1e9).abs() < 1e-9);
}

#[test]
fn compute_below_profile_floor_fails() {
    let out = compute_outcome(&[(Dtype::Bf16, 512.0), (Dtype::Tf32, 400.0)]);
    let r = judged(1, &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &["GPU1 bf16: 512 TFLOP/s < 600 TFLOP/s (H200 profile)"],
    );
}

#[test]
fn compute_spec_floor_overrides_profile() {
    let spec = ComputeCheck {
        min_tflops: Some(TflopsThresholds {
            bf16: Some(600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let out = compute_outcome(&[(Dtype::Bf16, 612.0)]);
    let r = judged_with(spec.clone(), Profile::Auto, 1, &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    let out = compute_outcome(&[(Dtype::Bf16, 590.0)]);
    let r = judged_with(spec, Profile::None, 1, &out);
    assert_eq!(
        r.reasons,
        vec!["GPU1 bf16: 590 TFLOP/s < 600 TFLOP/s (spec minTflops)"]
    );
}

#[test]
fn compute_mismatches_fail() {
    let mut out = compute_outcome(&[(Dtype::Fp16, 780.0)]);
    out.gemms[0].mismatches = 3;
    out.gemms[0].max_rel_error = 0.5;
    let r = judged(5, &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &[
            "GPU5 fp16: 3 mismatched elements in 1000 result comparisons (max relative error 5.00e-1)",
        ],
    );
    assert_eq!(r.gemms[0].mismatches, 3);
}

#[test]
fn transcendental_mismatches_fail() {
    let mut out = compute_outcome(&[(Dtype::Bf16, 780.0)]);
    if let Some(t) = out.transcendental.as_mut() {
        t.mismatches = 7;
    }
    let r = judged(2, &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &["GPU2 transcendental: 7 elements differed from the first run"],
    );
}

#[test]
fn a_gpu_at_its_power_cap_passes_and_reports_power() {
    let out = compute_outcome(&[(Dtype::Bf16, 780.0)]);
    let r = judged(0, &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    let p = r.power.expect("power");
    assert_eq!((p.samples, p.median_w, p.limit_w), (40, 660.0, Some(700.0)));
    assert_eq!((p.fraction, p.min_fraction), (Some(0.943), Some(0.75)));
    assert_eq!(p.throttle.len(), 1);
    assert_eq!(
        (p.throttle[0].reason.as_str(), p.throttle[0].fraction),
        ("SwPowerCap", 1.0)
    );
    assert_eq!(p.slowdown_fraction, 0.0);
}

#[test]
fn a_burn_far_below_the_power_limit_fails() {
    let mut out = compute_outcome(&[(Dtype::Bf16, 780.0)]);
    out.power = power_at(400.0, 40);
    let r = judged(3, &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &[
            "GPU3 power: the burn drew a median 400 W, 57% of its 700 W limit, below 75% (H200 profile)",
        ],
    );
    assert_eq!(r.reasons[0].code, Code::PowerBelowTarget);
    assert!(
        crate::checks::remeasure::short_on_performance_only(&r),
        "a power draw below target alone is measured again"
    );
    // the spec's share overrides the profile's; 0 turns the rule off
    for share in [0.5, 0.0] {
        let spec = ComputeCheck {
            min_power_fraction: Some(share),
            ..Default::default()
        };
        let r = judged_with(spec, Profile::Auto, 3, &out);
        assert_eq!(r.verdict, Verdict::Pass, "minPowerFraction {share}");
    }
    // without a profile nothing is asked of the power
    let r = judged_with(ComputeCheck::default(), Profile::None, 3, &out);
    assert_eq!(r.verdict, Verdict::Pass);
}

#[test]
fn hardware_slowdown_fails_past_its_share_but_one_noisy_sample_does_not() {
    let mut out = compute_outcome(&[(Dtype::Bf16, 780.0)]);
    out.power.samples[5] = sample(Phase::Burn, 650.0, &["HwSlowdown"]);
    let r = judged(2, &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    assert_eq!(r.power.as_ref().map(|p| p.slowdown_fraction), Some(0.025));
    for i in 10..20 {
        out.power.samples[i] = sample(Phase::Burn, 650.0, &["HwThermalSlowdown", "SwPowerCap"]);
    }
    out.power.samples[20] = sample(Phase::Burn, 650.0, &["HwPowerBrakeSlowdown"]);
    let r = judged(2, &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &[
            "GPU2: clocks slowed by HwSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown in 12 of 40 samples of the burn (30%, more than 5%)",
        ],
    );
    let tolerant = ComputeCheck {
        max_slowdown_fraction: Some(0.5),
        ..Default::default()
    };
    let r = judged_with(tolerant, Profile::Auto, 2, &out);
    assert_eq!(r.verdict, Verdict::Pass);
}

#[test]
fn a_lowered_power_limit_is_a_warning() {
    let mut out = compute_outcome(&[(Dtype::Bf16, 780.0)]);
    out.power = power_at(480.0, 40);
    out.power.limit_w = Some(500.0);
    let r = judged(1, &out);
    assert_eq!(r.verdict, Verdict::Warn);
    assert_eq!(
        r.reasons,
        ["GPU1 power: limit set to 500 W, below the GPU's default 700 W"]
    );
    assert_eq!(r.reasons[0].code, Code::PowerLimitLowered);
}

#[test]
fn the_pulse_reports_its_swing_and_fails_on_wrong_results() {
    let mut out = compute_outcome(&[(Dtype::Bf16, 780.0)]);
    for s in [
        sample(Phase::PulseLoad, 690.0, &["SwPowerCap"]),
        sample(Phase::PulseIdle, 95.0, &[]),
    ] {
        out.power.see_pulse(&s.reading);
    }
    out.pulse = Some(PulseOutcome {
        period_seconds: 1.0,
        seconds: 60.2,
        cycles: 60,
        comparisons: 183,
        mismatches: 0,
        max_rel_error: 0.0,
    });
    let r = judged(4, &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    let p = r.pulse.expect("pulse");
    // instantaneous readings
    assert_eq!(
        (p.min_w, p.max_w, p.swing_w),
        (Some(96.0), Some(691.0), Some(595.0))
    );
    assert_eq!((p.cycles, p.comparisons), (60, 183));
    if let Some(pulse) = out.pulse.as_mut() {
        pulse.mismatches = 2;
        pulse.max_rel_error = 0.5;
    }
    let r = judged(4, &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &[
            "GPU4 pulse: 2 mismatched elements in 183 result comparisons after 60 load-and-idle cycles (max relative error 5.00e-1)",
        ],
    );
}

#[test]
fn pulse_cycles_start_on_multiples_of_the_period() {
    let s = std::time::Duration::from_millis;
    assert_eq!(next_cycle_start(s(0), s(1000)), s(0));
    assert_eq!(next_cycle_start(s(1), s(1000)), s(1000));
    assert_eq!(next_cycle_start(s(2500), s(1000)), s(3000));
    assert_eq!(next_cycle_start(s(3000), s(500)), s(3000));
    assert_eq!(next_cycle_start(s(7), s(0)), s(7));
}

#[test]
fn the_watch_samples_until_told_and_skips_what_is_not_burn_or_pulse() {
    let phase = PhaseCell::default();
    phase.set(Phase::PulseLoad);
    let (done, finished) = mpsc::channel();
    let reads = std::cell::Cell::new(0);
    let read = || {
        reads.set(reads.get() + 1);
        if reads.get() == 3 {
            let _ = done.send(());
        }
        Some(PowerReading {
            average_w: Some(f64::from(reads.get())),
            ..Default::default()
        })
    };
    let watched = watch(std::time::Duration::from_millis(1), &phase, read, &finished);
    assert_eq!(watched.pulse_range, Some((1.0, 3.0)));
    let got: Vec<(Phase, Option<f64>)> = watched
        .samples
        .iter()
        .map(|s| (s.phase, s.reading.average_w))
        .collect();
    assert_eq!(
        got,
        (1..=3)
            .map(|n| (Phase::PulseLoad, Some(f64::from(n))))
            .collect::<Vec<_>>()
    );

    // outside the burn and the pulse nothing is read; a dropped sender ends the watch
    phase.set(Phase::Other);
    let (done, finished) = mpsc::channel::<()>();
    drop(done);
    let called = std::cell::Cell::new(false);
    let watched = watch(
        std::time::Duration::from_secs(3600),
        &phase,
        || {
            called.set(true);
            None
        },
        &finished,
    );
    assert!(watched.samples.is_empty() && !called.get());
}

#[test]
fn pulse_flags_turn_the_pulse_on_with_defaults_for_the_rest() {
    let mut spec = ComputeCheck::default();
    Flags::default().apply(&mut spec);
    assert!(spec.pulse.is_none());
    let flags = Flags {
        pulse_period: Some("500ms".parse().expect("duration")),
        min_power_fraction: Some(0.8),
        ..Default::default()
    };
    flags.apply(&mut spec);
    let pulse = spec.pulse.expect("pulse on");
    assert_eq!(
        (pulse.period.as_secs_f64(), pulse.duration.as_secs_f64()),
        (0.5, 60.0)
    );
    assert_eq!(spec.min_power_fraction, Some(0.8));
    let c = Compute::from_spec(&ComputeCheck {
        pulse: Some(pulse),
        ..Default::default()
    });
    assert_eq!(
        c.request.pulse.map(|p| p.duration),
        Some(std::time::Duration::from_secs(60))
    );
}

/// The compute check alone (10 s burn, pulse as given) through the runner on a simulated node.
fn simulated_burn(spec: &str, pulse: Option<gpuval_crds::PulseSpec>) -> gpuval_crds::NodeReport {
    let checks = checks_with(|c| {
        c.compute = Some(ComputeCheck {
            duration: "10s".parse().expect("duration"),
            pulse,
            ..Default::default()
        })
    });
    crate::judge::testing::simulated_run(spec, checks)
}

#[test]
fn a_planted_hardware_slowdown_fails_the_burn_on_that_gpu_only() {
    let report = simulated_burn("gpus=2,throttle=1:HwSlowdown", None);
    let c = |i: usize| report.gpus[i].compute.clone().expect("compute");
    assert_eq!(c(0).verdict, Verdict::Pass, "{:?}", c(0).reasons);
    let slowed = c(1);
    assert_eq!(slowed.verdict, Verdict::Fail);
    assert_eq!(
        slowed.reasons,
        [
            "GPU1 power: the burn drew a median 390 W, 56% of its 700 W limit, below 75% (H200 profile)",
            "GPU1: clocks slowed by HwSlowdown in 12 of 20 samples of the burn (60%, more than 5%)",
        ]
    );
    let table = crate::render::table(&report);
    assert!(table.contains("power during the burn:"), "{table}");
    assert!(table.contains("HwSlowdown 60%"), "{table}");
}

#[test]
fn the_simulated_pulse_swings_and_checks_results() {
    let pulse = gpuval_crds::PulseSpec {
        period: "1s".parse().expect("duration"),
        duration: "10s".parse().expect("duration"),
    };
    let report = simulated_burn("gpus=2,fail=compute@1", Some(pulse));
    let p = |i: usize| {
        report.gpus[i]
            .compute
            .as_ref()
            .and_then(|c| c.pulse.clone())
            .expect("pulse")
    };
    assert_eq!((p(0).cycles, p(0).mismatches), (10, 0));
    assert!(p(0).swing_w.is_some_and(|w| w > 500.0), "{:?}", p(0));
    assert_eq!(p(1).mismatches, 4);
    let reasons = &report.gpus[1].compute.as_ref().expect("compute").reasons;
    assert_any_starts_with(reasons, "GPU1 pulse: 4 mismatched elements");
}

#[test]
fn a_long_watch_keeps_an_even_subsample() {
    let phase = PhaseCell::default();
    phase.set(Phase::Burn);
    let (done, finished) = mpsc::channel();
    let total = 3 * super::power::MAX_KEPT as u64;
    let reads = std::cell::Cell::new(0u64);
    let read = || {
        let n = reads.get();
        reads.set(n + 1);
        if n + 1 == total {
            let _ = done.send(());
        }
        Some(PowerReading {
            average_w: Some(n as f64),
            ..Default::default()
        })
    };
    let watched = watch(std::time::Duration::ZERO, &phase, read, &finished);
    let kept: Vec<f64> = watched
        .samples
        .iter()
        .filter_map(|s| s.reading.average_w)
        .collect();
    assert!(kept.len() < super::power::MAX_KEPT, "{}", kept.len());
    // every kept read is a multiple of the final stride, from the first read to near the last
    assert_eq!(kept[0], 0.0);
    let stride = kept[1] - kept[0];
    assert_eq!(stride, 4.0);
    assert!(kept.windows(2).all(|w| w[1] - w[0] == stride));
    assert!(*kept.last().expect("kept") >= (total - 4) as f64);
}
