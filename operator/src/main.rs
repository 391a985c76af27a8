//! `gpuval-operator`: runs the GpuValidation controller, with leader election on a Lease (so
//! replicas are safe), Prometheus metrics and health endpoints. Configured by flags or the
//! matching GPUVAL_* environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::{Router, extract::State, http::StatusCode, routing::get};
use clap::Parser;
use gpuval_operator::caches::leader::{self, Election, Fence, FenceLayer, Timing};
use gpuval_operator::decide::reconcile::allocation;
use gpuval_operator::settings::config::{self, OperatorConfig};
use gpuval_operator::{services::heap, services::metrics::Metrics, wiring};

/// Counts the heap in use for `/metrics` (`gpuval_operator_heap_bytes`).
#[global_allocator]
static ALLOCATOR: heap::Counting = heap::Counting;

#[derive(Parser, Debug)]
#[command(
    name = "gpuval-operator",
    version,
    about = "GPU acceptance operator for Kubernetes"
)]
struct Args {
    /// Namespace for agent pods, node results and the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpuval-system")]
    namespace: String,
    #[arg(long, env = "GPUVAL_AGENT_IMAGE")]
    agent_image: String,
    #[arg(long, env = "GPUVAL_AGENT_IMAGE_PULL_POLICY")]
    agent_image_pull_policy: Option<String>,
    #[arg(
        long,
        env = "GPUVAL_AGENT_SERVICE_ACCOUNT",
        default_value = "gpuval-agent"
    )]
    agent_service_account: String,
    /// Toleration for agent pods, KEY[=VALUE][:EFFECT]; repeatable.
    #[arg(
        long = "agent-toleration",
        env = "GPUVAL_AGENT_TOLERATIONS",
        value_delimiter = ','
    )]
    tolerations: Vec<String>,
    /// Host directory mounted into agent pods for the I/O check.
    #[arg(long, env = "GPUVAL_IO_HOST_PATH")]
    io_host_path: Option<PathBuf>,
    /// Directories the I/O host path may lie in (the administrator's allowlist); repeatable.
    #[arg(
        long = "io-allowed-path",
        env = "GPUVAL_IO_ALLOWED_PATHS",
        value_delimiter = ','
    )]
    io_allowed_paths: Vec<PathBuf>,
    /// An admission taint key a GpuValidationSchedule may name besides gpuval's own
    /// (gpuval.io/...); repeatable. gpuval removes that taint from nodes that pass.
    #[arg(
        long = "admission-taint-key",
        env = "GPUVAL_ADMISSION_TAINT_KEYS",
        value_delimiter = ','
    )]
    admission_taint_keys: Vec<String>,
    /// Run agent pods privileged (an administrator's opt-in).
    #[arg(long, env = "GPUVAL_AGENT_PRIVILEGED")]
    agent_privileged: bool,
    /// Fabric test (spec.fabric): agent pods use the host's network (RDMA NICs, no overlay).
    #[arg(long, env = "GPUVAL_FABRIC_HOST_NETWORK")]
    fabric_host_network: bool,
    /// Fabric test: a device resource each agent pod requests, NAME=COUNT (e.g. rdma/ib=1);
    /// repeatable.
    #[arg(
        long = "fabric-resource",
        env = "GPUVAL_FABRIC_RESOURCES",
        value_delimiter = ','
    )]
    fabric_resources: Vec<String>,
    /// Fabric test: the first rendezvous port; group N of a round uses PORT+2N and PORT+2N+1.
    #[arg(long, env = "GPUVAL_FABRIC_PORT", default_value_t = gpuval_crds::fabric::RENDEZVOUS_PORT)]
    fabric_port: u16,
    /// Fabric test: a capability added to agent containers (IPC_LOCK or NET_RAW); repeatable.
    #[arg(
        long = "fabric-capability",
        env = "GPUVAL_FABRIC_CAPABILITIES",
        value_delimiter = ','
    )]
    fabric_capabilities: Vec<String>,
    /// Extra agent environment NAME=VALUE; repeatable (e.g. GPUVAL_SIMULATE for demos).
    #[arg(long = "agent-env", env = "GPUVAL_AGENT_ENV", value_delimiter = ';')]
    agent_env: Vec<String>,
    /// Reconciles at once.
    #[arg(long, env = "GPUVAL_CONCURRENCY", default_value_t = 8)]
    concurrency: u16,
    /// Agent pods one reconcile creates at once.
    #[arg(long, env = "GPUVAL_POD_CREATE_CONCURRENCY", default_value_t = 32)]
    pod_create_concurrency: usize,
    /// API writes a second (pods, results, status); 0: no client-side limit.
    #[arg(long, env = "GPUVAL_API_QPS", default_value_t = 0.0)]
    api_qps: f64,
    /// API writes allowed at once above --api-qps.
    #[arg(long, env = "GPUVAL_API_BURST", default_value_t = 100)]
    api_burst: u32,
    /// Longest random delay (seconds) an agent waits before writing its result, so that
    /// thousands of agents finishing together do not write at once; 0: none.
    #[arg(long, env = "GPUVAL_AGENT_RESULT_JITTER_SECONDS", default_value_t = 0)]
    agent_result_jitter_seconds: u64,
    /// Agents treat a process that is not theirs on a GPU under test as a Warn, not a Fail
    /// (GPUs shared on purpose; figures may be lower than the GPUs can reach).
    #[arg(long, env = "GPUVAL_AGENT_ALLOW_SHARED_GPUS")]
    agent_allow_shared_gpus: bool,
    /// Agent pods mount the kubelet's PodResources socket (read-only) and run as root with no
    /// capabilities to open it: a GPU found busy names the pods that hold it. Outside Pod
    /// Security `restricted` (a hostPath, uid 0).
    #[arg(long, env = "GPUVAL_AGENT_POD_RESOURCES")]
    agent_pod_resources: bool,
    /// How agent pods get their GPUs: auto (Dynamic Resource Allocation on nodes whose GPUs
    /// the DRA driver publishes in ResourceSlices, nvidia.com/gpu elsewhere),
    /// extendedResource, or dra.
    #[arg(long, env = "GPUVAL_GPU_ALLOCATION", default_value = "auto")]
    gpu_allocation: String,
    /// The DeviceClass agent claims ask for on DRA nodes.
    #[arg(long, env = "GPUVAL_DRA_DEVICE_CLASS", default_value = allocation::DEFAULT_DEVICE_CLASS)]
    dra_device_class: String,
    /// The DRA driver whose ResourceSlices list the nodes' GPUs.
    #[arg(long, env = "GPUVAL_DRA_DRIVER", default_value = allocation::DEFAULT_DRIVER)]
    dra_driver: String,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "GPUVAL_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Take a Lease before reconciling (run several replicas safely).
    #[arg(long, env = "GPUVAL_LEADER_ELECT")]
    leader_elect: bool,
    #[arg(long, env = "GPUVAL_LEASE_NAME", default_value = "gpuval-operator")]
    lease_name: String,
    /// Seconds a follower waits after the Lease last changed before it takes over.
    #[arg(long, env = "GPUVAL_LEASE_DURATION_SECONDS", default_value_t = 15)]
    lease_duration: u64,
    /// Seconds the leader keeps writing after the start of its last successful renewal
    /// (shorter than --lease-duration: the difference covers writes in flight).
    #[arg(
        long,
        env = "GPUVAL_LEASE_RENEW_DEADLINE_SECONDS",
        default_value_t = 10
    )]
    lease_renew_deadline: u64,
    /// Seconds between reads of the Lease (and the leader's renewals).
    #[arg(long, env = "GPUVAL_LEASE_RETRY_PERIOD_SECONDS", default_value_t = 2)]
    lease_retry_period: u64,
    /// The Secret (operator namespace) with the certificate signing key under `private.pem`
    /// (ed25519 PKCS#8 PEM); generated there on first use when absent.
    #[arg(
        long,
        env = "GPUVAL_CERTIFICATE_KEY_SECRET",
        default_value = "gpuval-certificate-key"
    )]
    certificate_key_secret: String,
    /// Acceptance certificates kept per node (and per validation name), newest first; 0: none
    /// written.
    #[arg(long, env = "GPUVAL_CERTIFICATE_RETENTION", default_value_t = 20)]
    certificate_retention: usize,
    /// Passing runs of a GPU (from its certificates) its baseline is the median of; 0: no
    /// baselines.
    #[arg(long, env = "GPUVAL_BASELINE_RUNS", default_value_t = gpuval_crds::baseline::DEFAULT_RUNS)]
    baseline_runs: usize,
    /// A GPU figure more than this many percent below its own baseline is a Warn
    /// (BelowOwnBaseline).
    #[arg(
        long,
        env = "GPUVAL_BASELINE_TOLERANCE_PERCENT",
        default_value_t = 10.0
    )]
    baseline_tolerance_percent: f64,
    /// A node, or a GPU of it, that fails on hardware evidence in two runs or more within this
    /// window is a repeat offender (node label gpuval.io/repeat-offender=true, named in its
    /// GpuValidated message and an event); 0s: not counted. Written like 168h or 30m.
    #[arg(long, env = "GPUVAL_REPEAT_FAILURE_WINDOW", default_value = "168h")]
    repeat_failure_window: gpuval_crds::duration::Duration,
    /// An agent pod Pending this long (unscheduled, image not pulled, container not created)
    /// ends its node's line as trouble that says what to fix, before the run's deadline. Written
    /// like 10m; 0s: only the deadline.
    #[arg(long, env = "GPUVAL_AGENT_PENDING_LIMIT", default_value = "10m")]
    agent_pending_limit: gpuval_crds::duration::Duration,
    /// Who writes node taints: gpuval (default), or cluster (the cluster's own controller reads
    /// the GpuValidated condition; gpuval then writes conditions, labels and DRA device taints
    /// only).
    #[arg(long, env = "GPUVAL_NODE_TAINTS", default_value = "gpuval")]
    node_taints: String,
    /// The PriorityClass agent pods carry (empty: the cluster's default). An administrator's
    /// choice: whether tenants' work may preempt an agent.
    #[arg(long, env = "GPUVAL_AGENT_PRIORITY_CLASS", default_value = "")]
    agent_priority_class: String,
    /// After this many final lines in a row without hardware evidence (busy, infrastructure,
    /// configuration, no evidence) a node's GpuValidated turns Unknown, naming the reason and
    /// its last hardware evidence; 0 (default): never.
    #[arg(long, env = "GPUVAL_UNKNOWN_AFTER_NON_EVIDENCE", default_value_t = 0)]
    unknown_after_non_evidence: u32,
    /// json (default) or text.
    #[arg(long, env = "GPUVAL_LOG_FORMAT", default_value = "json")]
    log_format: String,
}

#[derive(Clone)]
struct Http {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
}

async fn serve_metrics(
    State(h): State<Http>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::OK,
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics.encode(),
    )
}

async fn readyz(State(h): State<Http>) -> (StatusCode, &'static str) {
    if h.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not filled or not leader",
        )
    }
}

/// A repeatable flag's entries less the empty ones (which a trailing or doubled delimiter in
/// its environment variable leaves).
fn entries(values: &[String]) -> impl Iterator<Item = &str> {
    values.iter().map(String::as_str).filter(|v| !v.is_empty())
}

/// A repeatable flag's entries, each parsed.
fn parse_each<T, E>(values: &[String], parse: impl Fn(&str) -> Result<T, E>) -> Result<Vec<T>, E> {
    entries(values).map(parse).collect()
}

fn build_config(a: &Args) -> anyhow::Result<OperatorConfig> {
    let cfg = OperatorConfig {
        namespace: a.namespace.clone(),
        agent_image: a.agent_image.clone(),
        agent_image_pull_policy: a.agent_image_pull_policy.clone(),
        agent_service_account: a.agent_service_account.clone(),
        tolerations: parse_each(&a.tolerations, config::parse_toleration)?,
        io_host_path: a.io_host_path.clone(),
        io_allowed_paths: a.io_allowed_paths.clone(),
        agent_privileged: a.agent_privileged,
        agent_env: parse_each(&a.agent_env, config::parse_env)?,
        concurrency: a.concurrency.max(1),
        pod_create_concurrency: a.pod_create_concurrency.max(1),
        api_qps: a.api_qps.max(0.0),
        api_burst: a.api_burst.max(1),
        agent_result_jitter: std::time::Duration::from_secs(a.agent_result_jitter_seconds),
        agent_allow_shared_gpus: a.agent_allow_shared_gpus,
        agent_pod_resources: a.agent_pod_resources,
        fabric: config::FabricPods {
            host_network: a.fabric_host_network,
            resources: parse_each(&a.fabric_resources, config::parse_resource)?,
            capabilities: entries(&a.fabric_capabilities)
                .map(str::to_string)
                .collect(),
            port: a.fabric_port,
        },
        clock: gpuval_operator::settings::clock::Clock::system(),
        // Test-only, never from a flag: simulated results do not act on Nodes here.
        simulated_acts_on_nodes: false,
        admission_taint_keys: entries(&a.admission_taint_keys)
            .map(str::to_string)
            .collect(),
        allocation: allocation::Allocation {
            mode: allocation::Mode::parse(&a.gpu_allocation).map_err(anyhow::Error::msg)?,
            device_class: a.dra_device_class.trim().to_string(),
            driver: a.dra_driver.trim().to_string(),
        },
        repeat_failure_window: a.repeat_failure_window.as_std(),
        agent_pending_limit: Some(a.agent_pending_limit.as_std()).filter(|d| !d.is_zero()),
        node_taints: config::NodeTaints::parse(&a.node_taints)?,
        agent_priority_class: Some(a.agent_priority_class.trim())
            .filter(|pc| !pc.is_empty())
            .map(str::to_string),
        unknown_after_non_evidence: a.unknown_after_non_evidence,
        certificates: config::CertificateSettings {
            key_secret: a.certificate_key_secret.clone(),
            retention: (a.certificate_retention > 0).then_some(a.certificate_retention),
            baseline_runs: a.baseline_runs,
            baseline_tolerance: (a.baseline_tolerance_percent / 100.0).clamp(0.0, 1.0),
            ..Default::default()
        },
    };
    cfg.validate()?;
    if cfg.agents_simulated() {
        tracing::warn!(
            "agents run the SIMULATED GPU backend (GPUVAL_SIMULATE or GPUVAL_BACKEND in --agent-env): their results are not evidence about any node; no node labels, conditions, taint changes or admissions follow from them"
        );
    }
    Ok(cfg)
}

fn init_tracing(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn".into());
    if format == "text" {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    }
}

/// Serves /metrics, /healthz and /readyz on `addr` in the background.
async fn serve_http(addr: SocketAddr, http: Http) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(http);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind {addr}"))?;
    tracing::info!(addr = %addr, "serving /metrics /healthz /readyz");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(())
}

/// How long the reconciles in flight at SIGTERM may go on: well inside the chart's 30 s grace
/// period, which leaves time to hand the Lease back.
const DRAIN: Duration = Duration::from_secs(20);

/// SIGTERM or Ctrl-C, told to every clone of the receiver: one listener for the process, so
/// the controller's graceful stop and the bound on it ([`drained`]) hear the same signal.
fn stop_requested() -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!(drain_s = DRAIN.as_secs(), "stopping");
        let _ = tx.send(true);
    });
    rx
}

/// Resolves once `stop` says so (never where no stop can come any more).
async fn told(mut stop: tokio::sync::watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Runs `run` to its end, or once `stop` is told for at most [`DRAIN`] more: reconciles still
/// in flight then are dropped at their next await (a write either went out whole or not at
/// all; the next leader rebuilds a run from the cluster). False when they were dropped.
async fn drained(
    run: impl std::future::Future<Output = ()>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> bool {
    tokio::pin!(run);
    tokio::select! {
        () = &mut run => return true,
        () = told(stop) => {}
    }
    match tokio::time::timeout(DRAIN, run).await {
        Ok(()) => true,
        Err(_) => {
            tracing::warn!(
                drain_s = DRAIN.as_secs(),
                "reconciles still in flight after the drain; abandoned"
            );
            false
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}

/// The leader election the flags ask for (None without --leader-elect).
fn election(a: &Args, namespace: &str) -> anyhow::Result<Option<Election>> {
    if !a.leader_elect {
        return Ok(None);
    }
    let timing = Timing {
        lease_duration: std::time::Duration::from_secs(a.lease_duration),
        renew_deadline: std::time::Duration::from_secs(a.lease_renew_deadline),
        retry_period: std::time::Duration::from_secs(a.lease_retry_period),
    };
    timing.validate()?;
    Ok(Some(Election {
        lease: a.lease_name.clone(),
        namespace: namespace.to_string(),
        identity: std::env::var("POD_NAME")
            .unwrap_or_else(|_| format!("gpuval-operator-{}", std::process::id())),
        timing,
    }))
}

/// Waits to hold the Lease, then runs the controller with a fenced client (writes refused
/// once the lease could not be renewed in time) until `shutdown` resolves or the lease is
/// lost. A lost lease is an error (the process exits non-zero and its Deployment restarts it
/// as a follower); after a shutdown the Lease is handed back.
async fn run_as_leader(
    config: kube::Config,
    cfg: OperatorConfig,
    election: Election,
    http: Http,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let shutdown = told(stop.clone());
    let lease_client = kube::Client::try_from(config.clone()).context("build the lease client")?;
    let fence = Fence::default();
    let client = kube::client::ClientBuilder::try_from(config)
        .context("build the API client")?
        .with_layer(&FenceLayer(fence.clone()))
        .build();
    let (leading_tx, mut leading) = tokio::sync::watch::channel(false);
    let mut elector = tokio::spawn(leader::run(
        lease_client.clone(),
        election.clone(),
        fence.clone(),
        leading_tx,
    ));
    let t = election.timing;
    tracing::info!(identity = %election.identity, lease = %election.lease, lease_duration_s = t.lease_duration.as_secs(), renew_deadline_s = t.renew_deadline.as_secs(), retry_period_s = t.retry_period.as_secs(), "waiting to become leader");
    let mut shutdown = Box::pin(shutdown);
    tokio::select! {
        r = leading.wait_for(|l| *l) => if r.is_err() { anyhow::bail!("leader election stopped") },
        () = &mut shutdown => { elector.abort(); return Ok(()) }
    }
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel();
    let stop_or_lost = async move {
        tokio::select! {
            () = shutdown => elector.abort(),
            lost = &mut elector => { let _ = lost_tx.send(lost); }
        }
    };
    let run = wiring::run(client, cfg, http.metrics, http.ready.clone(), stop_or_lost);
    drained(run, stop).await;
    fence.close();
    http.ready.store(false, Ordering::Relaxed);
    match lost_rx.await {
        Ok(Ok(lost)) => {
            tracing::error!(error = %lost, refused_writes = fence.refused(), "lost the lease; stopped");
            Err(anyhow::anyhow!("{lost}"))
        }
        Ok(Err(e)) => Err(anyhow::anyhow!("leader election failed: {e}")),
        Err(_) => {
            leader::release(lease_client, &election).await;
            Ok(())
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(&args.log_format);
    let cfg = build_config(&args).context("invalid configuration")?;
    let election = election(&args, &cfg.namespace).context("invalid leader election settings")?;
    let config = kube::Config::infer()
        .await
        .context("find the Kubernetes API (in-cluster or KUBECONFIG)")?;

    let http = Http {
        metrics: Arc::new(Metrics::default()),
        ready: Arc::new(AtomicBool::new(false)),
    };
    serve_http(args.metrics_addr, http.clone()).await?;
    let stop = stop_requested();
    match election {
        Some(e) => run_as_leader(config, cfg, e, http, stop).await?,
        None => {
            let client = kube::Client::try_from(config).context("connect to the Kubernetes API")?;
            let run = wiring::run(client, cfg, http.metrics, http.ready, told(stop.clone()));
            drained(run, stop).await;
        }
    }
    tracing::info!("stopped");
    Ok(())
}
