//! The gpuval operator: watches `GpuValidation`s, fans agent pods out to the selected GPU
//! nodes, and aggregates the nodes' results into the validation's status.
//!
//! The decisions are pure functions ([`selection`], [`plan`], [`pod`]); [`controller`] is the
//! thin shell that reads the cluster and applies them.

pub mod config;
pub mod controller;
pub mod metrics;
pub mod plan;
pub mod pod;
pub mod selection;
