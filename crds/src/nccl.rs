//! The `nccl` check: collectives over every GPU of a node through NCCL, a size sweep, bus
//! bandwidth as nccl-tests defines it, every result verified on the GPU, the transport NCCL
//! chose, hangs aborted. [`NcclCheck`] is its spec section, [`NcclResult`] its report section.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Duration, kinds::Verdict};

/// A collective operation.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    /// From rank 0.
    Broadcast,
    /// Grouped send/receive to and from every rank.
    AllToAll,
}

crate::spelling::api_spelling!(Collective {
    AllReduce => "allReduce",
    AllGather => "allGather",
    ReduceScatter => "reduceScatter",
    Broadcast => "broadcast",
    AllToAll => "allToAll",
});

impl std::str::FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        crate::spelling::loosely_named(s, &Collective::ALL, Collective::as_str).ok_or_else(|| {
            format!(
                "unknown collective {s:?}: use allReduce, allGather, reduceScatter, broadcast or allToAll"
            )
        })
    }
}

/// The element type of a collective's buffers.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum NcclDtype {
    #[default]
    Bf16,
    Fp32,
}

crate::spelling::api_spelling!(NcclDtype {
    Bf16 => "bf16",
    Fp32 => "fp32",
});

impl NcclDtype {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            NcclDtype::Bf16 => 2,
            NcclDtype::Fp32 => 4,
        }
    }
}

impl std::str::FromStr for NcclDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(NcclDtype::Bf16),
            "fp32" | "float" | "float32" => Ok(NcclDtype::Fp32),
            _ => Err(format!("unknown NCCL data type {s:?}: use bf16 or fp32")),
        }
    }
}

/// The bounds of `spec.checks.nccl.timeout`.
pub const NCCL_TIMEOUT_RANGE: crate::duration::DurationRange =
    crate::duration::DurationRange::new(Duration::from_secs(1), Duration::from_secs(3600));

/// The largest message size the sweep may reach (64 GiB).
pub const NCCL_MAX_BYTES: i64 = 1 << 36;

/// NCCL check settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = crate::rules::nccl_max_not_below_min())]
#[serde(rename_all = "camelCase")]
pub struct NcclCheck {
    /// Collectives to run, in turn (default allReduce).
    #[serde(default = "default_collectives")]
    #[schemars(length(min = 1, max = 5))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub collectives: Vec<Collective>,
    /// Smallest message size in bytes, as nccl-tests counts it (default 8).
    #[serde(default = "default_min_bytes")]
    #[schemars(range(min = 1, max = 68719476736i64))]
    pub min_bytes: i64,
    /// Largest message size in bytes (default 4 GiB where GPU memory allows, less on smaller
    /// GPUs); always measured, even off the size ladder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 68719476736i64))]
    pub max_bytes: Option<i64>,
    /// Each size is the previous one times this factor (default 4).
    #[serde(default = "default_step_factor")]
    #[schemars(range(min = 2, max = 1024))]
    pub step_factor: i32,
    /// Timed iterations per size, averaged (default 20).
    #[serde(default = "default_nccl_iterations")]
    #[schemars(range(min = 1, max = 10000))]
    pub iterations: i32,
    /// Untimed iterations before the timed ones, per size (default 5).
    #[serde(default = "default_warmup")]
    #[schemars(range(min = 0, max = 1000))]
    pub warmup_iterations: i32,
    /// Element type (default bf16).
    #[serde(default)]
    pub dtype: NcclDtype,
    /// How long one batch of collectives may take before the communicator is aborted and the
    /// check reports Error (default 60s).
    #[serde(default = "default_collective_timeout")]
    #[x_kube(validation = NCCL_TIMEOUT_RANGE.rule())]
    pub timeout: Duration,
    /// Also run the sweep with NCCL's peer-to-peer transport off (NCCL_P2P_DISABLE=1), in a
    /// second process, and report both curves.
    #[serde(default)]
    pub transports: bool,
    /// Lowest acceptable bus bandwidth at the largest size, GB/s (default: the model profile's
    /// for all-reduce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub min_bus_bandwidth_gbps: Option<i32>,
    /// Highest acceptable time of one collective at the smallest size, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000000))]
    pub max_small_latency_micros: Option<i32>,
}

impl Default for NcclCheck {
    fn default() -> Self {
        Self {
            collectives: default_collectives(),
            min_bytes: default_min_bytes(),
            max_bytes: None,
            step_factor: default_step_factor(),
            iterations: default_nccl_iterations(),
            warmup_iterations: default_warmup(),
            dtype: NcclDtype::default(),
            timeout: default_collective_timeout(),
            transports: false,
            min_bus_bandwidth_gbps: None,
            max_small_latency_micros: None,
        }
    }
}

fn default_collectives() -> Vec<Collective> {
    vec![Collective::AllReduce]
}
fn default_min_bytes() -> i64 {
    8
}
fn default_step_factor() -> i32 {
    4
}
fn default_nccl_iterations() -> i32 {
    20
}
fn default_warmup() -> i32 {
    5
}
fn default_collective_timeout() -> Duration {
    Duration::from_secs(60)
}

/// The NCCL check of a node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclResult {
    pub verdict: Verdict,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<crate::reason::Reason>,
    /// NVML index of each rank's GPU, in rank order.
    pub gpus: Vec<i32>,
    pub dtype: NcclDtype,
    pub iterations: i32,
    pub warmup_iterations: i32,
    /// NCCL's version (`2.28.3`), and the library file it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
    /// The sweep with NCCL's default transports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<NcclSweep>,
    /// The same sweep with peer-to-peer off (`transports: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p2p_off: Option<NcclSweep>,
    /// Elements that arrived wrong: the first few, each naming rank, collective and size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mismatches: Vec<NcclMismatch>,
    /// Facts about how the figures were taken (not verdict reasons).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub seconds: f64,
    /// The bus bandwidth floors each collective was held to, and where each came from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floors: Vec<crate::kinds::BandwidthFloor>,
}

/// One sweep: a curve per collective and the transports NCCL chose.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclSweep {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<NcclTransport>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub curves: Vec<NcclCurve>,
    /// Why the sweep stopped early (a hang that was aborted, an NCCL error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What NCCL's own log says about how the ranks were connected.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclTransport {
    /// Collective channels of the communicator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<i32>,
    /// Every transport seen (`P2P/CUMEM`, `P2P/IPC`, `SHM`, `NET/IB`, ...).
    pub kinds: Vec<String>,
    /// Per ordered GPU pair and transport, how many channel connections used it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<NcclLink>,
}

/// Channel connections from one GPU to another through one transport.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclLink {
    /// NVML indices.
    pub from: i32,
    pub to: i32,
    pub via: String,
    pub connections: i32,
}

/// One collective's size sweep.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclCurve {
    pub collective: Collective,
    pub rows: Vec<NcclRow>,
}

/// One size, like a line of nccl-tests' output: `bytes` and `count` mean what nccl-tests'
/// size and count columns mean for the collective; times are per collective, the slowest
/// rank's; bandwidths are GB/s (1e9).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclRow {
    pub bytes: i64,
    pub count: i64,
    pub time_micros: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_time_micros: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_algbw_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_busbw_gbps: Option<f64>,
    /// Elements that arrived wrong at this size, over every rank and both placements.
    pub wrong: i64,
}

/// Wrong elements one rank received.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclMismatch {
    pub rank: i32,
    /// NVML index of the rank's GPU.
    pub gpu: i32,
    pub collective: String,
    pub bytes: i64,
    pub in_place: bool,
    /// Peer-to-peer was off for this sweep.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub p2p_off: bool,
    pub elements: i64,
    /// Byte offset of the first wrong element in the rank's output buffer.
    pub first_offset: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_parse_in_the_usual_spellings() {
        assert_eq!("allReduce".parse::<Collective>(), Ok(Collective::AllReduce));
        assert_eq!(
            "all_gather".parse::<Collective>(),
            Ok(Collective::AllGather)
        );
        assert_eq!(
            "reduce-scatter".parse::<Collective>(),
            Ok(Collective::ReduceScatter)
        );
        assert_eq!("alltoall".parse::<Collective>(), Ok(Collective::AllToAll));
        assert!("gather".parse::<Collective>().is_err());
        assert_eq!(
            serde_json::to_string(&Collective::AllToAll).ok().as_deref(),
            Some("\"allToAll\"")
        );
    }

    #[test]
    fn defaults_follow_nccl_tests_where_they_can() {
        let c: NcclCheck = serde_json::from_str("{}").expect("an empty nccl section");
        assert_eq!(c, NcclCheck::default());
        assert_eq!(c.collectives, [Collective::AllReduce]);
        assert_eq!((c.min_bytes, c.step_factor, c.iterations), (8, 4, 20));
        assert_eq!(c.timeout, Duration::from_secs(60));
        assert_eq!("float".parse::<NcclDtype>(), Ok(NcclDtype::Fp32));
    }
}
