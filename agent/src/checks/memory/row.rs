//! The memory check as one row.

use super::{Flags, Memory, cell, headline, section};
use crate::check::GpuCheck;
use crate::checks::Plan;
use crate::checks::row::{Row, Step};
use crate::checks::steps::EveryGpu;

pub const ROW: Row = Row {
    name: Memory::NAME,
    settings: crate::settings_in!(memory),
    slot: crate::gpu_slot!(memory),
    plan,
    flags: crate::flags_of!(Flags, memory),
    compare: Some(|judge, gpus| Memory::from_spec(&Default::default()).compare(judge, gpus)),
    column: Some(("MEMORY", |g| g.memory.as_ref().map(cell))),
    section,
    headline,
};

fn plan(plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
    let spec = plan.checks.memory.as_ref()?;
    Some(Box::new(EveryGpu {
        check: Memory::from_spec(spec),
        slot: |g| &mut g.memory,
        // It sees the stop itself, between patterns.
        starts_after_stop: true,
    }))
}
