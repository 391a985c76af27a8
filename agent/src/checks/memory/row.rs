//! The memory check as one row.

use gpuval_crds::{GpuReport, NodeReport};

use super::{Flags, Memory, cell, headline, section};
use crate::check::GpuCheck;
use crate::checks::Plan;
use crate::checks::row::{Column, Row, Slot, Step};
use crate::checks::steps::EveryGpu;
use crate::judge::Judge;

pub struct MemoryRow;

impl Row for MemoryRow {
    fn name(&self) -> &'static str {
        Memory::NAME
    }
    fn slot(&self) -> Slot {
        crate::gpu_slot!(memory)
    }
    crate::settings_in!(memory);
    crate::flags_of!(Flags, memory);

    fn plan(&self, plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
        let spec = plan.checks.memory.as_ref()?;
        Some(Box::new(EveryGpu {
            check: Memory::from_spec(spec),
            slot: |g| &mut g.memory,
            // It sees the stop itself, between patterns.
            starts_after_stop: true,
        }))
    }
    fn compare(&self, judge: &Judge<'_>, gpus: &mut [GpuReport]) {
        Memory::from_spec(&Default::default()).compare(judge, gpus);
    }
    fn column(&self) -> Option<Column> {
        Some(("MEMORY", |g| g.memory.as_ref().map(cell)))
    }
    fn section(&self, report: &NodeReport) -> String {
        section(report)
    }
    fn headline(&self, report: &NodeReport) -> Vec<String> {
        headline(report)
    }
}
