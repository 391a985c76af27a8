//! The fleet's facts, pure: each node's versions (driver, VBIOS, CUDA, NCCL) from its result,
//! the version most nodes run, and the nodes that differ from it: `status.fleet`, a Warn when
//! any node differs. Also what a result's metadata says beyond its verdict (codes, action,
//! versions), read once here for the node lines.

use std::cmp::Ordering;
use std::collections::HashMap;

use gpuval_crds::facts::{
    Component, FleetComponent, FleetStatus, MAX_LISTED_DIFFERING, MAX_LISTED_VERSIONS, NodeVersion,
    VersionCount, Versions,
};
use gpuval_crds::result_meta::ReportMeta;
use gpuval_crds::{Action, Verdict};

use super::view::{ResultFacts, ResultView};

/// What a result's report says beyond its verdict and summary (its codes, action and versions).
pub fn result_facts(report: &ReportMeta) -> ResultFacts {
    let ReportMeta {
        verdict: _,
        summary: _,
        action,
        simulated,
        codes,
        versions,
    } = report;
    ResultFacts {
        codes: codes.clone(),
        action: *action,
        versions: versions.clone(),
        simulated: *simulated,
    }
}

/// A node line's `codes` and `action` from its result (None where there are none).
pub fn line_facts(f: &ResultFacts) -> (Option<String>, Option<Action>) {
    (
        (!f.codes.is_empty()).then(|| f.codes.clone()),
        (f.action != Action::None).then_some(f.action),
    )
}

/// `status.fleet` from the results of `generation`: None before any of them reports a version.
pub fn of(results: &[ResultView], generation: i64) -> Option<FleetStatus> {
    let current: Vec<&ResultView> = results
        .iter()
        .filter(|r| r.generation == generation)
        .collect();
    let components: Vec<FleetComponent> = Component::ALL
        .into_iter()
        .filter_map(|c| component(c, &current))
        .collect();
    let nodes = current
        .iter()
        .filter(|r| r.facts.versions != Versions::default())
        .count();
    if nodes == 0 {
        return None;
    }
    let drift: Vec<String> = components
        .iter()
        .filter(|c| !c.differing.is_empty())
        .map(drift_line)
        .collect();
    Some(FleetStatus {
        verdict: if drift.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Warn
        },
        message: (!drift.is_empty()).then(|| drift.join("; ")),
        nodes: i32::try_from(nodes).unwrap_or(i32::MAX),
        components,
    })
}

/// One component across the nodes that report it: the majority (most nodes; on a tie, the
/// highest version), every version with its count, and the nodes not on the majority.
fn component(c: Component, results: &[&ResultView]) -> Option<FleetComponent> {
    let mut by_node: Vec<(&str, &str)> = results
        .iter()
        .filter_map(|r| r.facts.versions.get(c).map(|v| (r.node.as_str(), v)))
        .collect();
    if by_node.is_empty() {
        return None;
    }
    by_node.sort_unstable();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (_, v) in &by_node {
        *counts.entry(v).or_default() += 1;
    }
    let mut versions: Vec<(&str, usize)> = counts.into_iter().collect();
    versions.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| compare_versions(b.0, a.0)));
    let majority = versions[0].0;
    let differing: Vec<NodeVersion> = by_node
        .iter()
        .filter(|(_, v)| *v != majority)
        .map(|(node, v)| NodeVersion {
            node: node.to_string(),
            version: v.to_string(),
        })
        .collect();
    let not_listed = differing.len().saturating_sub(MAX_LISTED_DIFFERING);
    Some(FleetComponent {
        component: c.as_str().to_string(),
        majority: majority.to_string(),
        versions: versions
            .iter()
            .take(MAX_LISTED_VERSIONS)
            .map(|(v, n)| VersionCount {
                version: v.to_string(),
                nodes: i32::try_from(*n).unwrap_or(i32::MAX),
            })
            .collect(),
        differing: differing.into_iter().take(MAX_LISTED_DIFFERING).collect(),
        differing_not_listed: i32::try_from(not_listed).unwrap_or(i32::MAX),
    })
}

/// `driver: 1 of 3 nodes differ from 570.86.15 (gpu-c 535.104.05)`.
fn drift_line(c: &FleetComponent) -> String {
    let total: i32 = c.versions.iter().map(|v| v.nodes).sum();
    let differ = c.differing.len() as i32 + c.differing_not_listed;
    let shown: Vec<String> = c
        .differing
        .iter()
        .take(3)
        .map(|n| format!("{} {}", n.node, n.version))
        .collect();
    let more = if differ > 3 {
        format!(" and {} more", differ - 3)
    } else {
        String::new()
    };
    format!(
        "{}: {differ} of {total} nodes differ from {} ({}{more})",
        c.component,
        c.majority,
        shown.join(", ")
    )
}

/// Versions compared part by part (`535.104.05` < `570.86.15`, `12.10` > `12.9`), numbers as
/// numbers, anything else as text.
fn compare_versions(a: &str, b: &str) -> Ordering {
    let parts = |s: &str| -> Vec<(u64, String)> {
        s.split(['.', '-', '+'])
            .map(|p| (p.parse::<u64>().unwrap_or(0), p.to_string()))
            .collect()
    };
    parts(a).cmp(&parts(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::labels;
    use std::collections::BTreeMap;

    fn result(node: &str, generation: i64, driver: &str, vbios: Option<&str>) -> ResultView {
        ResultView {
            name: format!("v-{node}"),
            node: node.into(),
            generation,
            verdict: Verdict::Pass,
            summary: String::new(),
            fabric: Vec::new(),
            ports: None,
            facts: ResultFacts {
                versions: Versions {
                    driver: Some(driver.into()),
                    vbios: vbios.map(String::from),
                    cuda: Some("12.8".into()),
                    nccl: None,
                },
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_nodes_off_the_majority_are_named_and_warn() {
        let results = vec![
            result("gpu-a", 2, "570.86.15", Some("96.00.99.00.01")),
            result("gpu-b", 2, "570.86.15", Some("96.00.99.00.01")),
            result("gpu-c", 2, "535.104.05", Some("96.00.99.00.01")),
            result("gpu-d", 1, "999.0", None),
        ];
        let f = of(&results, 2).expect("versions reported");
        assert_eq!(f.verdict, Verdict::Warn);
        assert_eq!(f.nodes, 3, "only this generation's results");
        assert_eq!(
            f.message.as_deref(),
            Some("driver: 1 of 3 nodes differ from 570.86.15 (gpu-c 535.104.05)")
        );
        let driver = &f.components[0];
        assert_eq!(
            (driver.component.as_str(), driver.majority.as_str()),
            ("driver", "570.86.15")
        );
        assert_eq!(
            driver.differing,
            vec![NodeVersion {
                node: "gpu-c".into(),
                version: "535.104.05".into()
            }]
        );
        assert_eq!(
            driver.versions,
            vec![
                VersionCount {
                    version: "570.86.15".into(),
                    nodes: 2
                },
                VersionCount {
                    version: "535.104.05".into(),
                    nodes: 1
                },
            ]
        );
        let names: Vec<&str> = f.components.iter().map(|c| c.component.as_str()).collect();
        assert_eq!(names, ["driver", "vbios", "cuda"], "nccl reported by none");
        assert!(f.components[1..].iter().all(|c| c.differing.is_empty()));
    }

    #[test]
    fn one_version_everywhere_passes_and_no_versions_say_nothing() {
        let same: Vec<ResultView> = (0..3)
            .map(|i| result(&format!("n{i}"), 1, "570.86.15", None))
            .collect();
        let f = of(&same, 1).expect("versions");
        assert_eq!((f.verdict, f.message.as_deref()), (Verdict::Pass, None));
        let mut silent = same.clone();
        for r in &mut silent {
            r.facts.versions = Versions::default();
        }
        assert_eq!(of(&silent, 1), None);
        assert_eq!(of(&same, 2), None);
    }

    #[test]
    fn a_tie_takes_the_higher_version_and_a_long_list_is_bounded() {
        let tie = vec![
            result("a", 1, "535.104.05", None),
            result("b", 1, "570.86.15", None),
        ];
        assert_eq!(of(&tie, 1).unwrap().components[0].majority, "570.86.15");
        assert_eq!(compare_versions("12.10", "12.9"), Ordering::Greater);
        let mut many: Vec<ResultView> = (0..40)
            .map(|i| result(&format!("n{i:02}"), 1, "570.86.15", None))
            .collect();
        many.extend((0..30).map(|i| result(&format!("o{i:02}"), 1, "535.104.05", None)));
        let c = &of(&many, 1).unwrap().components[0];
        assert_eq!(c.differing.len(), MAX_LISTED_DIFFERING);
        assert_eq!(c.differing_not_listed, 10);
        assert!(
            of(&many, 1)
                .unwrap()
                .message
                .unwrap()
                .ends_with("(o00 535.104.05, o01 535.104.05, o02 535.104.05 and 27 more)")
        );
    }

    #[test]
    fn result_metadata_reads_into_facts_and_lines() {
        let l = BTreeMap::from([
            (labels::VERDICT.to_string(), "Fail".to_string()),
            (labels::ACTION.to_string(), "ResetGpu".to_string()),
        ]);
        let a = BTreeMap::from([
            (
                labels::CODES.to_string(),
                "XidFatal,RowsRemapped".to_string(),
            ),
            (
                labels::VERSIONS.to_string(),
                "driver=570.86.15,nccl=2.28.3".to_string(),
            ),
        ]);
        let f = result_facts(&ReportMeta::read(Some(&l), Some(&a)).expect("a report"));
        assert_eq!(f.action, Action::ResetGpu);
        assert_eq!(f.versions.nccl.as_deref(), Some("2.28.3"));
        assert_eq!(
            line_facts(&f),
            (
                Some("XidFatal,RowsRemapped".to_string()),
                Some(Action::ResetGpu)
            )
        );
        let bad = BTreeMap::from([
            (labels::VERDICT.to_string(), "Pass".to_string()),
            (labels::ACTION.to_string(), "Pray".to_string()),
        ]);
        let bad = ReportMeta::read(Some(&bad), None).expect("a report");
        assert_eq!(line_facts(&result_facts(&bad)), (None, None));
    }
}
