//! The report as Markdown: the verdicts, the per-GPU table, p2p and NCCL peaks, reasons.

use std::fmt::Write;

use gpuval_crds::NodeReport;

use crate::Document;
use crate::checks::node_figures;
use crate::figures::Kind;
use crate::svg::num;

/// The Markdown page for `doc`.
pub fn markdown(doc: &Document) -> String {
    let mut s = format!("# {}\n\n", doc.title);
    if doc.simulated() {
        s.push_str("> **SIMULATED**: these figures come from the simulated GPU backend (tests and demos only).\n\n");
    }
    if let Some(v) = &doc.validation {
        let _ = writeln!(
            s,
            "Validation `{}`: **{}** ({} nodes selected)\n",
            v.name, v.phase, v.selected
        );
        if let Some(why) = v.why_no_reports(doc.reports().count()) {
            let _ = writeln!(s, "> {why}\n");
        }
        for r in &v.reasons {
            let _ = writeln!(s, "- {r}");
        }
        s.push('\n');
        if let Some(f) = &v.fabric {
            let _ = writeln!(s, "## Fabric\n\n{}\n", f.text());
        }
    }
    s.push_str("| node | verdict | GPUs | first failure |\n| --- | --- | --- | --- |\n");
    for n in &doc.nodes {
        let (v, g, f) = n.headline();
        let _ = writeln!(s, "| {} | {v} | {g} | {} |", n.node, cell(&f));
    }
    for n in &doc.nodes {
        if let Some(r) = &n.report {
            node(&mut s, n, r);
        }
    }
    s
}

/// Table cells keep their pipes out of the table.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn node(s: &mut String, n: &crate::NodeEntry, r: &NodeReport) {
    let _ = writeln!(s, "\n## {}: {}\n", n.node, n.verdict());
    if let Some(l) = n.line.as_ref().filter(|l| l.verdict != r.verdict) {
        let _ = writeln!(
            s,
            "> {} ({} evidence): {}\n",
            l.verdict, l.evidence, l.message
        );
    }
    let _ = writeln!(
        s,
        "{} to {}, backend {}, agent {}\n",
        r.started_at, r.finished_at, r.backend, r.agent_version
    );
    for f in crate::worst_first(&r.failures) {
        let _ = writeln!(s, "- {f}");
    }
    if !r.gpus.is_empty() {
        s.push_str("\n| GPU | model | UUID | verdict | memory GB/s | TFLOP/s | host pinned GB/s (h2d/d2h) | reasons |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    }
    for g in &r.gpus {
        let tflops: Vec<String> = g
            .compute
            .iter()
            .flat_map(|c| &c.gemms)
            .map(|t| format!("{} {}", t.dtype.as_str(), num(t.tflops)))
            .collect();
        let host = g
            .host_transfer
            .as_ref()
            .and_then(|h| h.pinned)
            .map(|p| format!("{}/{}", num(p.h2d_gbps), num(p.d2h_gbps)))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {host} | {} |",
            g.index,
            g.name,
            g.uuid,
            g.verdict,
            g.memory.as_ref().map(|m| num(m.gbps)).unwrap_or_default(),
            tflops.join(", "),
            cell(&gpuval_crds::reason::messages(&g.reasons))
        );
    }
    let figs = node_figures(r);
    let range = |kind: Kind, q: &str| {
        let v: Vec<f64> = figs
            .iter()
            .filter(|f| f.kind == kind && f.qualifier == q)
            .map(|f| f.value)
            .collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        (!v.is_empty()).then(|| format!("{}–{}", num(lo), num(hi)))
    };
    if let Some(uni) = range(Kind::P2pGbps, "unidirectional") {
        let bi = range(Kind::P2pGbps, "bidirectional").unwrap_or_default();
        let _ = writeln!(
            s,
            "\np2p over {} pairs: {uni} GB/s one way, {bi} GB/s both ways",
            r.p2p.as_ref().map_or(0, |p| p.pairs.len())
        );
    }
    for f in figs.iter().filter(|f| f.kind == Kind::NcclBusbwGbps) {
        let _ = writeln!(
            s,
            "\nNCCL {} bus bandwidth at the largest size: {} GB/s",
            f.qualifier,
            num(f.value)
        );
    }
    other_checks(s, r);
}

/// One line each for the node-wide checks the table has no column for.
fn other_checks(s: &mut String, r: &NodeReport) {
    if let Some(t) = &r.topology {
        let _ = writeln!(s, "\nTopology: {} over {} GPUs", t.verdict, t.gpus.len());
    }
    if let Some(io) = &r.io {
        let _ = writeln!(
            s,
            "\nFile I/O: {}, write {} MB/s, read {} MB/s in {}",
            io.verdict,
            num(io.write_mbps),
            num(io.read_mbps),
            if io.dir.is_empty() { "–" } else { &io.dir }
        );
    }
    if let Some(t) = &r.training {
        match &t.figures {
            Some(f) => {
                let _ = writeln!(
                    s,
                    "\nTraining step: {}, {} samples/s over {} GPUs ({} per GPU), scaling {}%, replicas {}",
                    t.verdict,
                    num(f.samples_per_second),
                    t.gpus.len(),
                    num(f.samples_per_second_per_gpu),
                    num(f.scaling_efficiency * 100.0),
                    if t.replicas.identical {
                        "identical"
                    } else {
                        "diverged"
                    }
                );
            }
            None => {
                let _ = writeln!(s, "\nTraining step: {}, no step measured", t.verdict);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_has_the_table_the_reason_and_the_banner() {
        let md = markdown(&Document::single("report.json", crate::sample::report()));
        assert!(md.contains("**SIMULATED**"));
        assert!(md.contains("| 1 | NVIDIA H200 | GPU-1 | Fail | 4100 | bf16 680 | 55.0/54.0 | memory: 2 mismatched words |"), "{md}");
        assert!(md.contains("390–390 GB/s one way"));
        assert!(md.contains("NCCL allReduce bus bandwidth at the largest size: 300 GB/s"));
    }
}
