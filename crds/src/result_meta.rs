//! What a node result's metadata says of its report: the labels (`gpuval.io/verdict`,
//! `gpuval.io/action`, `gpuval.io/simulated`) and annotations (`gpuval.io/summary`,
//! `gpuval.io/codes`, `gpuval.io/versions`) its agent writes beside the report, so that the
//! operator's caches (metadata only) can judge a node without the report itself. The agent
//! writes them through [`ReportMeta::labels`] and [`ReportMeta::annotations`]; every reader
//! goes through [`ReportMeta::read`], so a field added here is a compile error in each reader
//! that destructures it until it is handled.

use std::collections::BTreeMap;

use crate::facts::Versions;
use crate::kinds::Verdict;
use crate::labels;
use crate::reason::Action;

/// A result's report as its metadata carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportMeta {
    /// An unknown spelling reads as [`Verdict::Error`]: never a pass (whether it is hardware
    /// evidence is for its codes to say, as for any Error).
    pub verdict: Verdict,
    /// An unknown spelling, or none, reads as [`Action::None`].
    pub action: Action,
    /// Written by the simulated backend (tests and demos only): never evidence about a node.
    pub simulated: bool,
    /// The report's status headline (empty when it has none).
    pub summary: String,
    /// The codes of its first failures (or warnings), comma-separated (empty: none).
    pub codes: String,
    /// The node's driver, VBIOS, CUDA and NCCL versions.
    pub versions: Versions,
}

impl ReportMeta {
    /// The labels the agent writes.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let Self {
            verdict,
            action,
            simulated,
            summary: _,
            codes: _,
            versions: _,
        } = self;
        let mut l = BTreeMap::from([
            (labels::VERDICT.to_string(), verdict.as_str().to_string()),
            (labels::ACTION.to_string(), action.as_str().to_string()),
        ]);
        if *simulated {
            l.insert(labels::SIMULATED.to_string(), "true".to_string());
        }
        l
    }

    /// The annotations the agent writes (an empty one is left out).
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let Self {
            verdict: _,
            action: _,
            simulated: _,
            summary,
            codes,
            versions,
        } = self;
        [
            (labels::SUMMARY, summary.clone()),
            (labels::CODES, codes.clone()),
            (labels::VERSIONS, versions.annotation()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The report a result's `labels` and `annotations` carry; None without a verdict label (no
    /// report stored yet).
    pub fn read(
        labels: Option<&BTreeMap<String, String>>,
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Option<ReportMeta> {
        let l = labels?;
        let annotation = |k: &str| annotations.and_then(|a| a.get(k));
        Some(ReportMeta {
            verdict: l.get(labels::VERDICT)?.parse().unwrap_or(Verdict::Error),
            action: l
                .get(labels::ACTION)
                .and_then(|a| Action::ALL.into_iter().find(|x| x.as_str() == a))
                .unwrap_or_default(),
            simulated: is_simulated(l),
            summary: annotation(labels::SUMMARY).cloned().unwrap_or_default(),
            codes: annotation(labels::CODES).cloned().unwrap_or_default(),
            versions: annotation(labels::VERSIONS)
                .map(|v| Versions::parse_annotation(v))
                .unwrap_or_default(),
        })
    }
}

/// True when a result's labels say the simulated backend wrote it.
pub fn is_simulated(result_labels: &BTreeMap<String, String>) -> bool {
    result_labels
        .get(labels::SIMULATED)
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ReportMeta {
        ReportMeta {
            verdict: Verdict::Fail,
            action: Action::ResetGpu,
            simulated: true,
            summary: "memory: 3 wrong words on GPU 1".into(),
            codes: "MemoryMismatch".into(),
            versions: Versions::parse_annotation("driver=580.159.04"),
        }
    }

    #[test]
    fn what_is_written_reads_back_whole() {
        let m = meta();
        assert_eq!(
            ReportMeta::read(Some(&m.labels()), Some(&m.annotations())),
            Some(m)
        );
    }

    #[test]
    fn unknown_spellings_read_as_no_pass_and_no_action() {
        let l = BTreeMap::from([
            (labels::VERDICT.to_string(), "Great".to_string()),
            (labels::ACTION.to_string(), "Pray".to_string()),
        ]);
        let m = ReportMeta::read(Some(&l), None).expect("a verdict label");
        assert_eq!(m.verdict, Verdict::Error);
        assert_eq!(m.action, Action::None);
        assert!(!m.simulated);
        assert_eq!(m.summary, "");
    }

    #[test]
    fn the_keys_written_are_those_the_admission_policy_lets_an_agent_write() {
        let m = meta();
        let labels: Vec<String> = m.labels().into_keys().collect();
        let mut allowed: Vec<String> = crate::binding::AGENT_LABELS.map(String::from).into();
        allowed.sort();
        assert_eq!(labels, allowed);
        let annotations: Vec<String> = m.annotations().into_keys().collect();
        let mut allowed: Vec<String> = crate::binding::REPORT_ANNOTATIONS.map(String::from).into();
        allowed.sort();
        assert_eq!(annotations, allowed);
    }

    #[test]
    fn no_verdict_label_is_no_report() {
        assert_eq!(ReportMeta::read(Some(&BTreeMap::new()), None), None);
        assert_eq!(ReportMeta::read(None, None), None);
    }

    #[test]
    fn empty_annotations_are_left_out_and_only_true_is_simulated() {
        let m = ReportMeta {
            summary: String::new(),
            codes: String::new(),
            versions: Versions::default(),
            simulated: false,
            ..meta()
        };
        assert!(m.annotations().is_empty(), "{:?}", m.annotations());
        assert!(!m.labels().contains_key(labels::SIMULATED));
        let odd = BTreeMap::from([(labels::SIMULATED.to_string(), "yes".to_string())]);
        assert!(!is_simulated(&odd));
    }
}
