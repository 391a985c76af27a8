//! The one interface every GPU check goes through. Two implementations:
//! [`cuda::CudaBackend`] (cudarc + NVML, the real one) and [`sim::SimBackend`] (deterministic,
//! for tests and demos only; every report it produces says `simulated`).
//!
//! GPUs are named by their NVML index (the `GPU<n>` of `nvidia-smi`) everywhere; a backend maps
//! that to whatever it needs internally (the CUDA ordinal, by UUID).

pub mod cuda;
pub mod sim;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpuval_crds::{Dtype, GpuHealth, Mismatch, SystemInfo};
use serde::{Deserialize, Serialize};

/// Why a backend call failed. These are not hardware verdicts: a check that hits one reports
/// `Error` with this text, and the other checks go on.
#[derive(Debug, Clone, thiserror::Error)]
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
    #[error("{0}")]
    Other(String),
}

impl BackendError {
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

/// Memory check parameters for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryRequest {
    /// Fraction of free memory to allocate and test.
    pub fraction: f64,
    /// Each pass writes and verifies a pattern and then its bitwise inverse, with a new seed.
    pub passes: u32,
    /// How many mismatches to record with their address.
    pub max_logged: usize,
}

/// What a memory test measured on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemoryOutcome {
    pub total_bytes: u64,
    pub free_bytes_before: u64,
    pub bytes_tested: u64,
    /// Seconds spent in fill kernels and verify kernels (device-timed).
    pub fill_seconds: f64,
    pub verify_seconds: f64,
    /// Bytes written by fills and read by verifies, over all passes.
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub passes: u32,
    /// Mismatched 32-bit words over all passes.
    pub mismatches: u64,
    pub first_mismatches: Vec<Mismatch>,
}

/// Compute burn parameters for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeRequest {
    /// Total burn time; split evenly among the dtypes.
    pub duration: Duration,
    pub dtypes: Vec<Dtype>,
    pub matrix_size: usize,
    pub transcendentals: bool,
}

/// One dtype's burn on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmOutcome {
    pub dtype: Dtype,
    /// Floating-point operations done by the timed GEMMs (2·n³ each).
    pub flops: f64,
    /// Device-timed seconds of the GEMM batches.
    pub gemm_seconds: f64,
    pub iterations: u64,
    /// Result slots compared with the first one, and elements that differed beyond tolerance.
    pub comparisons: u64,
    pub mismatches: u64,
    pub max_rel_error: f64,
    pub wall_seconds: f64,
}

impl GemmOutcome {
    pub fn tflops(&self) -> f64 {
        if self.gemm_seconds > 0.0 {
            self.flops / self.gemm_seconds / 1e12
        } else {
            0.0
        }
    }
}

/// The elementwise transcendental kernel on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TranscendentalOutcome {
    /// Elements per run (each element does many sin/exp rounds); the rate is elements × iterations / seconds.
    pub elements: u64,
    pub seconds: f64,
    pub iterations: u64,
    pub mismatches: u64,
}

/// What a compute burn measured on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ComputeOutcome {
    pub gemms: Vec<GemmOutcome>,
    pub transcendental: Option<TranscendentalOutcome>,
    pub seconds: f64,
}

/// Peer-to-peer check parameters for a set of GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct P2pRequest {
    /// Bytes per copy.
    pub buffer_bytes: u64,
    /// Timed copies per sample; the figure is the median of [`P2pRequest::samples`] samples.
    pub iterations: u32,
    pub samples: u32,
    /// Small (4-byte) copies timed back to back for the copy-engine latency.
    pub latency_copies: u32,
    /// Dependent loads in the device-side pointer chase.
    pub chase_steps: u32,
    /// Also measure every pair with peer access off (copies staged through host memory).
    pub host_staged: bool,
    /// Seed of the pair order (shuffled so a slow pair is not always measured at the same
    /// moment of the run).
    pub seed: u64,
}

/// What one ordered pair (`src` sends to `dst`) measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PairOutcome {
    pub src: u32,
    pub dst: u32,
    /// Peer access was possible and enabled (otherwise the driver stages copies through host
    /// memory and the device-side latency is not measured).
    pub peer_access: bool,
    /// `src → dst`, issued on the source GPU's copy engine, GB/s (1e9).
    pub unidirectional_gbps: f64,
    /// `src → dst` and `dst → src` at once, one stream each, sum of both directions.
    pub bidirectional_gbps: f64,
    /// One 4-byte copy, averaged over back-to-back copies, microseconds.
    pub copy_latency_us: f64,
    /// One dependent load by `dst` from `src`'s memory (pointer chase), nanoseconds.
    pub load_latency_ns: Option<f64>,
    /// The same copies with peer access off (host-staged), when asked for.
    pub staged_unidirectional_gbps: Option<f64>,
    pub staged_bidirectional_gbps: Option<f64>,
    /// 32-bit words that arrived wrong, over every verified copy.
    pub mismatches: u64,
    /// Why this pair could not be measured; the other pairs go on.
    pub error: Option<String>,
}

/// What the peer-to-peer check measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct P2pOutcome {
    /// In the order they were measured.
    pub pairs: Vec<PairOutcome>,
    pub seconds: f64,
}

/// Host transfer parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTransferRequest {
    pub buffer_bytes: u64,
    /// Timed copies per sample (median of `samples`).
    pub iterations: u32,
    pub samples: u32,
    pub pinned: bool,
    pub pageable: bool,
}

/// Host-to-device and device-to-host rates of one GPU, GB/s (1e9).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DirectionRates {
    pub h2d_gbps: f64,
    pub d2h_gbps: f64,
}

/// What the host transfer check measured on one GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostTransferOutcome {
    /// Pinned memory, this GPU alone.
    pub pinned: Option<DirectionRates>,
    /// Pageable memory, this GPU alone.
    pub pageable: Option<DirectionRates>,
    /// Pinned memory while every GPU of the node transfers at once.
    pub pinned_concurrent: Option<DirectionRates>,
    /// NUMA node the host buffers were placed near (the GPU's, where known).
    pub numa_node: Option<u32>,
    /// Bytes that came back different after a host → device → host round trip.
    pub mismatches: u64,
    pub seconds: f64,
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

/// Error counters read before and after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorCounters {
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
}

/// An Xid error reported by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEvent {
    pub gpu: u32,
    pub xid: u64,
}

/// Cancellation and progress for long operations.
pub struct RunControl<'a> {
    stop: &'a AtomicBool,
    progress: &'a (dyn Fn(f64, &str) + Sync),
}

impl<'a> RunControl<'a> {
    pub fn new(stop: &'a AtomicBool, progress: &'a (dyn Fn(f64, &str) + Sync)) -> Self {
        Self { stop, progress }
    }
    /// True once a stop was requested (SIGTERM, deadline).
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    /// Reports progress: `done` in 0..=1 and a short note (`bf16 781 TFLOP/s`).
    pub fn progress(&self, done: f64, note: &str) {
        (self.progress)(done.clamp(0.0, 1.0), note)
    }
}

/// Fisher–Yates with a small xorshift generator: the order is reproducible from the seed.
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut x = seed | 1;
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// A GPU backend. Every method that takes a `gpu` may be called from several threads at once,
/// one per GPU; the checks run all GPUs concurrently.
pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    /// GPUs, driver versions, static health (ECC mode, remapped rows, PCIe link).
    fn inventory(&self) -> Result<Inventory, BackendError>;
    /// Raw topology readings (pair ancestors, NVLink link states, affinities).
    fn topology(&self) -> Result<TopologySnapshot, BackendError>;
    /// Fill a fraction of free memory with address-dependent patterns and verify every word.
    fn memory_test(
        &self,
        gpu: u32,
        req: &MemoryRequest,
        ctl: &RunControl<'_>,
    ) -> Result<MemoryOutcome, BackendError>;
    /// Sustained GEMM (and transcendental) burn with results cross-checked.
    fn compute_burn(
        &self,
        gpu: u32,
        req: &ComputeRequest,
        ctl: &RunControl<'_>,
    ) -> Result<ComputeOutcome, BackendError>;
    /// Peer-to-peer bandwidth and latency between every ordered pair of `gpus`.
    fn p2p(
        &self,
        gpus: &[u32],
        req: &P2pRequest,
        ctl: &RunControl<'_>,
    ) -> Result<P2pOutcome, BackendError>;
    /// Host ↔ device bandwidth of each of `gpus`, alone and all at once. Per-GPU failures are
    /// reported per GPU.
    fn host_transfer(
        &self,
        gpus: &[u32],
        req: &HostTransferRequest,
        ctl: &RunControl<'_>,
    ) -> BTreeMap<u32, Result<HostTransferOutcome, BackendError>>;
    /// Error counters of the GPU's active NVLink links (empty without NVLink).
    fn nvlink_errors(&self, gpu: u32) -> Result<Vec<LinkErrors>, BackendError>;
    /// One telemetry sample.
    fn sample(&self, gpu: u32) -> Result<TelemetrySample, BackendError>;
    /// Volatile ECC counters (None where the GPU has no ECC).
    fn error_counters(&self, gpu: u32) -> Result<ErrorCounters, BackendError>;
    /// Xid events that arrived since the last call, waiting at most `timeout` for the first.
    fn poll_xid(&self, timeout: Duration) -> Vec<XidEvent>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_is_a_reproducible_permutation() {
        let mut a: Vec<u32> = (0..56).collect();
        let mut b = a.clone();
        shuffle(&mut a, 7);
        shuffle(&mut b, 7);
        assert_eq!(a, b);
        assert_ne!(a, (0..56).collect::<Vec<_>>(), "the order should change");
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..56).collect::<Vec<_>>());
    }
}
