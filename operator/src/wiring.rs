//! The shell around [`crate::decide::reconcile`], in the kube-rs controller style: watches validations
//! and what they own into reflector stores, and per reconcile observes ([`crate::read::observe`]),
//! decides ([`crate::decide::reconcile::next`], pure) and applies ([`crate::write::apply`]).

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use gpuval_crds::{GpuFabricRound, GpuNodeResult, GpuValidation, Phase, labels};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PartialObjectMeta, ResourceExt};
use kube::runtime::controller::{self, Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::caches::pod_views::PodViews;
use crate::caches::runs::{Owned, Runs};
use crate::caches::stores::{trim_meta, trim_node, trim_result, trim_slice};
use crate::caches::wakes::{BATCH, Wakes};
use crate::context::{Ctx, Error, FIELD_MANAGER, select_nodes};
use crate::decide::reconcile::allocation;
use crate::decide::reconcile::finished;
use crate::read::observe::{node_of, observe, owner_ref_of};
use crate::read::result_figures::FigureFetcher;
use crate::services::metrics::{ErrorLabels, Metrics};
use crate::services::throttle::Throttle;
use crate::settings::config::OperatorConfig;
use crate::write::apply;

/// Requeue of a finished run (the periodic resync).
const RESYNC: Duration = Duration::from_secs(600);
/// Requeue after a failed reconcile that another try may not meet ([`Error::is_transient`]).
const RETRY: Duration = Duration::from_secs(5);
/// Requeue after a final error (a refusal the same try meets again): the validation's own
/// changes wake it sooner; this only looks again now and then.
const FINAL_RETRY: Duration = Duration::from_secs(300);
/// Requeue of a reconcile that came before the stores were filled.
const STORES_WAIT: Duration = Duration::from_millis(200);

async fn reconcile(gv: Arc<GpuValidation>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let uid = gv.metadata.uid.clone().unwrap_or_default();
    if !ctx.slices_settled.load(Ordering::Relaxed) {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if !ctx.stores_filled.load(Ordering::Relaxed) {
        // Reconciles are no longer debounced: one can come before the first lists are in,
        // and a node set resolved against an empty Node cache would fail the run.
        return Ok(Action::requeue(STORES_WAIT));
    }
    let taken = ctx.runs.take(&uid, std::time::Instant::now());
    let recovering = taken.record.is_none();
    // The nodes whose results to look at for their binding: every node after a restart or a
    // failed step, else those in the news.
    let to_bind = (!recovering && !taken.everything).then(|| taken.changed.nodes.clone());
    let changed_nodes = taken.changed.nodes.len();
    let now = Timestamp::now();
    let select = || {
        let nodes: Vec<Node> = ctx.nodes.state().iter().map(|n| (**n).clone()).collect();
        let mut s = select_nodes(&gv.spec, &nodes, &ctx);
        let installation = crate::decide::reconcile::preflight::Installation::of(&ctx.cfg);
        s.not_configured = crate::decide::reconcile::preflight::check(&gv.spec, &installation);
        s
    };
    let mut step = if taken.everything {
        let world = observe(&gv, &ctx);
        crate::decide::reconcile::next(&gv, &world, now, taken.record, select)
    } else {
        let news = crate::read::observe::news(&gv, &ctx, taken.changed);
        let everything = || observe(&gv, &ctx);
        crate::decide::reconcile::next_on_news(&gv, &news, now, taken.record, everything, select)
    };
    let record = step.record.take();
    tracing::debug!(
        validation = %gv.name_any(),
        changed_nodes,
        everything = taken.everything,
        create = step.create_pods.len(),
        delete = step.delete_pods.len(),
        new_verdicts = step.new_verdicts.len(),
        recovering,
        "reconcile"
    );
    let certificates_due = apply::apply(&gv, &ctx, &step, to_bind.as_ref()).await?;
    let live = ctx.validations.state();
    ctx.runs.put(&uid, record, |u| {
        live.iter().any(|v| v.metadata.uid.as_deref() == Some(u))
    });
    if tracing::enabled!(tracing::Level::TRACE) {
        let (runs, bytes) = ctx.runs.held();
        tracing::trace!(runs, bytes, "run records held");
    }
    ctx.metrics
        .set_phases(ctx.validations.state().iter().map(|v| {
            let s = v.status.as_ref();
            (
                s.and_then(|s| s.phase),
                s.and_then(|s| s.simulated) == Some(true),
            )
        }));
    let requeue = step.requeue_after.unwrap_or(RESYNC);
    Ok(Action::requeue(
        certificates_due.map_or(requeue, |c| c.min(requeue)),
    ))
}

/// Notes in `runs` each object of `kind` a watch yields (see [`touch_owned`]).
fn toucher<K: Resource>(runs: Arc<Runs>, kind: Owned) -> impl Fn(&Result<K, watcher::Error>) {
    move |o| {
        if let Ok(o) = o {
            touch_owned(&runs, o.meta(), kind);
        }
    }
}

/// Notes in `runs` that an object a validation owns (`kind`, with `meta`) changed.
fn touch_owned(runs: &Runs, meta: &ObjectMeta, kind: Owned) {
    let owner_kind = GpuValidation::kind(&());
    let owners = meta.owner_references.iter().flatten();
    for o in owners.filter(|o| o.kind == owner_kind) {
        let name = meta.name.as_deref().unwrap_or_default();
        runs.touch(&o.uid, kind, name, node_of(meta));
    }
}

fn error_policy(gv: Arc<GpuValidation>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            error: err.metric_label().into(),
        })
        .inc();
    let delay = retry_after(err);
    tracing::warn!(validation = %gv.name_any(), error = %err, cause = ?std::error::Error::source(err).map(ToString::to_string), retry_in_s = delay.as_secs(), "reconcile failed; retrying");
    Action::requeue(delay)
}

/// How long a failed reconcile waits: [`RETRY`] where another try may not meet the error,
/// [`FINAL_RETRY`] where it would (not every 5 s for a refusal that only a change lifts).
fn retry_after(err: &Error) -> Duration {
    if err.is_transient() {
        RETRY
    } else {
        FINAL_RETRY
    }
}

/// Watches `api` into `writer`'s store, trimming each object with `trim` first (what the
/// operator never reads need not stay in memory); yields the objects that changed.
fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
    trim: impl FnMut(&mut K) + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    watcher(api, config)
        .backoff(crate::caches::watch_backoff::watch_backoff())
        .modify(trim)
        .reflect(writer)
        .touched_objects()
}

/// How many validations reconcile at once. No debounce: kube's restarts on each trigger, and
/// the triggers are batched before they reach the controller instead ([`BATCH`]).
fn controller_config(cfg: &OperatorConfig) -> ControllerConfig {
    ControllerConfig::default().concurrency(cfg.concurrency)
}

/// The validations that each object `stream` yields names, through `map`; a watch error is
/// logged (the watch itself retries with backoff).
fn triggers<K, I>(
    stream: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    map: impl Fn(K) -> I + Send + 'static,
) -> BoxStream<'static, ObjectRef<GpuValidation>>
where
    I: IntoIterator<Item = ObjectRef<GpuValidation>>,
    I::IntoIter: Send + 'static,
{
    stream
        .filter_map(move |o| {
            let refs = match o {
                Ok(o) => Some(futures::stream::iter(map(o))),
                Err(e) => {
                    tracing::debug!(error = %e, "watch error; the watch retries");
                    None
                }
            };
            std::future::ready(refs)
        })
        .flatten()
        .boxed()
}

/// The validations a change of Node `node` may change: the unfinished ones whose run holds
/// it, or, still selecting, whose spec could select it ([`crate::decide::selection::node_matters`]).
fn woken_by_node(
    node: &Node,
    validations: &Store<GpuValidation>,
    runs: &Runs,
) -> Vec<ObjectRef<GpuValidation>> {
    let name = node.name_any();
    validations
        .state()
        .iter()
        .filter(|v| !finished(v))
        .filter(|v| {
            let held = v.metadata.uid.as_deref().and_then(|u| runs.holds(u, &name));
            crate::decide::selection::node_matters(&v.spec, held, node)
        })
        .map(|v| ObjectRef::new(&v.name_any()))
        .collect()
}

/// The validations each Node and each ResourceSlice of the streams may change.
fn node_triggers(
    node_stream: impl Stream<Item = Result<Node, watcher::Error>> + Send + 'static,
    slice_stream: impl Stream<Item = Result<ResourceSlice, watcher::Error>> + Send + 'static,
    ctx: &Arc<Ctx>,
) -> [BoxStream<'static, ObjectRef<GpuValidation>>; 2] {
    let (by_node, by_slice) = (ctx.clone(), ctx.clone());
    [
        triggers(node_stream, move |n: Node| {
            woken_by_node(&n, &by_node.validations, &by_node.runs)
        }),
        triggers(slice_stream, move |s: ResourceSlice| {
            let c = &by_slice;
            woken_by_slice(&s, &c.nodes, &c.validations, &c.runs)
        }),
    ]
}

/// The validations a change of ResourceSlice `slice` may change: those its node's change
/// would wake, or every unfinished one for a slice of no known node.
fn woken_by_slice(
    slice: &ResourceSlice,
    nodes: &Store<Node>,
    validations: &Store<GpuValidation>,
    runs: &Runs,
) -> Vec<ObjectRef<GpuValidation>> {
    let node = slice.spec.node_name.as_deref();
    match node.and_then(|n| nodes.get(&ObjectRef::new(n))) {
        Some(node) => woken_by_node(&node, validations, runs),
        None => unfinished(validations),
    }
}

/// The label selector of everything the operator creates.
fn managed_selector() -> String {
    format!("{}={}", labels::MANAGED_BY_KEY, labels::MANAGED_BY)
}

/// The validations whose run is not over (a node change may matter to them).
fn unfinished(validations: &Store<GpuValidation>) -> Vec<ObjectRef<GpuValidation>> {
    validations
        .state()
        .into_iter()
        .filter(|v| {
            !v.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(Phase::is_terminal)
        })
        .map(|v| ObjectRef::new(&v.name_any()))
        .collect()
}

/// How long `--gpu-allocation auto` waits for the first list of ResourceSlices before it
/// resolves node sets without them (an API server that does not serve `resource.k8s.io/v1`).
const SLICES_WAIT: Duration = Duration::from_secs(30);

/// Sets `settled` once the ResourceSlices are listed: at once when they are never read, after
/// the list with `dra`, after the list or [`SLICES_WAIT`] with `auto`.
async fn settle_slices(ctx: Arc<Ctx>) {
    let mode = ctx.cfg.allocation.mode;
    match mode {
        allocation::Mode::ExtendedResource => {}
        allocation::Mode::Dra => {
            let _ = ctx.slices.wait_until_ready().await;
        }
        allocation::Mode::Auto => {
            if tokio::time::timeout(SLICES_WAIT, ctx.slices.wait_until_ready())
                .await
                .is_err()
            {
                tracing::warn!(
                    driver = %ctx.cfg.allocation.driver,
                    "ResourceSlices could not be listed (is resource.k8s.io/v1 served, and may the operator list resourceslices?); nodes use the nvidia.com/gpu extended resource until they are"
                );
            }
        }
    }
    ctx.slices_settled.store(true, Ordering::Relaxed);
}

/// Sets `ready` once every store has been filled, then tells `filled`.
///
/// This is the only task that waits for the stores to fill: a kube `Store` wakes only the last
/// of several tasks waiting for it at once (its readiness is a oneshot channel, which keeps one
/// waker), so the node-state controller, whose kube controller waits on the Node store too,
/// starts on `filled` (once a store is filled, every wait returns at once). Two waiters left
/// the operator never ready at 1,000 nodes in the scale bench.
async fn mark_ready_when_filled(
    ctx: Arc<Ctx>,
    ready: Arc<AtomicBool>,
    filled: tokio::sync::oneshot::Sender<()>,
) {
    let _ = tokio::join!(
        ctx.pods.wait_until_ready(),
        ctx.results.wait_until_ready(),
        ctx.nodes.wait_until_ready(),
        ctx.rounds.wait_until_ready()
    );
    ready.store(true, Ordering::Relaxed);
    let _ = filled.send(());
    tracing::info!("caches filled; reconciling");
}

/// Runs the controller until `shutdown` resolves. `ready` turns true once every store is filled.
pub async fn run(
    client: Client,
    cfg: OperatorConfig,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let cfg = crate::controllers::admission::with_agent_tolerations(cfg);
    let ns = cfg.namespace.clone();
    let (results, result_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let (rounds, round_writer) = reflector::store();
    let (slices, slice_writer) = reflector::store();
    let runs = Arc::new(Runs::default());
    let pods = Arc::new(PodViews::default());
    let pod_stream = pod_stream(Api::namespaced(client.clone(), &ns), &pods, &runs);
    let figures = Arc::new(FigureFetcher::new(
        metrics.fleet.clone(),
        metrics.ports.clone(),
    ));
    let offers = figures.clone();
    let (wakes, woken) = Wakes::new();
    let result_wakes = wakes.clone();
    let result_stream = reflected(
        Api::<PartialObjectMeta<GpuNodeResult>>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
        result_writer,
        trim_result,
    )
    .inspect(toucher(runs.clone(), Owned::Result))
    .inspect(move |r| {
        if let Ok(r) = r {
            offers.offer(r);
            result_wakes.result_touched(r);
        }
    });
    let round_stream = reflected(
        Api::<GpuFabricRound>::namespaced(client.clone(), &ns),
        watcher::Config::default().labels(&managed_selector()),
        round_writer,
        trim_meta,
    );
    let node_stream = node_stream(&client, node_writer, runs.clone(), wakes);
    let slice_stream = slice_stream(&client, &cfg, slice_writer);
    let gv_api: Api<GpuValidation> = Api::all(client.clone());
    let controller = Controller::new(gv_api, watcher::Config::default().any_semantic());
    let validations = controller.store();
    let ctx = Arc::new(Ctx {
        recorder: recorder(client.clone()),
        client,
        cfg: cfg.clone(),
        pods,
        results,
        nodes,
        slices,
        slices_settled: Arc::new(AtomicBool::new(false)),
        stores_filled: ready.clone(),
        rounds,
        validations: validations.clone(),
        metrics,
        runs,
        throttle: Throttle::new(cfg.api_qps, cfg.api_burst),
        certificates: Default::default(),
    });
    let (filled, when_filled) = tokio::sync::oneshot::channel();
    tokio::spawn(mark_ready_when_filled(ctx.clone(), ready, filled));
    tokio::spawn(settle_slices(ctx.clone()));
    tokio::spawn(figures.run(Api::namespaced(ctx.client.clone(), &ns), ctx.nodes.clone()));
    // Schedules, admission and node state: their own controllers over the same stores.
    let schedules = crate::controllers::schedule::run(ctx.clone(), woken.nodes_changed);
    let node_state =
        crate::controllers::node_state::run(ctx.clone(), woken.node_state, when_filled);
    let lifecycle = [tokio::spawn(schedules), tokio::spawn(node_state)];
    let [by_node, by_slice] = node_triggers(node_stream, slice_stream, &ctx);
    let triggered = futures::stream::select_all([
        triggers(pod_stream, |p: Pod| owner_ref_of(&p.metadata)),
        triggers(result_stream, |r: PartialObjectMeta<GpuNodeResult>| {
            owner_ref_of(&r.metadata)
        }),
        triggers(round_stream, |r: GpuFabricRound| owner_ref_of(&r.metadata)),
        by_node,
        by_slice,
    ]);

    controller
        .with_config(controller_config(&cfg))
        .trigger_backoff(crate::caches::watch_backoff::watch_backoff())
        .reconcile_on(crate::caches::wakes::batched(triggered, BATCH))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(log_outcome)
        .await;
    lifecycle.iter().for_each(tokio::task::JoinHandle::abort);
}

/// The DRA driver's ResourceSlices (only its own, through the `spec.driver` field selector),
/// trimmed, into `writer`'s store; no stream when the operator never uses DRA.
/// The nodes, trimmed into their store; each change touches the runs that hold the node and
/// wakes its schedules and state.
fn node_stream(
    client: &Client,
    writer: Writer<Node>,
    runs: Arc<Runs>,
    wakes: Wakes,
) -> impl Stream<Item = Result<Node, watcher::Error>> + Send + 'static {
    reflected(
        Api::all(client.clone()),
        Default::default(),
        writer,
        trim_node,
    )
    .inspect(move |n| {
        if let Ok(n) = n {
            let name = n.name_any();
            runs.touch_node(&name);
            wakes.node_touched(&name);
        }
    })
}

fn slice_stream(
    client: &Client,
    cfg: &OperatorConfig,
    writer: Writer<ResourceSlice>,
) -> futures::stream::BoxStream<'static, Result<ResourceSlice, watcher::Error>> {
    if !cfg.allocation.reads_slices() {
        return futures::stream::empty().boxed();
    }
    let selector = format!("spec.driver={}", cfg.allocation.driver);
    reflected(
        Api::all(client.clone()),
        watcher::Config::default().fields(&selector),
        writer,
        trim_slice,
    )
    .boxed()
}

/// The agent pods' watch: each event kept in `pods` as a view (the pods a relist found gone
/// touch their run), then the pod that changed touches its run.
fn pod_stream(
    api: Api<Pod>,
    pods: &Arc<PodViews>,
    runs: &Arc<Runs>,
) -> impl Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    let (views, touched) = (pods.clone(), runs.clone());
    watcher(api, watcher::Config::default().labels(&managed_selector()))
        .backoff(crate::caches::watch_backoff::watch_backoff())
        .map_ok(move |event| {
            for (uid, name, node) in views.apply(&event) {
                touched.touch(&uid, Owned::Pod, &name, Some(&node));
            }
            event
        })
        .touched_objects()
        .inspect(toucher(runs.clone(), Owned::Pod))
}

/// The event recorder, reporting as this operator (and this replica, when it knows its pod).
fn recorder(client: Client) -> Recorder {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    Recorder::new(client, reporter)
}

/// Logs what the controller did with one trigger (failed reconciles are logged by
/// [`error_policy`]).
async fn log_outcome(
    outcome: Result<(ObjectRef<GpuValidation>, Action), controller::Error<Error, watcher::Error>>,
) {
    match outcome {
        Ok((obj, _)) => tracing::trace!(validation = %obj.name, "reconciled"),
        Err(e) => tracing::debug!(error = %e, "controller event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    /// A refusal only a change lifts waits long; what another try may not meet comes back
    /// soon; either keeps its cause.
    #[test]
    fn a_final_error_is_not_tried_again_every_few_seconds() {
        let status = |code: u16| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: "refused".into(),
                ..Default::default()
            }))
        };
        let api = |code: u16| Error::Kube(status(code));
        let template = Error::ClaimTemplate {
            note: "the API server refused the ResourceClaimTemplate t".into(),
            source: status(422),
        };
        assert_eq!(retry_after(&template), FINAL_RETRY);
        let cause = std::error::Error::source(&template).map(ToString::to_string);
        assert!(
            cause.as_deref().is_some_and(|c| c.contains("refused")),
            "{cause:?}"
        );
        assert_eq!(retry_after(&api(403)), FINAL_RETRY);
        assert_eq!(retry_after(&api(409)), RETRY);
        assert_eq!(retry_after(&api(503)), RETRY);
        assert_eq!(retry_after(&Error::FabricKey("made again".into())), RETRY);
    }

    #[test]
    fn a_trimmed_slice_keeps_what_the_allocation_decision_reads() {
        use crate::decide::reconcile::allocation::{DEFAULT_DRIVER, DraInventory, tests as dra};
        use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
        let mut d = dra::device("gpu-0", Some("GPU-0"), Some("gpu"));
        let attrs = d.attributes.as_mut().unwrap();
        attrs.insert(
            "productName".into(),
            DeviceAttribute {
                string: Some("NVIDIA H200".into()),
                ..Default::default()
            },
        );
        d.capacity = Some(
            [(
                "memory".to_string(),
                DeviceCapacity {
                    value: Quantity("141Gi".into()),
                    request_policy: None,
                },
            )]
            .into(),
        );
        let mut slice = dra::slice(DEFAULT_DRIVER, "node-a", "node-a", 1, vec![d]);
        slice.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        let before = DraInventory::from_slices(DEFAULT_DRIVER, [&slice]);
        trim_slice(&mut slice);
        assert_eq!(DraInventory::from_slices(DEFAULT_DRIVER, [&slice]), before);
        let kept = &slice.spec.devices.as_ref().unwrap()[0];
        assert!(kept.capacity.is_none() && slice.metadata.labels.is_none());
        let names: Vec<&String> = kept.attributes.as_ref().unwrap().keys().collect();
        assert_eq!(names, ["type", "uuid"]);
    }

    #[test]
    fn a_trimmed_node_selects_as_before() {
        let mut nodes = vec![
            crate::decide::selection::tests::node(
                "gpu-a",
                8,
                &[("nvidia.com/gpu.present", "true")],
                false,
            ),
            crate::decide::selection::tests::node(
                "gpu-b",
                8,
                &[("nvidia.com/gpu.present", "true")],
                true,
            ),
            crate::decide::selection::tests::node("cpu-c", 0, &[], false),
        ];
        for n in &mut nodes {
            n.metadata.annotations = Some([("big".to_string(), "x".repeat(2000))].into());
            let s = n.status.get_or_insert_with(Default::default);
            let mut capacity = s.allocatable.clone().unwrap_or_default();
            capacity.insert("memory".into(), Quantity("2Ti".into()));
            s.capacity = Some(capacity);
        }
        let spec = crate::decide::selection::tests::spec();
        let before = crate::decide::selection::select(&spec, &nodes);
        let expected = |nodes: &[Node]| {
            nodes
                .iter()
                .map(|n| crate::decide::expected::expected_gpus(&spec, Some(n)))
                .collect::<Vec<_>>()
        };
        let expected_before = expected(&nodes);
        assert!(
            expected_before[0].is_some(),
            "gpu-a's count comes from its capacity"
        );
        nodes.iter_mut().for_each(trim_node);
        assert_eq!(crate::decide::selection::select(&spec, &nodes), before);
        assert_eq!(
            expected(&nodes),
            expected_before,
            "the expected GPU count reads the capacity"
        );
        assert!(nodes.iter().all(|n| n.metadata.annotations.is_none()));
        let capacity = nodes[0].status.as_ref().and_then(|s| s.capacity.clone());
        assert_eq!(
            capacity.map(|c| c.into_keys().collect::<Vec<_>>()),
            Some(vec![gpuval_crds::GPU_RESOURCE.to_string()]),
            "only the GPU capacity stays"
        );
    }
}
