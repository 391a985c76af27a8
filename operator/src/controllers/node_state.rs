//! Node state where schedulers and people look: the Node condition `GpuValidated` (its message
//! with the first failures, their codes and the recommended action) and the labels
//! `gpuval.io/verdict` (`Pass`, `Fail`), `gpuval.io/validated-at` (seconds since 1970, so that
//! node affinity can ask for a recent pass with `Gt`) and, when there is something to do,
//! `gpuval.io/action` (`Rerun`, `ResetGpu`, `RebootNode`, `ReplaceHardware`).
//!
//! Decided in [`crate::decide::node_state`]: [`lines_of`] and [`newest`] pick a node's newest
//! verdict from each validation's final line for it ([`gpuval_crds::final_line`]: the node's
//! own checks and the fabric test together, the one input every consumer reads); [`desired`]
//! turns it into labels and the condition. Here, the controller over Nodes, woken by results and validations, writes both with server-side
//! apply under the operator's field manager (the condition through the status subresource).
//! A node's state is a record ([`crate::decide::failure_record`]): it changes only on news, a hardware
//! verdict newer than the one the record was judged on, so the labels and the condition stay
//! through a run's deletion, pruning or re-run, and a failure stands until a pass covers it.
//!
//! Only hardware evidence changes a node ([`gpuval_crds::Evidence`]): a pass labels it Pass
//! and sets `GpuValidated=True`, a failure on hardware evidence labels it Fail and sets
//! `GpuValidated=False`. A line of any other kind (a busy GPU, infrastructure trouble such as
//! an image that cannot be pulled or an evicted agent, the installation's configuration, a
//! simulated result or one without a report) never stands over a hardware verdict: the node
//! keeps what it had, and a node with no `GpuValidated` condition gets `Unknown` with the
//! reason and what to fix.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpuval_crds::result::result_name;
use gpuval_crds::{GpuNodeResult, GpuValidation, labels};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams, ResourceExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::context::{Ctx, Error, FIELD_MANAGER};
use crate::decide::node_state::{
    Incarnation, Mark, Policy, ResultMeta, Seen, apply_bodies, by_schedule, carried, condition_of,
    gone_or_replaced, lines_of, mark_for, marked, maybe_failed, newest, record_of, result_meta,
    retry_delay, runs_under_way, written_by_its_agent,
};

use crate::caches::wakes::NodeWake;
use crate::decide::failure_record::{Depth, Failure, Pass, Record};
use crate::decide::node_marks::Offences;
use tokio::sync::mpsc;

use crate::decide::node_evidence::Evidence;

/// Node `node`'s result of validation `validation` in the operator's result store, when its
/// own agent wrote it and it counts for that validation as it is now (bound to its uid, not
/// closed: [`gpuval_crds::binding::counts_for`]).
pub fn result_of(ctx: &Ctx, validation: &str, node: &str) -> Option<ResultMeta> {
    let key = ObjectRef::new(&result_name(validation, node)).within(&ctx.cfg.namespace);
    let r = ctx.results.get(&key)?;
    let run = ctx.validations.get(&ObjectRef::new(validation))?;
    let uid = run.metadata.uid.as_deref()?;
    (gpuval_crds::binding::counts_for(&r.metadata, uid)
        && written_by_its_agent(&r, validation, node))
    .then(|| result_meta(&r))
    .flatten()
    .filter(|m| m.node == node)
}

/// Writes `mark` on `node`: labels, then the condition, each by server-side apply (what `mark`
/// leaves out and the operator set before is removed). Each body names the node's UID: an
/// apply is a create where nothing exists, and the UID is what makes the API server refuse
/// that (409 for the labels, 404 for the status subresource, 422 on `metadata.uid` for a node
/// created again), so a node deleted after it was read is never brought back as a bare Node,
/// and a node created again under its name is not given its predecessor's marks.
async fn write(ctx: &Ctx, node: &Node, mark: &Mark) -> Result<(), kube::Error> {
    let name = node.name_any();
    let api: Api<Node> = Api::all(ctx.client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let (meta, status) = apply_bodies(node, mark);
    ctx.throttle.acquire().await;
    api.patch(&name, &pp, &Patch::Apply(&meta)).await?;
    ctx.throttle.acquire().await;
    api.patch_status(&name, &pp, &Patch::Apply(&status)).await?;
    Ok(())
}

/// What a node-state reconcile reads: the operator's context (its Node and result stores, see
/// [`crate::caches::wakes`]) and this controller's own store of validations (each store filled before
/// the trigger it causes is delivered).
pub struct NodeStateCtx {
    ctx: Arc<Ctx>,
    validations: Store<GpuValidation>,
    /// The served `DeviceTaintRule` resource, when the operator uses DRA and the API server
    /// serves it ([`crate::write::device_taints`]).
    device_taints: Option<kube::discovery::ApiResource>,
    /// Each node's failed reconciles in a row (the backoff of its writes).
    retries: Retries,
    /// The verdict record last written on each node (the Node cache may not show it yet).
    records: Written,
}

/// The verdict record this operator last wrote on each node (by its UID): a reconcile that reads the node
/// from a cache that does not show it yet judges on the newer of the two, so that no verdict
/// is judged twice against a record that missed it.
#[derive(Debug, Default)]
pub struct Written(std::sync::Mutex<HashMap<String, Record>>);

impl Written {
    /// The newer of `cached` (the node's annotation as the cache shows it) and the record last
    /// written on the node known as `name` (its UID).
    fn newest(&self, name: &str, cached: Record) -> Record {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match map.get(name) {
            Some(written) => cached.newer(written.clone()),
            None => cached,
        }
    }

    /// Notes that `record` was written on the node known as `name` (its UID).
    fn wrote(&self, name: &str, record: Record) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.insert(name.to_string(), record);
    }
}

async fn reconcile(node: Arc<Node>, nc: Arc<NodeStateCtx>) -> Result<Action, Error> {
    let ctx = &nc.ctx;
    let name = node.name_any();
    let quiet_after = ctx.cfg.unknown_after_non_evidence;
    // A validation has at most one result a node, named for both: look each up (the cost is
    // the number of validations, not of results).
    let validations = nc.validations.state();
    let results: Vec<Option<ResultMeta>> = validations
        .iter()
        .map(|v| result_of(ctx, &v.name_any(), &name))
        .collect();
    let runs: Vec<(&GpuValidation, Option<&ResultMeta>)> = validations
        .iter()
        .map(|v| &**v)
        .zip(results.iter().map(Option::as_ref))
        .collect();
    let lines = lines_of(&name, &runs, Policy::of(&ctx.cfg), &Incarnation::of(&node));
    let now = ctx.cfg.clock.now();
    let offences = offences_of(ctx, &name, &lines, now).await?;
    // The node changes only on news: a hardware verdict newer than the one its record was
    // judged on. A run deleted, pruned, edited or running again is none.
    // Known by the Node object: a node created again under its name starts with no record.
    let incarnation = node.metadata.uid.clone().unwrap_or_else(|| name.clone());
    let mut record = nc.records.newest(&incarnation, record_of(&node));
    let judged_before = record.clone();
    let news = newest(&lines)
        .filter(Evidence::is_hardware)
        .filter(|e| record.is_news(e, carried(condition_of(&node))));
    let shown = match &news {
        Some(e) => judge(ctx, &runs, &name, e, &mut record).await?,
        None => None,
    };
    note_quiet(ctx, &name, &mut record, &lines);
    let seen = Seen {
        shown: shown.as_ref(),
        record: &record,
        lines: &lines,
        offences: offences.as_ref(),
        quiet_after,
        under_way: &runs_under_way(&runs, &name),
    };
    let step = NodeStep {
        mark: mark_for(&node, &seen),
        shown,
        record: (record != judged_before).then_some(record),
    };
    if !apply(&nc, &node, &incarnation, step, offences.as_ref()).await? {
        // Nothing more for the node that was read: no failure marks (written by name) and no
        // device taints for it; the new node, if any, is looked at when it is seen.
        return Ok(Action::await_change());
    }
    nc.retries.succeeded(&name);
    Ok(match offences.and_then(|o| o.expires_in(now)) {
        // Looked at again when the oldest counted failure leaves the window.
        Some(left) => Action::requeue(left + Duration::from_secs(1)),
        None => Action::await_change(),
    })
}

/// What one reconcile of a node writes, decided before any of it is written.
struct NodeStep {
    /// The labels and condition to write, when they differ from what the node carries.
    mark: Option<Mark>,
    /// The hardware news the node now shows, if any: its failure marks and device taints follow.
    shown: Option<Evidence>,
    /// The node's verdict record, when this reconcile changed it.
    record: Option<Record>,
}

/// Writes `step` on `node`, in this order: the labels and condition (with the RepeatOffender
/// event), the failure marks and device taints `step.shown` asks for (with the return-to-service
/// events), then the verdict record. False, with nothing more written, when the node is gone
/// or was created again since it was read.
async fn apply(
    nc: &NodeStateCtx,
    node: &Node,
    incarnation: &str,
    step: NodeStep,
    offences: Option<&Offences>,
) -> Result<bool, Error> {
    let ctx = &nc.ctx;
    if let Some(want) = &step.mark
        && !write_mark(ctx, node, want, step.shown.as_ref(), offences).await?
    {
        return Ok(false);
    }
    follow_marks(nc, node, step.shown.as_ref()).await?;
    if let Some(record) = step.record {
        write_record(ctx, node, &record).await?;
        nc.records.wrote(incarnation, record);
    }
    Ok(true)
}

/// Writes `want` on `node` (and the RepeatOffender event when it newly marks one); false when
/// the node is gone or was created again since it was read.
async fn write_mark(
    ctx: &Ctx,
    node: &Node,
    want: &Mark,
    shown: Option<&Evidence>,
    offences: Option<&Offences>,
) -> Result<bool, Error> {
    let name = node.name_any();
    tracing::info!(
        node = %name,
        verdict = ?want.labels.get(labels::NODE_VERDICT),
        category = ?shown.map(|e| e.category),
        repeat_offender = want.labels.contains_key(labels::REPEAT_OFFENDER),
        "node state"
    );
    match write(ctx, node, want).await {
        Err(kube::Error::Api(s)) if gone_or_replaced(&s) => {
            tracing::info!(node = %name, code = s.code, "node gone or created again since it was read; not marked");
            return Ok(false);
        }
        other => other?,
    }
    if want.labels.contains_key(labels::REPEAT_OFFENDER)
        && !node.labels().contains_key(labels::REPEAT_OFFENDER)
    {
        let note = offences.map(Offences::words).unwrap_or_default();
        node_event(ctx, node, "RepeatOffender", true, note).await;
    }
    Ok(true)
}

/// Tells the metrics when `node`'s record says its last hardware verdict was reached (the
/// staleness metric counts from it where the newest result is no hardware evidence).
fn note_evidence(ctx: &Ctx, node: &str, record: &Record) {
    let at = record
        .judged
        .as_ref()
        .and_then(|j| j.at.parse::<Timestamp>().ok());
    if let Some(at) = at {
        ctx.metrics
            .fleet
            .note_evidence(node, at.as_millisecond() as f64 / 1000.0);
    }
}

/// Counts `node`'s final lines without hardware evidence into `record` ([`Record::note_quiet`]),
/// and tells the metrics when its last hardware evidence was reached.
fn note_quiet(ctx: &Ctx, node: &str, record: &mut Record, lines: &[Evidence]) {
    note_evidence(ctx, node, record);
    if record.note_quiet(lines)
        && let Some(q) = record.quiet.as_ref()
    {
        tracing::info!(node, lines = q.lines, run = %q.run, category = %q.category, "a final line without hardware evidence");
    }
}

/// The failure marks and device taints `shown` (the hardware news the node's state now shows;
/// None: none) asks for, and the events of a return to service, which name the run that
/// proved it.
async fn follow_marks(
    nc: &NodeStateCtx,
    node: &Node,
    shown: Option<&Evidence>,
) -> Result<(), Error> {
    let ctx = &nc.ctx;
    let name = node.name_any();
    let wanted = crate::decide::node_marks::wanted(shown);
    let removed = crate::write::node_marks::write(ctx, &name, &wanted).await?;
    if let (Some(e), false) = (shown, removed.is_empty()) {
        let note = format!(
            "passed GpuValidation {} on hardware evidence: returned to service, removed {}",
            e.validation,
            removed.join(", ")
        );
        node_event(ctx, node, "ReturnedToService", false, note).await;
    }
    if let (Some(rule), Some(e)) = (&nc.device_taints, shown) {
        let gpus = crate::write::device_taints::sync_node(ctx, rule, &name, Some(e)).await?;
        if e.passed && !gpus.is_empty() {
            let note = format!(
                "GPUs passed GpuValidation {} on hardware evidence: returned to service, removed DeviceTaintRules {}",
                e.validation,
                gpus.join(", ")
            );
            node_event(ctx, node, "GpuReturnedToService", false, note).await;
        }
    }
    Ok(())
}

/// True while a node that run `gv` failed on hardware evidence (a listed line: passes need no
/// keeping) has not taken that failure into its record ([`Record::took_in`], read from the
/// node cache): deleting the run then could lose the failure.
pub fn failure_unrecorded(ctx: &Ctx, gv: &GpuValidation) -> bool {
    let Some(status) = gv.status.as_ref() else {
        return false;
    };
    let run = gv.name_any();
    let policy = Policy::of(&ctx.cfg);
    // Read only where the list is full: the cache holds every run's results.
    let of_run = || {
        ctx.results
            .state()
            .iter()
            .filter_map(|r| result_meta(r))
            .filter(|m| m.validation == run)
            .map(|m| m.node)
            .collect()
    };
    maybe_failed(status, of_run).iter().any(|name| {
        // A node gone has nothing to record.
        let Some(node) = ctx.nodes.get(&ObjectRef::new(name)) else {
            return false;
        };
        let result = result_of(ctx, &run, name);
        let record = record_of(&node);
        let carried = carried(condition_of(&node));
        lines_of(
            name,
            &[(gv, result.as_ref())],
            policy,
            &Incarnation::of(&node),
        )
        .iter()
        .filter(|e| e.is_hardware() && !e.passed)
        .any(|e| !record.took_in(e, carried))
    })
}

/// Judges hardware news `e` about `node` into `record`: a failure is recorded (with its run's
/// depth and the GPUs its report failed) and shown; a pass takes away the failures it covers
/// ([`crate::decide::failure_record::covers`]) and is shown only when none stands. Returns what the
/// node's state shows (None: it keeps what it has).
async fn judge(
    ctx: &Ctx,
    runs: &[(&GpuValidation, Option<&ResultMeta>)],
    node: &str,
    e: &Evidence,
    record: &mut Record,
) -> Result<Option<Evidence>, kube::Error> {
    let run = runs
        .iter()
        .map(|(r, _)| *r)
        .find(|r| r.name_any() == e.validation);
    record.judge(e);
    let Some(run) = run else {
        return Ok(Some(e.clone()));
    };
    let report = match (e.passed, record.failures.is_empty()) {
        (true, true) => None,
        _ => report_of(ctx, &e.validation, node).await?,
    };
    let uid = run.metadata.uid.clone().unwrap_or_default();
    // The spec that ran: a spec edited since the line was reached is not what it measured, so
    // a pass then covers nothing (a failure then takes the spec as it is: a limit, documented).
    let edited = run.metadata.generation != run.status.as_ref().and_then(|s| s.observed_generation);
    let depth = match (edited, e.passed) {
        (true, true) => Depth::default(),
        _ => Depth::of(run),
    };
    if !e.passed {
        let gpus = report
            .map(|r| crate::decide::reconcile::device_taints::failed_gpus(&r))
            .unwrap_or_default();
        record.fail(Failure {
            run: e.validation.clone(),
            validation_uid: uid,
            schedule: run.labels().get(labels::SCHEDULE).cloned(),
            depth,
            gpus: gpus.into_iter().map(|g| g.uuid).collect(),
            codes: e.codes.clone(),
            at: e.at.to_string(),
            generation: Some(e.generation),
            on_failure: e.on_failure,
        });
        if by_schedule(run) {
            record.admit(e, false);
        }
        return Ok(Some(e.clone()));
    }
    let gpus: BTreeSet<String> = report
        .iter()
        .flat_map(|r| r.gpus.iter().map(|g| g.uuid.clone()))
        .collect();
    let pass = Pass {
        validation_uid: &uid,
        by_schedule: by_schedule(run),
        depth: &depth,
        gpus: &gpus,
        at: e.at,
    };
    let (cleared, stand) = record.pass(&pass);
    if pass.by_schedule {
        record.admit(e, record.failures.is_empty());
    }
    for f in &cleared {
        tracing::info!(node, run = %e.validation, failed_run = %f.run, "a pass that covers the failure clears it");
    }
    for (failed_run, why) in &stand {
        tracing::info!(node, run = %e.validation, failed_run = %failed_run, reason = %why, "the failure stands: the pass does not cover it");
    }
    Ok(record.failures.is_empty().then(|| e.clone()))
}

/// The report of `node`'s result of `validation`, if it has one.
async fn report_of(
    ctx: &Ctx,
    validation: &str,
    node: &str,
) -> Result<Option<gpuval_crds::NodeReport>, kube::Error> {
    let api: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    ctx.throttle.acquire().await;
    Ok(api
        .get_opt(&result_name(validation, node))
        .await?
        .and_then(|r| r.status))
}

/// Writes `record` on `node` (a merge patch of its annotation, bound to the node's UID).
async fn write_record(ctx: &Ctx, node: &Node, record: &Record) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({"metadata": {
        "uid": node.metadata.uid,
        "annotations": {crate::decide::failure_record::ANNOTATION: record.annotation()},
    }});
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    ctx.throttle.acquire().await;
    match api
        .patch(&node.name_any(), &pp, &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) if gone_or_replaced(&s) => Ok(()),
        other => other.map(drop),
    }
}

/// The node's repeated hardware failures within the administrator's window (None: fewer than
/// two, or the count is off). The GPUs each run failed come from its result's report, read
/// only when two runs or more failed.
async fn offences_of(
    ctx: &Ctx,
    node: &str,
    lines: &[Evidence],
    now: Timestamp,
) -> Result<Option<Offences>, kube::Error> {
    let window = ctx.cfg.repeat_failure_window;
    let Some(found) =
        crate::decide::node_marks::repeat_offences(lines, window, now, |_| Vec::new())
    else {
        return Ok(None);
    };
    let api: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let mut gpus: HashMap<String, Vec<String>> = HashMap::new();
    for (run, _) in &found.runs {
        ctx.throttle.acquire().await;
        let report = api
            .get_opt(&result_name(run, node))
            .await?
            .and_then(|r| r.status);
        let failed = report
            .map(|r| crate::decide::reconcile::device_taints::failed_gpus(&r))
            .unwrap_or_default();
        gpus.insert(run.clone(), failed.into_iter().map(|g| g.uuid).collect());
    }
    Ok(crate::decide::node_marks::repeat_offences(
        lines,
        window,
        now,
        |e| gpus.get(&e.validation).cloned().unwrap_or_default(),
    ))
}

/// Publishes an event about `node` (logged when it cannot be).
async fn node_event(ctx: &Ctx, node: &Node, reason: &'static str, warning: bool, note: String) {
    let planned = crate::decide::reconcile::PlannedEvent::new(warning, reason, note);
    crate::write::events::publish(node, ctx, &[planned]).await;
}

fn error_policy(node: Arc<Node>, err: &Error, nc: Arc<NodeStateCtx>) -> Action {
    let name = node.name_any();
    let delay = nc.retries.failed(&name);
    tracing::warn!(node = %name, error = %err, retry_in_ms = delay.as_millis() as u64, "could not write node state; retrying");
    Action::requeue(delay)
}

/// Each node's failed attempts in a row: the next try waits twice as long, from 500 ms up to
/// [`MAX_RETRY`], with up to a fifth added by the node's name (so that nodes that failed
/// together do not try again together).
#[derive(Debug, Default)]
pub struct Retries(std::sync::Mutex<HashMap<String, u32>>);

impl Retries {
    /// Counts a failure of node `name`'s reconcile; the wait before the next.
    pub fn failed(&self, name: &str) -> Duration {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = map.entry(name.to_string()).or_default();
        *n = n.saturating_add(1);
        retry_delay(name, *n)
    }

    /// Forgets node `name`'s failures.
    pub fn succeeded(&self, name: &str) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(name);
    }
}

/// Runs the node-state controller until the task is dropped, woken by `wakes` (from the
/// validation controller's Node and result watches) and by its own watch of validations. It
/// starts once the operator's stores are filled (`filled`; see
/// `wiring::mark_ready_when_filled`): the wakes sent before wait in their channel, and each
/// node is then looked at once.
pub async fn run(
    ctx: Arc<Ctx>,
    wakes: mpsc::UnboundedReceiver<NodeWake>,
    filled: tokio::sync::oneshot::Receiver<()>,
) {
    if filled.await.is_err() {
        return;
    }
    let (validations, validation_writer) = reflector::store();
    let validation_events = watcher(
        Api::<GpuValidation>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .backoff(crate::caches::watch_backoff::watch_backoff())
    .reflect(validation_writer)
    .touched_objects();
    let nodes = ctx.nodes.clone();
    let mut marks = Marks::default();
    let woken = crate::caches::wakes::node_wakes(wakes).filter_map(move |w| {
        let node = match w {
            NodeWake::Result(node) => Some(node),
            NodeWake::Node(node) => marks.changed(&nodes, &node).then_some(node),
        };
        futures::future::ready(node.map(|n| ObjectRef::new(&n)))
    });
    let device_taints = match ctx.cfg.allocation.reads_slices() {
        true => crate::write::device_taints::discover(&ctx.client).await,
        false => None,
    };
    let nc = Arc::new(NodeStateCtx {
        ctx,
        validations,
        device_taints,
        retries: Retries::default(),
        records: Written::default(),
    });
    let results = nc.ctx.results.clone();
    Controller::for_stream(futures::stream::pending(), nc.ctx.nodes.clone())
        .reconcile_on(woken)
        .watches_stream(validation_events, move |v: GpuValidation| {
            nodes_of_run(&v, &results)
        })
        .run(reconcile, error_policy, nc)
        .for_each(|_| async {})
        .await;
}

/// The nodes a change of validation `v` may give a final line: those its status lists and
/// those with a result of it (a node that passed is only counted in the status, and its line
/// becomes final when the status stops listing it or the fabric test ends).
fn nodes_of_run(
    v: &GpuValidation,
    results: &Store<PartialObjectMeta<GpuNodeResult>>,
) -> Vec<ObjectRef<Node>> {
    let name = v.name_any();
    let label = labels::node_value(&name);
    let listed = v
        .status
        .iter()
        .flat_map(|s| s.nodes.iter().map(|n| n.name.clone()));
    let with_result = results.state().into_iter().filter_map(|r| {
        let m = result_meta(&r)?;
        (m.validation == label).then_some(m.node)
    });
    let mut nodes: Vec<String> = listed.chain(with_result).collect();
    nodes.sort();
    nodes.dedup();
    nodes.iter().map(|n| ObjectRef::new(n)).collect()
}

/// The hash of each node's marks as last seen: a node's other changes (kubelet heartbeats,
/// other labels) do not wake this controller.
#[derive(Debug, Default)]
struct Marks(HashMap<String, u64>);

impl Marks {
    /// True when node `name`'s marks in `nodes` differ from the last seen (or were never seen);
    /// a node gone from the store is forgotten.
    fn changed(&mut self, nodes: &Store<Node>, name: &str) -> bool {
        match nodes.get(&ObjectRef::new(name)) {
            Some(node) => {
                let mark = marked(&node);
                self.0.insert(name.to_string(), mark) != Some(mark)
            }
            None => {
                self.0.remove(name);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::node_state::*;
    use gpuval_crds::Action as Remedy;
    use gpuval_crds::Verdict;
    use k8s_openapi::api::core::v1::NodeCondition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::collections::BTreeMap;

    /// Whatever node state writes on a node, the operator's Node cache shows back: a mark that
    /// read back otherwise would differ from the mark wanted on every wake, and the node would be
    /// written again each time (both conditions and the labels, twice a wake at 2,000 nodes).
    #[test]
    fn a_mark_written_reads_back_from_the_node_cache_as_written() {
        let condition = |type_: &str, status: &str, reason: &str| NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(format!("{type_} {reason}")),
            last_transition_time: Some(Time(ts("2026-12-08T01:00:00Z"))),
            last_heartbeat_time: Some(Time(ts("2026-12-08T01:00:00Z"))),
        };
        let mark = Mark {
            labels: OUR_LABELS
                .iter()
                .map(|k| (k.to_string(), "Pass".to_string()))
                .collect(),
            condition: Some(condition(labels::NODE_CONDITION, "True", "Passed")),
            admitted: Some(condition(
                labels::ADMITTED_CONDITION,
                "Unknown",
                NOT_ADMITTED,
            )),
        };
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-0", "uid": "u0", "labels": {"other": "x"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("a node");
        // The two bodies as the API server would merge them into the node.
        let (meta, status) = apply_bodies(&node, &mark);
        let written: BTreeMap<String, String> =
            serde_json::from_value(meta["metadata"]["labels"].clone()).expect("labels");
        node.metadata
            .labels
            .get_or_insert_with(Default::default)
            .extend(written);
        let conditions: Vec<NodeCondition> =
            serde_json::from_value(status["status"]["conditions"].clone()).expect("conditions");
        let s = node.status.get_or_insert_with(Default::default);
        s.conditions.get_or_insert_with(Vec::new).extend(conditions);
        crate::caches::stores::trim_node(&mut node);
        assert_eq!(current(&node), mark, "the node would be written again");
    }

    /// A full list may hide failures: the nodes with a result of the run are looked at too;
    /// a list with room names every failure, and passes are never kept for.
    #[test]
    fn a_full_list_of_lines_looks_past_itself_for_failures() {
        use gpuval_crds::{MAX_LISTED_NODES, NodeStatus, NodeVerdict};
        let mut status = gpuval_crds::GpuValidationStatus {
            nodes: (0..MAX_LISTED_NODES)
                .map(|i| NodeStatus {
                    name: format!("n{i:03}"),
                    verdict: NodeVerdict::Failed,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let with_results = ["n000", "n077"];
        let of_run = || with_results.map(String::from).to_vec();
        let names = maybe_failed(&status, of_run);
        assert!(names.contains("n077"), "beyond the list");
        assert_eq!(names.len(), MAX_LISTED_NODES + 1);
        status.nodes.truncate(3);
        status.nodes[0].verdict = NodeVerdict::Passed;
        status.nodes[2].verdict = NodeVerdict::Running;
        let names = maybe_failed(&status, of_run);
        assert_eq!(names, BTreeSet::from(["n001".to_string()]));
    }
    use gpuval_crds::{Evidence as Category, NodeStatus, NodeVerdict, Phase};

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// Result of validation `validation` on `node` (generation 1, with a report).
    fn result(node: &str, validation: &str, verdict: &str, at: &str) -> ResultMeta {
        let failed = verdict == "Fail";
        ResultMeta {
            name: format!("{validation}-{node}"),
            node: node.into(),
            validation: validation.into(),
            generation: 1,
            verdict: verdict.parse().unwrap_or(Verdict::Error),
            summary: if failed {
                "GPU5 memory: 3 mismatches".into()
            } else {
                String::new()
            },
            created: ts(at),
            action: if failed {
                Remedy::ReplaceHardware
            } else {
                Remedy::None
            },
            codes: if failed {
                "MemoryMismatch".into()
            } else {
                String::new()
            },
            simulated: false,
            reported: true,
            node_uid: None,
        }
    }

    /// Validation `name`'s run of generation 1, ended at `at`, listing `lines`.
    fn run(name: &str, at: &str, lines: Vec<NodeStatus>) -> GpuValidation {
        let mut gv: GpuValidation = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
            "metadata": {"name": name, "generation": 1}, "spec": {"checks": {"memory": {}}},
        }))
        .unwrap();
        gv.status = Some(gpuval_crds::GpuValidationStatus {
            observed_generation: Some(1),
            phase: Some(Phase::Failed),
            completion_time: Some(Time(ts(at))),
            nodes: lines,
            ..Default::default()
        });
        gv
    }

    /// A final line of `verdict` on `node` resting on `evidence`.
    fn line(node: &str, verdict: NodeVerdict, evidence: Category, message: &str) -> NodeStatus {
        NodeStatus {
            name: node.into(),
            verdict,
            message: Some(message.into()),
            evidence: Some(evidence),
            ..Default::default()
        }
    }

    /// The listed line of a failed result.
    fn failed_line(r: &ResultMeta) -> NodeStatus {
        NodeStatus {
            result: Some(r.name.clone()),
            codes: Some(r.codes.clone()),
            action: Some(r.action),
            ..line(&r.node, NodeVerdict::Failed, Category::Hardware, &r.summary)
        }
    }

    fn latest_of(node: &str, runs: &[(&GpuValidation, Option<&ResultMeta>)]) -> Option<Evidence> {
        latest(node, runs, Policy::default())
    }

    #[test]
    fn a_node_passes_only_once_its_final_line_says_so() {
        let pass = result("a", "v", "Pass", "2026-11-23T01:00:00Z");
        for verdict in gpuval_crds::Verdict::ALL {
            let mut r = pass.clone();
            r.verdict = verdict;
            let lines = match verdict.passes() {
                true => vec![],
                false => vec![failed_line(&r)],
            };
            let gv = run("v", "2026-11-23T02:00:00Z", lines);
            let e = latest_of("a", &[(&gv, Some(&r))]).expect("a verdict");
            assert_eq!(e.passed, verdict.passes(), "{verdict}");
        }
        // The run still lists the node as running: its result alone says nothing yet.
        let running = run(
            "v",
            "2026-11-23T02:00:00Z",
            vec![NodeStatus {
                name: "a".into(),
                verdict: NodeVerdict::Running,
                ..Default::default()
            }],
        );
        assert_eq!(latest_of("a", &[(&running, Some(&pass))]), None);
    }

    #[test]
    fn a_node_the_fabric_names_is_labelled_fail_though_its_result_passed() {
        let pass = result("a", "v", "Pass", "2026-11-23T01:00:00Z");
        let mut named = line(
            "a",
            NodeVerdict::Failed,
            Category::Hardware,
            "fabric: in round 2 the pair's bandwidth was below 350 GB/s",
        );
        named.result = Some(pass.name.clone());
        let gv = run("v", "2026-11-23T02:00:00Z", vec![named]);
        let e = latest_of("a", &[(&gv, Some(&pass))]).expect("a verdict");
        assert!(!e.passed);
        let mark = desired(Some(&e), None).expect("a mark");
        assert_eq!(mark.labels[labels::NODE_VERDICT], "Fail");
        let c = mark.condition.expect("a condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("Failed"))
        );
        assert!(may_act_on(&gv, "a", Some(&pass), Policy::default()));
    }

    #[test]
    fn a_result_without_a_report_never_makes_its_node_pass() {
        let mut r = result("a", "v", "Pass", "2026-11-23T01:00:00Z");
        r.reported = false;
        let gv = run("v", "2026-11-23T02:00:00Z", vec![]);
        let e = latest_of("a", &[(&gv, Some(&r))]).expect("a line");
        assert!(!e.passed && !e.is_hardware(), "{e:?}");
        let mark = desired(Some(&e), None).expect("a mark");
        assert!(mark.labels.is_empty(), "{:?}", mark.labels);
        assert_eq!(
            mark.condition.map(|c| c.status),
            Some("Unknown".to_string())
        );
    }

    #[test]
    fn a_simulated_result_is_no_evidence_about_a_real_node() {
        let mut sim = result("a", "demo", "Pass", "2026-11-23T02:00:00Z");
        sim.simulated = true;
        let real = result("a", "old", "Fail", "2026-11-23T01:00:00Z");
        let demo = run("demo", "2026-11-23T02:30:00Z", vec![]);
        let old = run("old", "2026-11-23T01:30:00Z", vec![failed_line(&real)]);
        let runs = [(&old, Some(&real)), (&demo, Some(&sim))];
        let e = latest_of("a", &runs).unwrap();
        assert_eq!(
            (e.validation.as_str(), e.passed),
            ("old", false),
            "the newer simulated pass does not hide the real failure"
        );
        assert!(!latest_of("a", &runs[1..]).unwrap().is_hardware());
        // An operator whose agents all simulate has no evidence at all.
        let simulating = Policy {
            agents_simulated: true,
            ..Policy::default()
        };
        assert_eq!(latest("a", &runs[..1], simulating), None);
        // The test-only opt-in counts them.
        let trusted = Policy {
            agents_simulated: true,
            trust_simulated: true,
        };
        assert!(latest("a", &runs, trusted).unwrap().passed);
    }

    #[test]
    fn only_the_result_of_the_validation_s_own_agent_pod_counts() {
        let meta = |pod: &str, node: &str, generation: &str| -> PartialObjectMeta<GpuNodeResult> {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
                "metadata": {"name": "a-b-c", "namespace": "gpuval-system",
                    "labels": {labels::GENERATION: generation},
                    "annotations": {labels::POD: pod, labels::NODE: node}},
            }))
            .unwrap()
        };
        let own = meta("gpuval-a-b-c-3-g2", "c", "2");
        assert!(written_by_its_agent(&own, "a-b", "c"));
        // Read as validation a's result on node b-c (whose pod was once named alike): not its agent's.
        assert!(!written_by_its_agent(&own, "a", "b-c"));
        let older = meta("gpuval-a-b-c-3-g1", "c", "2");
        assert!(
            !written_by_its_agent(&older, "a-b", "c"),
            "another generation's pod"
        );
        let intruder = meta("intruder", "c", "2");
        assert!(!written_by_its_agent(&intruder, "a-b", "c"));
        let long_node = "n".repeat(80);
        let long = meta(
            &crate::decide::pod::pod_name("v", &long_node, 1),
            &long_node,
            "1",
        );
        assert!(written_by_its_agent(&long, "v", &long_node));
    }

    #[test]
    fn only_hardware_failures_act_on_a_node() {
        let fail = result("a", "v", "Fail", "2026-11-23T02:00:00Z");
        let p = Policy::default();
        let gv = run("v", "2026-11-23T03:00:00Z", vec![failed_line(&fail)]);
        assert!(may_act_on(&gv, "a", Some(&fail), p));
        for evidence in [
            Category::Busy,
            Category::Infrastructure,
            Category::Configuration,
            Category::NoEvidence,
        ] {
            let l = line("a", NodeVerdict::Error, evidence, "what to fix");
            let gv = run("v", "2026-11-23T03:00:00Z", vec![l]);
            assert!(!may_act_on(&gv, "a", None, p), "{evidence}");
        }
        let mut sim = fail.clone();
        sim.simulated = true;
        assert!(!may_act_on(&gv, "a", Some(&sim), p), "simulated");
        let trusted = Policy {
            trust_simulated: true,
            ..p
        };
        assert!(may_act_on(&gv, "a", Some(&sim), trusted));
    }

    #[test]
    fn infrastructure_trouble_leaves_the_node_as_it_was() {
        let pass = result("a", "old", "Pass", "2026-11-23T01:00:00Z");
        let old = run("old", "2026-11-23T01:30:00Z", vec![]);
        let pulled = line(
            "a",
            NodeVerdict::Error,
            Category::Infrastructure,
            "agent pod failed: ImagePullBackOff: the agent image cannot be pulled",
        );
        let new = run("new", "2026-11-23T03:00:00Z", vec![pulled]);
        let e = latest_of("a", &[(&old, Some(&pass)), (&new, None)]).unwrap();
        assert!(e.passed && e.validation == "old", "the earlier pass stands");
        // A node with no verdict yet: Unknown with what to fix, no labels.
        let e = latest_of("a", &[(&new, None)]).unwrap();
        assert_eq!((e.passed, e.category), (false, Category::Infrastructure));
        let mark = desired(Some(&e), None).expect("a mark");
        assert!(mark.labels.is_empty());
        let c = mark.condition.expect("a condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("Unknown", Some("Infrastructure"))
        );
        assert!(c.message.unwrap_or_default().contains("cannot be pulled"));
        // A node that has a condition keeps it as it is.
        assert_eq!(
            desired(Some(&e), Some(&c_at("True", "2026-11-23T00:30:00Z"))),
            None
        );
    }

    #[test]
    fn a_configuration_error_never_labels_a_node_fail() {
        let mut io = result("a", "new", "Error", "2026-11-23T02:00:00Z");
        io.codes = "IoError".into();
        io.action = Remedy::Rerun;
        let mut io_line = failed_line(&io);
        io_line.evidence = None;
        io_line.verdict = NodeVerdict::Error;
        let new = run("new", "2026-11-23T02:30:00Z", vec![io_line.clone()]);
        let pass = result("a", "old", "Pass", "2026-11-23T01:00:00Z");
        let old = run("old", "2026-11-23T01:30:00Z", vec![]);
        let e = latest_of("a", &[(&old, Some(&pass)), (&new, Some(&io))]).unwrap();
        assert!(e.passed && e.validation == "old", "the earlier pass stands");
        let e = latest_of("a", &[(&new, Some(&io))]).unwrap();
        assert_eq!(e.category, Category::Configuration);
        // A hardware code beside it is a real failure.
        io.codes = "MemoryMismatch,IoError".into();
        io_line.codes = Some(io.codes.clone());
        let new = run("new", "2026-11-23T02:30:00Z", vec![io_line]);
        let e = latest_of("a", &[(&new, Some(&io))]).unwrap();
        assert!(!e.passed && e.is_hardware());
        assert_eq!(
            desired(Some(&e), None).unwrap().labels[labels::NODE_VERDICT],
            "Fail"
        );
    }

    #[test]
    fn the_newest_verdict_wins_and_sets_labels_and_condition() {
        let old_a = result("a", "old", "Fail", "2026-11-23T01:00:00Z");
        let new_a = result("a", "new", "Warn", "2026-11-23T02:00:00Z");
        let new_b = result("b", "new", "Fail", "2026-11-23T02:00:00Z");
        let old = run("old", "2026-11-23T01:30:00Z", vec![failed_line(&old_a)]);
        let new = run("new", "2026-11-23T02:30:00Z", vec![failed_line(&new_b)]);
        let a = latest_of("a", &[(&old, Some(&old_a)), (&new, Some(&new_a))]).unwrap();
        assert!(a.passed && a.validation == "new");
        let b = latest_of("b", &[(&old, None), (&new, Some(&new_b))]);
        let failed = desired(b.as_ref(), None).unwrap();
        assert_eq!(failed.labels[labels::NODE_VERDICT], "Fail");
        assert_eq!(
            failed.labels[labels::VALIDATED_AT],
            ts("2026-11-23T02:00:00Z").as_second().to_string()
        );
        let c = failed.condition.unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("Failed"))
        );
        assert_eq!(
            c.message.as_deref(),
            Some(
                "[MemoryMismatch; action ReplaceHardware] GpuValidation new: GPU5 memory: 3 mismatches"
            )
        );
        assert_eq!(failed.labels[labels::ACTION], "ReplaceHardware");
        // A later pass flips the condition and moves its transition time; a repeat keeps it.
        let passed = desired(Some(&a), Some(&c_at("False", "2026-11-23T01:00:00Z"))).unwrap();
        assert!(
            !passed.labels.contains_key(labels::ACTION),
            "nothing to do after a pass"
        );
        let pc = passed.condition.unwrap();
        assert_eq!(pc.status, "True");
        assert_eq!(
            pc.last_transition_time,
            Some(Time(ts("2026-11-23T02:00:00Z")))
        );
        let again = desired(Some(&a), Some(&c_at("True", "2026-11-23T00:30:00Z"))).unwrap();
        assert_eq!(
            again.condition.unwrap().last_transition_time,
            Some(Time(ts("2026-11-23T00:30:00Z")))
        );
        assert_eq!(
            desired(None, Some(&pc)),
            None,
            "no verdict: the node keeps what it carries"
        );
    }

    #[test]
    fn a_run_under_way_is_told_in_the_message_and_changes_nothing_else() {
        let mark = Mark {
            labels: BTreeMap::new(),
            admitted: None,
            condition: Some(NodeCondition {
                message: Some("passed GpuValidation keep".into()),
                ..c_at("True", "2026-11-23T00:30:00Z")
            }),
        };
        let before = mark.condition.clone().expect("condition");
        let told = with_runs_under_way(mark, &["nightly".to_string()]);
        let c = told.condition.clone().expect("condition");
        assert_eq!(
            (&c.status, &c.last_transition_time, &c.last_heartbeat_time),
            (
                &before.status,
                &before.last_transition_time,
                &before.last_heartbeat_time
            )
        );
        let message = c.message.clone().unwrap_or_default();
        assert!(
            message.contains("a run is under way: GpuValidation nightly"),
            "{message}"
        );
        let again = with_runs_under_way(told.clone(), &["nightly".to_string()]);
        assert_eq!(again, told, "told once");
        let over = with_runs_under_way(told, &[]);
        assert_eq!(over.condition.and_then(|c| c.message), before.message);
    }

    fn c_at(status: &str, at: &str) -> NodeCondition {
        NodeCondition {
            type_: CONDITION.into(),
            status: status.into(),
            last_transition_time: Some(Time(ts(at))),
            ..Default::default()
        }
    }

    #[test]
    fn the_shared_node_cache_keeps_what_this_controller_reads() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-1",
                         "labels": {"kubernetes.io/hostname": "gpu-1", labels::NODE_VERDICT: "Pass"},
                         "annotations": {"a": "b"}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": CONDITION, "status": "True", "reason": "Passed", "message": "ok"}],
                "capacity": {"nvidia.com/gpu": "8"}},
        }))
        .unwrap();
        let before = (current(&node), marked(&node));
        crate::caches::stores::trim_node(&mut node);
        assert_eq!((current(&node), marked(&node)), before);
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        assert_eq!(
            conditions
                .iter()
                .map(|c| c.type_.as_str())
                .collect::<Vec<_>>(),
            [CONDITION],
            "only this controller's condition stays"
        );
        assert!(node.metadata.annotations.is_none());
    }

    #[test]
    fn only_a_change_of_marks_wakes_the_controller() {
        let (store, mut writer) = reflector::store::<Node>();
        let node = |verdict: &str, hostname: &str| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "gpu-1",
                "labels": {"kubernetes.io/hostname": hostname, labels::NODE_VERDICT: verdict}}}))
            .unwrap()
        };
        let mut marks = Marks::default();
        writer.apply_watcher_event(&watcher::Event::Apply(node("Pass", "a")));
        assert!(marks.changed(&store, "gpu-1"), "first seen");
        assert!(!marks.changed(&store, "gpu-1"), "nothing changed");
        writer.apply_watcher_event(&watcher::Event::Apply(node("Pass", "b")));
        assert!(!marks.changed(&store, "gpu-1"), "another label changed");
        writer.apply_watcher_event(&watcher::Event::Apply(node("Fail", "b")));
        assert!(marks.changed(&store, "gpu-1"), "its verdict label changed");
        writer.apply_watcher_event(&watcher::Event::Delete(node("Fail", "b")));
        assert!(!marks.changed(&store, "gpu-1"), "gone");
        assert!(marks.0.is_empty(), "a node gone is forgotten");
    }

    #[test]
    fn a_node_created_again_under_its_name_inherits_no_verdict() {
        let pass = result("a", "v", "Pass", "2026-11-23T01:00:00Z");
        let gv = run("v", "2026-11-23T02:00:00Z", vec![]);
        let p = Policy::default();
        let node = |uid: &str, created: &str| Incarnation {
            uid: Some(uid.into()),
            created: Some(ts(created)),
        };
        let old = node("old", "2026-11-20T00:00:00Z");
        assert_eq!(lines_of("a", &[(&gv, Some(&pass))], p, &old).len(), 1);
        let again = node("new", "2026-11-23T03:00:00Z");
        assert!(lines_of("a", &[(&gv, Some(&pass))], p, &again).is_empty());
        // A result that names its Node's UID: the UID decides, even within the same second.
        let same_second = node("new", "2026-11-23T01:00:00Z");
        let mut bound = pass.clone();
        bound.node_uid = Some("old".into());
        assert!(lines_of("a", &[(&gv, Some(&bound))], p, &same_second).is_empty());
        bound.node_uid = Some("new".into());
        let lines = lines_of("a", &[(&gv, Some(&bound))], p, &same_second);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].passed);
    }

    #[test]
    fn a_verdict_names_its_run_and_a_repeat_offender_says_so_after_its_codes() {
        let r = result("a", "fri", "Fail", "2026-11-27T00:00:00Z");
        let gv = run("fri", "2026-11-27T01:00:00Z", vec![failed_line(&r)]);
        let e = latest_of("a", &[(&gv, Some(&r))]).expect("a verdict");
        let mark = desired(Some(&e), None).expect("a mark");
        assert_eq!(mark.labels[labels::VERDICT_RUN], "fri");
        let offences = crate::decide::node_marks::Offences {
            runs: vec![
                ("mon".into(), ts("2026-11-23T00:00:00Z")),
                ("fri".into(), ts("2026-11-27T00:00:00Z")),
            ],
            gpus: vec!["GPU-5".into()],
            window: crate::settings::config::REPEAT_FAILURE_WINDOW,
        };
        let marked = with_offences(mark.clone(), Some(&offences));
        assert_eq!(marked.labels[labels::REPEAT_OFFENDER], "true");
        let message = marked.condition.and_then(|c| c.message).unwrap_or_default();
        assert!(
            message.starts_with("[MemoryMismatch; action ReplaceHardware] repeat offender: failed 2 runs within 168h (mon, fri); GPU GPU-5"),
            "{message}"
        );
        assert!(
            message.contains("GpuValidation fri: GPU5 memory"),
            "{message}"
        );
        // One failure is no repeat offence; nor is a node left as it is (Unknown).
        let once = crate::decide::node_marks::Offences {
            runs: offences.runs[..1].to_vec(),
            ..offences.clone()
        };
        assert_eq!(with_offences(mark.clone(), Some(&once)), mark);
        let busy = Evidence {
            category: Category::Busy,
            ..e
        };
        let unknown = desired(Some(&busy), None).expect("Unknown");
        assert_eq!(with_offences(unknown.clone(), Some(&offences)), unknown);
    }

    /// `GpuAdmitted` is `True` only where a run whose author may admit nodes passed the node;
    /// another author's pass leaves it `Unknown` (NotAdmitted) and the node without the
    /// admission label; a failure is `False` in both conditions.
    #[test]
    fn only_an_admit_capable_pass_admits() {
        let e = |run: &str, at: &str, passed: bool| Evidence {
            validation: run.into(),
            at: ts(at),
            passed,
            category: Category::Hardware,
            reason: if passed { "Passed" } else { "Failed" }.into(),
            message: String::new(),
            action: Remedy::None,
            codes: String::new(),
            on_failure: gpuval_crds::NodeAction::None,
            run_created: None,
            generation: 0,
            uid: None,
        };
        let trivial = e("trivial", "2026-11-23T01:00:00Z", true);
        let mut record = Record::default();
        record.judge(&trivial);
        let shown = desired(Some(&trivial), None).expect("a pass");
        let m = with_admission(shown.clone(), &record, None);
        let a = m.admitted.clone().expect("GpuAdmitted");
        assert_eq!(
            (a.type_.as_str(), a.status.as_str(), a.reason.as_deref()),
            ("GpuAdmitted", "Unknown", Some(NOT_ADMITTED))
        );
        assert!(!m.labels.contains_key(labels::ADMISSION));
        assert_eq!(m.condition, shown.condition, "GpuValidated as it was");

        let gate = e("gate-admit-1", "2026-11-23T02:00:00Z", true);
        record.judge(&gate);
        record.admit(&gate, true);
        let shown = desired(Some(&gate), None).expect("a pass");
        let m = with_admission(shown.clone(), &record, Some(&a));
        let admitted = m.admitted.clone().expect("GpuAdmitted");
        assert_eq!(admitted.status, "True");
        assert!(
            admitted
                .message
                .unwrap_or_default()
                .contains("gate-admit-1")
        );
        assert_eq!(
            m.labels.get(labels::ADMISSION).map(String::as_str),
            Some("Pass")
        );
        // Still admitted after another author's later pass; its transition time stays.
        let again = with_admission(shown.clone(), &record, m.admitted.as_ref());
        assert_eq!(again.admitted, m.admitted);

        let failed = e("trivial", "2026-11-23T03:00:00Z", false);
        let shown = desired(Some(&failed), None).expect("a failure");
        let m = with_admission(shown, &record, None);
        assert_eq!(m.admitted.map(|a| a.status), Some("False".to_string()));
        assert_eq!(
            with_admission(
                Mark {
                    labels: BTreeMap::new(),
                    condition: None,
                    admitted: None
                },
                &record,
                None
            )
            .admitted,
            None
        );
    }

    /// A GPU held by no pod in two runs in a row is its own finding: action ResetGpu, the
    /// message leads with it, the status stays; another line between breaks the streak.
    #[test]
    fn a_gpu_held_by_no_pod_in_consecutive_runs_asks_for_a_reset() {
        let line = |run: &str, at: &str, codes: &str| Evidence {
            validation: run.into(),
            at: ts(at),
            passed: false,
            category: Category::Busy,
            reason: "Error".into(),
            message: "GPU0 busy".into(),
            action: Remedy::Rerun,
            codes: codes.into(),
            on_failure: gpuval_crds::NodeAction::None,
            run_created: None,
            generation: 0,
            uid: None,
        };
        let pass = Evidence {
            category: Category::Hardware,
            passed: true,
            ..line("deep", "2026-11-23T01:00:00Z", "")
        };
        let mut record = Record::default();
        record.judge(&pass);
        let shown = desired(Some(&pass), None).expect("a pass");
        record.note_quiet(&[line("n1", "2026-11-24T01:00:00Z", "GpuHeldByNoPod")]);
        assert_eq!(
            with_stuck(shown.clone(), &record),
            shown,
            "once is no finding"
        );
        record.note_quiet(&[line("n2", "2026-11-25T01:00:00Z", "GpuBusy")]);
        record.note_quiet(&[line("n3", "2026-11-26T01:00:00Z", "GpuHeldByNoPod")]);
        assert_eq!(with_stuck(shown.clone(), &record), shown, "not in a row");
        record.note_quiet(&[line("n4", "2026-11-27T01:00:00Z", "GpuHeldByNoPod,GpuBusy")]);
        let stuck = with_stuck(shown.clone(), &record);
        assert_eq!(
            stuck.labels.get(labels::ACTION).map(String::as_str),
            Some("ResetGpu")
        );
        assert_eq!(with_stuck(stuck.clone(), &record), stuck, "told once");
        let c = stuck.condition.expect("condition");
        assert_eq!(c.status, "True", "no hardware verdict");
        let message = c.message.unwrap_or_default();
        assert!(
            message.starts_with("[GpuHeldByNoPod; action ResetGpu]") && message.contains("n4"),
            "{message}"
        );
        // Hardware news ends it.
        record.judge(&Evidence {
            at: ts("2026-11-28T01:00:00Z"),
            ..pass
        });
        assert_eq!(with_stuck(shown.clone(), &record), shown);
    }

    /// K lines in a row without hardware evidence, set by the administrator, turn a `True`
    /// condition `Unknown` naming the last line and the last hardware evidence; each line is
    /// counted once; a standing failure stays `False`; 0 is off; hardware news ends the streak.
    #[test]
    fn a_streak_of_lines_without_evidence_turns_a_pass_unknown() {
        let line = |run: &str, at: &str, category: Category| Evidence {
            validation: run.into(),
            at: ts(at),
            passed: category == Category::Hardware,
            category,
            reason: "Error".into(),
            message: format!("{run} said so"),
            action: Remedy::Rerun,
            codes: String::new(),
            on_failure: gpuval_crds::NodeAction::None,
            run_created: None,
            generation: 0,
            uid: None,
        };
        let pass = line("deep", "2026-11-23T01:00:00Z", Category::Hardware);
        let mut record = Record::default();
        record.judge(&pass);
        let shown = desired(Some(&pass), None).expect("a pass");
        let busy1 = line("n1", "2026-11-24T01:00:00Z", Category::Busy);
        let early = line("old", "2026-11-22T01:00:00Z", Category::Infrastructure);
        assert!(record.note_quiet(&[pass.clone(), busy1.clone(), early]));
        assert!(
            !record.note_quiet(std::slice::from_ref(&busy1)),
            "counted once"
        );
        assert_eq!(record.quiet.as_ref().map(|q| q.lines), Some(1));
        assert_eq!(with_quiet(shown.clone(), &record, 2, None), shown, "1 < 2");
        let busy2 = line("n2", "2026-11-25T01:00:00Z", Category::Infrastructure);
        assert!(record.note_quiet(&[busy1, busy2]));
        assert_eq!(with_quiet(shown.clone(), &record, 0, None), shown, "off");
        let quiet = with_quiet(shown.clone(), &record, 2, shown.condition.as_ref());
        let c = quiet.condition.clone().expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("Unknown", Some(NO_RECENT_EVIDENCE))
        );
        let message = c.message.unwrap_or_default();
        for want in [
            "2 runs in a row",
            "Infrastructure",
            "n2 said so",
            "2026-11-23T01:00:00Z",
        ] {
            assert!(message.contains(want), "{want}: {message}");
        }
        assert_eq!(
            c.last_transition_time,
            Some(Time(ts("2026-11-25T01:00:00Z")))
        );
        assert_eq!(quiet.labels, shown.labels, "the labels stay");
        // Already Unknown: its transition time stays.
        let again = with_quiet(shown.clone(), &record, 2, quiet.condition.as_ref());
        assert_eq!(again, quiet);
        // A standing failure stays False.
        let failed = Evidence {
            passed: false,
            ..pass.clone()
        };
        let shown_failed = desired(Some(&failed), None).expect("a failure");
        assert_eq!(
            with_quiet(shown_failed.clone(), &record, 2, None),
            shown_failed
        );
        // Hardware news ends the streak.
        record.judge(&line("deep", "2026-11-26T01:00:00Z", Category::Hardware));
        assert_eq!(record.quiet, None);
        assert_eq!(with_quiet(shown.clone(), &record, 2, None), shown);
    }

    #[test]
    fn without_news_the_node_shows_the_line_its_record_stands_on_while_it_is_there() {
        let line = |run: &str, at: &str, passed: bool| Evidence {
            validation: run.into(),
            at: ts(at),
            passed,
            category: Category::Hardware,
            reason: if passed { "Passed" } else { "Failed" }.into(),
            message: String::new(),
            action: Remedy::None,
            codes: String::new(),
            on_failure: gpuval_crds::NodeAction::None,
            run_created: None,
            generation: 0,
            uid: None,
        };
        let failed = line("deep", "2026-11-23T01:00:00Z", false);
        let shallow = line("nightly", "2026-11-23T02:00:00Z", true);
        let mut record = Record::default();
        record.judge(&shallow);
        record
            .failures
            .push(crate::decide::failure_record::Failure {
                run: "deep".into(),
                validation_uid: "u".into(),
                schedule: None,
                depth: Default::default(),
                gpus: Vec::new(),
                codes: String::new(),
                at: failed.at.to_string(),
                generation: None,
                on_failure: gpuval_crds::NodeAction::None,
            });
        let lines = vec![failed.clone(), shallow.clone()];
        assert_eq!(
            basis(&record, &lines),
            Some(failed.clone()),
            "the standing failure"
        );
        assert_eq!(
            basis(&record, std::slice::from_ref(&shallow)),
            None,
            "its run is gone"
        );
        // The same failure dated by its run's end (its result replaced by the next
        // generation's) is still the one recorded, by its run's UID and generation.
        record.failures[0].generation = Some(1);
        let dated_again = Evidence {
            uid: Some("u".into()),
            generation: 1,
            at: ts("2026-11-23T01:00:04Z"),
            ..failed.clone()
        };
        assert_eq!(
            basis(&record, &[dated_again.clone(), shallow.clone()]),
            Some(dated_again.clone()),
            "the same verdict, dated otherwise"
        );
        let next = Evidence {
            generation: 2,
            ..dated_again
        };
        assert_eq!(
            basis(&record, &[next, shallow.clone()]),
            None,
            "another generation"
        );
        record.failures.clear();
        assert_eq!(
            basis(&record, &lines),
            Some(shallow),
            "the verdict judged on"
        );
    }

    #[test]
    fn a_node_whose_writes_fail_tries_again_later_each_time_up_to_five_minutes() {
        let retries = Retries::default();
        let waits: Vec<Duration> = (0..14).map(|_| retries.failed("gpu-1")).collect();
        assert!(waits[0] >= Duration::from_millis(500) && waits[0] < Duration::from_millis(601));
        for pair in waits.windows(2).take(8) {
            assert!(pair[1] > pair[0], "{waits:?}");
        }
        assert!(
            waits.iter().all(|w| *w <= MAX_RETRY + MAX_RETRY / 5),
            "{waits:?}"
        );
        assert!(waits[13] >= MAX_RETRY, "{waits:?}");
        retries.succeeded("gpu-1");
        assert!(
            retries.failed("gpu-1") < Duration::from_millis(601),
            "forgotten after a success"
        );
        assert_ne!(
            retry_delay("gpu-1", 3),
            retry_delay("gpu-2", 3),
            "spread by name"
        );
    }

    #[test]
    fn of_two_verdicts_within_the_same_second_the_later_run_s_is_the_newer() {
        let at = "2026-11-23T01:00:00Z";
        let failed = result("a", "quick", "Fail", at);
        let mut quick = run("quick", at, vec![failed_line(&failed)]);
        quick.metadata.creation_timestamp = Some(Time(ts("2026-11-23T00:59:50Z")));
        let passed = result("a", "repaired", "Pass", at);
        let mut repaired = run("repaired", at, vec![]);
        repaired.metadata.creation_timestamp = Some(Time(ts("2026-11-23T00:59:59Z")));
        let runs = [(&quick, Some(&failed)), (&repaired, Some(&passed))];
        let e = latest_of("a", &runs).expect("a verdict");
        assert!(e.passed && e.validation == "repaired", "{e:?}");
        // Without creation times, a failure wins the tie.
        quick.metadata.creation_timestamp = None;
        repaired.metadata.creation_timestamp = None;
        let runs = [(&quick, Some(&failed)), (&repaired, Some(&passed))];
        assert!(!latest_of("a", &runs).expect("a verdict").passed);
    }
}
