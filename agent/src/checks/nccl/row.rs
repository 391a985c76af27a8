//! The NCCL check as one row. Any of its flags turns it on.

use gpuval_crds::{Checks, NodeReport};

use super::args::NcclArgs;
use super::{Nccl, headline, section};
use crate::check::NodeCheck;
use crate::checks::Plan;
use crate::checks::row::{Row, Slot, Step, parsed};
use crate::checks::steps::OnceForNode;

pub struct NcclRow;

impl Row for NcclRow {
    fn name(&self) -> &'static str {
        Nccl::NAME
    }
    fn slot(&self) -> Slot {
        crate::node_slot!(nccl)
    }
    crate::settings_in!(nccl);

    fn plan(&self, plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
        let spec = plan.checks.nccl.as_ref()?;
        let log_dir = plan.nccl_log_dir.clone();
        Some(Box::new(OnceForNode::new(Nccl::from_spec(spec, log_dir))))
    }
    fn flags(&self, cmd: clap::Command) -> clap::Command {
        <NcclArgs as clap::Args>::augment_args(cmd)
    }
    fn apply_flags(&self, given: &clap::ArgMatches, checks: &mut Checks) -> Result<(), String> {
        let flags: NcclArgs = parsed(given)?;
        checks.nccl = flags.apply(checks.nccl.take());
        Ok(())
    }
    fn section(&self, report: &NodeReport) -> String {
        section(report)
    }
    fn headline(&self, report: &NodeReport) -> Vec<String> {
        headline(report)
    }
}
