//! The training check as one row.

use gpuval_crds::NodeReport;

use super::{Flags, Training, headline, section};
use crate::check::NodeCheck;
use crate::checks::Plan;
use crate::checks::row::{Row, Slot, Step};
use crate::checks::steps::OnceForNode;

pub struct TrainingRow;

impl Row for TrainingRow {
    fn name(&self) -> &'static str {
        Training::NAME
    }
    fn slot(&self) -> Slot {
        crate::node_slot!(training)
    }
    crate::settings_in!(training);
    crate::flags_of!(Flags, training);

    fn plan(&self, plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
        let spec = plan.checks.training.as_ref()?;
        Some(Box::new(OnceForNode::new(Training::from_spec(spec))))
    }
    fn section(&self, report: &NodeReport) -> String {
        section(report)
    }
    fn headline(&self, report: &NodeReport) -> Vec<String> {
        headline(report)
    }
}
