//! The human table the agent prints: one row per GPU (each per-GPU check a column), then each
//! check's section, then the node verdict and its failures; and the one-line headline the
//! validation's status carries. Plain text, no colours.

use gpuval_crds::{GpuReport, NodeReport, TelemetrySummary};

use crate::checks;
use crate::text::{columns, dash};

/// Shown first on every report from the simulated backend.
pub const SIMULATED_BANNER: &str = "SIMULATED BACKEND: figures are not from real GPUs";

/// Renders a node report as a compact table.
pub fn table(report: &NodeReport) -> String {
    let mut out = String::new();
    if report.simulated {
        out.push_str(SIMULATED_BANNER);
        out.push('\n');
    }
    let header: Vec<String> = ["GPU", "NAME"]
        .into_iter()
        .chain(checks::gpu_columns().into_iter().map(|(title, _)| title))
        .chain(["TEMP C", "POWER W", "VERDICT"])
        .map(String::from)
        .collect();
    let rows: Vec<Vec<String>> = std::iter::once(header)
        .chain(report.gpus.iter().map(gpu_row))
        .collect();
    out.push_str(&columns(&rows));
    out.push_str(&checks::sections(report));
    let node = report
        .node
        .as_deref()
        .map(|n| format!(" {n}"))
        .unwrap_or_default();
    if let Some(v) = versions_line(report) {
        out.push_str(&v);
    }
    let action = match report.action {
        gpuval_crds::Action::None => String::new(),
        a => format!(" (action: {a})"),
    };
    out.push_str(&format!("node{node}: {}{action}\n", report.verdict));
    for failure in &report.failures {
        out.push_str(&format!("  - [{}] {failure}\n", failure.code));
    }
    for warning in &report.warnings {
        out.push_str(&format!("  ~ [{}] {warning}\n", warning.code));
    }
    out
}

/// `versions: driver 570.86.15, vbios 96.00.99.00.01, cuda 12.8, nccl 2.28.3`.
fn versions_line(report: &NodeReport) -> Option<String> {
    let v = report.versions();
    let parts: Vec<String> = gpuval_crds::facts::Component::ALL
        .into_iter()
        .filter_map(|c| v.get(c).map(|x| format!("{c} {x}")))
        .collect();
    (!parts.is_empty()).then(|| format!("versions: {}\n", parts.join(", ")))
}

fn gpu_row(gpu: &GpuReport) -> Vec<String> {
    let telemetry = gpu.telemetry.as_ref();
    let mut row = vec![gpu.index.to_string(), gpu.name.clone()];
    row.extend(
        checks::gpu_columns()
            .into_iter()
            .map(|(_, cell)| cell(gpu).unwrap_or_else(dash)),
    );
    row.extend([
        telemetry.map_or_else(dash, temperature_cell),
        telemetry
            .and_then(|t| t.power_w)
            .map_or_else(dash, |p| format!("{:.0}", p.max)),
        gpu.verdict.to_string(),
    ]);
    row
}

fn temperature_cell(t: &TelemetrySummary) -> String {
    t.temperature_c
        .map_or_else(dash, |s| format!("{:.0}-{:.0}", s.min, s.max))
}

/// One line of the node's key figures (ranges over GPUs), for the validation's status:
/// `4x NVIDIA H200: memory 4344-4355 GB/s; bf16 677-687 TFLOP/s; p2p 392-396 GB/s
/// (both ways 780-785); host pinned 55.1-55.5 GB/s`. Simulated reports say so first.
pub fn headline(report: &NodeReport) -> String {
    let parts = checks::headline_parts(report);
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

#[cfg(test)]
mod tests {
    use gpuval_crds::{
        IoResult, MemoryResult, P2pPair, P2pResult, TopologyReport, TransferRates, Verdict,
    };

    use super::*;
    use crate::runner::sim_tests::simulated_report;
    use crate::text::span;

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
        assert!(
            text.contains(
                "versions: driver simulated, vbios simulated, cuda simulated, nccl simulated\nnode: Fail (action: ReplaceHardware)\n  - [MemoryMismatch] GPU2 memory: "
            ),
            "{text}"
        );
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
        report.gpus[1].host_transfer = Some(pinned(55.3, 55.6));
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

    /// A host transfer result with only its pinned rates.
    fn pinned(h2d_gbps: f64, d2h_gbps: f64) -> gpuval_crds::HostTransferResult {
        gpuval_crds::HostTransferResult {
            pinned: Some(TransferRates { h2d_gbps, d2h_gbps }),
            ..Default::default()
        }
    }

    #[test]
    fn headline_gives_ranges_of_the_key_figures() {
        let mut report = simulated_report("gpus=2");
        report.gpus[0].host_transfer = Some(pinned(55.26, 55.61));
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
            failures: vec![gpuval_crds::Reason::new(
                gpuval_crds::Code::NoGpus,
                "no GPUs found",
            )],
            topology: Some(TopologyReport::default()),
            ..Default::default()
        };
        let text = table(&report);
        assert!(!text.contains("SIMULATED"));
        assert!(text.starts_with("GPU  NAME"));
        assert!(
            text.contains("topology: Pass\nnode gpu-node-1: Error\n  - [NoGpus] no GPUs found\n"),
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
