//! Simulated backend (tests and demos only): a deterministic node of H100, H200 or A100 GPUs,
//! with faults injected from a spec string such as
//! `gpus=8,model=H200,fail=memory@2+compute@5,slow=compute@3:0.5+p2p@6:0.3,xid=1:79,linkdown=2:4,error=memory@1,throttle=4:HwSlowdown,replay=6:40,timescale=0.01`
//! (checks: `memory`, `compute`, `p2p` (every pair of that GPU), `host` (host transfers),
//! `nccl`, `training`). `fail=memory@2` flips one bit of GPU 2's words to 1 (stuck at 1);
//! `throttle=4:HwSlowdown` slows GPU 4's clocks for most of its burn; `replay=6:40` adds 40 to
//! GPU 6's PCIe replay counter during the run. `flaky=memory@2:0.5` is a `slow` that only the
//! first measurement sees; `version=driver:535.104.05+vbios:96.00.89.00.01` sets what the node
//! reports of its versions (`driver`, `vbios`, `cuda`, `nccl`; default `simulated`).
//! `hidden=3` makes GPU 3 one NVML lists and CUDA does not see (as `CUDA_VISIBLE_DEVICES`
//! would); `proc=2:4242:python3:10240` puts a process that is not the agent's (pid 4242,
//! `python3`, 10240 MiB) on GPU 2 for the whole run, and `proc=2:4242:python3:10240:0.5` one
//! whose work also takes half of GPU 2 (every figure of GPU 2 falls by half, and the GPU shows
//! 50 % utilisation and more power while the agent is idle). `pidns=1` runs the agent as a pod
//! does, in its own PID namespace: NVML lists only the agent's own processes, while the planted
//! ones' memory, load and power still show in the device's figures. `scrub=60` has the driver
//! scrub the memory the agent's checks free, as an H200 did after the memory check freed 132
//! GiB: the first utilisation samples each idle probe reads show 60 %, then a quarter of it,
//! then the GPU idle (bench/nvml-tail). `disk=eio@read` has the io check's real file I/O meet a
//! failing disk ([`disk`]).
//!
//! Every figure is a pure function of the spec, the GPU and the request (telemetry also of how
//! many samples were taken), so two runs with the same spec give the same report.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use gpuval_crds::{Dtype, GpuHealth, SystemInfo};

use super::{
    BackendError, BackendKind, ErrorCounters, GpuInfo, GpuProcess, HiddenGpu, Inventory,
    LinkErrors, LinkReading, Occupancy, Platform, TelemetrySample, TopoGpu, TopologySnapshot,
    XidEvent,
};
use crate::run_control::RunControl;

pub mod disk;
pub mod net;

/// The keys a spec string may use.
pub const SPEC_KEYS: &str = "gpus, model, fail, slow, flaky, xid, linkdown, error, hang, throttle, replay, hidden, proc, pidns, scrub, version, timescale, fabric, net, netfault, railnet, disk";
/// The throttle reasons `throttle=` may plant (NVML names without prefix).
pub const THROTTLE_REASONS: [&str; 5] = [
    "SwPowerCap",
    "HwSlowdown",
    "HwThermalSlowdown",
    "HwPowerBrakeSlowdown",
    "SwThermalSlowdown",
];
/// The most GPUs a simulated node may have.
pub const MAX_GPUS: u32 = 64;
/// The longest sleep between stop checks.
const STEP: Duration = Duration::from_millis(50);
/// Wall time of a memory test when `timescale` is above 0.
const MEMORY_WALL: Duration = Duration::from_millis(20);
/// Memory the driver and context keep on a fresh GPU.
const RESERVED_MIB: u64 = 600;
/// A simulated GPU's power draw while nothing runs on it, W.
const SIM_IDLE_W: f64 = 90.0;
pub(crate) const MIB: u64 = 1024 * 1024;

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
    pub(crate) fn memory_mib(self) -> u64 {
        match self {
            SimModel::H100 => 81_559,
            SimModel::H200 => 143_771,
            SimModel::A100 => 81_920,
        }
    }
    /// NVLink links per GPU (all to NVSwitches).
    pub(crate) fn nvlinks(self) -> u32 {
        match self {
            SimModel::A100 => 12,
            _ => 18,
        }
    }
    pub(crate) fn nvlink_version(self) -> u32 {
        match self {
            SimModel::A100 => 3,
            _ => 4,
        }
    }
    pub(crate) fn pcie_gen(self) -> i32 {
        match self {
            SimModel::A100 => 4,
            _ => 5,
        }
    }
    pub(crate) fn compute_capability(self) -> (i32, i32) {
        match self {
            SimModel::A100 => (8, 0),
            _ => (9, 0),
        }
    }
    /// Healthy fill+verify throughput, GB/s.
    pub(crate) fn memory_gbps(self) -> f64 {
        match self {
            SimModel::H100 => 2900.0,
            SimModel::H200 => 4000.0,
            SimModel::A100 => 1800.0,
        }
    }
    /// Healthy sustained GEMM TFLOP/s.
    pub(crate) fn tflops(self, d: Dtype) -> f64 {
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
    pub(crate) fn p2p(self) -> (f64, f64, f64, f64) {
        match self {
            SimModel::A100 => (230.0, 450.0, 9.5, 950.0),
            _ => (392.0, 770.0, 8.1, 850.0),
        }
    }
    /// Healthy pinned host transfer rate per direction, GB/s (PCIe Gen5 or Gen4 x16).
    pub(crate) fn host_gbps(self) -> f64 {
        match self {
            SimModel::A100 => 24.5,
            _ => 55.3,
        }
    }
    /// Transcendental kernel rate, billions of elements per second.
    pub(crate) fn gelems(self) -> f64 {
        match self {
            SimModel::A100 => 60.0,
            _ => 110.0,
        }
    }
    /// (max SM clock MHz, memory clock MHz, power limit W).
    pub(crate) fn clocks_power(self) -> (f64, f64, f64) {
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
    /// The NCCL collectives (`fail=nccl@1`: rank of GPU 1 receives wrong elements).
    Nccl,
    /// The training step (`fail=training@1`: GPU 1's weights diverge; `slow=training@1:0.1`:
    /// the all-reduce runs at a tenth of its speed and is no longer hidden).
    Training,
}

impl SimCheck {
    const ALL: [SimCheck; 6] = [
        SimCheck::Memory,
        SimCheck::Compute,
        SimCheck::P2p,
        SimCheck::Host,
        SimCheck::Nccl,
        SimCheck::Training,
    ];
}

impl fmt::Display for SimCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimCheck::Memory => "memory",
            SimCheck::Compute => "compute",
            SimCheck::P2p => "p2p",
            SimCheck::Host => "host",
            SimCheck::Nccl => "nccl",
            SimCheck::Training => "training",
        })
    }
}

/// The name [`fmt::Display`] writes.
impl FromStr for SimCheck {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SimCheck::ALL
            .into_iter()
            .find(|c| c.to_string() == s)
            .ok_or_else(|| {
                format!("unknown check {s:?}: use memory, compute, p2p, host, nccl or training")
            })
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
    /// `hang=training@1`: that GPU never joins the check's communicator, so the others wait in
    /// its setup until the watchdog ends the run (training only).
    pub hang: Vec<(SimCheck, u32)>,
    /// `throttle=` and `replay=` (boxed: the spec travels inside `BackendChoice`, which
    /// stays small).
    pub health: Box<HealthFaults>,
    /// `timescale=0.01`: wall time spent per simulated second of burn (0: none).
    pub timescale: f64,
    /// `fabric=hang` / `fabric=shm`: the NCCL communicator never completes a collective, or
    /// connects the GPUs through host shared memory instead of NVLink.
    pub fabric: Vec<FabricFault>,
    /// `net=<GB/s>`, `netfault=local|nojoin|vanish`: this node's fabric between nodes (see
    /// [`net`]).
    pub net: net::SimNet,
    /// `flaky=memory@2:0.5`: like `slow`, for the first measurement only (a second
    /// measurement, [`SimBackend::second_measurement`], sees the healthy figure).
    pub flaky: Vec<(SimCheck, u32, f64)>,
    /// `version=driver:535.104.05+vbios:96.00.89.00.01`: the versions the node reports.
    pub versions: Vec<(gpuval_crds::facts::Component, String)>,
    /// `disk=eio@read`: the io check's real file I/O meets a failing disk (see [`disk`]).
    pub disk: Option<disk::DiskFault>,
}

/// Faults of the GPUs' health signals.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HealthFaults {
    /// `throttle=4:HwSlowdown`: that throttle reason holds GPU 4's clocks down for most of its
    /// burn (and shows in its telemetry).
    pub throttle: Vec<(u32, String)>,
    /// `replay=6:40`: GPU 6's PCIe replay counter grows by 40 during the run.
    pub replay: Vec<(u32, u64)>,
    /// `hidden=3`: NVML lists GPU 3 but CUDA cannot see it.
    pub hidden: Vec<u32>,
    /// `proc=2:4242:python3:10240`: a process that is not the agent's on GPU 2.
    pub procs: Vec<SimProcess>,
    /// `pidns=1`: the agent runs in its own PID namespace (as in a pod): NVML lists only its
    /// own processes, though the planted ones' memory and load still show device-wide.
    pub pidns: bool,
    /// `scrub=60`: the driver scrubs the memory the agent freed: the first two utilisation
    /// samples of every idle probe show 60 % and 15 %, the work of the agent's own last check.
    pub scrub: u32,
}

/// A process planted on a simulated GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SimProcess {
    pub gpu: u32,
    pub pid: u32,
    pub name: String,
    pub mib: u64,
    /// The share of the GPU its work takes (0: it only holds memory).
    pub load: f64,
}

/// A fault of the node's GPU fabric as NCCL sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricFault {
    Hang,
    Shm,
}

impl FromStr for FabricFault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hang" => Ok(FabricFault::Hang),
            "shm" => Ok(FabricFault::Shm),
            _ => Err(format!("unknown fabric fault {s:?}: use hang or shm")),
        }
    }
}

impl fmt::Display for FabricFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FabricFault::Hang => "hang",
            FabricFault::Shm => "shm",
        })
    }
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
            hang: Vec::new(),
            health: Box::default(),
            timescale: 0.0,
            fabric: Vec::new(),
            net: Default::default(),
            flaky: Vec::new(),
            versions: Vec::new(),
            disk: None,
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
            "flaky" => self.flaky.extend(parse_list(value, parse_slow)?),
            "version" => self.versions.extend(parse_list(value, parse_version)?),
            "xid" => self.xid.extend(parse_list(value, parse_xid)?),
            "linkdown" => self.linkdown.extend(parse_list(value, parse_linkdown)?),
            "error" => self.error.extend(parse_list(value, parse_check_at)?),
            "hang" => self.hang.extend(parse_list(value, parse_check_at)?),
            "throttle" => self
                .health
                .throttle
                .extend(parse_list(value, parse_throttle)?),
            "replay" => self.health.replay.extend(parse_list(value, parse_replay)?),
            "hidden" => self
                .health
                .hidden
                .extend(parse_list(value, |v| parse_num::<u32>(v, "a GPU index"))?),
            "proc" => self.health.procs.extend(parse_list(value, parse_proc)?),
            "pidns" => self.health.pidns = parse_flag(value)?,
            "scrub" => {
                self.health.scrub = parse_num::<u32>(value, "a utilisation percent")?.min(100)
            }
            "timescale" => self.timescale = parse_timescale(value)?,
            "fabric" => self
                .fabric
                .extend(parse_list(value, |v| v.parse::<FabricFault>())?),
            "net" | "netfault" | "railnet" => self.net.set(key, value)?,
            "disk" => self.disk = Some(value.parse()?),
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
            .chain(self.hang.iter().map(|(c, g)| (format!("hang={c}@{g}"), *g)))
            .chain(
                self.slow
                    .iter()
                    .map(|(c, g, f)| (format!("slow={c}@{g}:{f}"), *g)),
            )
            .chain(
                self.flaky
                    .iter()
                    .map(|(c, g, f)| (format!("flaky={c}@{g}:{f}"), *g)),
            )
            .chain(self.xid.iter().map(|(g, x)| (format!("xid={g}:{x}"), *g)))
            .chain(
                self.linkdown
                    .iter()
                    .map(|(g, l)| (format!("linkdown={g}:{l}"), *g)),
            )
            .chain(
                self.health
                    .throttle
                    .iter()
                    .map(|(g, r)| (format!("throttle={g}:{r}"), *g)),
            )
            .chain(
                self.health
                    .replay
                    .iter()
                    .map(|(g, n)| (format!("replay={g}:{n}"), *g)),
            )
            .chain(
                self.health
                    .hidden
                    .iter()
                    .map(|g| (format!("hidden={g}"), *g)),
            )
            .chain(
                self.health
                    .procs
                    .iter()
                    .map(|p| (format!("proc={}:{}", p.gpu, p.pid), p.gpu)),
            );
        for (part, gpu) in gpu_refs {
            if gpu >= self.gpus {
                let why = format!("GPU{gpu} does not exist (gpus={})", self.gpus);
                return Err(invalid(part, why));
            }
        }
        if let Some((c, g)) = self.hang.iter().find(|(c, _)| *c != SimCheck::Training) {
            let why = "only the training check has a communicator to hang in".to_string();
            return Err(invalid(format!("hang={c}@{g}"), why));
        }
        let links = self.model.nvlinks();
        if let Some((g, l)) = self.linkdown.iter().find(|(_, l)| *l >= links) {
            let why = format!("{} GPUs have links 0 to {}", self.model, links - 1);
            return Err(invalid(format!("linkdown={g}:{l}"), why));
        }
        Ok(())
    }

    /// The product of the `slow` (and `flaky`) factors for that check on that GPU, and of the
    /// share the planted processes' work leaves the agent (sharing lowers every figure).
    pub(crate) fn slowdown(&self, check: SimCheck, gpu: u32) -> f64 {
        let slow: f64 = self
            .slow
            .iter()
            .chain(&self.flaky)
            .filter(|(c, g, _)| *c == check && *g == gpu)
            .map(|(_, _, f)| *f)
            .product();
        slow * (1.0 - self.load_on(gpu))
    }

    /// The share of the GPU the planted processes' work takes (at most 0.95).
    pub(crate) fn load_on(&self, gpu: u32) -> f64 {
        self.health
            .procs
            .iter()
            .filter(|p| p.gpu == gpu)
            .map(|p| p.load)
            .sum::<f64>()
            .min(0.95)
    }

    /// The version the node reports of `c` (`simulated` unless `version=` sets it).
    fn version(&self, c: gpuval_crds::facts::Component) -> String {
        self.versions
            .iter()
            .rev()
            .find(|(k, _)| *k == c)
            .map_or_else(|| "simulated".to_string(), |(_, v)| v.clone())
    }
}

impl fmt::Display for SimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpus={},model={}", self.gpus, self.model)?;
        // `,key=a+b+c` for a list that is not empty.
        let mut list = |key: &str, items: Vec<String>| -> fmt::Result {
            if items.is_empty() {
                Ok(())
            } else {
                write!(f, ",{key}={}", items.join("+"))
            }
        };
        let at = |(c, g): &(SimCheck, u32)| format!("{c}@{g}");
        list("fail", self.fail.iter().map(at).collect())?;
        let slow = self.slow.iter().map(|(c, g, x)| format!("{c}@{g}:{x}"));
        list("slow", slow.collect())?;
        let flaky = self.flaky.iter().map(|(c, g, x)| format!("{c}@{g}:{x}"));
        list("flaky", flaky.collect())?;
        let versions = self.versions.iter().map(|(c, v)| format!("{c}:{v}"));
        list("version", versions.collect())?;
        let xid = self.xid.iter().map(|(g, x)| format!("{g}:{x}"));
        list("xid", xid.collect())?;
        let linkdown = self.linkdown.iter().map(|(g, l)| format!("{g}:{l}"));
        list("linkdown", linkdown.collect())?;
        list("error", self.error.iter().map(at).collect())?;
        list("hang", self.hang.iter().map(at).collect())?;
        let throttle = self.health.throttle.iter().map(|(g, r)| format!("{g}:{r}"));
        list("throttle", throttle.collect())?;
        let replay = self.health.replay.iter().map(|(g, n)| format!("{g}:{n}"));
        list("replay", replay.collect())?;
        list(
            "hidden",
            self.health.hidden.iter().map(u32::to_string).collect(),
        )?;
        let procs = self.health.procs.iter().map(|p| {
            let load = (p.load > 0.0).then(|| format!(":{}", p.load));
            format!(
                "{}:{}:{}:{}{}",
                p.gpu,
                p.pid,
                p.name,
                p.mib,
                load.unwrap_or_default()
            )
        });
        list("proc", procs.collect())?;
        list(
            "pidns",
            self.health
                .pidns
                .then(|| "1".to_string())
                .into_iter()
                .collect(),
        )?;
        let scrub = (self.health.scrub > 0).then(|| self.health.scrub.to_string());
        list("scrub", scrub.into_iter().collect())?;
        let fabric = self.fabric.iter().map(ToString::to_string);
        list("fabric", fabric.collect())?;
        f.write_str(&self.net.spec_parts())?;
        write!(f, ",timescale={}", self.timescale)
    }
}

/// True when `check@gpu` is in the list.
pub(crate) fn listed(list: &[(SimCheck, u32)], check: SimCheck, gpu: u32) -> bool {
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

/// `driver:535.104.05`.
fn parse_version(value: &str) -> Result<(gpuval_crds::facts::Component, String), String> {
    let (c, v) = value
        .split_once(':')
        .ok_or_else(|| format!("{value:?} is not COMPONENT:VERSION (like driver:535.104.05)"))?;
    let component = gpuval_crds::facts::Component::ALL
        .into_iter()
        .find(|k| k.as_str() == c)
        .ok_or_else(|| format!("unknown component {c:?}: use driver, vbios, cuda or nccl"))?;
    if v.is_empty() || v.contains([',', '+', '=']) {
        return Err(format!("version {v:?} must be non-empty, without , + or ="));
    }
    Ok((component, v.to_string()))
}

/// `1:79`.
fn parse_xid(value: &str) -> Result<(u32, u64), String> {
    parse_on_gpu(value, "GPU:XID (like 1:79)", "an Xid code")
}

/// `2:4`.
fn parse_linkdown(value: &str) -> Result<(u32, u32), String> {
    parse_on_gpu(value, "GPU:LINK (like 2:4)", "a link number")
}

/// `GPU:N`: a GPU index and a number (`what`); `form` names the form in the error.
fn parse_on_gpu<T: FromStr>(value: &str, form: &str, what: &str) -> Result<(u32, T), String> {
    let (gpu, n) = value
        .split_once(':')
        .ok_or_else(|| format!("{value:?} is not {form}"))?;
    Ok((parse_num(gpu, "a GPU index")?, parse_num(n, what)?))
}

/// `4:HwSlowdown`.
fn parse_throttle(value: &str) -> Result<(u32, String), String> {
    let (gpu, reason): (u32, String) =
        parse_on_gpu(value, "GPU:REASON (like 4:HwSlowdown)", "a reason")?;
    match THROTTLE_REASONS
        .iter()
        .find(|r| r.eq_ignore_ascii_case(&reason))
    {
        Some(r) => Ok((gpu, r.to_string())),
        None => Err(format!(
            "unknown throttle reason {reason:?}: use {}",
            THROTTLE_REASONS.join(", ")
        )),
    }
}

/// `6:40`.
fn parse_replay(value: &str) -> Result<(u32, u64), String> {
    parse_on_gpu(value, "GPU:COUNT (like 6:40)", "a replay count")
}

/// `2:4242:python3:10240` (GPU, pid, name, MiB held), and `:0.5` the share of the GPU its
/// work takes.
fn parse_proc(value: &str) -> Result<SimProcess, String> {
    let usage = || {
        format!(
            "{value:?} is not GPU:PID:NAME:MIB[:LOAD] (like 2:4242:python3:10240 or 2:4242:python3:10240:0.5)"
        )
    };
    let parts: Vec<&str> = value.split(':').collect();
    let (gpu, pid, name, mib, load) = match parts.as_slice() {
        [gpu, pid, name, mib] => (gpu, pid, name, mib, None),
        [gpu, pid, name, mib, load] => (gpu, pid, name, mib, Some(load)),
        _ => return Err(usage()),
    };
    if name.is_empty() {
        return Err(usage());
    }
    let load: f64 = load.map_or(Ok(0.0), |l| parse_num(l, "a load share"))?;
    if !(0.0..1.0).contains(&load) {
        return Err(format!(
            "load {load} must be at least 0 and below 1 (the share of the GPU it takes)"
        ));
    }
    Ok(SimProcess {
        gpu: parse_num(gpu, "a GPU index")?,
        pid: parse_num(pid, "a pid")?,
        name: (*name).to_string(),
        mib: parse_num(mib, "MiB")?,
        load,
    })
}

/// `1`, `true`, `0` or `false`.
fn parse_flag(value: &str) -> Result<bool, String> {
    match value {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(format!("{value:?} is not 1, true, 0 or false")),
    }
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
    pub(crate) spec: SimSpec,
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

    /// The node as a second measurement of a check sees it: the same, without its `flaky=`
    /// slowdowns (and without Xids to hand out: the first backend still has those).
    pub fn second_measurement(&self) -> SimBackend {
        SimBackend::new(SimSpec {
            flaky: Vec::new(),
            xid: Vec::new(),
            ..self.spec.clone()
        })
    }

    /// The checks every simulated measurement makes first: the GPU exists, and no `error=`
    /// fault is planted for this check on it.
    pub(crate) fn begin(&self, check: SimCheck, gpu: u32) -> Result<(), BackendError> {
        self.check_gpu(gpu)?;
        self.injected_error(check, gpu)
    }

    /// Wall time of a short simulated phase: none unless the spec asks for time to pass.
    pub(crate) fn short_wall(&self) -> Duration {
        if self.spec.timescale > 0.0 {
            MEMORY_WALL
        } else {
            Duration::ZERO
        }
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

    pub(crate) fn total_bytes(&self) -> u64 {
        self.spec.model.memory_mib() * MIB
    }

    pub(crate) fn free_bytes(&self) -> u64 {
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
                persistence_mode: Some(true),
                mig_mode: Some(false),
                vbios_version: Some(self.spec.version(gpuval_crds::facts::Component::Vbios)),
                serial: Some(format!("sim-serial-{index}")),
                board_part_number: Some("sim-board".into()),
                inforom_version: Some("sim-inforom".into()),
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
    pub(crate) fn socket(&self, index: u32) -> u32 {
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

    /// The throttle reason planted on this GPU, active in its `n`-th sample (three samples in
    /// five).
    pub(crate) fn throttled(&self, gpu: u32, n: u64) -> Option<&str> {
        self.spec
            .health
            .throttle
            .iter()
            .find(|(g, _)| *g == gpu)
            .filter(|_| n % 5 < 3)
            .map(|(_, r)| r.as_str())
    }

    /// Wall time for `simulated` seconds of burn.
    pub(crate) fn scaled(&self, simulated: Duration) -> Duration {
        Duration::try_from_secs_f64(simulated.as_secs_f64() * self.spec.timescale)
            .unwrap_or(Duration::ZERO)
    }
}

impl Platform for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Simulated
    }

    fn inventory(&self) -> Result<Inventory, BackendError> {
        if self.spec.gpus == 0 {
            return Err(BackendError::NoGpu(
                "the simulated node has gpus=0".to_string(),
            ));
        }
        use gpuval_crds::facts::Component;
        Ok(Inventory {
            system: SystemInfo {
                driver_version: Some(self.spec.version(Component::Driver)),
                cuda_driver_version: Some(self.spec.version(Component::Cuda)),
                nvml_version: Some("simulated".to_string()),
                hostname: None,
                nccl_version: Some(self.spec.version(Component::Nccl)),
                host: Some(gpuval_crds::report::HostIdentity {
                    vendor: Some("gpuval".into()),
                    product: Some("simulated node".into()),
                    serial: Some("sim-host".into()),
                }),
                nics: Vec::new(),
            },
            gpus: (0..self.spec.gpus)
                .filter(|i| !self.spec.health.hidden.contains(i))
                .map(|i| self.gpu_info(i))
                .collect(),
            hidden: self
                .spec
                .health
                .hidden
                .iter()
                .map(|&i| {
                    let g = self.gpu_info(i);
                    HiddenGpu {
                        index: g.index,
                        uuid: g.uuid,
                        pci_bus_id: g.pci_bus_id,
                    }
                })
                .collect(),
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
        let mut t = telemetry(self.spec.model, gpu, n);
        if let Some(reason) = self.throttled(gpu, n) {
            t.throttle_reasons.push(reason.to_string());
        }
        Ok(t)
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

    /// The agent's own process (as NVML lists the agent on a real GPU) and any planted one,
    /// unless the agent runs in its own PID namespace (`pidns=1`): then only its own.
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, BackendError> {
        self.check_gpu(gpu)?;
        let own = GpuProcess {
            pid: std::process::id(),
            name: Some("gpuval-agent".into()),
            used_memory_bytes: Some(512 << 20),
            graphics: false,
        };
        let planted = self
            .spec
            .health
            .procs
            .iter()
            .filter(|p| p.gpu == gpu && !self.spec.health.pidns)
            .map(|p| GpuProcess {
                pid: p.pid,
                name: Some(p.name.clone()),
                used_memory_bytes: Some(p.mib << 20),
                graphics: false,
            });
        Ok(std::iter::once(own).chain(planted).collect())
    }

    /// The device as NVML shows it whatever the namespace: the agent's 512 MiB and every
    /// planted process's memory in use; the planted processes' load as utilisation (three
    /// samples, after the driver's scrub of what the agent freed, `scrub=`) and as power above
    /// idle.
    fn occupancy(
        &self,
        gpu: u32,
        _since: std::time::SystemTime,
    ) -> Result<Occupancy, BackendError> {
        let listed = self.processes(gpu)?;
        let planted: u64 = self
            .spec
            .health
            .procs
            .iter()
            .filter(|p| p.gpu == gpu)
            .map(|p| p.mib << 20)
            .sum();
        let load = self.spec.load_on(gpu);
        let (_, _, power_limit) = self.spec.model.clocks_power();
        let percent = (load * 100.0).round() as u32;
        let scrub = self.spec.health.scrub;
        let tail = [scrub, scrub / 4].map(|s| s.max(percent));
        let head = if scrub > 0 { &tail[..] } else { &[] };
        Ok(Occupancy {
            used_bytes: Some((512 << 20) + planted),
            listed_before: listed.clone(),
            listed_after: listed,
            utilization: head.iter().copied().chain([percent; 3]).collect(),
            process_sm: Vec::new(),
            power_w: Some(SIM_IDLE_W + (power_limit - SIM_IDLE_W) * load),
            sm_clock_mhz: None,
        })
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

/// A deterministic value in [-1, 1) for a GPU and a salt (splitmix64).
pub(crate) fn jitter(gpu: u32, salt: u64) -> f64 {
    let mut z = (u64::from(gpu) << 32 | salt).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// Spends `wall` in steps of at most [`STEP`], stopping early when asked; `overall` maps the
/// share done of this wait to the share done of the whole operation.
pub(crate) fn spend(
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
mod tests {

    use super::*;

    fn backend(spec: &str) -> SimBackend {
        SimBackend::new(spec.parse().expect("valid spec"))
    }

    #[test]
    fn parses_the_full_example() {
        let s: SimSpec = "gpus=8,model=H200,fail=memory@2+compute@5,slow=compute@3:0.5,xid=1:79,linkdown=2:4,error=memory@1,hang=training@6,throttle=4:hwslowdown,replay=6:40,timescale=0.01"
            .parse()
            .expect("valid");
        assert_eq!(s.health.throttle, vec![(4, "HwSlowdown".to_string())]);
        assert_eq!(s.health.replay, vec![(6, 40)]);
        assert_eq!(s.gpus, 8);
        assert_eq!(s.model, SimModel::H200);
        assert_eq!(s.fail, vec![(SimCheck::Memory, 2), (SimCheck::Compute, 5)]);
        assert_eq!(s.slow, vec![(SimCheck::Compute, 3, 0.5)]);
        assert_eq!(s.xid, vec![(1, 79)]);
        assert_eq!(s.linkdown, vec![(2, 4)]);
        assert_eq!(s.error, vec![(SimCheck::Memory, 1)]);
        assert_eq!(s.hang, vec![(SimCheck::Training, 6)]);
        assert_eq!(s.timescale, 0.01);
        assert_eq!(s.to_string().parse::<SimSpec>().expect("round trip"), s);
    }

    #[test]
    fn only_training_can_hang_and_only_on_a_gpu_that_exists() {
        let e = "gpus=2,hang=memory@1"
            .parse::<SimSpec>()
            .expect_err("memory has no communicator");
        assert!(e.to_string().contains("hang=memory@1"), "{e}");
        let e = "gpus=2,hang=training@2"
            .parse::<SimSpec>()
            .expect_err("no GPU2");
        assert!(e.to_string().contains("GPU2 does not exist"), "{e}");
    }

    #[test]
    fn flaky_faults_and_versions() {
        let s: SimSpec = "gpus=2,flaky=memory@1:0.5,version=driver:535.104.05+vbios:96.00.89.00.01"
            .parse()
            .expect("valid");
        assert_eq!(s.slowdown(SimCheck::Memory, 1), 0.5);
        assert_eq!(s.to_string().parse::<SimSpec>().expect("round trip"), s);
        let b = SimBackend::new(s);
        let inv = b.inventory().expect("inventory");
        assert_eq!(inv.system.driver_version.as_deref(), Some("535.104.05"));
        assert_eq!(inv.system.cuda_driver_version.as_deref(), Some("simulated"));
        assert_eq!(
            inv.gpus[1].health.vbios_version.as_deref(),
            Some("96.00.89.00.01")
        );
        let again = b.second_measurement();
        assert_eq!(again.spec.slowdown(SimCheck::Memory, 1), 1.0);
        assert_eq!(again.spec.versions, b.spec.versions);
        for bad in [
            "version=os:1",
            "version=driver",
            "version=driver:",
            "gpus=2,flaky=memory@5:0.5",
        ] {
            assert!(bad.parse::<SimSpec>().is_err(), "{bad}");
        }
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
            ("throttle=1:Sleepy", "throttle=1:Sleepy"),
            ("throttle=1", "throttle=1"),
            ("gpus=2,throttle=2:HwSlowdown", "throttle=2:HwSlowdown"),
            ("replay=1:-3", "replay=1:-3"),
            ("gpus=2,replay=3:1", "replay=3:1"),
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
        assert!(matches!(b.check_gpu(8), Err(BackendError::NoSuchGpu(8))));
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
}
