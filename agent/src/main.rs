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
use gpuval_agent::backend::{
    Backend, BackendError, cuda::CudaBackend, sim::SimBackend, sim::SimSpec,
};
use gpuval_agent::config::{self, Overrides, RunSettings};
use gpuval_agent::{checks, io_check, k8s, render, topology};
use gpuval_crds::{Dtype, Duration, Profile, Verdict};

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
    // ---- nccl check: the sweep process (begin) ----
    /// Runs one NCCL sweep for the nccl check (started by the agent itself), or with
    /// --standalone the whole check.
    #[command(name = "nccl-sweep", hide = true)]
    NcclSweep(Box<checks::nccl::standalone::SweepArgs>),
    // ---- nccl check: the sweep process (end) ----
}

#[derive(Args, Clone)]
struct BackendArgs {
    /// GPU backend. `simulated` is for tests and demos only: its figures are not real.
    #[arg(long, value_enum, default_value_t = BackendChoice::Cuda)]
    backend: BackendChoice,
    /// Simulated machine and faults, e.g. `gpus=8,model=H200,fail=memory@2` (implies --backend simulated).
    #[arg(long, value_name = "SPEC")]
    simulate: Option<String>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum BackendChoice {
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
    /// Run exactly these checks (comma-separated): topology, memory, compute, p2p,
    /// hostTransfer, io.
    #[arg(long, value_delimiter = ',')]
    checks: Option<Vec<String>>,
    /// Fraction of each GPU's free memory to test (0 < f ≤ 1).
    #[arg(long)]
    memory_fraction: Option<f64>,
    #[arg(long)]
    memory_passes: Option<i32>,
    /// Compute burn duration, like 60s, 5m, 1h.
    #[arg(long)]
    duration: Option<Duration>,
    /// GEMM data types (comma-separated): bf16, fp16, tf32, fp32.
    #[arg(long, value_delimiter = ',')]
    dtypes: Option<Vec<Dtype>>,
    #[arg(long)]
    matrix_size: Option<i32>,
    #[arg(long)]
    no_transcendentals: bool,
    /// Peer-to-peer copy size in MiB.
    #[arg(long)]
    p2p_buffer_mib: Option<i32>,
    /// Peer-to-peer timed copies per sample.
    #[arg(long)]
    p2p_iterations: Option<i32>,
    /// Also measure every pair with peer access off (host-staged copies).
    #[arg(long)]
    host_staged: bool,
    /// Host transfer copy size in MiB.
    #[arg(long)]
    host_buffer_mib: Option<i32>,
    /// Model expectations: Auto, H100, H200, A100, None.
    #[arg(long)]
    profile: Option<ProfileArg>,
    /// Relative rule: a GPU more than this many percent below its peers fails.
    #[arg(long)]
    tolerance: Option<i32>,
    /// Directory the io check writes in (a fresh subdirectory, removed afterwards). The io
    /// check is real file I/O on this host under either backend.
    #[arg(long, env = "GPUVAL_IO_DIR", value_name = "DIR")]
    io_dir: Option<PathBuf>,
    /// io: size of each file, MiB.
    #[arg(long)]
    io_file_size_mib: Option<i32>,
    /// io: number of files written and read back.
    #[arg(long)]
    io_files: Option<i32>,
    /// io: concurrent writers and readers.
    #[arg(long)]
    io_concurrency: Option<i32>,
    /// io: buffered I/O instead of O_DIRECT.
    #[arg(long)]
    io_buffered: bool,
    /// io: run beside the compute burn instead of after the GPU checks.
    #[arg(long)]
    io_during_compute: bool,
    /// io: fail below this write throughput, MB/s.
    #[arg(long)]
    io_min_write_mbps: Option<i32>,
    /// io: fail below this read throughput, MB/s.
    #[arg(long)]
    io_min_read_mbps: Option<i32>,
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
    /// Write the JSON report here.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// Print the JSON report on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum ProfileArg {
    Auto,
    H100,
    H200,
    A100,
    None,
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
        // nccl check: the sweep process answers on stdout and exits on its own.
        Command::NcclSweep(a) => return checks::nccl::standalone::command(*a),
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

fn backend(args: &BackendArgs) -> Result<Box<dyn Backend>, Fail> {
    if args.backend == BackendChoice::Simulated || args.simulate.is_some() {
        let spec: SimSpec = args
            .simulate
            .as_deref()
            .unwrap_or("")
            .parse()
            .map_err(|e| Fail(format!("--simulate: {e}"), 2))?;
        eprintln!("note: SIMULATED backend: figures are not from real GPUs (tests and demos only)");
        return Ok(Box::new(SimBackend::new(spec)));
    }
    Ok(Box::new(CudaBackend::new()?))
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
    let overrides = Overrides {
        checks: a.checks.clone(),
        memory_fraction: a.memory_fraction,
        memory_passes: a.memory_passes,
        duration: a.duration,
        dtypes: a.dtypes.clone(),
        matrix_size: a.matrix_size,
        no_transcendentals: a.no_transcendentals,
        p2p_buffer_mib: a.p2p_buffer_mib,
        p2p_iterations: a.p2p_iterations,
        host_staged: a.host_staged,
        host_buffer_mib: a.host_buffer_mib,
        profile: a.profile.map(|p| match p {
            ProfileArg::Auto => Profile::Auto,
            ProfileArg::H100 => Profile::H100,
            ProfileArg::H200 => Profile::H200,
            ProfileArg::A100 => Profile::A100,
            ProfileArg::None => Profile::None,
        }),
        tolerance: a.tolerance,
        io_file_size_mib: a.io_file_size_mib,
        io_files: a.io_files,
        io_concurrency: a.io_concurrency,
        io_buffered: a.io_buffered,
        io_during_compute: a.io_during_compute,
        io_min_write_mbps: a.io_min_write_mbps,
        io_min_read_mbps: a.io_min_read_mbps,
    };
    let settings = overrides.apply(base).map_err(|e| Fail(e, 2))?;
    let be = backend(&a.backend)?;
    let stop = stop_flag();
    let mut plan = checks::Plan::new(settings.checks, settings.thresholds);
    plan.gpus = a.gpus.clone();
    plan.io_dir = a.io_dir.clone();
    plan.io_tuning = io_check::Tuning {
        block_size: a.io_block_kib.map(|k| k.saturating_mul(1024)),
        skip_preflight: a.io_skip_preflight,
    };
    plan.node = std::env::var("NODE_NAME").ok().or_else(hostname);
    let report = checks::run(be.as_ref(), &plan, &stop, &|line| eprintln!("{line}"));
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| Fail(format!("serialise the report: {e}"), 2))?;
    if let Some(path) = &a.output {
        std::fs::write(path, &json)
            .map_err(|e| Fail(format!("write {}: {e}", path.display()), 2))?;
        eprintln!("report written to {}", path.display());
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

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn cmd_topo(a: TopoArgs) -> Result<u8, Fail> {
    let be = backend(&a.backend)?;
    let snap = be.topology()?;
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
    let inv = be.inventory()?;
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
    let be = CudaBackend::new()?;
    let inv = be.inventory()?;
    let mut ok = true;
    for g in &inv.gpus {
        let found = be.memory_selftest(g.index, a.mib << 20, a.flips)?;
        let pass = found == u64::from(a.flips);
        ok &= pass;
        println!(
            "GPU{}: planted {} bit flips, memory check found {found}: {}",
            g.index,
            a.flips,
            if pass { "PASS" } else { "FAIL" }
        );
    }
    Ok(if ok { 0 } else { 1 })
}
