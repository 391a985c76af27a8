//! gpuval node agent: checks a node's GPUs and writes a [`gpuval_crds::NodeReport`]; in a pod
//! ([`k8s`]) it stores that report in the node's `GpuNodeResult`, which the operator made for its pod.
//!
//! Layers, each using only its own and those below it: the entry points (`main`, [`k8s`],
//! [`config`], [`saved_result`]) → [`runner`] (inventory, sampler, aggregation),
//! [`render`] and [`fabric`] → [`checks`] (one folder per check; `checks/mod.rs` lists them) →
//! [`check`] (the contract, the shared fan-out, flag overrides) → [`backend`] (CUDA/NVML and
//! simulated plumbing), [`api_retry`], [`judge`], [`run_control`], [`text`], [`profiles`],
//! [`link_floors`], [`telemetry`], [`report`], [`test_hooks`], [`worker`], [`pod_resources`],
//! [`nccl`] (the NCCL engine, shared by the NCCL check, training and the fabric) →
//! [`pci`], [`host_identity`]. The table is kept in `tests/tests/layers.rs` (`AGENT`), whose
//! test fails on an import from a higher layer or a circle of modules (no exceptions).

pub mod api_retry;
pub mod backend;
pub mod bare_certificate;
pub mod check;
pub mod checks;
pub mod config;
pub mod fabric;
pub mod host_identity;
pub mod judge;
pub mod k8s;
pub mod link_floors;
pub mod nccl;
pub mod pci;
pub mod pod_resources;
pub mod profiles;
pub mod render;
pub mod report;
pub mod run_control;
pub mod runner;
pub mod saved_result;
pub mod telemetry;
pub mod test_hooks;
pub mod text;
pub mod worker;
