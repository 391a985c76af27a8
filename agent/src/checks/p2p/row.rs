//! The peer-to-peer check as one row, measured again where it fell short on performance alone.

use gpuval_crds::NodeReport;

use super::{Flags, P2p, headline, section};
use crate::check::{JudgeNode, NodeCheck, Stage};
use crate::checks::Plan;
use crate::checks::row::{Row, Step};
use crate::checks::steps::{OnceForNode, scratch_report};
use crate::checks::{apply_overrides, remeasure};

pub const ROW: Row = Row {
    name: P2p::NAME,
    settings: crate::settings_in!(p2p),
    slot: crate::node_slot!(p2p),
    plan,
    flags: crate::flags_of!(Flags, p2p),
    compare: None,
    column: None,
    section,
    headline,
};

fn plan(plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
    let spec = plan.checks.p2p.as_ref()?;
    Some(Box::new(OnceForNode {
        check: P2p::from_spec(spec, plan.p2p_seed),
        again: Some(again),
    }))
}

/// The second measurement, when the node's result fell short on performance alone.
fn again(p: &P2p, stage: &Stage<'_>, on: &JudgeNode<'_>, report: &mut NodeReport) -> bool {
    let short = report
        .p2p
        .as_ref()
        .is_some_and(remeasure::short_on_performance_only);
    if !short {
        return false;
    }
    let mut scratch = scratch_report(report, |_| {});
    p.judge(on, stage.on_node(p), &mut scratch);
    apply_overrides(&mut scratch, &on.judge.overrides);
    remeasure::replace_node_result(&mut report.p2p, scratch.p2p, P2p::NAME);
    true
}
