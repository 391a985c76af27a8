//! The administrator's settings, validated once at start ([`config`], [`allocation_config`]),
//! and the clock the schedule and admission controllers decide with ([`clock`]).

pub mod allocation_config;
pub mod clock;
pub mod config;
