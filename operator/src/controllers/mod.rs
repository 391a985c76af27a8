//! The controllers beside the validation controller ([`crate::wiring`]): the schedules
//! ([`schedule`]), the admission of new nodes that a schedule runs ([`admission`]), and the
//! Node state ([`node_state`]). Each observes, decides through [`crate::decide`] and writes
//! through [`crate::write`].

pub mod admission;
pub mod node_state;
pub mod schedule;
