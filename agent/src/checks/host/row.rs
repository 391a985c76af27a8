//! The host transfer check as one row: its PCIe counters read before the first check loads the
//! GPUs (so that their window covers the checks before it), measured again where a GPU fell
//! short on performance alone.

use gpuval_crds::NodeReport;

use super::{Baseline, Flags, Host, headline, section};
use crate::check::{JudgeNode, NodeCheck, Stage};
use crate::checks::Plan;
use crate::checks::row::{Pending, Row, Step};
use crate::checks::steps::scratch_report;
use crate::checks::{apply_overrides, remeasure};

pub const ROW: Row = Row {
    name: Host::NAME,
    settings: crate::settings_in!(host_transfer),
    slot: crate::gpu_slot!(host_transfer),
    plan,
    flags: crate::flags_of!(Flags, host_transfer),
    compare: None,
    column: None,
    section,
    headline,
};

fn plan(plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
    let spec = plan.checks.host_transfer.as_ref()?;
    Some(Box::new(HostStep {
        check: Host::from_spec(spec),
        baseline: None,
    }))
}

/// The check, and its counters' readings before the first check.
struct HostStep {
    check: Host,
    baseline: Option<Baseline>,
}

impl Step for HostStep {
    fn name(&self) -> &'static str {
        Host::NAME
    }

    fn prepare(&mut self, stage: &Stage<'_>) {
        self.baseline = Some(Host::read_baseline(stage.backend, stage.gpus));
    }

    fn measure(&self, stage: &Stage<'_>) -> Pending<'_> {
        let h = self
            .check
            .with_baseline(self.baseline.clone().unwrap_or_default());
        let measured = stage.on_node(&h);
        Box::new(move |on, report| h.judge(on, measured, report))
    }

    fn remeasure(&self, stage: &Stage<'_>, on: &JudgeNode<'_>, report: &mut NodeReport) -> bool {
        let slot: remeasure::Slot<_> = |g| &mut g.host_transfer;
        if stage.stopped() || !remeasure::any_gpu_short(&mut report.gpus, slot) {
            return false;
        }
        // The second measurement's counters' window is its own (read at its start).
        let h = &self.check;
        let mut scratch = scratch_report(report, |g| g.host_transfer = None);
        h.judge(on, stage.on_node(h), &mut scratch);
        apply_overrides(&mut scratch, &on.judge.overrides);
        remeasure::replace_gpu_results(&mut report.gpus, &mut scratch.gpus, slot, Host::NAME);
        true
    }
}
