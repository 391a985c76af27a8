//! `gpuval-operator`: runs the GpuValidation controller, with leader election on a Lease (so
//! replicas are safe), Prometheus metrics and health endpoints. Configured by flags or the
//! matching GPUVAL_* environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use axum::{Router, extract::State, http::StatusCode, routing::get};
use clap::Parser;
use gpuval_operator::config::{self, OperatorConfig};
use gpuval_operator::{controller, metrics::Metrics};
use kube_lease_manager::LeaseManagerBuilder;

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
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "GPUVAL_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Take a Lease before reconciling (run several replicas safely).
    #[arg(long, env = "GPUVAL_LEADER_ELECT")]
    leader_elect: bool,
    #[arg(long, env = "GPUVAL_LEASE_NAME", default_value = "gpuval-operator")]
    lease_name: String,
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

fn build_config(a: &Args) -> anyhow::Result<OperatorConfig> {
    let cfg = OperatorConfig {
        namespace: a.namespace.clone(),
        agent_image: a.agent_image.clone(),
        agent_image_pull_policy: a.agent_image_pull_policy.clone(),
        agent_service_account: a.agent_service_account.clone(),
        tolerations: a
            .tolerations
            .iter()
            .filter(|t| !t.is_empty())
            .map(|t| config::parse_toleration(t))
            .collect::<Result<_, _>>()?,
        io_host_path: a.io_host_path.clone(),
        io_allowed_paths: a.io_allowed_paths.clone(),
        agent_privileged: a.agent_privileged,
        agent_env: a
            .agent_env
            .iter()
            .filter(|e| !e.is_empty())
            .map(|e| config::parse_env(e))
            .collect::<Result<_, _>>()?,
        concurrency: a.concurrency.max(1),
        pod_create_concurrency: a.pod_create_concurrency.max(1),
        api_qps: a.api_qps.max(0.0),
        api_burst: a.api_burst.max(1),
        agent_result_jitter: std::time::Duration::from_secs(a.agent_result_jitter_seconds),
        fabric: config::FabricPods {
            host_network: a.fabric_host_network,
            resources: a
                .fabric_resources
                .iter()
                .filter(|r| !r.is_empty())
                .map(|r| config::parse_resource(r))
                .collect::<Result<_, _>>()?,
            capabilities: a
                .fabric_capabilities
                .iter()
                .filter(|c| !c.is_empty())
                .cloned()
                .collect(),
            port: a.fabric_port,
        },
        clock: gpuval_operator::schedule::Clock::system(),
    };
    cfg.validate()?;
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

/// Waits to hold the Lease `lease_name`, then runs the controller until `shutdown` resolves
/// or the lease is lost.
async fn run_as_leader(
    client: kube::Client,
    cfg: OperatorConfig,
    lease_name: &str,
    http: Http,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    let identity = std::env::var("POD_NAME")
        .unwrap_or_else(|_| format!("gpuval-operator-{}", std::process::id()));
    let manager = LeaseManagerBuilder::new(client.clone(), lease_name)
        .with_namespace(&cfg.namespace)
        .with_identity(&identity)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await
        .context("set up leader election")?;
    let (mut leader, _task) = manager.watch().await;
    tracing::info!(identity = %identity, lease = %lease_name, "waiting to become leader");
    while !*leader.borrow_and_update() {
        if leader.changed().await.is_err() {
            anyhow::bail!("leader election stopped");
        }
    }
    tracing::info!(identity = %identity, "leading");
    let lost = async move {
        while *leader.borrow_and_update() {
            if leader.changed().await.is_err() {
                break;
            }
        }
        tracing::warn!("lost the lease; stopping");
    };
    let stop = async move {
        tokio::select! { _ = shutdown => {}, _ = lost => {} }
    };
    controller::run(client, cfg, http.metrics, http.ready, stop).await;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(&args.log_format);
    let cfg = build_config(&args).context("invalid configuration")?;
    let client = kube::Client::try_default()
        .await
        .context("connect to the Kubernetes API")?;

    let http = Http {
        metrics: Arc::new(Metrics::default()),
        ready: Arc::new(AtomicBool::new(false)),
    };
    serve_http(args.metrics_addr, http.clone()).await?;
    if args.leader_elect {
        run_as_leader(client, cfg, &args.lease_name, http, shutdown_signal()).await?;
    } else {
        controller::run(client, cfg, http.metrics, http.ready, shutdown_signal()).await;
    }
    tracing::info!("stopped");
    Ok(())
}
