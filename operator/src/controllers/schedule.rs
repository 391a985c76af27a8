//! The schedule controller: watches schedules, the validations they own and the nodes; per
//! reconcile observes (runs from the operator's validation store, nodes from its node store,
//! GPU pods only when an `idleOnly` run is due), decides ([`crate::decide::schedule::plan`] and
//! [`crate::decide::admission::plan`]) and applies (deletes, creates, node taints, status, events).
//! Every tick of the [`Clock`](crate::settings::clock::Clock) re-plans every schedule.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpuval_crds::{GpuValidation, GpuValidationSchedule, NodeName, labels};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};

use crate::context::{Ctx, Error, FIELD_MANAGER};
use crate::controllers::admission;
use crate::decide::admission::AdmissionPlan;
use crate::decide::busy::{self, ClaimKey};
use crate::decide::reconcile::{PlannedEvent, Related};
use crate::decide::schedule::{self as plan, NewRun, NodeLoad, Plan, Run};

/// Requeue after a failed reconcile.
const RETRY: Duration = Duration::from_secs(5);

/// Whether schedule `s` is run `v`'s controller: its controller owner reference names a
/// GpuValidationSchedule of gpuval.io with `s`'s name and uid. A reference that names `s`'s uid
/// under another kind or name, or that is not the controller's, does not make `v` its run (and
/// the chart's `…-admit` policy keeps anyone without the `admit` verb from writing one).
pub fn controlled_by(v: &GpuValidation, s: &GpuValidationSchedule) -> bool {
    let (Some(name), Some(uid)) = (s.metadata.name.as_deref(), s.metadata.uid.as_deref()) else {
        return false;
    };
    v.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == GpuValidationSchedule::kind(&())
            && o.api_version.split('/').next() == Some(gpuval_crds::GROUP)
            && o.name == name
            && o.uid == uid
    })
}

/// The runs (validations) schedule `s` controls.
fn owned_runs(s: &GpuValidationSchedule, runs: &Store<GpuValidation>) -> Vec<Arc<GpuValidation>> {
    runs.state()
        .into_iter()
        .filter(|v| controlled_by(v, s))
        .collect()
}

/// The runs schedule `s` owns, listed from the API server: when a run is due, the concurrency
/// policy must see the run the previous reconcile created even where the store has not caught
/// up with it yet (a Forbid that starts a second run is worse than one list call).
async fn fresh_runs(
    s: &GpuValidationSchedule,
    ctx: &Ctx,
) -> Result<Vec<Arc<GpuValidation>>, kube::Error> {
    let selector = format!("{}={}", labels::SCHEDULE, s.name_any());
    let listed = Api::<GpuValidation>::all(ctx.client.clone())
        .list(&ListParams::default().labels(&selector))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|v| controlled_by(v, s))
        .map(Arc::new)
        .collect())
}

/// A run as [`plan`] sees it; its scheduled time comes from its annotation.
fn run_of(v: &GpuValidation, ctx: &Ctx) -> Run {
    let scheduled_at = v
        .annotations()
        .get(labels::SCHEDULED_AT)
        .and_then(|t| t.parse::<Timestamp>().ok());
    let mut run = Run {
        name: v.name_any(),
        scheduled_at,
        created: v
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        phase: v.status.as_ref().and_then(|s| s.phase),
        unrecorded: false,
    };
    run.unrecorded = run.finished() && crate::controllers::node_state::failure_unrecorded(ctx, v);
    run
}

/// Pods an `idleOnly` look lists at once: the cluster's pods come in pages of this many, so the
/// operator never holds every pod of a large cluster at once.
pub const POD_PAGE: u32 = 500;

/// Lists `api` with `lp`, `lp`'s limit at a time, handing each page's items to `each`: a large
/// cluster's objects are never all held at once.
async fn each_page<K>(
    api: &Api<K>,
    mut lp: ListParams,
    mut each: impl FnMut(Vec<K>),
) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    loop {
        let list = api.list(&lp).await?;
        each(list.items);
        match list.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Where DRA may be in use: the claims holding `driver`'s devices, read `page` at a time. A
/// cluster that does not serve ResourceClaims has none.
pub async fn gpu_claims(
    claims: &Api<ResourceClaim>,
    driver: &str,
    page: u32,
) -> Result<BTreeSet<ClaimKey>, kube::Error> {
    let mut held = BTreeSet::new();
    let listed = each_page(claims, ListParams::default().limit(page), |items| {
        held.extend(busy::gpu_claims(&items, driver));
    })
    .await;
    match listed {
        Ok(()) => Ok(held),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(BTreeSet::new()),
        Err(e) => Err(e),
    }
}

/// The busy nodes among `selected`, from every running pod, read `page` pods at a time;
/// `gpu_claims` are the claims that hold the GPU driver's devices ([`gpu_claims`]).
pub async fn busy_nodes(
    pods: &Api<Pod>,
    gpu_claims: &BTreeSet<ClaimKey>,
    selected: &[String],
    page: u32,
) -> Result<BTreeMap<String, String>, kube::Error> {
    let selected: BTreeSet<&str> = selected.iter().map(String::as_str).collect();
    let running = ListParams::default()
        .fields("status.phase!=Succeeded,status.phase!=Failed")
        .limit(page);
    let mut busy = BTreeMap::new();
    each_page(pods, running, |items| {
        for (node, why) in items.iter().filter_map(|p| busy::holds_gpus(p, gpu_claims)) {
            if selected.contains(node.as_str()) {
                busy.entry(node).or_insert(why);
            }
        }
    })
    .await?;
    Ok(busy)
}

/// The nodes the template selects and which running pods (other than agents) hold their GPUs.
async fn node_load(
    s: &GpuValidationSchedule,
    ctx: &Ctx,
    nodes: &[Node],
) -> Result<NodeLoad, kube::Error> {
    let selected: Vec<String> = crate::context::select_nodes(&s.spec.template, nodes, ctx)
        .selected
        .into_iter()
        .map(|n| n.name)
        .collect();
    let allocation = &ctx.cfg.allocation;
    let claims = if allocation.reads_slices() {
        let api: Api<ResourceClaim> = Api::all(ctx.client.clone());
        gpu_claims(&api, &allocation.driver, POD_PAGE).await?
    } else {
        BTreeSet::new()
    };
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let busy = busy_nodes(&pods, &claims, &selected, POD_PAGE).await?;
    Ok(NodeLoad {
        selected,
        busy,
        unknown: None,
    })
}

/// When the operator may not list pods, the load is unknown: the run is skipped, saying which
/// permission is missing (other errors are retried).
fn forbidden_load(e: kube::Error) -> Result<NodeLoad, kube::Error> {
    match e {
        kube::Error::Api(s) if s.code == 403 => Ok(NodeLoad {
            unknown: Some(format!(
                "idleOnly: cannot list pods (or ResourceClaims) to find busy GPUs ({}); grant the operator `list` on pods and resourceclaims in every namespace (the chart does)",
                s.message
            )),
            ..NodeLoad::default()
        }),
        other => Err(other),
    }
}

/// The validation a [`NewRun`] (or an admission batch) creates: the template, owned by the
/// schedule, labelled with it; a scheduled run is annotated with its time.
fn new_validation(
    s: &GpuValidationSchedule,
    name: &str,
    scheduled_at: Option<Timestamp>,
    nodes: Option<&[String]>,
) -> GpuValidation {
    let mut spec = s.spec.template.clone();
    if let Some(nodes) = nodes {
        spec.node_names = nodes.iter().cloned().map(NodeName).collect();
    }
    let mut gv = GpuValidation::new(name, spec);
    gv.metadata = ObjectMeta {
        name: Some(name.into()),
        labels: Some(BTreeMap::from([
            (labels::SCHEDULE.into(), labels::node_value(&s.name_any())),
            (labels::MANAGED_BY_KEY.into(), labels::MANAGED_BY.into()),
        ])),
        annotations: scheduled_at
            .map(|t| BTreeMap::from([(labels::SCHEDULED_AT.to_string(), t.to_string())])),
        owner_references: s.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    };
    gv
}

async fn create(ctx: &Ctx, gv: &GpuValidation) -> Result<(), kube::Error> {
    let api: Api<GpuValidation> = Api::all(ctx.client.clone());
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    ctx.throttle.acquire().await;
    match api.create(&pp, gv).await {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => other.map(|_| ()),
    }
}

async fn delete(ctx: &Ctx, names: &[String]) -> Result<(), kube::Error> {
    let api: Api<GpuValidation> = Api::all(ctx.client.clone());
    for name in names {
        ctx.throttle.acquire().await;
        match api.delete(name, &DeleteParams::background()).await {
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            other => {
                other?;
            }
        }
    }
    Ok(())
}

/// The admission plan of `s` (nothing without `spec.admission`).
fn plan_admission(
    s: &GpuValidationSchedule,
    runs: &[Arc<GpuValidation>],
    ctx: &Ctx,
    nodes: &[Node],
    now: Timestamp,
) -> AdmissionPlan {
    let Some(a) = s.spec.admission.as_ref() else {
        return AdmissionPlan::default();
    };
    let views = admission::node_views(&s.spec.template, a, nodes);
    let admission_runs: Vec<_> = runs
        .iter()
        .filter(|r| !r.annotations().contains_key(labels::SCHEDULED_AT))
        .map(|r| admission::run_view(r, ctx))
        .collect();
    crate::decide::admission::plan(
        &s.name_any(),
        a,
        &views,
        &admission_runs,
        now,
        s.spec.suspend,
    )
}

/// Node `node` passed admission run `run` and lost the admission taint `taint`: an event of
/// its own (see [`Related`]), naming the run.
fn admitted(node: &str, run: &str, taint: &str) -> PlannedEvent {
    let note = format!("{node} passed {run}; removed taint {taint}");
    PlannedEvent::new(false, "NodeAdmitted", note).about(Related::Node(node.into()))
}

/// Node `node` did not pass admission run `run`: it keeps `taint` and gets the failure mark.
fn not_admitted(node: &str, run: &str, taint: &str) -> PlannedEvent {
    let failed = labels::FAILED_NODE;
    let note = format!("{node} did not pass {run}; kept taint {taint} and added {failed}");
    PlannedEvent::new(true, "NodeNotAdmitted", note).about(Related::Node(node.into()))
}

/// Admission run `name` started on `nodes`: an event of each run's own.
fn admission_started(name: &str, nodes: &[String]) -> PlannedEvent {
    let (n, list) = (nodes.len(), nodes.join(", "));
    let note = format!("started {name} on {n} new node(s): {list}");
    PlannedEvent::new(false, "AdmissionStarted", note).about(Related::Run(name.into()))
}

/// Carries out the admission plan: node taints first (best effort, logged), then the new run.
async fn apply_admission(
    s: &GpuValidationSchedule,
    ctx: &Ctx,
    p: &AdmissionPlan,
    events: &mut Vec<PlannedEvent>,
) -> Result<(), kube::Error> {
    let Some(a) = s.spec.admission.as_ref() else {
        return Ok(());
    };
    // Under the cluster's taint controller (--node-taints=cluster), it removes the admission
    // taint once GpuValidated is True and keeps it while False: gpuval writes no taint.
    let (untaint, mark_failed) = match ctx.cfg.node_taints.by_gpuval() {
        true => (p.untaint.as_slice(), p.mark_failed.as_slice()),
        false => (&[][..], &[][..]),
    };
    for (node, run) in untaint {
        admission::untaint(ctx, node, &a.taint).await?;
        events.push(admitted(node, run, &a.taint.key));
    }
    for (node, run) in mark_failed {
        admission::mark_failed(ctx, node, run).await?;
        events.push(not_admitted(node, run, &a.taint.key));
    }
    if let Some((name, nodes)) = &p.create {
        create(ctx, &new_validation(s, name, None, Some(nodes))).await?;
        events.push(admission_started(name, nodes));
    }
    Ok(())
}

/// What a schedule reconcile reads: the operator's context (its Node store, see
/// [`crate::caches::wakes`]), and this controller's own store of runs (each filled before the trigger
/// it causes is delivered, so a reconcile never sees a run older than the event that woke it).
pub struct ScheduleCtx {
    ctx: Arc<Ctx>,
    runs: Store<GpuValidation>,
}

async fn reconcile(s: Arc<GpuValidationSchedule>, sc: Arc<ScheduleCtx>) -> Result<Action, Error> {
    let ctx = &sc.ctx;
    let now = ctx.cfg.clock.now();
    let owned = match plan::slot_due(&s, now) {
        Some(_) => fresh_runs(&s, ctx).await?,
        None => owned_runs(&s, &sc.runs),
    };
    let runs: Vec<Run> = owned.iter().map(|v| run_of(v, ctx)).collect();
    let nodes: Vec<Node> = ctx.nodes.state().iter().map(|n| (**n).clone()).collect();
    let load = match (s.spec.idle_only, plan::slot_due(&s, now)) {
        (true, Some(_)) => node_load(&s, ctx, &nodes).await.or_else(forbidden_load)?,
        _ => NodeLoad::default(),
    };
    let refused = s
        .spec
        .admission
        .as_ref()
        .and_then(|a| admission::refuse_taint_key(&a.taint.key, &ctx.cfg.admission_taint_keys));
    let admission = match refused {
        Some(_) => AdmissionPlan::default(),
        None => plan_admission(&s, &owned, ctx, &nodes, now),
    };
    let mut p: Plan = plan::plan_with(&s, &runs, now, || load, refused);
    for r in runs
        .iter()
        .filter(|r| r.unrecorded && p.delete.contains(&r.name))
    {
        tracing::warn!(schedule = %s.name_any(), run = %r.name, kept = plan::MAX_UNRECORDED_KEPT, "pruned past the history limit although a node has not recorded its failure (the newest such runs are kept)");
    }
    delete(ctx, &p.delete).await?;
    if let Some(NewRun {
        name,
        scheduled_at,
        node_names,
    }) = &p.create
    {
        let gv = new_validation(&s, name, Some(*scheduled_at), node_names.as_deref());
        create(ctx, &gv).await?;
    }
    apply_admission(&s, ctx, &admission, &mut p.events).await?;
    if s.status.as_ref() != Some(&p.status) {
        crate::write::status::write::<GpuValidationSchedule>(&s.name_any(), ctx, &p.status).await?;
    }
    crate::write::events::publish(&*s, ctx, &p.events).await;
    let requeue = [p.requeue_after, admission.requeue_after]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(Duration::from_secs(600));
    Ok(Action::requeue(requeue))
}

fn error_policy(s: Arc<GpuValidationSchedule>, err: &Error, _ctx: Arc<ScheduleCtx>) -> Action {
    tracing::warn!(schedule = %s.name_any(), error = %err, "schedule reconcile failed; retrying");
    Action::requeue(RETRY)
}

/// The schedules with an admission section (a node change may matter to them).
fn gating(store: &Store<GpuValidationSchedule>) -> Vec<ObjectRef<GpuValidationSchedule>> {
    store
        .state()
        .iter()
        .filter(|s| s.spec.admission.is_some())
        .map(|s| ObjectRef::from_obj(&**s))
        .collect()
}

/// The schedule that owns run `v`, if any.
fn owner_schedule(v: &GpuValidation) -> Option<ObjectRef<GpuValidationSchedule>> {
    let kind = GpuValidationSchedule::kind(&());
    v.owner_references()
        .iter()
        .find(|o| o.kind == kind)
        .map(|o| ObjectRef::new(&o.name))
}

/// Runs the schedule controller until the task is dropped.
pub async fn run(ctx: Arc<Ctx>, nodes_changed: tokio::sync::watch::Receiver<()>) {
    let client = ctx.client.clone();
    let controller = Controller::new(
        Api::<GpuValidationSchedule>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    );
    let schedules = controller.store();
    let (runs, run_writer) = reflector::store();
    let run_events = watcher(
        Api::<GpuValidation>::all(client.clone()),
        watcher::Config::default().labels(labels::SCHEDULE),
    )
    .backoff(crate::caches::watch_backoff::watch_backoff())
    .reflect(run_writer)
    .touched_objects();
    let gating_schedules = schedules.clone();
    let node_events =
        crate::caches::wakes::nodes_changed(nodes_changed, crate::caches::wakes::BATCH)
            .flat_map(move |()| futures::stream::iter(gating(&gating_schedules)));
    let ticks = ctx.cfg.clock.ticks();
    let sc = Arc::new(ScheduleCtx { ctx, runs });
    controller
        .watches_stream(run_events, |v: GpuValidation| owner_schedule(&v))
        .reconcile_on(node_events)
        .reconcile_all_on(ticks)
        .run(reconcile, error_policy, sc)
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn schedule() -> GpuValidationSchedule {
        let mut s: GpuValidationSchedule = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidationSchedule",
            "metadata": {"name": "gate", "uid": "s-uid"},
            "spec": {"admission": {}, "template": {"checks": {"memory": {}}}},
        }))
        .expect("schedule");
        s.metadata.uid = Some("s-uid".into());
        s
    }

    fn run_owned_by(owner: OwnerReference) -> GpuValidation {
        let mut v = GpuValidation::new("gate-admit-1", schedule().spec.template);
        v.metadata.owner_references = Some(vec![owner]);
        v
    }

    #[test]
    fn only_the_schedule_as_controller_by_kind_name_and_uid_makes_a_run_its_own() {
        let s = schedule();
        let own = s.controller_owner_ref(&()).expect("owner reference");
        assert!(controlled_by(&run_owned_by(own.clone()), &s));
        let forged = [
            OwnerReference {
                kind: "ConfigMap".into(),
                ..own.clone()
            },
            OwnerReference {
                name: "other".into(),
                ..own.clone()
            },
            OwnerReference {
                api_version: "example.com/v1".into(),
                ..own.clone()
            },
            OwnerReference {
                controller: None,
                ..own.clone()
            },
            OwnerReference {
                uid: "another-uid".into(),
                ..own
            },
        ];
        for o in forged {
            assert!(!controlled_by(&run_owned_by(o.clone()), &s), "{o:?}");
        }
    }
}
