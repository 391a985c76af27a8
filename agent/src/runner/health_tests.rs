//! Verdicts an operator can act on, through the whole runner on the simulated backend: the
//! node's facts (a wrong GPU count fails fast), Xids with their meaning, severity overrides,
//! a second measurement of a figure that fell short, and a missing measurement as an Error.

use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use gpuval_crds::facts::CountSource;
use gpuval_crds::{
    Action, Checks, Code, ComputeCheck, MemoryCheck, NodeReport, Severity, SeverityOverride,
    Thresholds, TopologyCheck, Verdict,
};

use super::{Plan, run};
use crate::backend::Backend;
use crate::backend::sim::SimBackend;
use crate::checks::Planned;
use crate::judge::testing::assert_any_starts_with;

fn checks() -> Checks {
    Checks {
        topology: Some(TopologyCheck::default()),
        memory: Some(MemoryCheck::default()),
        compute: Some(ComputeCheck {
            duration: "10s".parse().expect("a duration"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The report and the progress lines of `plan` on the simulated node `spec`.
fn run_with(spec: &str, plan: &Plan) -> (NodeReport, Vec<String>) {
    let backend = Backend::Simulated(SimBackend::new(spec.parse().expect("valid spec")));
    let lines = Mutex::new(Vec::new());
    let sink = |l: &str| lines.lock().expect("lines").push(l.to_string());
    let report = run(&backend, plan, &AtomicBool::new(false), &sink);
    (report, lines.into_inner().expect("lines"))
}

fn plan(set: impl FnOnce(&mut Plan)) -> Plan {
    let mut p = Plan::new(checks(), Thresholds::default());
    set(&mut p);
    p
}

fn codes(reasons: &[gpuval_crds::Reason]) -> Vec<Code> {
    reasons.iter().map(|r| r.code).collect()
}

#[test]
fn a_node_short_of_a_gpu_fails_before_the_long_checks() {
    let p = plan(|p| p.expected_gpus = Some((8, CountSource::Capacity)));
    let (r, lines) = run_with("gpus=7", &p);
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(codes(&r.failures), [Code::GpuCountMismatch]);
    assert_eq!(r.action, Action::RebootNode);
    assert!(
        r.failures[0].message.starts_with(
            "7 GPUs visible, 8 expected (the node's nvidia.com/gpu capacity): NVML sees 0000:18:00.0, 0000:2a:00.0,"
        ),
        "{}",
        r.failures[0]
    );
    let facts = r.facts.as_ref().expect("facts");
    assert_eq!((facts.expected_gpus, facts.gpus_seen), (Some(8), 7));
    assert!(
        r.gpus
            .iter()
            .all(|g| g.memory.is_none() && g.compute.is_none()),
        "no check ran"
    );
    assert!(r.topology.is_none());
    assert!(
        !lines.iter().any(|l| l.starts_with("[memory]")),
        "{lines:?}"
    );
    assert_any_starts_with(&lines, "[facts] 7 GPUs visible, 8 expected");

    // The listed slots name the missing GPU.
    let p = plan(|p| {
        p.expect.gpu_count = Some(8);
        p.expect.pci_bus_ids = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
            .iter()
            .map(|b| format!("0000:{b}:00.0"))
            .collect();
    });
    let (r, _) = run_with("gpus=7", &p);
    assert!(
        r.failures[0]
            .message
            .contains("no GPU at 0000:db:00.0 (spec.expect.pciBusIds)")
    );

    let (r, _) = run_with("gpus=8", &plan(|p| p.expect.gpu_count = Some(8)));
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.failures);
}

#[test]
fn xids_are_mapped_to_their_meaning_fatal_ones_fail_the_gpu_the_rest_warn() {
    let (r, _) = run_with("gpus=4,xid=1:48+1:48+2:13+3:999", &plan(|_| {}));
    let t = |i: usize| r.gpus[i].telemetry.clone().expect("telemetry");
    let x1 = &t(1).xids[0];
    assert_eq!((x1.xid, x1.count, x1.fatal), (48, 2, true));
    assert_eq!(x1.name.as_deref(), Some("ROBUST_CHANNEL_GPU_ECC_DBE"));
    assert_eq!(r.gpus[1].verdict, Verdict::Fail);
    assert_eq!(r.gpus[2].verdict, Verdict::Warn, "{:?}", r.gpus[2].reasons);
    assert_eq!(r.gpus[3].verdict, Verdict::Warn);
    assert_eq!(codes(&r.gpus[3].reasons), [Code::XidUnknown]);
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(codes(&r.failures), [Code::XidFatal]);
    assert_eq!(r.failures[0].action, Action::ResetGpu);
    assert!(
        r.failures[0]
            .message
            .contains("2 times; NVIDIA's catalogue: reset the GPU")
    );
    assert_eq!(codes(&r.warnings), [Code::XidNonFatal, Code::XidUnknown]);
    assert_eq!(r.action, Action::ResetGpu);
    assert_eq!(r.codes(), "XidFatal");

    // Only non-fatal Xids: the node passes with a warning and the catalogue's action.
    let (r, _) = run_with("gpus=2,xid=0:13", &plan(|_| {}));
    assert_eq!(r.verdict, Verdict::Warn);
    assert_eq!(r.action, Action::Rerun);
    assert!(r.failures.is_empty());
}

#[test]
fn the_spec_raises_or_lowers_a_severity_by_its_code() {
    let raise = plan(|p| {
        p.overrides = vec![SeverityOverride {
            code: Code::XidNonFatal,
            severity: Severity::Fail,
        }]
    });
    let (r, _) = run_with("gpus=2,xid=0:13", &raise);
    assert_eq!(r.verdict, Verdict::Fail);
    assert_eq!(r.failures[0].severity, Severity::Fail);
    assert_eq!(r.gpus[0].verdict, Verdict::Fail);

    let lower = plan(|p| {
        p.overrides = vec![SeverityOverride {
            code: Code::MemoryBandwidthLow,
            severity: Severity::Warn,
        }]
    });
    let (r, lines) = run_with("gpus=4,slow=memory@2:0.5", &lower);
    assert_eq!(r.verdict, Verdict::Warn, "{:?}", r.failures);
    let m = r.gpus[2].memory.as_ref().expect("memory");
    assert_eq!(m.verdict, Verdict::Warn);
    assert!(
        m.reasons
            .iter()
            .all(|x| x.code == Code::MemoryBandwidthLow && x.severity == Severity::Warn)
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("[remeasure]")),
        "a warning is not measured again"
    );
}

#[test]
fn a_figure_that_fell_short_once_is_measured_again_and_the_second_decides() {
    let (r, lines) = run_with("gpus=4,flaky=memory@2:0.5", &plan(|_| {}));
    assert!(
        lines
            .iter()
            .any(|l| l == "[remeasure] measured again: memory (a figure fell short)"),
        "{lines:?}"
    );
    let m = r.gpus[2].memory.as_ref().expect("memory");
    assert_eq!(m.verdict, Verdict::Pass, "{:?}", m.reasons);
    assert_eq!(codes(&m.reasons), [Code::SecondMeasurement]);
    assert!(
        m.reasons[0]
            .message
            .starts_with("GPU2 memory: the first measurement fell short (GPU2 memory: 2"),
        "{}",
        m.reasons[0]
    );
    assert!(
        m.gbps > 3000.0,
        "the second measurement's figure: {}",
        m.gbps
    );
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.failures);

    // A GPU that is slow every time fails, and says it was measured twice.
    let (r, _) = run_with("gpus=4,slow=memory@2:0.5", &plan(|_| {}));
    let m = r.gpus[2].memory.as_ref().expect("memory");
    assert_eq!(m.verdict, Verdict::Fail);
    assert_eq!(
        codes(&m.reasons)[..2],
        [Code::MemoryBandwidthLow, Code::MemoryBandwidthLow]
    );
    assert!(codes(&m.reasons).contains(&Code::SecondMeasurement));
    assert_eq!(r.verdict, Verdict::Fail);

    // Asked not to, the first measurement decides.
    let once = plan(|p| p.thresholds.remeasure = false);
    let (r, lines) = run_with("gpus=4,flaky=memory@2:0.5", &once);
    assert_eq!(
        r.gpus[2].memory.as_ref().expect("memory").verdict,
        Verdict::Fail
    );
    assert!(!lines.iter().any(|l| l.starts_with("[remeasure]")));
}

#[test]
fn a_missing_measurement_is_an_error_never_a_pass() {
    // A check asked for whose result never came back.
    let p = plan(|_| {});
    let planned = Planned::new(&p, true);
    let mut report = NodeReport {
        gpus: vec![gpuval_crds::GpuReport {
            index: 0,
            ..Default::default()
        }],
        ..Default::default()
    };
    planned.require_results(&mut report);
    let m = report.gpus[0]
        .memory
        .as_ref()
        .expect("an Error result in its place");
    assert_eq!(m.verdict, Verdict::Error);
    assert_eq!(codes(&m.reasons), [Code::MeasurementMissing]);
    assert!(
        report
            .topology
            .as_ref()
            .is_some_and(|t| t.verdict == Verdict::Error)
    );
    assert!(report.p2p.is_none(), "a check not asked for stays absent");
    let judge = crate::judge::testing::judge(&p.checks, gpuval_crds::Profile::Auto);
    judge.node(&mut report);
    assert_eq!(report.verdict, Verdict::Error);

    // A burn that timed nothing has no TFLOP/s to compare with its floor.
    let out = crate::checks::compute::ComputeOutcome {
        gemms: vec![crate::checks::compute::GemmOutcome::nothing(
            gpuval_crds::Dtype::Bf16,
        )],
        transcendental: None,
        seconds: 0.0,
        power: Default::default(),
        pulse: None,
    };
    let c = judge.compute(&crate::judge::testing::h200(0), &out);
    assert_eq!(c.verdict, Verdict::Error, "{:?}", c.reasons);
    assert_eq!(codes(&c.reasons), [Code::MeasurementMissing]);
    let o = crate::checks::memory::MemoryOutcome {
        total_bytes: 1 << 30,
        free_bytes_before: 1 << 30,
        ..Default::default()
    };
    let m = judge.memory(&crate::judge::testing::h200(0), &o);
    assert!(
        matches!(m.verdict, Verdict::Error | Verdict::Fail),
        "{:?}",
        m.reasons
    );
    assert!(codes(&m.reasons).contains(&Code::MeasurementMissing));
}

#[test]
fn versions_and_modes_are_in_the_report() {
    let (r, _) = run_with(
        "gpus=2,version=driver:535.104.05+nccl:2.21.5",
        &plan(|_| {}),
    );
    let v = r.versions();
    assert_eq!(v.driver.as_deref(), Some("535.104.05"));
    assert_eq!(v.nccl.as_deref(), Some("2.21.5"));
    assert_eq!(v.vbios.as_deref(), Some("simulated"));
    let h = r.gpus[0].health.as_ref().expect("health");
    assert_eq!(
        (h.persistence_mode, h.mig_mode, h.ecc_enabled),
        (Some(true), Some(false), Some(true))
    );
    assert_eq!(r.verdict, Verdict::Pass);
    // Expecting persistence mode off on a node that runs it warns.
    let off = plan(|p| p.expect.persistence_mode = gpuval_crds::facts::ModeExpectation::Off);
    let (r, _) = run_with("gpus=2", &off);
    assert_eq!(r.verdict, Verdict::Warn);
    assert_eq!(codes(&r.warnings), [Code::PersistenceModeUnexpected; 2]);
}
