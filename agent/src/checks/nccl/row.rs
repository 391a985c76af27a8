//! The NCCL check as one row. Any of its flags turns it on.

use super::args::NcclArgs;
use super::{Nccl, headline, section};
use crate::check::NodeCheck;
use crate::checks::Plan;
use crate::checks::row::{FlagSet, Row, Step, parsed};
use crate::checks::steps::OnceForNode;

pub const ROW: Row = Row {
    name: Nccl::NAME,
    settings: crate::settings_in!(nccl),
    slot: crate::node_slot!(nccl),
    plan,
    flags: Some(FlagSet {
        add: <NcclArgs as clap::Args>::augment_args,
        apply: |given, checks| {
            let flags: NcclArgs = parsed(given)?;
            checks.nccl = flags.apply(checks.nccl.take());
            Ok(())
        },
    }),
    compare: None,
    column: None,
    section,
    headline,
};

fn plan(plan: &Plan, _simulated: bool) -> Option<Box<dyn Step>> {
    let spec = plan.checks.nccl.as_ref()?;
    let log_dir = plan.nccl_log_dir.clone();
    Some(Box::new(OnceForNode::new(Nccl::from_spec(spec, log_dir))))
}
