//! A node's report: what the agent prints as JSON (`--output`) and stores in its
//! `GpuNodeResult`. Per-GPU figures, topology, telemetry, and a verdict with reasons in plain
//! words at each level (check, GPU, node).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::Dtype;
pub use crate::kinds::{BandwidthFloor, Verdict};
use crate::reason::Action;

/// The whole report of one node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// True when the figures come from the simulated backend (tests and demos only).
    pub simulated: bool,
    /// `cuda` (cudarc + NVML) or `simulated`.
    pub backend: String,
    pub agent_version: String,
    /// Kubernetes node name (or hostname on bare metal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// RFC 3339 times.
    pub started_at: String,
    pub finished_at: String,
    pub verdict: Verdict,
    /// The first failures (Fail and Error reasons, at most a handful), worst first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<crate::reason::Reason>,
    /// The first warnings (at most a handful), when the node passed with some.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<crate::reason::Reason>,
    /// The one step that covers the node's failures (or, without any, its warnings): the most
    /// drastic of their actions.
    #[serde(default)]
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemInfo>,
    /// The node against `spec.expect` (GPU count, bus ids) and its versions, judged before the
    /// checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<crate::facts::NodeFacts>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologyReport>,
    /// NVLink/PCIe peer-to-peer transfers between every ordered pair of GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p: Option<P2pResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoResult>,
    /// NCCL collectives over every GPU of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<crate::nccl::NcclResult>,
    /// A synthetic data-parallel training step over every GPU of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<crate::training::TrainingResult>,
}

impl NodeReport {
    /// The codes of the node's failures (or, without any, its warnings), worst first, each
    /// once, comma-separated: the result's `gpuval.io/codes` annotation.
    pub fn codes(&self) -> String {
        let reasons = if self.failures.is_empty() {
            &self.warnings
        } else {
            &self.failures
        };
        let mut codes: Vec<&str> = Vec::new();
        for r in reasons {
            if !codes.contains(&r.code.as_str()) {
                codes.push(r.code.as_str());
            }
        }
        codes.join(",")
    }

    /// The node's versions: from its facts, else from its system info.
    pub fn versions(&self) -> crate::facts::Versions {
        if let Some(f) = &self.facts {
            return f.versions.clone();
        }
        let s = self.system.clone().unwrap_or_default();
        crate::facts::Versions {
            driver: s.driver_version,
            vbios: None,
            cuda: s.cuda_driver_version,
            nccl: s.nccl_version,
        }
    }
}

/// Driver and library versions.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SystemInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The NCCL library the agent found (`2.28.3`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_version: Option<String>,
    /// The host's DMI identity, where readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostIdentity>,
    /// The host's RDMA adapters and their firmware, where readable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicIdentity>,
}

/// The host's identity from DMI (`/sys/class/dmi/id`), each where readable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostIdentity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
}

/// A network adapter (`/sys/class/infiniband/<name>`) and its firmware.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NicIdentity {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// The node GUID, where readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_guid: Option<String>,
}

/// One GPU as the agent saw it, with its check results.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuReport {
    /// NVML index (the `GPU<n>` of `nvidia-smi`).
    pub index: i32,
    pub uuid: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    pub memory_total_mib: i64,
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<GpuHealth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<ComputeResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_transfer: Option<HostTransferResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetrySummary>,
    /// Processes that were not the agent's on this GPU during the run (NVML's compute and
    /// graphics processes, read before the checks, sampled during them and read after).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign_processes: Vec<ForeignProcess>,
}

/// A process that was not the agent's, seen on a GPU under test.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ForeignProcess {
    pub pid: i64,
    /// Its name as NVML reports it (`unknown` where NVML cannot).
    pub name: String,
    /// The most GPU memory it was seen holding, MiB, where NVML reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_memory_mib: Option<i64>,
    /// When it was seen: `before` the checks, `during` them (sampled), `after` them.
    pub seen: Vec<String>,
}

/// Static health signals and board facts read before the checks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuHealth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_correctable: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_uncorrectable: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_pending: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows_failure: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_gen: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_max_gen: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_width: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_max_width: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence_mode: Option<bool>,
    /// MIG mode is on (None where the GPU has no MIG).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vbios_version: Option<String>,
    /// The board's serial number (NVML), where the board reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The board's part number (NVML), where the board reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_part_number: Option<String>,
    /// The InfoROM image version (NVML), where the board reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inforom_version: Option<String>,
}

/// Memory check result of one GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryResult {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    /// GiB under test (allocated and filled).
    pub tested_gib: f64,
    /// The fraction of free memory that was asked for.
    pub fraction: f64,
    pub passes: i32,
    /// Fill throughput, GB/s (1e9 bytes) of bytes written.
    pub fill_gbps: f64,
    /// Verify throughput, GB/s of bytes read.
    pub verify_gbps: f64,
    /// Fill+verify throughput: every byte written plus every byte read, over both phases.
    pub gbps: f64,
    /// 32-bit words that read back wrong, over all passes.
    pub mismatches: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_mismatches: Vec<Mismatch>,
    pub seconds: f64,
    /// Each pattern's figures (fillGbps, verifyGbps and gbps above are the address pattern's,
    /// or every pattern's together when it did not run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<crate::depth::PatternResult>,
    /// Which bits flipped, where any did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bit_flips: Option<crate::depth::BitFlips>,
    /// Remapped rows and retired pages before and after the test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_before: Option<crate::depth::RowHealth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_after: Option<crate::depth::RowHealth>,
}

/// A word that read back wrong.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Mismatch {
    /// Byte offset into the tested block.
    pub offset: i64,
    /// Expected and read values, hex.
    pub expected: String,
    pub actual: String,
}

/// Compute burn result of one GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ComputeResult {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    pub seconds: f64,
    pub matrix_size: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemms: Vec<GemmResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcendental: Option<TranscendentalResult>,
    /// Power drawn and clocks lost during the burn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<crate::depth::PowerResult>,
    /// The power pulse after the burn, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulse: Option<crate::depth::PulseResult>,
}

/// One data type's GEMM burn.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GemmResult {
    pub dtype: Dtype,
    /// Sustained TFLOP/s over the burn (2·n³ per product).
    pub tflops: f64,
    pub iterations: i64,
    /// Results compared against the first result slot: elements beyond the dtype's tolerance.
    pub mismatches: i64,
    /// Largest relative difference seen in those comparisons.
    pub max_rel_error: f64,
    pub seconds: f64,
}

/// The elementwise sin/exp kernel.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TranscendentalResult {
    /// Billions of elements per second (each element: several sin/exp evaluations).
    pub gelems_per_second: f64,
    pub iterations: i64,
    /// Elements whose result differed from the first run.
    pub mismatches: i64,
}

/// Host transfer result of one GPU. Rates in GB/s (1e9 bytes per second), each direction.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostTransferResult {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    /// Pinned host memory, this GPU alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<TransferRates>,
    /// Pageable host memory, this GPU alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pageable: Option<TransferRates>,
    /// Pinned, while every GPU of the node transfers at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_concurrent: Option<TransferRates>,
    /// NUMA node the host buffers were placed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// Bytes that differed after a host → GPU → host round trip.
    pub mismatches: i64,
    pub seconds: f64,
    /// The GPU's PCIe link under load and its error counters over the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<crate::depth::PcieResult>,
    /// The floor the pinned rates were held to, and where it came from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<BandwidthFloor>,
}

/// Host-to-device and device-to-host rates, GB/s.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TransferRates {
    pub h2d_gbps: f64,
    pub d2h_gbps: f64,
}

/// The peer-to-peer check of a node: one entry per ordered pair, in the order measured.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct P2pResult {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    /// Bytes per copy (MiB) and timed copies per sample.
    pub buffer_mib: i32,
    pub iterations: i32,
    pub pairs: Vec<P2pPair>,
    /// NVLink error counters that moved during the check (`GPU2 link 5: replay +3`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_errors: Vec<String>,
    pub seconds: f64,
    /// The floors the pairs were held to, and where each came from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<BandwidthFloor>,
}

/// One ordered pair: `src` sends, `dst` receives.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct P2pPair {
    pub src: i32,
    pub dst: i32,
    pub verdict: Verdict,
    /// Peer access was enabled (direct NVLink/PCIe transfers); otherwise copies were staged
    /// through host memory by the driver.
    pub peer_access: bool,
    /// GB/s, `src → dst`.
    pub unidirectional_gbps: f64,
    /// GB/s, both directions at once, summed.
    pub bidirectional_gbps: f64,
    /// One 4-byte copy-engine copy, microseconds.
    pub copy_latency_micros: f64,
    /// One dependent load by `dst` from `src`'s memory, nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_latency_nanos: Option<f64>,
    /// The same with peer access off (host-staged), when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_unidirectional_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_bidirectional_gbps: Option<f64>,
    /// 32-bit words that arrived wrong.
    pub mismatches: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Min, mean and max of a sampled value.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq)]
pub struct Stat {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

/// NVML telemetry sampled through the run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TelemetrySummary {
    pub samples: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<Stat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_clock_mhz: Option<Stat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<Stat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<Stat>,
    /// Every clock-throttle reason seen in any sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle_reasons: Vec<String>,
    /// Change of the volatile ECC counters across the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_corrected_delta: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorrected_delta: Option<i64>,
    /// Xid codes reported by NVML events during the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid_events: Vec<i64>,
    /// Each Xid seen, with its meaning from NVIDIA's catalogue.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<crate::xid::XidSeen>,
}

/// The node's GPU interconnect topology, like `nvidia-smi topo -m`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologyReport {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    /// Row/column labels (`GPU0`, `GPU1`, ...).
    pub gpus: Vec<String>,
    /// `matrix[i][j]`: X, NV#, PIX, PXB, PHB, NODE or SYS.
    pub matrix: Vec<Vec<String>>,
    /// Per GPU, the CPUs near it (`0-63`), and its NUMA node(s).
    pub cpu_affinity: Vec<String>,
    pub numa_affinity: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<NvlinkState>,
    /// How many times the link states were sampled during the run.
    pub samples: i32,
    /// Link state changes seen between samples (`GPU1 link 4 went down at +93s`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_changes: Vec<String>,
}

/// A GPU's NVLink links.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NvlinkState {
    pub gpu: i32,
    pub active: i32,
    /// Links the GPU has (NVML's link count).
    pub total: i32,
    /// NVLink generation (4 on Hopper), where NVML reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,
    /// What the active links connect to: `GPU`, `NVSwitch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
}

/// The file I/O check: files written, fsynced, read back and verified in a directory on the
/// node. Real file I/O on the host under either GPU backend.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IoResult {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    /// The directory asked for (the files went into a fresh subdirectory of it, since removed).
    pub dir: String,
    /// Filesystem type of that directory (`ext4`, `xfs`, `tmpfs`, ...), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_type: Option<String>,
    pub files: i32,
    pub file_size_mib: i64,
    pub concurrency: i32,
    /// Bytes written (and the same again read back).
    pub bytes: i64,
    /// MB/s (1e6 bytes): write including every fsync; read including verification.
    pub write_mbps: f64,
    pub read_mbps: f64,
    pub write_seconds: f64,
    pub read_seconds: f64,
    /// True when the files were written and read with O_DIRECT.
    pub direct_io: bool,
    /// Why direct I/O was not used, and what was done instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_io_note: Option<String>,
    /// True when the check ran while the compute burn ran.
    pub during_compute: bool,
    /// Free space in the directory's filesystem before the check, bytes.
    pub free_bytes_before: i64,
    /// 8-byte words that read back different from what was written.
    pub mismatches: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_mismatches: Vec<IoMismatch>,
    /// Facts worth knowing about how the figures were taken (not verdict reasons).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// An 8-byte word of a file that read back wrong.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IoMismatch {
    /// File name inside the check's working directory.
    pub file: String,
    /// Byte offset into the file.
    pub offset: i64,
    /// Expected and read values, hex.
    pub expected: String,
    pub actual: String,
}
