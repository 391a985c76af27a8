//! The operator's memory of its validations' runs, by validation uid: the record of each
//! running run ([`RunNodes`]) and what changed since the validation's last reconcile (the
//! pods, results and nodes the watches touched). A reconcile takes both, so that it works on
//! the news only (see [`crate::decide::reconcile::next_on_news`]), and puts back the next record once
//! its step is applied; a failed step puts back nothing, and the next reconcile rebuilds the
//! record from the cluster. Every [`EVERYTHING_EVERY`] a run's reconcile looks at everything
//! again: a watch that had to list again after an outage tells of no object that went while it
//! was away, and this bounds how long such a loss can go unseen.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::decide::reconcile::RunNodes;

/// How often a running run's reconcile looks at everything instead of the news.
pub const EVERYTHING_EVERY: Duration = Duration::from_secs(300);

/// What the watches touched since a validation's last reconcile, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    /// Nodes whose agent pod, result or Node object changed.
    pub nodes: BTreeSet<String>,
    /// The validation's pods that changed (or went).
    pub pods: BTreeSet<String>,
    /// The validation's results that changed (or went).
    pub results: BTreeSet<String>,
}

/// What a watch touched that a validation owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    Pod,
    Result,
}

#[derive(Debug, Default)]
struct Run {
    record: Option<RunNodes>,
    /// The run is not over (Node changes matter to it).
    running: bool,
    changed: Changed,
    /// When a reconcile of this run last looked at everything.
    everything_at: Option<Instant>,
    /// The nodes the run holds (its record's lines), kept while a reconcile has the record:
    /// a Node event wakes the run only for these (see [`Runs::holds`]).
    held: Option<HeldNodes>,
}

/// The node names of a run's record, with the generation and count they were read from (the
/// lines of one generation never change, so they are read once per generation).
#[derive(Debug, Clone)]
struct HeldNodes {
    generation: i64,
    count: usize,
    names: Arc<BTreeSet<String>>,
}

/// What a reconcile takes.
#[derive(Debug, Default)]
pub struct Taken {
    pub record: Option<RunNodes>,
    pub changed: Changed,
    /// Look at everything, not only the news (see [`EVERYTHING_EVERY`]).
    pub everything: bool,
}

/// Every validation's [`Run`] memory.
#[derive(Default)]
pub struct Runs(Mutex<HashMap<String, Run>>);

impl Runs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Run>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes that object `name` (of `kind`, made for `node`) of validation `uid` changed.
    pub fn touch(&self, uid: &str, kind: Owned, name: &str, node: Option<&str>) {
        let mut runs = self.lock();
        let changed = &mut runs.entry(uid.to_string()).or_default().changed;
        let names = match kind {
            Owned::Pod => &mut changed.pods,
            Owned::Result => &mut changed.results,
        };
        names.insert(name.to_string());
        if let Some(n) = node {
            changed.nodes.insert(n.to_string());
        }
    }

    /// Notes that Node `name` changed, for every run that is not over.
    pub fn touch_node(&self, name: &str) {
        for run in self.lock().values_mut().filter(|r| r.running) {
            run.changed.nodes.insert(name.to_string());
        }
    }

    /// Takes validation `uid`'s record (if it has one) and what changed since the last take,
    /// at `now`.
    pub fn take(&self, uid: &str, now: Instant) -> Taken {
        let mut runs = self.lock();
        let run = runs.entry(uid.to_string()).or_default();
        let everything = run
            .everything_at
            .is_none_or(|t| now.saturating_duration_since(t) >= EVERYTHING_EVERY);
        if everything {
            run.everything_at = Some(now);
        }
        Taken {
            record: run.record.take(),
            changed: std::mem::take(&mut run.changed),
            everything,
        }
    }

    /// Keeps `record` for validation `uid` (None: the run is over), and forgets validations
    /// that no longer exist.
    pub fn put(&self, uid: &str, record: Option<RunNodes>, exists: impl Fn(&str) -> bool) {
        let mut runs = self.lock();
        runs.retain(|u, _| u == uid || exists(u));
        let run = runs.entry(uid.to_string()).or_default();
        run.running = record.is_some();
        run.held = record.as_ref().map(|r| match run.held.take() {
            Some(h) if h.generation == r.generation() && h.count == r.lines().len() => h,
            _ => HeldNodes {
                generation: r.generation(),
                count: r.lines().len(),
                names: Arc::new(r.lines().iter().map(|l| l.name.clone()).collect()),
            },
        });
        run.record = record;
    }

    /// Whether validation `uid`'s run holds node `node`: None where no run of it is known
    /// (not started yet, or not since this operator started), so that only its spec can say.
    pub fn holds(&self, uid: &str, node: &str) -> Option<bool> {
        let runs = self.lock();
        let held = runs.get(uid)?.held.as_ref()?;
        Some(held.names.contains(node))
    }

    /// Runs held and about how many bytes their records hold (for the logs).
    pub fn held(&self) -> (usize, usize) {
        let runs = self.lock();
        let bytes = runs
            .values()
            .filter_map(|r| r.record.as_ref())
            .map(RunNodes::approx_bytes)
            .sum();
        (runs.len(), bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_pile_up_until_taken() {
        let runs = Runs::default();
        runs.touch("u1", Owned::Pod, "pod-a", Some("a"));
        runs.touch("u1", Owned::Result, "v-b", Some("b"));
        runs.touch("u1", Owned::Result, "v-b", Some("b"));
        runs.touch("u2", Owned::Pod, "pod-c", None);
        let Taken {
            record, changed, ..
        } = runs.take("u1", Instant::now());
        assert_eq!(record, None);
        assert_eq!(
            changed.nodes.iter().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(changed.pods.contains("pod-a") && changed.results.contains("v-b"));
        let now = Instant::now();
        assert_eq!(
            runs.take("u1", now).changed,
            Changed::default(),
            "taken once"
        );
        assert_eq!(runs.take("u2", now).changed.pods.len(), 1);
    }

    #[test]
    fn node_changes_reach_runs_that_are_not_over() {
        let runs = Runs::default();
        let all = |_: &str| true;
        runs.put("running", Some(RunNodes::new(1, Vec::new())), all);
        runs.put("over", None, all);
        let now = Instant::now();
        assert!(runs.take("running", now).record.is_some());
        runs.touch_node("gpu-1");
        assert!(
            runs.take("running", now).changed.nodes.contains("gpu-1"),
            "a run being reconciled still hears of nodes"
        );
        assert!(runs.take("over", now).changed.nodes.is_empty());
    }

    #[test]
    fn a_run_holds_the_nodes_of_its_record_while_a_reconcile_has_it() {
        let runs = Runs::default();
        assert_eq!(runs.holds("u", "gpu-1"), None, "no run known");
        let line = |n: &str| gpuval_crds::NodeStatus {
            name: n.into(),
            ..Default::default()
        };
        let record = RunNodes::new(1, vec![line("gpu-2"), line("gpu-1")]);
        runs.put("u", Some(record), |_| true);
        assert_eq!(runs.holds("u", "gpu-1"), Some(true));
        assert_eq!(runs.holds("u", "cpu-9"), Some(false));
        let taken = runs.take("u", Instant::now());
        assert_eq!(runs.holds("u", "gpu-2"), Some(true), "while reconciling");
        runs.put("u", taken.record, |_| true);
        runs.put("u", Some(RunNodes::new(2, vec![line("gpu-3")])), |_| true);
        assert_eq!(runs.holds("u", "gpu-1"), Some(false), "a new generation");
        assert_eq!(runs.holds("u", "gpu-3"), Some(true));
        runs.put("u", None, |_| true);
        assert_eq!(runs.holds("u", "gpu-3"), None, "the run is over");
    }

    #[test]
    fn validations_that_went_are_forgotten() {
        let runs = Runs::default();
        runs.put("a", Some(RunNodes::new(1, Vec::new())), |_| true);
        runs.put("b", Some(RunNodes::new(1, Vec::new())), |u| u != "a");
        assert_eq!(runs.held().0, 1);
        assert!(runs.take("a", Instant::now()).record.is_none());
    }

    #[test]
    fn everything_is_seen_first_and_then_every_so_often() {
        let runs = Runs::default();
        let t0 = Instant::now();
        assert!(runs.take("u", t0).everything, "the first reconcile");
        assert!(!runs.take("u", t0 + Duration::from_secs(1)).everything);
        let later = t0 + EVERYTHING_EVERY;
        assert!(runs.take("u", later).everything);
        assert!(!runs.take("u", later).everything);
    }
}
