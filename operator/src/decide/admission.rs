//! The admission decision (pure): which waiting nodes to validate now, which passed nodes to
//! untaint, which failed ones to mark.
//!
//! A node waits when the template selects it and it carries the admission taint (or, with
//! `untestedNodes`, has no `gpuval.io/admission` label: no run whose author may admit nodes has
//! judged it), unless it carries the failure taint (an
//! administrator removes that to try again) or an admission run already covers it. Waiting
//! nodes are batched: a run starts once the newest of them has waited `debounce`, or the
//! oldest [`MAX_DEBOUNCES`] times that (nodes that keep joining never postpone a batch for
//! ever), or at once when there are `maxBatch` of them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuval_crds::schedule::Admission;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use gpuval_crds::schedule::name_prefix;

/// A node as admission sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub created: Timestamp,
    /// The template's selection takes it (GPUs, selector, not cordoned).
    pub selected: bool,
    /// It carries the admission taint.
    pub tainted: bool,
    /// It carries the failure taint (`gpuval.io/failed`).
    pub failed: bool,
    /// It has a `gpuval.io/admission` label (a run whose author may admit nodes judged it).
    pub has_verdict: bool,
}

/// A batch waits at most this many debounces after its oldest node came.
pub const MAX_DEBOUNCES: i32 = 4;

/// What a finished node of an admission run came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Passed,
    /// Failed, Error or DeadlineExceeded, with the message.
    NotPassed(String),
    /// A verdict that says nothing about the node (a simulated result, a finding of only
    /// configuration codes), with why: the node is neither untainted nor marked failed, and
    /// waits for the administrator (fix the installation, then delete the run).
    NoEvidence(String),
}

/// An admission run (a GpuValidation the schedule owns, without a scheduled time).
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionRun {
    pub name: String,
    pub nodes: Vec<String>,
    pub finished: bool,
    /// The nodes with a verdict so far.
    pub outcomes: BTreeMap<String, Outcome>,
}

/// What the shell should do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionPlan {
    /// (run name, nodes) to start.
    pub create: Option<(String, Vec<String>)>,
    /// (node, run) that passed and still carry the admission taint.
    pub untaint: Vec<(String, String)>,
    /// (node, run) that did not pass and get the failure taint.
    pub mark_failed: Vec<(String, String)>,
    /// When to look again for a batch still inside its debounce.
    pub requeue_after: Option<Duration>,
}

/// The name of an admission run of schedule `schedule` started at `now` over `nodes`.
pub fn run_name(schedule: &str, now: Timestamp, nodes: &[String]) -> String {
    let hash = gpuval_crds::result::fnv1a(nodes.join(",").as_bytes());
    format!(
        "{}-admit-{}-{:08x}",
        name_prefix(schedule),
        now.as_second(),
        hash & 0xffff_ffff
    )
}

/// The verdicts of existing admission runs for each node that still exists: passes to untaint
/// and failures to mark, each once.
fn outcomes(
    nodes: &BTreeMap<&str, &NodeView>,
    runs: &[AdmissionRun],
    plan: &mut AdmissionPlan,
) -> BTreeSet<String> {
    let mut decided = BTreeSet::new();
    for run in runs {
        for (node, outcome) in &run.outcomes {
            decided.insert(node.clone());
            // A node removed mid-run is dropped: nothing to untaint or mark.
            let Some(view) = nodes.get(node.as_str()) else {
                continue;
            };
            match outcome {
                Outcome::Passed if view.tainted => {
                    plan.untaint.push((node.clone(), run.name.clone()));
                }
                Outcome::NotPassed(_) if !view.failed => {
                    plan.mark_failed.push((node.clone(), run.name.clone()));
                }
                _ => {}
            }
        }
    }
    plan.untaint.sort();
    plan.untaint.dedup_by(|a, b| a.0 == b.0);
    plan.mark_failed.sort();
    plan.mark_failed.dedup_by(|a, b| a.0 == b.0);
    decided
}

/// Plans admission for schedule `schedule` at `now`.
pub fn plan(
    schedule: &str,
    admission: &Admission,
    nodes: &[NodeView],
    runs: &[AdmissionRun],
    now: Timestamp,
    suspended: bool,
) -> AdmissionPlan {
    let mut out = AdmissionPlan::default();
    let by_name: BTreeMap<&str, &NodeView> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let decided = outcomes(&by_name, runs, &mut out);
    if suspended {
        return out;
    }
    let covered: BTreeSet<&str> = runs
        .iter()
        .filter(|r| !r.finished)
        .flat_map(|r| r.nodes.iter().map(String::as_str))
        .collect();
    let mut waiting: Vec<&NodeView> = nodes
        .iter()
        .filter(|n| n.selected && !n.failed)
        .filter(|n| n.tainted || (admission.untested_nodes && !n.has_verdict))
        .filter(|n| !covered.contains(n.name.as_str()) && !decided.contains(&n.name))
        .collect();
    if waiting.is_empty() {
        return out;
    }
    waiting.sort_by(|a, b| a.name.cmp(&b.name));
    let max = usize::try_from(admission.max_batch).unwrap_or(1).max(1);
    let newest = waiting.iter().map(|n| n.created).max().unwrap_or(now);
    let oldest = waiting.iter().map(|n| n.created).min().unwrap_or(now);
    let debounce = SignedDuration::try_from(admission.debounce_or_default().as_std())
        .unwrap_or(SignedDuration::ZERO);
    let after = |t: Timestamp, d: SignedDuration| t.checked_add(d).unwrap_or(t);
    let longest = debounce.checked_mul(MAX_DEBOUNCES).unwrap_or(debounce);
    let ready_at = after(newest, debounce).min(after(oldest, longest));
    if waiting.len() < max && now < ready_at {
        out.requeue_after = ready_at
            .duration_since(now)
            .try_into()
            .ok()
            .map(|d: Duration| d.max(Duration::from_millis(100)));
        return out;
    }
    let batch: Vec<String> = waiting.iter().take(max).map(|n| n.name.clone()).collect();
    out.create = Some((run_name(schedule, now, &batch), batch));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn node(name: &str, created: &str, tainted: bool) -> NodeView {
        NodeView {
            name: name.into(),
            created: ts(created),
            selected: true,
            tainted,
            failed: false,
            has_verdict: false,
        }
    }

    fn admission() -> Admission {
        serde_json::from_value(serde_json::json!({"debounce": "30s", "maxBatch": 2})).unwrap()
    }

    #[test]
    fn no_evidence_neither_untaints_nor_marks_nor_reruns() {
        let nodes = [node("n1", "2026-11-23T01:00:00Z", true)];
        let run = AdmissionRun {
            name: "gate-admit-1".into(),
            nodes: vec!["n1".into()],
            finished: true,
            outcomes: BTreeMap::from([("n1".to_string(), Outcome::NoEvidence("simulated".into()))]),
        };
        let p = plan(
            "gate",
            &admission(),
            &nodes,
            &[run],
            ts("2026-11-23T02:00:00Z"),
            false,
        );
        assert_eq!(p, AdmissionPlan::default());
    }

    #[test]
    fn waiting_nodes_are_debounced_then_batched() {
        let nodes = [
            node("n1", "2026-11-23T01:00:00Z", true),
            node("n0", "2026-11-23T01:00:10Z", false),
        ];
        let early = plan(
            "gate",
            &admission(),
            &nodes,
            &[],
            ts("2026-11-23T01:00:20Z"),
            false,
        );
        assert_eq!(early.create, None);
        assert_eq!(early.requeue_after, Some(Duration::from_secs(10)));
        let p = plan(
            "gate",
            &admission(),
            &nodes,
            &[],
            ts("2026-11-23T01:00:30Z"),
            false,
        );
        let (name, batch) = p.create.unwrap();
        assert_eq!(
            batch,
            vec!["n1".to_string()],
            "untainted nodes wait only with untestedNodes"
        );
        assert!(name.starts_with("gate-admit-"), "{name}");
        assert_eq!(name, run_name("gate", ts("2026-11-23T01:00:30Z"), &batch));
    }

    #[test]
    fn nodes_that_keep_joining_never_postpone_a_batch_beyond_its_longest_wait() {
        let a: Admission =
            serde_json::from_value(serde_json::json!({"debounce": "30s", "maxBatch": 100}))
                .unwrap();
        // A node joins every 20 s from 01:00:00, each inside the debounce of the one before.
        let joined = |upto: usize| -> Vec<NodeView> {
            (0..=upto)
                .map(|i| {
                    let t = ts("2026-11-23T01:00:00Z") + SignedDuration::from_secs(20 * i as i64);
                    node(&format!("n{i:02}"), &t.to_string(), true)
                })
                .collect()
        };
        let at = |s: &str| plan("gate", &a, &joined(6), &[], ts(s), false);
        let waiting = at("2026-11-23T01:01:59Z");
        assert_eq!(
            waiting.create, None,
            "inside the oldest node's longest wait"
        );
        assert_eq!(waiting.requeue_after, Some(Duration::from_secs(1)));
        let (_, batch) = at("2026-11-23T01:02:00Z")
            .create
            .expect("four debounces after the oldest node, whoever joined since");
        assert_eq!(batch.len(), 7);
    }

    #[test]
    fn a_full_batch_starts_at_once_and_covered_or_failed_nodes_do_not_wait() {
        let mut a = admission();
        a.untested_nodes = true;
        let mut failed = node("f", "2026-11-23T01:00:00Z", true);
        failed.failed = true;
        let nodes = [
            node("a", "2026-11-23T01:00:00Z", true),
            node("b", "2026-11-23T01:00:00Z", false),
            node("c", "2026-11-23T01:00:00Z", true),
            failed,
        ];
        let running = AdmissionRun {
            name: "gate-admit-1".into(),
            nodes: vec!["c".into()],
            finished: false,
            outcomes: BTreeMap::new(),
        };
        let p = plan(
            "gate",
            &a,
            &nodes,
            &[running],
            ts("2026-11-23T01:00:01Z"),
            false,
        );
        assert_eq!(p.create.unwrap().1, vec!["a".to_string(), "b".to_string()]);
        let p = plan("gate", &a, &nodes, &[], ts("2026-11-23T01:00:01Z"), true);
        assert_eq!(p.create, None, "suspended");
    }

    #[test]
    fn outcomes_untaint_passes_mark_failures_and_drop_removed_nodes() {
        let nodes = [
            node("ok", "2026-11-23T01:00:00Z", true),
            node("bad", "2026-11-23T01:00:00Z", true),
        ];
        let run = AdmissionRun {
            name: "gate-admit-1".into(),
            nodes: vec!["ok".into(), "bad".into(), "gone".into()],
            finished: true,
            outcomes: [
                ("ok".to_string(), Outcome::Passed),
                ("bad".to_string(), Outcome::NotPassed("GPU3 memory".into())),
                ("gone".to_string(), Outcome::NotPassed("node gone".into())),
            ]
            .into(),
        };
        let p = plan(
            "gate",
            &admission(),
            &nodes,
            &[run],
            ts("2026-11-23T02:00:00Z"),
            false,
        );
        assert_eq!(p.untaint, [("ok".to_string(), "gate-admit-1".to_string())]);
        assert_eq!(
            p.mark_failed,
            vec![("bad".to_string(), "gate-admit-1".to_string())]
        );
        assert_eq!(p.create, None, "decided nodes are not batched again");
    }
}
