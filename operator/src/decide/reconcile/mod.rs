//! The reconcile decision, as named pure steps: from a validation, what the cluster looks like
//! (nodes, this validation's pods and results) and the time, compute the next status and the
//! actions (pods to create or delete, results to delete, events, nodes to mark).
//!
//! A run is one spec generation. Its node set is resolved once, when the generation is first
//! seen ([`start`]), and kept by the operator as a [`RunNodes`] record ([`record`]: a line per
//! node and the counts, reasons and listing kept up to date line by line) that each step takes
//! and gives back; each node's verdict then follows its pod and its result ([`advance`]); the
//! record's counts add up to a phase ([`summarize`]), which sets the kstatus conditions
//! ([`kstatus`]); [`events`] says what to tell and when to look again. The status shows only
//! the counts and the nodes that have not passed (bounded), so an operator that restarts
//! rebuilds the record from the status, the run's pods and results, and the selection
//! ([`start::recover`]).
//!
//! A step sees either everything ([`next`]: the whole run, at its start, after a restart, at
//! the deadline, during the fabric test) or the news since the last step ([`next_on_news`]:
//! the nodes whose pod, result or Node changed), and then advances only those nodes: a result
//! arriving costs work for that node, not for the cluster. The shell (`controller`) observes
//! the cluster into a [`World`] or [`News`] and applies the [`Step`].

pub mod advance;
pub mod allocation;
pub mod clock;
pub mod device_taints;
pub mod events;
pub mod fabric;
pub mod fabric_rails;
pub mod fleet;
pub mod freshness;
pub mod kstatus;
pub mod preflight;
pub mod record;
pub mod start;
pub mod summarize;
pub mod view;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use gpuval_crds::fabric::FabricPhase;
use gpuval_crds::{GpuValidation, GpuValidationStatus, NodeVerdict, Phase, Summary};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::decide::selection::Selection;

pub use advance::RESULT_GRACE;
pub use clock::RunClock;
pub use events::{PlannedEvent, RUNNING_REQUEUE, Related};
pub use record::RunNodes;
pub use view::{PodPhase, PodView, ResultFacts, ResultView, RoundView, World};

/// Longest node message kept in the validation status (the full report is in the result).
pub const MAX_MESSAGE: usize = 200;

/// What changed since a validation's last step: the nodes whose agent pod, result or Node
/// object changed, and a [`World`] that holds, for those nodes, their pods and results as they
/// are now (of any generation; an absent one is gone) and whether each node exists; any other
/// of the validation's pods and results that changed; and all of its fabric rounds.
#[derive(Debug, Clone, Default)]
pub struct News {
    pub nodes: BTreeSet<String>,
    pub world: World,
}

/// Everything the shell should do.
#[derive(Debug, Clone, Default)]
pub struct Step {
    pub status: GpuValidationStatus,
    /// The record to keep for the next step (None once the run is over or blocked).
    pub record: Option<RunNodes>,
    /// Final verdicts nodes reached in this step (for metrics).
    pub new_verdicts: Vec<NodeVerdict>,
    /// (node, gpus) that need an agent pod for this generation.
    pub create_pods: Vec<(String, i32)>,
    pub delete_pods: Vec<String>,
    pub delete_results: Vec<String>,
    /// Nodes whose line became final without their result, with that verdict: their result
    /// (if any) is closed, so that a late report never overrides the line.
    pub close_results: Vec<(String, NodeVerdict)>,
    pub events: Vec<PlannedEvent>,
    /// Nodes that just failed (for onFailure actions).
    pub newly_failed: Vec<String>,
    /// A fabric round to create (see [`fabric`]).
    pub create_round: Option<gpuval_crds::FabricRoundSpec>,
    /// None: nothing to wait for (terminal); the controller's periodic resync still runs.
    pub requeue_after: Option<Duration>,
}

/// `s` in at most [`MAX_MESSAGE`] bytes, shortened in the middle so that its end (what to
/// do) stays (see [`gpuval_crds::text::shorten`]).
fn truncate(s: &str) -> String {
    gpuval_crds::text::shorten(s, MAX_MESSAGE)
}

/// Computes the next step at time `now` from `world`, everything the cluster shows of this
/// validation, and `record`, the previous step's record of this run (None after a restart).
/// `select` is called only when this generation has no node set yet, or to recover one.
pub fn next(
    gv: &GpuValidation,
    world: &World,
    now: Timestamp,
    record: Option<RunNodes>,
    select: impl FnOnce() -> Selection,
) -> Step {
    let view = View { world, news: None };
    decide(gv, view, now, record, select, || None)
}

/// Computes the next step at time `now` from the `news` since the step that gave `record`.
/// Works on the nodes in the news (and those whose result is awaited) only, unless the step
/// needs everything (no record of this run, the deadline passed, the fabric test): then it
/// calls `everything` for the whole view and decides as [`next`] does.
pub fn next_on_news(
    gv: &GpuValidation,
    news: &News,
    now: Timestamp,
    record: Option<RunNodes>,
    everything: impl FnOnce() -> World,
    select: impl FnOnce() -> Selection,
) -> Step {
    if needs_everything(gv, record.as_ref(), now, news.world.pending_limit) {
        return next(gv, &everything(), now, record, select);
    }
    let view = View {
        world: &news.world,
        news: Some(&news.nodes),
    };
    decide(gv, view, now, record, select, || Some(everything()))
}

/// What a step sees: `world` is everything when `news` is None, else the news about those
/// nodes.
#[derive(Clone, Copy)]
struct View<'a> {
    world: &'a World,
    news: Option<&'a BTreeSet<String>>,
}

/// True when the news cannot do: a run that is not over has no record of this generation
/// (it starts, or the operator restarted), is past its deadline (every unfinished node runs
/// out of time), has gone on for the pending limit with a node still Pending (its pod may
/// have waited too long), or has every verdict and a fabric test (which reads every pod and
/// result).
fn needs_everything(
    gv: &GpuValidation,
    record: Option<&RunNodes>,
    now: Timestamp,
    pending_limit: Option<std::time::Duration>,
) -> bool {
    let generation = gv.metadata.generation.unwrap_or(0);
    let Some(previous) = gv
        .status
        .as_ref()
        .filter(|p| start::is_same_run(p, generation))
    else {
        return true;
    };
    if previous.phase.is_some_and(Phase::is_terminal) {
        return false;
    }
    let Some(r) = record.filter(|r| r.generation() == generation) else {
        return true;
    };
    let deadline = gv.spec.deadline_or_default();
    let clock = RunClock::new(now, previous.start_time.as_ref(), deadline)
        .with_pending_limit(pending_limit);
    let pending = || r.lines().iter().any(|l| l.verdict == NodeVerdict::Pending);
    clock.past_deadline()
        || (clock.pending_limit_reached() && pending())
        || (gv.spec.fabric.is_some() && r.all_final())
}

/// The step, from what `view` shows (when it is the news, `everything` gives the whole view,
/// for the fabric test).
fn decide(
    gv: &GpuValidation,
    view: View<'_>,
    now: Timestamp,
    record: Option<RunNodes>,
    select: impl FnOnce() -> Selection,
    everything: impl FnOnce() -> Option<World>,
) -> Step {
    let generation = gv.metadata.generation.unwrap_or(0);
    let now_t = Time(now);
    let previous = gv.status.clone().unwrap_or_default();
    let same_run = start::is_same_run(&previous, generation);
    let world = view.world;
    let stale = start::leftovers(world, generation);
    let mut step = Step {
        delete_pods: stale.pods,
        delete_results: stale.results,
        ..Default::default()
    };

    if same_run && previous.phase.is_some_and(Phase::is_terminal) {
        // A finished run stays as it ended (a blocked one has no node lines to count again),
        // but its agents must hear that the fabric test is over.
        let deadline = gv.spec.deadline_or_default();
        let clock = RunClock::new(now, previous.start_time.as_ref(), deadline);
        step.create_round =
            fabric::for_run(gv, world, &previous, &clock, &mut []).and_then(|f| f.round);
        step.status = previous;
        return step;
    }
    let Some((mut status, mut record)) = this_run(
        generation,
        previous,
        same_run.then_some(record),
        world,
        select,
        &now_t,
        &mut step,
    ) else {
        return step;
    };

    let clock = RunClock::new(
        now,
        status.start_time.as_ref(),
        gv.spec.deadline_or_default(),
    )
    .with_pending_limit(view.world.pending_limit);
    advance_nodes(&mut record, view, &clock, &mut step);
    // Once every node has its verdict the step reads every pod and result (from `everything`
    // when it has only the news): the fabric test and the fleet's versions need them all.
    let whole = if record.all_final() {
        view.news.and_then(|_| everything())
    } else {
        None
    };
    let fabric_requeue = fabric_step(
        gv,
        view,
        whole.as_ref(),
        &clock,
        &mut status,
        &mut record,
        &mut step,
    );

    note_simulated(&mut status, [Some(view.world), whole.as_ref()], generation);
    let (phase, summary) = conclude(&mut status, &record, generation, &now_t);
    if status.simulated == Some(true) {
        kstatus::mark_simulated(&mut status.conditions);
    }
    // The fleet's versions: read from every result when the step sees them all (the start,
    // a full look, and once every node has its verdict), so a step on the news stays flat.
    if let Some(w) = whole.as_ref().or(view.news.is_none().then_some(view.world)) {
        status.fleet = fleet::of(&w.results, generation);
    }
    if phase.is_terminal() {
        step.events.push(events::finished(phase, &summary));
    } else {
        step.record = Some(record);
    }
    step.requeue_after = events::requeue_after(
        phase,
        &clock,
        step.record.as_ref().is_some_and(RunNodes::is_awaiting),
    )
    .map(|r| fabric_requeue.map_or(r, |f| r.min(f)));
    step.status = status;
    step
}

/// The status and node record of this generation's run: for the same run (`same_run` holds
/// the record kept in memory, if any) its record, or one recovered from the cluster; else a new
/// run's. None when a new run is blocked (`step` then holds its status and event).
fn this_run(
    generation: i64,
    previous: GpuValidationStatus,
    same_run: Option<Option<RunNodes>>,
    world: &World,
    select: impl FnOnce() -> Selection,
    now: &Time,
    step: &mut Step,
) -> Option<(GpuValidationStatus, RunNodes)> {
    if let Some(kept) = same_run {
        let record = match kept.filter(|r| r.generation() == generation) {
            Some(r) => r,
            None => {
                let lines = start::recover(&previous, world, generation, &select());
                RunNodes::new(generation, lines)
            }
        };
        return Some((previous, record));
    }
    match start::start_run(generation, &previous, &select(), now) {
        start::RunStart::Blocked { status, event } => {
            step.events.push(event);
            step.status = status;
            None
        }
        start::RunStart::Started {
            status,
            nodes,
            event,
        } => {
            step.events.push(event);
            Some((status, RunNodes::new(generation, nodes)))
        }
    }
}

/// The fabric test's part of the step (see [`fabric`]); returns when to look again for it.
/// Before every node has its verdict the fabric step only waits and changes no line; once
/// they all have one it reads every pod and result (`whole` when the step has only the news)
/// and may fail nodes, so the record is then rebuilt.
fn fabric_step(
    gv: &GpuValidation,
    view: View<'_>,
    whole: Option<&World>,
    clock: &RunClock,
    status: &mut GpuValidationStatus,
    record: &mut RunNodes,
    step: &mut Step,
) -> Option<Duration> {
    gv.spec.fabric.as_ref()?;
    let f = if record.all_final() {
        let world = whole.unwrap_or(view.world);
        record.edit_all(|lines| fabric::for_run(gv, world, status, clock, lines))
    } else {
        record.lend(|lines| fabric::for_run(gv, view.world, status, clock, lines))
    }?;
    step.newly_failed.extend(f.newly_failed);
    step.events.extend(f.events);
    step.create_round = f.round;
    status.fabric = f.status;
    f.requeue
}

/// Sets `status.simulated` once a result of `generation` in any of `worlds` came from the
/// simulated backend (it stays set: the run's verdicts are not about real GPUs).
fn note_simulated<'a>(
    status: &mut GpuValidationStatus,
    worlds: impl IntoIterator<Item = Option<&'a World>>,
    generation: i64,
) {
    let simulated = worlds.into_iter().flatten().any(|w| {
        w.results
            .iter()
            .any(|r| r.generation == generation && r.facts.simulated)
    });
    if simulated {
        status.simulated = Some(true);
    }
}

/// Sets the counts, the listed node lines, the phase, the conditions and (once the run is
/// over) the completion time from the run's `record`.
fn conclude(
    status: &mut GpuValidationStatus,
    record: &RunNodes,
    generation: i64,
    now: &Time,
) -> (Phase, Summary) {
    let summary = record.summary();
    let mut phase = summarize::phase_of(&summary);
    let fabric = status.fabric.as_ref();
    if phase.is_terminal() && fabric.is_some_and(|f| !f.phase.is_terminal()) {
        phase = Phase::Running;
    }
    let (listed, not_listed) = record.listed();
    // The fabric failed without naming a node: every node that did not pass is one it could
    // neither clear nor name (or none), so the fabric's own words say why.
    let only_fabric = |f: &gpuval_crds::fabric::FabricStatus| {
        phase.is_terminal()
            && listed
                .iter()
                .filter(|l| summarize::is_failed(l.verdict))
                .all(|l| f.suspects.contains(&l.name))
    };
    match fabric.filter(|f| f.phase == FabricPhase::Failed && only_fabric(f)) {
        Some(f) => {
            phase = Phase::Failed;
            let msg = f.message.as_deref().unwrap_or("the fabric test failed");
            kstatus::set_fabric_failed(&mut status.conditions, msg, generation, now);
        }
        None => kstatus::set_for_phase(
            &mut status.conditions,
            phase,
            &summary,
            &listed,
            record.awaiting().len(),
            generation,
            now,
        ),
    }
    (status.nodes, status.nodes_not_listed) = (listed, not_listed);
    if phase.is_terminal() {
        status.completion_time.get_or_insert_with(|| now.clone());
    }
    status.phase = Some(phase);
    status.summary = Some(summary.clone());
    (phase, summary)
}

/// Advances the nodes without a final verdict that `view` has news of (every one when it
/// shows everything) and those whose result is awaited, adding the pods to create or delete,
/// the nodes that failed and their events to `step`. A node whose result is awaited and that
/// is not in the news is advanced from its finished pod as the record kept it.
fn advance_nodes(record: &mut RunNodes, view: View<'_>, clock: &RunClock, step: &mut Step) {
    let generation = record.generation();
    let world = view.world;
    let pods: HashMap<&str, &PodView> = world
        .pods_of(generation)
        .map(|p| (p.node.as_str(), p))
        .collect();
    let results: HashMap<&str, &ResultView> = world
        .results_of(generation)
        .map(|r| (r.node.as_str(), r))
        .collect();
    let targets = match view.news {
        None => record.unfinished(),
        Some(nodes) => {
            let mut t: Vec<usize> = nodes.iter().filter_map(|n| record.position(n)).collect();
            t.extend(record.awaiting());
            t.sort_unstable();
            t.dedup();
            t
        }
    };
    for i in targets {
        let line = &record.lines()[i];
        if line.verdict.is_final() {
            continue;
        }
        let name = line.name.as_str();
        let seen = if view.news.is_none_or(|n| n.contains(name)) {
            advance::Seen {
                pod: pods.get(name).copied(),
                result: results.get(name).copied(),
                node_exists: world.nodes.contains(name),
            }
        } else {
            advance::Seen {
                pod: record.awaited_pod(i),
                result: None,
                node_exists: true,
            }
        };
        let next = advance::advance_node(line, seen, clock);
        let awaited = next.waiting_for_result.then(|| seen.pod.cloned()).flatten();
        match next.pod {
            Some(advance::PodChange::Create) => step
                .create_pods
                .push((next.line.name.clone(), next.line.gpus)),
            Some(advance::PodChange::Delete(pod)) => step.delete_pods.push(pod),
            None => {}
        }
        let verdict = next.line.verdict;
        if verdict.is_final() {
            step.new_verdicts.push(verdict);
            if next.line.result.is_none() {
                step.close_results.push((next.line.name.clone(), verdict));
            }
        }
        if summarize::is_failed(verdict) {
            step.newly_failed.push(next.line.name.clone());
            step.events.push(events::node_failed(&next.line));
        }
        record.set(i, next.line);
        record.await_result(i, awaited);
    }
}

/// True when `gv`'s run is over (its phase is terminal).
pub fn finished(gv: &GpuValidation) -> bool {
    gv.status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(Phase::is_terminal)
}

#[cfg(test)]
#[path = "news_tests.rs"]
mod news_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::selection::{SelectedNode, Selection};
    use gpuval_crds::conditions::{self, READY, RECONCILING, STALLED};
    use gpuval_crds::{GpuValidationSpec, Verdict};

    fn gv(generation: i64, status: Option<GpuValidationStatus>) -> GpuValidation {
        let mut g = GpuValidation::new("acceptance", crate::decide::selection::tests::spec());
        g.metadata.generation = Some(generation);
        g.status = status;
        g
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + secs).unwrap()
    }

    fn two_nodes() -> Selection {
        Selection {
            selected: vec![
                SelectedNode {
                    name: "a".into(),
                    gpus: 8,
                },
                SelectedNode {
                    name: "b".into(),
                    gpus: 8,
                },
            ],
            ..Default::default()
        }
    }

    /// The cluster at `secs` into the run: both nodes exist.
    fn world(secs: i64, pods: Vec<PodView>, results: Vec<ResultView>) -> (Timestamp, World) {
        let w = World {
            nodes: ["a".into(), "b".into()].into(),
            pods,
            results,
            rounds: Vec::new(),
            fabric_port: 0,
            pending_limit: None,
        };
        (at(secs), w)
    }

    /// The cluster as the run starts: both nodes, no pods, no results.
    fn start() -> (Timestamp, World) {
        world(0, vec![], vec![])
    }

    /// Both nodes' pods, in `phase`.
    fn both(phase: PodPhase) -> Vec<PodView> {
        vec![pod("a", phase), pod("b", phase)]
    }

    fn pod(node: &str, phase: PodPhase) -> PodView {
        PodView {
            name: format!("pod-{node}"),
            node: node.into(),
            generation: 1,
            phase,
            ..Default::default()
        }
    }

    fn result(node: &str, v: Verdict, summary: &str) -> ResultView {
        ResultView {
            name: format!("acceptance-{node}"),
            node: node.into(),
            generation: 1,
            verdict: v,
            summary: summary.into(),
            fabric: Vec::new(),
            ports: None,
            facts: Default::default(),
        }
    }

    /// Feeds each step's status back in, as the API server would.
    fn run(steps: &[(Timestamp, World)]) -> Vec<Step> {
        let mut g = gv(1, None);
        let mut out: Vec<Step> = Vec::new();
        for (now, w) in steps {
            let record = out.last().and_then(|s| s.record.clone());
            let s = next(&g, w, *now, record, two_nodes);
            g.status = Some(s.status.clone());
            out.push(s);
        }
        out
    }

    #[test]
    fn a_new_run_resolves_nodes_and_creates_one_pod_each() {
        let s = &run(&[start()])[0];
        assert_eq!(
            s.create_pods,
            vec![("a".to_string(), 8), ("b".to_string(), 8)]
        );
        assert_eq!(s.status.phase, Some(Phase::Pending));
        assert_eq!(s.status.observed_generation, Some(1));
        assert!(conditions::is_true(&s.status.conditions, RECONCILING));
        assert!(!conditions::is_true(&s.status.conditions, READY));
        assert_eq!(s.events[0].reason, "Started");
        assert!(s.requeue_after.is_some());
    }

    #[test]
    fn all_pass_gives_passed_and_ready() {
        let steps = run(&[
            start(),
            world(5, both(PodPhase::Running), vec![]),
            world(
                60,
                both(PodPhase::Succeeded),
                vec![
                    result("a", Verdict::Pass, ""),
                    result("b", Verdict::Warn, "GPU1 throttled"),
                ],
            ),
        ]);
        assert_eq!(steps[1].status.phase, Some(Phase::Running));
        assert!(
            steps[1].create_pods.is_empty(),
            "pods exist; nothing to create"
        );
        let last = &steps[2].status;
        assert_eq!(last.phase, Some(Phase::Passed));
        assert!(conditions::is_true(&last.conditions, READY));
        assert!(!conditions::is_true(&last.conditions, STALLED));
        assert_eq!(last.summary.as_ref().unwrap().passed, 2);
        assert!(last.completion_time.is_some());
        assert_eq!(steps[2].events.last().unwrap().reason, "Passed");
        assert_eq!(steps[2].requeue_after, None);
    }

    #[test]
    fn one_failing_node_fails_the_run_and_names_it() {
        let steps = run(&[
            start(),
            world(
                60,
                both(PodPhase::Succeeded),
                vec![
                    result("a", Verdict::Pass, ""),
                    result("b", Verdict::Fail, "GPU3 memory: 2 mismatched words"),
                ],
            ),
        ]);
        let s = &steps[1].status;
        assert_eq!(s.phase, Some(Phase::Failed));
        assert!(conditions::is_true(&s.conditions, STALLED));
        let stalled = conditions::find(&s.conditions, STALLED).unwrap();
        assert!(
            stalled.message.contains("b Failed: GPU3 memory"),
            "{}",
            stalled.message
        );
        assert_eq!(steps[1].newly_failed, vec!["b".to_string()]);
        assert!(
            steps[1]
                .events
                .iter()
                .any(|e| e.reason == "NodeFailed" && e.note.contains("GPU3"))
        );
    }

    #[test]
    fn a_failed_pod_is_an_error_with_its_reason_and_the_run_completes() {
        let mut p = pod("b", PodPhase::Failed);
        p.reason = Some("OOMKilled (exit code 137)".into());
        let steps = run(&[
            start(),
            world(
                30,
                vec![pod("a", PodPhase::Succeeded), p],
                vec![result("a", Verdict::Pass, "")],
            ),
        ]);
        let b = &steps[1].status.nodes[0];
        assert_eq!(b.name, "b", "only the node that did not pass is listed");
        assert_eq!(b.verdict, NodeVerdict::Error);
        assert!(b.message.as_deref().unwrap().contains("OOMKilled"));
        assert_eq!(steps[1].status.phase, Some(Phase::Failed));
        assert_eq!(
            steps[1].close_results,
            vec![("b".to_string(), NodeVerdict::Error)],
            "a failed pod's late result never overrides its line"
        );
    }

    #[test]
    fn deadline_gives_deadline_exceeded_and_removes_pods() {
        let steps = run(&[
            start(),
            world(
                3601,
                both(PodPhase::Running),
                vec![result("a", Verdict::Pass, "")],
            ),
        ]);
        let s = &steps[1];
        assert_eq!(s.status.nodes.len(), 1, "a passed: counted, not listed");
        assert_eq!(s.status.nodes[0].name, "b");
        assert_eq!(s.status.nodes[0].verdict, NodeVerdict::DeadlineExceeded);
        assert_eq!(s.status.summary.as_ref().unwrap().passed, 1);
        assert_eq!(s.delete_pods, vec!["pod-b".to_string()]);
        assert_eq!(s.status.phase, Some(Phase::Failed));
        // b's line is final without its result: its result is closed, a's (counted) is not.
        assert_eq!(
            s.close_results,
            vec![("b".to_string(), NodeVerdict::DeadlineExceeded)]
        );
    }

    #[test]
    fn a_vanished_pod_or_node_is_an_error() {
        let mut w = world(40, vec![], vec![]);
        w.1.nodes.remove("b");
        let steps = run(&[start(), world(5, both(PodPhase::Running), vec![]), w]);
        assert_eq!(
            steps[2].status.nodes[0].verdict,
            NodeVerdict::Error,
            "pod a vanished"
        );
        assert!(
            steps[2].status.nodes[0]
                .message
                .as_deref()
                .unwrap()
                .contains("disappeared")
        );
        assert!(
            steps[2].status.nodes[1]
                .message
                .as_deref()
                .unwrap()
                .contains("node was deleted")
        );
    }

    #[test]
    fn succeeded_without_result_waits_then_errors() {
        let mut done = pod("a", PodPhase::Succeeded);
        done.finished_at = Some(at(10));
        let steps = run(&[
            start(),
            world(12, vec![done.clone(), pod("b", PodPhase::Running)], vec![]),
            world(45, vec![done, pod("b", PodPhase::Running)], vec![]),
        ]);
        assert_eq!(steps[1].status.nodes[0].verdict, NodeVerdict::Running);
        assert!(steps[1].requeue_after.unwrap() <= Duration::from_secs(5));
        assert_eq!(steps[2].status.nodes[0].verdict, NodeVerdict::Error);
    }

    #[test]
    fn the_same_world_twice_gives_the_same_status() {
        let w = world(
            5,
            vec![pod("a", PodPhase::Running), pod("b", PodPhase::Pending)],
            vec![],
        );
        let steps = run(&[start(), w.clone()]);
        let mut g = gv(1, Some(steps[1].status.clone()));
        let again = next(&g, &w.1, at(9), steps[1].record.clone(), two_nodes);
        assert_eq!(
            again.status, steps[1].status,
            "no change, no new status (no reconcile storm)"
        );
        assert!(again.events.is_empty());
        g.status = Some(again.status);
    }

    #[test]
    fn a_new_generation_starts_over_and_cleans_up_the_old_run() {
        let first = run(&[start()]);
        let mut g = gv(2, Some(first[0].status.clone()));
        g.spec = GpuValidationSpec { ..g.spec.clone() };
        let old_pod = pod("a", PodPhase::Running);
        let old_result = result("b", Verdict::Pass, "");
        let (now, w) = world(10, vec![old_pod], vec![old_result]);
        let s = next(&g, &w, now, first[0].record.clone(), two_nodes);
        assert_eq!(s.status.observed_generation, Some(2));
        assert_eq!(s.delete_pods, vec!["pod-a".to_string()]);
        assert_eq!(s.delete_results, vec!["acceptance-b".to_string()]);
        assert_eq!(s.create_pods.len(), 2);
        assert!(
            s.status
                .nodes
                .iter()
                .all(|n| n.verdict == NodeVerdict::Pending)
        );
    }

    #[test]
    fn a_selection_that_matches_nothing_stalls() {
        let g = gv(1, None);
        let (now, w) = start();
        let s = next(&g, &w, now, None, Selection::default);
        assert_eq!(s.status.phase, Some(Phase::Failed));
        let stalled = conditions::find(&s.status.conditions, STALLED).unwrap();
        assert_eq!(stalled.reason, "NoNodesSelected");
        assert!(s.create_pods.is_empty());
        assert_eq!(s.requeue_after, None);
    }
    #[test]
    fn a_blocked_run_stays_blocked() {
        let g = gv(1, None);
        let (now, w) = start();
        let first = next(&g, &w, now, None, Selection::default);
        let g = gv(1, Some(first.status.clone()));
        let again = next(&g, &w, at(5), None, || {
            unreachable!("the node set is resolved once")
        });
        assert_eq!(again.status, first.status, "still Failed and Stalled");
        assert!(again.events.is_empty());
        assert_eq!(again.requeue_after, None);
    }

    #[test]
    fn a_finished_run_is_left_as_it_ended() {
        let done = |node| pod(node, PodPhase::Succeeded);
        let passed = |node| result(node, Verdict::Pass, "");
        let (now, w) = world(
            60,
            vec![done("a"), done("b")],
            vec![passed("a"), passed("b")],
        );
        let steps = run(&[start(), (now, w.clone())]);
        assert_eq!(steps[1].status.phase, Some(Phase::Passed));
        let g = gv(1, Some(steps[1].status.clone()));
        let again = next(&g, &w, at(900), None, two_nodes);
        assert_eq!(again.status, steps[1].status);
        assert!(again.events.is_empty(), "Passed is told once");
        assert_eq!(again.requeue_after, None);
    }

    #[test]
    fn a_restarted_operator_recovers_the_run_and_decides_the_same() {
        let mut done = pod("a", PodPhase::Succeeded);
        done.finished_at = Some(at(10));
        let w = world(
            20,
            vec![done, pod("b", PodPhase::Running)],
            vec![result("a", Verdict::Fail, "GPU0 memory: 1 word")],
        );
        let steps = run(&[start(), w.clone()]);
        let g = gv(1, Some(steps[1].status.clone()));
        let kept = next(&g, &w.1, at(21), steps[1].record.clone(), two_nodes);
        let recovered = next(&g, &w.1, at(21), None, two_nodes);
        assert_eq!(recovered.status, kept.status);
        assert_eq!(recovered.record, kept.record);
        assert!(recovered.create_pods.is_empty(), "both pods exist");
    }

    #[test]
    fn a_restart_before_every_pod_was_created_creates_the_rest() {
        let steps = run(&[start()]);
        let g = gv(1, Some(steps[0].status.clone()));
        let (now, w) = world(3, vec![pod("a", PodPhase::Pending)], vec![]);
        let s = next(&g, &w, now, None, two_nodes);
        assert_eq!(s.create_pods, vec![("b".to_string(), 8)]);
        assert_eq!(s.record.map(|r| r.lines().len()), Some(2));
    }

    #[test]
    fn the_status_of_a_large_run_stays_small() {
        let n = 5_000;
        let selection = || Selection::of_nodes((0..n).map(|i| format!("gpu-node-{i:05}")), 8);
        let g = gv(1, None);
        let cluster = World {
            nodes: selection().selected.into_iter().map(|n| n.name).collect(),
            ..Default::default()
        };
        let first = next(&g, &cluster, at(0), None, selection);
        let results = (0..n)
            .map(|i| {
                let node = format!("gpu-node-{i:05}");
                let v = if i % 3 == 0 {
                    Verdict::Fail
                } else {
                    Verdict::Pass
                };
                ResultView {
                    name: format!("acceptance-{node}"),
                    node,
                    generation: 1,
                    verdict: v,
                    summary: format!("GPU{} memory: {} mismatched words", i % 8, i),
                    fabric: Vec::new(),
                    ports: None,
                    facts: Default::default(),
                }
            })
            .collect();
        let w = World { results, ..cluster };
        let g = gv(1, Some(first.status.clone()));
        let s = next(&g, &w, at(60), first.record, selection);
        let sum = s.status.summary.clone().unwrap();
        assert_eq!((sum.selected, sum.failed), (n, 1667));
        assert_eq!(s.status.nodes.len(), gpuval_crds::MAX_LISTED_NODES);
        assert_eq!(s.status.nodes_not_listed, 1667 - 50);
        assert_eq!(sum.reasons[0].count, 209, "{:?}", sum.reasons);
        let size = serde_json::to_vec(&s.status).unwrap().len();
        assert!(size < 64 * 1024, "{size} bytes");
        assert_eq!(s.new_verdicts.len(), n as usize);
    }
}
