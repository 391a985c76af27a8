//! Two runs compared figure by figure, per node and GPU: a figure that fell by more than the
//! tolerance is a regression, even when both runs passed every fixed floor.

use std::collections::BTreeMap;
use std::fmt::Write;

use gpuval_crds::{NodeReport, Verdict};
use serde::{Deserialize, Serialize};

use crate::checks::node_figures;
use crate::figures::{Figure, Kind, Scope};
use crate::svg::num;
use crate::{Document, FabricLine};

/// How far a figure may fall before it counts as a regression, as a fraction (0.05: 5%).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct Tolerance(pub f64);

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance(0.05)
    }
}

/// One figure in both runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    pub node: String,
    /// `GPU3 memory GB/s`.
    pub figure: String,
    pub before: f64,
    pub after: f64,
    /// after / before − 1 (−0.08: 8% lower).
    pub relative: f64,
    pub regressed: bool,
}

/// What differs between two runs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Diff {
    pub before: String,
    pub after: String,
    pub tolerance: f64,
    /// Every figure present in both runs, node by node, in report order.
    pub changes: Vec<Change>,
    /// Verdicts that changed, GPU ones included (`gpu-a GPU1: Pass -> Fail`), and GPUs whose
    /// UUID changed (a swapped board is not the same GPU).
    pub notes: Vec<String>,
    /// Nodes with a report in only one of the runs.
    pub only_before: Vec<String>,
    pub only_after: Vec<String>,
}

impl Change {
    /// Figure `figure` of `node`, `before` in the earlier run and `after` in the later: a
    /// regression when it fell by more than `tol`.
    fn new(node: &str, figure: String, before: f64, after: f64, tol: Tolerance) -> Self {
        let relative = if before > 0.0 {
            after / before - 1.0
        } else {
            0.0
        };
        Change {
            node: node.to_string(),
            figure,
            before,
            after,
            relative,
            regressed: relative < -tol.0,
        }
    }
}

/// A figure whose relative change is below this shows as unchanged (it prints as 0.0%).
const UNCHANGED: f64 = 0.0005;

impl Diff {
    /// The figures that fell by more than the tolerance.
    pub fn regressions(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.regressed)
    }

    /// The verdicts (a node's or a GPU's) that got worse.
    pub fn worse_verdicts(&self) -> impl Iterator<Item = &String> {
        self.notes.iter().filter(|n| n.ends_with("(worse)"))
    }

    /// True when a figure regressed or a verdict got worse (the plugin's exit code 1).
    pub fn worse(&self) -> bool {
        self.regressions().next().is_some() || self.worse_verdicts().next().is_some()
    }

    /// A plain-text account: one line of counts (what makes [`Diff::worse`]), the regressions,
    /// the notes, the nodes in one run only, then the figures that changed within the
    /// tolerance; with `all`, every figure compared, unchanged ones too.
    pub fn text(&self, all: bool) -> String {
        let regressions: Vec<&Change> = self.regressions().collect();
        let worse = self.worse_verdicts().count();
        let mut s = format!(
            "{} -> {} (tolerance {}%): {} regression(s), {} verdict(s) worse{}\n",
            self.before,
            self.after,
            num(self.tolerance * 100.0),
            regressions.len(),
            worse,
            if self.worse() { "" } else { ", nothing worse" }
        );
        for c in &regressions {
            let _ = writeln!(s, "  REGRESSED {}", line(c));
        }
        for n in &self.notes {
            let _ = writeln!(s, "  {n}");
        }
        for (what, nodes) in [
            ("only in before", &self.only_before),
            ("only in after", &self.only_after),
        ] {
            if !nodes.is_empty() {
                let _ = writeln!(s, "  {what}: {}", nodes.join(", "));
            }
        }
        let moved: Vec<&Change> = self
            .changes
            .iter()
            .filter(|c| !c.regressed && (all || c.relative.abs() >= UNCHANGED))
            .collect();
        let unchanged = self
            .changes
            .iter()
            .filter(|c| c.relative.abs() < UNCHANGED)
            .count();
        let _ = writeln!(
            s,
            "figures compared: {}, unchanged: {unchanged}{}",
            self.changes.len(),
            if all { "" } else { " (--all lists them)" }
        );
        for c in moved {
            let _ = writeln!(s, "  {}", line(c));
        }
        s
    }
}

fn line(c: &Change) -> String {
    let how = if c.relative.abs() < UNCHANGED {
        "unchanged".to_string()
    } else {
        format!("{:+.1}%", c.relative * 100.0)
    };
    format!(
        "{} {}: {} -> {} ({how})",
        c.node,
        c.figure,
        num(c.before),
        num(c.after),
    )
}

/// Where a figure sits, so that the same figure of two runs meets (GPUs by index).
type Key = (Scope, Kind, String);

fn key(f: &Figure) -> Key {
    let scope = match &f.scope {
        Scope::Gpu { index, .. } => Scope::Gpu {
            index: *index,
            uuid: String::new(),
            model: String::new(),
        },
        other => other.clone(),
    };
    (scope, f.kind, f.qualifier.clone())
}

/// Compares run `b` with the earlier run `a`.
pub fn diff(a: &Document, b: &Document, tolerance: Tolerance) -> Diff {
    let by_node = |d: &Document| -> BTreeMap<String, NodeReport> {
        d.nodes
            .iter()
            .filter_map(|n| Some((n.node.clone(), n.report.clone()?)))
            .collect()
    };
    let (before, after) = (by_node(a), by_node(b));
    let mut out = Diff {
        before: a.title.clone(),
        after: b.title.clone(),
        tolerance: tolerance.0,
        only_before: before
            .keys()
            .filter(|n| !after.contains_key(*n))
            .cloned()
            .collect(),
        only_after: after
            .keys()
            .filter(|n| !before.contains_key(*n))
            .cloned()
            .collect(),
        ..Default::default()
    };
    for (node, ra) in &before {
        if let Some(rb) = after.get(node) {
            compare_node(&mut out, node, ra, rb, tolerance);
        }
    }
    let fabric = |d: &Document| d.validation.as_ref().and_then(|v| v.fabric.clone());
    compare_fabric(&mut out, fabric(a).as_ref(), fabric(b).as_ref(), tolerance);
    out
}

/// The name the fabric's figures and notes go under.
pub const FABRIC: &str = "fabric";

/// The fabric test of both runs: its phase, the nodes it named or cleared, and its figures (the
/// all-node bus bandwidth, the slowest TCP pair), which regress like any other figure.
fn compare_fabric(out: &mut Diff, a: Option<&FabricLine>, b: Option<&FabricLine>, tol: Tolerance) {
    let (a, b) = match (a, b) {
        (Some(a), Some(b)) => (a, b),
        (None, Some(_)) => return out.notes.push(format!("{FABRIC}: only in after")),
        (Some(_), None) => return out.notes.push(format!("{FABRIC}: only in before")),
        (None, None) => return,
    };
    if a.phase != b.phase {
        let how = match (a.phase.as_str(), b.phase.as_str()) {
            (_, "Failed") => " (worse)",
            ("Failed", "Passed") => " (better)",
            _ => "",
        };
        out.notes
            .push(format!("{FABRIC}: {} -> {}{how}", a.phase, b.phase));
    }
    for n in b.named.iter().filter(|n| !a.named.contains(n)) {
        out.notes.push(format!("{FABRIC}: names {n} (worse)"));
    }
    for n in a.named.iter().filter(|n| !b.named.contains(n)) {
        out.notes
            .push(format!("{FABRIC}: no longer names {n} (better)"));
    }
    let figures = [
        ("all-node bus GB/s", a.bus_gbps, b.bus_gbps),
        ("slowest TCP pair Gb/s", a.tcp_min_gbps, b.tcp_min_gbps),
    ];
    for (figure, before, after) in figures {
        let (Some(before), Some(after)) = (before, after) else {
            continue;
        };
        out.changes
            .push(Change::new(FABRIC, figure.to_string(), before, after, tol));
    }
}

fn compare_node(out: &mut Diff, node: &str, a: &NodeReport, b: &NodeReport, tol: Tolerance) {
    verdict_note(out, node, "", a.verdict, b.verdict);
    for gb in &b.gpus {
        let Some(ga) = a.gpus.iter().find(|g| g.index == gb.index) else {
            continue;
        };
        let who = format!(" GPU{}", gb.index);
        verdict_note(out, node, &who, ga.verdict, gb.verdict);
        if ga.uuid != gb.uuid {
            out.notes.push(format!(
                "{node}{who}: UUID changed {} -> {} (a different board)",
                ga.uuid, gb.uuid
            ));
        }
    }
    let earlier: BTreeMap<Key, f64> = node_figures(a).iter().map(|f| (key(f), f.value)).collect();
    for f in node_figures(b) {
        let Some(&before) = earlier.get(&key(&f)) else {
            continue;
        };
        out.changes
            .push(Change::new(node, f.describe(), before, f.value, tol));
    }
}

fn verdict_note(out: &mut Diff, node: &str, who: &str, a: Verdict, b: Verdict) {
    if a == b {
        return;
    }
    let how = if b > a { "worse" } else { "better" };
    out.notes
        .push(format!("{node}{who}: verdict {a} -> {b} ({how})"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_fabric(title: &str, fabric: FabricLine) -> Document {
        let mut d = Document::single(title, crate::sample::report());
        d.validation = Some(crate::ValidationLine {
            name: title.into(),
            phase: fabric.phase.clone(),
            fabric: Some(fabric),
            ..Default::default()
        });
        d
    }

    #[test]
    fn the_fabric_is_compared_its_named_nodes_and_figures_too() {
        let passed = FabricLine {
            phase: "Passed".into(),
            nodes: 4,
            rounds: 1,
            bus_gbps: Some(380.0),
            tcp_min_gbps: Some(150.0),
            ..Default::default()
        };
        let failed = FabricLine {
            phase: "Failed".into(),
            rounds: 3,
            bus_gbps: Some(2.8),
            named: vec!["gpu-3".into()],
            ..passed.clone()
        };
        let d = diff(
            &with_fabric("monday", passed.clone()),
            &with_fabric("friday", failed.clone()),
            Tolerance(0.05),
        );
        assert!(d.worse(), "{}", d.text(false));
        let text = d.text(false);
        assert!(text.contains("fabric: Passed -> Failed (worse)"), "{text}");
        assert!(text.contains("fabric: names gpu-3 (worse)"), "{text}");
        assert!(
            text.contains("REGRESSED fabric all-node bus GB/s: 380 -> 2.80 (-99.3%)"),
            "{text}"
        );
        let back = diff(
            &with_fabric("friday", failed),
            &with_fabric("monday", passed),
            Tolerance(0.05),
        );
        assert!(!back.worse(), "{}", back.text(false));
        assert!(
            back.text(false)
                .contains("fabric: no longer names gpu-3 (better)")
        );
        let one = diff(
            &Document::single("a", crate::sample::report()),
            &with_fabric("b", FabricLine::default()),
            Tolerance(0.05),
        );
        assert_eq!(one.notes, ["fabric: only in after"]);
    }

    fn doc(title: &str, r: NodeReport) -> Document {
        Document::single(title, r)
    }

    #[test]
    fn a_figure_that_fell_beyond_the_tolerance_is_a_regression() {
        let a = crate::sample::report();
        let mut b = a.clone();
        b.gpus[0].memory.as_mut().expect("memory").gbps = 4300.0 * 0.92;
        b.gpus[1].memory.as_mut().expect("memory").gbps = 4100.0 * 0.97;
        let d = diff(&doc("last month", a), &doc("today", b), Tolerance(0.05));
        let r: Vec<&Change> = d.regressions().collect();
        assert_eq!(r.len(), 1, "{}", d.text(false));
        assert_eq!(r[0].figure, "GPU0 memory GB/s");
        assert!((r[0].relative + 0.08).abs() < 1e-9);
        assert!(d.worse());
        assert!(
            d.text(false)
                .contains("REGRESSED gpu-a GPU0 memory GB/s: 4300 -> 3956 (-8.0%)"),
            "{}",
            d.text(false)
        );
        let within = d
            .changes
            .iter()
            .find(|c| c.figure == "GPU1 memory GB/s")
            .expect("GPU1");
        assert!(!within.regressed, "3% is within 5%");
    }

    #[test]
    fn verdict_and_board_changes_are_named_and_nodes_present_once_listed() {
        let a = crate::sample::report();
        let mut b = a.clone();
        b.gpus[0].verdict = Verdict::Fail;
        b.gpus[0].uuid = "GPU-new".into();
        let mut other = a.clone();
        other.node = Some("gpu-b".into());
        let mut da = doc("a", a);
        da.nodes.push(crate::NodeEntry {
            node: "gpu-b".into(),
            report: Some(other),
            ..Default::default()
        });
        let d = diff(&da, &doc("b", b), Tolerance::default());
        assert!(
            d.notes
                .iter()
                .any(|n| n == "gpu-a GPU0: verdict Pass -> Fail (worse)"),
            "{:?}",
            d.notes
        );
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("UUID changed GPU-0 -> GPU-new"))
        );
        assert_eq!(d.only_before, ["gpu-b"]);
        assert!(d.worse());
        assert_eq!(d.regressions().count(), 0);
    }

    #[test]
    fn the_same_run_twice_has_nothing_to_say() {
        let a = doc("a", crate::sample::report());
        let d = diff(&a, &a, Tolerance::default());
        assert!(!d.worse());
        assert!(d.notes.is_empty());
        assert!(d.changes.iter().all(|c| c.relative == 0.0));
        let text = d.text(false);
        assert_eq!(text.lines().count(), 2, "only the counts: {text}");
        assert!(
            text.contains("0 regression(s), 0 verdict(s) worse, nothing worse"),
            "{text}"
        );
        let all = d.text(true);
        assert_eq!(all.lines().count(), 2 + d.changes.len(), "{all}");
        assert!(
            all.contains("(unchanged)") && !all.contains("-0.0%"),
            "{all}"
        );
    }

    #[test]
    fn the_counts_agree_with_what_makes_the_diff_worse() {
        let a = crate::sample::report();
        let mut b = a.clone();
        b.verdict = Verdict::Fail;
        b.gpus[0].verdict = Verdict::Fail;
        b.gpus[1].memory.as_mut().expect("memory").gbps = 4100.0 * 0.99;
        let d = diff(&doc("a", a), &doc("b", b), Tolerance::default());
        assert!(d.worse());
        let text = d.text(false);
        let first = text.lines().next().unwrap_or_default();
        assert!(
            first.ends_with(": 0 regression(s), 1 verdict(s) worse"),
            "{text}"
        );
        assert!(
            text.contains("GPU1 memory GB/s: 4100 -> 4059 (-1.0%)"),
            "{text}"
        );
        assert!(
            !text.contains("GPU0 memory GB/s"),
            "unchanged figures are left out: {text}"
        );
    }
}
