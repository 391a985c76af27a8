use super::*;
use crate::fabric::{FabricPhase, FabricStatus};
use crate::{GpuValidation, GpuValidationStatus, NodeStatus, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn at(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

/// A finished run of generation 1 with `lines` listed and `fabric` as its fabric line.
fn run(lines: Vec<NodeStatus>, fabric: Option<FabricStatus>) -> GpuValidation {
    let mut gv: GpuValidation = serde_json::from_value(serde_json::json!({
        "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
        "metadata": {"name": "v", "generation": 1}, "spec": {"checks": {"memory": {}}},
    }))
    .expect("validation");
    gv.status = Some(GpuValidationStatus {
        observed_generation: Some(1),
        phase: Some(Phase::Failed),
        completion_time: Some(Time(at("2026-11-23T03:00:00Z"))),
        nodes: lines,
        fabric,
        ..Default::default()
    });
    gv
}

fn fabric(phase: FabricPhase, failed: &[&str]) -> FabricStatus {
    FabricStatus {
        phase,
        nodes: 4,
        rounds: 2,
        bus_bandwidth_gbps: None,
        tcp_min_gbps: None,
        failed_nodes: failed.iter().map(|n| n.to_string()).collect(),
        suspects: Vec::new(),
        ports: None,
        message: Some("in round 2 the pair's bandwidth was below 350 GB/s".into()),
    }
}

fn passed_result(node: &str) -> ResultSeen {
    ResultSeen {
        name: format!("v-{node}"),
        generation: 1,
        verdict: Some(Verdict::Pass),
        reported: true,
        created: Some(at("2026-11-23T02:00:00Z")),
        ..Default::default()
    }
}

fn line(node: &str, verdict: NodeVerdict, evidence: Option<Evidence>) -> NodeStatus {
    NodeStatus {
        name: node.into(),
        verdict,
        message: Some(format!("{verdict} on {node}")),
        evidence,
        ..Default::default()
    }
}

const TRUST: Trust = Trust {
    trust_simulated: false,
};

#[test]
fn codes_map_to_their_category_the_deciding_codes_first() {
    use Evidence::*;
    for (codes, want) in [
        ("MemoryMismatch", Hardware),
        ("XidFatal,ClockThrottled", Hardware),
        ("GpuBusy", Busy),
        ("ForeignProcess,ClockThrottled", Busy),
        ("MemoryBusy,MemoryMismatch", Hardware),
        ("ForeignProcessAllowed", Busy),
        ("RunStopped", Infrastructure),
        ("RunStopped,GpuBusy", Busy),
        ("IoError", Configuration),
        ("IoError,LibraryMissing", Configuration),
        ("IoError,RunStopped", Infrastructure),
        ("", Hardware),
        ("NoSuchCode", Hardware),
        ("IoError,NoSuchCode", Hardware),
    ] {
        assert_eq!(Evidence::of_codes(codes), want, "{codes}");
    }
    for code in [
        Code::ForeignProcess,
        Code::ForeignProcessAllowed,
        Code::GpuBusy,
        Code::GpuBusyAllowed,
        Code::MemoryBusy,
    ] {
        assert_eq!(code.evidence(), Busy, "{code}");
    }
    for code in crate::reason::CONFIGURATION_CODES {
        assert_eq!(code.evidence(), Configuration, "{code}");
    }
}

#[test]
fn only_hardware_evidence_acts_on_a_node() {
    let acting: Vec<Evidence> = Evidence::ALL
        .into_iter()
        .filter(|e| e.acts_on_node())
        .collect();
    assert_eq!(acting, [Evidence::Hardware]);
}

#[test]
fn a_node_the_fabric_names_is_failed_on_hardware_though_its_result_passed() {
    let r = passed_result("gpu-2");
    // As the operator lists it: Failed, with the result it rested on.
    let mut listed = line("gpu-2", NodeVerdict::Failed, Some(Evidence::Hardware));
    listed.result = Some(r.name.clone());
    let gv = run(vec![listed], Some(fabric(FabricPhase::Failed, &["gpu-2"])));
    let l = final_line(&gv, "gpu-2", Some(&r), TRUST).expect("a final line");
    assert!(!l.passed() && l.failed_on_hardware(), "{l:?}");
    assert_eq!(l.certified(Verdict::Pass), Verdict::Fail, "never certified");
    // Not listed (the list overflowed): the fabric's own list still names it.
    let gv = run(vec![], Some(fabric(FabricPhase::Failed, &["gpu-2"])));
    let l = final_line(&gv, "gpu-2", Some(&r), TRUST).expect("a final line");
    assert_eq!(
        (l.verdict, l.evidence),
        (NodeVerdict::Failed, Evidence::Hardware)
    );
    assert!(l.message.starts_with("fabric: "), "{}", l.message);
    // Its peer, not named, passed.
    let peer = final_line(&gv, "gpu-1", Some(&passed_result("gpu-1")), TRUST).expect("peer");
    assert!(peer.passed());
    assert_eq!(peer.certified(Verdict::Warn), Verdict::Warn);
}

#[test]
fn a_pass_waits_for_the_fabric_test() {
    let r = passed_result("gpu-1");
    let gv = run(vec![], Some(fabric(FabricPhase::Running, &[])));
    assert_eq!(final_line(&gv, "gpu-1", Some(&r), TRUST), None);
    // The spec asks for the fabric and the status has no fabric line yet.
    let mut gv = run(vec![], None);
    gv.spec.fabric = Some(serde_json::from_value(serde_json::json!({})).expect("fabric spec"));
    assert_eq!(final_line(&gv, "gpu-1", Some(&r), TRUST), None);
    let gv = run(vec![], Some(fabric(FabricPhase::Passed, &[])));
    assert!(final_line(&gv, "gpu-1", Some(&r), TRUST).is_some_and(|l| l.passed()));
}

#[test]
fn a_result_without_a_report_never_makes_its_node_pass() {
    let mut r = passed_result("gpu-1");
    r.reported = false;
    let gv = run(vec![], None);
    let l = final_line(&gv, "gpu-1", Some(&r), TRUST).expect("a line");
    assert!(!l.passed() && !l.failed_on_hardware(), "{l:?}");
    assert_eq!(l.evidence, Evidence::NoEvidence);
    assert!(l.message.contains("no report"), "{}", l.message);
    // Nor while the run is under way and its status does not list the node (a large run
    // lists a few): the operator checks a stored report some time after it lands, and the
    // node's line waits for that check, not counted once unchecked and again checked.
    let mut under_way = run(vec![], None);
    if let Some(s) = under_way.status.as_mut() {
        s.phase = Some(Phase::Running);
        s.completion_time = None;
        s.nodes_not_listed = 1;
    }
    assert_eq!(final_line(&under_way, "gpu-1", Some(&r), TRUST), None);
    assert!(
        final_line(&under_way, "gpu-1", Some(&passed_result("gpu-1")), TRUST)
            .is_some_and(|l| l.passed()),
        "a checked report is the node's line at once"
    );
    // While the run still waits for the node, there is no final line at all.
    let gv = run(vec![line("gpu-1", NodeVerdict::Pending, None)], None);
    assert_eq!(
        final_line(&gv, "gpu-1", Some(&passed_result("gpu-1")), TRUST),
        None
    );
}

#[test]
fn infrastructure_lines_do_not_act_and_say_what_to_fix() {
    let mut pulled = line("gpu-1", NodeVerdict::Error, Some(Evidence::Infrastructure));
    pulled.message = Some("the agent image cannot be pulled: fix the registry".into());
    // A line written before lines carried their evidence: no result means the operator's own.
    let old = line("gpu-2", NodeVerdict::DeadlineExceeded, None);
    let gv = run(vec![pulled, old], None);
    for node in ["gpu-1", "gpu-2"] {
        let l = final_line(&gv, node, None, TRUST).expect("a line");
        assert_eq!(l.evidence, Evidence::Infrastructure, "{node}");
        assert!(!l.passed() && !l.failed_on_hardware(), "{node}");
        assert_eq!(l.action, Action::Rerun, "{node}");
        assert_eq!(l.at, Some(at("2026-11-23T03:00:00Z")), "{node}");
    }
    let l = final_line(&gv, "gpu-1", None, TRUST).expect("a line");
    assert!(l.message.contains("fix the registry"));
}

#[test]
fn simulated_results_are_no_evidence_unless_trusted() {
    let mut r = passed_result("gpu-1");
    r.simulated = true;
    let gv = run(vec![], None);
    let l = final_line(&gv, "gpu-1", Some(&r), TRUST).expect("a line");
    assert_eq!(l.evidence, Evidence::NoEvidence);
    let trusted = Trust {
        trust_simulated: true,
    };
    assert!(final_line(&gv, "gpu-1", Some(&r), trusted).is_some_and(|l| l.passed()));
}

#[test]
fn results_the_run_does_not_count_are_no_line() {
    let gv = run(vec![], None);
    let mut other = passed_result("gpu-1");
    other.generation = 2;
    assert_eq!(final_line(&gv, "gpu-1", Some(&other), TRUST), None);
    let mut failed = passed_result("gpu-1");
    failed.verdict = Some(Verdict::Fail);
    failed.codes = "MemoryMismatch".into();
    assert_eq!(
        final_line(&gv, "gpu-1", Some(&failed), TRUST),
        None,
        "every failed node is listed, and this one is not: the run does not count it"
    );
    let mut overflowing = run(vec![], None);
    if let Some(s) = overflowing.status.as_mut() {
        s.nodes_not_listed = 3;
    }
    let l = final_line(&overflowing, "gpu-1", Some(&failed), TRUST).expect("a line");
    assert!(l.failed_on_hardware(), "{l:?}");
    assert_eq!(
        final_line(&gv, "gpu-1", None, TRUST),
        None,
        "no result, not listed"
    );
}

#[test]
fn a_busy_or_configuration_result_line_does_not_act() {
    let mut busy = line("gpu-1", NodeVerdict::Error, None);
    busy.result = Some("v-gpu-1".into());
    busy.codes = Some("GpuBusy".into());
    let mut io = line("gpu-2", NodeVerdict::Error, None);
    io.result = Some("v-gpu-2".into());
    io.codes = Some("IoError".into());
    let mut memory = line("gpu-3", NodeVerdict::Failed, None);
    memory.result = Some("v-gpu-3".into());
    memory.codes = Some("MemoryMismatch".into());
    let gv = run(vec![busy, io, memory], None);
    let of =
        |n: &str| final_line(&gv, n, None, TRUST).map(|l| (l.evidence, l.failed_on_hardware()));
    assert_eq!(of("gpu-1"), Some((Evidence::Busy, false)));
    assert_eq!(of("gpu-2"), Some((Evidence::Configuration, false)));
    assert_eq!(of("gpu-3"), Some((Evidence::Hardware, true)));
}

#[test]
fn every_view_shows_the_final_line_not_the_results_own_verdict() {
    let gv = run(
        vec![
            line("busy", NodeVerdict::Error, Some(Evidence::Busy)),
            line("broken", NodeVerdict::Failed, Some(Evidence::Hardware)),
        ],
        Some(fabric(FabricPhase::Failed, &["named"])),
    );
    let shown = |node: &str, reported: Verdict| {
        let mut r = passed_result(node);
        r.verdict = Some(reported);
        final_line(&gv, node, Some(&r), TRUST).map(|l| l.shown(Some(reported)))
    };
    // The fabric named a node whose own checks passed: Fail, not its result's Pass.
    assert_eq!(shown("named", Verdict::Pass), Some(Verdict::Fail));
    assert_eq!(shown("broken", Verdict::Fail), Some(Verdict::Fail));
    assert_eq!(shown("busy", Verdict::Error), Some(Verdict::Error));
    assert_eq!(shown("fine", Verdict::Warn), Some(Verdict::Warn));
}

#[test]
fn a_result_object_reads_as_its_labels_say_else_as_its_report() {
    let mut r = crate::GpuNodeResult::new(
        "v-gpu-1",
        crate::GpuNodeResultSpec {
            validation: "v".into(),
            generation: 3,
            node_name: "gpu-1".into(),
        },
    );
    let seen = ResultSeen::of(&r);
    assert_eq!(
        (seen.verdict, seen.reported, seen.generation),
        (None, false, 3)
    );
    r.status = Some(crate::NodeReport {
        verdict: Verdict::Fail,
        ..Default::default()
    });
    assert_eq!(ResultSeen::of(&r).verdict, Some(Verdict::Fail));
    r.metadata.labels = Some([(crate::labels::VERDICT.to_string(), "Warn".to_string())].into());
    let seen = ResultSeen::of(&r);
    assert_eq!((seen.verdict, seen.reported), (Some(Verdict::Warn), true));
}
