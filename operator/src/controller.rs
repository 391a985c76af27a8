//! The shell around [`crate::plan`]: reads the cluster from reflector stores, applies the plan
//! (pods, results, status through server-side apply, events, node actions).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use gpuval_crds::{GpuNodeResult, GpuValidation, NodeAction, NodeVerdict, Phase, Verdict, labels};
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, DeleteParams, PartialObjectMeta, Patch, PatchParams, PostParams, ResourceExt,
};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};

use crate::config::OperatorConfig;
use crate::metrics::{ErrorLabels, Metrics, PhaseLabels, VerdictLabels};
use crate::plan::{self, PodView, ResultView, Step, World};
use crate::{pod, selection};

pub const FIELD_MANAGER: &str = "gpuval-operator";
const MANAGED: &str = "app.kubernetes.io/managed-by=gpuval-operator";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("serialising status: {0}")]
    Serde(#[from] serde_json::Error),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "client",
            Error::Serde(_) => "serde",
        }
    }
}

/// What every reconcile needs.
pub struct Ctx {
    pub client: Client,
    pub cfg: OperatorConfig,
    pub pods: Store<Pod>,
    pub results: Store<PartialObjectMeta<GpuNodeResult>>,
    pub nodes: Store<Node>,
    pub validations: Store<GpuValidation>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
}

fn owned_by(meta: &kube::api::ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "GpuValidation" && o.uid == uid)
}

fn owner_ref_of(meta: &kube::api::ObjectMeta) -> Option<ObjectRef<GpuValidation>> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "GpuValidation")
        .map(|o| ObjectRef::new(&o.name))
}

/// A pod as the plan sees it: phase, and why it failed or is stuck, in words.
fn pod_view(p: &Pod) -> Option<PodView> {
    let labels = p.metadata.labels.as_ref()?;
    let generation = labels.get(labels::GENERATION)?.parse().ok()?;
    let node = p
        .annotations()
        .get(labels::NODE)
        .cloned()
        .or_else(|| labels.get(labels::NODE).cloned())?;
    let status = p.status.as_ref();
    let mut phase = status
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    let cs = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first());
    let terminated = cs
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    let waiting = cs
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref());
    let mut reason = None;
    if let Some(t) = terminated {
        reason = Some(format!(
            "{} (exit code {}){}",
            t.reason.as_deref().unwrap_or("terminated"),
            t.exit_code,
            t.message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        ));
    }
    if let Some(r) = status.and_then(|s| s.reason.as_deref()) {
        let msg = status.and_then(|s| s.message.as_deref()).unwrap_or("");
        reason = Some(format!("{r}: {msg}"));
    }
    if let Some(w) = waiting {
        let r = w.reason.as_deref().unwrap_or("");
        if matches!(
            r,
            "ErrImagePull"
                | "ImagePullBackOff"
                | "InvalidImageName"
                | "CreateContainerConfigError"
                | "CreateContainerError"
        ) {
            phase = "Failed".into();
            reason = Some(format!("{r}: {}", w.message.as_deref().unwrap_or("")));
        }
    }
    if phase == "Pending" && reason.is_none() {
        reason = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
            .map(|c| {
                format!(
                    "{}: {}",
                    c.reason.as_deref().unwrap_or("Unschedulable"),
                    c.message.as_deref().unwrap_or("")
                )
            });
    }
    Some(PodView {
        name: p.name_any(),
        node,
        generation,
        phase,
        reason,
        deleting: p.metadata.deletion_timestamp.is_some(),
        finished_at: terminated.and_then(|t| t.finished_at.as_ref()).map(|t| t.0),
    })
}

fn result_view(r: &PartialObjectMeta<GpuNodeResult>) -> Option<ResultView> {
    let labels = r.metadata.labels.as_ref()?;
    let verdict = match labels.get(labels::VERDICT)?.as_str() {
        "Pass" => Verdict::Pass,
        "Warn" => Verdict::Warn,
        "Fail" => Verdict::Fail,
        "Skipped" => Verdict::Skipped,
        _ => Verdict::Error,
    };
    let ann = r.metadata.annotations.as_ref();
    Some(ResultView {
        name: r.name_any(),
        node: ann
            .and_then(|a| a.get(labels::NODE))
            .or_else(|| labels.get(labels::NODE))
            .cloned()?,
        generation: labels.get(labels::GENERATION)?.parse().ok()?,
        verdict,
        summary: ann
            .and_then(|a| a.get(labels::SUMMARY))
            .cloned()
            .unwrap_or_default(),
    })
}

/// Observes the cluster for one validation (from the stores; no API calls).
pub fn observe(gv: &GpuValidation, ctx: &Ctx) -> World {
    let uid = gv.metadata.uid.clone().unwrap_or_default();
    World {
        now: Some(Timestamp::now()),
        nodes: ctx
            .nodes
            .state()
            .iter()
            .map(|n| n.name_any())
            .collect::<BTreeSet<_>>(),
        pods: ctx
            .pods
            .state()
            .iter()
            .filter(|p| owned_by(&p.metadata, &uid))
            .filter_map(|p| pod_view(p))
            .collect(),
        results: ctx
            .results
            .state()
            .iter()
            .filter(|r| owned_by(&r.metadata, &uid))
            .filter_map(|r| result_view(r))
            .collect(),
    }
}

async fn reconcile(gv: Arc<GpuValidation>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let name = gv.name_any();
    let world = observe(&gv, &ctx);
    let step = plan::next(&gv, &world, || {
        let nodes: Vec<Node> = ctx.nodes.state().iter().map(|n| (**n).clone()).collect();
        selection::select(&gv.spec, &nodes)
    });
    tracing::debug!(validation = %name, create = step.create_pods.len(), delete = step.delete_pods.len(), "reconcile");
    apply(&gv, &ctx, &step).await?;
    update_phase_gauge(&ctx);
    Ok(step
        .requeue_after
        .map(Action::requeue)
        .unwrap_or_else(|| Action::requeue(Duration::from_secs(600))))
}

async fn apply(gv: &GpuValidation, ctx: &Ctx, step: &Step) -> Result<(), Error> {
    let name = gv.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);
    let results: Api<GpuNodeResult> = Api::namespaced(ctx.client.clone(), &ctx.cfg.namespace);

    for p in &step.delete_pods {
        ignore_not_found(
            pods.delete(p, &DeleteParams::background())
                .await
                .map(|_| ()),
        )?;
    }
    for r in &step.delete_results {
        ignore_not_found(
            results
                .delete(r, &DeleteParams::background())
                .await
                .map(|_| ()),
        )?;
    }
    let to_create: Vec<Pod> = step
        .create_pods
        .iter()
        .map(|(node, gpus)| pod::agent_pod(gv, node, *gpus, &ctx.cfg))
        .collect();
    let created = futures::stream::iter(to_create.into_iter().map(|pod| {
        let pods = pods.clone();
        async move {
            let pp = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            match pods.create(&pp, &pod).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<_>>()
    .await;
    for c in created {
        if c? {
            ctx.metrics.pods_created.inc();
        }
    }

    if gv.status.as_ref() != Some(&step.status) {
        let body = serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1",
            "kind": "GpuValidation",
            "status": step.status,
        });
        let api: Api<GpuValidation> = Api::all(ctx.client.clone());
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        let before: Vec<NodeVerdict> = gv
            .status
            .iter()
            .flat_map(|s| s.nodes.iter().map(|n| n.verdict))
            .collect();
        for n in &step.status.nodes {
            if n.verdict.is_final()
                && !before.is_empty()
                && !gv
                    .status
                    .iter()
                    .flat_map(|s| &s.nodes)
                    .any(|o| o.name == n.name && o.verdict == n.verdict)
            {
                ctx.metrics
                    .node_verdicts
                    .get_or_create(&VerdictLabels {
                        verdict: format!("{:?}", n.verdict),
                    })
                    .inc();
            }
        }
    }

    let reference = gv.object_ref(&());
    for e in &step.events {
        let ev = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.into(),
            note: Some(e.note.clone()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(validation = %name, error = %err, "could not publish an event");
        }
    }

    let action = gv
        .spec
        .on_failure
        .as_ref()
        .map(|o| o.action)
        .unwrap_or_default();
    if action != NodeAction::None {
        for node in &step.newly_failed {
            if let Err(err) = mark_node(ctx, node, &name, action).await {
                tracing::warn!(validation = %name, node = %node, error = %err, "could not mark a failed node");
            }
        }
    }
    Ok(())
}

/// Labels or taints a node that failed (`gpuval.io/failed=<validation>`).
async fn mark_node(
    ctx: &Ctx,
    node: &str,
    validation: &str,
    action: NodeAction,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let value = labels::node_value(validation);
    match action {
        NodeAction::None => Ok(()),
        NodeAction::Label => {
            let patch = serde_json::json!({"metadata": {"labels": {labels::FAILED_NODE: value}}});
            nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
        NodeAction::Taint => {
            let current = nodes.get(node).await?;
            let mut taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
            if taints.iter().any(|t| t.key == labels::FAILED_NODE) {
                return Ok(());
            }
            taints.push(Taint {
                key: labels::FAILED_NODE.into(),
                value: Some(value),
                effect: "NoSchedule".into(),
                time_added: None,
            });
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": current.metadata.resource_version},
                "spec": {"taints": taints},
            });
            nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
    }
}

fn ignore_not_found(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    }
}

fn update_phase_gauge(ctx: &Ctx) {
    let mut counts = std::collections::BTreeMap::new();
    for p in [Phase::Pending, Phase::Running, Phase::Passed, Phase::Failed] {
        counts.insert(format!("{p:?}"), 0i64);
    }
    for v in ctx.validations.state() {
        let p = v.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
        *counts.entry(format!("{p:?}")).or_default() += 1;
    }
    for (phase, n) in counts {
        ctx.metrics
            .validations
            .get_or_create(&PhaseLabels { phase })
            .set(n);
    }
}

fn error_policy(gv: Arc<GpuValidation>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            error: err.metric_label().into(),
        })
        .inc();
    tracing::warn!(validation = %gv.name_any(), error = %err, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until `shutdown` resolves. `ready` turns true once every store is filled.
pub async fn run(
    client: Client,
    cfg: OperatorConfig,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = cfg.namespace.clone();
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let result_api: Api<PartialObjectMeta<GpuNodeResult>> = Api::namespaced(client.clone(), &ns);
    let node_api: Api<Node> = Api::all(client.clone());
    let gv_api: Api<GpuValidation> = Api::all(client.clone());

    let (pods, pod_writer) = reflector::store();
    let (results, result_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let pod_stream = watcher(pod_api.clone(), watcher::Config::default().labels(MANAGED))
        .default_backoff()
        .modify(|p| {
            p.managed_fields_mut().clear();
        })
        .reflect(pod_writer)
        .touched_objects();
    let result_stream = watcher(result_api.clone(), watcher::Config::default())
        .default_backoff()
        .modify(|r| {
            r.managed_fields_mut().clear();
        })
        .reflect(result_writer)
        .touched_objects();
    let node_stream = watcher(node_api.clone(), watcher::Config::default())
        .default_backoff()
        .modify(|n| {
            n.managed_fields_mut().clear();
            if let Some(s) = n.status.as_mut() {
                s.images = None;
                s.node_info = None;
                s.conditions = None;
                s.volumes_attached = None;
                s.volumes_in_use = None;
            }
        })
        .reflect(node_writer)
        .touched_objects();

    let controller = Controller::new(gv_api, watcher::Config::default().any_semantic());
    let validations = controller.store();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        cfg: cfg.clone(),
        pods: pods.clone(),
        results: results.clone(),
        nodes: nodes.clone(),
        validations: validations.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        metrics: metrics.clone(),
    });

    let node_validations = validations.clone();
    let controller = controller
        .with_config(
            ControllerConfig::default()
                .concurrency(cfg.concurrency)
                .debounce(Duration::from_millis(200)),
        )
        .watches_stream(pod_stream, |p: Pod| owner_ref_of(&p.metadata))
        .watches_stream(result_stream, |r: PartialObjectMeta<GpuNodeResult>| {
            owner_ref_of(&r.metadata)
        })
        .watches_stream(node_stream, move |_n: Node| {
            node_validations
                .state()
                .into_iter()
                .filter(|v| {
                    !v.status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .is_some_and(Phase::is_terminal)
                })
                .map(|v| ObjectRef::new(&v.name_any()))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown);

    let stores_ready = {
        let (pods, results, nodes) = (pods.clone(), results.clone(), nodes.clone());
        async move {
            let _ = tokio::join!(
                pods.wait_until_ready(),
                results.wait_until_ready(),
                nodes.wait_until_ready()
            );
            ready.store(true, Ordering::Relaxed);
            tracing::info!("caches filled; reconciling");
        }
    };
    tokio::spawn(stores_ready);

    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::trace!(validation = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "controller event"),
            }
        })
        .await;
}
