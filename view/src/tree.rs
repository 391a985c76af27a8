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
        let first = first_after_gap(&crate::worst_first(&r.failures));
        let _ = writeln!(
            s,
            "{branch} {}  {}  {} GPUs{first}",
            n.node,
            r.verdict,
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
        let mut doc = Document::single("v", crate::sample::report());
        doc.validation = Some(ValidationLine {
            name: "quick".into(),
            phase: "Failed".into(),
            reasons: vec![],
            selected: 2,
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
             ├─ gpu-a  Fail  2 GPUs  GPU1 memory: 2 mismatched words\n\
             │  ├─ GPU0 GPU-0  Pass\n\
             │  └─ GPU1 GPU-1  Fail  memory: 2 mismatched words\n\
             └─ gpu-b  no report  agent pod failed\n"
        );
    }
}
