//! The human table the agent prints: one row per GPU, then topology, then the node verdict
//! and its failures. Plain text, no colours.

use gpuval_crds::{ComputeResult, GpuReport, IoResult, MemoryResult, NodeReport, TelemetrySummary};

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
