//! What the shell reads for a decision: a validation's world from the caches ([`observe`]),
//! each node's latest figures for the metrics ([`result_figures`]), and a node's GPU baselines
//! from its certificates ([`baselines`]).

pub mod baselines;
pub mod observe;
pub mod result_figures;
