//! The `nvidia-smi topo -m` view of a host, derived from raw NVML readings
//! ([`TopologySnapshot`]), and a parser for nvidia-smi's own output to cross-check it.
//! Pure functions: no NVML here.

use std::fmt::Write as _;

use gpuval_crds::{NvlinkState, TopologyReport, Verdict};

use crate::backend::{LinkReading, TopoGpu, TopologySnapshot};
use crate::pci::{format_ranges, normalize_bus_id, set_bits};

/// Remote bus id NVML reports for links that end at an NVSwitch (normalised form).
pub(crate) const SWITCH_BUS_ID: &str = "ffffffff:ff:ff.0";

/// What each matrix symbol means, as in nvidia-smi's legend.
const LEGEND: &[&str] = &[
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
    "  N/A  = NVML did not report the path",
];

/// The `nvidia-smi topo -m` matrix, affinities and per-GPU NVLink summary of a snapshot.
/// The verdict is always Pass here; judging the topology happens elsewhere.
pub fn derive(snap: &TopologySnapshot) -> TopologyReport {
    let n = snap.gpus.len();
    TopologyReport {
        verdict: Verdict::Pass,
        reasons: Vec::new(),
        gpus: snap
            .gpus
            .iter()
            .map(|g| format!("GPU{}", g.index))
            .collect(),
        matrix: (0..n)
            .map(|i| (0..n).map(|j| cell(snap, i, j)).collect())
            .collect(),
        cpu_affinity: snap
            .gpus
            .iter()
            .map(|g| affinity_text(&set_bits(&g.cpu_affinity)))
            .collect(),
        numa_affinity: snap.gpus.iter().map(|g| numa_text(&g.numa_nodes)).collect(),
        nvlinks: snap.gpus.iter().map(nvlink_state).collect(),
        samples: 1,
        link_changes: Vec::new(),
    }
}

/// One matrix cell: `X`, `NV#`, or the PCIe level of the pair's common ancestor.
fn cell(snap: &TopologySnapshot, i: usize, j: usize) -> String {
    if i == j {
        return "X".to_string();
    }
    let (a, b) = (&snap.gpus[i], &snap.gpus[j]);
    let links = nvlink_count(a, b);
    if links > 0 {
        return format!("NV{links}");
    }
    let ancestor = snap
        .ancestors
        .get(i)
        .and_then(|row| row.get(j))
        .and_then(|c| c.as_deref());
    pcie_symbol(ancestor).to_string()
}

/// NVLinks joining `a` to `b`: `a`'s active links whose remote bus id is `b`'s; otherwise,
/// when both reach an NVSwitch, the smaller of their switch-link counts.
pub fn nvlink_count(a: &TopoGpu, b: &TopoGpu) -> usize {
    let target = normalize_bus_id(&b.pci_bus_id);
    let direct = a
        .links
        .iter()
        .filter(|l| {
            l.active
                && l.remote_bus_id
                    .as_deref()
                    .is_some_and(|r| normalize_bus_id(r) == target)
        })
        .count();
    if direct > 0 {
        return direct;
    }
    let (sa, sb) = (switch_links(a), switch_links(b));
    if sa > 0 && sb > 0 { sa.min(sb) } else { 0 }
}

/// Active links of a GPU that end at an NVSwitch.
fn switch_links(g: &TopoGpu) -> usize {
    g.links
        .iter()
        .filter(|l| l.active && is_switch_link(l))
        .count()
}

/// True for a link to an NVSwitch: remote type SWITCH, or (type unknown) the switch bus id.
fn is_switch_link(l: &LinkReading) -> bool {
    match l.remote_type.as_deref() {
        Some(t) => t.eq_ignore_ascii_case("SWITCH"),
        None => l
            .remote_bus_id
            .as_deref()
            .is_some_and(|r| normalize_bus_id(r) == SWITCH_BUS_ID),
    }
}

/// nvidia-smi's symbol for an NVML common-ancestor level.
fn pcie_symbol(ancestor: Option<&str>) -> &'static str {
    match ancestor.map(str::to_ascii_uppercase).as_deref() {
        Some("INTERNAL" | "SINGLE") => "PIX",
        Some("MULTIPLE") => "PXB",
        Some("HOSTBRIDGE") => "PHB",
        Some("NODE") => "NODE",
        Some("SYSTEM") => "SYS",
        _ => "N/A",
    }
}

fn affinity_text(ids: &[u32]) -> String {
    if ids.is_empty() {
        "N/A".to_string()
    } else {
        format_ranges(ids)
    }
}

fn numa_text(nodes: &[u32]) -> String {
    let mut nodes = nodes.to_vec();
    nodes.sort_unstable();
    nodes.dedup();
    affinity_text(&nodes)
}

fn nvlink_state(g: &TopoGpu) -> NvlinkState {
    let active: Vec<&LinkReading> = g.links.iter().filter(|l| l.active).collect();
    let remote = if active.iter().any(|l| is_switch_link(l)) {
        Some("NVSwitch".to_string())
    } else if active.iter().any(|l| {
        l.remote_type
            .as_deref()
            .is_some_and(|t| t.eq_ignore_ascii_case("GPU"))
    }) {
        Some("GPU".to_string())
    } else {
        None
    };
    NvlinkState {
        gpu: to_i32(g.index as usize),
        active: to_i32(active.len()),
        total: to_i32(g.links.len()),
        version: active
            .iter()
            .filter_map(|l| l.version)
            .max()
            .map(|v| to_i32(v as usize)),
        remote,
    }
}

fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A table like `nvidia-smi topo -m`: header, one row per GPU, then the legend.
pub fn render(report: &TopologyReport) -> String {
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(report.gpus.len() + 1);
    let mut header = vec![String::new()];
    header.extend(report.gpus.iter().cloned());
    header.extend(["CPU Affinity".to_string(), "NUMA Affinity".to_string()]);
    rows.push(header);
    for (i, label) in report.gpus.iter().enumerate() {
        let mut row = vec![label.clone()];
        row.extend((0..report.gpus.len()).map(|j| cell_at(&report.matrix, i, j).to_string()));
        row.push(report.cpu_affinity.get(i).cloned().unwrap_or_default());
        row.push(report.numa_affinity.get(i).cloned().unwrap_or_default());
        rows.push(row);
    }
    let mut out = format_columns(&rows);
    out.push_str("\nLegend:\n\n");
    for line in LEGEND {
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn cell_at(matrix: &[Vec<String>], i: usize, j: usize) -> &str {
    matrix
        .get(i)
        .and_then(|r| r.get(j))
        .map_or("", String::as_str)
}

/// Left-aligned columns, two spaces apart, trailing spaces trimmed.
fn format_columns(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (text, width) in row.iter().zip(&widths) {
            let _ = write!(line, "{text:<width$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The GPU part of `nvidia-smi topo -m` output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SmiTopology {
    /// `GPU0`, `GPU1`, ... in header order.
    pub gpus: Vec<String>,
    /// `matrix[i][j]` for GPUs only (NIC rows and columns dropped).
    pub matrix: Vec<Vec<String>>,
    pub cpu_affinity: Vec<String>,
    pub numa_affinity: Vec<String>,
}

/// Why `nvidia-smi topo -m` text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyParseError {
    #[error("no header line found (empty input)")]
    NoHeader,
    #[error("line {line}: header has no GPU columns: {text:?}")]
    NoGpuColumns { line: usize, text: String },
    #[error("line {line}: {label} has {found} cells, expected at least {expected}: {text:?}")]
    ShortRow {
        line: usize,
        label: String,
        expected: usize,
        found: usize,
        text: String,
    },
    #[error("line {line}: row {label} has no column in the header: {text:?}")]
    UnknownRow {
        line: usize,
        label: String,
        text: String,
    },
    #[error("line {line}: row {label} appears twice: {text:?}")]
    DuplicateRow {
        line: usize,
        label: String,
        text: String,
    },
    #[error("the header names {label} but no row for it follows")]
    MissingRow { label: String },
}

/// Column positions found in the header (indices into the cells after the row label).
struct Header {
    gpu_columns: Vec<(String, usize)>,
    cpu: Option<usize>,
    numa: Option<usize>,
}

/// Parses real `nvidia-smi topo -m` output: tabs or spaces, ANSI escapes, NIC rows and
/// columns (dropped), a `GPU NUMA ID` column (ignored); stops at `Legend:` / `NIC Legend:`.
pub fn parse_nvidia_smi(text: &str) -> Result<SmiTopology, TopologyParseError> {
    let clean = strip_ansi(text);
    let mut lines = clean.lines().enumerate().map(|(i, l)| (i + 1, l));
    let (header_line, header_text) = lines
        .by_ref()
        .find(|(_, l)| !l.trim().is_empty())
        .ok_or(TopologyParseError::NoHeader)?;
    let header = parse_header(header_line, header_text)?;
    let mut rows: Vec<Option<Vec<String>>> = vec![None; header.gpu_columns.len()];
    for (line, text) in lines {
        let trimmed = text.trim();
        if trimmed.starts_with("Legend:") || trimmed.starts_with("NIC Legend:") {
            break;
        }
        let tokens: Vec<&str> = trimmed.split_whitespace().collect();
        let Some((&label, cells)) = tokens.split_first() else {
            continue;
        };
        if !is_gpu_label(label) {
            continue;
        }
        let slot = header
            .gpu_columns
            .iter()
            .position(|(name, _)| name == label)
            .ok_or_else(|| TopologyParseError::UnknownRow {
                line,
                label: label.into(),
                text: text.into(),
            })?;
        if rows[slot].is_some() {
            return Err(TopologyParseError::DuplicateRow {
                line,
                label: label.into(),
                text: text.into(),
            });
        }
        rows[slot] = Some(gpu_row(&header, line, label, cells, text)?);
    }
    assemble(header, rows)
}

fn parse_header(line: usize, text: &str) -> Result<Header, TopologyParseError> {
    let columns = merge_header_words(text.split_whitespace());
    let gpu_columns: Vec<(String, usize)> = columns
        .iter()
        .enumerate()
        .filter(|(_, c)| is_gpu_label(c))
        .map(|(i, c)| (c.clone(), i))
        .collect();
    if gpu_columns.is_empty() {
        return Err(TopologyParseError::NoGpuColumns {
            line,
            text: text.into(),
        });
    }
    Ok(Header {
        gpu_columns,
        cpu: columns.iter().position(|c| c == "CPU Affinity"),
        numa: columns.iter().position(|c| c == "NUMA Affinity"),
    })
}

/// Joins the multi-word column names (`CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID`).
fn merge_header_words<'a>(words: impl Iterator<Item = &'a str>) -> Vec<String> {
    let words: Vec<&str> = words.collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let rest = &words[i..];
        let (name, used) = match rest {
            ["GPU", "NUMA", "ID", ..] => ("GPU NUMA ID".to_string(), 3),
            ["CPU", "Affinity", ..] => ("CPU Affinity".to_string(), 2),
            ["NUMA", "Affinity", ..] => ("NUMA Affinity".to_string(), 2),
            [word, ..] => (word.to_string(), 1),
            [] => break,
        };
        out.push(name);
        i += used;
    }
    out
}

/// The GPU cells and affinities of one GPU row, in header GPU-column order.
fn gpu_row(
    header: &Header,
    line: usize,
    label: &str,
    cells: &[&str],
    text: &str,
) -> Result<Vec<String>, TopologyParseError> {
    let needed = header
        .gpu_columns
        .iter()
        .map(|(_, c)| *c)
        .chain(header.cpu)
        .chain(header.numa)
        .max()
        .map_or(0, |c| c + 1);
    if cells.len() < needed {
        return Err(TopologyParseError::ShortRow {
            line,
            label: label.into(),
            expected: needed,
            found: cells.len(),
            text: text.into(),
        });
    }
    let mut row: Vec<String> = header
        .gpu_columns
        .iter()
        .map(|(_, c)| cells[*c].to_string())
        .collect();
    row.push(header.cpu.map_or("N/A", |c| cells[c]).to_string());
    row.push(header.numa.map_or("N/A", |c| cells[c]).to_string());
    Ok(row)
}

fn assemble(
    header: Header,
    rows: Vec<Option<Vec<String>>>,
) -> Result<SmiTopology, TopologyParseError> {
    let mut out = SmiTopology::default();
    for ((label, _), row) in header.gpu_columns.into_iter().zip(rows) {
        let Some(mut row) = row else {
            return Err(TopologyParseError::MissingRow { label });
        };
        let numa = row.pop().unwrap_or_default();
        let cpu = row.pop().unwrap_or_default();
        out.gpus.push(label);
        out.matrix.push(row);
        out.cpu_affinity.push(cpu);
        out.numa_affinity.push(numa);
    }
    Ok(out)
}

fn is_gpu_label(s: &str) -> bool {
    s.strip_prefix("GPU")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Removes ANSI CSI escape sequences (`ESC [ ... final-byte`) and stray ESC characters.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            for f in chars.by_ref() {
                if ('@'..='~').contains(&f) {
                    break;
                }
            }
        }
    }
    out
}

/// Every difference between our matrix and nvidia-smi's, in plain words; empty when equal.
pub fn compare(ours: &TopologyReport, smi: &SmiTopology) -> Vec<String> {
    let mut out = Vec::new();
    if ours.gpus.len() != smi.gpus.len() {
        out.push(format!(
            "GPU count: ours {}, nvidia-smi {}",
            ours.gpus.len(),
            smi.gpus.len()
        ));
    }
    for (i, label) in ours.gpus.iter().enumerate() {
        let Some(si) = smi.gpus.iter().position(|g| g == label) else {
            out.push(format!("{label}: in ours, missing from nvidia-smi"));
            continue;
        };
        for (j, other) in ours.gpus.iter().enumerate() {
            let Some(sj) = smi.gpus.iter().position(|g| g == other) else {
                continue;
            };
            let (a, b) = (cell_at(&ours.matrix, i, j), cell_at(&smi.matrix, si, sj));
            if !a.trim().eq_ignore_ascii_case(b.trim()) {
                out.push(format!(
                    "{label}->{other}: ours {}, nvidia-smi {}",
                    shown(a),
                    shown(b)
                ));
            }
        }
        for (what, o, s) in [
            ("CPU affinity", &ours.cpu_affinity, &smi.cpu_affinity),
            ("NUMA affinity", &ours.numa_affinity, &smi.numa_affinity),
        ] {
            compare_field(&mut out, label, what, o.get(i), s.get(si));
        }
    }
    for label in smi.gpus.iter().filter(|g| !ours.gpus.contains(g)) {
        out.push(format!("{label}: in nvidia-smi, missing from ours"));
    }
    out
}

fn compare_field(
    out: &mut Vec<String>,
    label: &str,
    what: &str,
    ours: Option<&String>,
    smi: Option<&String>,
) {
    let (a, b) = (ours.map_or("", |s| s.trim()), smi.map_or("", |s| s.trim()));
    if a != b {
        out.push(format!(
            "{label} {what}: ours {}, nvidia-smi {}",
            shown(a),
            shown(b)
        ));
    }
}

fn shown(s: &str) -> &str {
    if s.trim().is_empty() {
        "(nothing)"
    } else {
        s.trim()
    }
}

/// NVLink links that went down or came up between two snapshots, and GPUs whose count of
/// active links changed. `at_secs` is the time of `after` since the run started.
pub fn link_changes(
    before: &TopologySnapshot,
    after: &TopologySnapshot,
    at_secs: f64,
) -> Vec<String> {
    let at = format!("+{at_secs:.0}s");
    let mut out = Vec::new();
    for b in &before.gpus {
        let Some(a) = after.gpus.iter().find(|g| g.index == b.index) else {
            out.push(format!(
                "GPU{} disappeared from the topology at {at}",
                b.index
            ));
            continue;
        };
        gpu_link_changes(b, a, &at, &mut out);
    }
    for a in after
        .gpus
        .iter()
        .filter(|a| !before.gpus.iter().any(|b| b.index == a.index))
    {
        out.push(format!("GPU{} appeared in the topology at {at}", a.index));
    }
    out
}

fn gpu_link_changes(before: &TopoGpu, after: &TopoGpu, at: &str, out: &mut Vec<String>) {
    let is_up = |g: &TopoGpu, link: u32| g.links.iter().any(|l| l.link == link && l.active);
    let mut ids: Vec<u32> = before
        .links
        .iter()
        .chain(&after.links)
        .map(|l| l.link)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    for link in ids {
        match (is_up(before, link), is_up(after, link)) {
            (true, false) => out.push(format!(
                "GPU{} NVLink {link} went down at {at}",
                after.index
            )),
            (false, true) => out.push(format!("GPU{} NVLink {link} came up at {at}", after.index)),
            _ => {}
        }
    }
    let count = |g: &TopoGpu| g.links.iter().filter(|l| l.active).count();
    let (was, now) = (count(before), count(after));
    if was != now {
        out.push(format!(
            "GPU{} active NVLinks {was} -> {now} at {at}",
            after.index
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::pci::parse_ranges;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/topo")
            .join(name)
    }

    fn read_fixture(name: &str) -> String {
        std::fs::read_to_string(fixture(name)).expect("fixture readable")
    }

    /// Bitmask words with the given ids set.
    fn words(ids: &[u32], n_words: usize) -> Vec<u64> {
        let mut w = vec![0u64; n_words];
        for id in ids {
            w[(id / 64) as usize] |= 1 << (id % 64);
        }
        w
    }

    fn ids(list: &str) -> Vec<u32> {
        parse_ranges(list).expect("valid list")
    }

    fn link(link: u32, remote_bus: &str, remote_type: &str, version: u32) -> LinkReading {
        LinkReading {
            link,
            active: true,
            remote_bus_id: Some(remote_bus.to_string()),
            remote_type: Some(remote_type.to_string()),
            version: Some(version),
        }
    }

    fn switch_gpu(index: u32, bus: &str, cpus: &str, node: u32, n_words: usize) -> TopoGpu {
        TopoGpu {
            index,
            pci_bus_id: bus.to_string(),
            cpu_affinity: words(&ids(cpus), n_words),
            numa_nodes: vec![node],
            links: (0..18)
                .map(|l| link(l, "FFFFFFFF:FF:FF.0", "SWITCH", 4))
                .collect(),
        }
    }

    fn ancestors(
        n: usize,
        level: impl Fn(usize, usize) -> &'static str,
    ) -> Vec<Vec<Option<String>>> {
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| (i != j).then(|| level(i, j).to_string()))
                    .collect()
            })
            .collect()
    }

    fn h200x2() -> TopologySnapshot {
        TopologySnapshot {
            gpus: vec![
                switch_gpu(0, "00000000:18:00.0", "0-47,96-143", 0, 3),
                switch_gpu(1, "00000000:2A:00.0", "0-47,96-143", 0, 3),
            ],
            ancestors: ancestors(2, |_, _| "HOSTBRIDGE"),
        }
    }

    fn hgx8() -> TopologySnapshot {
        let bus = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"];
        let gpus = (0..8u32)
            .map(|i| {
                let (cpus, node) = if i < 4 {
                    ("0-55,112-167", 0)
                } else {
                    ("56-111,168-223", 1)
                };
                switch_gpu(
                    i,
                    &format!("00000000:{}:00.0", bus[i as usize]),
                    cpus,
                    node,
                    4,
                )
            })
            .collect();
        TopologySnapshot {
            gpus,
            ancestors: ancestors(8, |i, j| if (i < 4) == (j < 4) { "NODE" } else { "SYSTEM" }),
        }
    }

    #[test]
    fn h200_nvswitch_pair_is_nv18_both_ways() {
        let r = derive(&h200x2());
        assert_eq!(r.gpus, ["GPU0", "GPU1"]);
        assert_eq!(r.matrix, [["X", "NV18"], ["NV18", "X"]]);
        assert_eq!(r.cpu_affinity, ["0-47,96-143", "0-47,96-143"]);
        assert_eq!(r.numa_affinity, ["0", "0"]);
        assert_eq!(r.verdict, Verdict::Pass);
        assert_eq!(r.samples, 1);
        assert!(r.reasons.is_empty());
        let expected = NvlinkState {
            gpu: 1,
            active: 18,
            total: 18,
            version: Some(4),
            remote: Some("NVSwitch".into()),
        };
        assert_eq!(r.nvlinks[1], expected);
    }

    #[test]
    fn switch_pair_uses_the_smaller_link_count() {
        let mut snap = h200x2();
        snap.gpus[1].links[3].active = false;
        snap.gpus[1].links[7].active = false;
        let r = derive(&snap);
        assert_eq!(r.matrix, [["X", "NV16"], ["NV16", "X"]]);
        assert_eq!(r.nvlinks[1].active, 16);
        assert_eq!(r.nvlinks[1].total, 18);
    }

    #[test]
    fn switch_links_without_remote_type_are_recognised_by_bus_id() {
        let mut snap = h200x2();
        for g in &mut snap.gpus {
            for l in &mut g.links {
                l.remote_type = None;
            }
        }
        assert_eq!(derive(&snap).matrix[0][1], "NV18");
    }

    #[test]
    fn pcie_only_box_maps_ancestors_to_symbols() {
        let level = |i: usize, j: usize| match (i.min(j), i.max(j)) {
            (0, 1) => "SINGLE",
            (2, 3) => "MULTIPLE",
            (0, 2) | (1, 2) => "NODE",
            _ => "SYSTEM",
        };
        let gpus = (0..4u32)
            .map(|i| TopoGpu {
                index: i,
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 * (i + 1)),
                cpu_affinity: words(&ids(if i < 3 { "0-15" } else { "16-31" }), 1),
                numa_nodes: if i < 3 { vec![0] } else { vec![] },
                links: vec![],
            })
            .collect();
        let mut snap = TopologySnapshot {
            gpus,
            ancestors: ancestors(4, level),
        };
        snap.ancestors[3][0] = None;
        let r = derive(&snap);
        let expected = [
            ["X", "PIX", "NODE", "SYS"],
            ["PIX", "X", "NODE", "SYS"],
            ["NODE", "NODE", "X", "PXB"],
            ["N/A", "SYS", "PXB", "X"],
        ];
        assert_eq!(r.matrix, expected);
        assert_eq!(r.cpu_affinity, ["0-15", "0-15", "0-15", "16-31"]);
        assert_eq!(r.numa_affinity, ["0", "0", "0", "N/A"]);
        assert!(
            r.nvlinks
                .iter()
                .all(|l| l.active == 0 && l.total == 0 && l.remote.is_none())
        );
    }

    #[test]
    fn direct_nvlink_pair_counts_links_to_the_peer() {
        let gpu = |index: u32, bus: &str, peer: &str| TopoGpu {
            index,
            pci_bus_id: bus.to_string(),
            cpu_affinity: words(&ids("0-63"), 1),
            numa_nodes: vec![0, 1],
            links: (0..12).map(|l| link(l, peer, "GPU", 3)).collect(),
        };
        // NVML writes an 8-digit domain for the GPU and sometimes a 4-digit one for the remote.
        let snap = TopologySnapshot {
            gpus: vec![
                gpu(0, "00000000:07:00.0", "0000:0f:00.0"),
                gpu(1, "00000000:0F:00.0", "0000:07:00.0"),
            ],
            ancestors: ancestors(2, |_, _| "SYSTEM"),
        };
        let r = derive(&snap);
        assert_eq!(r.matrix, [["X", "NV12"], ["NV12", "X"]]);
        assert_eq!(r.numa_affinity, ["0-1", "0-1"]);
        assert_eq!(r.nvlinks[0].remote.as_deref(), Some("GPU"));
        assert_eq!(r.nvlinks[0].version, Some(3));
    }

    #[test]
    fn direct_links_are_split_by_peer() {
        let bus = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0"];
        let mut gpus: Vec<TopoGpu> = (0..3u32)
            .map(|i| TopoGpu {
                index: i,
                pci_bus_id: bus[i as usize].into(),
                cpu_affinity: vec![],
                numa_nodes: vec![],
                links: vec![],
            })
            .collect();
        gpus[0].links = (0..12)
            .map(|l| link(l, bus[if l < 8 { 1 } else { 2 }], "GPU", 3))
            .collect();
        let snap = TopologySnapshot {
            gpus,
            ancestors: ancestors(3, |_, _| "SYSTEM"),
        };
        let r = derive(&snap);
        assert_eq!(r.matrix[0], ["X", "NV8", "NV4"]);
        assert_eq!(r.matrix[1][0], "SYS");
        assert_eq!(r.cpu_affinity[0], "N/A");
    }

    #[test]
    fn parses_h200_output_and_matches_derived() {
        let smi = parse_nvidia_smi(&read_fixture("h200x2-nvidia-smi.txt")).expect("parses");
        assert_eq!(smi.gpus, ["GPU0", "GPU1"]);
        assert_eq!(smi.matrix, [["X", "NV18"], ["NV18", "X"]]);
        assert_eq!(smi.cpu_affinity, ["0-47,96-143", "0-47,96-143"]);
        assert_eq!(smi.numa_affinity, ["0", "0"]);
        assert_eq!(compare(&derive(&h200x2()), &smi), Vec::<String>::new());
    }

    #[test]
    fn parses_hgx8_output_with_nics_and_matches_derived() {
        let smi = parse_nvidia_smi(&read_fixture("hgx8-nics-nvidia-smi.txt")).expect("parses");
        assert_eq!(smi.gpus.len(), 8);
        assert!(smi.matrix.iter().all(|row| row.len() == 8));
        assert_eq!(smi.matrix[3][5], "NV18");
        assert_eq!(smi.cpu_affinity[5], "56-111,168-223");
        assert_eq!(smi.numa_affinity[5], "1");
        assert_eq!(compare(&derive(&hgx8()), &smi), Vec::<String>::new());
    }

    #[test]
    fn compare_names_the_differing_cell() {
        let text = read_fixture("h200x2-nvidia-smi.txt").replacen("NV18", "NV12", 1);
        let smi = parse_nvidia_smi(&text).expect("parses");
        assert_eq!(
            compare(&derive(&h200x2()), &smi),
            ["GPU0->GPU1: ours NV18, nvidia-smi NV12"]
        );
    }

    #[test]
    fn compare_reports_count_and_affinity_differences() {
        let smi = parse_nvidia_smi(&read_fixture("hgx8-nics-nvidia-smi.txt")).expect("parses");
        let mut ours = derive(&h200x2());
        ours.numa_affinity[1] = "1".into();
        let diffs = compare(&ours, &smi);
        assert_eq!(diffs[0], "GPU count: ours 2, nvidia-smi 8");
        assert!(
            diffs.contains(&"GPU1 NUMA affinity: ours 1, nvidia-smi 0".to_string()),
            "{diffs:?}"
        );
        assert!(
            diffs.contains(&"GPU7: in nvidia-smi, missing from ours".to_string()),
            "{diffs:?}"
        );
    }

    #[test]
    fn render_round_trips_through_the_parser() {
        let report = derive(&hgx8());
        let text = render(&report);
        assert!(
            text.lines()
                .next()
                .is_some_and(|h| h.contains("GPU7") && h.ends_with("NUMA Affinity"))
        );
        assert!(text.contains("Legend:"));
        let smi = parse_nvidia_smi(&text).expect("parses our own table");
        assert_eq!(compare(&report, &smi), Vec::<String>::new());
    }

    #[test]
    fn parse_errors_name_the_line() {
        assert_eq!(parse_nvidia_smi("\n\n"), Err(TopologyParseError::NoHeader));
        let err = parse_nvidia_smi("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV18\n");
        let err = err.expect_err("short row");
        assert!(
            matches!(err, TopologyParseError::ShortRow { line: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().starts_with("line 2: GPU0"), "{err}");
        let err = parse_nvidia_smi(
            "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV18\t0-7\t0\n",
        );
        assert_eq!(
            err,
            Err(TopologyParseError::MissingRow {
                label: "GPU1".into()
            })
        );
        let err = parse_nvidia_smi("\tNIC0\nNIC0\t X\n").expect_err("no GPU columns");
        assert!(err.to_string().starts_with("line 1:"), "{err}");
    }

    #[test]
    fn snapshot_fixture_loads_and_derives_nv18() {
        let text = read_fixture("h200x2-snapshot.json");
        let snap: TopologySnapshot = serde_json::from_str(&text).expect("valid snapshot JSON");
        assert_eq!(snap, h200x2());
        assert_eq!(derive(&snap).matrix, [["X", "NV18"], ["NV18", "X"]]);
    }

    /// Captured on a 2x H200 VM (driver 580.159.04) by the ignored `real_nvml_matches_nvidia_smi`.
    #[test]
    fn real_h200_capture_matches_its_nvidia_smi_output() {
        let text = read_fixture("h200x2-vm-snapshot.json");
        let snap: TopologySnapshot = serde_json::from_str(&text).expect("valid snapshot JSON");
        let smi = parse_nvidia_smi(&read_fixture("h200x2-vm-nvidia-smi.txt")).expect("parses");
        let report = derive(&snap);
        assert_eq!(report.matrix, [["X", "NV18"], ["NV18", "X"]]);
        assert_eq!(compare(&report, &smi), Vec::<String>::new());
    }

    #[test]
    fn link_changes_finds_a_dropped_link() {
        let before = h200x2();
        let mut after = before.clone();
        after.gpus[1].links[4].active = false;
        let changes = link_changes(&before, &after, 93.2);
        assert_eq!(
            changes,
            [
                "GPU1 NVLink 4 went down at +93s",
                "GPU1 active NVLinks 18 -> 17 at +93s"
            ]
        );
        assert_eq!(
            link_changes(&after, &before, 120.0)[0],
            "GPU1 NVLink 4 came up at +120s"
        );
        assert!(link_changes(&before, &before, 1.0).is_empty());
    }
}
