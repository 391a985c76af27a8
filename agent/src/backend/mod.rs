//! The GPU plumbing every check stands on. Two implementations: [`cuda::CudaBackend`]
//! (cudarc + NVML, the real one) and [`sim::SimBackend`] (deterministic, for tests and demos
//! only; every report it produces says `simulated`). [`Platform`] is what the runner needs of
//! either (inventory, topology readings, telemetry); each check's own measurement lives in its
//! folder under `checks/` and matches on [`Backend`] to reach the implementation it needs.
//!
//! GPUs are named by their NVML index (the `GPU<n>` of `nvidia-smi`) everywhere; a backend maps
//! that to whatever it needs internally (the CUDA ordinal, by UUID).

pub mod children;
pub mod cuda;
pub mod sim;

use std::path::PathBuf;
use std::time::Duration;

use gpuval_crds::{GpuHealth, SystemInfo};
use serde::{Deserialize, Serialize};

/// Why a backend call failed. These are not hardware verdicts: a check that hits one reports
/// `Error` with this text, and the other checks go on. Serialisable so that it crosses from the
/// NCCL sweep's child process whole.
#[derive(Debug, Clone, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BackendError {
    /// A shared library (driver, NVML, NVRTC, cuBLAS) is not installed or not on the loader path.
    #[error("{library} is not available: {hint}")]
    MissingLibrary { library: String, hint: String },
    /// The driver loaded but reports no GPU.
    #[error("no NVIDIA GPU visible: {0}")]
    NoGpu(String),
    /// A GPU operation failed.
    #[error("GPU{gpu}: {what}: {detail}")]
    Gpu {
        gpu: u32,
        what: String,
        detail: String,
    },
    /// The GPU index does not exist on this host.
    #[error("GPU{0} does not exist on this host")]
    NoSuchGpu(u32),
    /// The run was asked to stop (SIGTERM) before the operation finished.
    #[error("stopped before completion")]
    Stopped,
    /// A collective's setup failed (NCCL's communicator, or this side's GPU work before it),
    /// with whose side the failure is on as NCCL's result and its own words put it.
    #[error("{message}")]
    CollectiveSetup { message: String, side: Side },
    /// A child process said nothing for longer than its limit and was killed.
    #[error("{0}")]
    Silent(String),
    /// A host call (an NCCL setup waiting for its peers, say) did not return in time.
    #[error("{0}")]
    Hung(String),
    /// The temporary directory cannot hold a child process's run directory (a read-only root
    /// filesystem with no writable `TMPDIR`, say): no NCCL sweep or training step can start.
    #[error(
        "the agent's temporary directory {} is not usable (creating {} failed: {source}): give the agent a writable temporary directory (in a pod: a writable volume, with TMPDIR pointing at it)",
        temp.display(),
        dir.display()
    )]
    TempDir {
        /// `std::env::temp_dir()`: `$TMPDIR`, else `/tmp`.
        temp: PathBuf,
        /// The run directory that could not be created.
        dir: PathBuf,
        #[source]
        source: IoCause,
    },
    #[error("{0}")]
    Other(String),
}

/// An I/O failure as the source of a [`BackendError`]: its words, kept as text so that the
/// error still crosses a process boundary whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{0}")]
pub struct IoCause(pub String);

impl From<std::io::Error> for IoCause {
    fn from(e: std::io::Error) -> Self {
        Self(e.to_string())
    }
}

/// Whose side a collective's failure is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Side {
    /// This node's own: its GPU, its NCCL or network setup.
    Own,
    /// A peer's: a remote process exited, or closed, reset or refused the connection.
    Peer,
}

impl BackendError {
    /// Ok where the library was found (`present`), else [`BackendError::MissingLibrary`].
    pub fn library_present(present: bool, library: &str, hint: &str) -> Result<(), Self> {
        if present {
            Ok(())
        } else {
            Err(Self::MissingLibrary {
                library: library.into(),
                hint: hint.into(),
            })
        }
    }

    pub fn gpu(gpu: u32, what: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        Self::Gpu {
            gpu,
            what: what.into(),
            detail: detail.to_string(),
        }
    }
}

/// Which implementation produced a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Cuda,
    Simulated,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Simulated => "simulated",
        }
    }
}

/// One GPU as inventoried (static facts and health signals).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// `00000000:18:00.0` as NVML writes it.
    pub pci_bus_id: String,
    pub memory_total_bytes: u64,
    pub memory_free_bytes: u64,
    /// `(major, minor)`, where known.
    pub compute_capability: Option<(i32, i32)>,
    pub health: GpuHealth,
}

/// The host's GPUs and driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub system: SystemInfo,
    pub gpus: Vec<GpuInfo>,
    /// GPUs NVML lists that CUDA does not see (left out of `gpus`; the report names them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<HiddenGpu>,
}

/// One NVLink link of a GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkReading {
    pub link: u32,
    pub active: bool,
    /// PCI bus id of what the link connects to (`FFFFFFFF:FF:FF.0` for an NVSwitch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_bus_id: Option<String>,
    /// `GPU`, `SWITCH`, `IBMNPU` or `UNKNOWN` (raw NVML remote device type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_type: Option<String>,
    /// NVML NVLink version enum translated to a generation (4 on Hopper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
}

/// One GPU's raw topology readings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopoGpu {
    pub index: u32,
    pub pci_bus_id: String,
    /// `nvmlDeviceGetCpuAffinity` bitmask words (64 CPUs per word, lowest first).
    pub cpu_affinity: Vec<u64>,
    /// NUMA nodes from `nvmlDeviceGetMemoryAffinity` (node scope); empty when unknown.
    pub numa_nodes: Vec<u32>,
    pub links: Vec<LinkReading>,
}

/// Raw NVML topology readings for the whole host: what `derive` turns into the
/// `nvidia-smi topo -m` matrix. Serialisable so readings from a GPU machine can be fixtures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologySnapshot {
    pub gpus: Vec<TopoGpu>,
    /// `ancestors[i][j]`: `nvmlDeviceGetTopologyCommonAncestor` as `INTERNAL`, `SINGLE`,
    /// `MULTIPLE`, `HOSTBRIDGE`, `NODE`, `SYSTEM`; None on the diagonal or where NVML refused.
    pub ancestors: Vec<Vec<Option<String>>>,
}

/// NVLink error counters of one link (NVML `nvmlDeviceGetNvLinkErrorCounter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkErrors {
    pub link: u32,
    pub replay: u64,
    pub recovery: u64,
    pub crc_flit: u64,
    pub crc_data: u64,
}

/// One telemetry sample of one GPU. Fields NVML does not give are None.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TelemetrySample {
    pub sm_clock_mhz: Option<f64>,
    pub memory_clock_mhz: Option<f64>,
    pub temperature_c: Option<f64>,
    pub power_w: Option<f64>,
    /// Active clock-throttle reasons, NVML names without prefix (`SwPowerCap`, `HwSlowdown`, ...).
    pub throttle_reasons: Vec<String>,
}

/// Power draw and throttle reasons of one GPU at one moment (the compute check's samples).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PowerReading {
    /// NVML's power reading (averaged over about a second on recent GPUs), W.
    pub average_w: Option<f64>,
    /// The instantaneous reading where the driver gives it, W.
    pub instant_w: Option<f64>,
    /// Active clock-throttle reasons, NVML names without prefix.
    pub throttle: Vec<String>,
}

/// Error counters read before and after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorCounters {
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
}

/// One GPU's PCIe link and error counters as NVML reports them; None where NVML does not
/// expose the figure (the AER counters need a recent driver and GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PcieReading {
    /// Current link generation and lane count.
    pub link_gen: Option<u32>,
    pub link_width: Option<u32>,
    /// The most the GPU and its slot together allow.
    pub max_gen: Option<u32>,
    pub max_width: Option<u32>,
    /// The most the GPU alone supports.
    pub gpu_max_gen: Option<u32>,
    /// Replay counter since the driver loaded.
    pub replays: Option<u64>,
    /// AER counters: correctable, uncorrectable non-fatal, uncorrectable fatal.
    pub correctable: Option<u64>,
    pub nonfatal: Option<u64>,
    pub fatal: Option<u64>,
}

/// A process NVML lists on a GPU: compute (CUDA) or graphics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuProcess {
    /// As the driver reports it (the host's pid where the agent runs in a container).
    pub pid: u32,
    /// The process's name as NVML reports it, where it can.
    pub name: Option<String>,
    /// GPU memory it holds, where NVML reports it.
    pub used_memory_bytes: Option<u64>,
    pub graphics: bool,
}

/// What NVML shows of a GPU's use by anyone, device-wide: the evidence a PID namespace does not
/// hide. In a pod NVML lists only the processes of the pod's own namespace, yet the device's
/// memory in use, its utilisation and its power count every process on it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Occupancy {
    /// Memory in use on the device, bytes: every process's, listed or not.
    pub used_bytes: Option<u64>,
    /// The processes NVML lists from here, read just before `used_bytes`...
    pub listed_before: Vec<GpuProcess>,
    /// ... and just after it (a process starting or ending between the readings is in one).
    pub listed_after: Vec<GpuProcess>,
    /// GPU utilisation samples (percent of the time a kernel ran) taken since the reading's
    /// `since`, oldest first.
    pub utilization: Vec<u32>,
    /// Per-process SM utilisation samples since `since` (pid as NVML gives it, percent), where
    /// the driver gives them.
    pub process_sm: Vec<(u32, u32)>,
    pub power_w: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
}

impl Occupancy {
    /// Memory in use that no process listed from here accounts for, bytes (None where NVML
    /// gave no device figure or no process list). The larger of the two lists' sums is taken,
    /// so a process of the agent's that starts or ends between the readings is never counted
    /// as someone else's.
    pub fn unlisted_bytes(&self) -> Option<u64> {
        let sum = |l: &[GpuProcess]| {
            l.iter()
                .map(|p| p.used_memory_bytes.unwrap_or(0))
                .sum::<u64>()
        };
        let listed = sum(&self.listed_before).max(sum(&self.listed_after));
        self.used_bytes.map(|u| u.saturating_sub(listed))
    }
}

/// A GPU that NVML lists but CUDA cannot see, so no check can reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HiddenGpu {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
}

/// An Xid error reported by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEvent {
    pub gpu: u32,
    pub xid: u64,
}

/// What the runner needs of a backend besides the checks' own measurements: inventory,
/// topology readings and the telemetry sampled during the run. Every method that takes a
/// `gpu` may be called from several threads at once.
pub trait Platform: Send + Sync {
    fn kind(&self) -> BackendKind;
    /// GPUs, driver versions, static health (ECC mode, remapped rows, PCIe link).
    fn inventory(&self) -> Result<Inventory, BackendError>;
    /// Raw topology readings (pair ancestors, NVLink link states, affinities).
    fn topology(&self) -> Result<TopologySnapshot, BackendError>;
    /// Error counters of the GPU's active NVLink links (empty without NVLink).
    fn nvlink_errors(&self, gpu: u32) -> Result<Vec<LinkErrors>, BackendError>;
    /// One telemetry sample.
    fn sample(&self, gpu: u32) -> Result<TelemetrySample, BackendError>;
    /// Volatile ECC counters (None where the GPU has no ECC).
    fn error_counters(&self, gpu: u32) -> Result<ErrorCounters, BackendError>;
    /// Xid events that arrived since the last call, waiting at most `timeout` for the first.
    fn poll_xid(&self, timeout: Duration) -> Vec<XidEvent>;
    /// The compute and graphics processes on the GPU now (the agent's own included).
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, BackendError>;
    /// Device-wide use of the GPU now ([`Occupancy`]), with the utilisation samples taken since
    /// `since`.
    fn occupancy(&self, gpu: u32, since: std::time::SystemTime) -> Result<Occupancy, BackendError>;
    /// The pids NVML reports for the agent's own process, where the backend learned them
    /// (they differ from `std::process::id()` inside a container).
    fn own_pids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// The backend a run uses. A check matches on it to reach its real or simulated
/// implementation; everything else goes through [`Backend::platform`].
pub enum Backend {
    Cuda(cuda::CudaBackend),
    Simulated(sim::SimBackend),
}

impl Backend {
    pub fn platform(&self) -> &dyn Platform {
        match self {
            Backend::Cuda(b) => b,
            Backend::Simulated(b) => b,
        }
    }

    pub fn kind(&self) -> BackendKind {
        self.platform().kind()
    }

    /// The disk fault a simulated node plants in the io check's file I/O (`disk=`); never on
    /// the real backend.
    pub fn planted_disk_fault(&self) -> Option<sim::disk::DiskFault> {
        match self {
            Backend::Cuda(_) => None,
            Backend::Simulated(b) => b.spec().disk,
        }
    }
}

/// Which backend to open: the one choice the CLI and the Kubernetes mode both make.
#[derive(Debug, Clone, PartialEq)]
// Made once per process: the simulated spec's size is of no consequence.
#[allow(clippy::large_enum_variant)]
pub enum BackendChoice {
    Cuda,
    /// Tests and demos only: the figures are not real.
    Simulated(sim::SimSpec),
}

/// This host's name: the kernel's (`/proc/sys/kernel/hostname`), else `$HOSTNAME`; None when
/// neither names one.
pub fn hostname() -> Option<String> {
    let from_proc = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    from_proc
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// Printed on stderr whenever the simulated backend is opened.
pub const SIMULATED_NOTE: &str =
    "note: SIMULATED backend: figures are not from real GPUs (tests and demos only)";

/// Opens the chosen backend. The real one loads the driver and NVML (a missing library is a
/// [`BackendError::MissingLibrary`], never a panic); the simulated one says so on stderr.
pub fn open(choice: &BackendChoice) -> Result<Backend, BackendError> {
    match choice {
        BackendChoice::Cuda => Ok(Backend::Cuda(cuda::CudaBackend::new()?)),
        BackendChoice::Simulated(spec) => {
            eprintln!("{SIMULATED_NOTE}");
            Ok(Backend::Simulated(sim::SimBackend::new(spec.clone())))
        }
    }
}
