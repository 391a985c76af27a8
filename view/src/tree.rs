//! The status tree a terminal shows: validation, then its nodes, then their GPUs, each with its
//! verdict and first reason.

use std::fmt::Write;

use crate::Document;

/// The tree of `doc`. Nodes that passed show their GPUs on one line; others list each GPU.
pub fn tree(doc: &Document) -> String {
    let mut s = String::new();
    match &doc.validation {
        Some(v) => {
            let _ = writeln!(
                s,
                "{}  {}  ({} nodes selected, {} reports){}",
                v.name,
                v.phase,
                v.selected,
                doc.reports().count(),
                if doc.simulated() { "  SIMULATED" } else { "" }
            );
            if let Some(why) = v.why_no_reports(doc.reports().count()) {
                let _ = writeln!(s, "   {why}");
            }
            if let Some(f) = &v.fabric {
                let _ = writeln!(s, "   fabric  {}", f.text());
            }
        }
        None => {
            let _ = writeln!(s, "{}", doc.title);
        }
    }
    let last_node = doc.nodes.len().saturating_sub(1);
    for (i, n) in doc.nodes.iter().enumerate() {
        let (branch, stem) = if i == last_node {
            ("└─", "   ")
        } else {
            ("├─", "│  ")
        };
        let Some(r) = &n.report else {
            let _ = writeln!(
                s,
                "{branch} {}  no report  {}",
                n.node,
                n.message.as_deref().unwrap_or("")
            );
            continue;
        };
        let (_, _, first) = n.headline();
        let first = if first.is_empty() {
            first
        } else {
            format!("  {first}")
        };
        let _ = writeln!(
            s,
            "{branch} {}  {}  {} GPUs{first}",
            n.node,
            n.verdict(),
            r.gpus.len()
        );
        if !r.verdict.is_bad() && r.gpus.iter().all(|g| g.verdict == r.verdict) {
            continue;
        }
        let last_gpu = r.gpus.len().saturating_sub(1);
        for (j, g) in r.gpus.iter().enumerate() {
            let b = if j == last_gpu { "└─" } else { "├─" };
            let reason = first_after_gap(&crate::worst_first(&g.reasons));
            let _ = writeln!(
                s,
                "{stem}{b} GPU{} {}  {}{reason}",
                g.index, g.uuid, g.verdict
            );
        }
    }
    s
}

/// The first of `items` after two spaces; nothing where there is none.
fn first_after_gap(items: &[impl std::fmt::Display]) -> String {
    items.first().map(|x| format!("  {x}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NodeEntry, ValidationLine};

    #[test]
    fn a_failed_node_lists_its_gpus_with_the_first_reason() {
        let mut report = crate::sample::report();
        report.action = gpuval_crds::reason::Action::ReplaceHardware;
        let mut doc = Document::single("v", report);
        doc.validation = Some(ValidationLine {
            name: "quick".into(),
            phase: "Failed".into(),
            reasons: vec![],
            selected: 2,
            ..Default::default()
        });
        doc.nodes.push(NodeEntry {
            node: "gpu-b".into(),
            message: Some("agent pod failed".into()),
            ..Default::default()
        });
        let t = tree(&doc);
        assert_eq!(
            t,
            "quick  Failed  (2 nodes selected, 1 reports)  SIMULATED\n\
             ├─ gpu-a  Fail  2 GPUs  [ReplaceHardware] GPU1 memory: 2 mismatched words\n\
             │  ├─ GPU0 GPU-0  Pass\n\
             │  └─ GPU1 GPU-1  Fail  memory: 2 mismatched words\n\
             └─ gpu-b  no report  agent pod failed\n"
        );
    }

    /// A run refused before any node ran (no node selected, a spec the cluster cannot run) says
    /// why under its line; one whose nodes reported does not repeat the condition.
    #[test]
    fn a_run_that_failed_before_its_nodes_says_why_and_the_fabric_has_a_line() {
        let mut doc = Document {
            title: "validation fabric".into(),
            validation: Some(ValidationLine {
                name: "fabric".into(),
                phase: "Failed".into(),
                selected: 0,
                message: Some(
                    "NotConfigured: spec.fabric needs agent.fabric in the chart: set \
                     agent.fabric.hostNetwork or agent.fabric.resources, then apply again"
                        .into(),
                ),
                ..Default::default()
            }),
            nodes: vec![],
        };
        assert_eq!(
            tree(&doc),
            "fabric  Failed  (0 nodes selected, 0 reports)\n   NotConfigured: spec.fabric needs \
             agent.fabric in the chart: set agent.fabric.hostNetwork or agent.fabric.resources, \
             then apply again\n"
        );
        let v = doc.validation.as_mut().expect("a validation");
        v.phase = "Failed".into();
        v.selected = 4;
        v.fabric = Some(crate::FabricLine {
            phase: "Failed".into(),
            nodes: 4,
            rounds: 3,
            bus_gbps: Some(2.8),
            tcp_min_gbps: Some(145.72),
            named: vec!["vm-3".into()],
            suspects: vec![],
            message: Some("vm-3 was in 3 of 4 slow groups".into()),
        });
        doc.nodes.push(NodeEntry {
            node: "vm-0".into(),
            report: Some(crate::sample::report()),
            ..Default::default()
        });
        let t = tree(&doc);
        assert!(!t.contains("NotConfigured"), "{t}");
        assert!(
            t.contains(
                "\n   fabric  Failed  4 nodes, 3 rounds, bus 2.8 GB/s, TCP >= 145.7 Gb/s; named \
                 vm-3: vm-3 was in 3 of 4 slow groups\n"
            ),
            "{t}"
        );
    }
}
