//! The compute check as one row.

use gpuval_crds::{GpuReport, NodeReport};

use super::{Compute, Flags, cell, headline, section};
use crate::check::GpuCheck;
use crate::checks::Plan;
use crate::checks::row::{Column, Row, Slot, Step};
use crate::checks::steps::EveryGpu;
use crate::judge::Judge;

pub struct ComputeRow;

impl Row for ComputeRow {
    fn name(&self) -> &'static str {
        Compute::NAME
    }
    fn slot(&self) -> Slot {
        crate::gpu_slot!(compute)
    }
    crate::settings_in!(compute);
    crate::flags_of!(Flags, compute);

    fn plan(&self, plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
        let spec = plan.checks.compute.as_ref()?;
        Some(Box::new(EveryGpu {
            check: Compute::from_spec(spec),
            slot: |g| &mut g.compute,
            starts_after_stop: false,
        }))
    }
    fn compare(&self, judge: &Judge<'_>, gpus: &mut [GpuReport]) {
        Compute::from_spec(&Default::default()).compare(judge, gpus);
    }
    fn column(&self) -> Option<Column> {
        Some(("COMPUTE TFLOP/s", |g| g.compute.as_ref().map(cell)))
    }
    fn section(&self, report: &NodeReport) -> String {
        section(report)
    }
    fn headline(&self, report: &NodeReport) -> Vec<String> {
        headline(report)
    }
}
