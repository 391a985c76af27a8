//! Simulated backend (tests and demos only): a deterministic node of H100, H200 or A100 GPUs,
//! with faults injected from a spec string such as
//! `gpus=8,model=H200,fail=memory@2+compute@5,slow=compute@3:0.5+p2p@6:0.3,xid=1:79,linkdown=2:4,error=memory@1,timescale=0.01`
//! (checks: `memory`, `compute`, `p2p` (every pair of that GPU), `host` (host transfers)).
//!
//! Every figure is a pure function of the spec, the GPU and the request (telemetry also of how
//! many samples were taken), so two runs with the same spec give the same report.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use gpuval_crds::{Dtype, GpuHealth, Mismatch, SystemInfo};

use super::{
    Backend, BackendError, BackendKind, ComputeOutcome, ComputeRequest, DirectionRates,
    ErrorCounters, GemmOutcome, GpuInfo, HostTransferOutcome, HostTransferRequest, Inventory,
    LinkErrors, LinkReading, MemoryOutcome, MemoryRequest, P2pOutcome, P2pRequest, PairOutcome,
    RunControl, TelemetrySample, TopoGpu, TopologySnapshot, TranscendentalOutcome, XidEvent,
};

/// The keys a spec string may use.
pub const SPEC_KEYS: &str = "gpus, model, fail, slow, xid, linkdown, error, timescale";
/// The most GPUs a simulated node may have.
pub const MAX_GPUS: u32 = 64;
/// The longest sleep between stop checks.
const STEP: Duration = Duration::from_millis(50);
/// Wall time of a memory test when `timescale` is above 0.
const MEMORY_WALL: Duration = Duration::from_millis(20);
/// Memory the driver and context keep on a fresh GPU.
const RESERVED_MIB: u64 = 600;
const MIB: u64 = 1024 * 1024;

/// A simulated GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SimModel {
    H100,
    #[default]
    H200,
    A100,
}

impl SimModel {
    pub fn as_str(self) -> &'static str {
        match self {
            SimModel::H100 => "H100",
            SimModel::H200 => "H200",
            SimModel::A100 => "A100",
        }
    }
    fn memory_mib(self) -> u64 {
        match self {
            SimModel::H100 => 81_559,
            SimModel::H200 => 143_771,
            SimModel::A100 => 81_920,
        }
    }
    /// NVLink links per GPU (all to NVSwitches).
    fn nvlinks(self) -> u32 {
        match self {
            SimModel::A100 => 12,
            _ => 18,
        }
    }
    fn nvlink_version(self) -> u32 {
        match self {
            SimModel::A100 => 3,
            _ => 4,
        }
    }
    fn pcie_gen(self) -> i32 {
        match self {
            SimModel::A100 => 4,
            _ => 5,
        }
    }
    fn compute_capability(self) -> (i32, i32) {
        match self {
            SimModel::A100 => (8, 0),
            _ => (9, 0),
        }
    }
    /// Healthy fill+verify throughput, GB/s.
    fn memory_gbps(self) -> f64 {
        match self {
            SimModel::H100 => 2900.0,
            SimModel::H200 => 4000.0,
            SimModel::A100 => 1800.0,
        }
    }
    /// Healthy sustained GEMM TFLOP/s.
    fn tflops(self, d: Dtype) -> f64 {
        let (bf16, tf32, fp32) = match self {
            SimModel::H100 => (760.0, 380.0, 51.0),
            SimModel::H200 => (780.0, 390.0, 52.0),
            SimModel::A100 => (270.0, 135.0, 18.5),
        };
        match d {
            Dtype::Bf16 => bf16,
            Dtype::Fp16 => bf16 * 1.005,
            Dtype::Tf32 => tf32,
            Dtype::Fp32 => fp32,
        }
    }
    /// Healthy peer-to-peer figures: (unidirectional GB/s, bidirectional GB/s, copy latency µs,
    /// load latency ns), NVLink through NVSwitches.
    fn p2p(self) -> (f64, f64, f64, f64) {
        match self {
            SimModel::A100 => (230.0, 450.0, 9.5, 950.0),
            _ => (392.0, 770.0, 8.1, 850.0),
        }
    }
    /// Healthy pinned host transfer rate per direction, GB/s (PCIe Gen5 or Gen4 x16).
    fn host_gbps(self) -> f64 {
        match self {
            SimModel::A100 => 24.5,
            _ => 55.3,
        }
    }
    /// Transcendental kernel rate, billions of elements per second.
    fn gelems(self) -> f64 {
        match self {
            SimModel::A100 => 60.0,
            _ => 110.0,
        }
    }
    /// (max SM clock MHz, memory clock MHz, power limit W).
    fn clocks_power(self) -> (f64, f64, f64) {
        match self {
            SimModel::H100 => (1980.0, 2619.0, 700.0),
            SimModel::H200 => (1980.0, 3201.0, 700.0),
            SimModel::A100 => (1410.0, 1593.0, 400.0),
        }
    }
}

impl fmt::Display for SimModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SimModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [SimModel::H100, SimModel::H200, SimModel::A100]
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown model {s:?}: use H100, H200 or A100"))
    }
}

/// A check a fault can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimCheck {
    Memory,
    Compute,
    /// Every pair the GPU is part of.
    P2p,
    /// Host transfers.
    Host,
}

impl fmt::Display for SimCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimCheck::Memory => "memory",
            SimCheck::Compute => "compute",
            SimCheck::P2p => "p2p",
            SimCheck::Host => "host",
        })
    }
}

impl FromStr for SimCheck {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "memory" => Ok(SimCheck::Memory),
            "compute" => Ok(SimCheck::Compute),
            "p2p" => Ok(SimCheck::P2p),
            "host" => Ok(SimCheck::Host),
            _ => Err(format!(
                "unknown check {s:?}: use memory, compute, p2p or host"
            )),
        }
    }
}

/// What to simulate. Parsed from `key=value` parts separated by commas; list values are
/// joined with `+`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSpec {
    /// `gpus=8`: number of GPUs.
    pub gpus: u32,
    /// `model=H200`: H100, H200 or A100.
    pub model: SimModel,
    /// `fail=memory@2+compute@5`: that check finds corrupted results on that GPU.
    pub fail: Vec<(SimCheck, u32)>,
    /// `slow=compute@3:0.5`: that check's throughput on that GPU is scaled by the factor.
    pub slow: Vec<(SimCheck, u32, f64)>,
    /// `xid=1:79`: GPU 1 reports Xid 79 once.
    pub xid: Vec<(u32, u64)>,
    /// `linkdown=2:4`: GPU 2's NVLink link 4 is down.
    pub linkdown: Vec<(u32, u32)>,
    /// `error=memory@1`: that check cannot run on that GPU (a backend error).
    pub error: Vec<(SimCheck, u32)>,
    /// `timescale=0.01`: wall time spent per simulated second of burn (0: none).
    pub timescale: f64,
}

impl Default for SimSpec {
    fn default() -> Self {
        Self {
            gpus: 8,
            model: SimModel::H200,
            fail: Vec::new(),
            slow: Vec::new(),
            xid: Vec::new(),
            linkdown: Vec::new(),
            error: Vec::new(),
            timescale: 0.0,
        }
    }
}

/// A spec string that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("simulated backend spec: bad part {part:?}: {why} (valid keys: {keys})", keys = SPEC_KEYS)]
pub struct SimSpecError {
    /// The offending `key=value` part.
    pub part: String,
    pub why: String,
}

impl FromStr for SimSpec {
    type Err = SimSpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut spec = SimSpec::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = |why: String| SimSpecError {
                part: part.to_string(),
                why,
            };
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad("expected key=value".to_string()))?;
            spec.set(key.trim(), value.trim()).map_err(bad)?;
        }
        spec.validate()?;
        Ok(spec)
    }
}

impl SimSpec {
    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "gpus" => self.gpus = parse_num(value, "a GPU count")?,
            "model" => self.model = value.parse()?,
            "fail" => self.fail.extend(parse_list(value, parse_check_at)?),
            "slow" => self.slow.extend(parse_list(value, parse_slow)?),
            "xid" => self.xid.extend(parse_list(value, parse_xid)?),
            "linkdown" => self.linkdown.extend(parse_list(value, parse_linkdown)?),
            "error" => self.error.extend(parse_list(value, parse_check_at)?),
            "timescale" => self.timescale = parse_timescale(value)?,
            _ => return Err(format!("unknown key {key:?}")),
        }
        Ok(())
    }

    /// Checks what only makes sense once every part is read (GPU and link numbers).
    fn validate(&self) -> Result<(), SimSpecError> {
        if self.gpus > MAX_GPUS {
            return Err(invalid(
                format!("gpus={}", self.gpus),
                format!("at most {MAX_GPUS} GPUs"),
            ));
        }
        let gpu_refs = self
            .fail
            .iter()
            .map(|(c, g)| (format!("fail={c}@{g}"), *g))
            .chain(
                self.error
                    .iter()
                    .map(|(c, g)| (format!("error={c}@{g}"), *g)),
            )
            .chain(
                self.slow
                    .iter()
                    .map(|(c, g, f)| (format!("slow={c}@{g}:{f}"), *g)),
            )
            .chain(self.xid.iter().map(|(g, x)| (format!("xid={g}:{x}"), *g)))
            .chain(
                self.linkdown
                    .iter()
                    .map(|(g, l)| (format!("linkdown={g}:{l}"), *g)),
            );
        for (part, gpu) in gpu_refs {
            if gpu >= self.gpus {
                let why = format!("GPU{gpu} does not exist (gpus={})", self.gpus);
                return Err(invalid(part, why));
            }
        }
        let links = self.model.nvlinks();
        if let Some((g, l)) = self.linkdown.iter().find(|(_, l)| *l >= links) {
            let why = format!("{} GPUs have links 0 to {}", self.model, links - 1);
            return Err(invalid(format!("linkdown={g}:{l}"), why));
        }
        Ok(())
    }

    /// The product of the `slow` factors for that check on that GPU.
    fn slowdown(&self, check: SimCheck, gpu: u32) -> f64 {
        self.slow
            .iter()
            .filter(|(c, g, _)| *c == check && *g == gpu)
            .map(|(_, _, f)| *f)
            .product()
    }
}

impl fmt::Display for SimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpus={},model={}", self.gpus, self.model)?;
        let join = |items: Vec<String>| items.join("+");
        if !self.fail.is_empty() {
            write!(
                f,
                ",fail={}",
                join(self.fail.iter().map(|(c, g)| format!("{c}@{g}")).collect())
            )?;
        }
        if !self.slow.is_empty() {
            let items = self
                .slow
                .iter()
                .map(|(c, g, x)| format!("{c}@{g}:{x}"))
                .collect();
            write!(f, ",slow={}", join(items))?;
        }
        if !self.xid.is_empty() {
            write!(
                f,
                ",xid={}",
                join(self.xid.iter().map(|(g, x)| format!("{g}:{x}")).collect())
            )?;
        }
        if !self.linkdown.is_empty() {
            let items = self
                .linkdown
                .iter()
                .map(|(g, l)| format!("{g}:{l}"))
                .collect();
            write!(f, ",linkdown={}", join(items))?;
        }
        if !self.error.is_empty() {
            write!(
                f,
                ",error={}",
                join(self.error.iter().map(|(c, g)| format!("{c}@{g}")).collect())
            )?;
        }
        write!(f, ",timescale={}", self.timescale)
    }
}

/// True when `check@gpu` is in the list.
fn listed(list: &[(SimCheck, u32)], check: SimCheck, gpu: u32) -> bool {
    list.contains(&(check, gpu))
}

fn invalid(part: String, why: String) -> SimSpecError {
    SimSpecError { part, why }
}

fn parse_num<T: FromStr>(value: &str, what: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{value:?} is not {what}"))
}

fn parse_list<T>(value: &str, item: fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    value.split('+').map(|v| item(v.trim())).collect()
}

/// `memory@2`.
fn parse_check_at(value: &str) -> Result<(SimCheck, u32), String> {
    let (check, gpu) = value
        .split_once('@')
        .ok_or_else(|| format!("{value:?} is not CHECK@GPU (like memory@2)"))?;
    Ok((check.parse()?, parse_num(gpu, "a GPU index")?))
}

/// `compute@3:0.5`.
fn parse_slow(value: &str) -> Result<(SimCheck, u32, f64), String> {
    let (at, factor) = value
        .split_once(':')
        .ok_or_else(|| format!("{value:?} is not CHECK@GPU:FACTOR (like compute@3:0.5)"))?;
    let (check, gpu) = parse_check_at(at)?;
    let factor: f64 = parse_num(factor, "a factor")?;
    if !(factor.is_finite() && factor > 0.0 && factor <= 10.0) {
        return Err(format!("factor {factor} must be above 0 and at most 10"));
    }
    Ok((check, gpu, factor))
}

/// `1:79`.
fn parse_xid(value: &str) -> Result<(u32, u64), String> {
    let (gpu, xid) = value
        .split_once(':')
        .ok_or_else(|| format!("{value:?} is not GPU:XID (like 1:79)"))?;
    Ok((
        parse_num(gpu, "a GPU index")?,
        parse_num(xid, "an Xid code")?,
    ))
}

/// `2:4`.
fn parse_linkdown(value: &str) -> Result<(u32, u32), String> {
    let (gpu, link) = value
        .split_once(':')
        .ok_or_else(|| format!("{value:?} is not GPU:LINK (like 2:4)"))?;
    Ok((
        parse_num(gpu, "a GPU index")?,
        parse_num(link, "a link number")?,
    ))
}

fn parse_timescale(value: &str) -> Result<f64, String> {
    let t: f64 = parse_num(value, "a number")?;
    if t.is_finite() && (0.0..=1000.0).contains(&t) {
        Ok(t)
    } else {
        Err(format!("timescale {t} must be between 0 and 1000"))
    }
}

/// The simulated backend. Reports say `simulated`; nothing here touches a GPU.
pub struct SimBackend {
    spec: SimSpec,
    /// Xid events not yet handed out by `poll_xid`.
    xids: Mutex<Vec<XidEvent>>,
    /// Telemetry samples taken so far, per GPU.
    samples: Vec<AtomicU64>,
}

impl SimBackend {
    pub fn new(spec: SimSpec) -> Self {
        let xids = spec
            .xid
            .iter()
            .map(|&(gpu, xid)| XidEvent { gpu, xid })
            .collect();
        let samples = (0..spec.gpus).map(|_| AtomicU64::new(0)).collect();
        Self {
            spec,
            xids: Mutex::new(xids),
            samples,
        }
    }

    pub fn spec(&self) -> &SimSpec {
        &self.spec
    }

    fn check_gpu(&self, gpu: u32) -> Result<(), BackendError> {
        if gpu < self.spec.gpus {
            Ok(())
        } else {
            Err(BackendError::NoSuchGpu(gpu))
        }
    }

    fn injected_error(&self, check: SimCheck, gpu: u32) -> Result<(), BackendError> {
        if listed(&self.spec.error, check, gpu) {
            let detail = format!("simulated failure (error={check}@{gpu})");
            return Err(BackendError::gpu(gpu, format!("{check} check"), detail));
        }
        Ok(())
    }

    fn total_bytes(&self) -> u64 {
        self.spec.model.memory_mib() * MIB
    }

    fn free_bytes(&self) -> u64 {
        self.total_bytes() - RESERVED_MIB * MIB
    }

    fn gpu_info(&self, index: u32) -> GpuInfo {
        let gen_ = self.spec.model.pcie_gen();
        GpuInfo {
            index,
            uuid: format!("GPU-sim-{index}"),
            name: format!("NVIDIA {} (simulated)", self.spec.model),
            pci_bus_id: bus_id(index),
            memory_total_bytes: self.total_bytes(),
            memory_free_bytes: self.free_bytes(),
            compute_capability: Some(self.spec.model.compute_capability()),
            health: GpuHealth {
                ecc_enabled: Some(true),
                remapped_rows_correctable: Some(0),
                remapped_rows_uncorrectable: Some(0),
                remapped_rows_pending: Some(false),
                remapped_rows_failure: Some(false),
                pcie_gen: Some(gen_),
                pcie_max_gen: Some(gen_),
                pcie_width: Some(16),
                pcie_max_width: Some(16),
            },
        }
    }

    fn topo_gpu(&self, index: u32) -> TopoGpu {
        let socket = self.socket(index);
        let links = (0..self.spec.model.nvlinks())
            .map(|link| {
                let up = !self.spec.linkdown.contains(&(index, link));
                LinkReading {
                    link,
                    active: up,
                    remote_bus_id: up.then(|| "FFFFFFFF:FF:FF.0".to_string()),
                    remote_type: up.then(|| "SWITCH".to_string()),
                    version: Some(self.spec.model.nvlink_version()),
                }
            })
            .collect();
        TopoGpu {
            index,
            pci_bus_id: bus_id(index),
            cpu_affinity: if socket == 0 {
                vec![u64::MAX, 0]
            } else {
                vec![0, u64::MAX]
            },
            numa_nodes: vec![socket],
            links,
        }
    }

    /// GPUs of the first half sit on socket 0, the rest on socket 1.
    fn socket(&self, index: u32) -> u32 {
        u32::from(index >= self.spec.gpus.div_ceil(2))
    }

    /// Pairs on one socket share a host bridge two by two; pairs across sockets meet at the
    /// system interconnect.
    fn ancestor(&self, i: u32, j: u32) -> Option<String> {
        if i == j {
            return None;
        }
        let name = if self.socket(i) != self.socket(j) {
            "SYSTEM"
        } else if i / 2 == j / 2 {
            "HOSTBRIDGE"
        } else {
            "NODE"
        };
        Some(name.to_string())
    }

    fn memory_outcome(&self, gpu: u32, req: &MemoryRequest) -> MemoryOutcome {
        let free = self.free_bytes();
        let share = if req.fraction.is_finite() {
            req.fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let tested = ((free as f64 * share) as u64) / MIB * MIB;
        let passes = req.passes.max(1);
        // Each pass writes and verifies a pattern and its inverse.
        let bytes = tested.saturating_mul(2 * u64::from(passes));
        let gbps = self.spec.model.memory_gbps()
            * (1.0 + 0.02 * jitter(gpu, 1))
            * self.spec.slowdown(SimCheck::Memory, gpu);
        let fail = listed(&self.spec.fail, SimCheck::Memory, gpu);
        let mismatches = if fail { 3 + u64::from(gpu % 4) } else { 0 };
        MemoryOutcome {
            total_bytes: self.total_bytes(),
            free_bytes_before: free,
            bytes_tested: tested,
            fill_seconds: bytes as f64 / (gbps * 0.96 * 1e9),
            verify_seconds: bytes as f64 / (gbps * 1.04 * 1e9),
            bytes_written: bytes,
            bytes_read: bytes,
            passes,
            mismatches,
            first_mismatches: mismatch_list(gpu, tested, mismatches, req.max_logged),
        }
    }

    fn gemm_outcome(&self, gpu: u32, dtype: Dtype, seconds: f64, n: usize) -> GemmOutcome {
        let tflops = self.spec.model.tflops(dtype)
            * (1.0 + 0.015 * jitter(gpu, 10 + dtype as u64))
            * self.spec.slowdown(SimCheck::Compute, gpu);
        let per_gemm = 2.0 * (n.max(1) as f64).powi(3);
        let iterations = ((tflops * 1e12 * seconds * 0.95 / per_gemm) as u64).max(1);
        let flops = iterations as f64 * per_gemm;
        let fail = listed(&self.spec.fail, SimCheck::Compute, gpu);
        GemmOutcome {
            dtype,
            flops,
            gemm_seconds: flops / (tflops * 1e12),
            iterations,
            comparisons: iterations,
            mismatches: if fail { 5 + dtype as u64 } else { 0 },
            max_rel_error: if fail { 0.25 } else { 0.0 },
            wall_seconds: seconds,
        }
    }

    fn transcendental_outcome(&self, seconds: f64) -> TranscendentalOutcome {
        const ELEMENTS: u64 = 1 << 26;
        let seconds = seconds * 0.05;
        let iterations =
            ((self.spec.model.gelems() * 1e9 * seconds / ELEMENTS as f64) as u64).max(1);
        TranscendentalOutcome {
            elements: ELEMENTS,
            seconds: iterations as f64 * ELEMENTS as f64 / (self.spec.model.gelems() * 1e9),
            iterations,
            mismatches: 0,
        }
    }

    /// Wall time for `simulated` seconds of burn.
    fn scaled(&self, simulated: Duration) -> Duration {
        Duration::try_from_secs_f64(simulated.as_secs_f64() * self.spec.timescale)
            .unwrap_or(Duration::ZERO)
    }
}

impl Backend for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Simulated
    }

    fn inventory(&self) -> Result<Inventory, BackendError> {
        if self.spec.gpus == 0 {
            return Err(BackendError::NoGpu(
                "the simulated node has gpus=0".to_string(),
            ));
        }
        let simulated = Some("simulated".to_string());
        Ok(Inventory {
            system: SystemInfo {
                driver_version: simulated.clone(),
                cuda_driver_version: simulated.clone(),
                nvml_version: simulated,
                hostname: None,
            },
            gpus: (0..self.spec.gpus).map(|i| self.gpu_info(i)).collect(),
        })
    }

    fn topology(&self) -> Result<TopologySnapshot, BackendError> {
        let n = self.spec.gpus;
        Ok(TopologySnapshot {
            gpus: (0..n).map(|i| self.topo_gpu(i)).collect(),
            ancestors: (0..n)
                .map(|i| (0..n).map(|j| self.ancestor(i, j)).collect())
                .collect(),
        })
    }

    fn memory_test(
        &self,
        gpu: u32,
        req: &MemoryRequest,
        ctl: &RunControl<'_>,
    ) -> Result<MemoryOutcome, BackendError> {
        self.check_gpu(gpu)?;
        self.injected_error(SimCheck::Memory, gpu)?;
        let wall = if self.spec.timescale > 0.0 {
            MEMORY_WALL
        } else {
            Duration::ZERO
        };
        spend(ctl, wall, |done| done, "memory fill and verify")?;
        let out = self.memory_outcome(gpu, req);
        ctl.progress(1.0, &format!("{} mismatches", out.mismatches));
        Ok(out)
    }

    fn compute_burn(
        &self,
        gpu: u32,
        req: &ComputeRequest,
        ctl: &RunControl<'_>,
    ) -> Result<ComputeOutcome, BackendError> {
        self.check_gpu(gpu)?;
        self.injected_error(SimCheck::Compute, gpu)?;
        let count = req.dtypes.len().max(1);
        let share = req.duration / u32::try_from(count).unwrap_or(u32::MAX);
        let mut gemms = Vec::with_capacity(req.dtypes.len());
        for (i, &dtype) in req.dtypes.iter().enumerate() {
            let g = self.gemm_outcome(gpu, dtype, share.as_secs_f64(), req.matrix_size);
            let note = format!("{dtype} {:.0} TFLOP/s", g.tflops());
            let overall = |done: f64| (i as f64 + done) / count as f64;
            spend(ctl, self.scaled(share), overall, &note)?;
            gemms.push(g);
        }
        let seconds = req.duration.as_secs_f64();
        Ok(ComputeOutcome {
            gemms,
            transcendental: req
                .transcendentals
                .then(|| self.transcendental_outcome(seconds)),
            seconds,
        })
    }

    fn p2p(
        &self,
        gpus: &[u32],
        req: &P2pRequest,
        ctl: &RunControl<'_>,
    ) -> Result<P2pOutcome, BackendError> {
        for &g in gpus {
            self.check_gpu(g)?;
            self.injected_error(SimCheck::P2p, g)?;
        }
        let wall = if self.spec.timescale > 0.0 {
            MEMORY_WALL
        } else {
            Duration::ZERO
        };
        spend(ctl, wall, |done| done, "peer-to-peer pairs")?;
        let mut order: Vec<(u32, u32)> = gpus
            .iter()
            .flat_map(|&a| gpus.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
            .collect();
        crate::backend::shuffle(&mut order, req.seed);
        let (uni, bidi, copy_us, load_ns) = self.spec.model.p2p();
        let pairs: Vec<PairOutcome> = order
            .into_iter()
            .map(|(src, dst)| {
                let slow =
                    self.spec.slowdown(SimCheck::P2p, src) * self.spec.slowdown(SimCheck::P2p, dst);
                let wobble = 1.0 + 0.005 * jitter(src * 64 + dst, 20);
                let fail = listed(&self.spec.fail, SimCheck::P2p, src)
                    || listed(&self.spec.fail, SimCheck::P2p, dst);
                PairOutcome {
                    src,
                    dst,
                    peer_access: true,
                    unidirectional_gbps: uni * slow * wobble,
                    bidirectional_gbps: bidi * slow * wobble,
                    copy_latency_us: copy_us / slow.max(0.01),
                    load_latency_ns: Some(load_ns / slow.max(0.01)),
                    staged_unidirectional_gbps: req.host_staged.then_some(37.5 * wobble),
                    staged_bidirectional_gbps: req.host_staged.then_some(41.0 * wobble),
                    mismatches: if fail { 12 } else { 0 },
                    error: None,
                }
            })
            .collect();
        ctl.progress(1.0, &format!("{} pairs", pairs.len()));
        Ok(P2pOutcome {
            seconds: pairs.len() as f64 * 0.2,
            pairs,
        })
    }

    fn host_transfer(
        &self,
        gpus: &[u32],
        req: &HostTransferRequest,
        _ctl: &RunControl<'_>,
    ) -> BTreeMap<u32, Result<HostTransferOutcome, BackendError>> {
        gpus.iter()
            .map(|&g| {
                let r = self
                    .check_gpu(g)
                    .and_then(|_| self.injected_error(SimCheck::Host, g))
                    .map(|_| {
                        let rate = self.spec.model.host_gbps()
                            * self.spec.slowdown(SimCheck::Host, g)
                            * (1.0 + 0.004 * jitter(g, 30));
                        let both = DirectionRates {
                            h2d_gbps: rate,
                            d2h_gbps: rate * 1.003,
                        };
                        let scaled = |f: f64| DirectionRates {
                            h2d_gbps: both.h2d_gbps * f,
                            d2h_gbps: both.d2h_gbps * f,
                        };
                        HostTransferOutcome {
                            pinned: req.pinned.then_some(both),
                            pageable: req.pageable.then(|| scaled(0.3)),
                            pinned_concurrent: (req.pinned && gpus.len() > 1).then(|| scaled(0.97)),
                            numa_node: Some(self.socket(g)),
                            mismatches: if listed(&self.spec.fail, SimCheck::Host, g) {
                                64
                            } else {
                                0
                            },
                            seconds: 1.0,
                        }
                    });
                (g, r)
            })
            .collect()
    }

    fn nvlink_errors(&self, gpu: u32) -> Result<Vec<LinkErrors>, BackendError> {
        self.check_gpu(gpu)?;
        Ok((0..self.spec.model.nvlinks())
            .filter(|l| !self.spec.linkdown.contains(&(gpu, *l)))
            .map(|link| LinkErrors {
                link,
                ..Default::default()
            })
            .collect())
    }

    fn sample(&self, gpu: u32) -> Result<TelemetrySample, BackendError> {
        self.check_gpu(gpu)?;
        let n = self
            .samples
            .get(gpu as usize)
            .map_or(0, |c| c.fetch_add(1, Ordering::Relaxed));
        Ok(telemetry(self.spec.model, gpu, n))
    }

    fn error_counters(&self, gpu: u32) -> Result<ErrorCounters, BackendError> {
        self.check_gpu(gpu)?;
        Ok(ErrorCounters {
            ecc_corrected: Some(0),
            ecc_uncorrected: Some(0),
        })
    }

    fn poll_xid(&self, timeout: Duration) -> Vec<XidEvent> {
        let events = std::mem::take(&mut *self.xids.lock().unwrap_or_else(|e| e.into_inner()));
        if events.is_empty() && !timeout.is_zero() {
            thread::sleep(timeout);
        }
        events
    }
}

/// The n-th telemetry sample of a GPU: warming up over the first ten samples, then steady
/// with a small deterministic wobble; `SwPowerCap` every fifth sample.
fn telemetry(model: SimModel, gpu: u32, n: u64) -> TelemetrySample {
    let (sm_max, mem_clock, power_limit) = model.clocks_power();
    let load = n.min(10) as f64 / 10.0;
    let wobble = ((n * 37 + u64::from(gpu) * 11) % 17) as f64 / 16.0;
    TelemetrySample {
        sm_clock_mhz: Some((sm_max - 150.0 * load + 30.0 * wobble).min(sm_max).round()),
        memory_clock_mhz: Some(mem_clock),
        temperature_c: Some(32.0 + f64::from(gpu % 4) + 30.0 * load + 2.0 * wobble),
        power_w: Some(90.0 + (power_limit - 150.0) * load + 40.0 * wobble),
        throttle_reasons: if n % 5 == 4 {
            vec!["SwPowerCap".to_string()]
        } else {
            Vec::new()
        },
    }
}

/// `00000000:18:00.0` style ids of an 8-GPU HGX board; further GPUs on domain 1.
fn bus_id(index: u32) -> String {
    const HGX: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    match HGX.get(index as usize) {
        Some(bus) => format!("00000000:{bus:02X}:00.0"),
        None => format!("00000001:{:02X}:00.0", index % 256),
    }
}

/// The first `max_logged` of `count` bad words, spread over the tested block.
fn mismatch_list(gpu: u32, tested: u64, count: u64, max_logged: usize) -> Vec<Mismatch> {
    let shown = count.min(max_logged as u64);
    (0..shown)
        .map(|k| {
            let offset = (tested / (count + 1)).saturating_mul(k + 1) & !7;
            let expected = 0xA5A5_A5A5_0000_0000u64 | (offset >> 3);
            let actual = expected ^ (1u64 << ((u64::from(gpu) * 7 + k * 13) % 64));
            Mismatch {
                offset: i64::try_from(offset).unwrap_or(i64::MAX),
                expected: format!("{expected:#018x}"),
                actual: format!("{actual:#018x}"),
            }
        })
        .collect()
}

/// A deterministic value in [-1, 1) for a GPU and a salt (splitmix64).
fn jitter(gpu: u32, salt: u64) -> f64 {
    let mut z = (u64::from(gpu) << 32 | salt).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// Spends `wall` in steps of at most [`STEP`], stopping early when asked; `overall` maps the
/// share done of this wait to the share done of the whole operation.
fn spend(
    ctl: &RunControl<'_>,
    wall: Duration,
    overall: impl Fn(f64) -> f64,
    note: &str,
) -> Result<(), BackendError> {
    if ctl.stopped() {
        return Err(BackendError::Stopped);
    }
    if wall.is_zero() {
        return Ok(());
    }
    let steps = u32::try_from(wall.as_nanos().div_ceil(STEP.as_nanos()))
        .unwrap_or(u32::MAX)
        .max(1);
    let step = wall / steps;
    for k in 1..=steps {
        thread::sleep(step);
        if ctl.stopped() {
            return Err(BackendError::Stopped);
        }
        ctl.progress(overall(f64::from(k) / f64::from(steps)), note);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    use gpuval_crds::{
        Checks, ComputeCheck, GpuReport, MemoryCheck, NodeReport, Thresholds, TopologyCheck,
        Verdict,
    };

    use super::*;
    use crate::telemetry::summarize;
    use crate::verdict::Judge;

    fn backend(spec: &str) -> SimBackend {
        SimBackend::new(spec.parse().expect("valid spec"))
    }

    fn checks() -> Checks {
        Checks {
            topology: Some(TopologyCheck::default()),
            memory: Some(MemoryCheck::default()),
            compute: Some(ComputeCheck {
                dtypes: Dtype::ALL.to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn memory_request() -> MemoryRequest {
        MemoryRequest {
            fraction: 0.95,
            passes: 1,
            max_logged: 4,
        }
    }

    fn compute_request(seconds: u64) -> ComputeRequest {
        ComputeRequest {
            duration: Duration::from_secs(seconds),
            dtypes: Dtype::ALL.to_vec(),
            matrix_size: 8192,
            transcendentals: true,
        }
    }

    fn gpu_report(b: &SimBackend, judge: &Judge<'_>, g: &GpuInfo, xids: &[XidEvent]) -> GpuReport {
        let stop = AtomicBool::new(false);
        let ctl = RunControl::new(&stop, &|_, _| {});
        let before = b.error_counters(g.index).ok();
        let memory = Judge::judged(b.memory_test(g.index, &memory_request(), &ctl), |o| {
            judge.memory(g, &o)
        });
        let compute = Judge::judged(b.compute_burn(g.index, &compute_request(300), &ctl), |o| {
            judge.compute(g, &o)
        });
        let samples: Vec<TelemetrySample> =
            (0..12).filter_map(|_| b.sample(g.index).ok()).collect();
        let after = b.error_counters(g.index).ok();
        let mine: Vec<u64> = xids
            .iter()
            .filter(|x| x.gpu == g.index)
            .map(|x| x.xid)
            .collect();
        GpuReport {
            index: g.index as i32,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
            pci_bus_id: Some(g.pci_bus_id.clone()),
            memory_total_mib: (g.memory_total_bytes / MIB) as i64,
            health: Some(g.health.clone()),
            memory: Some(memory),
            compute: Some(compute),
            telemetry: Some(summarize(&samples, before, after, &mine)),
            ..Default::default()
        }
    }

    /// Runs every check of a simulated node and judges it as the agent would.
    pub(crate) fn simulated_report(spec: &str) -> NodeReport {
        let b = backend(spec);
        let checks = checks();
        let judge = Judge {
            checks: &checks,
            thresholds: Thresholds::default(),
        };
        let inv = b.inventory().expect("inventory");
        let xids = b.poll_xid(Duration::ZERO);
        let mut gpus: Vec<GpuReport> = inv
            .gpus
            .iter()
            .map(|g| gpu_report(&b, &judge, g, &xids))
            .collect();
        judge.relative(&mut gpus);
        let topology = judge.topology(
            &inv.gpus,
            crate::topology::derive(&b.topology().expect("topology")),
        );
        let mut report = NodeReport {
            simulated: true,
            backend: b.kind().as_str().to_string(),
            agent_version: "test".into(),
            system: Some(inv.system),
            gpus,
            topology: Some(topology),
            ..Default::default()
        };
        judge.node(&mut report);
        report
    }

    // ---- spec parsing ----

    #[test]
    fn parses_the_full_example() {
        let s: SimSpec = "gpus=8,model=H200,fail=memory@2+compute@5,slow=compute@3:0.5,xid=1:79,linkdown=2:4,error=memory@1,timescale=0.01"
            .parse()
            .expect("valid");
        assert_eq!(s.gpus, 8);
        assert_eq!(s.model, SimModel::H200);
        assert_eq!(s.fail, vec![(SimCheck::Memory, 2), (SimCheck::Compute, 5)]);
        assert_eq!(s.slow, vec![(SimCheck::Compute, 3, 0.5)]);
        assert_eq!(s.xid, vec![(1, 79)]);
        assert_eq!(s.linkdown, vec![(2, 4)]);
        assert_eq!(s.error, vec![(SimCheck::Memory, 1)]);
        assert_eq!(s.timescale, 0.01);
        assert_eq!(s.to_string().parse::<SimSpec>().expect("round trip"), s);
    }

    #[test]
    fn every_key_is_optional() {
        assert_eq!("".parse::<SimSpec>().expect("empty"), SimSpec::default());
        let s: SimSpec = " model=a100 , gpus=4 ,".parse().expect("valid");
        assert_eq!((s.gpus, s.model, s.timescale), (4, SimModel::A100, 0.0));
        let s: SimSpec = "xid=0:79+3:48,xid=1:31".parse().expect("valid");
        assert_eq!(s.xid, vec![(0, 79), (3, 48), (1, 31)]);
    }

    #[test]
    fn bad_specs_name_the_part_and_the_keys() {
        let cases = [
            ("gpus=8,colour=red", "colour=red"),
            ("gpus", "gpus"),
            ("gpus=eight", "gpus=eight"),
            ("gpus=65", "gpus=65"),
            ("model=V100", "model=V100"),
            ("fail=memory", "fail=memory"),
            ("fail=disk@1", "fail=disk@1"),
            ("fail=memory@x", "fail=memory@x"),
            ("fail=", "fail="),
            ("slow=compute@3", "slow=compute@3"),
            ("slow=compute@3:0", "slow=compute@3:0"),
            ("slow=compute@3:nan", "slow=compute@3:nan"),
            ("xid=1", "xid=1"),
            ("xid=1:-5", "xid=1:-5"),
            ("linkdown=2", "linkdown=2"),
            ("linkdown=2:18", "linkdown=2:18"),
            ("model=A100,linkdown=2:12", "linkdown=2:12"),
            ("timescale=-1", "timescale=-1"),
            ("timescale=inf", "timescale=inf"),
            ("fail=memory@9", "fail=memory@9"),
            ("gpus=2,xid=2:79", "xid=2:79"),
            ("error=compute@4,gpus=4", "error=compute@4"),
        ];
        for (input, part) in cases {
            let err = input.parse::<SimSpec>().expect_err(input);
            assert_eq!(err.part, part, "{input}");
            let text = err.to_string();
            assert!(text.contains(&format!("{part:?}")), "{text}");
            assert!(text.contains(SPEC_KEYS), "{text}");
        }
    }

    // ---- backend behaviour ----

    #[test]
    fn inventory_and_topology_look_like_an_hgx_node() {
        let b = backend("gpus=8,model=H200,linkdown=2:4");
        assert_eq!(b.kind(), BackendKind::Simulated);
        let inv = b.inventory().expect("inventory");
        assert_eq!(inv.gpus.len(), 8);
        let g = &inv.gpus[3];
        assert_eq!(
            (g.name.as_str(), g.uuid.as_str()),
            ("NVIDIA H200 (simulated)", "GPU-sim-3")
        );
        assert_eq!(g.pci_bus_id, "00000000:5D:00.0");
        assert_eq!(g.memory_total_bytes, 143_771 * MIB);
        let topo = b.topology().expect("topology");
        assert_eq!(topo.gpus[0].links.len(), 18);
        assert!(
            topo.gpus[0]
                .links
                .iter()
                .all(|l| l.active && l.remote_type.as_deref() == Some("SWITCH"))
        );
        assert!(!topo.gpus[2].links[4].active);
        assert_eq!(topo.gpus[2].links.iter().filter(|l| l.active).count(), 17);
        assert_eq!(topo.ancestors[0][0], None);
        assert_eq!(topo.ancestors[0][1].as_deref(), Some("HOSTBRIDGE"));
        assert_eq!(topo.ancestors[0][2].as_deref(), Some("NODE"));
        assert_eq!(topo.ancestors[0][7].as_deref(), Some("SYSTEM"));
        assert_eq!(topo.gpus[5].numa_nodes, vec![1]);
        assert!(backend("gpus=0").inventory().is_err());
        let stop = AtomicBool::new(false);
        let ctl = RunControl::new(&stop, &|_, _| {});
        assert!(matches!(
            b.memory_test(8, &memory_request(), &ctl),
            Err(BackendError::NoSuchGpu(8))
        ));
    }

    #[test]
    fn same_spec_same_report() {
        let spec = "gpus=4,model=H100,fail=memory@2,slow=compute@3:0.7,xid=1:79,linkdown=0:1";
        let a = simulated_report(spec);
        let b = simulated_report(spec);
        assert_eq!(a, b);
        let ta = a.gpus[0].telemetry.as_ref().expect("telemetry");
        let sm = ta.sm_clock_mhz.expect("sm clock");
        assert!(sm.min < sm.max, "samples vary: {sm:?}");
    }

    #[test]
    fn healthy_nodes_pass_every_model() {
        for model in ["H100", "H200", "A100"] {
            let report = simulated_report(&format!("gpus=8,model={model}"));
            assert_eq!(
                report.verdict,
                Verdict::Pass,
                "{model}: {:?}",
                report.failures
            );
            assert!(report.gpus.iter().all(|g| g.verdict == Verdict::Pass));
        }
    }

    #[test]
    fn injected_faults_show_up_in_the_verdict() {
        let report = simulated_report(
            "gpus=8,model=H200,fail=memory@2+compute@5,slow=compute@3:0.5,xid=1:79,linkdown=2:4,error=memory@1",
        );
        assert_eq!(report.verdict, Verdict::Error);
        let v = |i: usize| report.gpus[i].verdict;
        let mem = |i: usize| report.gpus[i].memory.as_ref().map(|m| m.verdict);
        let comp = |i: usize| report.gpus[i].compute.as_ref().map(|c| c.verdict);
        assert_eq!(mem(1), Some(Verdict::Error));
        assert_eq!(mem(2), Some(Verdict::Fail));
        assert_eq!(comp(3), Some(Verdict::Fail));
        assert_eq!(comp(5), Some(Verdict::Fail));
        for i in [0, 4, 6, 7] {
            assert_eq!(v(i), Verdict::Pass, "GPU{i}: {:?}", report.gpus[i].reasons);
        }
        let reasons = |i: usize| report.gpus[i].reasons.join("\n");
        assert!(
            reasons(1).contains("GPU1: Xid 79 during the run"),
            "{}",
            reasons(1)
        );
        assert!(reasons(1).contains("error=memory@1"), "{}", reasons(1));
        assert!(
            reasons(2).contains("mismatched words (first at offset 0x"),
            "{}",
            reasons(2)
        );
        assert!(reasons(3).contains("(H200 profile)"), "{}", reasons(3));
        assert!(reasons(3).contains("below its peers"), "{}", reasons(3));
        assert!(reasons(5).contains("mismatched elements"), "{}", reasons(5));
        let topo = report.topology.as_ref().expect("topology");
        assert_eq!(topo.verdict, Verdict::Fail);
        assert!(
            topo.reasons
                .iter()
                .any(|r| r.starts_with("GPU2: 17 of 18 NVLink links active"))
        );
        assert_eq!(report.failures.len(), 5);
        assert!(
            report.failures[0].starts_with("GPU1: memory check"),
            "{:?}",
            report.failures
        );
    }

    #[test]
    fn slow_memory_fails_relative_rule() {
        let report = simulated_report("gpus=4,slow=memory@0:0.7");
        let m = report.gpus[0].memory.as_ref().expect("memory");
        assert_eq!(m.verdict, Verdict::Fail);
        assert!(
            m.reasons.iter().any(|r| r.contains("below its peers")),
            "{:?}",
            m.reasons
        );
    }

    #[test]
    fn xid_is_reported_once() {
        let b = backend("gpus=2,xid=1:79+0:48");
        assert_eq!(
            b.poll_xid(Duration::ZERO),
            vec![XidEvent { gpu: 1, xid: 79 }, XidEvent { gpu: 0, xid: 48 }]
        );
        assert!(b.poll_xid(Duration::from_millis(1)).is_empty());
    }

    #[test]
    fn timescale_spends_time_with_progress_and_stops() {
        let b = backend("gpus=1,timescale=0.01");
        let calls = AtomicUsize::new(0);
        let last = Mutex::new(0.0f64);
        let progress = |done: f64, _: &str| {
            calls.fetch_add(1, Ordering::Relaxed);
            *last.lock().unwrap_or_else(|e| e.into_inner()) = done;
        };
        let stop = AtomicBool::new(false);
        let ctl = RunControl::new(&stop, &progress);
        let start = std::time::Instant::now();
        let out = b.compute_burn(0, &compute_request(20), &ctl).expect("burn");
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(calls.load(Ordering::Relaxed) >= 4);
        assert_eq!(*last.lock().unwrap_or_else(|e| e.into_inner()), 1.0);
        assert_eq!(out.gemms.len(), 4);

        stop.store(true, Ordering::Relaxed);
        assert!(matches!(
            b.compute_burn(0, &compute_request(20), &ctl),
            Err(BackendError::Stopped)
        ));
        assert!(matches!(
            b.memory_test(0, &memory_request(), &ctl),
            Err(BackendError::Stopped)
        ));
    }

    #[test]
    fn timescale_zero_returns_at_once() {
        let b = backend("gpus=1");
        let stop = AtomicBool::new(false);
        let ctl = RunControl::new(&stop, &|_, _| {});
        let start = std::time::Instant::now();
        let out = b
            .compute_burn(0, &compute_request(3600), &ctl)
            .expect("burn");
        assert!(start.elapsed() < Duration::from_millis(100));
        assert!(out.gemms[0].tflops() > 700.0);
        assert_eq!(out.seconds, 3600.0);
    }
}
