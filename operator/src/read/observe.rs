//! The shell's read side: this validation's pods, results and the cluster's nodes, from the
//! reflector stores (no API calls), reduced to the [`World`] the reconcile steps decide on:
//! everything of one validation ([`observe`]), or only what changed since its last reconcile
//! ([`news`], looked up by name: work for the news, not for the cluster). Pod phases and
//! failure reasons are parsed once, in [`crate::decide::pod_reading`].

use gpuval_crds::result_meta::ReportMeta;
use gpuval_crds::{GpuNodeResult, GpuValidation, labels};
use kube::Resource;
use kube::api::{ObjectMeta, PartialObjectMeta, ResourceExt};
use kube::runtime::reflector::{ObjectRef, Store};

use std::collections::BTreeSet;

use crate::caches::pod_views::PodIdentity;
use crate::caches::runs::Changed;
use crate::context::Ctx;
use crate::decide::reconcile::freshness::{self, Claim, PodId, Run};
use crate::decide::reconcile::{News, ResultView, RoundView, World};

/// True when `meta` names the validation with `uid` among its owners.
pub fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    let kind = GpuValidation::kind(&());
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == kind && o.uid == uid)
}

/// The validation that owns the object with `meta`, if any.
pub fn owner_ref_of(meta: &ObjectMeta) -> Option<ObjectRef<GpuValidation>> {
    let kind = GpuValidation::kind(&());
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == kind)
        .map(|o| ObjectRef::new(&o.name))
}

pub use gpuval_crds::binding::node_of;

/// A node result as the steps see it (from its labels and annotations only). An unknown
/// verdict label counts as Error; None for a result without the labels the agent sets.
pub fn result_view(r: &PartialObjectMeta<GpuNodeResult>) -> Option<ResultView> {
    let labels = r.metadata.labels.as_ref()?;
    let ann = r.metadata.annotations.as_ref();
    let report = ReportMeta::read(Some(labels), ann)?;
    Some(ResultView {
        name: r.name_any(),
        node: ann
            .and_then(|a| a.get(labels::NODE))
            .or_else(|| labels.get(labels::NODE))
            .cloned()?,
        generation: labels.get(labels::GENERATION)?.parse().ok()?,
        verdict: report.verdict,
        summary: report.summary.clone(),
        fabric: ann
            .and_then(|a| a.get(labels::FABRIC_OUTCOMES))
            .map(|s| fabric_outcomes(&r.name_any(), s))
            .unwrap_or_default(),
        ports: ann
            .and_then(|a| a.get(labels::FABRIC_PORTS))
            .and_then(|s| fabric_ports(&r.name_any(), s)),
        facts: crate::decide::reconcile::fleet::result_facts(&report),
    })
}

/// A result's fabric outcomes; an unreadable annotation counts as none (logged): the planner
/// then treats the node as not having reported, which its round timeout settles.
fn fabric_outcomes(result: &str, annotation: &str) -> Vec<gpuval_crds::fabric::FabricOutcome> {
    gpuval_crds::fabric::parse_outcomes(annotation).unwrap_or_else(|e| {
        tracing::warn!(result, error = %e, "ignoring the fabric outcomes annotation");
        Vec::new()
    })
}

/// A result's ports report; an unreadable annotation counts as none (logged).
fn fabric_ports(result: &str, annotation: &str) -> Option<gpuval_crds::fabric_ports::PortsReport> {
    gpuval_crds::fabric_ports::parse_ports(annotation)
        .inspect_err(|e| tracing::warn!(result, error = %e, "ignoring the fabric ports annotation"))
        .ok()
}

/// True when a result's managed fields say some writer stored its status subresource (the agent
/// applies the object, then the report). A hint of where to look only, since a writer can set
/// its own `managedFields`: a result counts once its report is checked ([`reported_at`]).
/// Read from the managed fields the result cache keeps ([`crate::caches::stores::trim_result`]).
pub fn has_report(meta: &ObjectMeta) -> bool {
    meta.managed_fields
        .iter()
        .flatten()
        .any(|f| f.subresource.as_deref() == Some("status"))
}

/// When the operator checked a result's stored report ([`gpuval_crds::binding::report_checked`]);
/// None while it has not. Only a checked result counts, dated by this time: nothing a writer
/// sets about itself (`managedFields` and their times, labels) makes a result count or dates
/// it.
pub fn reported_at(meta: &ObjectMeta) -> Option<k8s_openapi::jiff::Timestamp> {
    gpuval_crds::binding::report_checked(meta)
}

/// The pod a result is bound to as its writer (`gpuval.io/pod-uid`, `gpuval.io/pod`).
pub fn writer_of(meta: &ObjectMeta) -> Option<PodId<'_>> {
    let ann = meta.annotations.as_ref()?;
    Some(PodId {
        name: ann.get(labels::POD)?,
        uid: ann.get(labels::POD_UID).map(String::as_str),
    })
}

/// What a result with metadata `meta` and view `view` claims of its run and writer.
fn claim_of<'a>(view: &ResultView, meta: &'a ObjectMeta) -> Claim<'a> {
    Claim {
        generation: view.generation,
        validation_uid: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(labels::VALIDATION_UID))
            .map(String::as_str),
        writer: writer_of(meta),
        closed: gpuval_crds::binding::closed(meta).is_some(),
    }
}

/// The results of validation `uid` that may decide their node's verdict in the run of
/// `generation` (see [`freshness`]); results of other generations are kept (the steps ignore
/// and delete them), results of this generation that are not bound to this run and the node's
/// current pod, or are closed, are left out.
fn counted_results(ctx: &Ctx, uid: &str, generation: i64) -> Vec<ResultView> {
    let current = ctx.pods.current_by_node(uid, generation);
    let run = Run { uid, generation };
    owned_views(&ctx.results, uid, |r| {
        let view = result_view(r)?;
        let current = current.get(&view.node).map(pod_id);
        counted(view, &r.metadata, run, current)
    })
}

/// A held pod's identity as the freshness rule takes it.
fn pod_id(p: &PodIdentity) -> PodId<'_> {
    PodId {
        name: &p.name,
        uid: p.uid.as_deref(),
    }
}

/// `view` of a result with metadata `meta`, unless `run` must not count it: of its generation
/// but not bound to it and the node's `current` pod, closed, or without a report (see
/// [`freshness`]).
fn counted(
    view: ResultView,
    meta: &ObjectMeta,
    run: Run<'_>,
    current: Option<PodId<'_>>,
) -> Option<ResultView> {
    match freshness::judge(claim_of(&view, meta), run, current) {
        freshness::Freshness::Current if reported_at(meta).is_none() => {
            tracing::debug!(result = %view.name, "ignoring a result without a checked report (yet)");
            None
        }
        freshness::Freshness::Current | freshness::Freshness::OtherGeneration { .. } => Some(view),
        not => {
            tracing::debug!(result = %view.name, why = ?not, "ignoring a result that is not this run's current pod's");
            None
        }
    }
}

/// A result of the news, judged as [`counted_results`] judges it, its node's current pod
/// looked up by name.
fn counted_by_name(
    ctx: &Ctx,
    validation: &str,
    run: Run<'_>,
    r: &PartialObjectMeta<GpuNodeResult>,
) -> Option<ResultView> {
    let view = result_view(r)?;
    let pod_name = crate::decide::pod::pod_name(validation, &view.node, run.generation);
    let pod = ctx.pods.identity(&pod_name);
    counted(view, &r.metadata, run, pod.as_ref().map(pod_id))
}

/// Observes the cluster for one validation (from the stores; no API calls).
pub fn observe(gv: &GpuValidation, ctx: &Ctx) -> World {
    let uid = gv.metadata.uid.as_deref().unwrap_or_default();
    let generation = gv.metadata.generation.unwrap_or(0);
    World {
        nodes: ctx.nodes.state().iter().map(|n| n.name_any()).collect(),
        pods: ctx.pods.owned_by(uid),
        results: counted_results(ctx, uid, generation),
        rounds: owned_views(&ctx.rounds, uid, |r| Some(RoundView::from(&r.spec))),
        fabric_port: ctx.cfg.fabric.port,
        pending_limit: ctx.cfg.agent_pending_limit,
    }
}

/// The news for validation `gv`: for each node in `changed`, whether it exists, its agent pod
/// of this generation and its result (by their names); the pods and results `changed` names;
/// and all of the validation's fabric rounds. Store look-ups by name: the cost follows the
/// news, not the cluster.
pub fn news(gv: &GpuValidation, ctx: &Ctx, changed: Changed) -> News {
    let uid = gv.metadata.uid.as_deref().unwrap_or_default();
    let name = gv.name_any();
    let generation = gv.metadata.generation.unwrap_or(0);
    let Changed {
        nodes,
        mut pods,
        mut results,
    } = changed;
    for node in &nodes {
        pods.insert(crate::decide::pod::pod_name(&name, node, generation));
        results.insert(gpuval_crds::result::result_name(&name, node));
    }
    let ns = ctx.cfg.namespace.as_str();
    let world = World {
        nodes: nodes
            .iter()
            .filter(|n| ctx.nodes.get(&ObjectRef::new(n)).is_some())
            .cloned()
            .collect(),
        pods: pods.iter().filter_map(|p| ctx.pods.get(p, uid)).collect(),
        results: named_views(&ctx.results, ns, uid, &results, |r| {
            counted_by_name(ctx, &name, Run { uid, generation }, r)
        }),
        rounds: owned_views(&ctx.rounds, uid, |r| Some(RoundView::from(&r.spec))),
        fabric_port: ctx.cfg.fabric.port,
        pending_limit: ctx.cfg.agent_pending_limit,
    };
    News { nodes, world }
}

/// The views of the objects in `store` named `names` in namespace `ns` that `uid` owns.
fn named_views<K, V>(
    store: &Store<K>,
    ns: &str,
    uid: &str,
    names: &BTreeSet<String>,
    view: impl Fn(&K) -> Option<V>,
) -> Vec<V>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    names
        .iter()
        .filter_map(|n| store.get(&ObjectRef::new(n).within(ns)))
        .filter(|o| owned_by(o.meta(), uid))
        .filter_map(|o| view(&o))
        .collect()
}

/// The views of the objects in `store` owned by `uid` (objects `view` cannot read are left out).
fn owned_views<K, V>(store: &Store<K>, uid: &str, view: impl Fn(&K) -> Option<V>) -> Vec<V>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .state()
        .iter()
        .filter(|o| owned_by(o.meta(), uid))
        .filter_map(|o| view(o))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::Verdict;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use kube::core::PartialObjectMetaExt;
    use std::collections::BTreeMap;

    fn result_meta(verdict: &str) -> PartialObjectMeta<GpuNodeResult> {
        ObjectMeta {
            name: Some("v-gpu-0".into()),
            labels: Some(BTreeMap::from([
                (labels::GENERATION.to_string(), "2".to_string()),
                (labels::NODE.to_string(), "gpu-0".to_string()),
                (labels::VERDICT.to_string(), verdict.to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                labels::SUMMARY.to_string(),
                "GPU3 memory: 2 mismatched words".to_string(),
            )])),
            ..Default::default()
        }
        .into_response_partial()
    }

    #[test]
    fn a_result_gives_its_verdict_and_summary() {
        let v = result_view(&result_meta("Warn")).unwrap();
        assert_eq!(v.verdict, Verdict::Warn);
        assert_eq!(v.node, "gpu-0");
        assert_eq!(v.generation, 2);
        assert_eq!(v.summary, "GPU3 memory: 2 mismatched words");
        let odd = result_view(&result_meta("Great")).unwrap();
        assert_eq!(odd.verdict, Verdict::Error, "an unknown verdict is no pass");
    }

    #[test]
    fn a_results_writer_is_its_pod_uid_and_name() {
        let mut meta = result_meta("Pass").metadata;
        assert_eq!(writer_of(&meta), None, "a result that names no pod");
        let ann = meta.annotations.get_or_insert_with(BTreeMap::new);
        ann.insert(labels::POD.into(), "gpuval-v-gpu-0-g2".into());
        assert_eq!(
            writer_of(&meta),
            Some(PodId {
                name: "gpuval-v-gpu-0-g2",
                uid: None
            })
        );
        let ann = meta.annotations.get_or_insert_with(BTreeMap::new);
        ann.insert(labels::POD_UID.into(), "u-9".into());
        assert_eq!(writer_of(&meta).and_then(|w| w.uid), Some("u-9"));
    }

    #[test]
    fn ownership_is_by_validation_kind_and_uid() {
        let owner = |kind: &str, uid: &str| ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: GpuValidation::api_version(&()).into_owned(),
                kind: kind.into(),
                name: "v".into(),
                uid: uid.into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(owned_by(&owner("GpuValidation", "u1"), "u1"));
        assert!(!owned_by(&owner("GpuValidation", "u2"), "u1"));
        assert!(!owned_by(&owner("Job", "u1"), "u1"));
        assert_eq!(
            owner_ref_of(&owner("GpuValidation", "u1")),
            Some(ObjectRef::new("v"))
        );
        assert_eq!(owner_ref_of(&owner("Job", "u1")), None);
    }
}
