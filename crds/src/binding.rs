//! A node result's binding: the run and the agent pod it belongs to.
//!
//! The operator creates each agent pod's `GpuNodeResult` itself, right after the pod (it then
//! knows the pod's uid), bound to the run and to that pod ([`Binding::result`]): owned by the
//! validation, labelled with the validation, node and generation, annotated with the node, the
//! validation's uid and the pod's name and uid. An agent never creates a result: it writes its
//! report into the one result bound to its own pod and may change nothing else on it. The
//! chart's `…-agent-own-node` admission policy holds that for every name length: the keys an
//! agent may write are [`AGENT_LABELS`], [`REPORT_ANNOTATIONS`] and [`FABRIC_ANNOTATIONS`], and
//! once its report (the status) is stored, only the fabric ones. So a validation has at most one
//! result a node, and no token of another run's pod can write it.
//!
//! Readers count a result only for the run it is bound to and never a closed one
//! ([`counts_for`]): where a node's line became final without its result (out of time, its pod
//! failed, was deleted or replaced), the operator closes the result ([`labels::CLOSED`]), which
//! keeps a late report for the record and out of every verdict.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::labels;
use crate::result::{GpuNodeResult, GpuNodeResultSpec, result_name};

/// The labels an agent may set on its result, until its report is stored.
pub const AGENT_LABELS: [&str; 3] = [labels::VERDICT, labels::ACTION, labels::SIMULATED];
/// The annotations of an agent's report, which it may set until its report is stored.
pub const REPORT_ANNOTATIONS: [&str; 3] = [labels::SUMMARY, labels::CODES, labels::VERSIONS];
/// The annotations an agent writes during the fabric test, also after its report is stored.
pub const FABRIC_ANNOTATIONS: [&str; 2] = [labels::FABRIC_OUTCOMES, labels::FABRIC_PORTS];

/// Which run and pod a result is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The uid of the validation (its owner).
    pub validation_uid: String,
    /// The validation generation the pod was made for.
    pub generation: i64,
    /// The node (its full name).
    pub node: String,
    /// The agent pod's name and uid: the one pod whose token may write the report.
    pub pod: String,
    pub pod_uid: String,
}

impl Binding {
    /// The binding of a result with metadata `meta`; None when any part is missing (a result
    /// the operator did not create).
    pub fn of(meta: &ObjectMeta) -> Option<Binding> {
        let ann = meta.annotations.as_ref()?;
        let get = |k: &str| ann.get(k).filter(|v| !v.is_empty()).cloned();
        Some(Binding {
            validation_uid: get(labels::VALIDATION_UID)?,
            generation: meta
                .labels
                .as_ref()?
                .get(labels::GENERATION)?
                .parse()
                .ok()?,
            node: get(labels::NODE)?,
            pod: get(labels::POD)?,
            pod_uid: get(labels::POD_UID)?,
        })
    }

    /// True when this binding is to the run of `generation` of the validation with `uid`.
    pub fn is_run(&self, uid: &str, generation: i64) -> bool {
        self.validation_uid == uid && self.generation == generation
    }

    /// The labels of a result so bound (validation `validation`).
    pub fn labels(&self, validation: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::VALIDATION.into(), labels::node_value(validation)),
            (labels::NODE.into(), labels::node_value(&self.node)),
            (labels::GENERATION.into(), self.generation.to_string()),
            (labels::MANAGED_BY_KEY.into(), labels::MANAGED_BY.into()),
        ])
    }

    /// The annotations of a result so bound.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::NODE.into(), self.node.clone()),
            (labels::VALIDATION_UID.into(), self.validation_uid.clone()),
            (labels::POD.into(), self.pod.clone()),
            (labels::POD_UID.into(), self.pod_uid.clone()),
        ])
    }

    /// The result the operator creates for this binding of validation `validation` in
    /// `namespace`: named for the validation and node ([`result_name`]), owned by the
    /// validation, without a report.
    pub fn result(&self, validation: &str, namespace: &str) -> GpuNodeResult {
        let owner = OwnerReference {
            api_version: format!("{}/{}", crate::GROUP, crate::VERSION),
            kind: "GpuValidation".into(),
            name: validation.into(),
            uid: self.validation_uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        GpuNodeResult {
            metadata: ObjectMeta {
                name: Some(result_name(validation, &self.node)),
                namespace: Some(namespace.into()),
                labels: Some(self.labels(validation)),
                annotations: Some(self.annotations()),
                owner_references: Some(vec![owner]),
                ..Default::default()
            },
            spec: GpuNodeResultSpec {
                validation: validation.into(),
                generation: self.generation,
                node_name: self.node.clone(),
            },
            status: None,
        }
    }
}

/// The node an agent pod or a result was made for: its annotation (the full name), else its
/// label (the short form).
pub fn node_of(meta: &ObjectMeta) -> Option<&str> {
    let annotated = meta.annotations.as_ref().and_then(|a| a.get(labels::NODE));
    let labelled = || meta.labels.as_ref().and_then(|l| l.get(labels::NODE));
    annotated.or_else(labelled).map(String::as_str)
}

/// Why a result is closed (its [`labels::CLOSED`] annotation), if it is.
pub fn closed(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(labels::CLOSED)
        .map(String::as_str)
}

/// True when a result with metadata `meta` may count for the validation with `uid`: it is
/// owned by that validation, bound to it ([`Binding::of`]) and not [`closed`].
pub fn counts_for(meta: &ObjectMeta, uid: &str) -> bool {
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "GpuValidation" && o.uid == uid);
    let bound = Binding::of(meta).is_some_and(|b| b.validation_uid == uid);
    owned && bound && closed(meta).is_none()
}

/// Why a result's stored report does not count ([`check_report`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unchecked {
    /// Its status is empty: whatever its labels or `managedFields` say, no report is stored.
    #[error("no report is stored (the status is empty)")]
    NoReport,
    /// The operator did not bind it to a run and a pod.
    #[error("it is not bound to a run and an agent pod")]
    Unbound,
    /// The report, or the result's spec, is about another node than its binding.
    #[error("its report is about node {reported}, its binding names node {bound}")]
    OtherNode { reported: String, bound: String },
    /// A label or annotation beside the report says something else than the report.
    #[error("its {what} says {beside:?}, its report {report:?}")]
    Differs {
        what: &'static str,
        beside: String,
        report: String,
    },
}

/// Checks the report stored in `result` (read whole, status included): there is one, the
/// result is bound ([`Binding::of`]) to the node the report and the spec name, and the verdict,
/// action, simulated flag and codes its agent put beside it (what the operator's caches read)
/// are the report's own. The admission policy keeps a stored report and those labels from
/// changing, so a result that passes this once counts as it is.
pub fn check_report(result: &GpuNodeResult) -> Result<(), Unchecked> {
    let report = result.status.as_ref().ok_or(Unchecked::NoReport)?;
    let bound = Binding::of(&result.metadata).ok_or(Unchecked::Unbound)?;
    let reported = report.node.as_deref().unwrap_or(&bound.node);
    for about in [reported, result.spec.node_name.as_str()] {
        if about != bound.node {
            return Err(Unchecked::OtherNode {
                reported: about.to_string(),
                bound: bound.node.clone(),
            });
        }
    }
    let label = |k: &str| {
        result
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .cloned()
            .unwrap_or_default()
    };
    let annotation = |k: &str| {
        result
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .cloned()
            .unwrap_or_default()
    };
    let simulated = if report.simulated { "true" } else { "" };
    let beside = [
        (
            "verdict label",
            label(labels::VERDICT),
            report.verdict.as_str().to_string(),
        ),
        (
            "action label",
            label(labels::ACTION),
            report.action.as_str().to_string(),
        ),
        (
            "simulated label",
            label(labels::SIMULATED).replace("false", ""),
            simulated.to_string(),
        ),
        (
            "codes annotation",
            annotation(labels::CODES),
            report.codes(),
        ),
    ];
    match beside.into_iter().find(|(_, b, r)| b != r) {
        Some((what, beside, report)) => Err(Unchecked::Differs {
            what,
            beside,
            report,
        }),
        None => Ok(()),
    }
}

/// When the operator checked the report of a result with metadata `meta`
/// ([`labels::REPORT_CHECKED`]); None when it has not (or the time does not parse).
pub fn report_checked(meta: &ObjectMeta) -> Option<k8s_openapi::jiff::Timestamp> {
    meta.annotations
        .as_ref()?
        .get(labels::REPORT_CHECKED)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> Binding {
        Binding {
            validation_uid: "v-uid".into(),
            generation: 2,
            node: "gpu-0".into(),
            pod: "gpuval-quick-gpu-0-5-g2".into(),
            pod_uid: "p-uid".into(),
        }
    }

    #[test]
    fn a_result_the_operator_creates_reads_back_as_its_binding() {
        let r = binding().result("quick", "gpuval-system");
        assert_eq!(r.metadata.name.as_deref(), Some("quick-gpu-0-5"));
        assert_eq!(Binding::of(&r.metadata), Some(binding()));
        assert!(r.status.is_none(), "no report until the agent writes one");
        assert_eq!(r.spec.generation, 2);
        let owner = &r.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("GpuValidation", "v-uid")
        );
        assert!(binding().is_run("v-uid", 2));
        assert!(!binding().is_run("v-uid", 3));
        assert!(!binding().is_run("other", 2));
    }

    #[test]
    fn a_result_missing_any_part_of_its_binding_has_none() {
        for key in [
            labels::VALIDATION_UID,
            labels::POD,
            labels::POD_UID,
            labels::NODE,
        ] {
            let mut r = binding().result("quick", "ns");
            r.metadata
                .annotations
                .as_mut()
                .expect("annotations")
                .remove(key);
            assert_eq!(Binding::of(&r.metadata), None, "without {key}");
            let mut empty = binding().result("quick", "ns");
            empty
                .metadata
                .annotations
                .as_mut()
                .expect("annotations")
                .insert(key.into(), String::new());
            assert_eq!(Binding::of(&empty.metadata), None, "{key} empty");
        }
        let mut r = binding().result("quick", "ns");
        r.metadata.labels = None;
        assert_eq!(Binding::of(&r.metadata), None, "without its generation");
    }

    #[test]
    fn only_a_bound_open_result_of_the_validation_counts() {
        let r = binding().result("quick", "ns");
        assert!(counts_for(&r.metadata, "v-uid"));
        assert!(!counts_for(&r.metadata, "a-recreated-validation"));
        let mut closed_one = r.clone();
        closed_one
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(labels::CLOSED.into(), "DeadlineExceeded".into());
        assert_eq!(closed(&closed_one.metadata), Some("DeadlineExceeded"));
        assert!(!counts_for(&closed_one.metadata, "v-uid"));
        // Bound to the validation by annotation but owned by another object: no.
        let mut foreign = r.clone();
        foreign.metadata.owner_references = None;
        assert!(!counts_for(&foreign.metadata, "v-uid"));
        // Owned, but bound to another run.
        let mut other = r;
        other
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(labels::VALIDATION_UID.into(), "other".into());
        assert!(!counts_for(&other.metadata, "v-uid"));
    }

    #[test]
    fn agents_write_only_their_report_and_never_a_binding_key() {
        let b = binding();
        let bound: Vec<String> = b
            .labels("quick")
            .into_keys()
            .chain(b.annotations().into_keys())
            .collect();
        let writable: Vec<&str> = AGENT_LABELS
            .iter()
            .chain(&REPORT_ANNOTATIONS)
            .chain(&FABRIC_ANNOTATIONS)
            .copied()
            .collect();
        for key in &bound {
            assert!(!writable.contains(&key.as_str()), "{key} is a binding key");
        }
        assert!(!writable.contains(&labels::CLOSED));
    }
    fn reported(verdict: crate::Verdict) -> GpuNodeResult {
        let mut r = binding().result("quick", "ns");
        let report = crate::NodeReport {
            node: Some("gpu-0".into()),
            verdict,
            ..Default::default()
        };
        let labels = r.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(labels::VERDICT.into(), verdict.as_str().into());
        labels.insert(labels::ACTION.into(), report.action.as_str().into());
        r.status = Some(report);
        r
    }

    #[test]
    fn only_a_stored_report_that_agrees_with_its_labels_and_binding_checks() {
        let ok = reported(crate::Verdict::Pass);
        assert_eq!(check_report(&ok), Ok(()));
        let mut bare = ok.clone();
        bare.status = None;
        assert_eq!(check_report(&bare), Err(Unchecked::NoReport));
        let mut elsewhere = ok.clone();
        if let Some(r) = elsewhere.status.as_mut() {
            r.node = Some("gpu-9".into());
        }
        assert!(matches!(
            check_report(&elsewhere),
            Err(Unchecked::OtherNode { .. })
        ));
        let mut relabelled = reported(crate::Verdict::Fail);
        relabelled
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::VERDICT.into(), "Pass".into());
        let refused = check_report(&relabelled);
        assert!(
            matches!(&refused, Err(Unchecked::Differs { what, .. }) if what.contains("verdict")),
            "{refused:?}"
        );
        let mut unbound = ok;
        unbound.metadata.annotations = None;
        assert_eq!(check_report(&unbound), Err(Unchecked::Unbound));
    }

    #[test]
    fn a_check_time_is_read_from_the_operators_annotation_only() {
        let mut meta = binding().result("quick", "ns").metadata;
        assert_eq!(report_checked(&meta), None);
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::REPORT_CHECKED.into(), "2026-12-07T05:00:00Z".into());
        assert!(report_checked(&meta).is_some());
    }
}
