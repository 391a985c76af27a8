//! The human table the agent prints: one row per GPU, then topology, then the node verdict
//! and its failures. Plain text, no colours.

use gpuval_crds::IoResult;
use gpuval_crds::{
    ComputeResult, GpuReport, MemoryResult, NodeReport, P2pPair, P2pResult, TelemetrySummary,
    TransferRates,
};

const HEADER: [&str; 7] = [
    "GPU",
    "NAME",
    "MEMORY",
    "COMPUTE TFLOP/s",
    "TEMP C",
    "POWER W",
    "VERDICT",
];
/// Shown first on every report from the simulated backend.
pub const SIMULATED_BANNER: &str = "SIMULATED BACKEND: figures are not from real GPUs";

/// Renders a node report as a compact table.
pub fn table(report: &NodeReport) -> String {
    let mut out = String::new();
    if report.simulated {
        out.push_str(SIMULATED_BANNER);
        out.push('\n');
    }
    let rows: Vec<Vec<String>> = std::iter::once(HEADER.map(String::from).to_vec())
        .chain(report.gpus.iter().map(gpu_row))
        .collect();
    out.push_str(&columns(&rows));
    out.push_str(&topology_line(report));
    out.push_str(&host_section(report));
    if let Some(p) = &report.p2p {
        out.push_str(&p2p_section(p));
    }
    if let Some(io) = &report.io {
        out.push_str(&io_line(io));
    }
    let node = report
        .node
        .as_deref()
        .map(|n| format!(" {n}"))
        .unwrap_or_default();
    out.push_str(&format!("node{node}: {}\n", report.verdict));
    for failure in &report.failures {
        out.push_str(&format!("  - {failure}\n"));
    }
    out
}

fn gpu_row(gpu: &GpuReport) -> Vec<String> {
    let telemetry = gpu.telemetry.as_ref();
    vec![
        gpu.index.to_string(),
        gpu.name.clone(),
        gpu.memory.as_ref().map_or_else(dash, memory_cell),
        gpu.compute.as_ref().map_or_else(dash, compute_cell),
        telemetry.map_or_else(dash, temperature_cell),
        telemetry
            .and_then(|t| t.power_w)
            .map_or_else(dash, |p| format!("{:.0}", p.max)),
        gpu.verdict.to_string(),
    ]
}

fn memory_cell(m: &MemoryResult) -> String {
    if m.tested_gib <= 0.0 {
        return m.verdict.to_string();
    }
    format!(
        "{:.1} GiB {:.0} GB/s {} bad",
        m.tested_gib, m.gbps, m.mismatches
    )
}

fn compute_cell(c: &ComputeResult) -> String {
    if c.gemms.is_empty() {
        return c.verdict.to_string();
    }
    c.gemms
        .iter()
        .map(|g| format!("{} {:.0}", g.dtype, g.tflops))
        .collect::<Vec<_>>()
        .join(" ")
}

fn temperature_cell(t: &TelemetrySummary) -> String {
    t.temperature_c
        .map_or_else(dash, |s| format!("{:.0}-{:.0}", s.min, s.max))
}

fn topology_line(report: &NodeReport) -> String {
    match &report.topology {
        None => "topology: not checked\n".to_string(),
        Some(t) => {
            let links: Vec<String> = t
                .nvlinks
                .iter()
                .map(|l| format!("{}/{}", l.active, l.total))
                .collect();
            let mut line = format!("topology: {}", t.verdict);
            if !links.is_empty() {
                line.push_str(&format!(
                    " (NVLink active/total per GPU: {})",
                    links.join(" ")
                ));
            }
            line.push('\n');
            line
        }
    }
}

/// One line of the node's key figures (ranges over GPUs), for the validation's status:
/// `4x NVIDIA H200: memory 4344-4355 GB/s; bf16 677-687 TFLOP/s; p2p 392-396 GB/s
/// (both ways 780-785); host pinned 55.1-55.5 GB/s`. Simulated reports say so first.
pub fn headline(report: &NodeReport) -> String {
    let mut parts = Vec::new();
    let memory: Vec<f64> = report
        .gpus
        .iter()
        .filter_map(|g| g.memory.as_ref().map(|m| m.gbps))
        .filter(|v| *v > 0.0)
        .collect();
    if !memory.is_empty() {
        parts.push(format!("memory {} GB/s", span(&memory, 0)));
    }
    let mut dtypes: Vec<gpuval_crds::Dtype> = Vec::new();
    for g in &report.gpus {
        for gm in g.compute.iter().flat_map(|c| &c.gemms) {
            if !dtypes.contains(&gm.dtype) {
                dtypes.push(gm.dtype);
            }
        }
    }
    for d in dtypes {
        let v: Vec<f64> = report
            .gpus
            .iter()
            .flat_map(|g| g.compute.iter().flat_map(|c| &c.gemms))
            .filter(|gm| gm.dtype == d)
            .map(|gm| gm.tflops)
            .collect();
        parts.push(format!("{d} {} TFLOP/s", span(&v, 0)));
    }
    if let Some(p) = report.p2p.as_ref().filter(|p| !p.pairs.is_empty()) {
        let uni: Vec<f64> = p.pairs.iter().map(|q| q.unidirectional_gbps).collect();
        let bidi: Vec<f64> = p.pairs.iter().map(|q| q.bidirectional_gbps).collect();
        parts.push(format!(
            "p2p {} GB/s (both ways {})",
            span(&uni, 0),
            span(&bidi, 0)
        ));
    }
    let host: Vec<f64> = report
        .gpus
        .iter()
        .filter_map(|g| g.host_transfer.as_ref().and_then(|h| h.pinned))
        .flat_map(|r| [r.h2d_gbps, r.d2h_gbps])
        .collect();
    if !host.is_empty() {
        parts.push(format!("host pinned {} GB/s", span(&host, 1)));
    }
    if let Some(io) = report.io.as_ref().filter(|io| io.bytes > 0) {
        parts.push(format!(
            "io write {:.0} MB/s, read {:.0} MB/s",
            io.write_mbps, io.read_mbps
        ));
    }
    let sim = if report.simulated { "SIMULATED " } else { "" };
    let Some(first) = report.gpus.first() else {
        return format!("{sim}no GPUs");
    };
    let head = format!("{sim}{}x {}", report.gpus.len(), first.name);
    if parts.is_empty() {
        head
    } else {
        format!("{head}: {}", parts.join("; "))
    }
}

/// `min-max` (or one value) with `decimals` decimals.
fn span(values: &[f64], decimals: usize) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (format!("{lo:.decimals$}"), format!("{hi:.decimals$}"));
    if a == b { a } else { format!("{a}-{b}") }
}

/// Host transfer rates per GPU, when measured.
fn host_section(report: &NodeReport) -> String {
    let measured: Vec<&GpuReport> = report
        .gpus
        .iter()
        .filter(|g| g.host_transfer.is_some())
        .collect();
    if measured.is_empty() {
        return String::new();
    }
    let rates = |r: Option<TransferRates>| {
        r.map_or_else(dash, |r| format!("{:.1}/{:.1}", r.h2d_gbps, r.d2h_gbps))
    };
    let mut rows = vec![
        [
            "GPU",
            "PINNED H2D/D2H GB/s",
            "ALL AT ONCE",
            "PAGEABLE",
            "VERDICT",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in measured {
        if let Some(h) = &g.host_transfer {
            rows.push(vec![
                g.index.to_string(),
                rates(h.pinned),
                rates(h.pinned_concurrent),
                rates(h.pageable),
                h.verdict.to_string(),
            ]);
        }
    }
    format!("host transfers:\n{}", indent(&columns(&rows)))
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

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// `io: Pass (4 × 1024 MiB in /data, ext4, O_DIRECT, 4 workers): write 1520 MB/s, read 2110 MB/s, 0 bad words`
fn io_line(io: &IoResult) -> String {
    if io.bytes <= 0 {
        return format!("io: {}\n", io.verdict);
    }
    let mut how = vec![format!(
        "{} × {} MiB in {}",
        io.files, io.file_size_mib, io.dir
    )];
    how.extend(io.fs_type.clone());
    how.push(if io.direct_io { "O_DIRECT" } else { "buffered" }.to_string());
    how.push(format!("{} workers", io.concurrency));
    if io.during_compute {
        how.push("during the burn".into());
    }
    format!(
        "io: {} ({}): write {:.0} MB/s, read {:.0} MB/s, {} bad words\n",
        io.verdict,
        how.join(", "),
        io.write_mbps,
        io.read_mbps,
        io.mismatches
    )
}

/// Left-aligned columns two spaces apart, trailing spaces trimmed.
fn columns(rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(max) => *max = (*max).max(w),
                None => widths.push(w),
            }
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn dash() -> String {
    "-".to_string()
}

#[cfg(test)]
mod tests {
    use gpuval_crds::{TopologyReport, Verdict};

    use super::*;
    use crate::backend::sim::tests::simulated_report;

    #[test]
    fn simulated_report_has_banner_and_gpu_rows() {
        let report = simulated_report("gpus=4,fail=memory@2");
        let text = table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], SIMULATED_BANNER);
        assert!(lines[1].starts_with("GPU  NAME"), "{text}");
        for i in 0..4 {
            let row = lines[2 + i];
            assert!(
                row.starts_with(&format!("{i}    NVIDIA H200 (simulated)")),
                "{row}"
            );
            assert!(row.contains("GB/s") && row.contains("bf16 "), "{row}");
        }
        assert!(lines[4].ends_with("Fail"), "{}", lines[4]);
        assert!(lines[2].ends_with("Pass"), "{}", lines[2]);
        assert!(
            text.contains("topology: Pass (NVLink active/total per GPU: 18/18"),
            "{text}"
        );
        assert!(text.contains("node: Fail\n  - GPU2 memory: "), "{text}");
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn p2p_matrices_and_host_rates_are_printed() {
        let report = simulated_report("gpus=3,slow=p2p@2:0.25");
        let mut report = report;
        let pair = |src, dst, gbps| P2pPair {
            src,
            dst,
            unidirectional_gbps: gbps,
            bidirectional_gbps: 2.0 * gbps,
            copy_latency_micros: 8.1,
            ..Default::default()
        };
        report.p2p = Some(P2pResult {
            verdict: Verdict::Fail,
            buffer_mib: 512,
            iterations: 16,
            pairs: vec![pair(0, 1, 392.0), pair(1, 0, 391.0), pair(0, 2, 98.0)],
            ..Default::default()
        });
        report.gpus[1].host_transfer = Some(gpuval_crds::HostTransferResult {
            pinned: Some(TransferRates {
                h2d_gbps: 55.3,
                d2h_gbps: 55.6,
            }),
            ..Default::default()
        });
        let text = table(&report);
        assert!(
            text.contains("p2p: Fail (3 pairs, 512 MiB x 16 copies)"),
            "{text}"
        );
        assert!(text.contains("\n    GPU0  X     392   98\n"), "{text}");
        assert!(text.contains("\n    GPU1  391   X     -\n"), "{text}");
        assert!(text.contains("\n    GPU0  X     784   196\n"), "{text}");
        assert!(text.contains("  1    55.3/55.6"), "{text}");
    }

    #[test]
    fn headline_gives_ranges_of_the_key_figures() {
        let mut report = simulated_report("gpus=2");
        report.gpus[0].host_transfer = Some(gpuval_crds::HostTransferResult {
            pinned: Some(TransferRates {
                h2d_gbps: 55.26,
                d2h_gbps: 55.61,
            }),
            ..Default::default()
        });
        let line = headline(&report);
        assert!(
            line.starts_with("SIMULATED 2x NVIDIA H200 (simulated): memory "),
            "{line}"
        );
        assert!(line.contains(" GB/s; bf16 7"), "{line}");
        assert!(line.ends_with("; host pinned 55.3-55.6 GB/s"), "{line}");
        assert_eq!(span(&[392.4], 0), "392");
        assert_eq!(span(&[391.6, 396.2], 0), "392-396");
    }

    #[test]
    fn real_report_has_no_banner() {
        let report = NodeReport {
            simulated: false,
            node: Some("gpu-node-1".into()),
            verdict: Verdict::Error,
            failures: vec!["no GPUs found".into()],
            topology: Some(TopologyReport::default()),
            ..Default::default()
        };
        let text = table(&report);
        assert!(!text.contains("SIMULATED"));
        assert!(text.starts_with("GPU  NAME"));
        assert!(
            text.contains("topology: Pass\nnode gpu-node-1: Error\n  - no GPUs found\n"),
            "{text}"
        );
    }

    #[test]
    fn io_line_shows_how_and_how_fast() {
        let mut report = NodeReport {
            io: Some(IoResult {
                verdict: Verdict::Pass,
                dir: "/data".into(),
                fs_type: Some("xfs".into()),
                files: 4,
                file_size_mib: 1024,
                concurrency: 4,
                bytes: 4 << 30,
                write_mbps: 1520.4,
                read_mbps: 2110.0,
                direct_io: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = table(&report);
        assert!(
            text.contains("topology: not checked\nio: Pass (4 × 1024 MiB in /data, xfs, O_DIRECT, 4 workers): write 1520 MB/s, read 2110 MB/s, 0 bad words\n"),
            "{text}"
        );
        report.io = Some(IoResult {
            verdict: Verdict::Error,
            ..Default::default()
        });
        assert!(table(&report).contains("\nio: Error\n"));
        report.io = None;
        assert!(!table(&report).contains("io:"));
    }

    #[test]
    fn checks_that_did_not_run_show_their_verdict() {
        let report = NodeReport {
            gpus: vec![GpuReport {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                verdict: Verdict::Error,
                memory: Some(MemoryResult {
                    verdict: Verdict::Error,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = table(&report);
        let row = text.lines().nth(1).unwrap_or_default();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            [
                "0", "NVIDIA", "H100", "80GB", "HBM3", "Error", "-", "-", "-", "Error"
            ]
        );
        assert!(text.contains("topology: not checked"));
    }
}
