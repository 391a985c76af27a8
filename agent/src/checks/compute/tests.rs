//! The compute check's judging rules.

use gpuval_crds::{Checks, Profile, TflopsThresholds, Verdict};

use super::*;
use crate::judge::testing::{assert_fails_with, checks_with, h200, judge};

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
    }
}

fn compute_checks(spec: ComputeCheck) -> Checks {
    checks_with(|c| c.compute = Some(spec))
}

#[test]
fn compute_passes_above_floors() {
    let checks = compute_checks(ComputeCheck::default());
    let out = compute_outcome(&[(Dtype::Bf16, 780.0), (Dtype::Fp32, 50.0)]);
    let r = judge(&checks, Profile::Auto).compute(&h200(0), &out);
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
    let checks = compute_checks(ComputeCheck::default());
    let out = compute_outcome(&[(Dtype::Bf16, 512.0), (Dtype::Tf32, 400.0)]);
    let r = judge(&checks, Profile::Auto).compute(&h200(1), &out);
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
    let checks = compute_checks(spec);
    let out = compute_outcome(&[(Dtype::Bf16, 612.0)]);
    let r = judge(&checks, Profile::Auto).compute(&h200(1), &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    let out = compute_outcome(&[(Dtype::Bf16, 590.0)]);
    let r = judge(&checks, Profile::None).compute(&h200(1), &out);
    assert_eq!(
        r.reasons,
        vec!["GPU1 bf16: 590 TFLOP/s < 600 TFLOP/s (spec minTflops)"]
    );
}

#[test]
fn compute_mismatches_fail() {
    let checks = compute_checks(ComputeCheck::default());
    let mut out = compute_outcome(&[(Dtype::Fp16, 780.0)]);
    out.gemms[0].mismatches = 3;
    out.gemms[0].max_rel_error = 0.5;
    let r = judge(&checks, Profile::Auto).compute(&h200(5), &out);
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
    let checks = compute_checks(ComputeCheck::default());
    let mut out = compute_outcome(&[(Dtype::Bf16, 780.0)]);
    if let Some(t) = out.transcendental.as_mut() {
        t.mismatches = 7;
    }
    let r = judge(&checks, Profile::Auto).compute(&h200(2), &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &["GPU2 transcendental: 7 elements differed from the first run"],
    );
}
