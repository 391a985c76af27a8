//! What the reconcile steps see of the cluster: this validation's agent pods and node results,
//! reduced by the shell to the few facts the steps decide on.

use std::collections::BTreeSet;

use gpuval_crds::Verdict;
use gpuval_crds::fabric::{FabricGroup, FabricOutcome, FabricRoundSpec};
use k8s_openapi::jiff::Timestamp;

/// A pod's `status.phase`, parsed once by the shell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodPhase {
    /// Accepted but not running yet (being scheduled, pulling the image, ...).
    #[default]
    Pending,
    /// The agent container is running.
    Running,
    /// The agent exited 0.
    Succeeded,
    /// The agent exited non-zero, or the pod cannot start at all.
    Failed,
    /// The kubelet cannot report the pod's state (or the phase is one this operator does not know).
    Unknown,
}

impl PodPhase {
    /// Parses `status.phase` as the API writes it; a phase this operator does not know is
    /// [`PodPhase::Unknown`].
    pub fn parse(phase: &str) -> Self {
        match phase {
            "Pending" => PodPhase::Pending,
            "Running" => PodPhase::Running,
            "Succeeded" => PodPhase::Succeeded,
            "Failed" => PodPhase::Failed,
            _ => PodPhase::Unknown,
        }
    }
}

/// One of this validation's agent pods, as far as the steps care.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodView {
    pub name: String,
    /// The node the pod was made for (its annotation, not the scheduler's choice).
    pub node: String,
    /// The validation generation the pod was made for.
    pub generation: i64,
    pub phase: PodPhase,
    /// Why the pod failed or is stuck, in words (Evicted: ..., OOMKilled, exit code 137, ...).
    pub reason: Option<String>,
    /// The pod has a deletion timestamp.
    pub deleting: bool,
    /// When the agent container finished (Succeeded/Failed pods).
    pub finished_at: Option<Timestamp>,
    /// When the pod was created (its time Pending counts from it).
    pub created: Option<Timestamp>,
    /// The pod's IP (where its agent hosts a fabric rendezvous).
    pub ip: Option<String>,
    /// The image its agent container ran, as the kubelet resolved it (the container status's
    /// `imageID`, a digest), once it started.
    pub image_id: Option<String>,
}

/// One of this validation's node results (metadata only: verdict label and summary annotation).
#[derive(Debug, Clone, PartialEq)]
pub struct ResultView {
    pub name: String,
    pub node: String,
    pub generation: i64,
    pub verdict: Verdict,
    /// The node's failures in plain words (empty when there are none).
    pub summary: String,
    /// What the node's agent measured in the fabric test's rounds so far.
    pub fabric: Vec<FabricOutcome>,
    /// Its InfiniBand/RoCE ports as its agent last read them in the fabric test (None: no
    /// RDMA ports, or not read yet).
    pub ports: Option<gpuval_crds::fabric_ports::PortsReport>,
    /// Its failures' codes, the recommended action and the node's versions.
    pub facts: ResultFacts,
}

impl ResultView {
    /// Result `name` of node `node` for generation `generation`: a pass with nothing more to
    /// say.
    pub fn passed(name: String, node: &str, generation: i64) -> ResultView {
        ResultView {
            name,
            node: node.to_string(),
            generation,
            verdict: Verdict::Pass,
            summary: String::new(),
            fabric: Vec::new(),
            ports: None,
            facts: ResultFacts::default(),
        }
    }
}

/// What a node result says beyond its verdict (its `gpuval.io/action` label and its
/// `gpuval.io/codes` and `gpuval.io/versions` annotations).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResultFacts {
    /// The codes of its first failures (or warnings), comma-separated.
    pub codes: String,
    pub action: gpuval_crds::Action,
    pub versions: gpuval_crds::facts::Versions,
    /// It carries `gpuval.io/simulated=true`.
    pub simulated: bool,
}

/// One of this validation's fabric rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundView {
    pub generation: i64,
    pub number: u32,
    pub purpose: String,
    pub started: Timestamp,
    pub timeout: std::time::Duration,
    pub end: bool,
    pub groups: Vec<FabricGroup>,
    /// This object's part of the round, and how many parts the round has.
    pub shard: i32,
    pub shards: i32,
}

impl From<&FabricRoundSpec> for RoundView {
    /// A fabric round as the steps see it (a negative number or timeout reads as 0).
    fn from(s: &FabricRoundSpec) -> Self {
        RoundView {
            generation: s.generation,
            number: u32::try_from(s.round).unwrap_or(0),
            purpose: s.purpose.clone(),
            started: s.started.0,
            timeout: std::time::Duration::from_secs(u64::try_from(s.timeout_seconds).unwrap_or(0)),
            end: s.end,
            groups: s.groups.clone(),
            shard: s.shard,
            shards: s.shards,
        }
    }
}

/// What the cluster looks like now, for one validation.
#[derive(Debug, Clone, Default)]
pub struct World {
    /// Names of nodes that exist.
    pub nodes: BTreeSet<String>,
    pub pods: Vec<PodView>,
    pub results: Vec<ResultView>,
    pub rounds: Vec<RoundView>,
    /// The first fabric rendezvous port (the operator's `--fabric-port`; 0: the default).
    pub fabric_port: u16,
    /// How long an agent pod may stay Pending (the operator's `--agent-pending-limit`; None:
    /// until the deadline).
    pub pending_limit: Option<std::time::Duration>,
}

impl World {
    /// The agent pods made for the run of `generation`.
    pub fn pods_of(&self, generation: i64) -> impl Iterator<Item = &PodView> {
        self.pods.iter().filter(move |p| p.generation == generation)
    }

    /// The agent pods of the run of `generation` that are running and not being deleted.
    pub fn running_of(&self, generation: i64) -> impl Iterator<Item = &PodView> {
        self.pods_of(generation)
            .filter(|p| p.phase == PodPhase::Running && !p.deleting)
    }

    /// The node results of the run of `generation`.
    pub fn results_of(&self, generation: i64) -> impl Iterator<Item = &ResultView> {
        self.results
            .iter()
            .filter(move |r| r.generation == generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_phases_parse_and_unknown_ones_are_unknown() {
        assert_eq!(PodPhase::parse("Pending"), PodPhase::Pending);
        assert_eq!(PodPhase::parse("Running"), PodPhase::Running);
        assert_eq!(PodPhase::parse("Succeeded"), PodPhase::Succeeded);
        assert_eq!(PodPhase::parse("Failed"), PodPhase::Failed);
        assert_eq!(PodPhase::parse("Unknown"), PodPhase::Unknown);
        assert_eq!(PodPhase::parse("running"), PodPhase::Unknown, "exact names");
    }
}
