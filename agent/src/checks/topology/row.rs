//! The topology check as one row: read before any check loads the GPUs, re-read by the
//! runner's sampler, judged last with what the re-reads found.

use super::{Topology, section};
use crate::check::{NodeCheck, Stage};
use crate::checks::Plan;
use crate::checks::row::{Pending, Row, Step, When};

pub const ROW: Row = Row {
    name: Topology::NAME,
    settings: crate::settings_in!(topology),
    slot: crate::node_slot!(topology),
    plan,
    flags: None,
    compare: None,
    column: None,
    section,
    headline: |_| Vec::new(),
};

fn plan(plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
    let spec = plan.checks.topology.as_ref()?;
    Some(Box::new(Topology::from_spec(spec)))
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
