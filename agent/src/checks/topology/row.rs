//! The topology check as one row: read before any check loads the GPUs, re-read by the
//! runner's sampler, judged last with what the re-reads found.

use gpuval_crds::NodeReport;

use super::{Topology, section};
use crate::check::{NodeCheck, Stage};
use crate::checks::Plan;
use crate::checks::row::{Pending, Row, Slot, Step, When};

pub struct TopologyRow;

impl Row for TopologyRow {
    fn name(&self) -> &'static str {
        Topology::NAME
    }
    fn slot(&self) -> Slot {
        crate::node_slot!(topology)
    }
    crate::settings_in!(topology);

    fn plan(&self, plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
        let spec = plan.checks.topology.as_ref()?;
        Some(Box::new(Topology::from_spec(spec)))
    }
    fn section(&self, report: &NodeReport) -> String {
        section(report)
    }
    fn headline(&self, _report: &NodeReport) -> Vec<String> {
        Vec::new()
    }
}

impl Step for Topology {
    fn name(&self) -> &'static str {
        Topology::NAME
    }
    fn when(&self) -> When {
        When::Sampled
    }
    /// One reading, judged alone (the runner reads it through [`Step::sampled_topology`]).
    fn measure(&self, stage: &Stage<'_>) -> Pending<'_> {
        let measured = stage.on_node(self);
        Box::new(move |on, report| self.judge(on, measured, report))
    }
    fn sampled_topology(&self) -> Option<&Topology> {
        Some(self)
    }
}
