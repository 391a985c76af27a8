//! The shell's write side: carries out a reconcile [`Step`] against the API server, every write
//! of one reconcile in one ordered list (pods and the results bound to them, closed results,
//! the status through server-side apply, events, the results bound and checked, then the
//! certificates; a failed node's marks are [`crate::write::node_marks`]'s).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

use gpuval_crds::GpuValidation;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ResourceExt;

use crate::context::{Ctx, Error};
use crate::decide::reconcile::{Step, finished};
use crate::write::result_binding;
use crate::write::{events, fabric, pods, status};

/// Applies `step` for validation `gv`, in this order: deletes, creates, the fabric round,
/// closed results, the status (only when it changed), events; while the run is under way, its
/// pods' results bound and checked (`to_bind`: the nodes to look at, None for every node);
/// and last, once the terminal status is stored, the certificates
/// ([`crate::write::certificates::after_terminal`]), whose next try is returned. Events are best
/// effort: their failures are logged, not retried.
pub async fn apply(
    gv: &GpuValidation,
    ctx: &Ctx,
    step: &Step,
    to_bind: Option<&BTreeSet<String>>,
) -> Result<Option<Duration>, Error> {
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
        let lines = crate::services::metrics::final_verdicts(gv, &step.status);
        ctx.metrics.fleet.set_lines(&gv.name_any(), &lines);
    }
    // `spec.onFailure` is the node-state controller's (crate::write::node_marks): it marks a node
    // from its final line, tries again until the mark holds, and takes it back on a pass.
    events::publish(gv, ctx, &step.events).await;
    if !finished(gv) {
        bind_and_check(gv, ctx, to_bind).await?;
    }
    // Only now is the status stored: a run's certificates follow its terminal status.
    Ok(crate::write::certificates::after_terminal(gv, ctx, &step.status).await)
}

/// Gives back its result to each pod of the run whose result is missing or bound elsewhere
/// without a report (a pod created before a restart or a failed step, a result deleted or
/// tampered with), then checks the stored reports not yet checked: a result counts only once
/// the operator has read it and found it whole. A few reads at once (the write throttle still
/// bounds the rate), so that thousands of results are not read one round trip after another.
async fn bind_and_check(
    gv: &GpuValidation,
    ctx: &Ctx,
    to_bind: Option<&BTreeSet<String>>,
) -> Result<(), Error> {
    for (node, pod) in result_binding::unbound(gv, ctx, to_bind) {
        result_binding::bind(gv, ctx, &node, &pod).await?;
    }
    let unchecked = result_binding::unchecked(gv, ctx, to_bind);
    futures::stream::iter(unchecked)
        .map(|name| async move { result_binding::check(gv, ctx, &name).await })
        .buffer_unordered(result_binding::CHECKS_AT_ONCE)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}
