//! The [`Step`] of a check written against the [`GpuCheck`] or [`NodeCheck`] contract: a row
//! plans one of these unless its check needs more (the host check's counters, the io thread).

use gpuval_crds::{GpuReport, NodeReport};

use super::remeasure;
use super::row::{Pending, Step};
use crate::check::{GpuCheck, JudgeNode, NodeCheck, Stage};
use crate::judge::CheckResult;

/// A per-GPU check: measured on every GPU at once, judged into each GPU's report, compared
/// across the GPUs; measured again where a GPU fell short on performance alone.
pub struct EveryGpu<C, R> {
    pub check: C,
    /// Where its result sits in a GPU's report.
    pub slot: remeasure::Slot<R>,
    /// Whether it starts after a stop request (it sees the stop itself).
    pub starts_after_stop: bool,
}

impl<C, R> Step for EveryGpu<C, R>
where
    C: GpuCheck + Send,
    R: CheckResult + 'static,
{
    fn name(&self) -> &'static str {
        C::NAME
    }

    fn starts_after_stop(&self) -> bool {
        self.starts_after_stop
    }

    fn measure(&self, stage: &Stage<'_>) -> Pending<'_> {
        let measured = stage.on_every_gpu(&self.check);
        Box::new(move |on, report| self.judge(on, measured, &mut report.gpus))
    }

    fn remeasure(&self, stage: &Stage<'_>, on: &JudgeNode<'_>, report: &mut NodeReport) -> bool {
        if stage.stopped() || !remeasure::any_gpu_short(&mut report.gpus, self.slot) {
            return false;
        }
        let measured = stage.on_every_gpu(&self.check);
        let mut scratch = scratch_report(report, |g| *(self.slot)(g) = None);
        self.judge(on, measured, &mut scratch.gpus);
        super::apply_overrides(&mut scratch, &on.judge.overrides);
        remeasure::replace_gpu_results(&mut report.gpus, &mut scratch.gpus, self.slot, C::NAME);
        true
    }
}

impl<C: GpuCheck, R> EveryGpu<C, R> {
    /// Judges each GPU's measurement into its report (`gpus`, in the order of `on.gpus`), then
    /// the rules across the GPUs.
    fn judge(
        &self,
        on: &JudgeNode<'_>,
        mut measured: std::collections::HashMap<u32, crate::check::Measurement<C::Outcome>>,
        gpus: &mut [GpuReport],
    ) {
        for (g, r) in on.gpus.iter().zip(gpus.iter_mut()) {
            if let Some(m) = measured.remove(&g.index) {
                self.check.judge(&on.gpu(g), m, r);
            }
        }
        self.check.compare(on.judge, gpus);
    }
}

/// A check measured once for the node and judged into the node's report.
pub struct OnceForNode<C> {
    pub check: C,
    /// Its second measurement of what fell short on performance alone, if it has one.
    pub again: Option<Again<C>>,
}

/// A node-level check's second measurement: true when it measured again.
pub type Again<C> = fn(&C, &Stage<'_>, &JudgeNode<'_>, &mut NodeReport) -> bool;

impl<C> OnceForNode<C> {
    pub fn new(check: C) -> Self {
        Self { check, again: None }
    }
}

impl<C: NodeCheck + Send> Step for OnceForNode<C> {
    fn name(&self) -> &'static str {
        C::NAME
    }

    fn measure(&self, stage: &Stage<'_>) -> Pending<'_> {
        let measured = stage.on_node(&self.check);
        Box::new(move |on, report| self.check.judge(on, measured, report))
    }

    fn remeasure(&self, stage: &Stage<'_>, on: &JudgeNode<'_>, report: &mut NodeReport) -> bool {
        match self.again {
            Some(again) if !stage.stopped() => again(&self.check, stage, on, report),
            _ => false,
        }
    }
}

/// A copy of `report` to judge a second measurement into: its GPUs (each changed by `clear`)
/// and nothing else.
pub fn scratch_report(report: &NodeReport, clear: impl Fn(&mut GpuReport)) -> NodeReport {
    let mut gpus = report.gpus.clone();
    gpus.iter_mut().for_each(clear);
    NodeReport {
        gpus,
        ..Default::default()
    }
}
