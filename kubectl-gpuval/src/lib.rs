//! The pure half of `kubectl gpuval`: a validation and its node results turned into the
//! [`gpuval_view::Document`] every subcommand renders, and what the plugin says and returns
//! ([`cli`]).

pub mod certificates;
pub mod cli;

use std::collections::BTreeMap;

use gpuval_crds::{GpuNodeResult, GpuValidation};
use gpuval_view::{Document, FabricLine, LineView, NodeEntry, ValidationLine};
use kube::ResourceExt;

/// The document of validation `gv` from `results` (any results: those not owned by this
/// validation, by uid, are ignored; of several results for one node, the latest generation's
/// wins). Nodes the status lists without a result keep its message.
pub fn document(gv: &GpuValidation, results: &[GpuNodeResult]) -> Document {
    let uid = gv.metadata.uid.as_deref().unwrap_or_default();
    let mut by_node: BTreeMap<String, &GpuNodeResult> = BTreeMap::new();
    for r in results.iter().filter(|r| owned_by(r, uid)) {
        let slot = by_node.entry(r.spec.node_name.clone()).or_insert(r);
        if r.spec.generation > slot.spec.generation {
            *slot = r;
        }
    }
    let status = gv.status.clone().unwrap_or_default();
    let mut nodes: Vec<NodeEntry> = by_node
        .into_values()
        .map(|r| {
            let listed = status.nodes.iter().find(|l| l.name == r.spec.node_name);
            let mut entry = node_entry(r, listed);
            entry.line = line_view(gv, &r.spec.node_name, Some(r));
            entry
        })
        .collect();
    for line in &status.nodes {
        if !nodes.iter().any(|n| n.node == line.name) {
            nodes.push(NodeEntry {
                node: line.name.clone(),
                result: None,
                report: None,
                message: Some(format!(
                    "{}: {}",
                    line.verdict.as_str(),
                    line.message.as_deref().unwrap_or("no result")
                )),
                line: line_view(gv, &line.name, None),
            });
        }
    }
    // Worst first, so that the top of a long tree is what needs a look.
    nodes.sort_by(|a, b| {
        let rank = |n: &NodeEntry| std::cmp::Reverse(n.report.as_ref().map(|_| n.verdict()));
        rank(a).cmp(&rank(b)).then_with(|| a.node.cmp(&b.node))
    });
    let summary = status.summary.clone().unwrap_or_default();
    Document {
        title: format!("validation {}", gv.name_any()),
        validation: Some(ValidationLine {
            name: gv.name_any(),
            phase: status
                .phase
                .map_or_else(|| "Pending".into(), |p| p.as_str().to_string()),
            reasons: summary
                .reasons
                .iter()
                .map(|r| format!("{} ({})", r.reason, r.count))
                .collect(),
            selected: summary.selected,
            message: ready_message(&status),
            fabric: status.fabric.as_ref().map(fabric_line),
        }),
        nodes,
    }
}

/// Node `node`'s final line in `gv` ([`gpuval_crds::final_line`]) as the views show it, with
/// its result `r` if any; None while the node has none. Simulated results are read as they are:
/// every view flags simulation on its own.
fn line_view(gv: &GpuValidation, node: &str, r: Option<&GpuNodeResult>) -> Option<LineView> {
    let seen = r.map(gpuval_crds::ResultSeen::of);
    let trust = gpuval_crds::Trust {
        trust_simulated: true,
    };
    let line = gpuval_crds::final_line(gv, node, seen.as_ref(), trust)?;
    let reported = r.and_then(|r| r.status.as_ref()).map(|s| s.verdict);
    Some(LineView {
        verdict: line.shown(reported),
        evidence: line.evidence.as_str().to_string(),
        message: line.message,
    })
}

/// A node's entry from its result: its report, or why there is none to show (not stored yet,
/// with what the status's line `listed` says of the node where it says something: an agent pod
/// that cannot be scheduled, an image that cannot be pulled; or the result is closed, its
/// node's line final without it: a report that came late is kept in the result for the record
/// and is not shown as the node's).
fn node_entry(r: &GpuNodeResult, listed: Option<&gpuval_crds::NodeStatus>) -> NodeEntry {
    const NOT_STORED: &str = "the agent has not stored its report yet";
    let closed = gpuval_crds::binding::closed(&r.metadata);
    let why =
        listed.and_then(|l| Some((l.verdict, l.message.as_deref().filter(|m| !m.is_empty())?)));
    let message = match (closed, &r.status, why) {
        (Some(verdict), _, _) => Some(format!(
            "{verdict}: the node's line became final without its result (closed; see the result for the record)"
        )),
        (None, None, Some((verdict, why))) => {
            Some(format!("{}: {why} ({NOT_STORED})", verdict.as_str()))
        }
        (None, None, None) => Some(NOT_STORED.into()),
        (None, Some(_), _) => None,
    };
    NodeEntry {
        node: r.spec.node_name.clone(),
        result: Some(r.name_any()),
        report: r.status.clone().filter(|_| closed.is_none()),
        message,
        line: None,
    }
}

/// The Ready condition's message, whole.
pub fn ready_message(status: &gpuval_crds::GpuValidationStatus) -> Option<String> {
    gpuval_crds::conditions::find(&status.conditions, gpuval_crds::conditions::READY)
        .map(|c| c.message.clone())
        .filter(|m| !m.is_empty())
}

/// The view's line of the fabric test, from the validation's status.
fn fabric_line(f: &gpuval_crds::fabric::FabricStatus) -> FabricLine {
    let gpuval_crds::fabric::FabricStatus {
        phase,
        nodes,
        rounds,
        bus_bandwidth_gbps,
        tcp_min_gbps,
        failed_nodes,
        suspects,
        ports: _,
        message,
    } = f;
    FabricLine {
        phase: phase.as_str().to_string(),
        nodes: *nodes,
        rounds: *rounds,
        bus_gbps: *bus_bandwidth_gbps,
        tcp_min_gbps: *tcp_min_gbps,
        named: failed_nodes.clone(),
        suspects: suspects.clone(),
        message: message.clone(),
    }
}

fn owned_by(r: &GpuNodeResult, uid: &str) -> bool {
    r.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "GpuValidation" && o.uid == uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::{GpuNodeResultSpec, GpuValidationSpec, NodeReport, Verdict};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    fn result(node: &str, generation: i64, owner: &str, verdict: Verdict) -> GpuNodeResult {
        let mut r = GpuNodeResult::new(
            &format!("v-{node}-{generation}"),
            GpuNodeResultSpec {
                validation: "v".into(),
                generation,
                node_name: node.into(),
            },
        );
        r.metadata.owner_references = Some(vec![OwnerReference {
            kind: "GpuValidation".into(),
            uid: owner.into(),
            ..Default::default()
        }]);
        r.status = Some(NodeReport {
            verdict,
            ..Default::default()
        });
        r
    }

    #[test]
    fn the_latest_owned_result_of_each_node_counts_worst_first() {
        let mut gv = GpuValidation::new(
            "v",
            serde_json::from_str::<GpuValidationSpec>(r#"{"checks":{}}"#).expect("spec"),
        );
        gv.metadata = ObjectMeta {
            name: Some("v".into()),
            uid: Some("u1".into()),
            ..Default::default()
        };
        let results = [
            result("a", 1, "u1", Verdict::Fail),
            result("a", 2, "u1", Verdict::Pass),
            result("b", 2, "u1", Verdict::Fail),
            result("c", 2, "someone-else", Verdict::Fail),
        ];
        let doc = document(&gv, &results);
        let names: Vec<(&str, Option<Verdict>)> = doc
            .nodes
            .iter()
            .map(|n| (n.node.as_str(), n.report.as_ref().map(|r| r.verdict)))
            .collect();
        assert_eq!(
            names,
            [("b", Some(Verdict::Fail)), ("a", Some(Verdict::Pass))]
        );
        assert_eq!(doc.nodes[1].result.as_deref(), Some("v-a-2"));
        assert_eq!(
            doc.validation.as_ref().map(|v| v.phase.as_str()),
            Some("Pending")
        );
    }

    #[test]
    fn a_closed_results_late_report_is_not_shown_as_the_nodes() {
        let mut late = result("a", 1, "u1", Verdict::Pass);
        late.metadata.annotations = Some(
            [(
                gpuval_crds::labels::CLOSED.to_string(),
                "DeadlineExceeded".to_string(),
            )]
            .into(),
        );
        let entry = node_entry(&late, None);
        assert_eq!(entry.report, None);
        let message = entry.message.unwrap_or_default();
        assert!(
            message.starts_with("DeadlineExceeded") && message.contains("closed"),
            "{message}"
        );
        let mut waiting = result("b", 1, "u1", Verdict::Pass);
        waiting.status = None;
        assert_eq!(
            node_entry(&waiting, None).message.as_deref(),
            Some("the agent has not stored its report yet")
        );
    }

    /// A node whose agent has stored no report says why, where the status does: its agent pod
    /// cannot be scheduled (issue 56: `status` said only "not stored yet").
    #[test]
    fn a_node_without_a_report_says_what_the_status_says_of_it() {
        let mut gv: GpuValidation = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
            "metadata": {"name": "v", "uid": "u1", "generation": 1},
            "spec": {"checks": {}},
            "status": {"observedGeneration": 1, "phase": "Running",
                       "nodes": [{"name": "a", "verdict": "Pending", "gpus": 8,
                                  "message": "Unschedulable: cannot allocate all claims"}]}
        }))
        .expect("validation");
        let mut waiting = result("a", 1, "u1", Verdict::Pass);
        waiting.status = None;
        let doc = document(&gv, std::slice::from_ref(&waiting));
        let message = doc.nodes[0].message.clone().unwrap_or_default();
        assert!(
            message.contains("Unschedulable: cannot allocate all claims")
                && message.contains("not stored its report yet"),
            "{message}"
        );
        // Without a word in the status, it says only that.
        if let Some(st) = gv.status.as_mut() {
            st.nodes[0].message = None;
        }
        let doc = document(&gv, std::slice::from_ref(&waiting));
        assert_eq!(
            doc.nodes[0].message.as_deref(),
            Some("the agent has not stored its report yet")
        );
    }

    /// A validation that Failed on its fabric test, which named node b though b's own checks
    /// passed: b's row is Fail (its final line), a's Pass, and the headline is no pass.
    #[test]
    fn every_node_reads_its_final_line_and_the_headline_the_validations() {
        let mut gv: GpuValidation = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
            "metadata": {"name": "fab", "uid": "u1", "generation": 1},
            "spec": {"checks": {}},
            "status": {"observedGeneration": 1, "phase": "Failed",
                       "summary": {"selected": 2, "pending": 0, "running": 0, "passed": 1, "failed": 1},
                       "nodes": [{"name": "b", "verdict": "Failed", "evidence": "Hardware",
                                  "message": "fabric: in 3 of 4 TCP pairs 7.7 Gb/s below 25"}],
                       "fabric": {"phase": "Failed", "nodes": 2, "rounds": 2, "failedNodes": ["b"]}},
        }))
        .expect("validation");
        gv.metadata.uid = Some("u1".into());
        let results = [
            result("a", 1, "u1", Verdict::Pass),
            result("b", 1, "u1", Verdict::Pass),
        ];
        let doc = document(&gv, &results);
        let verdicts: Vec<(&str, Verdict)> = doc
            .nodes
            .iter()
            .map(|n| (n.node.as_str(), n.verdict()))
            .collect();
        assert_eq!(verdicts, [("b", Verdict::Fail), ("a", Verdict::Pass)]);
        assert_eq!(
            doc.nodes[0].line.as_ref().map(|l| l.evidence.as_str()),
            Some("Hardware")
        );
        assert!(doc.nodes[0].headline().2.starts_with("fabric: in 3 of 4"));
        assert_eq!(doc.worst(), Verdict::Fail);
        let page = gpuval_view::html(&doc);
        assert!(page.contains("<span class=\"badge b-Fail\">Fail</span></h1>"));
    }
}
