//! `gpu-e2e`: the whole gpuval flow on ONE host with its real GPUs, from `kubectl apply` to a
//! verdict (issue 7). Starts etcd + kube-apiserver (+ kube-controller-manager when its binary is
//! in the tools dir), registers this host as a Node advertising its real `nvidia.com/gpu` count,
//! keeps that Node Ready the way a kubelet does (status + Lease heartbeat), runs the real
//! `gpuval-operator` binary, binds the operator's agent pod to the node (standing in for
//! kube-scheduler, which is not carried to the GPU machine for size) unless `--scheduler` is
//! given, runs the agent for the pod as a local process through [`FakeKubelet`] with the real
//! CUDA backend (or the simulated one with `--backend sim`), applies a validation from a YAML
//! file, waits for its verdict, and writes the validation and every GpuNodeResult as
//! `kubectl get -o yaml` would, plus a short summary, into `--out`.
//!
//! Exit code: 0 the outcome is what `--expect` says (and, for a fault, names the right node,
//! GPU and reason), 1 it is not, 2 the run itself could not be carried out.
//!
//! Tools come from `$GPUVAL_TOOLS_DIR/bin` (or the build script's cache dir): etcd and
//! kube-apiserver are required; kube-controller-manager is used when present.
//!
//!   gpu-e2e --validation bench/e2e/standard.yaml --expect passed --out /tmp/e2e/standard
//!   gpu-e2e --validation bench/e2e/fault-memory.yaml --expect failed \
//!       --hold-gpu-memory 2:0.25 --expect-gpu 2 --expect-reason "another process holds GPU memory" \
//!       --out /tmp/e2e/fault-memory

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures::StreamExt;
use gpuval_crds::conditions::{self, READY, STALLED};
use gpuval_crds::fabric::FabricPhase;
use gpuval_crds::{GPU_RESOURCE, GpuNodeResult, GpuValidation, NodeVerdict, Phase, Verdict};
use gpuval_tests::kubelet::{FakeKubelet, KubeletOptions};
use gpuval_tests::{ControlPlane, Options, Tools};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Field manager of everything this runner applies.
const MANAGER: &str = "gpu-e2e";
/// How often the node's Lease and Ready condition are renewed (a kubelet's default is 10s).
const HEARTBEAT: Duration = Duration::from_secs(10);
/// How long to wait for the operator's /readyz, the helper holding GPU memory, and the
/// controller-manager lifting the node's not-ready taint.
const STEP_TIMEOUT: Duration = Duration::from_secs(90);
/// The default helper that holds part of one GPU's memory: PyTorch allocates
/// `$GPUVAL_HOLD_FRACTION` of GPU `$GPUVAL_HOLD_GPU`'s total memory (NVML order), prints a line
/// starting with `holding`, and keeps it until its stdin closes (the runner ends or kills it).
const DEFAULT_HOLD_COMMAND: &str = r#"exec python3 -u -c '
import os, sys, torch
g = int(os.environ["GPUVAL_HOLD_GPU"]); f = float(os.environ["GPUVAL_HOLD_FRACTION"])
torch.cuda.set_device(g)
free, total = torch.cuda.mem_get_info(g)
x = torch.empty(int(f * total), dtype=torch.uint8, device=f"cuda:{g}")
x.fill_(7); torch.cuda.synchronize()
free2, _ = torch.cuda.mem_get_info(g)
print(f"holding {x.numel() / 2**30:.1f} GiB on GPU{g} ({torch.cuda.get_device_name(g)}); free {free / 2**30:.1f} -> {free2 / 2**30:.1f} of {total / 2**30:.1f} GiB", flush=True)
sys.stdin.read()
'"#;

#[derive(Parser, Debug)]
#[command(
    name = "gpu-e2e",
    about = "gpuval end to end on this host's GPUs: control plane, Node, operator, agent, verdict"
)]
struct Args {
    /// The GpuValidation to apply (YAML, one document).
    #[arg(long, value_name = "FILE")]
    validation: PathBuf,
    /// The outcome this run must reach.
    #[arg(long, value_enum)]
    expect: Expect,
    /// Where the YAML, logs and summary go (created).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Node name (default: this host's name, lower-cased and made a valid node name).
    #[arg(long)]
    node: Option<String>,
    /// GPU backend of the agent: `cuda` (real GPUs) or `sim` (simulated; tests of this runner).
    #[arg(long, value_enum, default_value_t = BackendArg::Cuda)]
    backend: BackendArg,
    /// The simulated machine and its faults with `--backend sim` (GPUVAL_SIMULATE of the agent).
    #[arg(long, default_value = "gpus=4,model=H200,timescale=0.01")]
    simulate: String,
    /// The agent binary (default: `gpuval-agent` beside this program).
    #[arg(long, value_name = "PATH")]
    agent_bin: Option<PathBuf>,
    /// The operator binary (default: `gpuval-operator` beside this program).
    #[arg(long, value_name = "PATH")]
    operator_bin: Option<PathBuf>,
    /// Fault: hold FRACTION (0-1) of GPU's total memory in another process during the run.
    #[arg(long, value_name = "GPU:FRACTION")]
    hold_gpu_memory: Option<String>,
    /// Shell command that holds the memory (gets GPUVAL_HOLD_GPU, GPUVAL_HOLD_FRACTION; must
    /// print a line starting with `holding` once it holds it, and exit when stdin closes).
    #[arg(long, default_value = DEFAULT_HOLD_COMMAND, hide_default_value = true)]
    hold_command: String,
    /// With `--expect failed`: the GPUs that must fail (`2`, `1,3` or `all`); the others must not.
    #[arg(long, value_name = "LIST")]
    expect_gpu: Option<String>,
    /// With `--expect failed`: text every failing GPU's reason must contain.
    #[arg(long, value_name = "TEXT")]
    expect_reason: Option<String>,
    /// Seconds from applying the validation to its verdict before the run counts as failed.
    #[arg(long, default_value_t = 420)]
    timeout: u64,
    /// Start kube-scheduler (from the tools dir) to bind the agent pod instead of binding it here.
    #[arg(long)]
    scheduler: bool,
    /// Do not start kube-controller-manager even when its binary is in the tools dir.
    #[arg(long)]
    no_controller_manager: bool,
    /// The CRDs to install (relative to the working directory).
    #[arg(long, default_value = "deploy/crds/gpuval.io.yaml")]
    crds: PathBuf,
    /// Namespace of the operator, agent pods and results.
    #[arg(long, default_value = "gpuval-system")]
    namespace: String,
    /// Variables of this process passed on to the agent when set (the fake kubelet starts it
    /// with a clean environment); repeatable.
    #[arg(
        long = "pass-env",
        value_name = "NAME",
        default_values = ["HOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "GPUVAL_REQUIRE_NVRTC", "GPUVAL_CAPTURE_DIR"]
    )]
    pass_env: Vec<String>,
    /// Register this host as N Nodes with its GPUs divided between them, each node's agent
    /// seeing its share through CUDA_VISIBLE_DEVICES: the fabric test across "nodes" of one host.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    split: u32,
    /// Extra environment of split node I's agent (`I:NAME=VALUE`, repeatable): a fault planted
    /// on one node.
    #[arg(long = "node-env", value_name = "I:NAME=VALUE")]
    node_env: Vec<String>,
    /// With `--expect failed` and `--split`: the split node (0-based) that must be named at
    /// fault; the others must not fail.
    #[arg(long, value_name = "I")]
    expect_node: Option<u32>,
    /// Run each agent pod as an OCI container under this runc, made from the pod spec the
    /// operator wrote (needs `--image` and `--cdi`), instead of as a local process.
    #[arg(long, value_name = "PATH", requires_all = ["image", "cdi"])]
    runc: Option<PathBuf>,
    /// The agent image for `--runc`: `DIR/rootfs` and `DIR/image.json` (`env`, `entrypoint`,
    /// `uid`, `gid`), as `bench/agent-rootfs.sh` writes them.
    #[arg(long, value_name = "DIR")]
    image: Option<PathBuf>,
    /// The host's GPUs as a CDI spec for `--runc` (`bench/cdi-from-host.sh`).
    #[arg(long, value_name = "FILE")]
    cdi: Option<PathBuf>,
    /// Kill the agent (SIGKILL, its whole container under `--runc`) this many seconds after
    /// it starts: a crash, which must end in Error with no hardware action.
    #[arg(long, value_name = "SECONDS")]
    kill_agent_after: Option<u64>,
    /// Also write the (first) node's stored report, its GpuNodeResult's status, as JSON here:
    /// the shape `gpuval-agent run -o` writes, for the GPU gate's summary.
    #[arg(long, value_name = "FILE")]
    report_json: Option<PathBuf>,
    /// The operator's io host directory (`--io-host-path`, its parent allowed): the io check's
    /// hostPath volume in the agent pod.
    #[arg(long, value_name = "DIR")]
    io_host_path: Option<PathBuf>,
}

/// One registered Node: its name and the host GPUs (NVML indices) its agent sees.
#[derive(Debug, Clone, PartialEq)]
struct Share {
    name: String,
    gpus: Vec<usize>,
}

/// The Nodes this host is registered as: itself, or `split` nodes `NAME-0..` with the GPUs
/// dealt out in order (the count must divide evenly, so every node is alike).
fn shares(node: &str, count: usize, split: u32) -> Result<Vec<Share>, String> {
    let split = split as usize;
    if split == 1 {
        return Ok(vec![Share {
            name: node.to_string(),
            gpus: (0..count).collect(),
        }]);
    }
    if count == 0 || !count.is_multiple_of(split) {
        return Err(format!(
            "--split {split}: this host has {count} GPU(s), which do not divide into {split} equal nodes"
        ));
    }
    let per = count / split;
    Ok((0..split)
        .map(|i| Share {
            name: format!("{node}-{i}"),
            gpus: (i * per..(i + 1) * per).collect(),
        })
        .collect())
}

/// `I:NAME=VALUE` of `--node-env`.
fn parse_node_env(s: &str, split: u32) -> Result<(u32, String, String), String> {
    let bad =
        || format!("--node-env {s:?}: write I:NAME=VALUE, I a node index below --split {split}");
    let (i, kv) = s.split_once(':').ok_or_else(bad)?;
    let (k, v) = kv.split_once('=').ok_or_else(bad)?;
    let i: u32 = i.trim().parse().map_err(|_| bad())?;
    if i >= split || k.is_empty() {
        return Err(bad());
    }
    Ok((i, k.to_string(), v.to_string()))
}

/// The simulator's spec with its `gpus=` key set to `n` (a split node's share).
fn simulate_with_gpus(spec: &str, n: usize) -> String {
    let mut keys: Vec<String> = spec
        .split(',')
        .filter(|k| !k.trim().is_empty() && !k.trim_start().starts_with("gpus="))
        .map(str::to_string)
        .collect();
    keys.insert(0, format!("gpus={n}"));
    keys.join(",")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Expect {
    Passed,
    Failed,
    /// The run ends without a hardware verdict on the node (a busy GPU, a killed agent): its
    /// line is Error with evidence other than Hardware, `--expect-reason` in its message, and
    /// the Node carries no failure mark.
    NoHardwareAction,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Cuda,
    Sim,
}

/// The GPUs a fault must show on.
#[derive(Debug, Clone, PartialEq)]
enum GpuSet {
    All,
    Some(BTreeSet<i32>),
}

impl GpuSet {
    fn parse(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("all") {
            return Ok(GpuSet::All);
        }
        let set = s
            .split(',')
            .map(|p| p.trim().parse::<i32>())
            .collect::<Result<BTreeSet<_>, _>>()
            .map_err(|e| format!("--expect-gpu {s:?}: {e}; write `2`, `1,3` or `all`"))?;
        if set.is_empty() {
            return Err("--expect-gpu is empty".into());
        }
        Ok(GpuSet::Some(set))
    }

    fn contains(&self, gpu: i32) -> bool {
        match self {
            GpuSet::All => true,
            GpuSet::Some(s) => s.contains(&gpu),
        }
    }

    /// The lowest GPU that must fail (node and validation messages name it first).
    fn first(&self) -> i32 {
        match self {
            GpuSet::All => 0,
            GpuSet::Some(s) => s.iter().next().copied().unwrap_or(0),
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn,kube_client=off".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("gpu-e2e: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Prints a progress line with the seconds since the start.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn say(&self, msg: impl AsRef<str>) {
        println!("[{:6.1}s] {}", self.0.elapsed().as_secs_f64(), msg.as_ref());
    }
}

/// What the agent reports about this host's GPUs (`gpuval-agent inventory --json`).
#[derive(Debug, Clone)]
struct HostGpus {
    count: usize,
    product: String,
    memory_mib: u64,
    driver: Option<String>,
    cuda: Option<String>,
}

async fn run(args: Args) -> Result<bool, String> {
    let clock = Clock(Instant::now());
    let gpu_set = args.expect_gpu.as_deref().map(GpuSet::parse).transpose()?;
    let hold = args
        .hold_gpu_memory
        .as_deref()
        .map(parse_hold)
        .transpose()?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("create {}: {e}", args.out.display()))?;
    let validation_doc = read_validation(&args.validation)?;
    let validation_name = validation_doc["metadata"]["name"]
        .as_str()
        .ok_or_else(|| format!("{}: metadata.name is missing", args.validation.display()))?
        .to_string();
    let agent_bin = sibling_binary(args.agent_bin.clone(), "gpuval-agent")?;
    let operator_bin = sibling_binary(args.operator_bin.clone(), "gpuval-operator")?;
    let node = match &args.node {
        Some(n) => node_name(n)?,
        None => node_name(&host_name())?,
    };

    let host = inventory(&agent_bin, &args).await?;
    let shares = shares(&node, host.count, args.split)?;
    for e in &args.node_env {
        parse_node_env(e, args.split)?;
    }
    if args.expect_node.is_some_and(|i| i >= args.split) {
        return Err(format!(
            "--expect-node must be below --split {}",
            args.split
        ));
    }
    clock.say(format!(
        "{} GPU(s) on this host ({}, {} MiB each; driver {}, CUDA {}); backend {}",
        host.count,
        host.product,
        host.memory_mib,
        host.driver.as_deref().unwrap_or("?"),
        host.cuda.as_deref().unwrap_or("?"),
        match args.backend {
            BackendArg::Cuda => "cuda (real GPUs)".to_string(),
            BackendArg::Sim => format!("SIMULATED ({})", args.simulate),
        }
    ));

    // Start the helper that holds GPU memory first: importing PyTorch overlaps the control
    // plane's start.
    let mut holder = match &hold {
        Some((gpu, fraction)) => {
            if *gpu as usize >= host.count {
                return Err(format!(
                    "--hold-gpu-memory names GPU{gpu}, but this host has {} GPU(s)",
                    host.count
                ));
            }
            clock.say(format!(
                "fault: holding {:.0}% of GPU{gpu}'s memory in another process",
                fraction * 100.0
            ));
            Some(Holder::spawn(
                &args.hold_command,
                *gpu,
                *fraction,
                &args.out.join("hold-gpu-memory.log"),
            )?)
        }
        None => None,
    };

    let tools = Tools::locate()?;
    let controller_manager =
        !args.no_controller_manager && tools.path("kube-controller-manager").is_file();
    if args.scheduler {
        tools.require("kube-scheduler")?;
    }
    let cp = ControlPlane::start_with(Options {
        controller_manager,
        scheduler: args.scheduler,
        kwok: false,
        audit_log: false,
        in_cluster: None,
        device_taint_rules: false,
    })
    .await
    .map_err(|e| {
        format!(
            "start the control plane from {}: {e}",
            tools.dir().display()
        )
    })?;
    if !controller_manager {
        clock.say(
            "kube-controller-manager not started (not in the tools dir or --no-controller-manager): \
             the node keeps its not-ready admission taint (harmless: pods are bound directly) and \
             nothing garbage-collects (the control plane is thrown away at the end)",
        );
    }
    let client = cp.client().await.map_err(|e| e.to_string())?;
    let result = scenario(
        &args,
        &clock,
        &cp,
        &client,
        controller_manager,
        &shares,
        &host,
        &operator_bin,
        &agent_bin,
        &mut holder,
        &validation_doc,
        &validation_name,
        gpu_set.as_ref(),
    )
    .await;
    if let Some(h) = holder.as_mut() {
        h.stop().await;
    }
    copy_control_plane_logs(&cp, &args.out.join("logs"));
    let ok = result?;
    clock.say(format!(
        "done: {} ({} s in all)",
        if ok { "PASS" } else { "FAIL" },
        clock.0.elapsed().as_secs()
    ));
    Ok(ok)
}

#[allow(clippy::too_many_arguments)]
async fn scenario(
    args: &Args,
    clock: &Clock,
    cp: &ControlPlane,
    client: &Client,
    controller_manager: bool,
    shares: &[Share],
    host: &HostGpus,
    operator_bin: &Path,
    agent_bin: &Path,
    holder: &mut Option<Holder>,
    validation_doc: &Value,
    validation_name: &str,
    gpu_set: Option<&GpuSet>,
) -> Result<bool, String> {
    let ns = args.namespace.as_str();
    let crds = install_crds(client, &args.crds).await?;
    clock.say(format!("installed CRDs: {}", crds.join(", ")));
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))
        .map_err(|e| format!("namespace object: {e}"))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| format!("create namespace {ns}: {e}"))?;

    let mut _heartbeats = Vec::new();
    for share in shares {
        let node = share.name.as_str();
        let mine = HostGpus {
            count: share.gpus.len(),
            ..host.clone()
        };
        let taints = register_node(client, node, &mine).await?;
        _heartbeats.push(Abort(tokio::spawn(heartbeat(
            client.clone(),
            node.to_string(),
        ))));
        clock.say(format!(
            "registered this host as Node {node} with {GPU_RESOURCE}={} (GPUs {:?}; admission taints: {}); Ready, status and Lease renewed every {}s",
            mine.count,
            share.gpus,
            if taints.is_empty() { "none".to_string() } else { taints.join(", ") },
            HEARTBEAT.as_secs()
        ));
    }
    if controller_manager {
        for share in shares {
            wait_not_ready_taint_lifted(client, &share.name).await?;
        }
        clock.say(
            "kube-controller-manager's node lifecycle controller lifted the not-ready taint: the node(s) are Ready",
        );
    }

    let runtime = container_runtime(args)?;
    if let Some(rt) = &runtime {
        clock.say(format!(
            "agent pods run as OCI containers: {} run, image {} (uid {}), GPUs from the CDI spec {} ({} device(s))",
            rt.runc.display(),
            rt.image.rootfs.display(),
            rt.image.uid,
            args.cdi.as_deref().unwrap_or(Path::new("-")).display(),
            rt.cdi.devices.len()
        ));
    }
    let kubelet = FakeKubelet::start_with(
        client.clone(),
        cp.kubeconfig().to_path_buf(),
        agent_bin.to_path_buf(),
        ns.to_string(),
        KubeletOptions {
            runtime: runtime.map(std::sync::Arc::new),
            ..Default::default()
        },
    );
    for (i, share) in shares.iter().enumerate() {
        node_env(&kubelet, args, share, i as u32)?;
        if args.runc.is_some() && args.split > 1 {
            // Each node's container gets its share of the host's GPUs, as a device plugin
            // allocates them: never another node's.
            kubelet.set_node_devices(
                &share.name,
                share.gpus.iter().map(usize::to_string).collect(),
            );
        }
    }
    let names: Vec<String> = shares.iter().map(|s| s.name.clone()).collect();
    let _binder = if args.scheduler {
        None
    } else {
        clock.say(
            "binding agent pods to the node here (stands in for kube-scheduler, which is not carried to the GPU machine for size)",
        );
        Some(Abort(tokio::spawn(bind_pods(
            client.clone(),
            ns.to_string(),
            names.clone(),
        ))))
    };

    let mut operator = Operator::spawn(
        operator_bin,
        cp.kubeconfig(),
        ns,
        &args.out,
        args.io_host_path.as_deref(),
    )?;
    operator.wait_ready().await?;
    clock.say(format!(
        "gpuval-operator (pid {}) ready; metrics on {}",
        operator.pid, operator.metrics_addr
    ));

    if let Some(h) = holder.as_mut() {
        let line = h.wait_holding().await?;
        clock.say(format!("fault in place: {line}"));
    }

    let api: Api<GpuValidation> = Api::all(client.clone());
    let applied = api
        .patch(
            validation_name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(validation_doc),
        )
        .await
        .map_err(|e| format!("apply {}: {e}", args.validation.display()))?;
    let generation = applied.metadata.generation;
    let applied_at = Instant::now();
    clock.say(format!(
        "$ kubectl apply -f {}  (gpuvalidation/{validation_name} generation {})",
        args.validation.display(),
        generation.unwrap_or(0)
    ));

    let _killer = args.kill_agent_after.map(|secs| {
        let kubelet = kubelet.handle();
        let say = *clock;
        Abort(tokio::spawn(async move {
            let pod = loop {
                if let Some(p) = kubelet.running().into_iter().next() {
                    break p;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            tokio::time::sleep(Duration::from_secs(secs)).await;
            let killed = kubelet.kill(&pod);
            say.say(format!(
                "fault: SIGKILL to the agent of {pod} {secs}s after it started (sent: {killed})"
            ));
        }))
    });
    let wait = await_condition(
        api.clone(),
        validation_name,
        move |g: Option<&GpuValidation>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.phase.is_some_and(Phase::is_terminal) && s.observed_generation == generation
            })
        },
    );
    let verdict = tokio::select! {
        r = tokio::time::timeout(Duration::from_secs(args.timeout), wait) => match r {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("watch gpuvalidation/{validation_name}: {e}")),
            Err(_) => Err(format!("no verdict within {}s of applying the validation", args.timeout)),
        },
        e = operator.exited() => Err(e),
    };
    let to_verdict = applied_at.elapsed().as_secs_f64();
    if verdict.is_ok() {
        clock.say(format!("verdict {to_verdict:.1}s after apply"));
    }

    // The agent exits right after storing its result; let it free the GPUs before this run
    // ends (the next scenario measures free memory at its start).
    let still = if verdict.is_ok() {
        wait_agents_exited(&kubelet, Duration::from_secs(30)).await
    } else {
        Vec::new()
    };
    if !still.is_empty() {
        clock.say(format!(
            "agent(s) still running 30s after the verdict, killed now: {}",
            still.join(", ")
        ));
    }

    // Whatever happened, write what the API holds.
    let written = write_objects(client, ns, validation_name, &args.out).await;
    if let Ok((gv, results)) = &written {
        let evidence = write_evidence(client, ns, gv, results, &args.out).await;
        clock.say(match evidence {
            Ok(n) => format!("evidence written: {n} attestation(s), the public key, junit.xml"),
            Err(e) => format!("evidence not written: {e}"),
        });
    }
    for pod in kubelet.started() {
        let path = args.out.join("logs").join(format!("agent-{pod}.log"));
        write_file(&path, &kubelet.logs(&pod));
    }
    operator.stop().await;
    let (gv, results) = written?;
    if let Some(path) = &args.report_json {
        let report = result_for(&results, &shares[0].name).and_then(|r| r.status.as_ref());
        match report.map(serde_json::to_string_pretty) {
            Some(Ok(text)) => write_file(path, &text),
            Some(Err(e)) => clock.say(format!("the report could not be encoded: {e}")),
            None => clock.say(format!("no stored report of {} to write", shares[0].name)),
        }
    }
    if let Err(e) = verdict {
        let pods = pod_lines(client, ns).await;
        let summary = format!(
            "gpu-e2e {}: ERROR: {e}\nstatus now:\n{}\npods:\n{pods}",
            validation_name,
            serde_saphyr::to_string(&gv.status).unwrap_or_default()
        );
        write_file(&args.out.join("summary.txt"), &summary);
        return Err(summary);
    }

    let mut lines = summarise(&gv, &results, host, args, &names.join(", "), to_verdict);
    let mut ok = true;
    let phase = gv.status.as_ref().and_then(|s| s.phase);
    let want = match args.expect {
        Expect::Passed => Phase::Passed,
        Expect::Failed | Expect::NoHardwareAction => Phase::Failed,
    };
    let phase_ok = phase == Some(want);
    ok &= phase_ok;
    lines.push(format!(
        "{} outcome: phase {phase:?}, expected {want:?}",
        pass_fail(phase_ok)
    ));
    let checks = match (args.expect, args.expect_node) {
        (Expect::Passed, _) => {
            let mut all: Vec<(bool, String)> = shares
                .iter()
                .flat_map(|s| check_passed(&gv, &results, &s.name, s.gpus.len(), args.backend))
                .collect();
            if validation_doc["spec"]["fabric"].is_object() {
                all.extend(check_fabric_passed(&gv, shares.len()));
            }
            all
        }
        (Expect::NoHardwareAction, _) => {
            let node = &shares[0].name;
            let object = Api::<Node>::all(client.clone()).get(node).await.ok();
            check_no_hardware_action(&gv, node, object.as_ref(), args.expect_reason.as_deref())
        }
        (Expect::Failed, Some(i)) => {
            check_fabric_fault(&gv, &names, i as usize, args.expect_reason.as_deref())
        }
        (Expect::Failed, None) => check_fault(
            &gv,
            &results,
            &shares[0].name,
            gpu_set.unwrap_or(&GpuSet::All),
            args.expect_reason.as_deref(),
            host.count,
        ),
    };
    for (good, what) in checks {
        ok &= good;
        lines.push(format!("{} {what}", pass_fail(good)));
    }
    lines.push(format!(
        "RESULT: {}",
        if ok {
            "PASS (the outcome is the expected one)"
        } else {
            "FAIL"
        }
    ));
    let text = lines.join("\n") + "\n";
    print!("{text}");
    write_file(&args.out.join("summary.txt"), &text);
    Ok(ok)
}

/// The environment the fake kubelet gives the agent of `share` (node `index`): the backend, the
/// passed-on variables, its GPU share when the host is split, and `--node-env` faults.
fn node_env(kubelet: &FakeKubelet, args: &Args, share: &Share, index: u32) -> Result<(), String> {
    let node = share.name.as_str();
    match args.backend {
        BackendArg::Cuda => kubelet.set_node_env(node, "GPUVAL_BACKEND", "cuda"),
        BackendArg::Sim if args.split > 1 => kubelet.set_node_env(
            node,
            "GPUVAL_SIMULATE",
            &simulate_with_gpus(&args.simulate, share.gpus.len()),
        ),
        BackendArg::Sim => kubelet.set_node_env(node, "GPUVAL_SIMULATE", &args.simulate),
    }
    for name in &args.pass_env {
        if let Some(v) = std::env::var_os(name) {
            kubelet.set_node_env(node, name, &v.to_string_lossy());
        }
    }
    if args.split > 1 && args.runc.is_none() {
        // A process sees every GPU of the host: its share is chosen by CUDA_VISIBLE_DEVICES
        // (a container gets only its share's device nodes instead). NVML's indices are in PCI
        // bus order; CUDA's default order is fastest first.
        let list: Vec<String> = share.gpus.iter().map(usize::to_string).collect();
        kubelet.set_node_env(node, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
        kubelet.set_node_env(node, "CUDA_VISIBLE_DEVICES", &list.join(","));
    }
    for e in &args.node_env {
        let (i, k, v) = parse_node_env(e, args.split)?;
        if i == index {
            kubelet.set_node_env(node, &k, &v);
        }
    }
    Ok(())
}

/// Waits until the fake kubelet runs no agent process, up to `within`; returns those still running.
async fn wait_agents_exited(kubelet: &FakeKubelet, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let running = kubelet.running();
        if running.is_empty() || Instant::now() > deadline {
            return running;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pass_fail(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

// ---------------------------------------------------------------------------------------------
// Inputs

fn read_validation(path: &Path) -> Result<Value, String> {
    let docs = gpuval_tests::crds::read_yaml_documents(path)?;
    let [doc] = docs.as_slice() else {
        return Err(format!(
            "{}: expected one GpuValidation document, found {}",
            path.display(),
            docs.len()
        ));
    };
    if doc["kind"] != "GpuValidation" {
        return Err(format!(
            "{}: kind is {}, expected GpuValidation",
            path.display(),
            doc["kind"]
        ));
    }
    Ok(doc.clone())
}

/// `2:0.25` → (2, 0.25).
fn parse_hold(s: &str) -> Result<(u32, f64), String> {
    let bad = || format!("--hold-gpu-memory {s:?}: write GPU:FRACTION, e.g. 2:0.25");
    let (g, f) = s.split_once(':').ok_or_else(bad)?;
    let gpu: u32 = g.trim().parse().map_err(|_| bad())?;
    let fraction: f64 = f.trim().parse().map_err(|_| bad())?;
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(format!(
            "--hold-gpu-memory {s:?}: the fraction must be between 0 and 1"
        ));
    }
    Ok((gpu, fraction))
}

/// `explicit`, else `name` in the directory of this program.
fn sibling_binary(explicit: Option<PathBuf>, name: &str) -> Result<PathBuf, String> {
    let path = match explicit {
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|e| format!("find this program's path: {e}"))?
            .with_file_name(name),
    };
    gpuval_tests::binaries::existing_file(path, |p| {
        format!(
            "{name} not found at {}: build it (cargo build --release -p {name}) or pass its path",
            p.display()
        )
    })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "gpu-host".into())
}

/// A lower-case DNS-1123 subdomain made from `raw` (other characters become `-`).
fn node_name(raw: &str) -> Result<String, String> {
    let lowered: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let labels: Vec<String> = lowered
        .split('.')
        .map(|l| l.trim_matches('-').chars().take(63).collect::<String>())
        .map(|l| l.trim_matches('-').to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let name: String = labels.join(".").chars().take(253).collect();
    let name = name.trim_end_matches(['-', '.']).to_string();
    if name.is_empty() {
        Err(format!(
            "{raw:?} gives no valid node name: pass --node NAME"
        ))
    } else {
        Ok(name)
    }
}

/// Runs `gpuval-agent inventory --json` with the chosen backend.
async fn inventory(agent: &Path, args: &Args) -> Result<HostGpus, String> {
    let mut cmd = tokio::process::Command::new(agent);
    cmd.args(["inventory", "--json"]);
    if args.backend == BackendArg::Sim {
        cmd.args(["--simulate", &args.simulate]);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("run {} inventory: {e}", agent.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} inventory --json failed ({}): {}",
            agent.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let inv: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("parse the agent's inventory JSON: {e}"))?;
    let gpus = inv["gpus"].as_array().cloned().unwrap_or_default();
    if gpus.is_empty() {
        return Err("the agent found no GPU on this host".into());
    }
    Ok(HostGpus {
        count: gpus.len(),
        product: gpus[0]["name"].as_str().unwrap_or("unknown").to_string(),
        memory_mib: gpus[0]["memoryTotalBytes"].as_u64().unwrap_or(0) >> 20,
        driver: inv["system"]["driverVersion"].as_str().map(String::from),
        cuda: inv["system"]["cudaDriverVersion"]
            .as_str()
            .map(String::from),
    })
}

// ---------------------------------------------------------------------------------------------
// Cluster setup

/// Applies the CRDs in `path` and waits until each is Established.
async fn install_crds(client: &Client, path: &Path) -> Result<Vec<String>, String> {
    if !path.is_file() {
        return Err(format!(
            "{} not found (run from the repository root, or pass --crds)",
            path.display()
        ));
    }
    gpuval_tests::crds::apply_crds(client, path, MANAGER, STEP_TIMEOUT).await
}

fn first_line_of(path: &str, prefix: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().and_then(|t| {
        t.lines().find_map(|l| {
            l.strip_prefix(prefix)
                .map(|v| v.trim_matches('"').to_string())
        })
    })
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Creates the Node for this host, as a kubelet registers itself, with the labels GPU Feature
/// Discovery puts on a GPU node, then writes its status (capacity, Ready).
/// Returns the taints the API server gave the new node (admission adds
/// `node.kubernetes.io/not-ready:NoSchedule`).
async fn register_node(
    client: &Client,
    node: &str,
    host: &HostGpus,
) -> Result<Vec<String>, String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem_kib = first_line_of("/proc/meminfo", "MemTotal:")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    let product = label_value(&host.product);
    let labels = json!({
        "kubernetes.io/hostname": node,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": host.count.to_string(),
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": host.memory_mib.to_string(),
        "gpuval.io/e2e-host": "true",
    });
    let resources = json!({
        "cpu": cpus.to_string(),
        "memory": format!("{mem_kib}Ki"),
        "pods": "110",
        GPU_RESOURCE: host.count.to_string(),
    });
    let body: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": labels},
        "status": {"capacity": resources, "allocatable": resources},
    }))
    .map_err(|e| format!("node object: {e}"))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let created = nodes
        .create(&PostParams::default(), &body)
        .await
        .map_err(|e| format!("create Node {node}: {e}"))?;
    let taints: Vec<String> = created
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    let kernel = read_trimmed("/proc/sys/kernel/osrelease");
    let os_image =
        first_line_of("/etc/os-release", "PRETTY_NAME=").unwrap_or_else(|| "Linux".into());
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": node},
        ],
        "nodeInfo": {
            "machineID": read_trimmed("/etc/machine-id"),
            "systemUUID": "",
            "bootID": read_trimmed("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": kernel,
            "osImage": os_image,
            "containerRuntimeVersion": "gpuval-fake-kubelet://local-processes",
            "kubeletVersion": "v0.0.0-gpu-e2e",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": std::env::consts::ARCH.replace("x86_64", "amd64"),
        },
        "conditions": node_conditions(),
    }});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| format!("write the status of Node {node}: {e}"))?;
    renew_lease(client, node).await?;
    Ok(taints)
}

/// `raw` as a label value: spaces and other characters become `-` (GPU Feature Discovery writes
/// `NVIDIA-H200`), at most 63 characters, alphanumeric at both ends.
fn label_value(raw: &str) -> String {
    let v: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// A kubelet's node conditions: Ready, no pressure; the heartbeat time is now.
fn node_conditions() -> Value {
    let now = Timestamp::now().to_string();
    let cond = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    // The conditions never change (Ready from the start): the heartbeat sends them without
    // lastTransitionTime, so the first one stays.
    json!([
        cond(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "gpu-e2e: no memory pressure"
        ),
        cond(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "gpu-e2e: no disk pressure"
        ),
        cond(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "gpu-e2e: no PID pressure"
        ),
        cond(
            "Ready",
            "True",
            "KubeletReady",
            "gpu-e2e keeps this host's Node Ready (it runs agent pods as local processes)"
        ),
    ])
}

/// Creates or renews the node's Lease in kube-node-lease, as a kubelet does.
async fn renew_lease(client: &Client, node: &str) -> Result<(), String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            namespace: Some("kube-node-lease".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    let mut body = serde_json::to_value(&lease).map_err(|e| format!("lease object: {e}"))?;
    body["apiVersion"] = json!("coordination.k8s.io/v1");
    body["kind"] = json!("Lease");
    api.patch(
        node,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| format!("renew Lease kube-node-lease/{node}: {e}"))?;
    Ok(())
}

/// Renews the Lease and the Ready condition's heartbeat every [`HEARTBEAT`] (a kubelet's job),
/// so kube-controller-manager's node lifecycle controller never sees the node as unreachable.
async fn heartbeat(client: Client, node: String) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = renew_lease(&client, &node).await {
            tracing::warn!(error = %e, "heartbeat: lease not renewed");
        }
        let mut conds = node_conditions();
        if let Some(list) = conds.as_array_mut() {
            for c in list {
                if let Some(o) = c.as_object_mut() {
                    o.remove("lastTransitionTime");
                }
            }
        }
        // Strategic merge on `type`: only the heartbeat times change.
        let body = json!({"status": {"conditions": conds}});
        if let Err(e) = nodes
            .patch_status(&node, &PatchParams::default(), &Patch::Strategic(&body))
            .await
        {
            tracing::warn!(error = %e, "heartbeat: node status not written");
        }
    }
}

/// Waits (watching) until the node has no `node.kubernetes.io/not-ready` taint: the admission
/// plugin adds it to new nodes and the node lifecycle controller lifts it once the node is Ready.
async fn wait_not_ready_taint_lifted(client: &Client, node: &str) -> Result<(), String> {
    let api: Api<Node> = Api::all(client.clone());
    let lifted = await_condition(api, node, |n: Option<&Node>| {
        n.is_some_and(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key.starts_with("node.kubernetes.io/")))
        })
    });
    tokio::time::timeout(STEP_TIMEOUT, lifted)
        .await
        .map_err(|_| {
            format!(
                "Node {node} still has a node.kubernetes.io/ taint after {}s: kube-controller-manager's \
                 node lifecycle controller does not see it Ready (see logs/kube-controller-manager.log)",
                STEP_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("watch Node {node}: {e}"))?;
    Ok(())
}

/// The node an agent pod is pinned to: its node affinity's `matchFields metadata.name In [..]`.
fn pinned_nodes(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|sel| {
            sel.node_selector_terms
                .iter()
                .flat_map(|t| t.match_fields.iter().flatten())
                .filter(|r| r.key == "metadata.name" && r.operator == "In")
                .flat_map(|r| r.values.iter().flatten().cloned())
                .collect()
        })
        .unwrap_or_default()
}

/// Binds every unbound agent pod pinned to `node` through the pods/binding subresource. This
/// stands in for kube-scheduler, which is not carried to the GPU machine (size): the operator
/// pins each agent pod to its node with node affinity, so the scheduler's only choice is that
/// node anyway.
async fn bind_pods(client: Client, ns: String, nodes: Vec<String>) {
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let selector = format!(
        "{}={}",
        gpuval_crds::labels::APP_NAME_KEY,
        gpuval_crds::labels::AGENT_APP
    );
    let mut bound: BTreeSet<String> = BTreeSet::new();
    let mut events = std::pin::pin!(
        watcher(pods.clone(), watcher::Config::default().labels(&selector))
            .default_backoff()
            .applied_objects()
    );
    while let Some(ev) = events.next().await {
        let pod = match ev {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "binder: pod watch failed; retrying");
                continue;
            }
        };
        let uid = pod.uid().unwrap_or_default();
        let unbound = pod
            .spec
            .as_ref()
            .is_some_and(|s| s.node_name.as_deref().is_none_or(str::is_empty));
        if !unbound || pod.metadata.deletion_timestamp.is_some() || bound.contains(&uid) {
            continue;
        }
        let targets = pinned_nodes(&pod);
        let Some(node) = (if targets.is_empty() {
            nodes.first()
        } else {
            nodes.iter().find(|n| targets.contains(n))
        }) else {
            continue;
        };
        let name = pod.name_any();
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        match pods
            .create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
            .await
        {
            Ok(_) => {
                bound.insert(uid);
                println!("binder: pod {ns}/{name} bound to node {node}");
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                bound.insert(uid);
            }
            Err(e) => tracing::warn!(pod = %name, error = %e, "binder: could not bind the pod"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

/// Aborts a background task when dropped.
struct Abort(tokio::task::JoinHandle<()>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn pdeathsig(cmd: &mut tokio::process::Command) {
    // SAFETY: prctl is async-signal-safe; the child gets SIGKILL if this process dies, so
    // nothing outlives a runner that is killed outright.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

fn log_file(path: &Path) -> Result<(Stdio, Stdio), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let f = std::fs::File::create(path).map_err(|e| format!("create {}: {e}", path.display()))?;
    let g = f
        .try_clone()
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    Ok((Stdio::from(f), Stdio::from(g)))
}

/// SIGTERM, then SIGKILL after `grace`.
async fn terminate(child: &mut tokio::process::Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: plain kill(2) on our own child, not reaped yet (we hold it).
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

/// The real `gpuval-operator` binary as a process, as it runs in its Deployment.
struct Operator {
    child: tokio::process::Child,
    pid: u32,
    metrics_addr: String,
    log: PathBuf,
}

impl Operator {
    fn spawn(
        bin: &Path,
        kubeconfig: &Path,
        ns: &str,
        out: &Path,
        io_host_path: Option<&Path>,
    ) -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("find a free port: {e}"))?
            .port();
        let metrics_addr = format!("127.0.0.1:{port}");
        let log = out.join("logs").join("gpuval-operator.log");
        let (o, e) = log_file(&log)?;
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args([
            "--namespace",
            ns,
            // Any image name: the fake kubelet runs the local agent binary for the pod.
            "--agent-image",
            "gpuval-agent:local-binary",
            "--metrics-addr",
            &metrics_addr,
            "--log-format",
            "text",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        .args(io_host_path.into_iter().flat_map(|p| {
            let parent = p.parent().unwrap_or(p);
            [
                "--io-host-path".into(),
                p.as_os_str().to_owned(),
                "--io-allowed-path".into(),
                parent.as_os_str().to_owned(),
            ]
        }))
        .stdin(Stdio::null())
        .stdout(o)
        .stderr(e)
        .kill_on_drop(true);
        pdeathsig(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let pid = child.id().unwrap_or(0);
        Ok(Self {
            child,
            pid,
            metrics_addr,
            log,
        })
    }

    fn exit_error(&self, status: std::process::ExitStatus) -> String {
        format!(
            "gpuval-operator exited ({status}); last log lines:\n{}",
            tail(&self.log, 20)
        )
    }

    /// Polls /readyz until it answers 200 (caches filled), the process exits, or time is up.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.exit_error(status));
            }
            if http_status(&self.metrics_addr, "/readyz").await == Some(200) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "gpuval-operator not ready within {}s; last log lines:\n{}",
                    STEP_TIMEOUT.as_secs(),
                    tail(&self.log, 20)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Resolves (with the reason) if the operator exits.
    async fn exited(&mut self) -> String {
        match self.child.wait().await {
            Ok(status) => self.exit_error(status),
            Err(e) => format!("wait for gpuval-operator: {e}"),
        }
    }

    async fn stop(&mut self) {
        terminate(&mut self.child, Duration::from_secs(10)).await;
    }
}

/// The HTTP status of `GET path` on `addr`, or None when it cannot be had.
async fn http_status(addr: &str, path: &str) -> Option<u16> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// The helper process that holds part of one GPU's memory (the planted fault).
struct Holder {
    child: tokio::process::Child,
    stdout: Option<tokio::io::Lines<BufReader<tokio::process::ChildStdout>>>,
    log: PathBuf,
}

impl Holder {
    fn spawn(command: &str, gpu: u32, fraction: f64, log: &Path) -> Result<Self, String> {
        // Its stderr and the stdout lines read below both go to `log`, appended.
        std::fs::File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let err = std::fs::OpenOptions::new()
            .append(true)
            .open(log)
            .map_err(|e| format!("open {}: {e}", log.display()))?;
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", command])
            .env("GPUVAL_HOLD_GPU", gpu.to_string())
            .env("GPUVAL_HOLD_FRACTION", fraction.to_string())
            // CUDA numbers GPUs like NVML (PCI bus order), as the agent's GPU indices do.
            .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        pdeathsig(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("start the GPU memory holder: {e}"))?;
        let stdout = child.stdout.take().map(|o| BufReader::new(o).lines());
        Ok(Self {
            child,
            stdout,
            log: log.to_path_buf(),
        })
    }

    /// Waits until the helper prints its `holding ...` line (it holds the memory from then on).
    async fn wait_holding(&mut self) -> Result<String, String> {
        let Some(lines) = self.stdout.as_mut() else {
            return Err("the GPU memory holder has no stdout".into());
        };
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, lines.next_line()).await {
                Err(_) => {
                    return Err(format!(
                        "the GPU memory holder printed no `holding` line within {}s; its stderr:\n{}",
                        STEP_TIMEOUT.as_secs(),
                        tail(&self.log, 15)
                    ));
                }
                Ok(Ok(Some(line))) => {
                    let mut f = std::fs::OpenOptions::new()
                        .append(true)
                        .open(&self.log)
                        .ok();
                    if let Some(f) = f.as_mut() {
                        let _ = writeln!(f, "{line}");
                    }
                    if line.starts_with("holding") {
                        return Ok(line);
                    }
                }
                Ok(Ok(None)) | Ok(Err(_)) => {
                    let status = self.child.wait().await.map(|s| s.to_string());
                    return Err(format!(
                        "the GPU memory holder ended before it held the memory ({}); its stderr:\n{}",
                        status.unwrap_or_else(|e| e.to_string()),
                        tail(&self.log, 15)
                    ));
                }
            }
        }
    }

    /// Closes its stdin (it exits and frees the memory), SIGTERM/SIGKILL if it does not.
    async fn stop(&mut self) {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            terminate(&mut self.child, Duration::from_secs(5)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Output

fn write_file(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("gpu-e2e: could not write {}: {e}", path.display());
    }
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn copy_control_plane_logs(cp: &ControlPlane, to: &Path) {
    let _ = std::fs::create_dir_all(to);
    if let Ok(entries) = std::fs::read_dir(cp.dir()) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "log")
                && let Some(name) = p.file_name()
            {
                let _ = std::fs::copy(&p, to.join(name));
            }
        }
    }
}

/// `kubectl get -o yaml` drops managedFields; so do we.
fn clean(mut obj: Value) -> Value {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    obj
}

async fn get_json(client: &Client, path: &str) -> Result<Value, String> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| format!("GET {path}: {e}"))?;
    client
        .request::<Value>(req)
        .await
        .map_err(|e| format!("GET {path}: {e}"))
}

/// Writes `validation.yaml` (the object with its status) and `results.yaml` (every
/// GpuNodeResult, as a List) like `kubectl get -o yaml`; returns them typed.
async fn write_objects(
    client: &Client,
    ns: &str,
    name: &str,
    out: &Path,
) -> Result<(GpuValidation, Vec<GpuNodeResult>), String> {
    let gv = clean(
        get_json(
            client,
            &format!("/apis/gpuval.io/v1alpha1/gpuvalidations/{name}"),
        )
        .await?,
    );
    let list = get_json(
        client,
        &format!("/apis/gpuval.io/v1alpha1/namespaces/{ns}/gpunoderesults"),
    )
    .await?;
    let items: Vec<Value> = list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut i| {
            i["apiVersion"] = json!("gpuval.io/v1alpha1");
            i["kind"] = json!("GpuNodeResult");
            clean(i)
        })
        .collect();
    let to_yaml = |v: &Value| serde_saphyr::to_string(v).map_err(|e| format!("YAML: {e}"));
    write_file(&out.join("validation.yaml"), &to_yaml(&gv)?);
    let as_list = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items});
    write_file(&out.join("results.yaml"), &to_yaml(&as_list)?);
    let typed_gv: GpuValidation =
        serde_json::from_value(gv).map_err(|e| format!("read gpuvalidation/{name}: {e}"))?;
    let typed_results = items
        .into_iter()
        .map(serde_json::from_value::<GpuNodeResult>)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("read the GpuNodeResults: {e}"))?;
    Ok((typed_gv, typed_results))
}

/// The run's evidence as the ecosystem reads it, into `out/evidence/`: each certificate's
/// in-toto attestation (`<ConfigMap>.intoto.json`, once the operator wrote the validation's,
/// waited for up to 60 s), the public key (`public.pem`, `keyId`) and the run as JUnit XML
/// (`junit.xml`). Gives the number of attestations.
async fn write_evidence(
    client: &Client,
    ns: &str,
    gv: &GpuValidation,
    results: &[GpuNodeResult],
    out: &Path,
) -> Result<usize, String> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let dir = out.join("evidence");
    let doc = kubectl_gpuval::document(gv, results);
    write_file(&dir.join("junit.xml"), &gpuval_view::junit(&doc));
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let name = gv.name_any();
    let summary = gpuval_operator::decide::certificates::name(
        &name,
        gv.metadata.uid.as_deref().unwrap_or_default(),
        gv.metadata.generation.unwrap_or(1),
        None,
    );
    gpuval_tests::waits::until(
        "the validation's certificate",
        Duration::from_secs(60),
        || async { maps.get_opt(&summary).await.ok().flatten() },
    )
    .await?;
    let selector = format!("gpuval.io/certificate,gpuval.io/validation={name}");
    let list = maps
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("list the certificates: {e}"))?;
    let mut n = 0;
    for cm in &list.items {
        let data = cm.data.clone().unwrap_or_default();
        if let Some(text) = data.get(gpuval_crds::attestation::DATA_KEY) {
            write_file(&dir.join(format!("{}.intoto.json", cm.name_any())), text);
            n += 1;
        }
    }
    let key = maps
        .get("gpuval-certificate-public-key")
        .await
        .map_err(|e| format!("read the public key: {e}"))?
        .data
        .unwrap_or_default();
    for file in ["public.pem", "keyId"] {
        write_file(&dir.join(file), key.get(file).map_or("", String::as_str));
    }
    Ok(n)
}

async fn pod_lines(client: &Client, ns: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    match pods.list(&Default::default()).await {
        Ok(l) => l
            .items
            .iter()
            .map(|p| {
                format!(
                    "  {} node={} phase={}",
                    p.name_any(),
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_else(|| "(unbound)".into()),
                    p.status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("  (could not list pods: {e})"),
    }
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// The human summary: the verdict, conditions, and per GPU the key figures and reasons.
fn summarise(
    gv: &GpuValidation,
    results: &[GpuNodeResult],
    host: &HostGpus,
    args: &Args,
    node: &str,
    to_verdict: f64,
) -> Vec<String> {
    let mut out = Vec::new();
    let s = gv.status.clone().unwrap_or_default();
    out.push(format!(
        "gpuvalidation/{}: phase {:?}, verdict {to_verdict:.1}s after apply; node {node}, {} x {}; backend {}",
        gv.name_any(),
        s.phase.unwrap_or_default(),
        host.count,
        host.product,
        match args.backend {
            BackendArg::Cuda => "cuda".to_string(),
            BackendArg::Sim => format!("SIMULATED ({})", args.simulate),
        }
    ));
    for c in &s.conditions {
        out.push(format!(
            "  condition {}={} ({}): {}",
            c.type_, c.status, c.reason, c.message
        ));
    }
    if let Some(sel) = &s.selection {
        out.push(format!("  selection: {sel}"));
    }
    if let Some(f) = &s.fabric {
        out.push(format!(
            "  fabric: {:?}, {} node(s), {} round(s), all-node bus {} GB/s, lowest TCP {} Gb/s, named {:?}, suspects {:?}: {}",
            f.phase,
            f.nodes,
            f.rounds,
            fmt_opt(f.bus_bandwidth_gbps, 2),
            fmt_opt(f.tcp_min_gbps, 1),
            f.failed_nodes,
            f.suspects,
            f.message.as_deref().unwrap_or("-")
        ));
    }
    for n in &s.nodes {
        out.push(format!(
            "  node {}: {:?}, {} GPU(s), result {}{}",
            n.name,
            n.verdict,
            n.gpus,
            n.result.as_deref().unwrap_or("-"),
            n.message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        ));
    }
    for r in results {
        let Some(rep) = &r.status else {
            out.push(format!("  result {}: no status", r.name_any()));
            continue;
        };
        out.push(format!(
            "  result {}: verdict {}, backend {}{}, agent {}, {} .. {}",
            r.name_any(),
            rep.verdict,
            rep.backend,
            if rep.simulated { " (SIMULATED)" } else { "" },
            rep.agent_version,
            rep.started_at,
            rep.finished_at
        ));
        if let Some(t) = &rep.topology {
            out.push(format!(
                "    topology: {}{}",
                t.verdict,
                if t.reasons.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", gpuval_crds::reason::messages(&t.reasons))
                }
            ));
        }
        out.push(
            "    GPU  verdict  mem GiB  mem GB/s (fill+verify)  mismatches  TFLOP/s by dtype      SM MHz mean  power W max  temp C max"
                .into(),
        );
        for g in &rep.gpus {
            let mem = g.memory.as_ref();
            let tflops = g
                .compute
                .as_ref()
                .map(|c| {
                    c.gemms
                        .iter()
                        .map(|x| format!("{} {:.1}", x.dtype, x.tflops))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "-".into());
            let tel = g.telemetry.as_ref();
            out.push(format!(
                "    {:<4} {:<8} {:>7}  {:>22}  {:>10}  {:<20}  {:>11}  {:>11}  {:>10}",
                g.index,
                g.verdict.as_str(),
                fmt_opt(mem.map(|m| m.tested_gib), 1),
                fmt_opt(mem.map(|m| m.gbps), 0),
                mem.map_or_else(|| "-".into(), |m| m.mismatches.to_string()),
                tflops,
                fmt_opt(tel.and_then(|t| t.sm_clock_mhz).map(|x| x.mean), 0),
                fmt_opt(tel.and_then(|t| t.power_w).map(|x| x.max), 0),
                fmt_opt(tel.and_then(|t| t.temperature_c).map(|x| x.max), 0),
            ));
            for reason in &g.reasons {
                out.push(format!("         reason: {reason}"));
            }
        }
        for f in &rep.failures {
            out.push(format!("    node failure: {f}"));
        }
    }
    out
}

fn result_for<'a>(results: &'a [GpuNodeResult], node: &str) -> Option<&'a GpuNodeResult> {
    results.iter().find(|r| r.spec.node_name == node)
}

/// Checks of a run expected to pass: Ready=True, the node Passed, real (or, with `--backend sim`,
/// simulated) figures for every GPU.
fn check_passed(
    gv: &GpuValidation,
    results: &[GpuNodeResult],
    node: &str,
    gpus: usize,
    backend: BackendArg,
) -> Vec<(bool, String)> {
    let s = gv.status.clone().unwrap_or_default();
    let mut checks = vec![(
        conditions::is_true(&s.conditions, READY) && !conditions::is_true(&s.conditions, STALLED),
        "Ready=True and Stalled=False".to_string(),
    )];
    // The status counts a passing node without listing it; its verdict is its result's label.
    let listed = s.nodes.iter().find(|n| n.name == node);
    let passed = s.summary.as_ref().map_or(0, |x| x.passed);
    let label = result_for(results, node)
        .and_then(|r| r.metadata.labels.as_ref())
        .and_then(|l| l.get(gpuval_crds::labels::VERDICT))
        .cloned();
    checks.push((
        listed.is_none()
            && passed >= 1
            && label.as_deref().is_some_and(|v| v == "Pass" || v == "Warn"),
        format!(
            "node {node} passed: counted in the status, not listed (listed as {:?}, {passed} passed), result labelled {label:?}",
            listed.map(|n| n.verdict)
        ),
    ));
    let rep = result_for(results, node).and_then(|r| r.status.as_ref());
    checks.push((
        rep.is_some_and(|r| r.gpus.len() == gpus && !r.verdict.is_bad()),
        format!(
            "GpuNodeResult of {node}: {gpus} GPU report(s), verdict not Fail/Error (got {:?}, {} GPU(s))",
            rep.map(|r| r.verdict),
            rep.map_or(0, |r| r.gpus.len())
        ),
    ));
    let want_sim = backend == BackendArg::Sim;
    checks.push((
        rep.is_some_and(|r| r.simulated == want_sim),
        format!(
            "figures are {} (simulated: {:?})",
            if want_sim {
                "SIMULATED, as asked"
            } else {
                "from the real GPUs"
            },
            rep.map(|r| r.simulated)
        ),
    ));
    let measured = rep.is_some_and(|r| {
        r.gpus.iter().all(|g| {
            g.memory.as_ref().is_none_or(|m| m.gbps > 0.0)
                && g.compute
                    .as_ref()
                    .is_none_or(|c| c.gemms.iter().all(|x| x.tflops > 0.0))
        })
    });
    checks.push((
        measured,
        "every memory and compute figure is above zero".into(),
    ));
    checks
}

/// Checks of a fabric run expected to pass: the fabric line Passed over every node.
fn check_fabric_passed(gv: &GpuValidation, nodes: usize) -> Vec<(bool, String)> {
    let f = gv.status.as_ref().and_then(|s| s.fabric.as_ref());
    vec![(
        f.is_some_and(|f| {
            f.phase == FabricPhase::Passed && f.nodes as usize == nodes && f.failed_nodes.is_empty()
        }),
        format!(
            "fabric Passed over all {nodes} node(s), none named (got {:?}, {:?} nodes, bus {:?} GB/s, TCP {:?} Gb/s: {:?})",
            f.map(|f| f.phase),
            f.map(|f| f.nodes),
            f.and_then(|f| f.bus_bandwidth_gbps),
            f.and_then(|f| f.tcp_min_gbps),
            f.and_then(|f| f.message.as_deref())
        ),
    )]
}

/// Checks of a fabric run with a fault planted on node `bad`. Among three or more nodes the
/// healthy ones clear each other, so that node, and no other, is named at fault in the fabric
/// line and Failed in the node lines, with the reason. Two nodes cannot tell which of them is
/// at fault (each group holds both): the planted node is a suspect, none is named, and no
/// node is Failed, since nothing proves which one is.
fn check_fabric_fault(
    gv: &GpuValidation,
    nodes: &[String],
    bad: usize,
    reason: Option<&str>,
) -> Vec<(bool, String)> {
    let s = gv.status.clone().unwrap_or_default();
    let f = s.fabric.as_ref();
    let named = f.map(|f| f.failed_nodes.clone()).unwrap_or_default();
    let suspects = f.map(|f| f.suspects.clone()).unwrap_or_default();
    let message = f.and_then(|f| f.message.as_deref());
    let localizable = nodes.len() >= 3;
    let mut checks = vec![if localizable {
        (
            named == [nodes[bad].clone()],
            format!(
                "the fabric names {} and no other (named {named:?}; suspects {suspects:?}: {message:?})",
                nodes[bad]
            ),
        )
    } else {
        (
            named.is_empty() && suspects.contains(&nodes[bad]),
            format!(
                "two nodes: the fabric names none and suspects {} (named {named:?}; suspects {suspects:?}: {message:?})",
                nodes[bad]
            ),
        )
    }];
    for (i, node) in nodes.iter().enumerate() {
        let line = s.nodes.iter().find(|n| &n.name == node);
        let msg = line.and_then(|n| n.message.as_deref()).unwrap_or("");
        if i == bad && localizable {
            checks.push((
                line.is_some_and(|n| n.verdict == NodeVerdict::Failed)
                    && msg.contains("fabric")
                    && reason.is_none_or(|r| msg.contains(r)),
                format!(
                    "node {node} Failed with a fabric reason{} (got {:?}: {msg:?})",
                    reason
                        .map(|r| format!(" containing {r:?}"))
                        .unwrap_or_default(),
                    line.map(|n| n.verdict)
                ),
            ));
        } else {
            checks.push((
                line.is_none_or(|n| n.verdict != NodeVerdict::Failed),
                format!(
                    "node {node} not Failed (got {:?}: {msg:?})",
                    line.map(|n| n.verdict)
                ),
            ));
        }
    }
    checks
}

/// Checks of a run with a planted fault: Failed, Stalled naming the node and the (first) GPU,
/// the node's line Failed with the reason, and in its GpuNodeResult exactly the expected GPUs
/// failing with the reason, the others not.
fn check_fault(
    gv: &GpuValidation,
    results: &[GpuNodeResult],
    node: &str,
    gpu_set: &GpuSet,
    reason: Option<&str>,
    gpus: usize,
) -> Vec<(bool, String)> {
    let s = gv.status.clone().unwrap_or_default();
    let first = format!("GPU{}", gpu_set.first());
    let mut checks = Vec::new();
    let stalled = conditions::find(&s.conditions, STALLED);
    checks.push((
        !conditions::is_true(&s.conditions, READY)
            && stalled.is_some_and(|c| {
                c.status == "True" && c.message.contains(node) && c.message.contains(&first)
            }),
        format!(
            "Ready=False, Stalled=True naming node {node} and {first} (Stalled: {:?})",
            stalled.map(|c| c.message.as_str())
        ),
    ));
    let line = s.nodes.iter().find(|n| n.name == node);
    let msg = line.and_then(|n| n.message.as_deref()).unwrap_or("");
    checks.push((
        line.is_some_and(|n| n.verdict == NodeVerdict::Failed)
            && msg.contains(&first)
            && reason.is_none_or(|r| msg.contains(r)),
        format!(
            "node {node} Failed in the validation status, its message naming {first}{} (got {:?}: {msg:?})",
            reason.map(|r| format!(" and {r:?}")).unwrap_or_default(),
            line.map(|n| n.verdict)
        ),
    ));
    let rep = result_for(results, node).and_then(|r| r.status.as_ref());
    checks.push((
        rep.is_some_and(|r| r.verdict == Verdict::Fail && r.gpus.len() == gpus),
        format!(
            "GpuNodeResult of {node}: verdict Fail with {gpus} GPU report(s) (got {:?})",
            rep.map(|r| r.verdict)
        ),
    ));
    for g in rep.map(|r| r.gpus.as_slice()).unwrap_or_default() {
        let name = format!("GPU{}", g.index);
        if gpu_set.contains(g.index) {
            let why: Vec<&gpuval_crds::Reason> = g
                .reasons
                .iter()
                .filter(|x| x.contains(&name) && reason.is_none_or(|r| x.contains(r)))
                .collect();
            checks.push((
                g.verdict == Verdict::Fail && !why.is_empty(),
                format!(
                    "{name} Fail with a reason naming {name}{} (got {}: {:?})",
                    reason.map(|r| format!(" and {r:?}")).unwrap_or_default(),
                    g.verdict,
                    g.reasons
                ),
            ));
        } else {
            checks.push((
                !g.verdict.is_bad(),
                format!(
                    "{name} not failed (the fault is elsewhere) (got {}: {:?})",
                    g.verdict, g.reasons
                ),
            ));
        }
    }
    checks
}

/// The container runtime for `--runc`: the image from `--image`, the GPUs from `--cdi`.
fn container_runtime(args: &Args) -> Result<Option<gpuval_tests::runc::Runtime>, String> {
    let (Some(runc), Some(image), Some(cdi)) = (&args.runc, &args.image, &args.cdi) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(image.join("image.json"))
        .map_err(|e| format!("read {}/image.json: {e}", image.display()))?;
    let config: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}/image.json: {e}", image.display()))?;
    let strings = |key: &str| -> Vec<String> {
        config[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    };
    let id = |key: &str| {
        config[key]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| format!("{}/image.json: no {key}", image.display()))
    };
    let state = args.out.join("runc-state");
    std::fs::create_dir_all(&state).map_err(|e| format!("create {}: {e}", state.display()))?;
    Ok(Some(gpuval_tests::runc::Runtime {
        runc: runc.clone(),
        state,
        image: gpuval_tests::runc::Image {
            rootfs: image.join("rootfs"),
            env: strings("env"),
            entrypoint: strings("entrypoint"),
            uid: id("uid")?,
            gid: id("gid")?,
        },
        cdi: gpuval_tests::runc::cdi::Spec::read(cdi)?,
    }))
}

/// The node's line is Error, not Failed, its evidence other than Hardware, its message naming
/// `reason`; the Node carries no failure taint and no Fail verdict label.
fn check_no_hardware_action(
    gv: &GpuValidation,
    node: &str,
    object: Option<&Node>,
    reason: Option<&str>,
) -> Vec<(bool, String)> {
    let s = gv.status.clone().unwrap_or_default();
    let line = s.nodes.iter().find(|n| n.name == node);
    let msg = line.and_then(|n| n.message.as_deref()).unwrap_or("");
    let evidence = line.and_then(|n| n.evidence);
    let mut checks = vec![(
        line.is_some_and(|n| n.verdict == NodeVerdict::Error)
            && evidence.is_some_and(|e| !e.acts_on_node())
            && reason.is_none_or(|r| msg.contains(r)),
        format!(
            "node {node} Error (not Failed) with {evidence:?} evidence{} (got {:?} {:?}: {msg:?})",
            reason
                .map(|r| format!(", its message naming {r:?}"))
                .unwrap_or_default(),
            line.map(|n| n.verdict),
            line.and_then(|n| n.codes.clone())
        ),
    )];
    let failed_taint = object
        .and_then(|n| n.spec.as_ref())
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == gpuval_crds::labels::FAILED_NODE));
    let label = object
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(gpuval_crds::labels::NODE_VERDICT).cloned());
    checks.push((
        object.is_some() && !failed_taint && label.as_deref() != Some("Fail"),
        format!(
            "Node {node}: no hardware action (failure taint {failed_taint}, verdict label {label:?})"
        ),
    ));
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_sanitised() {
        assert_eq!(node_name("GPU_Host-01").unwrap(), "gpu-host-01");
        assert_eq!(node_name("a..b.-c-").unwrap(), "a.b.c");
        assert!(node_name("___").is_err());
        assert_eq!(
            label_value("NVIDIA H200 (simulated)"),
            "NVIDIA-H200--simulated"
        );
    }

    #[test]
    fn a_split_host_deals_its_gpus_out_evenly() {
        let one = shares("h", 2, 1).unwrap();
        assert_eq!(
            one,
            vec![Share {
                name: "h".into(),
                gpus: vec![0, 1]
            }]
        );
        let two = shares("h", 8, 2).unwrap();
        assert_eq!(two[1].name, "h-1");
        assert_eq!(two[1].gpus, vec![4, 5, 6, 7]);
        assert!(shares("h", 3, 2).is_err());
        assert_eq!(
            parse_node_env("1:NCCL_SOCKET_IFNAME=x=y", 2).unwrap(),
            (1, "NCCL_SOCKET_IFNAME".into(), "x=y".into())
        );
        assert!(parse_node_env("2:A=b", 2).is_err());
        assert!(parse_node_env("1:A", 2).is_err());
        assert_eq!(
            simulate_with_gpus("gpus=4,model=H200", 2),
            "gpus=2,model=H200"
        );
        assert_eq!(simulate_with_gpus("model=H200", 1), "gpus=1,model=H200");
    }

    #[test]
    fn gpu_sets_and_holds_parse() {
        assert_eq!(GpuSet::parse("all").unwrap(), GpuSet::All);
        let s = GpuSet::parse("3,1").unwrap();
        assert!(s.contains(1) && s.contains(3) && !s.contains(2));
        assert_eq!(s.first(), 1);
        assert!(GpuSet::parse("x").is_err());
        assert_eq!(parse_hold("2:0.25").unwrap(), (2, 0.25));
        assert!(parse_hold("2:1.5").is_err());
        assert!(parse_hold("2").is_err());
    }
}
