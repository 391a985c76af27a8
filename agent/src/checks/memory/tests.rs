//! The memory check's judging rules.

use gpuval_crds::{Checks, Mismatch, Profile, Verdict};

use super::*;
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

#[test]
fn memory_passes_above_profile_floor() {
    let checks = memory_checks(MemoryCheck::default());
    let r = judge(&checks, Profile::Auto).memory(&h200(0), &healthy_memory(4000.0));
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    assert!((r.gbps - 4000.0).abs() < 0.01);
    assert!((r.fill_gbps - 4000.0).abs() < 0.01);
    assert!((r.verify_gbps - 4000.0).abs() < 0.01);
    assert!((r.tested_gib - 133.0).abs() < 1.0, "{}", r.tested_gib);
    assert_eq!((r.fraction, r.passes, r.mismatches), (0.95, 1, 0));
}

#[test]
fn memory_mismatches_fail() {
    let checks = memory_checks(MemoryCheck::default());
    let mut out = healthy_memory(4000.0);
    out.mismatches = 2;
    out.first_mismatches = vec![Mismatch {
        offset: 0x1a2b_3c40,
        expected: "0x0".into(),
        actual: "0x1".into(),
    }];
    let r = judge(&checks, Profile::Auto).memory(&h200(3), &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &["GPU3 memory: 2 mismatched words (first at offset 0x1a2b3c40)"],
    );
    assert_eq!(r.first_mismatches.len(), 1);
}

#[test]
fn memory_mismatches_within_allowance_pass() {
    let checks = memory_checks(MemoryCheck {
        max_mismatches: Some(5),
        ..Default::default()
    });
    let mut out = healthy_memory(4000.0);
    out.mismatches = 5;
    let r = judge(&checks, Profile::Auto).memory(&h200(0), &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    out.mismatches = 6;
    let r = judge(&checks, Profile::Auto).memory(&h200(0), &out);
    assert_eq!(
        r.reasons,
        vec!["GPU0 memory: 6 mismatched words, more than the 5 allowed"]
    );
}

#[test]
fn memory_throughput_below_profile_floor_fails() {
    let checks = memory_checks(MemoryCheck::default());
    let r = judge(&checks, Profile::Auto).memory(&h200(1), &healthy_memory(3000.0));
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
    let checks = memory_checks(spec);
    let r = judge(&checks, Profile::Auto).memory(&h200(1), &healthy_memory(3000.0));
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
    let r = judge(&checks, Profile::Auto).memory(&h200(1), &healthy_memory(1500.0));
    assert_eq!(
        r.reasons,
        vec!["GPU1 memory: 1500 GB/s < 2000 GB/s (spec minGbps)"]
    );
}

#[test]
fn memory_without_profile_has_no_floor() {
    let checks = memory_checks(MemoryCheck::default());
    let l40s = gpu(0, "NVIDIA L40S");
    let r = judge(&checks, Profile::Auto).memory(&l40s, &healthy_memory(500.0));
    assert_eq!(r.verdict, Verdict::Pass);
    let r = judge(&checks, Profile::None).memory(&h200(0), &healthy_memory(500.0));
    assert_eq!(r.verdict, Verdict::Pass);
}

#[test]
fn memory_held_by_another_process_fails() {
    let checks = memory_checks(MemoryCheck::default());
    let gib = 1u64 << 30;
    let total = (143.8 * gib as f64) as u64;
    let free = (87.1 * gib as f64) as u64;
    let out = memory_outcome(4000.0, total, free, 0.95);
    let r = judge(&checks, Profile::Auto).memory(&h200(2), &out);
    assert_fails_with(
        r.verdict,
        &r.reasons,
        &[
            "GPU2: only 60% of memory free at start (87.1 of 143.8 GiB); another process holds GPU memory",
        ],
    );
    let out = memory_outcome(4000.0, total, total / 100 * 91, 0.95);
    let r = judge(&checks, Profile::Auto).memory(&h200(2), &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
}

#[test]
fn memory_tested_well_below_fraction_fails() {
    let checks = memory_checks(MemoryCheck::default());
    let g = h200(4);
    let out = memory_outcome(4000.0, g.memory_total_bytes, g.memory_free_bytes, 0.5);
    let r = judge(&checks, Profile::Auto).memory(&g, &out);
    assert_eq!(r.verdict, Verdict::Fail);
    assert!(
        r.reasons[0].starts_with("GPU4 memory: tested 69.9 GiB, 50% of free memory"),
        "{:?}",
        r.reasons
    );
    assert!(r.reasons[0].ends_with("well below the 95% asked for"));
    let out = memory_outcome(4000.0, g.memory_total_bytes, g.memory_free_bytes, 0.9);
    let r = judge(&checks, Profile::Auto).memory(&g, &out);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
}
