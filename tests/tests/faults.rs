//! The faults gpuval must survive, on a real control plane (etcd, kube-apiserver,
//! controller-manager, scheduler, kwok nodes) with agents run as processes by the FakeKubelet:
//! the leader killed or paused mid-run with a second replica waiting, kube-apiserver and etcd
//! restarted while agents write, agents cut off from the API server when their checks end
//! (back before the deadline, or not), and stale results planted beside the real ones.
//! RELIABILITY.md lists what each test proves.
//!
//! Time: the simulated backend spends `duration × timescale` of wall time on the compute burn,
//! so each fault lands while the agents run; the tests wait on conditions (watches, the
//! agents' logs, the audit log, the Lease), never on sleeps. Writes are counted from the API
//! server's audit log, where each operator replica writes under its own service account.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use gpuval_crds::{GpuNodeResult, GpuValidation, NodeVerdict, Phase, labels};
use gpuval_tests::audit::{self, Write};
use gpuval_tests::kubelet::FakeKubelet;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::proxy::Proxy;
use gpuval_tests::replica::{LeaseTiming, Replica, ReplicaSettings};
use gpuval_tests::scenario::{self, node_line, terminal_for_generation};
use gpuval_tests::{ControlPlane, Options, waits};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::wait::Condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
/// Simulated GPUs: the compute burn takes half its duration in wall time.
const SIM: &str = "gpus=2,model=H200,timescale=0.5";
/// Generous limits for a loaded 2-core CI machine.
const LONG: Duration = Duration::from_secs(300);
const MEDIUM: Duration = Duration::from_secs(180);

struct Env {
    cp: ControlPlane,
    client: Client,
    kubelet: FakeKubelet,
    /// In front of the API server for the agents only, when asked for.
    proxy: Option<Proxy>,
}

/// A control plane with `gpu_nodes` (2 GPUs each), the CRDs, the namespace and the fake
/// kubelet; the agents reach the API server through a [`Proxy`] when `agents_via_proxy`.
async fn env(gpu_nodes: &[&str], audit_log: bool, agents_via_proxy: bool) -> Env {
    let cp = ControlPlane::start_with(Options {
        audit_log,
        ..Options::all()
    })
    .await
    .expect("control plane");
    let client = cp.client().await.expect("client");
    scenario::install(&client, NS).await;
    scenario::ready_gpu_nodes(&client, gpu_nodes, 2, &[], Duration::from_secs(90)).await;
    let (kubeconfig, proxy) = if agents_via_proxy {
        let upstream: SocketAddr = cp
            .server()
            .trim_start_matches("https://")
            .parse()
            .expect("API server address");
        let proxy = Proxy::start(upstream).await.expect("proxy");
        let path = cp.dir().join("agents.kubeconfig");
        cp.write_kubeconfig_for(&proxy.server(), &path)
            .expect("agents' kubeconfig");
        (path, Some(proxy))
    } else {
        (cp.kubeconfig().to_path_buf(), None)
    };
    let kubelet = scenario::start_kubelet(&client, kubeconfig, NS);
    Env {
        cp,
        client,
        kubelet,
        proxy,
    }
}

/// Memory and a compute burn of `burn_secs` (simulated; half of it in wall time).
fn spec(burn_secs: u64, deadline: &str) -> Value {
    json!({
        "checks": {"memory": {}, "compute": {"duration": format!("{burn_secs}s")}},
        "deadline": deadline,
    })
}

async fn apply(client: &Client, name: &str, spec: Value) -> GpuValidation {
    scenario::apply_validation(client, "faults", name, spec).await
}

/// Waits (watching) until `cond` holds for validation `name`.
async fn wait_for(
    client: &Client,
    name: &str,
    limit: Duration,
    what: &str,
    cond: impl Condition<GpuValidation>,
) -> GpuValidation {
    scenario::wait_validation(client, name, limit, what, cond)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn wait_terminal(client: &Client, name: &str, limit: Duration) -> GpuValidation {
    wait_for(client, name, limit, "finished", terminal_for_generation).await
}

fn summary(gv: &GpuValidation) -> (i32, i32, i32) {
    let s = gv
        .status
        .as_ref()
        .and_then(|s| s.summary.clone())
        .unwrap_or_default();
    (s.selected, s.passed, s.failed)
}

/// The validation's agent pods of `generation`.
async fn pods_of(client: &Client, validation: &str, generation: i64) -> Vec<Pod> {
    let selector = format!(
        "{}={validation},{}={generation}",
        labels::VALIDATION,
        labels::GENERATION
    );
    Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Waits until `n` agent pods of the run are Running and each agent has begun its checks (it
/// read its validation); returns the pods.
async fn wait_checks_running(e: &Env, validation: &str, generation: i64, n: usize) -> Vec<Pod> {
    let pods = waits::until("agent pods running", MEDIUM, || async {
        let pods = pods_of(&e.client, validation, generation).await;
        let running = pods.iter().filter(|p| phase(p) == "Running").count();
        (running == n).then_some(pods)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    wait_agent_logs(&e.kubelet, &pods, "agents running their checks", |log| {
        log.contains("running the checks")
    })
    .await;
    pods
}

/// Starts an operator (it stops when the handle drops), applies validation `name` and waits
/// until the agents on all `nodes` nodes run their checks; returns the handle and the pods.
async fn operator_and_checks_running(
    e: &Env,
    name: &str,
    spec: Value,
    nodes: usize,
) -> (OperatorHandle, Vec<Pod>) {
    let op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    apply(&e.client, name, spec).await;
    let pods = wait_checks_running(e, name, 1, nodes).await;
    (op, pods)
}

/// Waits until the log of every agent of `pods` satisfies `done`; on a timeout, panics with
/// their logs.
async fn wait_agent_logs(
    kubelet: &FakeKubelet,
    pods: &[Pod],
    what: &str,
    done: impl Fn(&str) -> bool,
) {
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    waits::until(what, MEDIUM, || async {
        names.iter().all(|p| done(&kubelet.logs(p))).then_some(())
    })
    .await
    .unwrap_or_else(|err| {
        let logs: BTreeMap<&String, String> = names.iter().map(|p| (p, kubelet.logs(p))).collect();
        panic!("{err}; logs: {logs:#?}")
    });
}

/// Tries the agent whose log this is made to store its result that failed for a transient
/// reason.
fn failed_stores(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("transient API error") && l.contains("store the result"))
        .count()
}

/// Waits until every agent of `pods` has failed to store its result at least `n` times.
async fn wait_failed_stores(kubelet: &FakeKubelet, pods: &[Pod], n: usize) {
    let what = "agents failing to store their results";
    wait_agent_logs(kubelet, pods, what, |log| failed_stores(log) >= n).await;
}

async fn results(client: &Client, validation: &str) -> Vec<GpuNodeResult> {
    let selector = format!("{}={validation}", labels::VALIDATION);
    Api::<GpuNodeResult>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list results")
        .items
}

/// The results of `validation` that carry a report (the operator makes each with its pod; the
/// agent stores the report in it).
async fn reported(client: &Client, validation: &str) -> Vec<GpuNodeResult> {
    let mut all = results(client, validation).await;
    all.retain(|r| r.status.is_some());
    all
}

/// Each result's node and verdict label, sorted by node.
async fn result_verdicts(client: &Client, validation: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = results(client, validation)
        .await
        .iter()
        .map(|r| {
            let l = r.labels();
            (l[labels::NODE].clone(), l[labels::VERDICT].clone())
        })
        .collect();
    v.sort();
    v
}

fn writes(cp: &ControlPlane) -> Vec<Write> {
    let path = cp.audit_log().expect("the API server keeps an audit log");
    audit::writes(&path).expect("read the audit log")
}

/// Every uid an agent pod of each node ever had, from a watch kept for the whole test.
#[derive(Clone, Default)]
struct PodUids(Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>);

impl PodUids {
    fn track(client: &Client) -> (Self, tokio::task::JoinHandle<()>) {
        let uids = Self::default();
        let seen = uids.clone();
        let api: Api<Pod> = Api::namespaced(client.clone(), NS);
        let cfg = watcher::Config::default().labels(&format!(
            "{}={}",
            labels::APP_NAME_KEY,
            labels::AGENT_APP
        ));
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = event {
                    seen.note(&p);
                }
            }
        });
        (uids, task)
    }

    fn note(&self, p: &Pod) {
        let node = p.annotations().get(labels::NODE).cloned();
        if let (Some(node), Some(uid)) = (node, p.metadata.uid.clone()) {
            let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
            m.entry(node).or_default().insert(uid);
        }
    }

    fn per_node(&self) -> BTreeMap<String, usize> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(n, u)| (n.clone(), u.len())).collect()
    }
}

async fn lease(client: &Client, name: &str) -> Option<LeaseSpec> {
    Api::<Lease>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
}

/// Waits until `holder` holds Lease `name`; returns its spec then.
async fn wait_holder(client: &Client, name: &str, holder: &str, limit: Duration) -> LeaseSpec {
    waits::until(&format!("{holder} holding lease {name}"), limit, || async {
        lease(client, name)
            .await
            .filter(|s| s.holder_identity.as_deref() == Some(holder))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn replica_settings(lease: &str) -> ReplicaSettings {
    ReplicaSettings {
        namespace: NS.into(),
        lease: lease.into(),
        simulate: SIM.into(),
        timing: LeaseTiming::default(),
    }
}

/// Starts replica-a, waits until it leads, then starts replica-b (which follows).
async fn two_replicas(e: &Env, settings: &ReplicaSettings) -> (Replica, Replica) {
    let a = Replica::start(&e.cp, &e.client, "replica-a", settings)
        .await
        .expect("replica-a");
    wait_holder(&e.client, &settings.lease, "replica-a", MEDIUM).await;
    let b = Replica::start(&e.cp, &e.client, "replica-b", settings)
        .await
        .expect("replica-b");
    (a, b)
}

fn seconds_between(earlier: Timestamp, later: Timestamp) -> f64 {
    later.duration_since(earlier).as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_run_the_follower_takes_over_in_the_lease_bounds_and_nothing_is_lost() {
    let nodes = ["gpu-a", "gpu-b", "gpu-c"];
    let e = env(&nodes, true, false).await;
    e.kubelet
        .set_node_env("gpu-c", "GPUVAL_SIMULATE", &format!("{SIM},fail=memory@1"));
    let (uids, _watch) = PodUids::track(&e.client);
    let settings = replica_settings("failover");
    let timing = settings.timing;
    let (mut a, b) = two_replicas(&e, &settings).await;

    apply(&e.client, "failover", spec(60, "15m")).await;
    wait_checks_running(&e, "failover", 1, 3).await;

    // The leader crashes while every agent is mid-burn.
    let killed = Instant::now();
    a.kill();
    let last = lease(&e.client, "failover").await.expect("lease");
    assert_eq!(last.holder_identity.as_deref(), Some("replica-a"));
    let took = wait_holder(&e.client, "failover", "replica-b", MEDIUM).await;
    let takeover = killed.elapsed();
    let bound = timing.duration + timing.retry_period + Duration::from_secs(20);
    assert!(
        takeover <= bound,
        "replica-b took {takeover:?} to take over (lease {:?}, retry {:?})",
        timing.duration,
        timing.retry_period
    );
    let (renewed, acquired) = (
        last.renew_time.expect("renewTime").0,
        took.acquire_time.expect("acquireTime").0,
    );
    let waited = seconds_between(renewed, acquired);
    assert!(
        waited >= timing.duration.as_secs_f64() - 0.25,
        "replica-b took the lease {waited:.2}s after replica-a's last renewal, before it lapsed"
    );

    let gv = wait_terminal(&e.client, "failover", LONG).await;
    let status = gv.status.as_ref().expect("status");
    assert_eq!(
        status.phase,
        Some(Phase::Failed),
        "gpu-c fails its memory check"
    );
    assert_eq!(summary(&gv), (3, 2, 1));
    assert_eq!(
        node_line(&gv, "gpu-c").map(|l| l.0),
        Some(NodeVerdict::Failed)
    );
    assert_eq!(
        result_verdicts(&e.client, "failover").await,
        [("gpu-a", "Pass"), ("gpu-b", "Pass"), ("gpu-c", "Fail")]
            .map(|(n, v)| (n.to_string(), v.to_string())),
        "no result lost"
    );
    assert_eq!(
        uids.per_node(),
        nodes.iter().map(|n| (n.to_string(), 1)).collect(),
        "one agent pod per node, ever"
    );
    let created: Vec<Write> = writes(&e.cp)
        .into_iter()
        .filter(|w| w.resource == "pods" && w.subresource.is_none())
        .filter(|w| w.verb == "create" && w.succeeded())
        .collect();
    assert_eq!(created.len(), 3, "pod creations: {created:#?}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_stops_writing_before_the_follower_takes_over() {
    let e = env(&["gpu-a", "gpu-b"], true, false).await;
    let settings = replica_settings("paused");
    let (mut a, _b) = two_replicas(&e, &settings).await;
    apply(&e.client, "paused", spec(60, "15m")).await;
    let pods = wait_checks_running(&e, "paused", 1, 2).await;

    // Frozen mid-run (SIGSTOP): sockets open, nothing runs, the lease lapses.
    a.pause();
    wait_holder(&e.client, "paused", "replica-b", MEDIUM).await;
    // The agents finish meanwhile, so the frozen leader has news waiting when it wakes.
    waits::until("both results stored", MEDIUM, || async {
        (results(&e.client, "paused").await.len() == 2).then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}"));
    a.resume();
    let exit = waits::until("replica-a to step down", MEDIUM, || {
        let status = a.exited();
        async move { status }
    })
    .await
    .unwrap_or_else(|err| panic!("{err}; its log:\n{}", a.logs()));
    assert!(
        !exit.success(),
        "a replica that lost its lease exits non-zero"
    );
    assert!(a.logs().contains("lost the lease"), "{}", a.logs());

    let gv = wait_terminal(&e.client, "paused", LONG).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed)
    );
    assert_eq!(summary(&gv), (2, 2, 0));

    let all = writes(&e.cp);
    let user_a = Replica::user(NS, "replica-a");
    let user_b = Replica::user(NS, "replica-b");
    let led = all
        .iter()
        .filter(|w| w.user == user_a && w.resource == "pods" && w.subresource.is_none())
        .filter(|w| w.verb == "create" && w.succeeded())
        .count();
    assert_eq!(led, pods.len(), "replica-a led the run and made its pods");
    let acquired = all
        .iter()
        .find(|w| w.user == user_b && w.resource == "leases" && w.succeeded())
        .map(|w| w.received)
        .expect("replica-b's lease write");
    let late: Vec<&Write> = all
        .iter()
        .filter(|w| w.user == user_a && w.received >= acquired)
        .filter(|w| w.resource != "leases" || w.succeeded())
        .collect();
    assert!(
        late.is_empty(),
        "replica-a wrote after replica-b took the lease at {acquired}: {late:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_and_etcd_restart_mid_run_results_arrive_and_no_write_storm() {
    let nodes = ["gpu-a", "gpu-b", "gpu-c"];
    let started = Instant::now();
    let mut e = env(&nodes, true, false).await;
    let (_op, pods) = operator_and_checks_running(&e, "restart", spec(40, "15m"), 3).await;

    // An upgrade: both go down while the agents burn, and come back on the same ports with
    // etcd's data.
    println!(
        "{:?}: agents burning; stopping kube-apiserver and etcd",
        started.elapsed()
    );
    e.cp.stop("kube-apiserver").expect("stop kube-apiserver");
    e.cp.stop("etcd").expect("stop etcd");
    wait_failed_stores(&e.kubelet, &pods, 1).await;
    println!(
        "{:?}: every agent failed to store; starting etcd and kube-apiserver",
        started.elapsed()
    );
    e.cp.start_again("etcd").await.expect("etcd back");
    e.cp.start_again("kube-apiserver")
        .await
        .expect("kube-apiserver back");
    let back = Timestamp::now();
    let back_at = Instant::now();
    println!("{:?}: kube-apiserver ready again", started.elapsed());

    let gv = wait_terminal(&e.client, "restart", LONG).await;
    let recovered = back_at.elapsed();
    println!(
        "{:?}: verdict, {recovered:?} after the API server was back",
        started.elapsed()
    );
    // The agents retry at most 8 s apart and the operator's watches at most 5 s apart.
    assert!(
        recovered <= Duration::from_secs(120),
        "the operator took {recovered:?} to see the results after the restart"
    );
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed)
    );
    assert_eq!(summary(&gv), (3, 3, 0));
    assert_eq!(
        result_verdicts(&e.client, "restart").await,
        nodes.map(|n| (n.to_string(), "Pass".to_string()))
    );

    let all = writes(&e.cp);
    let stored_after: BTreeSet<String> = all
        .iter()
        .filter(|w| w.resource == "gpunoderesults" && w.succeeded() && w.received >= back)
        .filter_map(|w| w.name.clone())
        .collect();
    assert_eq!(
        stored_after.len(),
        3,
        "every result was stored after the restart (the fault landed mid-run): {stored_after:?}"
    );
    let status_writes = |after: Option<Timestamp>| {
        all.iter()
            .filter(|w| {
                w.resource == "gpuvalidations" && w.subresource.as_deref() == Some("status")
            })
            .filter(|w| after.is_none_or(|t| w.received >= t))
            .count()
    };
    let events_after = all
        .iter()
        .filter(|w| w.resource == "events" && w.received >= back)
        .count();
    println!(
        "writes: validation status {} in all, {} after the restart; events after it {events_after}",
        status_writes(None),
        status_writes(Some(back))
    );
    // Each node moves Pending → Running → Passed once; start and finish add a few.
    assert!(
        status_writes(None) <= 4 * nodes.len() + 8,
        "status write storm"
    );
    assert!(
        status_writes(Some(back)) <= 2 * nodes.len() + 4,
        "status write storm after the restart"
    );
    assert!(
        events_after <= 2 * nodes.len() + 4,
        "event storm after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_off_when_its_checks_end_stores_its_result_once_back() {
    let nodes = ["gpu-a", "gpu-b"];
    let e = env(&nodes, false, true).await;
    let state = tempfile::tempdir().expect("state dirs");
    for n in nodes {
        let dir = state.path().join(n);
        std::fs::create_dir_all(&dir).expect("state dir");
        e.kubelet
            .set_node_env(n, "GPUVAL_STATE_DIR", &dir.display().to_string());
    }
    let (_op, pods) = operator_and_checks_running(&e, "partition", spec(40, "15m"), 2).await;
    let proxy = e.proxy.as_ref().expect("proxy");

    proxy.cut();
    // Longer than one retry, and longer than the five tries an agent used to give up after:
    // every agent has failed six times with its result in hand.
    wait_failed_stores(&e.kubelet, &pods, 6).await;
    assert!(proxy.refused() > 0);
    assert!(
        reported(&e.client, "partition").await.is_empty(),
        "nothing can be stored while cut off"
    );
    for p in &pods {
        let node = p.annotations()[labels::NODE].clone();
        let path = state.path().join(&node).join("result.json");
        let saved: Value = serde_json::from_slice(&std::fs::read(&path).expect("saved result"))
            .expect("saved result JSON");
        assert_eq!(saved["report"]["verdict"], "Pass", "{node}");
        assert_eq!(
            saved["podUid"].as_str(),
            p.metadata.uid.as_deref(),
            "{node}"
        );
    }
    let gv = Api::<GpuValidation>::all(e.client.clone())
        .get("partition")
        .await
        .expect("validation");
    assert!(
        !terminal_for_generation(Some(&gv)),
        "no verdict without the results"
    );

    proxy.restore();
    let gv = wait_terminal(&e.client, "partition", LONG).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed)
    );
    assert_eq!(summary(&gv), (2, 2, 0));
    for r in results(&e.client, "partition").await {
        let writer = r.annotations().get(labels::POD_UID).cloned();
        let node = r.spec.node_name.clone();
        let pod = pods.iter().find(|p| p.annotations()[labels::NODE] == node);
        assert_eq!(writer, pod.and_then(|p| p.metadata.uid.clone()), "{node}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_off_past_the_deadline_gives_an_error_never_a_pass() {
    let nodes = ["gpu-a", "gpu-b"];
    let e = env(&nodes, false, true).await;
    let (_op, pods) = operator_and_checks_running(&e, "cutoff", spec(20, "90s"), 2).await;
    let proxy = e.proxy.as_ref().expect("proxy");

    proxy.cut();
    wait_failed_stores(&e.kubelet, &pods, 1).await;
    let gv = wait_terminal(&e.client, "cutoff", LONG).await;
    for n in nodes {
        println!("{n}: {:?}", node_line(&gv, n));
    }
    let check = |gv: &GpuValidation| {
        assert_eq!(
            gv.status.as_ref().and_then(|s| s.phase),
            Some(Phase::Failed)
        );
        assert_eq!(summary(gv), (2, 0, 2));
        for n in nodes {
            let (verdict, message) = node_line(gv, n).expect("a line for the node");
            assert!(
                matches!(verdict, NodeVerdict::DeadlineExceeded | NodeVerdict::Error),
                "{n}: {verdict:?}"
            );
            assert!(message.contains("deadline"), "{n}: {message}");
        }
    };
    check(&gv);

    // The way opens again once the agents are gone: nothing they held can turn into a pass.
    proxy.restore();
    waits::until("the agents to be gone", MEDIUM, || async {
        e.kubelet.running().is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}: {:?}", e.kubelet.running()));
    assert!(reported(&e.client, "cutoff").await.is_empty());
    // Their results are closed: no report can get in any more.
    for r in results(&e.client, "cutoff").await {
        let closed = gpuval_crds::binding::closed(&r.metadata);
        assert!(
            matches!(closed, Some("DeadlineExceeded" | "Error")),
            "{}: {closed:?}",
            r.name_any()
        );
    }
    let gv = Api::<GpuValidation>::all(e.client.clone())
        .get("cutoff")
        .await
        .expect("validation");
    check(&gv);
}

/// A result object for `node` as a stale writer would leave it: verdict Fail, of
/// `generation`, naming pod `pod_name`/`pod_uid`, owned by the validation.
fn planted(
    gv: &GpuValidation,
    node: &str,
    generation: i64,
    pod_name: &str,
    pod_uid: &str,
) -> Value {
    let name = gv.name_any();
    json!({
        "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
        "metadata": {
            "name": gpuval_crds::result::result_name(&name, node),
            "namespace": NS,
            "labels": {
                labels::VALIDATION: name, labels::NODE: node,
                labels::GENERATION: generation.to_string(), labels::VERDICT: "Fail",
                labels::MANAGED_BY_KEY: labels::MANAGED_BY,
            },
            "annotations": {
                labels::NODE: node, labels::POD: pod_name, labels::POD_UID: pod_uid,
                labels::SUMMARY: "planted: a stale writer's failure",
            },
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_results_from_an_older_run_or_another_pod_do_not_change_the_verdict() {
    let e = env(&["gpu-a", "gpu-b"], false, false).await;
    let _op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    apply(&e.client, "stale", spec(60, "15m")).await;
    let old = wait_checks_running(&e, "stale", 1, 2).await;
    // A spec edit: generation 2 replaces the run.
    let gv = apply(&e.client, "stale", spec(62, "15m")).await;
    assert_eq!(gv.metadata.generation, Some(2));
    let current = wait_checks_running(&e, "stale", 2, 2).await;

    let results_api: Api<GpuNodeResult> = Api::namespaced(e.client.clone(), NS);
    // Written as admin into the results the operator made for the current pods (no admission
    // policy here: what the chart's policy refuses an agent, binding.rs shows).
    let pp = PatchParams::apply("stale-writer").force();
    let gpu_a = current
        .iter()
        .find(|p| p.annotations()[labels::NODE] == "gpu-a")
        .expect("gpu-a's pod");
    let old_b = old
        .iter()
        .find(|p| p.annotations()[labels::NODE] == "gpu-b")
        .expect("gpu-b's old pod");
    // Of this run, under the current pod's name, but bound to a pod that is not the current
    // one, with a failure and no report.
    let other_pod = planted(&gv, "gpu-a", 2, &gpu_a.name_any(), "uid-of-a-replaced-pod");
    // From generation 1's agent, arriving late: its generation, its pod.
    let older_run = planted(
        &gv,
        "gpu-b",
        1,
        &old_b.name_any(),
        old_b.metadata.uid.as_deref().unwrap_or(""),
    );
    for body in [&other_pod, &older_run] {
        let name = body["metadata"]["name"].as_str().expect("name");
        results_api
            .patch(name, &pp, &Patch::Apply(body))
            .await
            .expect("plant a stale result");
    }
    // The operator deletes the older run's result once it sees it and makes the current pod's
    // again (another object); the result watch delivers in order, so the reconcile that deleted
    // it saw the other plant too.
    let b_name = older_run["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let planted_uid = results_api
        .get(&b_name)
        .await
        .expect("gpu-b's result")
        .uid();
    waits::until("the older run's result replaced", MEDIUM, || async {
        let now = results_api.get_opt(&b_name).await.ok()?;
        (now.and_then(|r| r.uid()) != planted_uid).then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}"));
    let now = Api::<GpuValidation>::all(e.client.clone())
        .get("stale")
        .await
        .expect("validation");
    assert!(!terminal_for_generation(Some(&now)), "{:?}", now.status);
    assert_ne!(
        node_line(&now, "gpu-a").map(|l| l.0),
        Some(NodeVerdict::Failed)
    );

    let gv = wait_terminal(&e.client, "stale", LONG).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed)
    );
    assert_eq!(summary(&gv), (2, 2, 0));
    let a_result = results_api
        .get(other_pod["metadata"]["name"].as_str().expect("name"))
        .await
        .expect("gpu-a's result");
    assert_eq!(a_result.labels()[labels::VERDICT], "Pass");
    assert_eq!(
        a_result.annotations().get(labels::POD_UID),
        gpu_a.metadata.uid.as_ref(),
        "the current pod's own result"
    );
}
