//! Placeholder until the rendezvous, TCP and simulated-NCCL parts land.

use gpuval_crds::fabric::{FabricError, FabricErrorKind, FabricOutcome, FabricSpec};

use super::{Assignment, NcclGroup};

/// Runs this node's groups of one round in order.
pub async fn run_round(
    assignments: Vec<Assignment>,
    _spec: &FabricSpec,
    nccl: &dyn NcclGroup,
) -> Vec<FabricOutcome> {
    assignments
        .into_iter()
        .map(|a| FabricOutcome {
            round: a.round,
            group: a.group,
            error: Some(FabricError {
                kind: FabricErrorKind::Local,
                message: "the fabric test is not built yet".into(),
            }),
            simulated: nccl.simulated(),
            ..Default::default()
        })
        .collect()
}
