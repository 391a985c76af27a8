//! The compute check as one row.

use super::{Compute, Flags, cell, headline, section};
use crate::check::GpuCheck;
use crate::checks::Plan;
use crate::checks::row::{Row, Step};
use crate::checks::steps::EveryGpu;

pub const ROW: Row = Row {
    name: Compute::NAME,
    settings: crate::settings_in!(compute),
    slot: crate::gpu_slot!(compute),
    plan,
    flags: crate::flags_of!(Flags, compute),
    compare: Some(|judge, gpus| Compute::from_spec(&Default::default()).compare(judge, gpus)),
    column: Some(("COMPUTE TFLOP/s", |g| g.compute.as_ref().map(cell))),
    section,
    headline,
};

fn plan(plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
    let spec = plan.checks.compute.as_ref()?;
    Some(Box::new(EveryGpu {
        check: Compute::from_spec(spec),
        slot: |g| &mut g.compute,
        starts_after_stop: false,
    }))
}
