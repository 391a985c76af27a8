//! The fabric test between nodes, as one agent takes part in it: the groups of a round that
//! this node is in, measured in `id` order, each giving this member's
//! [`FabricOutcome`](gpuval_crds::fabric::FabricOutcome).
//!
//! Every group starts with a rendezvous ([`rendezvous`]): the group's first node listens on the
//! group's address, the others connect and say hello, and the host answers `go` once all have
//! joined (or names the ones that never came). Then a TCP pair measures streams each way and
//! small-message round trips ([`tcp`]); an NCCL group runs one collective over every member's
//! GPUs through an [`NcclGroup`] (the real engine, or the simulator, [`sim`]).
//!
//! In a pod, the assignments come from the operator's `GpuFabricRound` objects (`k8s/`);
//! outside Kubernetes, from rank 0 of a Slurm or torchrun launch ([`launch`], [`coordinator`]).

#[cfg(test)]
mod bounds_tests;
pub mod coordinator;
pub mod data_streams;
pub mod greeting;
pub mod group;
pub mod launch;
pub mod member_key;
pub mod nccl;
pub mod ports;
pub mod rendezvous;
pub mod rounds;
pub mod sim;
pub mod tcp;
#[cfg(test)]
mod tests;
pub mod watch;

use std::time::Instant;

use gpuval_crds::fabric::{FabricError, FabricKind, FabricNccl, FabricOutcome, FabricSpec};

/// One group of one round, from this member's side.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    pub round: i32,
    pub group: i32,
    pub kind: FabricKind,
    /// The members in rank order; `nodes[0]` hosts the rendezvous.
    pub nodes: Vec<String>,
    /// This member's index in `nodes`.
    pub rank: usize,
    /// `host:port` of the rendezvous.
    pub rendezvous: String,
    /// Each member's GPU count (empty: not known; NCCL groups then take every member to have
    /// as many as this node).
    pub gpus: Vec<u32>,
    /// When the round runs out: nothing may block past it.
    pub deadline: Instant,
    /// The rail an NCCL group tests: NCCL runs with `NCCL_IB_HCA` set to it alone.
    pub rail: Option<String>,
}

/// The members that joined a group's rendezvous, in rank order, and how long joining took.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    pub join_seconds: f64,
}

/// Figures of one NCCL group, from this member's side.
#[derive(Debug, Clone, PartialEq)]
pub struct NcclFigures {
    pub bus_gbps: f64,
    pub seconds: f64,
}

/// Runs the collective of an NCCL group once its rendezvous is done (the real engine, or the
/// simulator).
pub trait NcclGroup: Send + Sync {
    /// `a` is this member's assignment; `settings` the validation's `spec.fabric.nccl`;
    /// `env` its `NCCL_*` variables; `link` the group's joined control channel (the host holds
    /// one connection per other member, a member one to the host), for small messages such as
    /// the communicator's unique id, each call with a deadline (`a.deadline` at the latest).
    fn run(
        &self,
        a: &Assignment,
        settings: &FabricNccl,
        env: &[(String, String)],
        link: &mut rendezvous::Link,
    ) -> Result<NcclFigures, FabricError>;
    /// The figures are not real.
    fn simulated(&self) -> bool;
    /// Test only (the simulator's `netfault=vanish`): the agent process exits when it is
    /// assigned its first fabric group, as an agent lost mid-round.
    fn planted_vanish(&self) -> bool {
        false
    }
    /// Test only (the simulator's `netfault=nojoin`): this node never reaches a rendezvous.
    fn planted_nojoin(&self) -> bool {
        false
    }
}

/// The NCCL runner for the backend in use: the simulator's, or the real engine over the GPUs
/// the node's checks reported.
pub fn group_runner(
    choice: &crate::backend::BackendChoice,
    report: &gpuval_crds::NodeReport,
) -> std::sync::Arc<dyn NcclGroup> {
    match choice {
        crate::backend::BackendChoice::Simulated(spec) => {
            std::sync::Arc::new(sim::SimNccl::new(spec.model, spec.net.clone()))
        }
        crate::backend::BackendChoice::Cuda => {
            std::sync::Arc::new(nccl::RealNccl::from_report(report))
        }
    }
}

/// The real NCCL group over every GPU of this host (outside Kubernetes: the GPUs come from the
/// CUDA backend's inventory).
pub fn real_nccl() -> Result<Box<dyn NcclGroup>, String> {
    let backend = crate::backend::open(&crate::backend::BackendChoice::Cuda)
        .map_err(|e| format!("GPU backend: {e}"))?;
    let inventory = backend
        .platform()
        .inventory()
        .map_err(|e| format!("list the GPUs: {e}"))?;
    // NVML lists every GPU of the host; the launcher may have given this rank only some.
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let gpus = inventory
        .gpus
        .iter()
        .filter(|g| nccl::is_visible(visible.as_deref(), g.index, &g.uuid))
        .map(|g| crate::nccl::request::RankGpu {
            index: g.index,
            uuid: g.uuid.clone(),
        })
        .collect();
    Ok(Box::new(nccl::RealNccl::new(gpus)))
}

/// What one member measured in one group (see [`FabricOutcome`]); never fails: a failure is
/// the outcome's `error`.
pub type Outcome = FabricOutcome;

/// The spec sections a group needs.
pub fn spec_env(spec: &FabricSpec) -> Vec<(String, String)> {
    spec.env
        .iter()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect()
}

/// The `NCCL_*` environment of assignment `a`'s NCCL group: the spec's, and on a rail
/// `NCCL_IB_HCA` naming that rail alone (in place of any the spec sets).
pub fn group_env(spec: &FabricSpec, a: &Assignment) -> Vec<(String, String)> {
    let mut env = spec_env(spec);
    if let Some(rail) = &a.rail {
        env.retain(|(name, _)| name != "NCCL_IB_HCA");
        env.push(("NCCL_IB_HCA".into(), gpuval_crds::fabric::rail_hca(rail)));
    }
    env
}
