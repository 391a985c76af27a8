//! The fabric test end to end on the real control plane: the operator plans rounds as
//! GpuFabricRound objects, the agents (real processes, simulated GPUs, real TCP between them on
//! loopback) take part and write their outcomes, and the verdict names the node at fault.

use gpuval_crds::fabric::FabricPhase;
use gpuval_crds::{GpuFabricRound, GpuValidation, NodeVerdict, Phase};
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario::{Cluster, node_line};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
/// Simulated GPUs: 2 × H200 a node (few, so that many nodes fit on a CI machine).
const SIM: &str = "gpus=2,model=H200,timescale=0.001";

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("gpu-{i:02}")).collect()
}

fn spec() -> Value {
    json!({
        "checks": {"memory": {"fraction": 0.1}},
        "fabric": {
            "nccl": {"minBusBandwidthGbps": 350},
            "tcp": {"streams": 2, "duration": "1s"},
            "roundTimeout": "60s"
        }
    })
}

fn fabric(gv: &GpuValidation) -> gpuval_crds::fabric::FabricStatus {
    gv.status
        .as_ref()
        .and_then(|s| s.fabric.clone())
        .expect("fabric status")
}

async fn rounds(c: &Cluster) -> Vec<GpuFabricRound> {
    let api: Api<GpuFabricRound> = Api::namespaced(c.client.clone(), NS);
    let mut r = api
        .list(&ListParams::default())
        .await
        .expect("rounds")
        .items;
    r.sort_by_key(|r| r.spec.round);
    r
}

/// Starts a cluster of `n` nodes, plants `faults` in the named nodes' simulated machines,
/// applies the validation and waits for its verdict. Every agent runs on this host, so each
/// test's groups meet on a port range of its own (`port`, below the ephemeral ports): the tests
/// run in parallel.
async fn run(
    name: &str,
    n: usize,
    faults: &[(usize, &str)],
    port: u16,
) -> (Cluster, GpuValidation, OperatorHandle) {
    run_spec(name, n, faults, port, spec()).await
}

/// As [`run`], with the validation's spec given.
async fn run_spec(
    name: &str,
    n: usize,
    faults: &[(usize, &str)],
    port: u16,
    spec: Value,
) -> (Cluster, GpuValidation, OperatorHandle) {
    run_with(name, n, faults, &[], port, spec).await
}

/// As [`run_spec`], with environment variables set on the named nodes' agents too.
async fn run_with(
    name: &str,
    n: usize,
    faults: &[(usize, &str)],
    env: &[(usize, &str, String)],
    port: u16,
    spec: Value,
) -> (Cluster, GpuValidation, OperatorHandle) {
    let nodes = names(n);
    let c = Cluster::start(NS, &nodes, 2).await;
    for (i, fault) in faults {
        c.kubelet
            .set_node_env(&nodes[*i], "GPUVAL_SIMULATE", &format!("{SIM},{fault}"));
    }
    for (i, key, value) in env {
        c.kubelet.set_node_env(&nodes[*i], key, value);
    }
    let mut cfg = test_config(NS, SIM);
    cfg.fabric.port = port;
    let op = OperatorHandle::start(c.client.clone(), cfg);
    c.apply(name, spec).await;
    let gv = c.wait_terminal(name, 240).await;
    (c, gv, op)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_healthy_nodes_pass_the_fabric_with_real_tcp_figures() {
    let (c, gv, _op) = run("fabric-ok", 8, &[], 31000).await;
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Passed), "{s:?}");
    let f = fabric(&gv);
    assert_eq!(f.phase, FabricPhase::Passed);
    assert_eq!((f.nodes, f.rounds), (8, 1));
    assert!(f.bus_bandwidth_gbps.is_some_and(|b| b >= 350.0), "{f:?}");
    assert!(
        f.tcp_min_gbps.is_some_and(|g| g > 0.0),
        "TCP measured on loopback: {f:?}"
    );
    let r = rounds(&c).await;
    assert!(
        r.last().is_some_and(|r| r.spec.end),
        "the end round tells agents to leave"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_node_among_eight_is_named_and_no_other() {
    let (_c, gv, _op) = run("fabric-slow", 8, &[(5, "net=120")], 31100).await;
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Failed));
    assert_eq!(fabric(&gv).failed_nodes, vec!["gpu-05".to_string()]);
    let (verdict, msg) = node_line(&gv, "gpu-05").expect("gpu-05 listed");
    assert_eq!(verdict, NodeVerdict::Failed);
    assert!(
        msg.starts_with("fabric: in ") && msg.contains("below 350"),
        "{msg}"
    );
    assert_eq!(
        s.summary.as_ref().unwrap().failed,
        1,
        "no other node blamed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bad_nodes_among_sixteen_are_both_named() {
    let (_c, gv, _op) = run("fabric-two", 16, &[(3, "net=100"), (12, "net=150")], 31200).await;
    let f = fabric(&gv);
    assert_eq!(
        f.failed_nodes,
        vec!["gpu-03".to_string(), "gpu-12".to_string()]
    );
    assert!(f.rounds <= 6, "{f:?}");
    assert_eq!(
        gv.status.as_ref().unwrap().summary.as_ref().unwrap().failed,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_lost_mid_round_is_that_nodes_error_and_the_others_pass() {
    let (_c, gv, _op) = run("fabric-lost", 4, &[(2, "netfault=vanish")], 31300).await;
    let (verdict, msg) = node_line(&gv, "gpu-02").expect("gpu-02 listed");
    assert_eq!(verdict, NodeVerdict::Error, "{msg}");
    assert!(msg.contains("fabric"), "{msg}");
    let s = gv.status.as_ref().unwrap();
    assert_eq!(
        s.summary.as_ref().unwrap().passed,
        3,
        "the others re-tested and passed"
    );
    // A lost report is infrastructure everywhere: not named at fault (so neither
    // `Fabric-Named`, the metrics nor the reports show it as failed on its fabric).
    let line = s.nodes.iter().find(|l| l.name == "gpu-02").expect("line");
    assert_eq!(line.evidence, Some(gpuval_crds::Evidence::Infrastructure));
    assert!(fabric(&gv).failed_nodes.is_empty(), "{:?}", fabric(&gv));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_failed_its_own_checks_is_left_out_of_the_fabric() {
    let (c, gv, _op) = run("fabric-skip", 4, &[(1, "fail=memory@0")], 31400).await;
    let (verdict, msg) = node_line(&gv, "gpu-01").expect("gpu-01 listed");
    assert_eq!(verdict, NodeVerdict::Failed);
    assert!(
        msg.contains("memory"),
        "failed its own check, not the fabric: {msg}"
    );
    let f = fabric(&gv);
    assert_eq!((f.phase, f.nodes), (FabricPhase::Passed, 3));
    let r = rounds(&c).await;
    assert!(
        r.iter().all(|r| r
            .spec
            .groups
            .iter()
            .all(|g| !g.nodes.contains(&"gpu-01".to_string()))),
        "gpu-01 is in no group"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_nccl_cannot_start_is_named_and_the_peers_that_saw_it_are_not() {
    // As on real H100s (issue 32): gpu-03 cannot start NCCL; its peers see the collective
    // stopped by a peer that exited, which names none of them.
    let (_c, gv, _op) = run("fabric-local", 4, &[(3, "netfault=local")], 31500).await;
    let f = fabric(&gv);
    assert_eq!(f.failed_nodes, vec!["gpu-03".to_string()], "{f:?}");
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.summary.as_ref().unwrap().failed, 1, "{f:?}");
    let (verdict, msg) = node_line(&gv, "gpu-03").expect("gpu-03 listed");
    assert_eq!(verdict, NodeVerdict::Failed, "{msg}");
    assert!(msg.contains("netfault=local"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_joins_its_groups_is_named_and_no_other() {
    let (_c, gv, _op) = run("fabric-nojoin", 4, &[(1, "netfault=nojoin")], 31600).await;
    let f = fabric(&gv);
    assert_eq!(f.failed_nodes, vec!["gpu-01".to_string()], "{f:?}");
    let (_, msg) = node_line(&gv, "gpu-01").expect("gpu-01 listed");
    assert!(msg.contains("rendezvous"), "{msg}");
}

/// The operator gives a fabric validation a key Secret of its own (owned by it), mounts it into
/// that validation's agent pods alone, and the agents, which refuse the fabric without it,
/// prove it to each other at every rendezvous; the Secret goes with the validation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fabric_key_is_the_validation_s_own_mounted_only_in_its_pods_and_goes_with_it() {
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use kube::ResourceExt;
    use kube::api::DeleteParams;
    use kube::runtime::wait::{await_condition, conditions};

    let nodes = names(3);
    let c = Cluster::start(NS, &nodes, 2).await;
    let mut cfg = test_config(NS, SIM);
    cfg.fabric.port = 31700;
    let _op = OperatorHandle::start(c.client.clone(), cfg);
    let mut keyed = spec();
    keyed["nodeNames"] = json!([nodes[0], nodes[1]]);
    c.apply("fabric-keyed", keyed).await;
    c.apply(
        "plain",
        json!({"nodeNames": [nodes[2]], "checks": {"memory": {"fraction": 0.1}}}),
    )
    .await;
    let gv = c.wait_terminal("fabric-keyed", 240).await;
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Passed), "{s:?}");
    assert_eq!(
        fabric(&gv).phase,
        FabricPhase::Passed,
        "the members proved the key"
    );
    c.wait_terminal("plain", 240).await;

    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), NS);
    let name = gpuval_operator::decide::fabric_key::secret_name("fabric-keyed");
    let secret = secrets
        .get(&name)
        .await
        .expect("the validation's key Secret");
    let owner = &secret.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("GpuValidation", gv.uid().unwrap().as_str(), Some(true))
    );
    let key = &secret.data.as_ref().expect("data")[gpuval_operator::decide::fabric_key::FILE];
    assert_eq!(key.0.len(), gpuval_operator::decide::fabric_key::KEY_BYTES);
    assert!(
        secrets
            .get_opt(&gpuval_operator::decide::fabric_key::secret_name("plain"))
            .await
            .expect("read")
            .is_none(),
        "a validation without the fabric has no key"
    );
    let mounting: Vec<String> = Api::<Pod>::namespaced(c.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .into_iter()
        .filter(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| {
                    v.secret
                        .as_ref()
                        .is_some_and(|s| s.secret_name.as_deref() == Some(name.as_str()))
                })
        })
        .map(|p| p.name_any())
        .collect();
    let mut want: Vec<String> = nodes[..2]
        .iter()
        .map(|n| gpuval_operator::decide::pod::pod_name("fabric-keyed", n, 1))
        .collect();
    want.sort();
    let mut got = mounting;
    got.sort();
    assert_eq!(got, want, "only the fabric validation's pods mount its key");

    Api::<GpuValidation>::all(c.client.clone())
        .delete("fabric-keyed", &DeleteParams::foreground())
        .await
        .expect("delete the validation");
    let uid = secret.uid().expect("uid");
    let gone = await_condition(secrets, &name, conditions::is_deleted(&uid));
    tokio::time::timeout(std::time::Duration::from_secs(60), gone)
        .await
        .expect("the key Secret goes with its validation within 60 s")
        .expect("watch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_slow_on_one_rail_is_named_with_that_rail_and_no_other() {
    let mut railed = spec();
    railed["fabric"]["nccl"]["rails"] = json!(["mlx5_0", "mlx5_1"]);
    let faults = [(2, "railnet=mlx5_1@120")];
    let (c, gv, _op) = run_spec("fabric-rails", 6, &faults, 31800, railed).await;
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Failed), "{s:?}");
    assert_eq!(fabric(&gv).failed_nodes, vec!["gpu-02".to_string()]);
    let (verdict, msg) = node_line(&gv, "gpu-02").expect("gpu-02 listed");
    assert_eq!(verdict, NodeVerdict::Failed);
    assert!(msg.starts_with("fabric: rail mlx5_1: in "), "{msg}");
    assert_eq!(
        s.summary.as_ref().unwrap().failed,
        1,
        "no other node blamed"
    );
    // Round 1 screened both rails at once; the agents ran each group on its rail.
    let r = rounds(&c).await;
    let first: Vec<Option<String>> = r[0]
        .spec
        .groups
        .iter()
        .filter(|g| g.kind == gpuval_crds::fabric::FabricKind::Nccl)
        .map(|g| g.rail.clone())
        .collect();
    assert_eq!(
        first,
        [Some("mlx5_0".to_string()), Some("mlx5_1".to_string())]
    );
}

/// One node's InfiniBand ports as the kernel's sysfs ABI lays them out, under `root`.
fn ib_port(root: &std::path::Path, dev: &str, state: &str, phys: &str, symbol_errors: u64) {
    let dir = root.join(dev).join("ports").join("1");
    std::fs::create_dir_all(dir.join("counters")).expect("port dir");
    for (file, text) in [
        ("state", state),
        ("phys_state", phys),
        ("rate", "400 Gb/sec (4X NDR)"),
        ("link_layer", "InfiniBand"),
    ] {
        std::fs::write(dir.join(file), format!("{text}\n")).expect("port file");
    }
    std::fs::write(
        dir.join("counters").join("symbol_error"),
        format!("{symbol_errors}\n"),
    )
    .expect("counter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_infiniband_port_is_down_is_named_with_the_port_and_the_status_counts_them() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let env: Vec<(usize, &str, String)> = (0..4)
        .map(|i| {
            let root = tmp.path().join(format!("node-{i}"));
            ib_port(&root, "mlx5_0", "4: ACTIVE", "5: LinkUp", 0);
            if i == 1 {
                ib_port(&root, "mlx5_1", "1: DOWN", "3: Disabled", 0);
            } else {
                ib_port(&root, "mlx5_1", "4: ACTIVE", "5: LinkUp", 0);
            }
            (i, "GPUVAL_INFINIBAND_SYSFS", root.display().to_string())
        })
        .collect();
    let (_c, gv, _op) = run_with("fabric-ports", 4, &[], &env, 31900, spec()).await;
    let s = gv.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Failed), "{s:?}");
    let f = fabric(&gv);
    assert_eq!(f.failed_nodes, vec!["gpu-01".to_string()]);
    let (verdict, msg) = node_line(&gv, "gpu-01").expect("gpu-01 listed");
    assert_eq!(verdict, NodeVerdict::Failed);
    assert!(
        msg.contains("port mlx5_1/1 (InfiniBand): state DOWN"),
        "{msg}"
    );
    let p = f.ports.expect("the ports line");
    assert_eq!((p.nodes, p.ports, p.infiniband, p.roce), (4, 8, 8, 0));
    assert_eq!(p.failing_count, 2, "state and physical state: {p:?}");
    assert!(p.failing.iter().all(|l| l.starts_with("gpu-01: ")), "{p:?}");
    assert_eq!(p.min_rate_gbps, Some(400.0));
    assert_eq!(
        s.summary.as_ref().unwrap().failed,
        1,
        "no other node blamed"
    );
}
