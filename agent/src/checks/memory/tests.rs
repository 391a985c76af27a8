//! The memory check's judging rules.

use gpuval_crds::{Checks, MemoryPattern, MemoryResult, Mismatch, Profile, Verdict};

use super::*;
use crate::backend::GpuInfo;
use crate::judge::testing::{assert_fails_with, checks_with, gpu, h200, judge};

/// A memory outcome at `gbps` combined, testing `share` of `free` bytes.
fn memory_outcome(gbps: f64, total: u64, free: u64, share: f64) -> MemoryOutcome {
    let tested = (free as f64 * share) as u64;
    let bytes = tested * 2;
    let seconds = bytes as f64 / (gbps * 1e9);
    MemoryOutcome {
        total_bytes: total,
        free_bytes_before: free,
        bytes_tested: tested,
        fill_seconds: seconds,
        verify_seconds: seconds,
        bytes_written: bytes,
        bytes_read: bytes,
        passes: 1,
        ..Default::default()
    }
}

fn healthy_memory(gbps: f64) -> MemoryOutcome {
    let g = h200(0);
    memory_outcome(gbps, g.memory_total_bytes, g.memory_free_bytes, 0.95)
}

fn memory_checks(spec: MemoryCheck) -> Checks {
    checks_with(|c| c.memory = Some(spec))
}

/// `gpu` judged on `out` under `spec`, with its model's profile or none.
fn judged_with(
    spec: MemoryCheck,
    profile: Profile,
    gpu: &GpuInfo,
    out: &MemoryOutcome,
) -> MemoryResult {
    judge(&memory_checks(spec), profile).memory(gpu, out)
}

/// [`judged_with`] the default spec and the model's profile.
fn judged(gpu: &GpuInfo, out: &MemoryOutcome) -> MemoryResult {
    judged_with(MemoryCheck::default(), Profile::Auto, gpu, out)
}

#[test]
fn memory_passes_above_profile_floor() {
    let r = judged(&h200(0), &healthy_memory(4000.0));
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    assert!((r.gbps - 4000.0).abs() < 0.01);
    assert!((r.fill_gbps - 4000.0).abs() < 0.01);
    assert!((r.verify_gbps - 4000.0).abs() < 0.01);
    assert!((r.tested_gib - 133.0).abs() < 1.0, "{}", r.tested_gib);
    assert_eq!((r.fraction, r.passes, r.mismatches), (0.95, 1, 0));
}

#[test]
fn memory_mismatches_fail() {
    let mut out = healthy_memory(4000.0);
    out.mismatches = 2;
    out.first_mismatches = vec![Mismatch {
        offset: 0x1a2b_3c40,
        expected: "0x0".into(),
        actual: "0x1".into(),
    }];
    let r = judged(&h200(3), &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &["GPU3 memory: 2 mismatched words (first at offset 0x1a2b3c40)"],
    );
    assert_eq!(r.first_mismatches.len(), 1);
}

#[test]
fn memory_mismatches_within_allowance_pass() {
    let spec = MemoryCheck {
        max_mismatches: Some(5),
        ..Default::default()
    };
    let mut out = healthy_memory(4000.0);
    out.mismatches = 5;
    let r = judged_with(spec.clone(), Profile::Auto, &h200(0), &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    out.mismatches = 6;
    let r = judged_with(spec, Profile::Auto, &h200(0), &out);
    assert_eq!(
        r.reasons,
        vec!["GPU0 memory: 6 mismatched words, more than the 5 allowed"]
    );
}

#[test]
fn memory_throughput_below_profile_floor_fails() {
    let r = judged(&h200(1), &healthy_memory(3000.0));
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &["GPU1 memory: 3000 GB/s < 3400 GB/s (H200 profile)"],
    );
}

#[test]
fn memory_spec_floor_overrides_profile() {
    let spec = MemoryCheck {
        min_gbps: Some(2000),
        ..Default::default()
    };
    let r = judged_with(
        spec.clone(),
        Profile::Auto,
        &h200(1),
        &healthy_memory(3000.0),
    );
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    let r = judged_with(spec, Profile::Auto, &h200(1), &healthy_memory(1500.0));
    assert_eq!(
        r.reasons,
        vec!["GPU1 memory: 1500 GB/s < 2000 GB/s (spec minGbps)"]
    );
}

#[test]
fn memory_without_profile_has_no_floor() {
    let l40s = gpu(0, "NVIDIA L40S");
    let r = judged(&l40s, &healthy_memory(500.0));
    assert_eq!(r.verdict, Verdict::Pass);
    let r = judged_with(
        MemoryCheck::default(),
        Profile::None,
        &h200(0),
        &healthy_memory(500.0),
    );
    assert_eq!(r.verdict, Verdict::Pass);
}

#[test]
fn memory_held_by_another_process_is_busy_not_a_hardware_fault() {
    let gib = 1u64 << 30;
    let total = (143.8 * gib as f64) as u64;
    let free = (87.1 * gib as f64) as u64;
    let out = memory_outcome(4000.0, total, free, 0.95);
    let r = judged(&h200(2), &out);
    assert_eq!(r.verdict, Verdict::Error, "{:?}", r.reasons);
    assert_eq!(
        r.reasons,
        [
            "GPU2: only 60% of memory free at start (87.1 of 143.8 GiB); another process holds GPU memory"
        ]
    );
    assert_eq!(r.reasons[0].action, gpuval_crds::reason::Action::Rerun);
    let out = memory_outcome(4000.0, total, total / 100 * 91, 0.95);
    let r = judged(&h200(2), &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
}

#[test]
fn memory_tested_well_below_fraction_fails() {
    let g = h200(4);
    let out = memory_outcome(4000.0, g.memory_total_bytes, g.memory_free_bytes, 0.5);
    let r = judged(&g, &out);
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.reasons[0].starts_with("GPU4 memory: tested 69.9 GiB, 50% of free memory"),
        "{:?}",
        r.reasons
    );
    assert!(r.reasons[0].ends_with("well below the 95% asked for"));
    let out = memory_outcome(4000.0, g.memory_total_bytes, g.memory_free_bytes, 0.9);
    let r = judged(&g, &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
}

fn rows(cor: i64, unc: i64, pending: bool, failure: bool) -> gpuval_crds::RowHealth {
    gpuval_crds::RowHealth {
        remapped_correctable: Some(cor),
        remapped_uncorrectable: Some(unc),
        remap_pending: Some(pending),
        remap_failure: Some(failure),
        ..Default::default()
    }
}

fn pattern(p: MemoryPattern, bytes: u64, seconds: f64, mismatches: u64) -> super::PatternOutcome {
    super::PatternOutcome {
        pattern: p,
        passes: 1,
        bytes,
        seconds,
        mismatches,
    }
}

#[test]
fn flipped_bits_and_the_patterns_that_found_them_are_named() {
    let mut out = healthy_memory(4000.0);
    out.patterns = vec![
        pattern(MemoryPattern::Address, 1 << 30, 0.25, 0),
        pattern(MemoryPattern::MovingInversions, 1 << 32, 1.0, 3),
        pattern(MemoryPattern::Random, 1 << 30, 0.25, 1),
    ];
    out.mismatches = 4;
    for _ in 0..4 {
        out.bits.add_word(0x0000_0000, 0x0000_2000);
    }
    out.first_mismatches = vec![Mismatch {
        offset: 0x40,
        expected: "0x00000000".into(),
        actual: "0x00002000".into(),
    }];
    let r = judged(&h200(6), &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &[
            "GPU6 memory: 4 mismatched words (first at offset 0x40) in movingInversions 3, random 1; bit 13 4× 0→1 (stuck at 1)",
        ],
    );
    let flips = r.bit_flips.expect("bit flips");
    assert_eq!((flips.stuck_at_one, flips.stuck_at_zero), (4, 0));
    assert_eq!(r.patterns.len(), 3);
    assert_eq!(r.patterns[1].pattern, MemoryPattern::MovingInversions);
    assert!((r.patterns[1].gbps - (1u64 << 32) as f64 / 1e9).abs() < 1e-6);
}

#[test]
fn without_the_address_pattern_the_floor_applies_to_every_pattern() {
    let g = h200(0);
    let mut out = memory_outcome(4000.0, g.memory_total_bytes, g.memory_free_bytes, 0.95);
    (
        out.fill_seconds,
        out.verify_seconds,
        out.bytes_written,
        out.bytes_read,
    ) = (0.0, 0.0, 0, 0);
    out.patterns = vec![pattern(MemoryPattern::Random, 3_000_000_000_000, 1.0, 0)];
    let r = judged(&g, &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &["GPU0 memory (every pattern): 3000 GB/s < 3400 GB/s (H200 profile)"],
    );
    assert!((r.gbps - 3000.0).abs() < 1e-6);
}

/// The table's REMAPPED ROWS cell of a judged result.
fn rows_cell(r: &MemoryResult) -> String {
    super::judge::rows_cell(r.rows_before.as_ref(), r.rows_after.as_ref())
}

#[test]
fn rows_remapped_during_the_test_warn_and_a_failed_remapping_fails() {
    let mut out = healthy_memory(4000.0);
    out.rows_before = Some(rows(0, 0, false, false));
    out.rows_after = Some(rows(0, 0, false, false));
    let r = judged(&h200(2), &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    assert_eq!(rows_cell(&r), "0 → 0");

    out.rows_after = Some(rows(0, 1, true, false));
    let r = judged(&h200(2), &out);
    assert_eq!(r.verdict, Verdict::Warn);
    assert_eq!(
        r.reasons,
        [
            "GPU2 memory: 1 row remapped during the test (0 after correctable, 1 after uncorrectable errors); reset the GPU to apply the remapping"
        ]
    );
    assert_eq!(
        (r.reasons[0].code, r.reasons[0].action),
        (Code::MemoryRowsRemapped, gpuval_crds::Action::ResetGpu)
    );
    assert_eq!(rows_cell(&r), "0 → 1 (pending)");

    out.rows_after = Some(rows(0, 1, true, true));
    let r = judged(&h200(2), &out);
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.reasons[0].contains("a row remapping failed during the test"),
        "{:?}",
        r.reasons
    );

    // already so before the test: the GPU's health reports it, not the test
    out.rows_before = out.rows_after.clone();
    let r = judged(&h200(2), &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
}

#[test]
fn retired_pages_during_the_test_warn() {
    let mut out = healthy_memory(4000.0);
    let page = |sbe, pending| gpuval_crds::RowHealth {
        retired_single_bit: Some(sbe),
        retired_double_bit: Some(0),
        retire_pending: Some(pending),
        ..Default::default()
    };
    out.rows_before = Some(page(1, false));
    out.rows_after = Some(page(3, true));
    let r = judged(&h200(0), &out);
    assert_eq!(r.verdict, Verdict::Warn);
    assert_eq!(
        r.reasons,
        ["GPU0 memory: 2 pages retired during the test; reset the GPU to retire them"]
    );
}

#[test]
fn patterns_come_from_the_spec_and_the_flag_once_each_in_order() {
    let m = Memory::from_spec(&MemoryCheck::default());
    assert_eq!(m.request.patterns, MemoryPattern::ALL);
    let mut spec = MemoryCheck::default();
    Flags {
        memory_patterns: Some(vec![
            MemoryPattern::Random,
            MemoryPattern::Random,
            MemoryPattern::Address,
        ]),
        ..Default::default()
    }
    .apply(&mut spec);
    let m = Memory::from_spec(&spec);
    assert_eq!(
        m.request.patterns,
        [MemoryPattern::Random, MemoryPattern::Address]
    );
    assert_eq!(
        "moving-inversions".parse::<MemoryPattern>(),
        Ok(MemoryPattern::MovingInversions)
    );
    assert!("walking".parse::<MemoryPattern>().is_err());
}

#[test]
fn a_planted_stuck_bit_is_reported_by_bit_through_the_runner() {
    let checks = memory_checks(MemoryCheck::default());
    let report = crate::judge::testing::simulated_run("gpus=2,fail=memory@1", checks);
    let m = |i: usize| report.gpus[i].memory.clone().expect("memory");
    assert_eq!(m(0).verdict, Verdict::Pass, "{:?}", m(0).reasons);
    assert_eq!(m(0).patterns.len(), 3);
    assert!(m(0).rows_after.is_some());
    assert_eq!(m(1).verdict, Verdict::Fail);
    assert!(
        m(1).reasons[0]
            .ends_with("in address 4, movingInversions 2, random 1; bit 12 7× 0→1 (stuck at 1)"),
        "{:?}",
        m(1).reasons
    );
    let table = crate::render::table(&report);
    assert!(table.contains("memory patterns:"), "{table}");
    assert!(table.contains("bit 12 7× 0→1 (stuck at 1)"), "{table}");
}
