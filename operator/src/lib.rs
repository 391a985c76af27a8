//! The gpuval operator: watches `GpuValidation`s, fans agent pods out to the selected GPU
//! nodes, and aggregates the nodes' results into the validation's status.
//!
//! The decisions are pure functions ([`selection`], [`reconcile`] and its steps, [`pod`]);
//! [`controller`] is the thin shell that watches the cluster, [`observe`]s it, and [`apply`]s
//! the decisions through the writers of [`write`], all standing on [`context`]. Layers, top
//! first: the wiring, the controllers, the writers, the readers, the context, the caches, the
//! decisions, the settings, the services; the table is `OPERATOR` in `tests/tests/layers.rs`,
//! whose test fails on an import from a higher layer or a circle of modules.

pub mod admission;
pub mod allocation_config;
pub mod apply;
pub mod baselines;
pub mod certificate_retry;
pub mod certificate_store;
pub mod certificates;
pub mod clock;
pub mod config;
pub mod context;
pub mod controller;
pub mod device_taints;
pub mod dra_claim;
pub mod expected;
pub mod fabric_key;
pub mod failure_marks;
pub mod failure_record;
pub mod heap;
pub mod leader;
pub mod metrics;
pub mod node_evidence;
pub mod node_marks;
pub mod node_state;
pub mod observe;
pub mod paged;
pub mod pod;
pub mod pod_reading;
pub mod pod_views;
pub mod port_metrics;
pub mod reconcile;
pub mod result_binding;
pub mod result_figures;
pub mod runs;
pub mod schedule;
pub mod selection;
pub mod stores;
pub mod throttle;
pub mod wakes;
pub mod watch_backoff;
pub mod write;
