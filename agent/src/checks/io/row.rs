//! The io check as one row: real file I/O on the host (never the GPUs), on a thread beside the
//! compute burn when asked (`duringCompute`), else alone after the GPU checks.

use super::{Flags, Io, headline, section};
use crate::check::{GpuCheck, Stage};
use crate::checks::Plan;
use crate::checks::compute::Compute;
use crate::checks::row::{Pending, Row, Step, When};

pub const ROW: Row = Row {
    name: Io::NAME,
    settings: crate::settings_in!(io),
    slot: crate::node_slot!(io, host_only),
    plan,
    flags: crate::flags_of!(Flags, io),
    compare: None,
    column: None,
    section,
    headline,
};

fn plan(plan: &Plan, simulated: bool) -> Option<Box<dyn Step>> {
    let spec = plan.checks.io.as_ref()?;
    let beside_compute = plan.checks.compute.is_some() && spec.during_compute;
    let (dir, tuning) = (plan.io_dir.clone(), plan.io_tuning.clone());
    Some(Box::new(Io::new(
        spec,
        dir,
        tuning,
        beside_compute,
        simulated,
    )))
}

impl Step for Io {
    fn name(&self) -> &'static str {
        Io::NAME
    }
    fn when(&self) -> When {
        if self.context.during_compute {
            When::Beside(Compute::NAME)
        } else {
            When::InTurn
        }
    }
    fn loads_gpus(&self) -> bool {
        false
    }
    /// It sees the stop itself, and says what it finished.
    fn starts_after_stop(&self) -> bool {
        true
    }
    fn measure(&self, stage: &Stage<'_>) -> Pending<'_> {
        let planted = stage.backend.planted_disk_fault();
        let measured = Io::measure(self, stage.stop, stage.sink, planted);
        Box::new(move |_, report| report.io = Some(self.judge(measured, planted)))
    }
    fn lost(&self) -> Pending<'_> {
        Box::new(|_, report| report.io = Some(Io::panicked()))
    }
}
