//! What every layer may use: the metrics ([`metrics`], [`port_metrics`]), the heap count
//! ([`heap`]), the client-side write throttle ([`throttle`]), lists read in pages ([`paged`]),
//! and when a run's certificates are tried ([`certificate_retry`]).

pub mod certificate_retry;
pub mod heap;
pub mod metrics;
pub mod paged;
pub mod port_metrics;
pub mod throttle;
