//! New nodes gated until they pass: the pure decision in [`plan`]; here the shell's part, the
//! views it decides on (from the operator's stores) and the node taint edits it makes.
//!
//! Admission belongs to a `GpuValidationSchedule` with `spec.admission`; the schedule's
//! reconcile (`schedule::shell`) runs it beside the cron plan and creates the admission runs.

pub mod plan;

use std::collections::BTreeMap;

use gpuval_crds::schedule::{Admission, AdmissionTaint};
use gpuval_crds::{Code, GpuValidation, GpuValidationSpec, NodeVerdict, labels};
use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use kube::api::{Api, Patch, PatchParams, ResourceExt};

use crate::config::OperatorConfig;
use crate::controller::Ctx;
use crate::node_state::{Policy, ResultMeta, result_meta};
use crate::selection;
use plan::{AdmissionRun, NodeView, Outcome};

/// `cfg` with a toleration of the default admission taint and of every admission taint key
/// the administrator allows added to agent pods (when it has none for that key), so that
/// agents can run on the nodes they are to admit.
pub fn with_agent_tolerations(mut cfg: OperatorConfig) -> OperatorConfig {
    let keys: Vec<String> = std::iter::once(labels::UNVALIDATED.to_string())
        .chain(cfg.admission_taint_keys.iter().cloned())
        .collect();
    for key in keys {
        if !cfg
            .tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(key.as_str()))
        {
            cfg.tolerations.push(Toleration {
                key: Some(key),
                operator: Some("Exists".into()),
                ..Default::default()
            });
        }
    }
    cfg
}

/// gpuval's own taint keys: admission may remove these without the administrator's list.
pub const OWN_TAINT_PREFIX: &str = "gpuval.io/";

/// Why the operator refuses admission taint `key` (None: it may be used): it is neither
/// gpuval's own (`gpuval.io/...`) nor in the administrator's list `allowed`. Removing it from
/// every node that passes would otherwise remove a taint someone else relies on.
pub fn refuse_taint_key(key: &str, allowed: &[String]) -> Option<String> {
    if key.starts_with(OWN_TAINT_PREFIX) || allowed.iter().any(|k| k == key) {
        return None;
    }
    Some(format!(
        "spec.admission.taint.key {key} is not gpuval's own ({OWN_TAINT_PREFIX}...) and not in the operator's --admission-taint-key list (Helm values operator.admission.allowedTaintKeys); gpuval removes the admission taint from nodes that pass, so use {} or ask the administrator to list {key}",
        labels::UNVALIDATED
    ))
}

/// True when `t` is the admission taint `taint` (key and effect).
fn is_admission_taint(t: &Taint, taint: &AdmissionTaint) -> bool {
    t.key == taint.key && t.effect == taint.effect.as_str()
}

fn has_taint(node: &Node, taint: &AdmissionTaint) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| is_admission_taint(t, taint)))
}

fn has_failed_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == labels::FAILED_NODE))
}

/// Removes the admission taint `taint` (its key with its effect) from `taints`; true when one
/// was there. Taints with that key and another effect are someone else's and stay.
pub fn remove_admission_taint(taints: &mut Vec<Taint>, taint: &AdmissionTaint) -> bool {
    let before = taints.len();
    taints.retain(|t| !is_admission_taint(t, taint));
    taints.len() != before
}

/// The cluster's nodes as admission sees them, for a template and an admission section.
pub fn node_views(
    template: &GpuValidationSpec,
    admission: &Admission,
    nodes: &[Node],
) -> Vec<NodeView> {
    let selected: std::collections::BTreeSet<String> = selection::select(template, nodes)
        .selected
        .into_iter()
        .map(|n| n.name)
        .collect();
    nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            Some(NodeView {
                selected: selected.contains(&name),
                created: n.metadata.creation_timestamp.as_ref()?.0,
                tainted: has_taint(n, &admission.taint),
                failed: has_failed_taint(n),
                has_verdict: n.labels().contains_key(labels::NODE_VERDICT),
                name,
            })
        })
        .collect()
}

/// An admission run as the plan sees it: its nodes, whether it is over, and each node's
/// outcome so far (a node result, or a final line without one).
pub fn run_view(run: &GpuValidation, ctx: &Ctx) -> AdmissionRun {
    let name = run.name_any();
    let policy = Policy::of(&ctx.cfg);
    let mut outcomes = BTreeMap::new();
    for r in ctx.results.state().iter().filter_map(|r| result_meta(r)) {
        if r.validation != labels::node_value(&name) && r.validation != name {
            continue;
        }
        let node = r.node.clone();
        outcomes.insert(node, result_outcome(r, policy));
    }
    let status = run.status.as_ref();
    for line in status.iter().flat_map(|s| s.nodes.iter()) {
        if line.verdict.is_final() && line.verdict != NodeVerdict::Passed {
            let message = line
                .message
                .clone()
                .unwrap_or_else(|| line.verdict.to_string());
            let configuration = line.codes.as_deref().is_some_and(Code::only_configuration);
            outcomes.entry(line.name.clone()).or_insert_with(|| {
                if configuration || !policy.counts(false) {
                    Outcome::NoEvidence(message)
                } else {
                    Outcome::NotPassed(message)
                }
            });
        }
    }
    AdmissionRun {
        name,
        nodes: run.spec.node_names.iter().map(|n| n.0.clone()).collect(),
        finished: status
            .and_then(|s| s.phase)
            .is_some_and(gpuval_crds::Phase::is_terminal),
        outcomes,
    }
}

/// What a node result of an admission run says about its node: nothing when `policy` does not
/// count it (simulated) or its finding is only configuration.
pub fn result_outcome(r: ResultMeta, policy: Policy) -> Outcome {
    let passed = r.passed();
    if !policy.counts(r.simulated) {
        Outcome::NoEvidence(format!("simulated result ({})", r.verdict))
    } else if !passed && Code::only_configuration(&r.codes) {
        Outcome::NoEvidence(r.summary)
    } else if passed {
        Outcome::Passed
    } else {
        Outcome::NotPassed(r.summary)
    }
}

/// Rewrites node `name`'s taints with `edit` (optimistic: the patch carries the
/// resourceVersion it read, so a concurrent change makes it fail and the next reconcile retry).
/// A node that is gone is no error.
async fn edit_taints(
    ctx: &Ctx,
    name: &str,
    edit: impl FnOnce(&mut Vec<Taint>) -> bool,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let Some(current) = nodes.get_opt(name).await? else {
        return Ok(());
    };
    let mut taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
    if !edit(&mut taints) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": {"taints": taints},
    });
    ctx.throttle.acquire().await;
    match nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Removes the admission taint (key and effect) from node `name` (it passed).
pub async fn untaint(ctx: &Ctx, name: &str, taint: &AdmissionTaint) -> Result<(), kube::Error> {
    edit_taints(ctx, name, |ts| remove_admission_taint(ts, taint)).await
}

/// Adds the failure taint `gpuval.io/failed=<run>:NoSchedule` to node `name`.
pub async fn mark_failed(ctx: &Ctx, name: &str, run: &str) -> Result<(), kube::Error> {
    edit_taints(ctx, name, |ts| {
        if ts.iter().any(|t| t.key == labels::FAILED_NODE) {
            return false;
        }
        ts.push(Taint {
            key: labels::FAILED_NODE.into(),
            value: Some(labels::node_value(run)),
            effect: "NoSchedule".into(),
            time_added: None,
        });
        true
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_tolerate_the_default_admission_taint_once() {
        let cfg = with_agent_tolerations(OperatorConfig::default());
        let cfg = with_agent_tolerations(cfg);
        let ours: Vec<_> = cfg
            .tolerations
            .iter()
            .filter(|t| t.key.as_deref() == Some(labels::UNVALIDATED))
            .collect();
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].operator.as_deref(), Some("Exists"));
    }

    #[test]
    fn only_gpuval_s_own_or_listed_taint_keys_are_used() {
        assert_eq!(refuse_taint_key("gpuval.io/unvalidated", &[]), None);
        assert_eq!(refuse_taint_key("gpuval.io/burn-in", &[]), None);
        let why = refuse_taint_key("nvidia.com/gpu", &[]).unwrap();
        assert!(
            why.contains("nvidia.com/gpu") && why.contains("allowedTaintKeys"),
            "{why}"
        );
        let listed = vec!["example.com/new-node".to_string()];
        assert_eq!(refuse_taint_key("example.com/new-node", &listed), None);
        assert!(refuse_taint_key("example.com/other", &listed).is_some());
        let cfg = with_agent_tolerations(OperatorConfig {
            admission_taint_keys: listed,
            ..OperatorConfig::default()
        });
        assert!(
            cfg.tolerations
                .iter()
                .any(|t| t.key.as_deref() == Some("example.com/new-node"))
        );
    }

    #[test]
    fn only_the_taint_gpuval_added_is_removed() {
        let t = |key: &str, effect: &str| Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        };
        let ours = AdmissionTaint::default();
        let mut taints = vec![
            t("gpuval.io/unvalidated", "NoSchedule"),
            t("gpuval.io/unvalidated", "NoExecute"),
            t("nvidia.com/gpu", "NoSchedule"),
        ];
        assert!(remove_admission_taint(&mut taints, &ours));
        assert_eq!(
            taints,
            vec![
                t("gpuval.io/unvalidated", "NoExecute"),
                t("nvidia.com/gpu", "NoSchedule")
            ]
        );
        assert!(
            !remove_admission_taint(&mut taints, &ours),
            "nothing left of ours"
        );
    }

    #[test]
    fn simulated_and_configuration_results_are_no_evidence_for_admission() {
        let meta = |verdict: &str, codes: &str, simulated: bool| ResultMeta {
            node: "n".into(),
            validation: "v".into(),
            verdict: verdict.into(),
            summary: "io: no host path".into(),
            created: "2026-11-23T01:00:00Z".parse().unwrap(),
            action: gpuval_crds::Action::Rerun,
            codes: codes.into(),
            simulated,
        };
        let p = Policy::default();
        assert_eq!(result_outcome(meta("Pass", "", false), p), Outcome::Passed);
        assert!(matches!(
            result_outcome(meta("Pass", "", true), p),
            Outcome::NoEvidence(_)
        ));
        assert!(matches!(
            result_outcome(meta("Error", "IoError", false), p),
            Outcome::NoEvidence(_)
        ));
        assert!(matches!(
            result_outcome(meta("Fail", "MemoryMismatch", false), p),
            Outcome::NotPassed(_)
        ));
        let trusted = Policy {
            trust_simulated: true,
            ..p
        };
        assert_eq!(
            result_outcome(meta("Pass", "", true), trusted),
            Outcome::Passed
        );
    }

    #[test]
    fn a_result_admits_its_node_as_its_verdict_passes() {
        let p = Policy::default();
        let result = |verdict: &str| ResultMeta {
            node: "n".into(),
            validation: "v".into(),
            verdict: verdict.into(),
            summary: "why".into(),
            created: "2026-11-23T01:00:00Z".parse().unwrap(),
            action: gpuval_crds::Action::None,
            codes: String::new(),
            simulated: false,
        };
        for verdict in gpuval_crds::Verdict::ALL {
            let admitted = result_outcome(result(verdict.as_str()), p) == Outcome::Passed;
            assert_eq!(admitted, verdict.passes(), "{verdict}");
        }
    }
}
