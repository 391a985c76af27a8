//! A GPU shared with other work, through the whole runner on the simulated backend, the way a
//! pod sees it (`pidns=1`: NVML lists only the agent's processes) and the way a host process
//! does: the GPU is busy, never broken, and no hardware action is recommended. The nccl and
//! training checks run in child processes of the agent's binary, as in the agent.

use std::sync::atomic::AtomicBool;

use gpuval_crds::reason::Action;
use gpuval_crds::{
    Checks, ComputeCheck, Dtype, MemoryCheck, NodeReport, P2pCheck, Thresholds, Verdict,
};

use gpuval_agent::backend::Backend;
use gpuval_agent::backend::sim::SimBackend;
use gpuval_agent::judge::Code;
use gpuval_agent::runner::{Plan, run};

fn checks() -> Checks {
    Checks {
        memory: Some(MemoryCheck::default()),
        compute: Some(ComputeCheck {
            dtypes: vec![Dtype::Bf16],
            ..Default::default()
        }),
        p2p: Some(P2pCheck::default()),
        nccl: Some(Default::default()),
        training: Some(Default::default()),
        ..Default::default()
    }
}

fn report(spec: &str, allow_shared: bool) -> NodeReport {
    // The nccl and training checks run in child processes of the agent's binary.
    gpuval_agent::worker::use_agent_exe(env!("CARGO_BIN_EXE_gpuval-agent").into())
        .expect("one agent binary");
    let backend = Backend::Simulated(SimBackend::new(spec.parse().expect("valid spec")));
    let mut plan = Plan::new(checks(), Thresholds::default());
    plan.allow_shared_gpus = allow_shared;
    run(&backend, &plan, &AtomicBool::new(false), &|_| {})
}

/// Every reason in the report: the node's, each GPU's and each check's.
fn all_reasons(r: &NodeReport) -> Vec<gpuval_crds::Reason> {
    let mut out: Vec<_> = r.failures.iter().chain(&r.warnings).cloned().collect();
    for g in &r.gpus {
        out.extend(g.reasons.iter().cloned());
        for (_, reasons) in gpuval_agent::checks::gpu_results(g) {
            out.extend(reasons.iter().cloned());
        }
    }
    for (_, reasons) in gpuval_agent::checks::node_results(r) {
        out.extend(reasons.iter().cloned());
    }
    out
}

fn assert_no_hardware_action(r: &NodeReport) {
    let hardware: Vec<_> = all_reasons(r)
        .into_iter()
        .filter(|x| x.action > Action::Rerun)
        .collect();
    assert!(hardware.is_empty(), "hardware actions: {hardware:#?}");
    assert!(r.action <= Action::Rerun, "{:?}", r.action);
}

fn codes(r: &NodeReport) -> Vec<Code> {
    all_reasons(r).into_iter().map(|x| x.code).collect()
}

/// The fault the pod saw on real H200s: a neighbour in another PID namespace burning on GPU 1
/// halves its figures; NVML lists no other process, yet its memory and load show device-wide.
#[test]
fn a_neighbour_the_pid_namespace_hides_makes_the_gpu_busy_never_broken() {
    let r = report(
        "gpus=4,model=H200,pidns=1,proc=1:4242:python3:20480:0.5",
        false,
    );
    let gpu1 = &r.gpus[1];
    assert_eq!(gpu1.verdict, Verdict::Error, "{:#?}", gpu1.reasons);
    assert!(gpu1.foreign_processes.is_empty(), "NVML named no one");
    let busy = gpu1
        .reasons
        .iter()
        .find(|x| x.code == Code::GpuBusy)
        .expect("a GpuBusy finding");
    for part in [
        "GPU1 was busy with other work",
        "20480 MiB in use that no listed process holds (before memory",
        "50% utilisation at ",
        "while the agent ran nothing on it (before memory",
        "after the checks",
    ] {
        assert!(busy.message.contains(part), "{part:?} in {}", busy.message);
    }
    assert_eq!(busy.action, Action::Rerun);
    let found = codes(&r);
    for hardware in [
        Code::ComputeSlow,
        Code::MemoryBandwidthLow,
        Code::NcclBandwidthLow,
        Code::TrainingSlow,
        Code::P2pSlow,
    ] {
        assert!(!found.contains(&hardware), "{hardware} in {found:?}");
    }
    let excused = all_reasons(&r)
        .into_iter()
        .find(|x| x.code == Code::FigureWhileBusy && x.message.contains("(ComputeSlow)"))
        .expect("the slow burn kept, excused");
    assert!(
        excused
            .message
            .starts_with("GPU1 was busy with other work, so this figure is not judged as hardware"),
        "{}",
        excused.message
    );
    assert_no_hardware_action(&r);
    assert_eq!(r.verdict, Verdict::Error);
    assert_eq!(r.action, Action::Rerun);
    for g in [0, 2, 3] {
        assert!(
            !r.gpus[g].reasons.iter().any(|x| x.code.is_busy()),
            "GPU{g}: {:?}",
            r.gpus[g].reasons
        );
    }
}

#[test]
fn a_neighbour_nvml_names_is_busy_with_no_hardware_action_either() {
    let r = report("gpus=2,model=H200,proc=0:4242:python3:10240:0.5", false);
    let gpu0 = &r.gpus[0];
    assert_eq!(gpu0.foreign_processes[0].pid, 4242);
    assert!(
        gpu0.reasons.iter().any(|x| x.code == Code::ForeignProcess),
        "{:?}",
        gpu0.reasons
    );
    assert_eq!(gpu0.verdict, Verdict::Error);
    assert!(!codes(&r).contains(&Code::ComputeSlow));
    assert_no_hardware_action(&r);
}

#[test]
fn where_sharing_is_allowed_a_short_figure_says_it_may_reflect_the_sharing() {
    let r = report(
        "gpus=2,model=H200,pidns=1,proc=1:4242:python3:10240:0.5",
        true,
    );
    // The short figure is judged neither a fault nor a pass.
    assert_eq!(r.verdict, Verdict::Error, "{:#?}", r.failures);
    assert_eq!(r.action, Action::Rerun);
    let reasons = all_reasons(&r);
    assert!(reasons.iter().any(|x| x.code == Code::GpuBusyAllowed));
    let excused = reasons
        .iter()
        .find(|x| x.code == Code::FigureWhileBusy)
        .expect("an excused figure");
    assert!(
        excused
            .message
            .contains("this figure may reflect the sharing"),
        "{}",
        excused.message
    );
    assert_no_hardware_action(&r);
}

#[test]
fn memory_held_by_a_hidden_process_is_busy_though_every_figure_passes() {
    let r = report("gpus=2,model=H200,pidns=1,proc=0:4242:python3:8192", false);
    let gpu0 = &r.gpus[0];
    assert!(
        gpu0.reasons
            .iter()
            .any(|x| x.code == Code::GpuBusy && x.message.contains("8192 MiB")),
        "{:?}",
        gpu0.reasons
    );
    assert!(
        !gpu0
            .reasons
            .iter()
            .any(|x| x.message.contains("utilisation")),
        "an idle holder shows no load: {:?}",
        gpu0.reasons
    );
    assert!(!codes(&r).contains(&Code::FigureWhileBusy));
    assert_eq!(r.gpus[1].verdict, Verdict::Pass);
}

#[test]
fn a_healthy_node_run_the_pods_way_does_not_see_itself_as_busy() {
    let r = report("gpus=4,model=H200,pidns=1", false);
    assert_eq!(r.verdict, Verdict::Pass, "{:#?}", r.failures);
    assert!(!codes(&r).iter().any(|c| c.is_busy()));
}

/// The agent's own last check's tail (the driver scrubbing the memory it freed shows as
/// utilisation for a sample or two after the check ends, as on an H200: bench/nvml-tail) is not
/// other work: the GPU is not busy, the node passes.
#[test]
fn the_tail_of_the_agent_s_own_work_is_not_other_work() {
    for pod in ["", ",pidns=1"] {
        let r = report(&format!("gpus=2,scrub=60{pod}"), false);
        let busy: Vec<_> = all_reasons(&r)
            .into_iter()
            .filter(|x| x.code.is_busy())
            .collect();
        assert!(busy.is_empty(), "{pod}: {busy:#?}");
        assert_eq!(r.verdict, Verdict::Pass, "{pod}: {:?}", r.failures);
    }
    // Other work behind the same tail is still seen.
    let r = report(
        "gpus=2,scrub=60,pidns=1,proc=1:4242:python3:1024:0.5",
        false,
    );
    assert!(
        r.gpus[1].reasons.iter().any(|x| x.code == Code::GpuBusy),
        "{:#?}",
        r.gpus[1].reasons
    );
}

/// A busy GPU excuses only its own figures and the node-level figures it took part in: beside
/// a busy GPU 0, GPU 1's slow peer-to-peer pairs (none with GPU 0) still fail it as hardware,
/// while the pairs GPU 0 took part in are excused.
#[test]
fn a_busy_gpu_beside_a_slow_one_does_not_hide_the_slow_ones_fault() {
    let r = report(
        "gpus=4,model=H200,pidns=1,proc=0:4242:python3:20480:0.5,slow=p2p@1:0.3",
        false,
    );
    let p2p = r.p2p.as_ref().expect("p2p ran");
    let slow: Vec<&gpuval_crds::Reason> = p2p
        .reasons
        .iter()
        .filter(|x| x.code == Code::P2pSlow)
        .collect();
    assert!(
        slow.iter().any(|x| x.message.starts_with("GPU1->GPU2")),
        "GPU1's pair with a free GPU is judged: {:#?}",
        p2p.reasons
    );
    assert!(
        slow.iter().all(|x| !x.message.contains("GPU0")),
        "no pair with the busy GPU is judged: {slow:#?}"
    );
    assert_eq!(r.verdict, Verdict::Fail, "{:#?}", r.failures);
    let codes = r.codes();
    assert_eq!(
        gpuval_crds::Evidence::of_codes(&codes),
        gpuval_crds::Evidence::Hardware,
        "{codes}"
    );
    assert!(
        r.failures.iter().any(|x| x.code == Code::P2pSlow),
        "{:#?}",
        r.failures
    );
}

/// Where sharing is allowed, a figure excused because its GPU was busy is not judged either
/// way: the node does not pass on it.
#[test]
fn an_excused_figure_is_never_a_pass() {
    let r = report(
        "gpus=2,model=H200,pidns=1,proc=1:4242:python3:10240:0.5",
        true,
    );
    assert!(!r.verdict.passes(), "{:?}: {:#?}", r.verdict, r.warnings);
    assert_eq!(
        gpuval_crds::Evidence::of_codes(&r.codes()),
        gpuval_crds::Evidence::Busy
    );
    assert_no_hardware_action(&r);
}

/// The fault the pod saw on a real H100: a neighbour's burn beside the agent's heated the GPU
/// until thermal slowdown held its clocks down through the burn. The slowdown is a figure taken
/// while the GPU was shared: busy, never a hardware fault; the same slowdown on a GPU nobody
/// shares stays one.
#[test]
fn clocks_slowed_on_a_shared_gpu_are_busy_and_on_a_free_one_hardware() {
    let shared = report(
        "gpus=2,model=H200,pidns=1,proc=1:4242:python3:10240:0.5,throttle=1:SwThermalSlowdown",
        false,
    );
    assert_no_hardware_action(&shared);
    assert_eq!(
        gpuval_crds::Evidence::of_codes(&shared.codes()),
        gpuval_crds::Evidence::Busy,
        "{}",
        shared.codes()
    );
    assert!(
        all_reasons(&shared)
            .iter()
            .any(|x| x.code == Code::FigureWhileBusy && x.message.contains("BurnClocksSlowed")),
        "{:#?}",
        all_reasons(&shared)
    );
    assert!(!codes(&shared).contains(&Code::BurnClocksSlowed));

    let free = report(
        "gpus=2,model=H200,pidns=1,proc=1:4242:python3:10240:0.5,throttle=0:SwThermalSlowdown",
        false,
    );
    assert!(
        free.failures
            .iter()
            .any(|x| x.code == Code::BurnClocksSlowed && x.message.starts_with("GPU0")),
        "{:#?}",
        free.failures
    );
    assert_eq!(
        gpuval_crds::Evidence::of_codes(&free.codes()),
        gpuval_crds::Evidence::Hardware
    );
}
