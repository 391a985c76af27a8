//! The shell's write side: carries out a reconcile [`Step`] against the API server (pods and
//! the results bound to them, closed results, the status through server-side apply, events; a
//! failed node's marks are [`crate::node_marks`]'s).

use gpuval_crds::GpuValidation;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ResourceExt;

use crate::context::{Ctx, Error};
use crate::reconcile::Step;
use crate::result_binding;
use crate::write::{events, fabric, pods, status};

/// Applies `step` for validation `gv`: deletes first, then creates, then writes the status
/// (only when it changed), then tells (events) and acts on failed nodes. Events and node
/// actions are best effort: their failures are logged, not retried. Certificates come after,
/// once the terminal status is stored ([`crate::certificate_store::after_terminal`]).
pub async fn apply(gv: &GpuValidation, ctx: &Ctx, step: &Step) -> Result<(), Error> {
    pods::delete_all::<Pod>(ctx, &step.delete_pods).await?;
    pods::delete_results(ctx, &step.delete_results).await?;
    pods::create_pods(gv, ctx, &step.create_pods).await?;
    if let Some(round) = &step.create_round {
        // A round too large for one object is written as parts, each under 64 KiB.
        for part in
            gpuval_crds::fabric_shard::shard(round, gpuval_crds::fabric_shard::MAX_PART_BYTES)
        {
            fabric::create_round(gv, ctx, &part).await?;
        }
    }
    // Before the status that makes their lines final: a late report never overrides a line.
    result_binding::close(gv, ctx, &step.close_results).await?;
    if gv.status.as_ref() != Some(&step.status) {
        status::write::<GpuValidation>(&gv.name_any(), ctx, &step.status).await?;
        ctx.metrics
            .count_new_verdicts(&step.new_verdicts, step.status.simulated == Some(true));
        let lines = crate::metrics::final_verdicts(gv, &step.status);
        ctx.metrics.fleet.set_lines(&gv.name_any(), &lines);
    }
    // `spec.onFailure` is the node-state controller's (crate::node_marks): it marks a node
    // from its final line, tries again until the mark holds, and takes it back on a pass.
    events::publish(gv, ctx, &step.events).await;
    Ok(())
}
