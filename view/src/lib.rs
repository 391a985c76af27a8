//! What a person reads of a run: node reports ([`gpuval_crds::NodeReport`]) rendered as one
//! self-contained HTML page ([`html()`]: inline SVG, no script, nothing fetched), as Markdown
//! ([`markdown()`]), as JSON ([`json()`]) or as JUnit XML for CI systems ([`junit()`]), and two
//! runs compared figure by figure ([`diff()`]). The key figures of a report ([`figures`]) are shared with the operator's
//! metrics, so a dashboard, a diff and a page agree on what a figure is.
//!
//! Pure: no I/O. The agent, the kubectl plugin and the operator read and write.

pub mod checks;
pub mod diff;
pub mod figures;
pub mod html;
pub mod junit;
pub mod markdown;
mod svg;
pub mod tree;

pub use checks::node_figures;
pub use diff::{Change, Diff, Tolerance, diff};
pub use figures::{Figure, Scope};
pub use html::html;
pub use junit::junit;
pub use markdown::markdown;
pub use tree::tree;

use gpuval_crds::{NodeReport, Reason, Verdict};
use serde::{Deserialize, Serialize};

/// One run to show: a validation's node reports, or one bare-metal report.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    /// What the run was (`validation quick`, `report.json`).
    pub title: String,
    /// The validation's phase and its own reasons, when the run came from a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<ValidationLine>,
    pub nodes: Vec<NodeEntry>,
}

/// A validation's overall state, as its status says it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValidationLine {
    pub name: String,
    pub phase: String,
    /// The most frequent reasons nodes did not pass, with counts (`Failed: GPU3 memory (2)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Nodes selected for the run, including any without a report (not started, pod lost).
    pub selected: i32,
    /// The Ready condition's message, whole: why the run passed, failed or waits (the only
    /// word there is when it failed before any node ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The fabric test between nodes, where the validation asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricLine>,
}

impl ValidationLine {
    /// The message, where the views should show it: a run that did not pass and has no node
    /// report to say why.
    pub fn why_no_reports(&self, reports: usize) -> Option<&str> {
        self.message
            .as_deref()
            .filter(|m| !m.is_empty() && reports == 0 && self.phase != "Passed")
    }
}

/// The fabric test between nodes, as the validation's status says it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FabricLine {
    pub phase: String,
    /// Nodes in the test (those that passed their own checks).
    pub nodes: i32,
    pub rounds: i32,
    /// Bus bandwidth of the all-node group, GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_gbps: Option<f64>,
    /// The lowest TCP throughput of a pair that passed, Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_min_gbps: Option<f64>,
    /// Nodes named at fault.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub named: Vec<String>,
    /// Nodes still under suspicion, neither cleared nor named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suspects: Vec<String>,
    /// What happened, in words (who was named and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl FabricLine {
    /// `Failed  4 nodes, 3 rounds, bus 2.8 GB/s, TCP >= 145.7 Gb/s; named vm-3: ...`: the line
    /// every view shows.
    pub fn text(&self) -> String {
        let mut s = format!(
            "{}  {} nodes, {} round{}",
            self.phase,
            self.nodes,
            self.rounds,
            if self.rounds == 1 { "" } else { "s" }
        );
        if let Some(b) = self.bus_gbps {
            s.push_str(&format!(", bus {b:.1} GB/s"));
        }
        if let Some(t) = self.tcp_min_gbps {
            s.push_str(&format!(", TCP >= {t:.1} Gb/s"));
        }
        if !self.named.is_empty() {
            s.push_str(&format!("; named {}", self.named.join(", ")));
        }
        if !self.suspects.is_empty() {
            s.push_str(&format!("; suspects left {}", self.suspects.join(", ")));
        }
        if let Some(m) = self.message.as_deref().filter(|m| !m.is_empty()) {
            s.push_str(&format!(": {m}"));
        }
        s
    }
}

/// One node's report, or why it has none.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeEntry {
    pub node: String,
    /// The result object it came from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<NodeReport>,
    /// Why there is no report (a pod that failed, a run still going), from the validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The node's final line in the validation, once it has one: the verdict every view shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<LineView>,
}

/// A node's final line in its validation (`gpuval_crds::final_line`): its verdict with the
/// evidence it rests on, as the validation's status says it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LineView {
    /// The line as one report verdict (`gpuval_crds::FinalLine::shown`): Fail for a node the
    /// fabric named though its own checks passed, Error for a line that is no hardware verdict.
    pub verdict: Verdict,
    /// The kind of evidence it rests on (`Hardware`, `Busy`, `Infrastructure`, ...).
    pub evidence: String,
    /// Why, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl NodeEntry {
    /// The verdict every view shows for the node: its final line's, else its report's (a run
    /// still going, a bare-metal report), else Error (no report).
    pub fn verdict(&self) -> Verdict {
        match (&self.line, &self.report) {
            (Some(l), _) => l.verdict,
            (None, Some(r)) => r.verdict,
            (None, None) => Verdict::Error,
        }
    }

    /// Whether the node passed, as its final line says (a node without a report did not).
    pub fn passes(&self) -> bool {
        (self.report.is_some() || self.line.is_some()) && self.verdict().passes()
    }

    /// The node's verdict ([`NodeEntry::verdict`]), GPU count and first failure (or why there
    /// is no report, or the line's own words where its report does not say why it failed): its
    /// line in an overview. The first failure carries the node's recommended action
    /// (`[ReplaceHardware] GPU1 ...`).
    pub fn headline(&self) -> (&'static str, usize, String) {
        let verdict = self.verdict().as_str();
        let line_words = self
            .line
            .as_ref()
            .filter(|l| !l.verdict.passes() && !l.message.is_empty())
            .map(|l| l.message.clone());
        match &self.report {
            Some(r) => {
                let own = worst_first(&r.failures)
                    .first()
                    .map(|f| with_action(r.action, &f.message));
                let first = match own {
                    Some(f) if !r.verdict.passes() => f,
                    own => line_words.or(own).unwrap_or_default(),
                };
                (verdict, r.gpus.len(), first)
            }
            None => (
                verdict,
                0,
                self.message.clone().or(line_words).unwrap_or_default(),
            ),
        }
    }
}

impl Document {
    /// A document of one bare-metal report, titled `title`.
    pub fn single(title: impl Into<String>, report: NodeReport) -> Self {
        let node = report
            .node
            .clone()
            .or_else(|| report.system.as_ref().and_then(|s| s.hostname.clone()))
            .unwrap_or_else(|| "this host".into());
        Self {
            title: title.into(),
            validation: None,
            nodes: vec![NodeEntry {
                node,
                result: None,
                report: Some(report),
                message: None,
                line: None,
            }],
        }
    }

    /// True when any report came from the simulated backend.
    pub fn simulated(&self) -> bool {
        self.reports().any(|r| r.simulated)
    }

    /// The reports present, in node order.
    pub fn reports(&self) -> impl Iterator<Item = &NodeReport> {
        self.nodes.iter().filter_map(|n| n.report.as_ref())
    }

    /// The verdict of the whole document, what a headline badge shows: the worst node verdict
    /// ([`NodeEntry::verdict`]: the final lines) of the nodes with a report or a line (Skipped
    /// when there is none), never a pass for a validation that Failed (Fail where its fabric
    /// test failed without naming a node, else Error).
    pub fn worst(&self) -> Verdict {
        let nodes = self
            .nodes
            .iter()
            .filter(|n| n.report.is_some() || n.line.is_some())
            .map(NodeEntry::verdict)
            .max();
        let failed_run = self.validation.as_ref().filter(|v| v.phase == "Failed");
        match (nodes, failed_run) {
            (Some(w), Some(_)) if w.is_bad() => w,
            (_, Some(v)) if v.fabric.as_ref().is_some_and(|f| f.phase == "Failed") => Verdict::Fail,
            (_, Some(_)) => Verdict::Error,
            (w, None) => w.unwrap_or(Verdict::Skipped),
        }
    }
}

/// `[RebootNode] message`: a node's first failure with the one action that covers the node
/// (none shown for `None`).
pub fn with_action(action: gpuval_crds::reason::Action, message: &str) -> String {
    match action {
        gpuval_crds::reason::Action::None => message.to_string(),
        a => format!("[{a}] {message}"),
    }
}

/// `reasons`, the worst first: a hardware Fail before an Error (a check that could not
/// measure), then warnings; in their own order within a severity. Every view lists findings so.
pub fn worst_first(reasons: &[Reason]) -> Vec<&Reason> {
    let mut v: Vec<&Reason> = reasons.iter().collect();
    v.sort_by_key(|r| std::cmp::Reverse(r.severity));
    v
}

/// The document as pretty JSON (the node reports exactly as stored, with the node names).
pub fn json(doc: &Document) -> String {
    // A Document holds only strings, numbers and lists: serialising it cannot fail, and an
    // empty object is the honest fallback were that ever untrue.
    serde_json::to_string_pretty(doc).unwrap_or_else(|_| "{}".into())
}

/// Why a report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "{what} is not a gpuval node report (the agent's --output JSON or a GpuNodeResult): {source}"
    )]
    Json {
        what: String,
        source: serde_json::Error,
    },
}

/// Reads a node report from the agent's `--output` JSON, or from a `GpuNodeResult` object
/// (its status), so either file works.
pub fn parse_report(what: &str, text: &str) -> Result<NodeReport, ReadError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|source| ReadError::Json {
            what: what.into(),
            source,
        })?;
    let inner = match value.get("status") {
        Some(status) if value.get("kind").is_some() => status.clone(),
        _ => value,
    };
    serde_json::from_value(inner).map_err(|source| ReadError::Json {
        what: what.into(),
        source,
    })
}

#[cfg(test)]
pub(crate) mod sample;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_from_the_agents_json_or_a_result_object_and_round_trips() {
        let r = sample::report();
        let bare = serde_json::to_string(&r).expect("json");
        assert_eq!(parse_report("a", &bare).expect("bare report"), r);
        let object = serde_json::json!({"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
            "metadata": {"name": "v-gpu-a"}, "spec": {}, "status": r});
        let wrapped = serde_json::to_string(&object).expect("json");
        assert_eq!(parse_report("b", &wrapped).expect("a result object"), r);
        let e = parse_report("notes.txt", "{\"verdict\": 3}").expect_err("not a report");
        assert!(
            e.to_string()
                .starts_with("notes.txt is not a gpuval node report"),
            "{e}"
        );
        let doc = Document::single("x", r);
        let back: Document = serde_json::from_str(&json(&doc)).expect("the JSON document");
        assert_eq!(back, doc);
        assert_eq!(doc.worst(), Verdict::Fail);
    }

    #[test]
    fn a_hardware_fail_leads_every_view_even_when_stored_after_an_error() {
        use gpuval_crds::reason::Code;
        let mut r = sample::report();
        let io = "no directory for the io check: set the Helm value agent.io.hostPath";
        let mem = "GPU1 memory: 2 mismatched words";
        r.failures = vec![
            Reason::new(Code::IoError, io),
            Reason::new(Code::MemoryMismatch, mem),
        ];
        let doc = Document::single("x", r);
        assert_eq!(doc.nodes[0].headline().2, mem);
        let page = html(&doc);
        let (m, i) = (page.find(mem), page.rfind(io));
        assert!(m.is_some() && i.is_some() && m < i, "memory first: {page}");
        let md = markdown(&doc);
        assert!(md.find(mem) < md.find(io), "{md}");
        assert!(tree(&doc).lines().nth(1).is_some_and(|l| l.ends_with(mem)));
    }
}
