//! The simulated backend through the whole runner: healthy nodes pass, planted faults show up
//! where they were planted, and the same spec gives the same report.

use std::sync::atomic::AtomicBool;

use gpuval_crds::{
    Checks, ComputeCheck, Dtype, MemoryCheck, NodeReport, Thresholds, TopologyCheck, Verdict,
};

use super::{Plan, run};
use crate::backend::sim::SimBackend;
use crate::backend::{Backend, Platform};
use crate::judge::testing::{assert_any_contains, assert_any_starts_with};

/// Topology, memory and a compute burn in every data type on a simulated node, through the
/// runner, as the agent runs them.
pub(crate) fn simulated_report(spec: &str) -> NodeReport {
    let checks = Checks {
        topology: Some(TopologyCheck::default()),
        memory: Some(MemoryCheck::default()),
        compute: Some(ComputeCheck {
            dtypes: Dtype::ALL.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    };
    simulated(spec, checks)
}

/// A run of these checks on the simulated node `spec` describes.
fn simulated(spec: &str, checks: Checks) -> NodeReport {
    let backend = Backend::Simulated(SimBackend::new(spec.parse().expect("valid spec")));
    let plan = Plan::new(checks, Thresholds::default());
    run(&backend, &plan, &AtomicBool::new(false), &|_| {})
}

#[test]
fn same_spec_same_report() {
    let spec = "gpus=4,model=H100,fail=memory@2,slow=compute@3:0.7,xid=1:79,linkdown=0:1";
    // Timestamps and telemetry depend on when and how often the sampler ran.
    let timeless = |mut r: NodeReport| {
        r.started_at.clear();
        r.finished_at.clear();
        for g in &mut r.gpus {
            g.telemetry = None;
        }
        r
    };
    let a = simulated_report(spec);
    let b = simulated_report(spec);
    assert_eq!(timeless(a), timeless(b));
    let sim = SimBackend::new(spec.parse().expect("valid spec"));
    let samples: Vec<_> = (0..12).filter_map(|_| sim.sample(0).ok()).collect();
    let ta = crate::telemetry::summarize(&samples, None, None, &[]);
    let sm = ta.sm_clock_mhz.expect("sm clock");
    assert!(sm.min < sm.max, "samples vary: {sm:?}");
}

#[test]
fn healthy_nodes_pass_every_model() {
    for model in ["H100", "H200", "A100"] {
        let report = simulated_report(&format!("gpus=8,model={model}"));
        assert_eq!(
            report.verdict,
            Verdict::Pass,
            "{model}: {:?}",
            report.failures
        );
        assert!(report.gpus.iter().all(|g| g.verdict == Verdict::Pass));
    }
}

#[test]
fn injected_faults_show_up_in_the_verdict() {
    let report = simulated_report(
        "gpus=8,model=H200,fail=memory@2+compute@5,slow=compute@3:0.5,xid=1:79,linkdown=2:4,error=memory@1",
    );
    assert_eq!(
        report.verdict,
        Verdict::Fail,
        "hardware faults lead over an error"
    );
    let v = |i: usize| report.gpus[i].verdict;
    let mem = |i: usize| report.gpus[i].memory.as_ref().map(|m| m.verdict);
    let comp = |i: usize| report.gpus[i].compute.as_ref().map(|c| c.verdict);
    assert_eq!(mem(1), Some(Verdict::Error));
    assert_eq!(mem(2), Some(Verdict::Fail));
    assert_eq!(comp(3), Some(Verdict::Fail));
    assert_eq!(comp(5), Some(Verdict::Fail));
    for i in [0, 4, 6, 7] {
        assert_eq!(v(i), Verdict::Pass, "GPU{i}: {:?}", report.gpus[i].reasons);
    }
    let reasons = |i: usize| gpuval_crds::reason::messages(&report.gpus[i].reasons);
    assert!(
        reasons(1).contains("GPU1: Xid 79 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"),
        "{}",
        reasons(1)
    );
    assert!(reasons(1).contains("error=memory@1"), "{}", reasons(1));
    assert!(
        reasons(2).contains("mismatched words (first at offset 0x"),
        "{}",
        reasons(2)
    );
    assert!(reasons(3).contains("(H200 profile)"), "{}", reasons(3));
    assert!(reasons(3).contains("below its peers"), "{}", reasons(3));
    assert!(reasons(5).contains("mismatched elements"), "{}", reasons(5));
    let topo = report.topology.as_ref().expect("topology");
    assert_eq!(topo.verdict, Verdict::Fail);
    assert_any_starts_with(&topo.reasons, "GPU2: 17 of 18 NVLink links active");
    assert_eq!(report.failures.len(), 5);
    assert!(
        !report.failures[0].starts_with("GPU1: memory check"),
        "a Fail leads, not the error: {:?}",
        report.failures
    );
    assert!(
        report
            .failures
            .iter()
            .all(|f| f.severity == gpuval_crds::reason::Severity::Fail),
        "five Fail findings leave no room for the error: {:?}",
        report.failures
    );
}

#[test]
fn slow_memory_fails_relative_rule() {
    let report = simulated_report("gpus=4,slow=memory@0:0.7");
    let m = report.gpus[0].memory.as_ref().expect("memory");
    assert_eq!(m.verdict, Verdict::Fail);
    assert_any_contains(&m.reasons, "below its peers");
}

/// A process that is not the agent's on GPU 2 makes GPU 2 alone busy (Error, rerun: not a
/// hardware verdict), naming its pid, name and memory; the agent's own process on every GPU
/// does not count.
#[test]
fn a_foreign_process_makes_the_gpu_it_ran_on_busy() {
    let report = simulated_report("gpus=4,model=H100,proc=2:4242:python3:10240");
    let g2 = &report.gpus[2];
    assert_eq!(g2.verdict, Verdict::Error, "{:?}", g2.reasons);
    assert_eq!(g2.foreign_processes.len(), 1);
    let p = &g2.foreign_processes[0];
    assert_eq!(
        (p.pid, p.name.as_str(), p.used_memory_mib),
        (4242, "python3", Some(10240))
    );
    assert_eq!(p.seen, ["before", "during", "after"]);
    assert_any_starts_with(
        &g2.reasons,
        "GPU2: process 4242 (python3, 10240 MiB) is not the agent's",
    );
    for i in [0, 1, 3] {
        assert_eq!(
            report.gpus[i].verdict,
            Verdict::Pass,
            "GPU{i}: {:?}",
            report.gpus[i].reasons
        );
        assert!(report.gpus[i].foreign_processes.is_empty());
    }
    assert_eq!(report.verdict, Verdict::Error);
    assert_eq!(report.action, gpuval_crds::reason::Action::Rerun);
}

/// A GPU NVML lists that CUDA does not see is named in the report, never silently left out.
#[test]
fn a_gpu_hidden_from_cuda_is_named_not_skipped() {
    let report = simulated_report("gpus=4,model=H100,hidden=3");
    assert_eq!(report.gpus.len(), 3, "GPU3 cannot be tested");
    let facts = report.facts.as_ref().expect("facts");
    assert_eq!(facts.hidden_gpus.len(), 1);
    let h = &facts.hidden_gpus[0];
    assert_eq!(h.index, 3);
    assert!(h.uuid.starts_with("GPU-"), "{h:?}");
    assert_any_contains(&facts.reasons, "GPU3 (");
    assert_any_contains(&facts.reasons, "is listed by NVML but not visible to CUDA");
    assert_ne!(
        report.verdict,
        Verdict::Pass,
        "the node cannot pass with a GPU untested"
    );
}
