//! gpuval node agent: checks a node's GPUs through one [`backend::Backend`] (real: cudarc + NVML;
//! simulated: tests and demos only) and writes a [`gpuval_crds::NodeReport`]; in a pod
//! ([`k8s`]) it stores that report as the node's `GpuNodeResult`.

pub mod backend;
pub mod checks;
pub mod config;
pub mod io_check;
pub mod k8s;
pub mod link_verdict;
pub mod profiles;
pub mod render;
pub mod telemetry;
pub mod topology;
pub mod verdict;
