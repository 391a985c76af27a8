//! New nodes gated until they pass: the pure decision in [`crate::decide::admission`]; here the shell's part, the
//! views it decides on (from the operator's stores) and the node taint edits it makes.
//!
//! Admission belongs to a `GpuValidationSchedule` with `spec.admission`; the schedule's
//! reconcile ([`crate::controllers::schedule`]) runs it beside the cron plan and creates the admission runs.

use gpuval_crds::schedule::{Admission, AdmissionTaint};
use gpuval_crds::{FinalLine, GpuValidation, GpuValidationSpec, labels};
use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use kube::api::ResourceExt;

use crate::context::Ctx;
use crate::controllers::node_state::result_of;
use crate::decide::admission::{AdmissionRun, NodeView, Outcome};
use crate::decide::node_state::{Incarnation, Policy};
use crate::decide::selection;
use crate::settings::config::OperatorConfig;

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

/// The taints gpuval puts on a node that failed on hardware evidence: never an admission taint,
/// whatever the administrator's list says (admission would remove them from every node that
/// passes a run, and a failed node would be let back in by any schedule).
pub const FAILURE_TAINT_KEYS: [&str; 2] = [
    labels::FAILED_NODE,
    crate::decide::reconcile::device_taints::TAINT_KEY,
];

/// Why the operator refuses admission taint `key` (None: it may be used): it marks a failed
/// node ([`FAILURE_TAINT_KEYS`]), or it is neither gpuval's own (`gpuval.io/...`) nor in the
/// administrator's list `allowed`. Removing it from every node that passes would otherwise
/// remove a taint someone else relies on.
pub fn refuse_taint_key(key: &str, allowed: &[String]) -> Option<String> {
    if FAILURE_TAINT_KEYS.contains(&key) {
        return Some(format!(
            "spec.admission.taint.key {key} marks nodes that failed on hardware evidence and is never an admission taint (admission removes its taint from nodes that pass); use {} or another key of your own",
            labels::UNVALIDATED
        ));
    }
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
                // Only a verdict of a run whose author may admit nodes: another author's
                // run never keeps the gate from testing a node.
                has_verdict: n.labels().contains_key(labels::ADMISSION),
                name,
            })
        })
        .collect()
}

/// An admission run as the plan sees it: its nodes, whether it is over, and each node's
/// outcome so far, from the node's final line in the run ([`gpuval_crds::final_line`]: its
/// own checks and the fabric test together, with the result its own agent wrote).
pub fn run_view(run: &GpuValidation, ctx: &Ctx) -> AdmissionRun {
    let name = run.name_any();
    let policy = Policy::of(&ctx.cfg);
    let nodes: Vec<String> = run.spec.node_names.iter().map(|n| n.0.clone()).collect();
    let outcomes = nodes
        .iter()
        .filter_map(|node| {
            let result = result_of(ctx, &name, node);
            let line = policy.final_line(run, node, result.as_ref())?;
            // A node created again under its name since is another node: no outcome of this
            // run is its (it waits for a run of its own).
            let present = ctx
                .nodes
                .get(&kube::runtime::reflector::ObjectRef::new(node));
            let result_node = result.as_ref().and_then(|r| r.node_uid.as_deref());
            let about_it = match (present, line.at) {
                (Some(n), Some(at)) => Incarnation::of(&n).owns(at, result_node),
                _ => true,
            };
            about_it.then(|| (node.clone(), outcome_of(&line, policy)))
        })
        .collect();
    AdmissionRun {
        name,
        nodes,
        finished: run
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(gpuval_crds::Phase::is_terminal),
        outcomes,
    }
}

/// What a node's final line says to admission: a pass on hardware evidence admits, a failure
/// on hardware evidence keeps the node out (failure taint); any other line (a busy GPU,
/// infrastructure, configuration, a simulated result or one without a report) is no evidence:
/// the node is neither admitted nor marked failed, and the line says what to fix.
pub fn outcome_of(line: &FinalLine, policy: Policy) -> Outcome {
    if !policy.counts(false) {
        Outcome::NoEvidence(format!("simulated agents ({})", line.verdict))
    } else if line.passed() {
        Outcome::Passed
    } else if line.failed_on_hardware() {
        Outcome::NotPassed(line.message.clone())
    } else {
        Outcome::NoEvidence(format!("{}: {}", line.evidence, line.message))
    }
}

/// Removes the admission taint (key and effect) from node `name` (it passed).
pub async fn untaint(ctx: &Ctx, name: &str, taint: &AdmissionTaint) -> Result<(), kube::Error> {
    crate::write::node_marks::edit_taints(ctx, name, |ts| remove_admission_taint(ts, taint)).await
}

/// Adds the failure taint `gpuval.io/failed=<run>:NoSchedule` to node `name` (none when it
/// has one already).
pub async fn mark_failed(ctx: &Ctx, name: &str, run: &str) -> Result<(), kube::Error> {
    let wanted = crate::decide::node_marks::Wanted::Mark {
        action: gpuval_crds::NodeAction::Taint,
        run: labels::node_value(run),
    };
    crate::write::node_marks::edit_taints(ctx, name, |ts| {
        crate::decide::node_marks::edit_taints(ts, &wanted)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::{Evidence, NodeVerdict};

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
        for failed in FAILURE_TAINT_KEYS {
            let listed = vec![failed.to_string()];
            let why = refuse_taint_key(failed, &listed).expect("never an admission key");
            assert!(
                why.contains(failed) && why.contains("never an admission taint"),
                "{why}"
            );
        }
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

    fn line(verdict: NodeVerdict, evidence: Evidence) -> FinalLine {
        FinalLine {
            validation: "v".into(),
            verdict,
            evidence,
            message: "why".into(),
            codes: String::new(),
            action: gpuval_crds::Action::None,
            result: None,
            at: None,
        }
    }

    #[test]
    fn only_a_hardware_line_admits_or_keeps_a_node_out() {
        let p = Policy::default();
        assert_eq!(
            outcome_of(&line(NodeVerdict::Passed, Evidence::Hardware), p),
            Outcome::Passed
        );
        assert!(matches!(
            outcome_of(&line(NodeVerdict::Failed, Evidence::Hardware), p),
            Outcome::NotPassed(_)
        ));
        for evidence in Evidence::ALL.into_iter().filter(|e| !e.acts_on_node()) {
            for verdict in [NodeVerdict::Passed, NodeVerdict::Failed, NodeVerdict::Error] {
                let o = outcome_of(&line(verdict, evidence), p);
                assert!(
                    matches!(&o, Outcome::NoEvidence(why) if why.starts_with(evidence.as_str())),
                    "{verdict} {evidence}: {o:?}"
                );
            }
        }
        let simulating = Policy {
            agents_simulated: true,
            ..p
        };
        assert!(matches!(
            outcome_of(&line(NodeVerdict::Passed, Evidence::Hardware), simulating),
            Outcome::NoEvidence(_)
        ));
    }
}
