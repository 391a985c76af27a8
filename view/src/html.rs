//! One self-contained HTML page: inline CSS and SVG, no script, nothing fetched. Per node: the
//! verdict and its reasons, the per-GPU table (with the burn's power), p2p bandwidth and
//! latency heatmaps, host and I/O figures, NCCL bus bandwidth against message size, telemetry
//! ranges, and the topology.
//!
//! The nodes that did not pass come first, and each node's detail is a `<details>` element:
//! open for the first few that did not pass (every node on a small page), collapsed for the
//! rest. On a page of more than [`CHARTS_UP_TO`] nodes, the nodes that passed keep their GPU
//! table and leave out the charts, so that a 1,000-node run stays one page of a few MB that a
//! browser opens at once (the JSON report keeps every figure).

use std::fmt::Write;

use gpuval_crds::{GpuReport, NcclResult, NodeReport, P2pResult, TopologyReport};

use crate::svg::{self, BarRow, Heatmap, RangeRow, Series, escape, num};
use crate::{Document, NodeEntry};

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#111;max-width:1400px}\
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ccc}h3{font-size:15px}\
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}\
th{background:#f4f4f4}td.l,th.l{text-align:left}.v-Pass{color:#137333}.v-Warn{color:#b06000}\
.v-Fail,.v-Error{color:#c5221f;font-weight:600}.v-Skipped{color:#777}\
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}\
.b-Pass{background:#137333}.b-Warn{background:#b06000}.b-Fail,.b-Error{background:#c5221f}.b-Skipped{background:#777}\
.sim{background:#c5221f;color:#fff;font-size:20px;font-weight:700;padding:12px 16px;margin:12px 0}\
.reasons li{color:#c5221f}.figs{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}\
svg .t{font-size:13px;font-weight:600}svg .ax{font-size:11px;fill:#444}svg .v{font-size:11px}\
.note{color:#555}details>summary{cursor:pointer}details>summary h2{display:inline-block;margin:16px 0 8px}";

/// Pages with at most this many nodes show every node's charts and open every node.
pub const CHARTS_UP_TO: usize = 8;
/// On larger pages, how many of the nodes that did not pass open at once.
const OPEN_FAILING: usize = 10;

/// The page for `doc`.
pub fn html(doc: &Document) -> String {
    let mut s = String::with_capacity(64 * 1024);
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>",
        escape(&doc.title)
    );
    if doc.simulated() {
        s.push_str("<div class=\"sim\" id=\"simulated\">SIMULATED: these figures come from the simulated GPU backend (tests and demos only). They say nothing about real hardware.</div>");
    }
    let worst = doc.worst();
    let _ = write!(
        s,
        "<h1>{} <span class=\"badge b-{worst}\">{worst}</span></h1>",
        escape(&doc.title)
    );
    if let Some(v) = &doc.validation {
        let _ = write!(
            s,
            "<p>Validation <b>{}</b>: {} ({} nodes selected, {} reports)</p>",
            escape(&v.name),
            escape(&v.phase),
            v.selected,
            doc.reports().count()
        );
        if let Some(why) = v.why_no_reports(doc.reports().count()) {
            let _ = write!(s, "<p id=\"why\"><b>{}</b></p>", escape(why));
        }
        list(&mut s, "reasons", &v.reasons);
        if let Some(f) = &v.fabric {
            let _ = write!(
                s,
                "<h2>Fabric</h2><p id=\"fabric\">{}</p>",
                escape(&f.text())
            );
        }
    }
    let order = worst_first_order(doc);
    s.push_str(&overview(doc, &order));
    let small = doc.nodes.len() <= CHARTS_UP_TO;
    for (rank, &i) in order.iter().enumerate() {
        let n = &doc.nodes[i];
        let passed = passes(n);
        let detail = Detail {
            open: small || (!passed && rank < OPEN_FAILING),
            charts: small || !passed,
        };
        node_section(&mut s, n, detail);
    }
    s.push_str("</body></html>\n");
    s
}

/// Whether a node passed, as its final line says (a node without a report did not).
fn passes(n: &NodeEntry) -> bool {
    n.passes()
}

/// The nodes' positions, those that did not pass first (the worst verdict first), each group in
/// the document's order.
fn worst_first_order(doc: &Document) -> Vec<usize> {
    let mut order: Vec<usize> = (0..doc.nodes.len()).collect();
    order.sort_by_key(|&i| {
        let n = &doc.nodes[i];
        (
            passes(n),
            std::cmp::Reverse(n.report.as_ref().map(|_| n.verdict())),
        )
    });
    order
}

/// How much of a node's section the page shows.
#[derive(Clone, Copy)]
struct Detail {
    /// The `<details>` element starts open.
    open: bool,
    /// The SVG charts (heatmaps, curves, ranges, bars) are on the page.
    charts: bool,
}

/// A table of the nodes (in `order`) with their verdict and first failure.
fn overview(doc: &Document, order: &[usize]) -> String {
    let mut s = String::from(
        "<table id=\"nodes\"><tr><th class=\"l\">node</th><th class=\"l\">verdict</th><th>GPUs</th><th class=\"l\">first failure</th></tr>",
    );
    for n in order.iter().map(|&i| &doc.nodes[i]) {
        let (verdict, gpus, first) = n.headline();
        let _ = write!(
            s,
            "<tr><td class=\"l\"><a href=\"#node-{id}\">{}</a></td><td class=\"l v-{verdict}\">{verdict}</td><td>{gpus}</td><td class=\"l\">{}</td></tr>",
            escape(&n.node),
            escape(&first),
            id = anchor(&n.node)
        );
    }
    s.push_str("</table>");
    s
}

/// An id-safe form of a node name.
fn anchor(node: &str) -> String {
    node.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

fn list<T: std::fmt::Display>(s: &mut String, class: &str, items: &[T]) {
    if items.is_empty() {
        return;
    }
    let _ = write!(s, "<ul class=\"{class}\">");
    for i in items {
        let _ = write!(s, "<li>{}</li>", escape(&i.to_string()));
    }
    s.push_str("</ul>");
}

fn node_section(s: &mut String, n: &NodeEntry, detail: Detail) {
    let id = anchor(&n.node);
    let Some(r) = &n.report else {
        let _ = write!(
            s,
            "<section id=\"node-{id}\"><h2>{} <span class=\"badge b-Error\">no report</span></h2><p class=\"reasons\">{}</p></section>",
            escape(&n.node),
            escape(n.message.as_deref().unwrap_or("no result was written"))
        );
        return;
    };
    let _ = write!(
        s,
        "<details id=\"node-{id}\"{}><summary><h2>{} <span class=\"badge b-{v}\">{v}</span></h2></summary>",
        if detail.open { " open" } else { "" },
        escape(&n.node),
        v = n.verdict()
    );
    if let Some(l) = n.line.as_ref().filter(|l| l.verdict != r.verdict) {
        let _ = write!(
            s,
            "<p class=\"reasons\" id=\"line-{id}\">{} ({} evidence): {}</p>",
            l.verdict,
            escape(&l.evidence),
            escape(&l.message)
        );
    }
    node_facts(s, n, r);
    list(s, "reasons", &crate::worst_first(&r.failures));
    gpu_table(s, &id, &r.gpus);
    if detail.charts {
        if let Some(p) = &r.p2p {
            p2p_section(s, &id, r.gpus.len(), p);
        }
        host_section(s, &id, r);
    }
    io_section(s, &id, r);
    if let Some(nccl) = r.nccl.as_ref().filter(|_| detail.charts) {
        nccl_section(s, &id, nccl);
    }
    if let Some(t) = &r.training {
        training_section(s, &id, t);
    }
    if detail.charts {
        telemetry_section(s, &id, &r.gpus);
    } else {
        s.push_str("<p class=\"note\">Charts of nodes that passed are left out of large pages; <code>-o json</code> has every figure.</p>");
    }
    throttle_notes(s, &r.gpus);
    if let Some(t) = r.topology.as_ref().filter(|_| detail.charts) {
        topology_section(s, t);
    }
    s.push_str("</details>");
}

fn node_facts(s: &mut String, n: &NodeEntry, r: &NodeReport) {
    let sys = r.system.clone().unwrap_or_default();
    let _ = write!(
        s,
        "<p class=\"note\">{} to {} · backend {}{} · agent {} · driver {} · CUDA {}{}</p>",
        escape(&r.started_at),
        escape(&r.finished_at),
        escape(&r.backend),
        if r.simulated { " (SIMULATED)" } else { "" },
        escape(&r.agent_version),
        escape(sys.driver_version.as_deref().unwrap_or("?")),
        escape(sys.cuda_driver_version.as_deref().unwrap_or("?")),
        n.result
            .as_deref()
            .map(|r| format!(" · result {}", escape(r)))
            .unwrap_or_default()
    );
}

/// The dtypes any GPU burned, in the API's order.
fn dtypes(gpus: &[GpuReport]) -> Vec<gpuval_crds::Dtype> {
    gpuval_crds::Dtype::ALL
        .into_iter()
        .filter(|d| {
            gpus.iter()
                .flat_map(|g| g.compute.iter().flat_map(|c| &c.gemms))
                .any(|g| g.dtype == *d)
        })
        .collect()
}

/// A GPU's highest power draw in the run: the telemetry's maximum (which the agent keeps at or
/// above the burn's), else the burn's own.
fn max_power(g: &GpuReport) -> Option<f64> {
    let tel = g.telemetry.as_ref().and_then(|t| t.power_w).map(|t| t.max);
    let burn = g
        .compute
        .as_ref()
        .and_then(|c| c.power.as_ref())
        .map(|p| p.max_w);
    match (tel, burn) {
        (Some(t), Some(b)) => Some(t.max(b)),
        (t, b) => t.or(b),
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(num).unwrap_or_else(|| "–".into())
}

fn gpu_table(s: &mut String, id: &str, gpus: &[GpuReport]) {
    if gpus.is_empty() {
        return;
    }
    let dts = dtypes(gpus);
    let _ = write!(
        s,
        "<h3>GPUs</h3><table id=\"gpus-{id}\" class=\"gpus\"><tr><th>GPU</th><th class=\"l\">model</th><th class=\"l\">UUID</th><th>PCIe</th><th class=\"l\">verdict</th><th>memory GB/s</th>"
    );
    for d in &dts {
        let _ = write!(s, "<th>{d} TFLOP/s</th>");
    }
    s.push_str("<th>host→GPU GB/s</th><th>GPU→host GB/s</th><th>max °C</th><th>burn W median</th><th>max W</th><th>of power limit</th><th class=\"l\">reasons</th></tr>");
    for g in gpus {
        let h = g.health.clone().unwrap_or_default();
        let pcie = match (h.pcie_gen, h.pcie_width) {
            (Some(gen_), Some(w)) => format!("Gen{gen_} x{w}"),
            _ => "–".into(),
        };
        let pinned = g.host_transfer.as_ref().and_then(|h| h.pinned);
        let tel = g.telemetry.as_ref();
        let _ = write!(
            s,
            "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{pcie}</td><td class=\"l v-{v}\">{v}</td><td>{}</td>",
            g.index,
            escape(&g.name),
            escape(&g.uuid),
            opt(g.memory.as_ref().map(|m| m.gbps)),
            v = g.verdict
        );
        for d in &dts {
            let t = g
                .compute
                .iter()
                .flat_map(|c| &c.gemms)
                .find(|x| x.dtype == *d);
            let _ = write!(s, "<td>{}</td>", opt(t.map(|t| t.tflops)));
        }
        let burn = g.compute.as_ref().and_then(|c| c.power.as_ref());
        let _ = write!(
            s,
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l reason\">{}</td></tr>",
            opt(pinned.map(|p| p.h2d_gbps)),
            opt(pinned.map(|p| p.d2h_gbps)),
            opt(tel.and_then(|t| t.temperature_c).map(|t| t.max)),
            opt(burn.map(|p| p.median_w)),
            opt(max_power(g)),
            burn.and_then(|p| p.fraction)
                .map_or_else(|| "–".into(), |f| format!("{:.0}%", f * 100.0)),
            escape(
                &crate::worst_first(&g.reasons)
                    .iter()
                    .map(|r| r.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        );
    }
    s.push_str("</table>");
}

/// A square matrix over `n` GPUs from the pairs, by `value`.
fn pair_matrix(
    n: usize,
    p: &P2pResult,
    value: impl Fn(&gpuval_crds::P2pPair) -> Option<f64>,
) -> Vec<Vec<Option<f64>>> {
    let mut m = vec![vec![None; n]; n];
    for pair in &p.pairs {
        let (Ok(i), Ok(j)) = (usize::try_from(pair.src), usize::try_from(pair.dst)) else {
            continue;
        };
        if i < n && j < n {
            m[i][j] = value(pair);
        }
    }
    m
}

fn p2p_section(s: &mut String, id: &str, gpus: usize, p: &P2pResult) {
    let n = p
        .pairs
        .iter()
        .map(|q| q.src.max(q.dst) + 1)
        .max()
        .and_then(|m| usize::try_from(m).ok())
        .unwrap_or(0)
        .max(gpus);
    let labels: Vec<String> = (0..n).map(|i| format!("GPU{i}")).collect();
    let bad: Vec<(usize, usize)> = p
        .pairs
        .iter()
        .filter(|q| q.verdict.is_bad())
        .filter_map(|q| Some((usize::try_from(q.src).ok()?, usize::try_from(q.dst).ok()?)))
        .collect();
    let _ = write!(
        s,
        "<h3>Peer to peer <span class=\"v-{v}\">{v}</span></h3>",
        v = p.verdict
    );
    list(s, "reasons", &p.reasons);
    list(s, "note", &p.nvlink_errors);
    s.push_str("<div class=\"figs\">");
    type Pick = fn(&gpuval_crds::P2pPair) -> Option<f64>;
    let maps: [(&str, &str, &str, bool, Pick); 4] = [
        ("p2p-uni", "unidirectional bandwidth", "GB/s", false, |q| {
            Some(q.unidirectional_gbps)
        }),
        ("p2p-bi", "bidirectional bandwidth", "GB/s", false, |q| {
            Some(q.bidirectional_gbps)
        }),
        ("p2p-copy-latency", "copy latency", "µs", true, |q| {
            Some(q.copy_latency_micros)
        }),
        ("p2p-load-latency", "load latency", "ns", true, |q| {
            q.load_latency_nanos
        }),
    ];
    for (key, title, unit, lower, pick) in maps {
        let cells = pair_matrix(n, p, pick);
        if cells.iter().flatten().all(Option::is_none) {
            continue;
        }
        s.push_str(&svg::heatmap(&Heatmap {
            id: &format!("{key}-{id}"),
            title,
            unit,
            labels: &labels,
            cells: &cells,
            bad: &bad,
            lower_is_better: lower,
        }));
    }
    s.push_str("</div>");
}

fn host_section(s: &mut String, id: &str, r: &NodeReport) {
    let rows: Vec<BarRow> = r
        .gpus
        .iter()
        .filter_map(|g| {
            let h = g.host_transfer.as_ref()?;
            let pick = |t: Option<gpuval_crds::TransferRates>| t.map(|t| [t.h2d_gbps, t.d2h_gbps]);
            let mut values = Vec::new();
            for rates in [pick(h.pinned), pick(h.pinned_concurrent), pick(h.pageable)] {
                values.extend(rates.unwrap_or([0.0, 0.0]));
            }
            Some(BarRow {
                label: format!("GPU{}", g.index),
                values,
            })
        })
        .collect();
    if !rows.is_empty() {
        s.push_str("<h3>Host links</h3>");
        s.push_str(&svg::bars(
            &format!("host-{id}"),
            "host transfers",
            "GB/s",
            &[
                "pinned host→GPU",
                "pinned GPU→host",
                "all GPUs at once host→GPU",
                "all GPUs at once GPU→host",
                "pageable host→GPU",
                "pageable GPU→host",
            ],
            &rows,
        ));
    }
}

/// The file I/O check: its figures, or "not run" where it wrote nothing (a check that could
/// not start has no speeds, not zero ones).
fn io_section(s: &mut String, id: &str, r: &NodeReport) {
    let Some(io) = &r.io else {
        return;
    };
    let _ = write!(
        s,
        "<h3>File I/O <span class=\"v-{v}\">{v}</span></h3><table id=\"io-{id}\"><tr><th class=\"l\">directory</th><th class=\"l\">fs</th><th>files × MiB</th><th>write MB/s</th><th>read MB/s</th><th class=\"l\">direct I/O</th><th>mismatches</th></tr>",
        v = io.verdict
    );
    if io.bytes > 0 {
        let _ = write!(
            s,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{} × {}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td></tr></table>",
            escape(&io.dir),
            escape(io.fs_type.as_deref().unwrap_or("–")),
            io.files,
            io.file_size_mib,
            num(io.write_mbps),
            num(io.read_mbps),
            if io.direct_io { "yes" } else { "no" },
            io.mismatches,
        );
    } else {
        let _ = write!(
            s,
            "<tr><td class=\"l\">{}</td><td class=\"l not-run\" colspan=\"6\">not run</td></tr></table>",
            escape(if io.dir.is_empty() { "–" } else { &io.dir }),
        );
    }
    list(s, "reasons", &io.reasons);
}

fn training_section(s: &mut String, id: &str, t: &gpuval_crds::TrainingResult) {
    let _ = write!(
        s,
        "<h3>Training step <span class=\"v-{v}\">{v}</span></h3><table id=\"training-{id}\"><tr><th>GPUs</th><th>timed steps</th><th>step ms</th><th>samples/s</th><th>samples/s per GPU</th><th>TFLOP/s per GPU</th><th>exposed comm</th><th>scaling</th><th class=\"l\">replicas</th></tr>",
        v = t.verdict
    );
    let replicas = if t.replicas.identical {
        format!("identical at {} comparisons", t.replicas.comparisons)
    } else {
        "diverged".to_string()
    };
    match &t.figures {
        Some(f) => {
            let _ = write!(
                s,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}%</td><td>{}%</td><td class=\"l\">{}</td></tr></table>",
                t.gpus.len(),
                t.steps,
                num(f.step_millis),
                num(f.samples_per_second),
                num(f.samples_per_second_per_gpu),
                num(f.tflops_per_gpu),
                num(f.exposed_comm_fraction * 100.0),
                num(f.scaling_efficiency * 100.0),
                escape(&replicas),
            );
        }
        None => {
            let _ = write!(
                s,
                "<tr><td>{}</td><td class=\"l not-run\" colspan=\"8\">no step measured</td></tr></table>",
                t.gpus.len()
            );
        }
    }
    list(s, "reasons", &t.reasons);
}

fn nccl_section(s: &mut String, id: &str, n: &NcclResult) {
    let _ = write!(
        s,
        "<h3>NCCL <span class=\"v-{v}\">{v}</span></h3><p class=\"note\">{} ranks · {} · NCCL {}{}</p>",
        n.gpus.len(),
        n.dtype,
        escape(n.nccl_version.as_deref().unwrap_or("?")),
        n.sweep
            .as_ref()
            .and_then(|s| s.transport.as_ref())
            .map(|t| format!(" · transports {}", escape(&t.kinds.join(", "))))
            .unwrap_or_default(),
        v = n.verdict
    );
    list(s, "reasons", &n.reasons);
    let mut series = Vec::new();
    for (sweep, off) in [(&n.sweep, false), (&n.p2p_off, true)] {
        for c in sweep.iter().flat_map(|s| &s.curves) {
            series.push(Series {
                name: format!("{}{}", c.collective, if off { " (p2p off)" } else { "" }),
                points: c
                    .rows
                    .iter()
                    .map(|r| (r.bytes as f64, r.busbw_gbps))
                    .collect(),
                dashed: off,
            });
        }
    }
    if !series.is_empty() {
        s.push_str(&svg::curves(
            &format!("nccl-busbw-{id}"),
            "NCCL bus bandwidth against message size",
            "bus bandwidth GB/s",
            &series,
        ));
    }
    for sweep in [&n.sweep, &n.p2p_off].into_iter().flatten() {
        if let Some(e) = &sweep.error {
            list(s, "reasons", std::slice::from_ref(e));
        }
    }
}

fn telemetry_section(s: &mut String, id: &str, gpus: &[GpuReport]) {
    type Pick = fn(&gpuval_crds::TelemetrySummary) -> Option<gpuval_crds::Stat>;
    let picks: [(&str, &str, &str, Pick); 4] = [
        ("sm-clock", "SM clock", "MHz", |t| t.sm_clock_mhz),
        ("temperature", "temperature", "°C", |t| t.temperature_c),
        ("power", "power", "W", |t| t.power_w),
        ("memory-clock", "memory clock", "MHz", |t| {
            t.memory_clock_mhz
        }),
    ];
    let samples: i64 = gpus
        .iter()
        .filter_map(|g| g.telemetry.as_ref().map(|t| t.samples))
        .max()
        .unwrap_or(0);
    if samples == 0 {
        return;
    }
    let _ = write!(
        s,
        "<h3>Telemetry</h3><p class=\"note\">Sampled through the run ({samples} samples a GPU); the report keeps each value's minimum, mean and maximum.</p><div class=\"figs\">"
    );
    for (key, title, unit, pick) in picks {
        let rows: Vec<RangeRow> = gpus
            .iter()
            .filter_map(|g| {
                let st = pick(g.telemetry.as_ref()?)?;
                Some(RangeRow {
                    label: format!("GPU{}", g.index),
                    min: st.min,
                    mean: st.mean,
                    max: st.max,
                })
            })
            .collect();
        if !rows.is_empty() {
            s.push_str(&svg::ranges(&format!("{key}-{id}"), title, unit, &rows));
        }
    }
    s.push_str("</div>");
}

/// What the telemetry saw worth a look: clocks slowed by hardware or heat (the power cap and
/// other healthy throttle reasons are not flagged) and Xids.
fn throttle_notes(s: &mut String, gpus: &[GpuReport]) {
    let events: Vec<String> = gpus
        .iter()
        .filter_map(|g| {
            let t = g.telemetry.as_ref()?;
            let mut parts = Vec::new();
            let slowed: Vec<&str> = t
                .throttle_reasons
                .iter()
                .map(String::as_str)
                .filter(|r| gpuval_crds::depth::is_slowdown(r))
                .collect();
            if !slowed.is_empty() {
                parts.push(format!("throttled: {}", slowed.join(", ")));
            }
            if !t.xid_events.is_empty() {
                parts.push(format!("Xid {:?}", t.xid_events));
            }
            (!parts.is_empty()).then(|| format!("GPU{}: {}", g.index, parts.join("; ")))
        })
        .collect();
    list(s, "note", &events);
}

fn topology_section(s: &mut String, t: &TopologyReport) {
    let _ = write!(
        s,
        "<h3>Topology <span class=\"v-{v}\">{v}</span></h3><table class=\"topo\"><tr><th></th>",
        v = t.verdict
    );
    for g in &t.gpus {
        let _ = write!(s, "<th>{}</th>", escape(g));
    }
    s.push_str("<th class=\"l\">CPU affinity</th><th class=\"l\">NUMA</th></tr>");
    for (i, row) in t.matrix.iter().enumerate() {
        let _ = write!(
            s,
            "<tr><th>{}</th>",
            escape(t.gpus.get(i).map(String::as_str).unwrap_or("?"))
        );
        for c in row {
            let _ = write!(s, "<td>{}</td>", escape(c));
        }
        let _ = write!(
            s,
            "<td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            escape(t.cpu_affinity.get(i).map(String::as_str).unwrap_or("")),
            escape(t.numa_affinity.get(i).map(String::as_str).unwrap_or(""))
        );
    }
    s.push_str("</table>");
    list(s, "reasons", &t.reasons);
    list(s, "reasons", &t.link_changes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_failing_report_says_so_and_names_the_failing_gpu() {
        let doc = Document::single("report.json", crate::sample::report());
        let page = html(&doc);
        assert!(page.contains("id=\"simulated\""), "simulated banner");
        assert!(page.contains("memory: 2 mismatched words"));
        assert!(page.contains("id=\"p2p-uni-gpu-a\""));
        assert!(page.contains("id=\"nccl-busbw-gpu-a\""));
        assert!(page.contains("id=\"temperature-gpu-a\""));
        assert!(!page.contains("<script"), "no script");
        assert!(!page.contains("http"), "nothing fetched: {page}");
    }

    #[test]
    fn a_real_report_has_no_banner_and_names_are_escaped() {
        let mut r = crate::sample::report();
        r.simulated = false;
        r.failures = vec![gpuval_crds::Reason::new(
            gpuval_crds::Code::Unclassified,
            "<b>odd</b>",
        )];
        let page = html(&Document::single("x", r));
        assert!(!page.contains("SIMULATED"));
        assert!(page.contains("&lt;b&gt;odd&lt;/b&gt;"));
    }

    #[test]
    fn the_burns_power_is_shown_and_agrees_with_the_runs_maximum() {
        let mut r = crate::sample::report();
        r.gpus[0].compute.as_mut().expect("compute").power =
            Some(gpuval_crds::depth::PowerResult {
                samples: 100,
                median_w: 651.0,
                max_w: 690.0,
                fraction: Some(0.93),
                ..Default::default()
            });
        r.gpus[0].telemetry = Some(gpuval_crds::TelemetrySummary {
            samples: 10,
            power_w: Some(gpuval_crds::Stat {
                min: 90.0,
                mean: 300.0,
                max: 422.0,
            }),
            ..Default::default()
        });
        let page = html(&Document::single("x", r));
        assert!(page.contains("<th>burn W median</th>"), "{page}");
        let row = page
            .split("<tr><td>0</td>")
            .nth(1)
            .and_then(|s| s.split("</tr>").next())
            .expect("GPU0's row");
        assert!(
            row.contains("<td>651</td><td>690</td><td>93%</td>"),
            "median, the run's maximum (not the sampler's 422) and the share: {row}"
        );
    }

    #[test]
    fn an_io_check_that_did_not_run_says_so_instead_of_zeros() {
        let mut r = crate::sample::report();
        r.io = Some(gpuval_crds::IoResult {
            verdict: gpuval_crds::Verdict::Error,
            reasons: vec![gpuval_crds::Reason::new(
                gpuval_crds::Code::IoError,
                "no directory for the io check",
            )],
            ..Default::default()
        });
        let page = html(&Document::single("x", r));
        let io = page
            .split("<table id=\"io-gpu-a\">")
            .nth(1)
            .and_then(|s| s.split("</table>").next())
            .expect("the io table");
        assert!(io.contains("not run"), "{io}");
        assert!(!io.contains("<td>0</td>") && !io.contains(">?<"), "{io}");
    }

    #[test]
    fn only_throttle_reasons_that_slow_the_clocks_are_flagged() {
        let mut r = crate::sample::report();
        for (g, reasons) in r
            .gpus
            .iter_mut()
            .zip([vec!["SwPowerCap"], vec!["SwPowerCap", "HwSlowdown"]])
        {
            g.telemetry = Some(gpuval_crds::TelemetrySummary {
                samples: 5,
                throttle_reasons: reasons.into_iter().map(String::from).collect(),
                ..Default::default()
            });
        }
        let page = html(&Document::single("x", r));
        assert!(!page.contains("SwPowerCap"), "healthy: not flagged");
        assert!(page.contains("GPU1: throttled: HwSlowdown"), "{page}");
    }

    #[test]
    fn a_thousand_node_page_leads_with_failing_nodes_and_stays_small() {
        let mut passing = crate::sample::report();
        passing.verdict = gpuval_crds::Verdict::Pass;
        passing.failures.clear();
        let failing = crate::sample::report();
        let nodes: Vec<NodeEntry> = (0..1000)
            .map(|i| NodeEntry {
                node: format!("gpu-{i:04}"),
                report: Some(if i % 100 == 7 {
                    failing.clone()
                } else {
                    passing.clone()
                }),
                ..Default::default()
            })
            .collect();
        let doc = Document {
            title: "validation big".into(),
            validation: None,
            nodes,
        };
        let page = html(&doc);
        assert!(page.len() <= 10 << 20, "{} bytes", page.len());
        let first_rows: Vec<&str> = page
            .split("<tr><td class=\"l\"><a href=\"#node-")
            .skip(1)
            .take(10)
            .map(|r| r.split('"').next().unwrap_or_default())
            .collect();
        let failing_names: Vec<String> =
            (0..10).map(|k| format!("gpu-{:04}", k * 100 + 7)).collect();
        assert_eq!(first_rows, failing_names, "failing nodes first");
        assert_eq!(
            page.matches("\" open>").count(),
            10,
            "only failing nodes open"
        );
        let single = html(&Document::single("one", failing.clone()));
        assert_eq!(
            page.matches("<svg").count(),
            10 * single.matches("<svg").count(),
            "charts only for the failing nodes"
        );
        assert!(
            page.len() < 1000 * single.len() / 4,
            "a passing node costs far less than a full one: {} vs {} a node",
            page.len() / 1000,
            single.len()
        );
    }

    #[test]
    fn a_node_without_a_report_says_why() {
        let doc = Document {
            title: "validation v".into(),
            validation: None,
            nodes: vec![NodeEntry {
                node: "gpu-b".into(),
                message: Some("agent pod failed: OOMKilled".into()),
                ..Default::default()
            }],
        };
        let page = html(&doc);
        assert!(page.contains("agent pod failed: OOMKilled"));
        assert!(page.contains("no report"));
    }

    /// A validation that Failed on its fabric test though every node's own checks passed: the
    /// headline never says Pass, and the node the fabric named shows Fail in its row, badge and
    /// words (its final line), not its report's Pass.
    #[test]
    fn the_headline_and_each_row_read_the_final_line() {
        let mut passing = crate::sample::report();
        passing.failures.clear();
        passing.verdict = gpuval_crds::Verdict::Pass;
        let entry = |node: &str, line: Option<crate::LineView>| NodeEntry {
            node: node.into(),
            report: Some(passing.clone()),
            line,
            ..Default::default()
        };
        let named = crate::LineView {
            verdict: gpuval_crds::Verdict::Fail,
            evidence: "Hardware".into(),
            message: "fabric: in 3 of 4 TCP pairs 7.7 Gb/s below 25".into(),
        };
        let doc = Document {
            title: "validation fabric-noib".into(),
            validation: Some(crate::ValidationLine {
                name: "fabric-noib".into(),
                phase: "Failed".into(),
                selected: 2,
                fabric: Some(crate::FabricLine {
                    phase: "Failed".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            nodes: vec![entry("vm-1", None), entry("vm-3", Some(named))],
        };
        let page = html(&doc);
        assert!(
            page.contains("<span class=\"badge b-Fail\">Fail</span></h1>"),
            "{page}"
        );
        assert!(!page.contains("b-Pass\">Pass</span></h1>"), "{page}");
        assert!(
            page.contains(
                "<td class=\"l v-Fail\">Fail</td><td>2</td><td class=\"l\">fabric: in 3 of 4"
            ),
            "{page}"
        );
        assert!(page.contains("id=\"line-vm-3\""), "{page}");
        let md = crate::markdown(&doc);
        assert!(md.contains("| vm-3 | Fail |"), "{md}");
        assert!(md.contains("## vm-3: Fail"), "{md}");
        assert!(
            crate::tree(&doc).contains("vm-3  Fail"),
            "{}",
            crate::tree(&doc)
        );
        // Without a fabric failure, a Failed run whose nodes have no hardware verdict is Error.
        let mut quiet = doc.clone();
        quiet.nodes.truncate(1);
        if let Some(v) = quiet.validation.as_mut() {
            v.fabric = None;
        }
        assert_eq!(quiet.worst(), gpuval_crds::Verdict::Error);
    }
}
