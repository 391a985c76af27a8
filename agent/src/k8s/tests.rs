//! The Kubernetes flow's pure parts: its environment, its report's labels and status, its deadline.

use std::collections::HashMap;

use std::path::PathBuf;

use gpuval_crds::{Action, GpuValidation, NodeReport, agent_env, binding, labels};

use super::steps::stale_reason;
use super::*;
use crate::backend::BackendChoice;
use crate::backend::sim::SimSpec;

fn base_env() -> HashMap<&'static str, String> {
    HashMap::from([
        (agent_env::VALIDATION, "quick".to_string()),
        (agent_env::GENERATION, "3".to_string()),
        (agent_env::VALIDATION_UID, "0b9a-uid".to_string()),
        (agent_env::NODE_NAME, "gpu-node-1".to_string()),
        (agent_env::POD_NAMESPACE, "gpuval-system".to_string()),
        (agent_env::POD_NAME, "quick-gpu-node-1-abcde".to_string()),
        (agent_env::POD_UID, "pod-uid-7".to_string()),
    ])
}

fn parse(vars: &HashMap<&'static str, String>) -> Result<AgentEnv, EnvError> {
    AgentEnv::from_lookup(|k| vars.get(k).cloned())
}

fn env() -> AgentEnv {
    parse(&base_env()).expect("base env parses")
}

#[test]
fn complete_env_parses_with_cuda_by_default() {
    let e = env();
    assert_eq!(e.validation, "quick");
    assert_eq!(e.generation, 3);
    assert_eq!(e.node, "gpu-node-1");
    assert_eq!(e.namespace, "gpuval-system");
    assert_eq!(e.backend, BackendChoice::Cuda);
    assert_eq!(e.io_dir, None);
    assert_eq!(e.pod_uid.as_deref(), Some("pod-uid-7"));
    assert_eq!(e.state_dir, None);
    let mut vars = base_env();
    vars.remove(agent_env::POD_UID);
    vars.insert(agent_env::STATE_DIR, "/var/lib/gpuval-agent".to_string());
    let e = parse(&vars).expect("POD_UID is optional");
    assert_eq!(e.pod_uid, None);
    assert_eq!(e.state_dir, Some(PathBuf::from("/var/lib/gpuval-agent")));
}

#[test]
fn io_dir_comes_from_the_environment() {
    let mut vars = base_env();
    vars.insert(agent_env::IO_DIR, "/var/lib/gpuval-io".to_string());
    assert_eq!(
        parse(&vars).unwrap().io_dir,
        Some(PathBuf::from("/var/lib/gpuval-io"))
    );
    vars.insert(agent_env::IO_DIR, "  ".to_string());
    assert_eq!(parse(&vars).unwrap().io_dir, None);
}

#[test]
fn the_dra_claims_gpu_uuids_are_read_as_a_list() {
    let mut vars = base_env();
    assert_eq!(parse(&vars).unwrap().dra_gpu_uuids, None);
    vars.insert(agent_env::DRA_GPU_UUIDS, " GPU-a, ,GPU-b ".to_string());
    assert_eq!(
        parse(&vars).unwrap().dra_gpu_uuids,
        Some(vec!["GPU-a".to_string(), "GPU-b".to_string()])
    );
    vars.insert(agent_env::DRA_GPU_UUIDS, " , ".to_string());
    assert_eq!(parse(&vars).unwrap().dra_gpu_uuids, None);
}

#[test]
fn the_result_jitter_is_optional_and_a_bad_one_is_named() {
    let mut vars = base_env();
    assert_eq!(parse(&vars).unwrap().result_jitter, Duration::ZERO);
    vars.insert(agent_env::RESULT_JITTER_MS, "2500".to_string());
    assert_eq!(
        parse(&vars).unwrap().result_jitter,
        Duration::from_millis(2500)
    );
    vars.insert(agent_env::RESULT_JITTER_MS, "2s".to_string());
    let err = parse(&vars).expect_err("milliseconds only");
    assert_eq!(err.variable(), agent_env::RESULT_JITTER_MS);
}

#[test]
fn result_delays_stay_within_the_bound_spread_out_and_repeat_per_seed() {
    let max = Duration::from_secs(10);
    assert_eq!(result_delay(Duration::ZERO, 42), Duration::ZERO);
    let delays: Vec<Duration> = (0..1000)
        .map(|i| result_delay(max, seed_of(&format!("gpuval-quick-node-{i}"))))
        .collect();
    assert!(delays.iter().all(|d| *d <= max));
    let first_half = delays.iter().filter(|d| **d < max / 2).count();
    assert!(
        (400..=600).contains(&first_half),
        "about half wait less than half the bound: {first_half}"
    );
    let buckets: std::collections::BTreeSet<u128> =
        delays.iter().map(|d| d.as_millis() / 1000).collect();
    assert_eq!(buckets.len(), 10, "every second of the window is used");
    assert_eq!(result_delay(max, 7), result_delay(max, 7));
}

#[test]
fn every_missing_variable_is_named() {
    for name in [
        agent_env::VALIDATION,
        agent_env::GENERATION,
        agent_env::VALIDATION_UID,
        agent_env::NODE_NAME,
        agent_env::POD_NAMESPACE,
        agent_env::POD_NAME,
    ] {
        for value in [None, Some("  ")] {
            let mut vars = base_env();
            match value {
                None => vars.remove(name),
                Some(v) => vars.insert(name, v.to_string()),
            };
            let err = parse(&vars).expect_err(name);
            assert_eq!(err, EnvError::Missing(name));
            let text = err.to_string();
            assert!(text.contains(name), "{text}");
            assert!(!text.contains('\n'), "one line: {text}");
        }
    }
}

#[test]
fn invalid_values_are_named_with_the_reason() {
    let cases = [
        (agent_env::GENERATION, "three", "not a whole number"),
        (agent_env::GENERATION, "0", "at least 1"),
        (agent_env::NODE_NAME, "GPU_Node", "DNS-1123"),
        (agent_env::VALIDATION, "a..b", "DNS-1123"),
        (agent_env::POD_NAMESPACE, "gpuval.system", "namespace"),
        (agent_env::BACKEND, "rocm", "cuda or simulated"),
        (agent_env::SIMULATE, "gpus=lots", ""),
    ];
    for (name, value, why) in cases {
        let mut vars = base_env();
        vars.insert(name, value.to_string());
        let err = parse(&vars).expect_err(name);
        assert_eq!(err.variable(), name);
        let text = err.to_string();
        assert!(
            text.contains(name) && text.contains(value) && text.contains(why),
            "{text}"
        );
    }
}

#[test]
fn simulate_implies_the_simulated_backend() {
    let mut vars = base_env();
    vars.insert(agent_env::SIMULATE, "gpus=2,fail=memory@1".to_string());
    let e = parse(&vars).expect("parses");
    let BackendChoice::Simulated(spec) = e.backend else {
        panic!("expected simulated, got {:?}", e.backend);
    };
    assert_eq!(spec.gpus, 2);

    let mut vars = base_env();
    vars.insert(agent_env::BACKEND, "Simulated".to_string());
    assert_eq!(
        parse(&vars).expect("parses").backend,
        BackendChoice::Simulated(SimSpec::default())
    );
    vars.insert(agent_env::BACKEND, "cuda".to_string());
    assert_eq!(parse(&vars).expect("parses").backend, BackendChoice::Cuda);
}

fn report(verdict: Verdict, failures: &[&str]) -> NodeReport {
    NodeReport {
        simulated: true,
        backend: "simulated".into(),
        agent_version: "0.1.0".into(),
        node: Some("gpu-node-1".into()),
        started_at: "2026-01-01T00:00:00Z".into(),
        finished_at: "2026-01-01T00:01:00Z".into(),
        verdict,
        failures: failures
            .iter()
            .map(|s| gpuval_crds::Reason::new(gpuval_crds::Code::Unclassified, *s))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn labels_and_summary() {
    let mut failed = report(Verdict::Fail, &["GPU3: memory"]);
    failed.action = Action::ResetGpu;
    failed.simulated = false;
    let l = report_meta(&failed).labels();
    assert_eq!(l["gpuval.io/verdict"], "Fail");
    assert_eq!(l["gpuval.io/action"], "ResetGpu");
    assert_eq!(l.len(), 2, "{l:?}");
    let simulated = report_meta(&report(Verdict::Pass, &[])).labels();
    assert_eq!(simulated["gpuval.io/simulated"], "true");

    assert_eq!(
        summary(&report(Verdict::Fail, &["GPU3: memory", "GPU5: slow"])),
        "GPU3: memory; GPU5: slow"
    );
    let passed = report(Verdict::Pass, &[]);
    assert_eq!(summary(&passed), crate::render::headline(&passed));
    assert!(summary(&passed).ends_with("no GPUs"));
    for v in [Verdict::Pass, Verdict::Warn, Verdict::Error] {
        assert_eq!(
            report_meta(&report(v, &[])).labels()["gpuval.io/verdict"],
            v.as_str()
        );
    }
}

#[test]
fn long_node_names_get_a_short_field_manager() {
    let mut vars = base_env();
    let node = format!("{}gpu", "rack-17.row-4.hall-b.datacenter-west.".repeat(3));
    assert!(node.len() > 63);
    vars.insert(agent_env::NODE_NAME, node.clone());
    let e = parse(&vars).expect("a long node name is valid");
    assert_eq!(e.node, node);
    let fm = field_manager(&node);
    assert!(fm.len() <= 128, "field managers are at most 128 characters");
    assert_eq!(fm, format!("gpuval-agent/{}", labels::node_value(&node)));
    assert_eq!(field_manager("gpu-node-1"), "gpuval-agent/gpu-node-1");
}

/// The agent's write carries its report and nothing of the result's binding (validation,
/// node, generation, pod, owner, spec): the operator wrote those and the admission policy keeps
/// an agent from changing them.
#[test]
fn the_report_metadata_names_only_what_the_agent_may_write() {
    let r = report(Verdict::Fail, &["GPU3: memory: 12 mismatched words"]);
    let v = report_metadata(&r);
    let expected = serde_json::json!({
        "metadata": {
            "labels": {
                "gpuval.io/verdict": "Fail",
                "gpuval.io/action": "None",
                "gpuval.io/simulated": "true",
            },
            "annotations": {
                "gpuval.io/summary": "GPU3: memory: 12 mismatched words",
                "gpuval.io/codes": "Unclassified",
            },
        },
    });
    assert_eq!(v, expected);
    let keys = |field: &str| -> Vec<String> {
        v["metadata"][field]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    for k in keys("labels") {
        assert!(binding::AGENT_LABELS.contains(&k.as_str()), "{k}");
    }
    for k in keys("annotations") {
        assert!(binding::REPORT_ANNOTATIONS.contains(&k.as_str()), "{k}");
    }

    let s = status_patch(&r);
    assert_eq!(s["apiVersion"], "gpuval.io/v1alpha1");
    assert_eq!(s["kind"], "GpuNodeResult");
    assert_eq!(s["status"]["verdict"], "Fail");
    assert_eq!(s["status"]["simulated"], true);
    assert_eq!(s.as_object().map(|o| o.len()), Some(3));
}

#[test]
fn a_result_not_created_yet_says_what_to_do() {
    let e = StoreError::NotCreated("gpuval-system/quick-gpu-node-1-5".into()).to_string();
    assert!(
        e.contains("quick-gpu-node-1-5") && e.contains("the operator creates it"),
        "{e}"
    );
    assert!(e.contains("create gpunoderesults"), "{e}");
}

fn validation(uid: &str, generation: i64) -> GpuValidation {
    let mut v = GpuValidation::new(
        "quick",
        serde_json::from_value(serde_json::json!({"checks": {"memory": {}}})).expect("spec"),
    );
    v.metadata.uid = Some(uid.into());
    v.metadata.generation = Some(generation);
    v
}

#[test]
fn stale_pods_are_recognised() {
    let e = env();
    assert_eq!(stale_reason(&e, &validation("0b9a-uid", 3)), None);
    let newer = stale_reason(&e, &validation("0b9a-uid", 4)).expect("stale");
    assert!(newer.contains("generation 4"), "{newer}");
    let recreated = stale_reason(&e, &validation("other-uid", 3)).expect("stale");
    assert!(recreated.contains("recreated"), "{recreated}");
}

#[test]
fn exit_codes() {
    assert_eq!(Outcome::Stored(Verdict::Fail).exit_code(), 0);
    assert_eq!(Outcome::Stale(String::new()).exit_code(), 0);
    assert_eq!(Outcome::NotStored(String::new()).exit_code(), 1);
    assert_eq!(Outcome::NoClient(String::new()).exit_code(), 2);
    assert_eq!(Outcome::Terminated.exit_code(), 143);
}

#[test]
fn transient_errors() {
    let status = |code| {
        kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        )
    };
    assert!(is_transient(&status(503)));
    assert!(is_transient(&status(429)));
    assert!(!is_transient(&status(404)));
    assert!(!is_transient(&status(422)));
    assert!(!is_transient(&status(403)));
}

#[test]
fn baselines_parse_from_the_environment_and_bad_json_names_the_variable() {
    let mut vars = base_env();
    assert_eq!(env().baselines, None);
    vars.insert(
        agent_env::BASELINES,
        r#"{"tolerance":0.1,"gpus":[{"uuid":"GPU-a","runs":2,"figures":{"memory.gbps":3000.0}}]}"#
            .to_string(),
    );
    let b = parse(&vars).expect("parses").baselines.expect("baselines");
    assert_eq!(b.gpus[0].uuid, "GPU-a");
    assert_eq!(b.gpus[0].figures.get("memory.gbps"), Some(&3000.0));
    vars.insert(agent_env::BASELINES, "{not json".to_string());
    let e = parse(&vars).expect_err("bad JSON");
    assert_eq!(e.variable(), agent_env::BASELINES);
}
