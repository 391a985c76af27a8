//! The fabric test: collectives and TCP between nodes, run after the node checks over the nodes
//! that passed them, with the node at fault named.
//!
//! [`FabricSpec`] is the validation's `spec.fabric`; [`FabricStatus`] its line in the
//! validation's status. The operator plans rounds as [`GpuFabricRound`] objects (one per round,
//! in the operator's namespace: the plan only, written once, so the validation object stays
//! small at any node count and the agents that watch rounds are sent each plan once); each
//! agent writes what it measured in a round as a [`FabricOutcome`] into the
//! [`FABRIC_OUTCOMES`](crate::labels::FABRIC_OUTCOMES) annotation of its own node result, which
//! the operator already watches (metadata only).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Duration;
use crate::duration::DurationRange;
use crate::nccl::Collective;

/// The bounds of `spec.fabric.roundTimeout`.
pub const ROUND_TIMEOUT_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(10), Duration::from_secs(3600));
/// The bounds of `spec.fabric.tcp.duration`.
pub const TCP_DURATION_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(1), Duration::from_secs(600));
/// The most rounds a fabric test may plan (the first screens, the rest localize).
pub const MAX_ROUNDS: i32 = 16;
/// The most NCCL environment variables a validation may set.
pub const MAX_ENV: usize = 32;
/// The first rendezvous port: group `id` of a round meets on `RENDEZVOUS_PORT + 2 * id` (and
/// its NCCL bootstrap on the port above).
pub const RENDEZVOUS_PORT: u16 = 29400;

/// The rendezvous port of group `id` from the first port `base`: `base + 2 * id`, wrapping
/// around within `base..=65534` so that a round of many groups never leaves the port range
/// (its NCCL bootstrap is the port above). Groups far enough apart to wrap onto one port meet
/// at different addresses (their first members differ), so they do not collide.
pub fn group_port(base: u16, id: usize) -> u16 {
    let slots = (usize::from(u16::MAX - base.min(u16::MAX - 1)) / 2).max(1);
    let offset = 2 * (id % slots);
    base.saturating_add(u16::try_from(offset).unwrap_or(0))
}
/// The most suspects the validation status lists (the rest are counted).
pub const MAX_LISTED_SUSPECTS: usize = 20;

/// `spec.fabric`: what to measure between nodes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = crate::rules::fabric_measures_something())]
#[serde(rename_all = "camelCase")]
pub struct FabricSpec {
    /// One NCCL communicator over the GPUs of every node that passed its checks, then smaller
    /// groups to localize a fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<FabricNccl>,
    /// TCP streams each way between pairs of agents, and the round-trip latency of small messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<FabricTcp>,
    /// When a group falls short, split the work until each fault has a name (default true).
    /// Off: one screening round only; a failing group fails the fabric without naming a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub localize: Option<bool>,
    /// The longest one round may take before members that have not reported count as failed
    /// (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = ROUND_TIMEOUT_RANGE.rule())]
    pub round_timeout: Option<Duration>,
    /// The most rounds (default 8): suspects not named by then are reported as not localized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_ROUNDS))]
    pub max_rounds: Option<i32>,
    /// NCCL environment for the agents' collectives (`NCCL_IB_HCA`, `NCCL_SOCKET_IFNAME`, ...):
    /// `NCCL_*` names only. What gives pods the fabric (host network, RDMA devices, capabilities)
    /// is the administrator's, in the operator's settings, never a validation's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ENV))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub env: Vec<NcclEnv>,
    /// The lowest acceptable rate of each InfiniBand/RoCE port of a fabric node, Gb/s, as sysfs
    /// gives it (`400 Gb/sec (4X NDR)` is 400): a port under it fails its node, named with its
    /// device and port. Unset: only ports that are not up, gone, or whose link went down during
    /// the rounds fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub min_port_rate_gbps: Option<f64>,
}

impl FabricSpec {
    /// Whether a failing group is split to name the node at fault.
    pub fn localize(&self) -> bool {
        self.localize.unwrap_or(true)
    }
    /// The round timeout in force.
    pub fn round_timeout_or_default(&self) -> Duration {
        self.round_timeout.unwrap_or(Duration::from_secs(300))
    }
    /// The round limit in force.
    pub fn max_rounds_or_default(&self) -> u32 {
        self.max_rounds.map_or(8, |r| r.clamp(1, MAX_ROUNDS) as u32)
    }
}

/// One `NCCL_*` environment variable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclEnv {
    /// The variable's name: `NCCL_` and upper-case letters, digits and underscores.
    #[schemars(length(max = 64), regex(pattern = r"^NCCL_[A-Z0-9_]+$"))]
    pub name: String,
    /// Its value.
    #[schemars(length(max = 1024))]
    pub value: String,
}

/// `spec.fabric.nccl`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FabricNccl {
    /// The collective (default allReduce).
    #[serde(default = "default_collective")]
    pub collective: Collective,
    /// Message size in bytes, as nccl-tests counts it (default 1 GiB).
    #[serde(default = "default_fabric_bytes")]
    #[schemars(range(min = 1024, max = 68719476736i64))]
    pub bytes: i64,
    /// Timed iterations (default 20), after 5 untimed ones.
    #[serde(default = "default_fabric_iterations")]
    #[schemars(range(min = 1, max = 10000))]
    pub iterations: i32,
    /// Lowest acceptable bus bandwidth of a group, GB/s (as nccl-tests reports busbw).
    #[schemars(range(min = 1, max = 100000))]
    pub min_bus_bandwidth_gbps: i32,
    /// The network transport every rank must use between nodes, read from its NCCL log: a
    /// rank that used another (an RDMA fabric that fell back to sockets) fails, named with
    /// what it used. InfiniBand and RoCE share NCCL's verbs transport (`NET/IB`); they are told
    /// apart by the link layer of the devices it opened (its `NET/IB : Using` line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_transport: Option<NcclTransport>,
    /// Test rail by rail: the HCAs (`mlx5_0`, or `mlx5_0:1` for one port) that every node has
    /// under the same name, one per rail. Each rail is a fabric test of its own: its groups run
    /// with `NCCL_IB_HCA` set to that HCA alone, so a bad NIC, cable or leaf switch is named
    /// with its rail (`rail mlx5_3: fabric: in 3 of 4 NCCL groups ...`). Empty: NCCL uses every
    /// HCA at once, as a training job does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_RAILS), inner(length(max = 64), regex(pattern = RAIL_PATTERN)))]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub rails: Vec<Rail>,
}

/// The most rails a validation may test one by one.
pub const MAX_RAILS: usize = 16;

/// An HCA's name, with an optional `:port`.
pub const RAIL_PATTERN: &str = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(:[0-9]+)?$";

/// One HCA (`mlx5_0`) or one port of it (`mlx5_0:1`), as `NCCL_IB_HCA` names it.
pub type Rail = String;

/// The `NCCL_IB_HCA` value that makes NCCL use `rail` alone (`=` asks for the exact name, so
/// `mlx5_1` does not also take `mlx5_10`).
pub fn rail_hca(rail: &str) -> String {
    format!("={rail}")
}

/// A network transport NCCL uses between nodes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclTransport {
    /// InfiniBand verbs (`NET/IB`).
    IB,
    /// RoCE, through the same verbs transport (`NET/IB`), on devices of link layer Ethernet.
    RoCE,
    /// TCP sockets (`NET/Socket`).
    Socket,
}

impl NcclTransport {
    /// The transport name NCCL's channel lines give for it.
    pub fn nccl_name(self) -> &'static str {
        match self {
            NcclTransport::IB | NcclTransport::RoCE => "NET/IB",
            NcclTransport::Socket => "NET/Socket",
        }
    }
}

fn default_collective() -> Collective {
    Collective::AllReduce
}
fn default_fabric_bytes() -> i64 {
    1 << 30
}
fn default_fabric_iterations() -> i32 {
    20
}

/// `spec.fabric.tcp`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FabricTcp {
    /// Parallel streams each way (default 4).
    #[serde(default = "default_streams")]
    #[schemars(range(min = 1, max = 64))]
    pub streams: i32,
    /// How long each direction is measured (default 5s).
    #[serde(default = "default_tcp_duration")]
    #[x_kube(validation = TCP_DURATION_RANGE.rule())]
    pub duration: Duration,
    /// Lowest acceptable throughput each way, Gb/s (bits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.001, max = 100000))]
    pub min_gbps: Option<f64>,
    /// Highest acceptable median round trip of a 64-byte message, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000000))]
    pub max_latency_micros: Option<i32>,
}

fn default_streams() -> i32 {
    4
}
fn default_tcp_duration() -> Duration {
    Duration::from_secs(5)
}

/// What a group of a round measures.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FabricKind {
    /// One NCCL communicator over every GPU of the group's nodes.
    Nccl,
    /// TCP streams each way and small-message round trips between the group's two nodes.
    Tcp,
}

crate::spelling::api_spelling!(FabricKind {
    Nccl => "Nccl",
    Tcp => "Tcp",
});

/// A round of the fabric test: which nodes measure together, and where they meet. Written once
/// by the operator; agents watch them and run the groups they are in, in `id` order.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpuval.io",
    version = "v1alpha1",
    kind = "GpuFabricRound",
    plural = "gpufabricrounds",
    shortname = "gpuround",
    category = "gpuval-all",
    namespaced,
    derive = "PartialEq",
    printcolumn(name = "Validation", type_ = "string", json_path = ".spec.validation"),
    printcolumn(name = "Round", type_ = "integer", json_path = ".spec.round"),
    printcolumn(name = "Purpose", type_ = "string", json_path = ".spec.purpose"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FabricRoundSpec {
    /// The GpuValidation this round belongs to.
    #[schemars(length(max = 253))]
    pub validation: String,
    /// The validation's metadata.generation.
    pub generation: i64,
    /// 1 for the screening round, then 2, 3, ...; `end` rounds carry the next number.
    pub round: i32,
    /// Why this round: `screen`, `pairs`, `confirm`, `split`, or `end`.
    #[schemars(length(max = 16))]
    pub purpose: String,
    /// When the round was planned; members that have not reported by this plus the timeout
    /// count as failed.
    pub started: Time,
    /// The round timeout, in seconds.
    pub timeout_seconds: i64,
    /// The fabric test is over: agents leave.
    #[serde(default)]
    pub end: bool,
    /// The groups, measured at the same time.
    #[serde(default)]
    pub groups: Vec<FabricGroup>,
    /// This object's part of the round, from 0: a round too large for one object is written
    /// as `shards` objects (see [`crate::fabric_shard`]), each well under etcd's object limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shard: i32,
    /// How many objects the round is written as (default 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub shards: i32,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}
fn is_one(v: &i32) -> bool {
    *v == 1
}
fn one() -> i32 {
    1
}

/// One group of a round.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FabricGroup {
    /// Unique within the round.
    pub id: i32,
    pub kind: FabricKind,
    /// The member nodes, in rank order (the first one hosts the rendezvous).
    pub nodes: Vec<String>,
    /// `host:port` of the rendezvous: the first node's agent pod IP and a port.
    pub rendezvous: String,
    /// Each member's GPU count, in the same order (an NCCL group's ranks are laid out by it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<i32>,
    /// The rail an NCCL group tests (`spec.fabric.nccl.rails`): its members run with
    /// `NCCL_IB_HCA` set to it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<Rail>,
    /// When this object lists only part of the group: the index in the group of the first
    /// node listed here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first: i32,
    /// When this object lists only part of the group: the group's size (0: `nodes` is all of it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: i32,
}

/// What one agent measured in one group of one round (one element of the JSON array in its
/// result's [`FABRIC_OUTCOMES`](crate::labels::FABRIC_OUTCOMES) annotation).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FabricOutcome {
    pub round: i32,
    pub group: i32,
    /// Bus bandwidth this member measured (NCCL groups), GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_gbps: Option<f64>,
    /// Throughput this member sent, Gb/s (TCP groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_gbps: Option<f64>,
    /// Throughput this member received, Gb/s (TCP groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv_gbps: Option<f64>,
    /// Median round trip of a 64-byte message, microseconds (TCP groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_micros: Option<f64>,
    /// Seconds from the round's plan reaching the agent to the group being connected.
    #[serde(default)]
    pub join_seconds: f64,
    /// Seconds of measuring.
    #[serde(default)]
    pub seconds: f64,
    /// Why this member could not measure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<FabricError>,
    /// Reported by the group's first node (which hosts the rendezvous): the members that never
    /// joined it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// The figures are not real (simulated backend).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
}

/// A member's failure: what happened to it, as a [`FabricErrorKind`], and in words for people.
/// The planner reads the kind alone (never the words), so rewording a message changes no
/// verdict.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FabricError {
    pub kind: FabricErrorKind,
    #[schemars(length(max = 300))]
    pub message: String,
}

/// What happened to a member of a fabric group, as its agent saw it. Only [`Local`] is the
/// member's own failure; every other kind is one another member's fault can explain, so it
/// never names the member that reported it.
///
/// [`Local`]: FabricErrorKind::Local
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricErrorKind {
    /// Its own side failed: its GPU (a CUDA error, wrong elements received on its ranks), its
    /// NCCL or network setup (no interface, no library), its own thread.
    Local,
    /// A peer's failure reached it: NCCL says a remote process exited or its connection was
    /// closed, reset or refused, or a peer broke off the TCP test.
    Peer,
    /// It waited for its peers past a deadline: a setup or a collective that did not return in
    /// time.
    Timeout,
    /// Its collective made no progress and its sweep was stopped for silence (a group that
    /// stalls stalls every member; whose watchdog fires first is chance).
    Stalled,
    /// The rendezvous did not gather the group: members never came, or the host could not be
    /// reached (the host's report names who was missing).
    NeverJoined,
    /// The rendezvous host refused this member.
    Refused,
    /// It stopped because another member of its group failed first.
    Aborted,
    /// A kind this reader does not know (written by a newer agent): read as not the member's
    /// own, so a reader older than its agents never blames a node for what it cannot read.
    #[serde(other)]
    Unknown,
}

impl FabricErrorKind {
    /// True for the member's own failure ([`FabricErrorKind::Local`]).
    pub fn is_own(self) -> bool {
        matches!(self, FabricErrorKind::Local)
    }
}

/// Parses the outcomes annotation; an unreadable one reads as no outcomes (and says why).
pub fn parse_outcomes(annotation: &str) -> Result<Vec<FabricOutcome>, String> {
    serde_json::from_str(annotation).map_err(|e| format!("unreadable fabric outcomes: {e}"))
}

/// The phase of the fabric test.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FabricPhase {
    /// Node checks still running.
    Waiting,
    Running,
    Passed,
    Failed,
    /// Fewer than two nodes passed their checks.
    Skipped,
}

impl FabricPhase {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            FabricPhase::Passed | FabricPhase::Failed | FabricPhase::Skipped
        )
    }
}

crate::spelling::api_spelling!(FabricPhase {
    Waiting => "Waiting",
    Running => "Running",
    Passed => "Passed",
    Failed => "Failed",
    Skipped => "Skipped",
});

/// The validation's fabric line.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FabricStatus {
    pub phase: FabricPhase,
    /// Nodes in the fabric test (those that passed their checks).
    pub nodes: i32,
    /// Rounds planned so far.
    pub rounds: i32,
    /// Bus bandwidth of the screening round's all-node group, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_bandwidth_gbps: Option<f64>,
    /// The lowest TCP throughput of any pair that passed, Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_min_gbps: Option<f64>,
    /// Nodes named at fault.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_nodes: Vec<String>,
    /// Nodes under suspicion that could not be cleared or named (at most 20 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspects: Vec<String>,
    /// The InfiniBand/RoCE ports of the fabric's nodes (absent when none has any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<crate::fabric_ports::FabricPortsStatus>,
    /// What happened, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod port_tests {

    #[test]
    fn a_kind_this_reader_does_not_know_is_no_members_own() {
        let outcome: FabricError =
            serde_json::from_str(r#"{"kind": "SomethingNewer", "message": "x"}"#).expect("read");
        assert_eq!(outcome.kind, FabricErrorKind::Unknown);
        assert!(!outcome.kind.is_own());
        let own: FabricError =
            serde_json::from_str(r#"{"kind": "Local", "message": "x"}"#).expect("read");
        assert!(own.kind.is_own());
    }

    use super::*;

    #[test]
    fn group_ports_stay_in_range_for_any_round() {
        assert_eq!(group_port(RENDEZVOUS_PORT, 0), 29400);
        assert_eq!(group_port(RENDEZVOUS_PORT, 3), 29406);
        for base in [1024, RENDEZVOUS_PORT, 65000, 65533, 65534] {
            for id in [0, 1, 5_000, 18_067, 18_068, 1_000_000] {
                let p = group_port(base, id);
                assert!(p >= base && p < u16::MAX, "base {base} group {id}: {p}");
            }
        }
        // Groups near each other still get ports of their own.
        assert_ne!(
            group_port(RENDEZVOUS_PORT, 17_000),
            group_port(RENDEZVOUS_PORT, 17_001)
        );
    }
}
