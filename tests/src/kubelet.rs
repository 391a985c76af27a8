//! A fake kubelet for gpuval agent pods: it runs each agent pod as a local process
//! (`gpuval-agent k8s`) and keeps the pod's status the way a kubelet would.
//!
//! [`FakeKubelet::start`] watches the pods labelled `app.kubernetes.io/name=gpuval-agent` in
//! one namespace. A pod that kube-scheduler has bound (`spec.nodeName`), that is not terminal
//! and not being deleted, is started once: its container's environment is resolved (plain
//! values and the downward-API fields `spec.nodeName`, `metadata.name`, `metadata.namespace`,
//! `metadata.uid`), `KUBECONFIG` points at the test control plane, and output goes to a log
//! file per pod. The pod becomes Running; when the process exits it becomes Succeeded (exit 0)
//! or Failed (with the exit code in `containerStatuses[0].state.terminated`).
//!
//! Secret volumes are mounted as a kubelet would, in the pod's own directory: each Secret's
//! keys become files there, and an environment value that names a file under the volume's mount
//! path is pointed at that directory (a process cannot see the pod's paths); a Secret that
//! cannot be read fails the pod.
//!
//! A pod with Dynamic Resource Allocation claims is started as a DRA kubelet plugin would
//! start it: with the devices its claims were allocated ([`crate::dra::allocated_uuids`]) as
//! its GPUs (`NVIDIA_VISIBLE_DEVICES`, and as many simulated GPUs); a claim that cannot be
//! read fails the pod.
//!
//! Deleting a pod whose process runs sends the process SIGTERM, SIGKILL after the pod's grace
//! period, and then removes the pod object (delete with grace 0), as a kubelet does.
//! kwok leaves these pods alone (see `kwok-stages.yaml`); should anything else overwrite the
//! final status of a pod, the fake kubelet writes it again.

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use gpuval_crds::labels;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::pod_resources::{Held, PodResourcesServer};

/// The shortest grace period a deleted pod's process gets (kubelet's minimum is 2s too).
const MIN_GRACE: Duration = Duration::from_secs(2);
/// The longest grace period a deleted pod's process gets in tests.
const MAX_GRACE: Duration = Duration::from_secs(30);
/// Tries per status write or delete before giving up (transient errors only).
const WRITE_ATTEMPTS: u32 = 5;
/// How many times a pod's final status is written again after something else changed it.
const MAX_REAPPLY: u32 = 5;

/// What the watcher asks of a pod's supervisor.
#[derive(Debug)]
enum Control {
    /// SIGKILL now (a crash).
    Kill,
    /// The pod is being deleted: SIGTERM, then SIGKILL after `grace`.
    Terminate { grace: Duration },
}

/// How a pod's process ended.
#[derive(Debug, Clone)]
struct Terminated {
    exit_code: i32,
    reason: &'static str,
    started_at: Time,
    finished_at: Time,
}

impl Terminated {
    fn phase(&self) -> &'static str {
        if self.exit_code == 0 {
            "Succeeded"
        } else {
            "Failed"
        }
    }
}

/// One pod this kubelet has taken on (keyed by uid in [`State`]).
struct PodEntry {
    name: String,
    container: String,
    image: String,
    container_id: String,
    /// The runc container's id, when the pod runs under runc.
    runc_id: Option<String>,
    log: Option<PathBuf>,
    control: Option<mpsc::UnboundedSender<Control>>,
    running: bool,
    /// Deletion seen: the process is (being) stopped and the pod object is to be removed.
    deleting: bool,
    /// The pod object is gone from the API.
    gone: bool,
    /// Set once the process has exited.
    terminated: Option<Terminated>,
    reapplied: u32,
    delete_sent: bool,
}

#[derive(Default)]
struct State {
    pods: HashMap<String, PodEntry>,
    /// Pod names in the order their processes were started.
    started: Vec<String>,
    /// Pod name → uid of the latest pod of that name.
    by_name: HashMap<String, String>,
    /// Node name → environment that overrides the pod's for agents on that node (a node's
    /// simulated hardware faults, say).
    node_env: HashMap<String, Vec<(String, String)>>,
}

struct Shared {
    client: Client,
    kubeconfig: PathBuf,
    agent_binary: PathBuf,
    namespace: String,
    log_dir: Result<tempfile::TempDir, String>,
    state: Mutex<State>,
    /// Node name → the CDI devices of that node's share of the host's GPUs (containers only).
    /// A lock of its own: a container is made while `state` is held.
    node_devices: Mutex<HashMap<String, Vec<String>>>,
    options: KubeletOptions,
    /// Pod-bound tokens handed to agents so far.
    tokens_minted: std::sync::atomic::AtomicUsize,
}

/// How the fake kubelet runs agent pods. The default is what [`FakeKubelet::start`] does.
#[derive(Debug, Clone, Default)]
pub struct KubeletOptions {
    /// Give each agent its pod's own identity instead of the admin kubeconfig: a token for the
    /// pod's `serviceAccountName`, bound to the pod, from the TokenRequest API (what a real
    /// kubelet mounts as the projected service-account token), so the agent runs with exactly
    /// the rights of its service account and its token names the node it runs on.
    pub pod_tokens: bool,
    /// Run each agent pod as a real OCI container under runc ([`crate::runc`]), from the pod
    /// spec the operator wrote, instead of as a local process of the agent binary.
    pub runtime: Option<Arc<crate::runc::Runtime>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

/// Runs gpuval agent pods as local processes. Dropping it kills every process it started.
pub struct FakeKubelet {
    shared: Arc<Shared>,
    watch: JoinHandle<()>,
    /// Node name → the PodResources API served for agents on that node.
    pod_resources: Mutex<HashMap<String, PodResourcesServer>>,
}

impl FakeKubelet {
    /// Starts watching agent pods in `namespace` (must be called inside a tokio runtime).
    /// `agent_binary` is run as `<agent_binary> k8s` with `KUBECONFIG=<kubeconfig>`; see
    /// [`agent_binary`] for the usual path.
    pub fn start(
        client: Client,
        kubeconfig: PathBuf,
        agent_binary: PathBuf,
        namespace: String,
    ) -> FakeKubelet {
        Self::start_with(
            client,
            kubeconfig,
            agent_binary,
            namespace,
            KubeletOptions::default(),
        )
    }

    /// [`start`](Self::start) with [`KubeletOptions`].
    pub fn start_with(
        client: Client,
        kubeconfig: PathBuf,
        agent_binary: PathBuf,
        namespace: String,
        options: KubeletOptions,
    ) -> FakeKubelet {
        let log_dir = tempfile::Builder::new()
            .prefix("gpuval-kubelet-")
            .tempdir()
            .map_err(|e| format!("could not create a log directory: {e}"));
        if let Err(e) = &log_dir {
            tracing::warn!(error = %e, "agent output will be discarded");
        }
        let shared = Arc::new(Shared {
            client,
            kubeconfig,
            agent_binary,
            namespace,
            log_dir,
            state: Mutex::new(State::default()),
            node_devices: Mutex::new(HashMap::new()),
            options,
            tokens_minted: std::sync::atomic::AtomicUsize::new(0),
        });
        let watch = tokio::spawn(watch_pods(shared.clone()));
        FakeKubelet {
            shared,
            watch,
            pod_resources: Mutex::new(HashMap::new()),
        }
    }

    /// A handle that kills and lists agents from another task ([`KubeletHandle`]).
    pub fn handle(&self) -> KubeletHandle {
        KubeletHandle {
            shared: self.shared.clone(),
        }
    }

    /// SIGKILLs the agent process of pod `pod_name` (a crash). False when no process of that
    /// pod is running.
    pub fn kill(&self, pod_name: &str) -> bool {
        self.handle().kill(pod_name)
    }

    /// Sets an environment variable for every agent started on `node` from now on, overriding
    /// the pod's own (for example `GPUVAL_SIMULATE` with a fault for that node's GPUs).
    pub fn set_node_env(&self, node: &str, key: &str, value: &str) {
        let mut st = self.shared.state();
        let env = st.node_env.entry(node.to_string()).or_default();
        env.retain(|(k, _)| k != key);
        env.push((key.to_string(), value.to_string()));
    }

    /// Serves the kubelet's PodResources API for agents started on `node` from now on (the
    /// socket the operator mounts where the administrator opts in, `agent.podResources`),
    /// answering that `held` is held; a later call changes the answer.
    pub fn serve_pod_resources(&self, node: &str, held: Vec<Held>) {
        let mut servers = self.pod_resources.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = servers.get(node) {
            s.set(held);
            return;
        }
        let dir = match &self.shared.log_dir {
            Ok(d) => d.path().to_path_buf(),
            Err(e) => panic!("no directory for the PodResources socket: {e}"),
        };
        let socket = dir.join(format!("pod-resources-{node}.sock"));
        let server = PodResourcesServer::start(&socket)
            .unwrap_or_else(|e| panic!("serve PodResources on {}: {e}", socket.display()));
        server.set(held);
        let path = server.socket().display().to_string();
        self.set_node_env(node, gpuval_crds::agent_env::POD_RESOURCES_SOCKET, &path);
        servers.insert(node.to_string(), server);
    }

    /// Gives containers on `node` the CDI devices `names` (`0`, `1`) only, where one host is
    /// registered as several nodes: each pod sees its node's share of the GPUs, never another's.
    pub fn set_node_devices(&self, node: &str, names: Vec<String>) {
        self.shared
            .node_devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.to_string(), names);
    }

    /// Names of the pods whose processes were started so far, in order.
    pub fn started(&self) -> Vec<String> {
        self.shared.state().started.clone()
    }

    /// Names of the pods whose processes are running now.
    pub fn running(&self) -> Vec<String> {
        self.handle().running()
    }

    /// stdout and stderr of the latest process of pod `pod_name` (empty when none ran).
    pub fn logs(&self, pod_name: &str) -> String {
        let path = {
            let st = self.shared.state();
            st.by_name
                .get(pod_name)
                .and_then(|uid| st.pods.get(uid))
                .and_then(|e| e.log.clone())
        };
        match path {
            Some(p) => std::fs::read_to_string(&p)
                .unwrap_or_else(|e| format!("(could not read {}: {e})", p.display())),
            None => String::new(),
        }
    }

    /// How many pod-bound tokens were handed to agents ([`KubeletOptions::pod_tokens`]).
    pub fn tokens_minted(&self) -> usize {
        self.shared
            .tokens_minted
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Where the per-pod log files are (`<pod>-<uid prefix>.log`).
    pub fn log_dir(&self) -> Option<&Path> {
        self.shared.log_dir.as_ref().ok().map(|d| d.path())
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.watch.abort();
        let st = self.shared.state();
        for entry in st.pods.values().filter(|e| e.running) {
            if let Some(tx) = &entry.control {
                let _ = tx.send(Control::Kill);
            }
        }
        // The supervisors may not get to run again (the runtime may be ending): every child is
        // also spawned with kill_on_drop and a parent-death signal. A runc container outlives
        // its `runc run`, so it is removed here.
        if let Some(rt) = &self.shared.options.runtime {
            for id in st.pods.values().filter_map(|e| e.runc_id.as_deref()) {
                rt.delete(id);
            }
        }
    }
}

/// What another task may do to the agents of a [`FakeKubelet`] (it does not keep them running).
#[derive(Clone)]
pub struct KubeletHandle {
    shared: Arc<Shared>,
}

impl KubeletHandle {
    /// SIGKILLs the agent of pod `pod_name` (a crash). False when none of that pod runs.
    pub fn kill(&self, pod_name: &str) -> bool {
        let st = self.shared.state();
        let Some(entry) = st.by_name.get(pod_name).and_then(|uid| st.pods.get(uid)) else {
            return false;
        };
        match (&entry.control, entry.running) {
            (Some(tx), true) => tx.send(Control::Kill).is_ok(),
            _ => false,
        }
    }

    /// Names of the pods whose agents are running now.
    pub fn running(&self) -> Vec<String> {
        let st = self.shared.state();
        let mut names: Vec<_> = st
            .pods
            .values()
            .filter(|e| e.running)
            .map(|e| e.name.clone())
            .collect();
        names.sort();
        names
    }
}

/// `target/debug/gpuval-agent` of this workspace (under `$CARGO_TARGET_DIR` when set), built
/// first so it is never stale; `GPUVAL_AGENT_BIN` names a binary to use as it is instead.
pub fn agent_binary() -> Result<PathBuf, String> {
    crate::binaries::agent_binary()
}

async fn watch_pods(shared: Arc<Shared>) {
    let selector = format!("{}={}", labels::APP_NAME_KEY, labels::AGENT_APP);
    let config = watcher::Config::default().labels(&selector);
    let mut events = std::pin::pin!(watcher(shared.pods(), config).default_backoff());
    // Uids seen during a (re)list: a running pod missing from it was deleted while the watch
    // was down.
    let mut listed: Option<HashSet<String>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(pod)) => {
                if let (Some(seen), Some(uid)) = (listed.as_mut(), pod.metadata.uid.clone()) {
                    seen.insert(uid);
                }
                on_pod(&shared, &pod);
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(seen) = listed.take() {
                    let vanished: Vec<String> = shared
                        .state()
                        .pods
                        .keys()
                        .filter(|uid| !seen.contains(*uid))
                        .cloned()
                        .collect();
                    for uid in vanished {
                        on_gone(&shared, &uid, None);
                    }
                }
            }
            Ok(watcher::Event::Apply(pod)) => on_pod(&shared, &pod),
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    on_gone(&shared, uid, Some(&pod));
                }
            }
            Err(e) => tracing::warn!(error = %e, "fake kubelet: pod watch failed; retrying"),
        }
    }
}

/// The grace period a deleted pod's process gets.
fn grace_of(pod: Option<&Pod>) -> Duration {
    let secs = pod.and_then(|p| {
        p.metadata.deletion_grace_period_seconds.or_else(|| {
            p.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
    });
    let grace = secs.map_or(MAX_GRACE, |s| {
        Duration::from_secs(u64::try_from(s).unwrap_or(0))
    });
    grace.clamp(MIN_GRACE, MAX_GRACE)
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A pod was added or changed.
fn on_pod(shared: &Arc<Shared>, pod: &Pod) {
    let (Some(uid), Some(name)) = (pod.metadata.uid.clone(), pod.metadata.name.clone()) else {
        return;
    };
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();

    let mut st = shared.state();
    if let Some(entry) = st.pods.get_mut(&uid) {
        if deleting {
            if entry.running {
                if !entry.deleting {
                    entry.deleting = true;
                    if let Some(tx) = &entry.control {
                        let _ = tx.send(Control::Terminate {
                            grace: grace_of(Some(pod)),
                        });
                    }
                }
            } else if !entry.delete_sent {
                entry.deleting = true;
                entry.delete_sent = true;
                tokio::spawn(delete_now(shared.clone(), name, uid));
            }
        } else if let Some(t) = entry.terminated.clone()
            && phase != t.phase()
            && entry.reapplied < MAX_REAPPLY
        {
            // Something overwrote the final status: write it again.
            entry.reapplied += 1;
            tracing::info!(pod = %name, phase = %phase, want = t.phase(), "fake kubelet: writing the final status again");
            let body = terminated_status(entry, &t);
            tokio::spawn(write_status(shared.clone(), name, body));
        }
        return;
    }

    if deleting {
        // Bound but never started: a kubelet still has to remove it.
        if bound {
            st.pods.insert(uid.clone(), new_entry(&name, pod, true));
            tokio::spawn(delete_now(shared.clone(), name, uid));
        }
        return;
    }
    if !bound || is_terminal(pod) {
        return;
    }
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let node_env = st.node_env.get(&node).cloned().unwrap_or_default();
    if shared.options.pod_tokens || has_secret_volumes(pod) || has_claims(pod) {
        // The token is minted first (an API call); the entry stands in until the process starts.
        st.by_name.insert(name.clone(), uid.clone());
        st.pods.insert(uid.clone(), new_entry(&name, pod, false));
        tokio::spawn(start_with_pod_token(
            shared.clone(),
            pod.clone(),
            name,
            uid,
            node_env,
        ));
        return;
    }
    let entry = start_pod(shared, pod, &name, &uid, node_env, &shared.kubeconfig);
    st.by_name.insert(name.clone(), uid.clone());
    if entry.running {
        st.started.push(name);
    }
    st.pods.insert(uid, entry);
}

fn new_entry(name: &str, pod: &Pod, delete_sent: bool) -> PodEntry {
    let container = agent_container(pod);
    PodEntry {
        name: name.to_string(),
        container: container.map(|c| c.name.clone()).unwrap_or_default(),
        image: container.and_then(|c| c.image.clone()).unwrap_or_default(),
        container_id: String::new(),
        runc_id: None,
        log: None,
        control: None,
        running: false,
        deleting: delete_sent,
        gone: false,
        terminated: None,
        reapplied: 0,
        delete_sent,
    }
}

/// The container the agent runs in: the one named `agent`, else the first.
fn agent_container(pod: &Pod) -> Option<&Container> {
    let containers = &pod.spec.as_ref()?.containers;
    containers
        .iter()
        .find(|c| c.name == "agent")
        .or_else(|| containers.first())
}

/// The container's environment as a kubelet would give it: plain values and the downward-API
/// fields the agent uses; other sources are ignored.
pub fn container_env(pod: &Pod, container: &Container) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => Some(v.clone()),
            (None, Some(from)) => from.field_ref.as_ref().and_then(|f| {
                match f.field_path.as_str() {
                    "spec.nodeName" => pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                    "metadata.name" => pod.metadata.name.clone(),
                    "metadata.namespace" => pod.metadata.namespace.clone(),
                    "metadata.uid" => pod.metadata.uid.clone(),
                    other => {
                        tracing::debug!(var = %var.name, field = other, "fake kubelet: field not supported; variable left out");
                        None
                    }
                }
            }),
            (None, None) => Some(String::new()),
        };
        if let Some(v) = value {
            out.push((var.name.clone(), v));
        }
    }
    out
}

/// Mints a token for the pod's service account bound to the pod, writes a kubeconfig with it,
/// and starts the pod's process with that kubeconfig (unless the pod went away meanwhile). When
/// no token can be had, the pod fails as a kubelet's would when its token volume cannot be set
/// up.
async fn start_with_pod_token(
    shared: Arc<Shared>,
    pod: Pod,
    name: String,
    uid: String,
    node_env: Vec<(String, String)>,
) {
    let minted = if shared.options.pod_tokens {
        pod_kubeconfig(&shared, &pod, &name, &uid).await
    } else {
        Ok(shared.kubeconfig.clone())
    };
    let claimed = claim_env(&shared, &pod, &node_env).await;
    let minted = match (
        minted,
        mount_secrets(&shared, &pod, &name, &uid).await,
        claimed,
    ) {
        (Ok(kubeconfig), Ok(paths), Ok(devices)) => Ok((kubeconfig, paths, devices)),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(e),
    };
    let mut st = shared.state();
    if st
        .pods
        .get(&uid)
        .is_none_or(|e| e.deleting || e.gone || e.terminated.is_some())
    {
        return;
    }
    let entry = match minted {
        Ok((kubeconfig, mounted, devices)) => {
            if shared.options.pod_tokens {
                shared
                    .tokens_minted
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            // The mounted files first: a node's own environment still wins.
            // The claim's devices replace the node's simulated GPU count.
            let replaced: Vec<String> = devices.iter().map(|(k, _)| k.clone()).collect();
            let node_env = node_env.into_iter().filter(|(k, _)| !replaced.contains(k));
            // A container gets the Secret volumes mounted where the pod says: no rewrites.
            let mounted = mounted
                .into_iter()
                .filter(|_| shared.options.runtime.is_none());
            let env = mounted.chain(devices).chain(node_env).collect();
            start_pod(&shared, &pod, &name, &uid, env, &kubeconfig)
        }
        Err(e) => {
            tracing::warn!(pod = %name, error = %e, "fake kubelet: the pod's token or volumes could not be set up");
            let mut entry = new_entry(&name, &pod, false);
            let t = Terminated {
                exit_code: 128,
                reason: "StartError",
                started_at: now(),
                finished_at: now(),
            };
            let body = terminated_status(&entry, &t);
            entry.terminated = Some(t);
            tokio::spawn(write_status(shared.clone(), name.clone(), body));
            entry
        }
    };
    if entry.running {
        st.started.push(name);
    }
    st.pods.insert(uid, entry);
}

fn has_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// The environment a DRA kubelet plugin gives the container of a pod with claims: its
/// allocated GPUs' UUIDs, and (simulated backend) as many GPUs; nothing for a pod without.
/// The node's own simulated spec, where it has one, gets the claim's GPU count too.
async fn claim_env(
    shared: &Shared,
    pod: &Pod,
    node_env: &[(String, String)],
) -> Result<Vec<(String, String)>, String> {
    let Some(uuids) = crate::dra::allocated_uuids(&shared.client, pod).await? else {
        return Ok(Vec::new());
    };
    let sim = gpuval_crds::agent_env::SIMULATE;
    let own = agent_container(pod).map(|c| container_env(pod, c));
    let spec = node_env
        .iter()
        .chain(own.iter().flatten())
        .find(|(k, _)| k == sim)
        .map(|(_, v)| v.clone());
    let mut env = vec![("NVIDIA_VISIBLE_DEVICES".to_string(), uuids.join(","))];
    if let Some(spec) = spec {
        env.push((
            sim.to_string(),
            crate::dra::with_sim_gpus(&spec, uuids.len()),
        ));
    }
    Ok(env)
}

fn has_secret_volumes(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.secret.is_some())
}

/// Writes the keys of the pod's secret volumes as files under the pod's directory; the agent
/// container's environment values that name a path under such a volume's mount path, pointed at
/// those files.
async fn mount_secrets(
    shared: &Shared,
    pod: &Pod,
    name: &str,
    uid: &str,
) -> Result<Vec<(String, String)>, String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Vec::new());
    };
    let Some(container) = agent_container(pod) else {
        return Ok(Vec::new());
    };
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(shared.client.clone(), &shared.namespace);
    let mut out = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        let Some(secret_name) = volume.secret.as_ref().and_then(|s| s.secret_name.clone()) else {
            continue;
        };
        let secret = secrets
            .get(&secret_name)
            .await
            .map_err(|e| format!("mount Secret {secret_name}: {e}"))?;
        let dir = shared
            .log_dir
            .as_ref()
            .map_err(|e| format!("no directory for the pod's volumes: {e}"))?
            .path()
            .join(format!(
                "{name}-{}",
                uid.chars().take(8).collect::<String>()
            ))
            .join(&volume.name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        for (key, bytes) in secret.data.iter().flatten() {
            let path = dir.join(key);
            std::fs::write(&path, &bytes.0)
                .map_err(|e| format!("write {}: {e}", path.display()))?;
        }
        let mounts = container.volume_mounts.iter().flatten();
        for mount in mounts.filter(|m| m.name == volume.name) {
            let prefix = format!("{}/", mount.mount_path.trim_end_matches('/'));
            for (var, value) in container_env(pod, container) {
                if let Some(rest) = value.strip_prefix(&prefix) {
                    out.push((var, dir.join(rest).display().to_string()));
                }
            }
        }
    }
    Ok(out)
}

/// A kubeconfig file holding a token for the pod's service account, bound to the pod.
async fn pod_kubeconfig(
    shared: &Shared,
    pod: &Pod,
    name: &str,
    uid: &str,
) -> Result<PathBuf, String> {
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let bound = crate::auth::BoundPod {
        name: name.to_string(),
        uid: uid.to_string(),
    };
    let token = crate::auth::request_token(&shared.client, &shared.namespace, &sa, Some(&bound))
        .await
        .map_err(|e| format!("TokenRequest for service account {sa}: {e}"))?;
    let server = crate::auth::server_of(&shared.kubeconfig)?;
    let dir = shared
        .log_dir
        .as_ref()
        .map_err(|e| format!("no directory for the pod's kubeconfig: {e}"))?;
    let short_uid: String = uid.chars().take(8).collect();
    let path = dir.path().join(format!("{name}-{short_uid}.kubeconfig"));
    std::fs::write(&path, crate::auth::token_kubeconfig(&server, &token))
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(path)
}

/// Starts the pod's process and its supervisor; on failure, the pod is marked Failed.
fn start_pod(
    shared: &Arc<Shared>,
    pod: &Pod,
    name: &str,
    uid: &str,
    node_env: Vec<(String, String)>,
    kubeconfig: &Path,
) -> PodEntry {
    let mut entry = new_entry(name, pod, false);
    let started_at = now();
    let Some(container) = agent_container(pod) else {
        let t = Terminated {
            exit_code: 128,
            reason: "StartError",
            started_at: started_at.clone(),
            finished_at: started_at,
        };
        tracing::warn!(pod = %name, "fake kubelet: pod has no container");
        entry.terminated = Some(t);
        return entry;
    };

    let log = shared.log_dir.as_ref().ok().map(|d| {
        let short_uid: String = uid.chars().take(8).collect();
        d.path().join(format!("{name}-{short_uid}.log"))
    });
    let (stdout, stderr) = match log.as_ref().map(|p| open_log(p)) {
        Some(Ok((o, e))) => (o, e),
        Some(Err(e)) => {
            tracing::warn!(pod = %name, error = %e, "fake kubelet: no log file; output discarded");
            (Stdio::null(), Stdio::null())
        }
        None => (Stdio::null(), Stdio::null()),
    };
    entry.log = log;

    let (mut cmd, runc) = match &shared.options.runtime {
        Some(rt) => {
            match container_command(shared, rt, pod, container, uid, node_env, kubeconfig) {
                Ok((cmd, id)) => (cmd, Some((rt.clone(), id))),
                Err(e) => {
                    tracing::warn!(pod = %name, error = %e, "fake kubelet: could not create the container");
                    return start_error(shared, entry, name, started_at);
                }
            }
        }
        None => (
            process_command(shared, pod, container, node_env, kubeconfig),
            None,
        ),
    };
    cmd.stdout(stdout).stderr(stderr).kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; the child gets SIGKILL if this thread dies, so no
    // agent outlives a test process that is killed outright.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(pod = %name, binary = %shared.agent_binary.display(), error = %e, "fake kubelet: could not start the agent");
            return start_error(shared, entry, name, started_at);
        }
    };
    let pid = child.id().unwrap_or(0);
    tracing::info!(pod = %name, pid, runc = ?runc.as_ref().map(|(_, id)| id), "fake kubelet: agent started");
    entry.container_id = match &runc {
        Some((_, id)) => format!("runc://{id}"),
        None => format!("fake://{pid}"),
    };
    entry.runc_id = runc.as_ref().map(|(_, id)| id.clone());
    let (tx, rx) = mpsc::unbounded_channel();
    entry.control = Some(tx);
    entry.running = true;
    let running = running_status(&entry, &started_at);
    tokio::spawn(supervise(
        shared.clone(),
        name.to_string(),
        uid.to_string(),
        Running { child, runc },
        rx,
        started_at,
        running,
    ));
    entry
}

/// The pod's container could not be created or started: Failed with `StartError`, as a
/// kubelet reports it.
fn start_error(
    shared: &Arc<Shared>,
    mut entry: PodEntry,
    name: &str,
    started_at: Time,
) -> PodEntry {
    let t = Terminated {
        exit_code: 128,
        reason: "StartError",
        started_at,
        finished_at: now(),
    };
    let body = terminated_status(&entry, &t);
    entry.terminated = Some(t);
    tokio::spawn(write_status(shared.clone(), name.to_string(), body));
    entry
}

/// The agent as a local process: `<agent> k8s` with the pod's environment and the kubeconfig.
fn process_command(
    shared: &Shared,
    pod: &Pod,
    container: &Container,
    node_env: Vec<(String, String)>,
    kubeconfig: &Path,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&shared.agent_binary);
    cmd.arg("k8s")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .envs(container_env(pod, container))
        .envs(node_env)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null());
    if let Ok(dir) = &shared.log_dir {
        cmd.current_dir(dir.path());
    }
    cmd
}

/// The agent as a runc container made from its pod ([`crate::runc`]): the bundle in the pod's
/// own directory, its Secret volumes from the files [`mount_secrets`] wrote there.
fn container_command(
    shared: &Shared,
    rt: &crate::runc::Runtime,
    pod: &Pod,
    container: &Container,
    uid: &str,
    node_env: Vec<(String, String)>,
    kubeconfig: &Path,
) -> Result<(tokio::process::Command, String), String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let pod_dir = shared
        .log_dir
        .as_ref()
        .map_err(|e| format!("no directory for the pod: {e}"))?
        .path()
        .join(format!(
            "{name}-{}",
            uid.chars().take(8).collect::<String>()
        ));
    let secrets = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| v.secret.is_some())
        .map(|v| (v.name.clone(), pod_dir.join(&v.name)))
        .collect();
    let env = std::iter::once(("RUST_LOG".to_string(), "info".to_string()))
        .chain(container_env(pod, container))
        .chain(node_env)
        .collect();
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let share = shared
        .node_devices
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&node)
        .cloned();
    let inputs = crate::runc::Inputs {
        env,
        secrets: &secrets,
        kubeconfig,
        share: share.as_deref(),
    };
    let prepared = rt.prepare(pod, container, &pod_dir.join("bundle"), inputs)?;
    tracing::info!(pod = %name, devices = ?prepared.devices, bundle = %prepared.bundle.display(), "fake kubelet: runc container");
    Ok((rt.run_command(&prepared), prepared.id))
}

fn open_log(path: &Path) -> std::io::Result<(Stdio, Stdio)> {
    let out = std::fs::File::create(path)?;
    let err = out.try_clone()?;
    Ok((Stdio::from(out), Stdio::from(err)))
}

/// Marks the pod Running, waits for its process (acting on kill and terminate requests),
/// writes the final status, and removes the pod when it is being deleted.
async fn supervise(
    shared: Arc<Shared>,
    name: String,
    uid: String,
    mut run: Running,
    mut control: mpsc::UnboundedReceiver<Control>,
    started_at: Time,
    running: Value,
) {
    write_status(shared.clone(), name.clone(), running).await;
    let status = loop {
        tokio::select! {
            s = run.child.wait() => break s,
            Some(c) = control.recv() => match c {
                Control::Kill => {
                    tracing::info!(pod = %name, "fake kubelet: SIGKILL (crash)");
                    run.kill();
                }
                Control::Terminate { grace } => {
                    tracing::info!(pod = %name, grace_s = grace.as_secs(), "fake kubelet: pod deleted; SIGTERM");
                    break terminate(&mut run, &mut control, grace).await;
                }
            },
        }
    };
    if let Some((rt, id)) = &run.runc {
        rt.delete(id);
    }
    let exit_code = match &status {
        Ok(s) => exit_code(s),
        Err(e) => {
            tracing::warn!(pod = %name, error = %e, "fake kubelet: could not wait for the agent");
            137
        }
    };
    let t = Terminated {
        exit_code,
        reason: if exit_code == 0 { "Completed" } else { "Error" },
        started_at,
        finished_at: now(),
    };
    tracing::info!(pod = %name, exit_code, phase = t.phase(), "fake kubelet: agent exited");

    let (body, deleting, gone) = {
        let mut st = shared.state();
        let Some(entry) = st.pods.get_mut(&uid) else {
            return;
        };
        entry.running = false;
        entry.control = None;
        let body = terminated_status(entry, &t);
        entry.terminated = Some(t);
        let deleting = entry.deleting && !entry.gone;
        if deleting {
            entry.delete_sent = true;
        }
        (body, deleting, entry.gone)
    };
    if !gone {
        write_status(shared.clone(), name.clone(), body).await;
    }
    if deleting {
        delete_now(shared, name, uid).await;
    }
}

/// A pod's running agent: its process, or the `runc run` of its container.
struct Running {
    child: tokio::process::Child,
    runc: Option<(Arc<crate::runc::Runtime>, String)>,
}

impl Running {
    /// SIGKILL to the agent: to every process of its container under runc (killing `runc
    /// run` itself would leave the container running).
    fn kill(&mut self) {
        match &self.runc {
            Some((rt, id)) => rt.kill(id, "KILL"),
            None => {
                let _ = self.child.start_kill();
            }
        }
    }

    fn term(&mut self) {
        if let Some((rt, id)) = &self.runc {
            rt.kill(id, "TERM");
            return;
        }
        if let Some(pid) = self.child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: plain kill(2) on our own child, which is not reaped yet (we hold it), so
            // the pid cannot have been reused.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}

/// SIGTERM, then SIGKILL once `grace` is over (or at once on a kill request).
async fn terminate(
    run: &mut Running,
    control: &mut mpsc::UnboundedReceiver<Control>,
    grace: Duration,
) -> std::io::Result<ExitStatus> {
    run.term();
    tokio::select! {
        s = run.child.wait() => return s,
        () = tokio::time::sleep(grace) => {}
        // A non-kill message (or a closed channel) only disables this branch.
        Some(Control::Kill) = control.recv() => {}
    }
    run.kill();
    run.child.wait().await
}

/// The exit code a container runtime reports: the code, or 128 + the signal.
fn exit_code(s: &ExitStatus) -> i32 {
    s.code()
        .or_else(|| s.signal().map(|sig| 128 + sig))
        .unwrap_or(255)
}

/// The pod (or its process) is gone from the API.
fn on_gone(shared: &Arc<Shared>, uid: &str, pod: Option<&Pod>) {
    let mut st = shared.state();
    let Some(entry) = st.pods.get_mut(uid) else {
        return;
    };
    entry.gone = true;
    if entry.running && !entry.deleting {
        entry.deleting = true;
        if let Some(tx) = &entry.control {
            let _ = tx.send(Control::Terminate {
                grace: grace_of(pod),
            });
        }
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn running_status(entry: &PodEntry, started_at: &Time) -> Value {
    json!({
        "status": {
            "phase": "Running",
            "startTime": started_at,
            // Every pod's process runs on this host: its address is loopback.
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": started_at},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": started_at},
                {"type": "Ready", "status": "True", "lastTransitionTime": started_at},
            ],
            "containerStatuses": [{
                "name": entry.container,
                "image": entry.image,
                "imageID": "",
                "containerID": entry.container_id,
                "ready": true,
                "started": true,
                "restartCount": 0,
                "state": {"running": {"startedAt": started_at}},
            }],
        }
    })
}

fn terminated_status(entry: &PodEntry, t: &Terminated) -> Value {
    let reason = if t.exit_code == 0 {
        "PodCompleted"
    } else {
        "PodFailed"
    };
    json!({
        "status": {
            "phase": t.phase(),
            "startTime": t.started_at,
            "conditions": [
                {"type": "ContainersReady", "status": "False", "reason": reason, "lastTransitionTime": t.finished_at},
                {"type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": t.finished_at},
            ],
            "containerStatuses": [{
                "name": entry.container,
                "image": entry.image,
                "imageID": "",
                "containerID": entry.container_id,
                "ready": false,
                "started": false,
                "restartCount": 0,
                "state": {
                    // Strategic merge: null removes the running state.
                    "running": null,
                    "terminated": {
                        "exitCode": t.exit_code,
                        "reason": t.reason,
                        "startedAt": t.started_at,
                        "finishedAt": t.finished_at,
                        "containerID": entry.container_id,
                    },
                },
            }],
        }
    })
}

fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => matches!(s.code, 408 | 409 | 429 | 500..=599),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Strategic-merge-patches the pod's status, retrying transient errors; a pod that is gone
/// is left alone.
async fn write_status(shared: Arc<Shared>, name: String, body: Value) {
    let api = shared.pods();
    let mut pause = Duration::from_millis(100);
    for attempt in 1..=WRITE_ATTEMPTS {
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&body))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.is_not_found() => return,
            Err(e) if attempt < WRITE_ATTEMPTS && is_transient(&e) => {
                tracing::debug!(pod = %name, attempt, error = %e, "fake kubelet: status write failed; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "fake kubelet: could not write the pod status");
                return;
            }
        }
    }
}

/// Removes the pod object at once (what a kubelet does once the containers are stopped).
async fn delete_now(shared: Arc<Shared>, name: String, uid: String) {
    let api = shared.pods();
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let mut pause = Duration::from_millis(100);
    for attempt in 1..=WRITE_ATTEMPTS {
        match api.delete(&name, &dp).await {
            Ok(_) => return,
            // Gone already, or a new pod of that name (uid precondition).
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => return,
            Err(e) if attempt < WRITE_ATTEMPTS && is_transient(&e) => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "fake kubelet: could not remove the pod");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(env: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "agent-1", "namespace": "gpuval-system", "uid": "u-1"},
            "spec": {
                "nodeName": "gpu-1",
                "containers": [{"name": "agent", "image": "gpuval-agent:test", "env": env}],
            },
        }))
        .expect("pod")
    }

    #[test]
    fn env_resolves_values_and_downward_api_fields() {
        let p = pod(json!([
            {"name": "PLAIN", "value": "x"},
            {"name": "EMPTY"},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ]));
        let c = agent_container(&p).expect("container");
        let env = container_env(&p, c);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PLAIN"), Some("x"));
        assert_eq!(get("EMPTY"), Some(""));
        assert_eq!(get("NODE_NAME"), Some("gpu-1"));
        assert_eq!(get("POD_NAME"), Some("agent-1"));
        assert_eq!(get("POD_NAMESPACE"), Some("gpuval-system"));
        assert_eq!(get("POD_UID"), Some("u-1"));
        assert_eq!(get("POD_IP"), None);
        assert_eq!(get("SECRET"), None);
    }

    #[test]
    fn grace_is_bounded() {
        let mut p = pod(json!([]));
        assert_eq!(grace_of(None), MAX_GRACE);
        p.metadata.deletion_grace_period_seconds = Some(0);
        assert_eq!(grace_of(Some(&p)), MIN_GRACE);
        p.metadata.deletion_grace_period_seconds = Some(5);
        assert_eq!(grace_of(Some(&p)), Duration::from_secs(5));
        p.metadata.deletion_grace_period_seconds = Some(3600);
        assert_eq!(grace_of(Some(&p)), MAX_GRACE);
    }

    #[test]
    fn exit_codes_follow_container_runtimes() {
        assert_eq!(exit_code(&ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(&ExitStatus::from_raw(1 << 8)), 1);
        assert_eq!(exit_code(&ExitStatus::from_raw(143 << 8)), 143);
        assert_eq!(exit_code(&ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
