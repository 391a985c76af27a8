//! gpuval node agent: checks a node's GPUs through one [`backend::Backend`] (real: cudarc + NVML;
//! simulated: tests and demos only) and writes a [`gpuval_crds::NodeReport`].

pub mod backend;
