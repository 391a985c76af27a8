//! What the operator keeps between reconciles: what it stores of each watched object
//! ([`stores`]), its agent pods as views ([`pod_views`]), its runs' records ([`runs`]), the one
//! Node and result watch that wakes every controller ([`wakes`]), the pause before a failed
//! watch ([`watch_backoff`]), and the Lease that makes one replica the writer ([`leader`]).

pub mod leader;
pub mod pod_views;
pub mod runs;
pub mod stores;
pub mod wakes;
pub mod watch_backoff;
