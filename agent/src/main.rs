//! `gpuval-agent`: checks this host's GPUs. `run` (the checks), `topo` (like
//! `nvidia-smi topo -m`), `inventory`, `selftest` (proves the memory check catches planted bit
//! flips). Exit codes: 0 pass or warn, 1 a check failed, 2 could not run (bad input, missing
//! driver or library).
//!
//! `k8s` is the agent pod's mode (see `gpuval_agent::k8s`): its assignment comes from the
//! environment, its result goes to the API; exit 0 once the result is stored whatever the
//! verdict, 1 when it could not be stored, 2 bad environment, 143 stopped by a signal.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::{Args, Parser, Subcommand, ValueEnum};
use gpuval_agent::backend::{self, Backend, BackendChoice, BackendError, sim::SimSpec};
use gpuval_agent::checks::{io, memory, nccl, topology, training};
use gpuval_agent::config::{self, Overrides, RunSettings};
use gpuval_agent::runner::{self, Plan};
use gpuval_agent::{fabric, k8s, render};
use gpuval_crds::Verdict;

#[derive(Parser)]
#[command(
    name = "gpuval-agent",
    version,
    about = "GPU acceptance checks for this host"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the checks and print a table; --output writes the JSON report.
    Run(Box<RunArgs>),
    /// Print the GPU interconnect topology like `nvidia-smi topo -m`.
    Topo(TopoArgs),
    /// List GPUs: index, UUID, name, memory, driver, PCIe, ECC, remapped rows.
    Inventory(InventoryArgs),
    /// Plant bit flips in GPU memory and check that the memory check finds every one.
    Selftest(SelftestArgs),
    /// Run as the operator's agent pod: read the assignment from the environment
    /// (GPUVAL_VALIDATION, GPUVAL_GENERATION, GPUVAL_VALIDATION_UID, NODE_NAME, POD_NAMESPACE,
    /// POD_NAME; optional GPUVAL_BACKEND, GPUVAL_SIMULATE), run the validation's checks and
    /// store the node's GpuNodeResult.
    K8s,
    /// The fabric test between nodes outside Kubernetes: run by every rank of a Slurm (`srun`)
    /// or torchrun-style launch; rank 0 plans the rounds, prints the table, writes the report.
    /// Exit 0 the fabric passed, 1 it failed, 2 the test could not run.
    Fabric(Box<FabricCmd>),
    /// The nccl check's sweep process, which the agent starts itself: a request as JSON on
    /// stdin, progress on stderr, the outcome as JSON on stdout.
    #[command(name = "nccl-sweep", hide = true)]
    NcclSweep,
    /// The training check's process, which the agent starts itself (as `nccl-sweep`).
    #[command(name = "training-run", hide = true)]
    TrainingRun,
    /// Render a JSON report (this agent's --output, or a GpuNodeResult) as one self-contained
    /// HTML page, Markdown, JSON or JUnit XML, chosen by the output file's extension.
    Report(ReportArgs),
    /// Verify a signed certificate offline (exported with `kubectl gpuval certificate`, or
    /// written by `run --certificate-key`): exit 0 valid, 1 not valid (naming what is wrong),
    /// 2 could not read the files.
    Verify(VerifyArgs),
}

#[derive(Args)]
struct VerifyArgs {
    /// The certificate (JSON).
    certificate: PathBuf,
    /// The issuer's public key (PEM: `PUBLIC KEY`).
    #[arg(long, value_name = "PEM")]
    key: PathBuf,
}

#[derive(Args)]
struct ReportArgs {
    /// The JSON report.
    input: PathBuf,
    /// Where to write: `.html`, `.md`, `.json` or `.xml` (JUnit).
    #[arg(long, short = 'o', value_name = "FILE")]
    output: PathBuf,
}

#[derive(Args, Clone)]
struct BackendArgs {
    /// GPU backend. `simulated` is for tests and demos only: its figures are not real.
    #[arg(long, value_enum, default_value_t = BackendName::Cuda)]
    backend: BackendName,
    /// Simulated machine and faults, e.g. `gpus=8,model=H200,fail=memory@2` (implies --backend simulated).
    #[arg(long, value_name = "SPEC")]
    simulate: Option<String>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum BackendName {
    Cuda,
    #[value(alias = "sim")]
    Simulated,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Settings in the API's shape: a GpuValidation, its spec, or a `checks` object (YAML or JSON).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: Overrides,
    /// Directory the io check writes in (a fresh subdirectory, removed afterwards). The io
    /// check is real file I/O on this host under either backend.
    #[arg(long, env = "GPUVAL_IO_DIR", value_name = "DIR")]
    io_dir: Option<PathBuf>,
    /// io: bytes per read and write call, KiB (default 8192, like `dd bs=8M`).
    #[arg(long)]
    io_block_kib: Option<usize>,
    /// io, tests only: skip the free-space pre-flight so the write phase itself meets a
    /// full filesystem.
    #[arg(long, hide = true)]
    io_skip_preflight: bool,
    /// Only these GPUs (NVML indices, comma-separated).
    #[arg(long, value_delimiter = ',')]
    gpus: Option<Vec<u32>>,
    /// A process that is not the agent's on a GPU under test is a Warn, not a Fail (the GPUs
    /// are shared on purpose; the figures may be lower than the GPUs can reach).
    #[arg(long, env = "GPUVAL_ALLOW_SHARED_GPUS")]
    allow_shared_gpus: bool,
    /// The kubelet's PodResources socket (on a Kubernetes node, usually
    /// /var/lib/kubelet/pod-resources/kubelet.sock): a GPU found busy names the pods that hold it.
    #[arg(long, env = "GPUVAL_POD_RESOURCES_SOCKET", value_name = "SOCKET")]
    pod_resources_socket: Option<PathBuf>,
    /// Write the JSON report here.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// Print the JSON report on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the report as JUnit XML here, for CI systems (a test case per check and GPU).
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Sign the run's certificate with this ed25519 PKCS#8 PEM key and write it beside the
    /// --output report (`NAME.cert.json`); needs --output.
    #[arg(long, value_name = "PEM", requires = "output")]
    certificate_key: Option<PathBuf>,
}

#[derive(Args)]
struct FabricCmd {
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    fabric: fabric::coordinator::FabricArgs,
}

#[derive(Args)]
struct TopoArgs {
    #[command(flatten)]
    backend: BackendArgs,
    #[arg(long)]
    json: bool,
    /// Also write the raw NVML readings as JSON (test fixtures).
    #[arg(long, value_name = "FILE")]
    snapshot: Option<PathBuf>,
    /// Compare with saved `nvidia-smi topo -m` output; exit 1 on any differing cell.
    #[arg(long, value_name = "FILE")]
    compare: Option<PathBuf>,
}

#[derive(Args)]
struct InventoryArgs {
    #[command(flatten)]
    backend: BackendArgs,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SelftestArgs {
    /// Bytes of GPU memory per GPU for the test (MiB).
    #[arg(long, default_value_t = 1024)]
    mib: u64,
    /// Bit flips to plant.
    #[arg(long, default_value_t = 37)]
    flips: u32,
}

/// The title of a bare run's JUnit report: the JSON report it was written beside, else `run`.
fn plan_title(output: Option<&std::path::Path>) -> String {
    output.map_or_else(|| "run".to_string(), |p| p.display().to_string())
}

/// `report`: reads the JSON report, writes the page the output's extension names.
fn cmd_report(a: &ReportArgs) -> Result<u8, Fail> {
    let what = a.input.display().to_string();
    let text =
        std::fs::read_to_string(&a.input).map_err(|e| Fail(format!("reading {what}: {e}"), 2))?;
    let report = gpuval_view::parse_report(&what, &text).map_err(|e| Fail(e.to_string(), 2))?;
    let doc = gpuval_view::Document::single(what, report);
    let page = match a.output.extension().and_then(|e| e.to_str()) {
        Some("md") => gpuval_view::markdown(&doc),
        Some("json") => gpuval_view::json(&doc),
        Some("xml") => gpuval_view::junit(&doc),
        _ => gpuval_view::html(&doc),
    };
    std::fs::write(&a.output, page)
        .map_err(|e| Fail(format!("writing {}: {e}", a.output.display()), 2))?;
    Ok(0)
}

/// `verify`: checks a certificate file against a public key file.
fn cmd_verify(a: &VerifyArgs) -> Result<u8, Fail> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).map_err(|e| Fail(format!("reading {}: {e}", p.display()), 2))
    };
    let (cert, key) = (read(&a.certificate)?, read(&a.key)?);
    match gpuval_crds::attestation::verify_exported(&cert, &key) {
        Ok(said) => {
            println!("{said}");
            Ok(0)
        }
        Err(e) => Err(Fail(
            format!("{} does not verify: {e}", a.certificate.display()),
            1,
        )),
    }
}

/// A failure that ends the command: message and exit code.
struct Fail(String, u8);

impl From<BackendError> for Fail {
    fn from(e: BackendError) -> Self {
        Fail(e.to_string(), 2)
    }
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => cmd_run(*a),
        Command::Topo(a) => cmd_topo(a),
        Command::Inventory(a) => cmd_inventory(a),
        Command::Selftest(a) => cmd_selftest(a),
        Command::K8s => cmd_k8s(),
        Command::Fabric(a) => cmd_fabric(*a),
        Command::NcclSweep => return gpuval_agent::nccl::child::child_main(),
        Command::TrainingRun => return training::child::child_main(),
        Command::Report(a) => cmd_report(&a),
        Command::Verify(a) => cmd_verify(&a),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Fail(msg, code)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}

fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    // No colour codes in pod logs and files: only on a terminal.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

/// Opens the backend the flags name (`--simulate` implies the simulated one).
fn backend(args: &BackendArgs) -> Result<Backend, Fail> {
    let choice = if args.backend == BackendName::Simulated || args.simulate.is_some() {
        BackendChoice::Simulated(sim_spec(args)?)
    } else {
        BackendChoice::Cuda
    };
    Ok(backend::open(&choice)?)
}

fn sim_spec(args: &BackendArgs) -> Result<SimSpec, Fail> {
    args.simulate
        .as_deref()
        .unwrap_or("")
        .parse()
        .map_err(|e| Fail(format!("--simulate: {e}"), 2))
}

fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            tracing::warn!(signal = sig, error = %e, "could not install a signal handler");
        }
    }
    stop
}

fn cmd_run(a: RunArgs) -> Result<u8, Fail> {
    let base = match &a.config {
        Some(p) => config::load(p).map_err(|e| Fail(e.to_string(), 2))?,
        None => RunSettings::default(),
    };
    let settings = a.overrides.clone().apply(base).map_err(|e| Fail(e, 2))?;
    // Read before the run: a key that cannot be read stops it before the GPUs are busy.
    let certificate_key = a
        .certificate_key
        .as_ref()
        .map(|p| {
            std::fs::read_to_string(p)
                .map_err(|e| Fail(format!("reading --certificate-key {}: {e}", p.display()), 2))
        })
        .transpose()?;
    let certified = settings.clone();
    if let Some(asked) = &a.gpus {
        runner::check_unique(asked).map_err(|e| Fail(e, 2))?;
    }
    if settings.checks.io.is_some()
        && let Some(dir) = &a.io_dir
    {
        // A directory that cannot serve the check stops the run before the GPUs are busy.
        io::usable_dir(dir).map_err(|e| Fail(format!("--io-dir: {e}"), 2))?;
    }
    let be = backend(&a.backend)?;
    if let Some(asked) = &a.gpus
        && let Ok(inventory) = be.platform().inventory()
    {
        runner::check_selection(asked, &inventory.gpus).map_err(|e| Fail(e, 2))?;
    }
    let stop = stop_flag();
    let mut plan = Plan::new(settings.checks, settings.thresholds);
    plan.expect = settings.expect;
    plan.overrides = settings.severity_overrides;
    plan.gpus = a.gpus.clone();
    plan.io_dir = a.io_dir.clone();
    plan.io_tuning = io::Tuning {
        block_size: a.io_block_kib.map(|k| k.saturating_mul(1024)),
        skip_preflight: a.io_skip_preflight,
    };
    plan.nccl_log_dir = a.overrides.flags.given().and_then(nccl::args::log_dir);
    plan.allow_shared_gpus = a.allow_shared_gpus;
    plan.pod_resources =
        a.pod_resources_socket
            .clone()
            .map(|socket| gpuval_agent::pod_resources::PodResources {
                socket,
                own_pod: None,
            });
    plan.node = std::env::var("NODE_NAME").ok().or_else(backend::hostname);
    let report = runner::run(&be, &plan, &stop, &|line| eprintln!("{line}"));
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| Fail(format!("serialise the report: {e}"), 2))?;
    if let Some(path) = &a.output {
        std::fs::write(path, &json)
            .map_err(|e| Fail(format!("write {}: {e}", path.display()), 2))?;
        eprintln!("report written to {}", path.display());
        if let Some(key) = &certificate_key {
            let source = a
                .config
                .as_ref()
                .map_or("the defaults and flags".to_string(), |p| {
                    format!("settings file {}", p.display())
                });
            let signed = gpuval_agent::bare_certificate::sign(&report, &certified, &source, key)
                .map_err(|e| Fail(format!("--certificate-key: {e}"), 2))?;
            let at = gpuval_agent::bare_certificate::path_beside(path);
            let text = serde_json::to_string_pretty(&signed)
                .map_err(|e| Fail(format!("serialise the certificate: {e}"), 2))?;
            std::fs::write(&at, text)
                .map_err(|e| Fail(format!("write {}: {e}", at.display()), 2))?;
            eprintln!("certificate written to {}", at.display());
        }
    }
    if let Some(path) = &a.junit {
        let title = plan_title(a.output.as_deref());
        let doc = gpuval_view::Document::single(title, report.clone());
        std::fs::write(path, gpuval_view::junit(&doc))
            .map_err(|e| Fail(format!("write --junit {}: {e}", path.display()), 2))?;
        eprintln!("JUnit report written to {}", path.display());
    }
    if a.json {
        println!("{json}");
    } else {
        print!("{}", render::table(&report));
    }
    Ok(match report.verdict {
        Verdict::Pass | Verdict::Warn | Verdict::Skipped => 0,
        Verdict::Fail | Verdict::Error => 1,
    })
}

fn cmd_k8s() -> Result<u8, Fail> {
    let env = k8s::AgentEnv::from_env().map_err(|e| Fail(e.to_string(), 2))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Fail(format!("start the async runtime: {e}"), 2))?;
    let outcome = rt.block_on(k8s::run(env));
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match &outcome {
        k8s::Outcome::Stored(_) | k8s::Outcome::Terminated => {}
        k8s::Outcome::Stale(why) => eprintln!("nothing to do: {why}"),
        k8s::Outcome::NoClient(why) | k8s::Outcome::NotStored(why) => eprintln!("error: {why}"),
    }
    Ok(outcome.exit_code())
}

fn cmd_fabric(a: FabricCmd) -> Result<u8, Fail> {
    let launch = fabric::launch::detect(&|k| std::env::var(k).ok(), a.fabric.port)
        .map_err(|e| Fail(e.to_string(), 2))?;
    let sim = match a.backend.backend == BackendName::Simulated || a.backend.simulate.is_some() {
        true => Some(sim_spec(&a.backend)?),
        false => None,
    };
    let nccl: Box<dyn fabric::NcclGroup> = match &sim {
        Some(s) => Box::new(fabric::sim::SimNccl::new(s.model, s.net.clone())),
        None => fabric::real_nccl().map_err(|e| Fail(e, 2))?,
    };
    let opts = fabric::coordinator::Options {
        node: a
            .fabric
            .node_name
            .clone()
            .or_else(backend::hostname)
            .unwrap_or(format!("rank-{}", launch.rank)),
        spec: a.fabric.spec().map_err(|e| Fail(e, 2))?,
        register_timeout: a.fabric.register_timeout(),
        output: a.fabric.output.clone(),
        simulated: sim.is_some(),
        launch,
    };
    Ok(fabric::coordinator::run(&opts, nccl.as_ref()))
}

fn cmd_topo(a: TopoArgs) -> Result<u8, Fail> {
    let be = backend(&a.backend)?;
    let snap = be.platform().topology()?;
    if let Some(p) = &a.snapshot {
        let text = serde_json::to_string_pretty(&snap).map_err(|e| Fail(e.to_string(), 2))?;
        std::fs::write(p, text).map_err(|e| Fail(format!("write {}: {e}", p.display()), 2))?;
    }
    let report = topology::derive(&snap);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| Fail(e.to_string(), 2))?
        );
    } else {
        print!("{}", topology::render(&report));
    }
    if let Some(p) = &a.compare {
        let text = std::fs::read_to_string(p)
            .map_err(|e| Fail(format!("read {}: {e}", p.display()), 2))?;
        let smi = topology::parse_nvidia_smi(&text)
            .map_err(|e| Fail(format!("{}: {e}", p.display()), 2))?;
        let diffs = topology::compare(&report, &smi);
        if diffs.is_empty() {
            eprintln!(
                "topology matches {} cell by cell ({} GPUs)",
                p.display(),
                smi.gpus.len()
            );
        } else {
            for d in &diffs {
                eprintln!("differs: {d}");
            }
            return Ok(1);
        }
    }
    Ok(0)
}

fn cmd_inventory(a: InventoryArgs) -> Result<u8, Fail> {
    let be = backend(&a.backend)?;
    let inv = be.platform().inventory()?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&inv).map_err(|e| Fail(e.to_string(), 2))?
        );
        return Ok(0);
    }
    let s = &inv.system;
    println!(
        "driver {}  CUDA {}  NVML {}",
        s.driver_version.as_deref().unwrap_or("?"),
        s.cuda_driver_version.as_deref().unwrap_or("?"),
        s.nvml_version.as_deref().unwrap_or("?")
    );
    println!(
        "{:<4} {:<42} {:<24} {:>10} {:>9} {:>5} {:>14}",
        "GPU", "UUID", "NAME", "MEMORY", "PCIE", "ECC", "REMAPPED ROWS"
    );
    for g in &inv.gpus {
        let h = &g.health;
        let pcie = match (h.pcie_gen, h.pcie_width, h.pcie_max_gen, h.pcie_max_width) {
            (Some(gn), Some(w), Some(mg), Some(mw)) => format!("{gn}x{w}/{mg}x{mw}"),
            (Some(gn), Some(w), _, _) => format!("Gen{gn} x{w}"),
            _ => "?".into(),
        };
        let ecc = h
            .ecc_enabled
            .map(|e| if e { "on" } else { "off" })
            .unwrap_or("?");
        let rows = match (
            h.remapped_rows_correctable,
            h.remapped_rows_uncorrectable,
            h.remapped_rows_pending,
        ) {
            (Some(c), Some(u), p) => {
                format!("{c}c/{u}u{}", if p == Some(true) { " PENDING" } else { "" })
            }
            _ => "n/a".into(),
        };
        println!(
            "{:<4} {:<42} {:<24} {:>6} GiB {:>9} {:>5} {:>14}",
            g.index,
            g.uuid,
            g.name,
            g.memory_total_bytes >> 30,
            pcie,
            ecc,
            rows
        );
    }
    Ok(0)
}

fn cmd_selftest(a: SelftestArgs) -> Result<u8, Fail> {
    let be = backend::cuda::CudaBackend::new()?;
    let inv = backend::Platform::inventory(&be)?;
    let mut ok = true;
    for g in &inv.gpus {
        let (found, bits) = memory::selftest(&be, g.index, a.mib << 20, a.flips)?;
        let pass = found == u64::from(a.flips) && bits == found;
        ok &= pass;
        println!(
            "GPU{}: planted {} bit flips, memory check found {found} (counted {bits} flipped bits): {}",
            g.index,
            a.flips,
            if pass { "PASS" } else { "FAIL" }
        );
    }
    Ok(if ok { 0 } else { 1 })
}
