//! The `training` check: a synthetic data-parallel training step over every GPU of the node,
//! as DDP runs one, with no framework: per GPU a stack of transformer-like MLP blocks (bf16
//! GEMMs forward and backward through cuBLAS, a GELU compiled by NVRTC), a batch generated on
//! the GPU each step, the gradients bucketed and all-reduced through NCCL on a second stream
//! while the backward pass runs, and a plain SGD update. It reports the step time, samples/s,
//! the communication the backward pass did not hide, the scaling efficiency against one GPU
//! alone (measured in the same run) and TFLOP/s; and it compares every replica's weights bit
//! for bit, since identical starting weights and identical all-reduced updates must keep them
//! identical: a replica that differs names a GPU with silent data corruption.
//!
//! How the pieces fit:
//! - [`request::TrainingRequest`] is the step the spec asks for (shapes, buckets, FLOPs);
//! - [`child::run`] runs it on real GPUs in a child process of the agent, which runs
//!   [`engine::run`] (one thread per GPU, the NCCL check's communicator code, a watchdog over
//!   its host NCCL calls); [`sim::run`] is the simulated node, whose step runs in a child
//!   process the same way;
//! - [`replicas::compare`] is the divergence detector, [`judge::judge`] the verdict;
//! - [`render`] prints it, [`args::Flags`] are its flags, [`Training`] is the check.
//!
//! Across nodes: the step runs over one node's GPUs today; the spec section is the one a
//! data-parallel group over several nodes will use once the fabric phase runs it.

pub mod args;
mod check;
pub mod child;
pub mod engine;
pub mod judge;
pub mod outcome;
pub mod render;
pub mod replicas;
pub mod request;
pub mod sim;
pub mod stuck;

pub use args::Flags;
pub use check::{Training, TrainingMeasured};

crate::check_result!(gpuval_crds::TrainingResult);

/// The check's table section, when it ran.
pub fn section(report: &gpuval_crds::NodeReport) -> String {
    report
        .training
        .as_ref()
        .map(render::section)
        .unwrap_or_default()
}

/// The headline's part: `training 41.2 samples/s/GPU, scaling 0.97`.
pub fn headline(report: &gpuval_crds::NodeReport) -> Vec<String> {
    report
        .training
        .iter()
        .filter_map(render::headline)
        .collect()
}

pub mod row;
