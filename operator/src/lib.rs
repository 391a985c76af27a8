//! The gpuval operator: watches `GpuValidation`s, fans agent pods out to the selected GPU
//! nodes, and aggregates the nodes' results into the validation's status.
//!
//! The decisions are pure functions ([`selection`], [`reconcile`] and its steps, [`pod`]);
//! [`controller`] is the thin shell that watches the cluster, [`observe`]s it, and [`apply`]s
//! the decisions.

pub mod admission;
pub mod apply;
pub mod certificate_retry;
pub mod certificate_store;
pub mod certificates;
pub mod config;
pub mod controller;
pub mod device_taints;
pub mod dra_claim;
pub mod expected;
pub mod fabric_key;
pub mod failure_marks;
pub mod heap;
pub mod leader;
pub mod metrics;
pub mod node_marks;
pub mod node_state;
pub mod observe;
pub mod paged;
pub mod pod;
pub mod pod_views;
pub mod port_metrics;
pub mod reconcile;
pub mod result_binding;
pub mod result_figures;
pub mod runs;
pub mod schedule;
pub mod selection;
pub mod throttle;
pub mod wakes;
pub mod watch_backoff;
