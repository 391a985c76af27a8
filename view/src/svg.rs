//! Inline SVG figures: heatmaps, curves on a log-size axis, bars and min–max ranges. Each
//! returns one `<svg>` element with an `id`, so a page (and a test) can find it.

use std::fmt::Write;

/// Colours for the series of one chart, in turn.
const PALETTE: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// Text made safe for HTML and SVG element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number with as many decimals as its size needs (`4337`, `55.4`, `2.51`, `0.006`).
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 || a == 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A byte count the way nccl-tests sizes read (`8 B`, `256 KiB`, `4 GiB`).
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{} {}", num(v), UNITS[u])
}

/// Light to dark blue for `t` in 0..=1; and whether text on it should be white.
fn shade(t: f64) -> (String, bool) {
    let t = t.clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64| (a + (b - a) * t).round();
    let (r, g, b) = (lerp(239.0, 8.0), lerp(246.0, 48.0), lerp(255.0, 107.0));
    (format!("rgb({r},{g},{b})"), t > 0.55)
}

/// The opening `<svg>` of a figure of class `class`, `w` by `h`, with `heading` (plain text)
/// at `x`.
fn open(id: &str, class: &str, title: &str, (w, h): (f64, f64), x: f64, heading: &str) -> String {
    format!(
        r#"<svg id="{}" class="{class}" role="img" aria-label="{}" width="{w}" height="{h}" viewBox="0 0 {w} {h}"><text x="{x}" y="14" class="t">{}</text>"#,
        escape(id),
        escape(title),
        escape(heading)
    )
}

/// What a heatmap shows.
pub struct Heatmap<'a> {
    pub id: &'a str,
    pub title: &'a str,
    pub unit: &'a str,
    /// Row and column labels (row: source, column: destination).
    pub labels: &'a [String],
    /// `cells[row][col]`; None where nothing was measured (the diagonal).
    pub cells: &'a [Vec<Option<f64>>],
    /// Cells to outline in red (a failed pair).
    pub bad: &'a [(usize, usize)],
    /// True for latencies: the darkest cell is the smallest.
    pub lower_is_better: bool,
}

/// A square matrix of coloured cells with their values; darker is better.
pub fn heatmap(h: &Heatmap<'_>) -> String {
    const CELL: f64 = 62.0;
    const LEFT: f64 = 56.0;
    const TOP: f64 = 44.0;
    let n = h.labels.len();
    let values: Vec<f64> = h.cells.iter().flatten().flatten().copied().collect();
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let size = CELL * n as f64;
    let (w, ht) = (LEFT + size + 8.0, TOP + size + 8.0);
    let mut s = open(
        h.id,
        "heatmap",
        h.title,
        (w, ht),
        LEFT,
        &format!("{} ({})", h.title, h.unit),
    );
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="{}" class="ax">to GPU →</text>"#,
        TOP - 20.0
    );
    for (i, label) in h.labels.iter().enumerate() {
        let c = LEFT + CELL * (i as f64 + 0.5);
        let r = TOP + CELL * (i as f64 + 0.5);
        let _ = write!(
            s,
            r#"<text x="{c}" y="{}" class="ax" text-anchor="middle">{}</text><text x="{}" y="{r}" class="ax" text-anchor="end" dominant-baseline="middle">{}</text>"#,
            TOP - 4.0,
            escape(label),
            LEFT - 6.0,
            escape(label)
        );
    }
    for (i, row) in h.cells.iter().enumerate() {
        for (j, cell) in row.iter().enumerate() {
            let (x, y) = (LEFT + CELL * j as f64, TOP + CELL * i as f64);
            let Some(v) = cell else {
                let _ = write!(
                    s,
                    r##"<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="#eeeeee" stroke="#fff"/>"##
                );
                continue;
            };
            let t = match (h.lower_is_better, max > 0.0) {
                (false, true) => v / max,
                (true, _) if *v > 0.0 => min / v,
                _ => 0.0,
            };
            let (fill, white) = shade(t);
            let stroke = if h.bad.contains(&(i, j)) {
                r##" stroke="#d00" stroke-width="3""##
            } else {
                r##" stroke="#fff""##
            };
            let _ = write!(
                s,
                r#"<rect class="cell" x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="{fill}"{stroke}><title>{} → {}: {} {}</title></rect><text x="{}" y="{}" text-anchor="middle" dominant-baseline="middle" class="v" fill="{}">{}</text>"#,
                escape(&h.labels[i]),
                escape(&h.labels[j]),
                num(*v),
                escape(h.unit),
                x + CELL / 2.0,
                y + CELL / 2.0,
                if white { "#fff" } else { "#111" },
                num(*v)
            );
        }
    }
    s.push_str("</svg>");
    s
}

/// One line of a chart.
pub struct Series {
    pub name: String,
    /// (x, y) with x > 0; drawn in x order.
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

/// The plot of [`curves`]: width, height, and the left, right, top and bottom margins.
const CW: f64 = 640.0;
const CH: f64 = 300.0;
const CL: f64 = 56.0;
const CR: f64 = 150.0;
const CT: f64 = 26.0;
const CB: f64 = 40.0;

/// Curves against a base-2 logarithmic x axis (message sizes), y from 0.
pub fn curves(id: &str, title: &str, y_unit: &str, series: &[Series]) -> String {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::INFINITY, 0.0_f64), |(lo, hi), x| {
        (lo.min(x.max(1.0)), hi.max(x))
    });
    let (lo, hi) = (
        lo.log2().floor(),
        hi.max(2.0).log2().ceil().max(lo.log2() + 1.0),
    );
    let ymax = nice_max(
        series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max),
    );
    let px = |x: f64| CL + (x.max(1.0).log2() - lo) / (hi - lo) * (CW - CL - CR);
    let py = |y: f64| CT + (1.0 - y / ymax) * (CH - CT - CB);
    let mut s = open(id, "chart", title, (CW, CH), CL, title);
    s.push_str(&curve_axes(ymax, (lo, hi), y_unit, &px, &py));
    for (i, ser) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let mut pts = ser.points.clone();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let dash = if ser.dashed {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = write!(
            s,
            r#"<polyline class="curve" fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"><title>{}</title></polyline>"#,
            path.join(" "),
            escape(&ser.name)
        );
        for (x, y) in &pts {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{colour}"><title>{}: {} at {}</title></circle>"#,
                px(*x),
                py(*y),
                escape(&ser.name),
                num(*y),
                bytes(*x)
            );
        }
        let ly = CT + 16.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/><text x="{}" y="{ly}" class="ax" dominant-baseline="middle">{}</text>"#,
            CW - CR + 10.0,
            CW - CR + 30.0,
            CW - CR + 34.0,
            escape(&ser.name)
        );
    }
    s.push_str("</svg>");
    s
}

/// Grid, ticks and axis titles of [`curves`]: y from 0 to `ymax`, x over 2^lo..2^hi.
fn curve_axes(
    ymax: f64,
    (lo, hi): (f64, f64),
    y_unit: &str,
    px: &dyn Fn(f64) -> f64,
    py: &dyn Fn(f64) -> f64,
) -> String {
    let mut s = String::new();
    for k in 0..=4 {
        let y = ymax * f64::from(k) / 4.0;
        let _ = write!(
            s,
            r##"<line x1="{CL}" x2="{}" y1="{py}" y2="{py}" stroke="#ddd"/><text x="{}" y="{py}" class="ax" text-anchor="end" dominant-baseline="middle">{}</text>"##,
            CW - CR,
            CL - 4.0,
            num(y),
            py = py(y)
        );
    }
    let step = ((hi - lo) / 8.0).ceil().max(1.0);
    let mut e = lo;
    while e <= hi {
        let x = px(e.exp2());
        let _ = write!(
            s,
            r##"<line x1="{x}" x2="{x}" y1="{CT}" y2="{}" stroke="#eee"/><text x="{x}" y="{}" class="ax" text-anchor="middle">{}</text>"##,
            CH - CB,
            CH - CB + 14.0,
            bytes(e.exp2())
        );
        e += step;
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" class="ax" text-anchor="middle">message size</text><text x="12" y="{}" class="ax" transform="rotate(-90 12 {})" text-anchor="middle">{}</text>"#,
        (CL + CW - CR) / 2.0,
        CH - 6.0,
        CH / 2.0,
        CH / 2.0,
        escape(y_unit)
    );
    s
}

/// A round upper bound for an axis (1, 2 or 5 times a power of ten).
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|m| *m >= v)
        .unwrap_or(10.0 * p)
}

/// One row of a bar chart: a label and a value per series.
pub struct BarRow {
    pub label: String,
    pub values: Vec<f64>,
}

/// Horizontal grouped bars, one group per row, one bar per series.
pub fn bars(id: &str, title: &str, unit: &str, names: &[&str], rows: &[BarRow]) -> String {
    const L: f64 = 70.0;
    const W: f64 = 640.0;
    const BAR: f64 = 12.0;
    let max = nice_max(
        rows.iter()
            .flat_map(|r| r.values.iter().copied())
            .fold(0.0, f64::max),
    );
    let group = BAR * names.len() as f64 + 8.0;
    let h = 40.0 + group * rows.len() as f64 + 16.0 * names.len() as f64;
    let mut s = open(id, "bars", title, (W, h), L, &format!("{title} ({unit})"));
    let span = W - L - 60.0;
    for (i, row) in rows.iter().enumerate() {
        let y0 = 28.0 + group * i as f64;
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" class="ax" text-anchor="end" dominant-baseline="middle">{}</text>"#,
            L - 6.0,
            y0 + group / 2.0 - 4.0,
            escape(&row.label)
        );
        for (k, v) in row.values.iter().enumerate() {
            let y = y0 + BAR * k as f64;
            let w = (v / max * span).max(0.0);
            let _ = write!(
                s,
                r#"<rect x="{L}" y="{y}" width="{w:.1}" height="{}" fill="{}"><title>{} {}: {} {}</title></rect><text x="{:.1}" y="{}" class="ax" dominant-baseline="middle">{}</text>"#,
                BAR - 2.0,
                PALETTE[k % PALETTE.len()],
                escape(&row.label),
                escape(names.get(k).copied().unwrap_or("")),
                num(*v),
                escape(unit),
                L + w + 4.0,
                y + BAR / 2.0 - 1.0,
                num(*v)
            );
        }
    }
    let ly = 32.0 + group * rows.len() as f64;
    for (k, name) in names.iter().enumerate() {
        let y = ly + 16.0 * k as f64;
        let _ = write!(
            s,
            r#"<rect x="{L}" y="{}" width="12" height="10" fill="{}"/><text x="{}" y="{}" class="ax" dominant-baseline="middle">{}</text>"#,
            y - 5.0,
            PALETTE[k % PALETTE.len()],
            L + 16.0,
            y,
            escape(name)
        );
    }
    s.push_str("</svg>");
    s
}

/// One row of a range chart: min, mean, max.
pub struct RangeRow {
    pub label: String,
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

/// A min–max band per row with a tick at the mean, on an axis from 0.
pub fn ranges(id: &str, title: &str, unit: &str, rows: &[RangeRow]) -> String {
    const L: f64 = 70.0;
    const W: f64 = 420.0;
    const ROW: f64 = 22.0;
    let max = nice_max(rows.iter().map(|r| r.max).fold(0.0, f64::max));
    let h = 36.0 + ROW * rows.len() as f64 + 18.0;
    let span = W - L - 90.0;
    let px = |v: f64| L + (v / max).clamp(0.0, 1.0) * span;
    let mut s = open(
        id,
        "ranges",
        title,
        (W, h),
        L,
        &format!("{title} ({unit}): min–max, mean"),
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 28.0 + ROW * i as f64;
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" class="ax" text-anchor="end" dominant-baseline="middle">{}</text><rect x="{:.1}" y="{}" width="{:.1}" height="10" fill="#9ecae1"><title>{}: min {} mean {} max {} {}</title></rect><line x1="{m:.1}" x2="{m:.1}" y1="{}" y2="{}" stroke="#08306b" stroke-width="2"/><text x="{:.1}" y="{}" class="ax" dominant-baseline="middle">{}–{}</text>"##,
            L - 6.0,
            y + 5.0,
            escape(&r.label),
            px(r.min),
            y,
            (px(r.max) - px(r.min)).max(1.0),
            escape(&r.label),
            num(r.min),
            num(r.mean),
            num(r.max),
            escape(unit),
            y - 2.0,
            y + 12.0,
            px(r.max) + 4.0,
            y + 5.0,
            num(r.min),
            num(r.max),
            m = px(r.mean)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{L}" y="{}" class="ax">0</text><text x="{}" y="{}" class="ax" text-anchor="end">{}</text>"#,
        h - 4.0,
        L + span,
        h - 4.0,
        num(max)
    );
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_numbers_and_sizes_read_well() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(num(4337.11), "4337");
        assert_eq!(num(55.44), "55.4");
        assert_eq!(num(2.514), "2.51");
        assert_eq!(num(0.0061), "0.006");
        assert_eq!(bytes(8.0), "8.00 B");
        assert_eq!(bytes(4.0 * 1024.0 * 1024.0 * 1024.0), "4.00 GiB");
        assert_eq!(nice_max(396.0), 500.0);
        assert_eq!(nice_max(0.0), 1.0);
    }

    #[test]
    fn a_heatmap_has_a_cell_per_measured_pair_and_outlines_a_bad_one() {
        let labels = vec!["GPU0".to_string(), "GPU1".to_string()];
        let cells = vec![vec![None, Some(390.0)], vec![Some(120.0), None]];
        let svg = heatmap(&Heatmap {
            id: "h",
            title: "p2p",
            unit: "GB/s",
            labels: &labels,
            cells: &cells,
            bad: &[(1, 0)],
            lower_is_better: false,
        });
        assert_eq!(svg.matches(r#"class="cell""#).count(), 2);
        assert_eq!(svg.matches("stroke=\"#d00\"").count(), 1);
        assert!(svg.contains(">390<") && svg.contains(">120<"), "{svg}");
    }

    #[test]
    fn curves_place_sizes_on_a_log_axis() {
        let svg = curves(
            "c",
            "busbw",
            "GB/s",
            &[Series {
                name: "allReduce".into(),
                points: vec![(8.0, 0.0), (1024.0, 50.0), (1048576.0, 100.0)],
                dashed: false,
            }],
        );
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert!(
            svg.contains(">1.00 KiB<") || svg.contains(">8.00 B<"),
            "{svg}"
        );
    }
}
