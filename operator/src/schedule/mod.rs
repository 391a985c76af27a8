//! `GpuValidationSchedule`: runs on a cron schedule, and the admission of new nodes.
//!
//! [`plan`] is the pure decision (the time is a parameter), [`busy`] which pods keep a node's
//! GPUs busy for `idleOnly`, [`Clock`] (from [`crate::clock`]) the time it is given,
//! [`shell`] the controller that observes the schedules, their runs and the nodes, and applies
//! the plan and the admission plan (`crate::admission`).

pub mod busy;
pub mod plan;
pub mod shell;

pub use crate::clock::Clock;
