//! The shell's writers: one module per kind of thing the operator writes for a run, each a few
//! API calls standing on [`crate::context`] and the pure builders (pods, claims, the fabric key
//! and rounds), and tested against a recorded API ([`recorded`]). [`crate::write::apply`] orders them
//! for one reconcile step; the schedule, node-state and certificate shells use them too.
//! The node's own marks are [`crate::write::node_marks`]'s and [`crate::controllers::node_state`]'s.

pub mod apply;
pub mod certificates;
pub mod claims;
pub mod device_taints;
pub mod events;
pub mod fabric;
pub mod node_marks;
pub mod pods;
pub mod result_binding;
pub mod status;

#[cfg(test)]
pub mod recorded;
#[cfg(test)]
mod tests;

use kube::api::PostParams;

use crate::context::FIELD_MANAGER;

/// A 404 is no error when deleting.
pub fn ignore_not_found(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    }
}

/// Create parameters under the operator's field manager.
pub fn create_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}
