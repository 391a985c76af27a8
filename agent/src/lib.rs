//! gpuval node agent: checks a node's GPUs through one [`backend::Backend`] (real: cudarc + NVML;
//! simulated: tests and demos only) and writes a [`gpuval_crds::NodeReport`].

pub mod backend;
pub mod checks;
pub mod config;
pub mod profiles;
pub mod render;
pub mod telemetry;
pub mod topology;
pub mod verdict;
