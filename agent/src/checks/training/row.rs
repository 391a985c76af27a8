//! The training check as one row.

use super::{Flags, Training, headline, section};
use crate::check::NodeCheck;
use crate::checks::Plan;
use crate::checks::row::{Row, Step};
use crate::checks::steps::OnceForNode;

pub const ROW: Row = Row {
    name: Training::NAME,
    settings: crate::settings_in!(training),
    slot: crate::node_slot!(training),
    plan,
    flags: crate::flags_of!(Flags, training),
    compare: None,
    column: None,
    section,
    headline,
};

fn plan(plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
    let spec = plan.checks.training.as_ref()?;
    Some(Box::new(OnceForNode::new(Training::from_spec(spec))))
}
