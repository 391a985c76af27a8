//! The `nccl` check: collectives (all-reduce, all-gather, reduce-scatter, broadcast,
//! all-to-all) over every GPU of the node through one NCCL communicator, a size sweep, bus and
//! algorithm bandwidth exactly as nccl-tests defines them ([`bandwidth`]), every result
//! verified on the GPU ([`verify`]), the transport NCCL chose read from its own log
//! ([`transport`]), hangs aborted.
//!
//! How the pieces fit:
//! - [`crate::nccl::NcclRequest::from_spec`] builds the request from the spec and the node's
//!   GPUs, and [`crate::nccl::run`] runs it on real GPUs (the NCCL engine is a library of the
//!   agent, shared with the training check and the fabric); [`crate::nccl::sim::run`] is the
//!   simulated node, whose sweeps run in child processes of the agent as the real ones do;
//! - [`judge::judge`] turns the outcome into the report's [`gpuval_crds::NcclResult`];
//! - [`render::section`] and [`render::headline`] print it; [`args::NcclArgs`] are its flags;
//!   [`Nccl`] is the check as the runner runs it.

pub mod args;
mod check;
pub mod judge;
pub mod render;
pub mod row;
#[cfg(test)]
mod sim_tests;

use gpuval_crds::TopologyReport;

pub use check::{Nccl, NcclMeasured};

crate::check_result!(gpuval_crds::NcclResult);

/// The check's table section, when it ran.
pub fn section(report: &gpuval_crds::NodeReport) -> String {
    report
        .nccl
        .as_ref()
        .map(render::section)
        .unwrap_or_default()
}

/// The headline's part: `all-reduce 346 GB/s busbw at 4 GiB`.
pub fn headline(report: &gpuval_crds::NodeReport) -> Vec<String> {
    report.nccl.iter().filter_map(render::headline).collect()
}

/// True when every pair of GPUs in the topology is connected by NVLink (`NV#`).
pub fn nvlink_between_all(t: &TopologyReport) -> bool {
    let n = t.matrix.len();
    n > 1
        && (0..n).all(|i| {
            (0..n).all(|j| i == j || t.matrix[i].get(j).is_some_and(|c| c.starts_with("NV")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvlink_everywhere_or_not() {
        let m = |cells: &[&[&str]]| TopologyReport {
            matrix: cells
                .iter()
                .map(|r| r.iter().map(|c| c.to_string()).collect())
                .collect(),
            ..Default::default()
        };
        assert!(nvlink_between_all(&m(&[&["X", "NV18"], &["NV18", "X"]])));
        assert!(!nvlink_between_all(&m(&[&["X", "SYS"], &["SYS", "X"]])));
        assert!(!nvlink_between_all(&m(&[&["X"]])));
    }
}
