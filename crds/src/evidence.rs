//! One final line per node per validation, and the kind of evidence it rests on.
//!
//! The operator writes each node's line of a run (its own checks, then the fabric test); every
//! consumer that acts on a node (node state, admission, `spec.onFailure`, certificates) reads
//! it back through [`final_line`], so that they cannot disagree: a node the fabric names is
//! Failed everywhere, and a result that carries no report never makes its node Pass.
//!
//! Every finding is one [`Evidence`] category. Only [`Evidence::Hardware`] acts on a node
//! (taints it, labels it Fail, sets `GpuValidated=False`, keeps it out at admission, signs a
//! failed certificate); the others say what to fix and leave the node as it was.

use k8s_openapi::jiff::Timestamp;

pub use crate::kinds::Evidence;
use crate::kinds::Verdict;
use crate::reason::{Action, Code, Severity};
use crate::status::{GpuValidationStatus, NodeStatus, NodeVerdict};

impl Evidence {
    /// The category of a finding whose codes are `codes` (a result's or node line's,
    /// comma-separated). The codes that decide are those whose default severity is Fail or
    /// Error (warnings beside them do not change what the finding is), else all of them. Any
    /// hardware code makes it hardware (an unknown code counts as hardware); otherwise a busy
    /// GPU, then infrastructure, then configuration, then the spec's expectation. A finding without codes is taken as the
    /// hardware's, as the agent reported it.
    pub fn of_codes(codes: &str) -> Evidence {
        let parsed: Vec<Option<Code>> = codes
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(|c| c.parse::<Code>().ok())
            .collect();
        let deciding = |c: &&Option<Code>| {
            c.is_none_or(|c| matches!(c.severity(), Severity::Fail | Severity::Error))
        };
        let strong: Vec<&Option<Code>> = parsed.iter().filter(deciding).collect();
        let kinds: Vec<Evidence> = if strong.is_empty() {
            parsed
                .iter()
                .map(|c| c.map_or(Evidence::Hardware, Code::evidence))
                .collect()
        } else {
            strong
                .iter()
                .map(|c| c.map_or(Evidence::Hardware, Code::evidence))
                .collect()
        };
        // Hardware < Busy < Infrastructure < Configuration < Spec in declaration order: the
        // first present wins.
        kinds.into_iter().min().unwrap_or(Evidence::Hardware)
    }
}

impl Code {
    /// The category of a finding of this code alone.
    pub fn evidence(self) -> Evidence {
        if self.is_about_sharing() {
            Evidence::Busy
        } else if self.is_infrastructure() {
            Evidence::Infrastructure
        } else if self.is_configuration() {
            Evidence::Configuration
        } else if self.is_from_spec() {
            Evidence::Spec
        } else {
            Evidence::Hardware
        }
    }
}

/// A node's result as the reader needs it (from its labels and annotations).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResultSeen {
    /// The result object's name.
    pub name: String,
    /// The validation generation it was written for.
    pub generation: i64,
    /// Its verdict label, parsed (None: missing or not in the API's words).
    pub verdict: Option<Verdict>,
    /// It carries a report (the agent wrote its status).
    pub reported: bool,
    /// Written by the simulated backend.
    pub simulated: bool,
    /// Its failures in plain words.
    pub summary: String,
    /// Its codes, comma-separated, worst first.
    pub codes: String,
    /// The action it recommends.
    pub action: Action,
    /// When it was created.
    pub created: Option<Timestamp>,
}

impl ResultSeen {
    /// Node result `r` as the reader needs it, read from the object itself: its metadata (the
    /// verdict label, else its report's verdict), whether it carries a report.
    pub fn of(r: &crate::GpuNodeResult) -> Self {
        let meta = crate::result_meta::ReportMeta::read(
            r.metadata.labels.as_ref(),
            r.metadata.annotations.as_ref(),
        );
        let reported = r.status.as_ref().map(|s| s.verdict);
        let (verdict, action, simulated, summary, codes) = match meta {
            Some(m) => (Some(m.verdict), m.action, m.simulated, m.summary, m.codes),
            None => {
                let s = r.status.as_ref();
                (
                    reported,
                    s.map(|s| s.action).unwrap_or_default(),
                    s.is_some_and(|s| s.simulated),
                    String::new(),
                    s.map(crate::NodeReport::codes).unwrap_or_default(),
                )
            }
        };
        ResultSeen {
            name: r.metadata.name.clone().unwrap_or_default(),
            generation: r.spec.generation,
            verdict,
            reported: r.status.is_some(),
            simulated,
            summary,
            codes,
            action,
            created: r.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }
}

/// Whose word counts: simulated results are no evidence unless `trust_simulated` (tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trust {
    pub trust_simulated: bool,
}

/// A node's final line for one validation: its verdict with the evidence it rests on.
#[derive(Debug, Clone, PartialEq)]
pub struct FinalLine {
    /// The validation's name.
    pub validation: String,
    /// Passed, Failed, Error or DeadlineExceeded.
    pub verdict: NodeVerdict,
    pub evidence: Evidence,
    /// Why, in words (for anything but a hardware verdict: what to fix).
    pub message: String,
    /// The codes of its findings, comma-separated.
    pub codes: String,
    pub action: Action,
    /// The node result it rests on, if any.
    pub result: Option<String>,
    /// When it was reached (the result's creation, else the run's end); None while unknown.
    pub at: Option<Timestamp>,
}

impl FinalLine {
    /// True for a pass on hardware evidence: the only line that admits, labels Pass, sets
    /// `GpuValidated=True` or certifies a pass.
    pub fn passed(&self) -> bool {
        self.verdict == NodeVerdict::Passed && self.evidence == Evidence::Hardware
    }

    /// True for a failure on hardware evidence: the only line that taints, labels Fail, sets
    /// `GpuValidated=False`, marks a node failed at admission or signs a failed certificate.
    pub fn failed_on_hardware(&self) -> bool {
        self.verdict != NodeVerdict::Passed && self.evidence == Evidence::Hardware
    }

    /// The line as one report verdict, the one every view and metric shows for the node (its
    /// report's own verdict is only what its agent saw): a hardware pass is the report's Pass
    /// or Warn (`reported`), a hardware failure Fail (the fabric may have named a node whose own
    /// checks passed), and anything else Error: no verdict about the hardware (busy,
    /// infrastructure, configuration, no evidence, a node the fabric could neither clear nor
    /// name).
    pub fn shown(&self, reported: Option<Verdict>) -> Verdict {
        match (self.verdict, self.evidence) {
            (NodeVerdict::Passed, Evidence::Hardware) => {
                reported.filter(|v| v.passes()).unwrap_or(Verdict::Pass)
            }
            (NodeVerdict::Failed, Evidence::Hardware) => Verdict::Fail,
            _ => Verdict::Error,
        }
    }

    /// The verdict a certificate of this line signs: the result's own where the line rests on
    /// it, Fail where the line failed on hardware evidence the result does not show (the fabric
    /// named the node), Error where the line is no hardware verdict.
    pub fn certified(&self, reported: Verdict) -> Verdict {
        match (self.passed(), self.failed_on_hardware()) {
            (true, _) => reported,
            (false, true) if reported.passes() => Verdict::Fail,
            (false, true) => reported,
            (false, false) if reported.passes() => Verdict::Error,
            (false, false) => reported,
        }
    }
}

/// Node `node`'s final line in validation `run` (its status, as the operator wrote it), with
/// the node's `result` of that run if it has one; None while the node has no final line (its
/// checks or the fabric test still run, or the status cannot tell).
///
/// The status lists every node that has not passed (failed ones first), up to its cap; a node
/// it does not list passed when its result passes, has a report, and the fabric test (if the
/// run has one) is over without naming it.
pub fn final_line(
    run: &crate::GpuValidation,
    node: &str,
    result: Option<&ResultSeen>,
    trust: Trust,
) -> Option<FinalLine> {
    let status = run.status.as_ref()?;
    let generation = status.observed_generation?;
    let result = result.filter(|r| r.generation == generation);
    let seen = Seen {
        validation: run.metadata.name.clone().unwrap_or_default(),
        status,
        result,
        trust,
        fabric_asked: status.fabric.is_some()
            || (run.spec.fabric.is_some() && run.metadata.generation == Some(generation)),
    };
    match status.nodes.iter().find(|l| l.name == node) {
        Some(line) if !line.verdict.is_final() => None,
        Some(line) if line.verdict != NodeVerdict::Passed => Some(seen.listed(line)),
        _ => seen.unlisted(node),
    }
}

/// What [`final_line`] reads.
struct Seen<'a> {
    validation: String,
    status: &'a GpuValidationStatus,
    result: Option<&'a ResultSeen>,
    trust: Trust,
    fabric_asked: bool,
}

impl Seen<'_> {
    fn line(&self, verdict: NodeVerdict, evidence: Evidence, message: String) -> FinalLine {
        let ended = self.status.completion_time.as_ref().map(|t| t.0);
        FinalLine {
            validation: self.validation.clone(),
            verdict,
            evidence,
            message,
            codes: self.result.map(|r| r.codes.clone()).unwrap_or_default(),
            action: self.result.map(|r| r.action).unwrap_or_default(),
            result: self.result.map(|r| r.name.clone()),
            at: self.result.and_then(|r| r.created).or(ended),
        }
    }

    /// Hardware evidence from a simulated result (or a simulated run whose result is gone)
    /// is none, unless trusted.
    fn trusted(&self, evidence: Evidence) -> Evidence {
        let simulated = match self.result {
            Some(r) => r.simulated,
            None => self.status.simulated == Some(true),
        };
        match evidence {
            Evidence::Hardware if simulated && !self.trust.trust_simulated => Evidence::NoEvidence,
            other => other,
        }
    }

    /// A listed line with a final verdict other than Passed: as the operator wrote it.
    fn listed(&self, l: &NodeStatus) -> FinalLine {
        let evidence = l.evidence.unwrap_or_else(|| match l.result {
            Some(_) => Evidence::of_codes(l.codes.as_deref().unwrap_or_default()),
            None => Evidence::Infrastructure,
        });
        let message = l.message.clone().unwrap_or_else(|| l.verdict.to_string());
        let mut line = self.line(l.verdict, self.trusted(evidence), message);
        if l.result.is_none() {
            line.result = None;
            line.at = self.status.completion_time.as_ref().map(|t| t.0);
        }
        line.codes = l.codes.clone().unwrap_or(line.codes);
        line.action = l.action.unwrap_or(match evidence {
            Evidence::Hardware => line.action,
            _ => Action::Rerun,
        });
        line
    }

    /// A node the status does not list: named by the fabric test, or passed as its result
    /// says, or (when the list overflowed) failed as its result says.
    fn unlisted(&self, node: &str) -> Option<FinalLine> {
        let fabric = self.status.fabric.as_ref();
        if fabric.is_some_and(|f| f.failed_nodes.iter().any(|n| n == node)) {
            let why = fabric.and_then(|f| f.message.clone()).unwrap_or_default();
            let ev = self.trusted(Evidence::Hardware);
            return Some(self.line(NodeVerdict::Failed, ev, format!("fabric: {why}")));
        }
        let r = self.result?;
        let verdict = r.verdict?;
        let overflow = self.status.nodes_not_listed > 0;
        if !verdict.passes() {
            // Only where the status could not list every failed node is the result's own
            // failure the line; otherwise the run does not count it (stale, not seen yet).
            return (overflow && r.reported).then(|| {
                let node_verdict = match verdict {
                    Verdict::Error => NodeVerdict::Error,
                    _ => NodeVerdict::Failed,
                };
                let ev = self.trusted(Evidence::of_codes(&r.codes));
                self.line(node_verdict, ev, r.summary.clone())
            });
        }
        self.unlisted_pass(node, overflow)
    }

    /// A node whose result passes: Passed once the fabric test is over without naming it.
    fn unlisted_pass(&self, node: &str, overflow: bool) -> Option<FinalLine> {
        let r = self.result?;
        let fabric = self.status.fabric.as_ref();
        if self.fabric_asked && !fabric.is_some_and(|f| f.phase.is_terminal()) {
            return None;
        }
        let failed = fabric.filter(|f| f.phase == crate::fabric::FabricPhase::Failed);
        let truncated =
            failed.is_some_and(|f| f.failed_nodes.len() >= crate::fabric::MAX_LISTED_SUSPECTS);
        if overflow && truncated {
            return None;
        }
        if failed.is_some_and(|f| f.suspects.iter().any(|n| n == node)) {
            let message = "the fabric test could neither clear nor name this node: rerun the validation (the fabric's message says which rounds did not finish)";
            return Some(self.line(NodeVerdict::Passed, Evidence::NoEvidence, message.into()));
        }
        if !r.reported {
            // Until the run ends its report may still be checked: no line yet.
            if !self.status.phase.is_some_and(|p| p.is_terminal()) {
                return None;
            }
            let message = format!(
                "result {} carries no report (its agent did not store one): no verdict about the node; rerun the validation",
                r.name
            );
            return Some(self.line(NodeVerdict::Passed, Evidence::NoEvidence, message));
        }
        let ev = self.trusted(Evidence::Hardware);
        Some(self.line(NodeVerdict::Passed, ev, r.summary.clone()))
    }
}

#[cfg(test)]
#[path = "evidence_tests.rs"]
mod tests;
