//! Categories right (issue 52, point 6), on a real control plane (etcd, kube-apiserver,
//! controller-manager, scheduler, kwok nodes) with the operator in-process and agents run as
//! processes by the FakeKubelet: an agent pod that stays Pending past the administrator's
//! limit ends its node's line as infrastructure, naming the scheduler's reason and what to fix,
//! long before the run's deadline; a busy GPU beside a slow one, and five busy GPUs beside a
//! hardware Error, leave the node's line a hardware failure (not Busy); a disk that fails the io
//! check's read with EIO or reads back short fails its node on hardware evidence, while one
//! that fills up marks nothing.
//!
//! Tests wait on conditions (watches, the wait helpers), never on sleeps.

use std::time::Duration;

use gpuval_crds::{Evidence, NodeVerdict, Phase};
use gpuval_tests::nodes;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{self, Cluster};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

const NS: &str = "gpuval-system";
/// Simulated GPUs, fast.
const SIM: &str = "gpus=2,model=H200,timescale=0.001";
/// The pending limit the operator is given: short, so that the test does not wait long.
const PENDING_LIMIT: Duration = Duration::from_secs(3);
/// How long the test waits for the line: the limit plus a periodic reconcile (30 s), far
/// below the run's deadline (one hour).
const WITHIN: Duration = Duration::from_secs(120);

/// Waits for validation `name`'s verdict and gives it with `node`'s line in its status.
async fn ended_line(
    c: &Cluster,
    name: &str,
    why: &str,
    node: &str,
) -> (gpuval_crds::GpuValidation, gpuval_crds::NodeStatus) {
    let gv = scenario::wait_validation(&c.client, name, WITHIN, why, scenario::terminal)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = gv.status.clone().expect("status");
    let line = status
        .nodes
        .iter()
        .find(|l| l.name == node)
        .cloned()
        .unwrap_or_else(|| panic!("no line of {node}: {status:#?}"));
    (gv, line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_pending_past_the_limit_ends_its_line_as_infrastructure_before_the_deadline() {
    let c = Cluster::start(NS, &["gpu-a".to_string(), "gpu-b".to_string()], 2).await;
    // gpu-b carries a taint the agent pods do not tolerate: its pod can never be scheduled.
    let api = Api::<Node>::all(c.client.clone());
    let mut node = api.get("gpu-b").await.expect("gpu-b");
    if let Some(spec) = node.spec.as_mut() {
        spec.taints.get_or_insert_with(Vec::new).push(Taint {
            key: "dedicated".into(),
            value: Some("infer".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    }
    api.replace("gpu-b", &PostParams::default(), &node)
        .await
        .expect("taint gpu-b");
    let mut cfg = test_config(NS, SIM);
    cfg.agent_pending_limit = Some(PENDING_LIMIT);
    let _op = OperatorHandle::start(c.client.clone(), cfg);

    c.apply(
        "stuck",
        json!({"checks": {"memory": {"fraction": 0.1}}, "deadline": "1h"}),
    )
    .await;
    let (gv, line) = ended_line(&c, "stuck", "ended before its deadline", "gpu-b").await;
    let status = gv.status.clone().expect("status");
    assert_eq!(status.phase, Some(Phase::Failed), "{status:#?}");
    assert_eq!(line.verdict, NodeVerdict::Error, "{line:#?}");
    assert_eq!(line.evidence, Some(Evidence::Infrastructure), "{line:#?}");
    let message = line.message.as_deref().unwrap_or_default();
    for part in [
        "Pending past the limit (3s, --agent-pending-limit)",
        "untolerated taint",
        "fix what the scheduler names and rerun",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    // The node that could run passed; the stuck one is no hardware verdict either way.
    assert!(
        status.nodes.iter().all(|l| l.name != "gpu-a"),
        "gpu-a passed: {status:#?}"
    );
    let fin = gpuval_crds::final_line(&gv, "gpu-b", None, gpuval_crds::Trust::default())
        .expect("gpu-b's final line");
    assert!(!fin.failed_on_hardware() && !fin.passed(), "{fin:#?}");
}

/// A busy GPU 0 beside a GPU 1 slow on its peer-to-peer links, through the operator: the node's
/// line is a hardware failure naming GPU 1's pairs (the busy GPU excuses only the figures it
/// took part in), not a Busy line that would hide the fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_gpu_beside_a_slow_one_fails_the_node_on_hardware() {
    let c = Cluster::start(NS, &["gpu-a".to_string()], 4).await;
    let sim =
        "gpus=4,model=H200,pidns=1,proc=0:4242:python3:20480:0.5,slow=p2p@1:0.3,timescale=0.001";
    let _op = OperatorHandle::start(c.client.clone(), test_config(NS, sim));
    c.apply("busy-and-slow", json!({"checks": {"p2p": {}}}))
        .await;
    let (gv, line) = ended_line(&c, "busy-and-slow", "finished", "gpu-a").await;
    assert_eq!(gv.status.and_then(|s| s.phase), Some(Phase::Failed));
    assert_eq!(line.verdict, NodeVerdict::Failed, "{line:#?}");
    assert_eq!(line.evidence, Some(Evidence::Hardware), "{line:#?}");
    let codes = line.codes.as_deref().unwrap_or_default();
    assert!(codes.starts_with("P2pSlow"), "hardware first: {codes}");
    let message = line.message.as_deref().unwrap_or_default();
    let pairs = named_pairs(message);
    assert!(
        !pairs.is_empty(),
        "the message names the slow pairs: {message}"
    );
    assert!(
        pairs.iter().all(|&(a, b)| a == 1 || b == 1),
        "only GPU 1's links are slow, whatever order the figures come in: {message}"
    );
}

/// The `GPUa->GPUb` pairs a line's message names, in its order.
fn named_pairs(message: &str) -> Vec<(u32, u32)> {
    let number = |s: &str| -> Option<(u32, usize)> {
        let len = s.chars().take_while(char::is_ascii_digit).count();
        Some((s.get(..len)?.parse().ok()?, len))
    };
    let mut pairs = Vec::new();
    let mut rest = message;
    while let Some(at) = rest.find("GPU") {
        rest = &rest[at + 3..];
        let Some((src, len)) = number(rest) else {
            continue;
        };
        let Some(tail) = rest[len..].strip_prefix("->GPU") else {
            continue;
        };
        if let Some((dst, _)) = number(tail) {
            pairs.push((src, dst));
        }
    }
    pairs
}

/// Five busy GPUs and a sixth whose memory check could not run (a hardware Error): the cap on
/// the listed failures keeps the hardware code, so the node's line stays hardware evidence
/// through the operator, not Busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failure_list_never_hides_a_hardware_code_behind_busy_ones() {
    let c = Cluster::start(NS, &["gpu-a".to_string()], 6).await;
    let busy: Vec<String> = (0..5)
        .map(|g| format!("{g}:{}:python3:20480:0.5", 4240 + g))
        .collect();
    let sim = format!(
        "gpus=6,model=H200,pidns=1,proc={},error=memory@5,timescale=0.001",
        busy.join("+")
    );
    let _op = OperatorHandle::start(c.client.clone(), test_config(NS, &sim));
    c.apply("busy-cap", json!({"checks": {"memory": {"fraction": 0.1}}}))
        .await;
    let (_, line) = ended_line(&c, "busy-cap", "finished", "gpu-a").await;
    let codes = line.codes.as_deref().unwrap_or_default();
    assert_eq!(
        line.evidence,
        Some(Evidence::Hardware),
        "{codes}: {line:#?}"
    );
    assert!(!codes.starts_with("GpuBusy"), "hardware first: {codes}");
}

/// The io check's real file I/O on three nodes whose simulated disks fail at the call the
/// kernel would fail (`disk=`): EIO on the read-back and a file that reads back short are the
/// disk's hardware fault (the node Failed on hardware evidence, ReplaceHardware, tainted and
/// labelled Fail), while a filesystem that fills up during the check is the installation's
/// (Configuration: no taint, no Fail label).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_disk_fails_its_node_on_hardware_and_a_full_one_marks_nothing() {
    let nodes = ["gpu-a", "gpu-b", "gpu-c"].map(String::from);
    let c = Cluster::start(NS, &nodes, 2).await;
    let io = tempfile::tempdir().expect("a directory for the io check");
    let faults = [
        ("gpu-a", "eio@read"),
        ("gpu-b", "short@read"),
        ("gpu-c", "full@write"),
    ];
    for (node, fault) in faults {
        let k = &c.kubelet;
        k.set_node_env(node, "GPUVAL_SIMULATE", &format!("{SIM},disk={fault}"));
        k.set_node_env(node, "GPUVAL_IO_DIR", &io.path().display().to_string());
    }
    let mut cfg = test_config(NS, SIM);
    cfg.simulated_acts_on_nodes = true;
    cfg.io_host_path = Some("/var/lib/gpuval-io".into());
    let _op = OperatorHandle::start(c.client.clone(), cfg);
    c.apply(
        "disks",
        json!({"checks": {"memory": {"fraction": 0.1}, "io": {"fileSizeMib": 1, "files": 2}},
               "onFailure": {"action": "Taint"}}),
    )
    .await;
    for (node, fault) in &faults[..2] {
        let (_, line) = ended_line(&c, "disks", "finished", node).await;
        assert_eq!(line.verdict, NodeVerdict::Failed, "{fault}: {line:#?}");
        assert_eq!(
            line.evidence,
            Some(Evidence::Hardware),
            "{fault}: {line:#?}"
        );
        assert_eq!(
            line.codes.as_deref(),
            Some("IoDeviceError"),
            "{fault}: {line:#?}"
        );
        let message = line.message.as_deref().unwrap_or_default();
        assert!(message.contains("file-00000"), "{fault}: {message}");
        let marked = nodes::wait_node(
            &c.client,
            node,
            "tainted and labelled Fail for its disk",
            WITHIN,
            |n| failure_taint(n) && verdict_label(n) == Some("Fail"),
        )
        .await;
        let action = marked.labels().get("gpuval.io/action").cloned();
        assert_eq!(action.as_deref(), Some("ReplaceHardware"), "{fault}");
    }
    let (_, full) = ended_line(&c, "disks", "finished", "gpu-c").await;
    assert_eq!(full.verdict, NodeVerdict::Error, "{full:#?}");
    assert_eq!(full.evidence, Some(Evidence::Configuration), "{full:#?}");
    assert!(
        full.message
            .as_deref()
            .unwrap_or_default()
            .contains("ENOSPC"),
        "{full:#?}"
    );
    let told = nodes::wait_node(
        &c.client,
        "gpu-c",
        "told why it has no verdict",
        WITHIN,
        |n| nodes::condition(n, "GpuValidated").is_some(),
    )
    .await;
    assert!(
        !failure_taint(&told),
        "a full disk marks nothing: {:?}",
        told.spec
    );
    assert_eq!(verdict_label(&told), None);
}

fn failure_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "gpuval.io/failed"))
}

fn verdict_label(n: &Node) -> Option<&str> {
    n.labels().get("gpuval.io/verdict").map(String::as_str)
}
