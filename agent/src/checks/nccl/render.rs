//! The check's part of the agent's table (rows like `all_reduce_perf`'s: size, count, then
//! time, algbw, busbw and wrong elements out of place and in place) and of the node's
//! headline.

use gpuval_crds::{Collective, NcclCurve, NcclResult, NcclSweep, NcclTransport};

use crate::nccl::bandwidth::human_bytes;

/// The section, ending with a newline; one line when nothing was measured.
pub fn section(r: &NcclResult) -> String {
    let mut out = format!("nccl: {}", r.verdict);
    let mut how = Vec::new();
    if !r.gpus.is_empty() {
        how.push(format!("{} GPUs", r.gpus.len()));
    }
    how.push(format!(
        "{}, {} iterations after {} warm-up",
        r.dtype, r.iterations, r.warmup_iterations
    ));
    if let Some(v) = &r.nccl_version {
        how.push(format!("NCCL {v}"));
    }
    out.push_str(&format!(" ({})\n", how.join(", ")));
    if let Some(s) = &r.sweep {
        out.push_str(&sweep_text(s, ""));
    }
    if let Some(s) = &r.p2p_off {
        out.push_str(&sweep_text(s, " with P2P off"));
    }
    for reason in &r.reasons {
        out.push_str(&format!("  - {reason}\n"));
    }
    out
}

fn sweep_text(s: &NcclSweep, label: &str) -> String {
    let mut out = String::new();
    if let Some(t) = &s.transport {
        out.push_str(&format!("  transport{label}: {}\n", transport_line(t)));
    }
    for c in &s.curves {
        out.push_str(&format!("  {}{label}:\n", c.collective));
        out.push_str(&curve_table(c));
    }
    out
}

/// `P2P/CUMEM, 24 channels`.
fn transport_line(t: &NcclTransport) -> String {
    let kinds = if t.kinds.is_empty() {
        "not in NCCL's log".to_string()
    } else {
        t.kinds.join(", ")
    };
    match t.channels {
        Some(n) => format!("{kinds}, {n} channels"),
        None => kinds,
    }
}

/// Right-aligned columns like nccl-tests' output.
fn curve_table(c: &NcclCurve) -> String {
    let mut rows: Vec<[String; 9]> = vec![
        [
            "size(B)",
            "count",
            "time(us)",
            "algbw",
            "busbw",
            "#wrong",
            "ip time(us)",
            "ip algbw",
            "ip busbw",
        ]
        .map(String::from),
    ];
    for r in &c.rows {
        let opt =
            |v: Option<f64>, d: usize| v.map_or_else(|| "-".to_string(), |v| format!("{v:.d$}"));
        rows.push([
            r.bytes.to_string(),
            r.count.to_string(),
            format!("{:.2}", r.time_micros),
            format!("{:.2}", r.algbw_gbps),
            format!("{:.2}", r.busbw_gbps),
            r.wrong.to_string(),
            opt(r.in_place_time_micros, 2),
            opt(r.in_place_algbw_gbps, 2),
            opt(r.in_place_busbw_gbps, 2),
        ]);
    }
    let widths: Vec<usize> = (0..9)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:>w$}"))
                .collect();
            format!("    {}\n", cells.join("  "))
        })
        .collect()
}

/// `all-reduce 362 GB/s busbw at 4 GiB` (the largest size of all-reduce, or of the first
/// collective measured when all-reduce was not); None when nothing was measured.
pub fn headline(r: &NcclResult) -> Option<String> {
    let curves = &r.sweep.as_ref()?.curves;
    let c = curves
        .iter()
        .find(|c| c.collective == Collective::AllReduce)
        .or_else(|| curves.first())?;
    let last = c.rows.last()?;
    let name = match c.collective {
        Collective::AllReduce => "all-reduce".to_string(),
        other => other.to_string(),
    };
    let mut line = format!(
        "{name} {:.0} GB/s busbw at {}",
        last.busbw_gbps,
        human_bytes(u64::try_from(last.bytes).unwrap_or(0))
    );
    if let Some(off) = r
        .p2p_off
        .as_ref()
        .and_then(|s| s.curves.iter().find(|o| o.collective == c.collective))
        .and_then(|o| o.rows.last())
    {
        line.push_str(&format!(" (P2P off {:.0})", off.busbw_gbps));
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::{NcclDtype, NcclRow, Verdict};

    fn row(bytes: i64, us: f64, busbw: f64) -> NcclRow {
        NcclRow {
            bytes,
            count: bytes / 2,
            time_micros: us,
            algbw_gbps: busbw,
            busbw_gbps: busbw,
            in_place_time_micros: Some(us),
            in_place_algbw_gbps: Some(busbw),
            in_place_busbw_gbps: Some(busbw),
            wrong: 0,
        }
    }

    fn result() -> NcclResult {
        NcclResult {
            verdict: Verdict::Pass,
            gpus: vec![0, 1],
            dtype: NcclDtype::Bf16,
            iterations: 20,
            warmup_iterations: 5,
            nccl_version: Some("2.28.3".into()),
            sweep: Some(NcclSweep {
                transport: Some(NcclTransport {
                    channels: Some(24),
                    kinds: vec!["P2P/CUMEM".into()],
                    links: vec![],
                }),
                curves: vec![NcclCurve {
                    collective: Collective::AllReduce,
                    rows: vec![row(8, 12.5, 0.0), row(4 << 30, 11_930.0, 360.04)],
                }],
                error: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_section_reads_like_all_reduce_perf() {
        let text = section(&result());
        assert!(
            text.starts_with(
                "nccl: Pass (2 GPUs, bf16, 20 iterations after 5 warm-up, NCCL 2.28.3)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("  transport: P2P/CUMEM, 24 channels\n  allReduce:\n"),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        let header = lines
            .iter()
            .position(|l| l.contains("size(B)"))
            .expect("a header");
        let cells = |i: usize| lines[i].split_whitespace().collect::<Vec<_>>();
        assert_eq!(
            cells(header + 1),
            [
                "8", "4", "12.50", "0.00", "0.00", "0", "12.50", "0.00", "0.00"
            ]
        );
        assert_eq!(
            cells(header + 2)[..6],
            [
                "4294967296",
                "2147483648",
                "11930.00",
                "360.04",
                "360.04",
                "0"
            ]
        );
        assert_eq!(
            lines[header + 1].len(),
            lines[header].len(),
            "right-aligned columns"
        );
    }

    #[test]
    fn the_headline_gives_all_reduce_at_the_largest_size() {
        let mut r = result();
        assert_eq!(
            headline(&r).as_deref(),
            Some("all-reduce 360 GB/s busbw at 4 GiB")
        );
        r.p2p_off = r.sweep.clone().map(|mut s| {
            s.curves[0].rows[1].busbw_gbps = 41.2;
            s
        });
        assert_eq!(
            headline(&r).as_deref(),
            Some("all-reduce 360 GB/s busbw at 4 GiB (P2P off 41)")
        );
        r.sweep = None;
        assert_eq!(headline(&r), None);
    }
}
