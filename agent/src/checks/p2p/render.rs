//! The peer-to-peer check's table section (matrices: rows send, columns receive) and its part
//! of the status headline.

use gpuval_crds::{NodeReport, P2pPair, P2pResult};

use crate::text::{columns, dash, indent, span};

/// The headline's part: `p2p 392-396 GB/s (both ways 780-785)`.
pub fn headline(report: &NodeReport) -> Vec<String> {
    let Some(p) = report.p2p.as_ref().filter(|p| !p.pairs.is_empty()) else {
        return Vec::new();
    };
    let uni: Vec<f64> = p.pairs.iter().map(|q| q.unidirectional_gbps).collect();
    let bidi: Vec<f64> = p.pairs.iter().map(|q| q.bidirectional_gbps).collect();
    vec![format!(
        "p2p {} GB/s (both ways {})",
        span(&uni, 0),
        span(&bidi, 0)
    )]
}

/// The section, when the check ran.
pub fn section(report: &NodeReport) -> String {
    report.p2p.as_ref().map(p2p_section).unwrap_or_default()
}

/// Peer-to-peer matrices (rows send, columns receive) and the check's verdict.
fn p2p_section(p: &P2pResult) -> String {
    let mut out = format!("p2p: {}", p.verdict);
    if p.pairs.is_empty() {
        out.push('\n');
        return out;
    }
    out.push_str(&format!(
        " ({} pairs, {} MiB x {} copies)\n",
        p.pairs.len(),
        p.buffer_mib,
        p.iterations
    ));
    let cells: [(&str, Cell); 4] = [
        ("unidirectional GB/s", |q| {
            format!("{:.0}", q.unidirectional_gbps)
        }),
        ("bidirectional GB/s", |q| {
            format!("{:.0}", q.bidirectional_gbps)
        }),
        ("copy latency us", |q| {
            format!("{:.1}", q.copy_latency_micros)
        }),
        ("load latency ns", |q| {
            q.load_latency_nanos
                .map_or_else(dash, |v| format!("{v:.0}"))
        }),
    ];
    for (title, cell) in cells {
        out.push_str(&format!("  {title}:\n"));
        out.push_str(&indent(&indent(&matrix(&p.pairs, cell))));
    }
    if p.pairs
        .iter()
        .any(|q| q.staged_unidirectional_gbps.is_some())
    {
        out.push_str("  host-staged unidirectional GB/s:\n");
        out.push_str(&indent(&indent(&matrix(&p.pairs, |q| {
            q.staged_unidirectional_gbps
                .map_or_else(dash, |v| format!("{v:.0}"))
        }))));
    }
    out
}

/// How one figure of a pair is printed.
type Cell = fn(&P2pPair) -> String;

/// A GPU × GPU matrix of one figure; X on the diagonal, `err` where the pair failed to run.
fn matrix(pairs: &[P2pPair], cell: Cell) -> String {
    let mut gpus: Vec<i32> = pairs.iter().flat_map(|q| [q.src, q.dst]).collect();
    gpus.sort_unstable();
    gpus.dedup();
    let mut rows = vec![
        std::iter::once(String::new())
            .chain(gpus.iter().map(|g| format!("GPU{g}")))
            .collect::<Vec<_>>(),
    ];
    for &src in &gpus {
        let mut row = vec![format!("GPU{src}")];
        for &dst in &gpus {
            row.push(if src == dst {
                "X".to_string()
            } else {
                pairs
                    .iter()
                    .find(|q| q.src == src && q.dst == dst)
                    .map_or_else(dash, |q| {
                        if q.error.is_some() {
                            "err".to_string()
                        } else {
                            cell(q)
                        }
                    })
            });
        }
        rows.push(row);
    }
    columns(&rows)
}
