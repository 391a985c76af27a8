//! What the compute, memory and hostTransfer checks judge besides throughput: power reached and
//! clocks lost during the burn, a power pulse, memtest-style patterns with the bits that flipped
//! and the remapped rows before and after, and the PCIe link and its error counters. The spec
//! sections ([`PulseSpec`], [`MemoryPattern`], [`PcieCheck`]) and the report sections
//! ([`PowerResult`], [`PulseResult`], [`PatternResult`], [`BitFlips`], [`RowHealth`],
//! [`PcieResult`]) of those checks.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Duration;
use crate::duration::DurationRange;

/// The range of `spec.checks.compute.pulse.period`.
pub const PULSE_PERIOD_RANGE: DurationRange =
    DurationRange::new(Duration::from_millis(100), Duration::from_secs(60));
/// The range of `spec.checks.compute.pulse.duration`.
pub const PULSE_DURATION_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(10), Duration::from_secs(168 * 3600));

/// The power pulse after the burn: full load and idle in turn, half a period each, then the
/// GEMM results checked once more.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = crate::rules::pulse_period_within_duration())]
#[serde(rename_all = "camelCase")]
pub struct PulseSpec {
    /// One load-and-idle cycle (default 1s: half a second of GEMMs, half a second idle).
    #[serde(default = "default_pulse_period")]
    #[x_kube(validation = PULSE_PERIOD_RANGE.rule())]
    pub period: Duration,
    /// How long the pulse runs, after the burn (default 60s).
    #[serde(default = "default_pulse_duration")]
    #[x_kube(validation = PULSE_DURATION_RANGE.rule())]
    pub duration: Duration,
}

impl Default for PulseSpec {
    fn default() -> Self {
        Self {
            period: default_pulse_period(),
            duration: default_pulse_duration(),
        }
    }
}

fn default_pulse_period() -> Duration {
    Duration::from_secs(1)
}
fn default_pulse_duration() -> Duration {
    Duration::from_secs(60)
}

/// A memory test pattern.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub enum MemoryPattern {
    /// Every word a hash of its own address (a stuck or aliased address line reads back a value
    /// that belongs elsewhere), then the inverse.
    Address,
    /// memtest's moving inversions: write a pattern, then read each word and write its inverse
    /// going up, then read the inverse and write the pattern going down; with zeros and ones,
    /// 0x55, the eight walking-one bytes and a random word.
    MovingInversions,
    /// A random number sequence from a new seed each pass, then its inverse.
    Random,
}

crate::spelling::api_spelling!(MemoryPattern {
    Address => "address",
    MovingInversions => "movingInversions",
    Random => "random",
});

impl std::str::FromStr for MemoryPattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        crate::spelling::loosely_named(s, &MemoryPattern::ALL, MemoryPattern::as_str).ok_or_else(
            || format!("unknown memory pattern {s:?}: use address, movingInversions or random"),
        )
    }
}

/// The PCIe link of each GPU, judged by the hostTransfer check.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PcieCheck {
    /// Replays (link-level retransmissions, NVML's replay counter) tolerated per GPU over the run
    /// before the GPU fails (default 8); fewer than that, but some, give a Warn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_replays: Option<i64>,
    /// Correctable PCIe errors (AER) tolerated per GPU over the run, where NVML exposes the
    /// counter (default 8); fewer, but some, give a Warn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_correctable_errors: Option<i64>,
    /// Uncorrectable PCIe errors (AER non-fatal and fatal) tolerated per GPU over the run, where
    /// NVML exposes the counters (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_uncorrectable_errors: Option<i64>,
    /// The PCIe generation every GPU of the node must run at under load (default: what the GPU
    /// and its slot support).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 7))]
    pub expect_gen: Option<i32>,
    /// The lane count every GPU of the node must run at under load (default: what the GPU and
    /// its slot support).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    pub expect_width: Option<i32>,
}

/// Power and clocks during one GPU's burn, from NVML samples taken while it ran.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PowerResult {
    /// The enforced power limit, W (where NVML gives it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_w: Option<f64>,
    /// The GPU's default power limit, W (where NVML gives it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_limit_w: Option<f64>,
    /// Samples taken during the burn.
    pub samples: i64,
    /// Median and highest power draw over the burn, W.
    pub median_w: f64,
    pub max_w: f64,
    /// The median's share of the enforced limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// The share the spec or the model profile asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_fraction: Option<f64>,
    /// Share of the samples with each throttle reason active (`SwPowerCap`: at the power cap,
    /// healthy under a burn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle: Vec<ThrottleShare>,
    /// Share of the samples slowed by hardware or thermal limits (`HwSlowdown`,
    /// `HwThermalSlowdown`, `HwPowerBrakeSlowdown`, `SwThermalSlowdown`).
    pub slowdown_fraction: f64,
}

/// The throttle reasons that mean clocks lost to hardware or thermal limits: worth a look.
/// Every other reason NVML names (`SwPowerCap`, `ApplicationsClocksSetting`, `GpuIdle`, ...) is
/// healthy under a burn and is never flagged.
pub const SLOWDOWN_THROTTLES: [&str; 4] = [
    "HwSlowdown",
    "HwThermalSlowdown",
    "HwPowerBrakeSlowdown",
    "SwThermalSlowdown",
];

/// True when throttle reason `reason` (NVML's name without its prefix) is one of
/// [`SLOWDOWN_THROTTLES`].
pub fn is_slowdown(reason: &str) -> bool {
    SLOWDOWN_THROTTLES.contains(&reason)
}

/// How often one throttle reason was active.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ThrottleShare {
    /// NVML's name without its prefix (`SwPowerCap`, `HwSlowdown`, ...).
    pub reason: String,
    pub fraction: f64,
}

/// The power pulse of one GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PulseResult {
    pub period_seconds: f64,
    pub seconds: f64,
    /// Load-and-idle cycles run.
    pub cycles: i64,
    /// Lowest and highest power read during the pulse, W, and the swing between them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_w: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_w: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swing_w: Option<f64>,
    /// GEMM results compared with the first after the pulse, and elements that differed.
    pub comparisons: i64,
    pub mismatches: i64,
}

/// One memory pattern's figures on one GPU.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PatternResult {
    pub pattern: MemoryPattern,
    pub passes: i32,
    /// 32-bit words that read back wrong.
    pub mismatches: i64,
    /// Bytes written plus bytes read over the pattern's device time, GB/s.
    pub gbps: f64,
    pub seconds: f64,
}

/// Which bits of the 32-bit words read back wrong, over every pattern.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BitFlips {
    /// Bits read as 1 where 0 was written (as if stuck at 1).
    pub stuck_at_one: i64,
    /// Bits read as 0 where 1 was written (as if stuck at 0).
    pub stuck_at_zero: i64,
    /// Each bit position that flipped, most flips first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bits: Vec<BitFlipCount>,
}

/// The flips of one bit position (0 = least significant bit of the word).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BitFlipCount {
    pub bit: i32,
    pub to_one: i64,
    pub to_zero: i64,
}

/// Remapped rows and retired pages of one GPU at one moment (None: NVML does not give it; GPUs
/// before Ampere retire pages, Ampere and later remap rows).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RowHealth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_correctable: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_uncorrectable: Option<i64>,
    /// A remapping waits for the GPU's next reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remap_pending: Option<bool>,
    /// A remapping failed (no spare row left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remap_failure: Option<bool>,
    /// Pages retired after single-bit and double-bit errors, and whether a retirement waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_single_bit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_double_bit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retire_pending: Option<bool>,
}

/// One GPU's PCIe link and its error counters.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PcieResult {
    /// Generation and lane count while host transfers ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_gen: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_width: Option<i32>,
    /// The most the GPU and its slot together allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gen: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_width: Option<i32>,
    /// The most the GPU alone supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_max_gen: Option<i32>,
    /// Replays from the start of the GPU checks to the end of the host transfers, and the
    /// counter's value at the end (since the driver loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replays: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replays_total: Option<i64>,
    /// Correctable and uncorrectable (non-fatal plus fatal) AER errors over the same window;
    /// absent where NVML does not expose them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correctable_errors: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncorrectable_errors: Option<i64>,
}
