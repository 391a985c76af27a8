//! The gpuval operator: watches `GpuValidation`s, fans agent pods out to the selected GPU
//! nodes, and aggregates the nodes' results into the validation's status.
//!
//! Its folders are its layers, top first; a module imports only from its own layer or the
//! layers below it, and no modules tie a circle (`tests/tests/layers.rs` reads the table from
//! this tree and holds it):
//!
//! | layer | what it holds |
//! | --- | --- |
//! | [`wiring`] | starts every controller on shared watches; the validation controller's reconcile |
//! | [`controllers`] | the schedule, admission and node-state controllers |
//! | [`write`] | every write to the API server, and the ordered list a reconcile applies |
//! | [`read`] | what a reconcile observes from the caches and the API server |
//! | [`context`] | what every shell module stands on: the client, the stores, the errors |
//! | [`caches`] | what the operator keeps between reconciles: stores, pods, runs, wakes, the lease |
//! | [`decide`] | every pure decision: time and the world are parameters, nothing is written |
//! | [`settings`] | the administrator's settings and the clock |
//! | [`services`] | metrics, the heap, the write throttle, paged lists, the certificates' retry |

pub mod caches;
pub mod context;
pub mod controllers;
pub mod decide;
pub mod read;
pub mod services;
pub mod settings;
pub mod wiring;
pub mod write;
