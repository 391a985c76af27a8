//! The schedule decision, as named pure steps: from the schedule, the runs it owns and the
//! time, compute the run to start (if one is due), the runs to delete (replaced or past the
//! history limits), the status and when to look again.
//!
//! [`plan`] runs the steps in order: [`due_slot`] (the latest scheduled time not yet handled),
//! [`admit_run`] (the concurrency policy), [`idle_nodes`] (`idleOnly`), [`prune_history`],
//! then the status. The shell (`schedule::shell`) observes and applies.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuval_crds::conditions::{self, READY};
use gpuval_crds::cron::Cron;
use gpuval_crds::schedule::{
    ConcurrencyPolicy, GpuValidationScheduleStatus, MAX_SKIPPED_LISTED, SkippedNode,
};
use gpuval_crds::{GpuValidationSchedule, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::decide::reconcile::{PlannedEvent, Related};
pub use gpuval_crds::schedule::{MAX_NAME_PREFIX, name_prefix};

/// Requeue when nothing is due sooner.
const IDLE_REQUEUE: Duration = Duration::from_secs(600);

/// A run (GpuValidation) the schedule owns, as the steps see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub name: String,
    /// Its scheduled time (None for an admission run).
    pub scheduled_at: Option<Timestamp>,
    pub created: Timestamp,
    /// Its phase (None before the operator first wrote its status).
    pub phase: Option<Phase>,
    /// True while it is finished and a node it failed on hardware evidence has not taken that
    /// failure into its record yet: deleting the run then could lose the failure, so the
    /// history keeps it a while.
    pub unrecorded: bool,
}

impl Run {
    /// True once the run has its verdict.
    pub fn finished(&self) -> bool {
        self.phase.is_some_and(Phase::is_terminal)
    }
}

/// A run the shell should create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub name: String,
    pub scheduled_at: Timestamp,
    /// The nodes to run on, when `idleOnly` left some out (None: the template's own selection).
    pub node_names: Option<Vec<String>>,
}

/// Everything the shell should do for one schedule.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub create: Option<NewRun>,
    pub delete: Vec<String>,
    pub status: GpuValidationScheduleStatus,
    pub events: Vec<PlannedEvent>,
    pub requeue_after: Option<Duration>,
}

/// Which nodes the template selects, and which of them a pod's GPUs keep busy (node, reason).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeLoad {
    pub selected: Vec<String>,
    pub busy: BTreeMap<String, String>,
    /// Why the load could not be read (then no run starts).
    pub unknown: Option<String>,
}

/// The deterministic name of the run scheduled at `slot`: the schedule's name (cut to
/// [`MAX_NAME_PREFIX`]) and the slot in minutes since 1970, as CronJob names its Jobs.
pub fn run_name(schedule: &str, slot: Timestamp) -> String {
    format!("{}-{}", name_prefix(schedule), slot.as_second() / 60)
}

/// The latest scheduled time in (the last handled time, now], if any. The last handled time
/// is the last run's or skip's scheduled time, or the schedule's creation.
pub fn due_slot(
    cron: &Cron,
    status: &GpuValidationScheduleStatus,
    created: Timestamp,
    now: Timestamp,
) -> Option<Timestamp> {
    let handled = [
        status.last_schedule_time.as_ref(),
        status.last_skipped_time.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|t| t.0)
    .fold(created, Timestamp::max);
    cron.latest_in(handled, now)
}

/// The scheduled time due now for schedule `s` (None when suspended, invalid or not due).
pub fn slot_due(s: &GpuValidationSchedule, now: Timestamp) -> Option<Timestamp> {
    if s.spec.suspend {
        return None;
    }
    let cron = Cron::parse(s.spec.schedule.as_deref()?).ok()?;
    let status = s.status.clone().unwrap_or_default();
    let created = s.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    due_slot(&cron, &status, created, now)
}

/// What the concurrency policy makes of a due run.
#[derive(Debug, Clone, PartialEq)]
pub enum Admit {
    Start,
    /// Delete these running runs first.
    Replace(Vec<String>),
    Skip(String),
}

/// [`Admit`] for a due run while `active` runs go on.
pub fn admit_run(policy: ConcurrencyPolicy, active: &[&Run]) -> Admit {
    if active.is_empty() {
        return Admit::Start;
    }
    let names: Vec<String> = active.iter().map(|r| r.name.clone()).collect();
    match policy {
        ConcurrencyPolicy::Allow => Admit::Start,
        ConcurrencyPolicy::Replace => Admit::Replace(names),
        ConcurrencyPolicy::Forbid => Admit::Skip(format!(
            "concurrencyPolicy Forbid: {} still running",
            names.join(", ")
        )),
    }
}

/// `idleOnly`: the selected nodes no pod keeps busy, and the busy ones with the reason.
pub fn idle_nodes(load: &NodeLoad) -> (Vec<String>, Vec<SkippedNode>) {
    let mut idle = Vec::new();
    let mut skipped = Vec::new();
    for node in &load.selected {
        match load.busy.get(node) {
            Some(why) => skipped.push(SkippedNode {
                name: node.clone(),
                reason: why.clone(),
            }),
            None => idle.push(node.clone()),
        }
    }
    (idle, skipped)
}

/// How soon a schedule is looked at again while a finished run waits for the nodes' records.
pub const RECORD_WAIT: Duration = Duration::from_secs(5);

/// The most runs past the limits the history keeps for nodes that have not recorded their
/// failures (a node-state controller that cannot write keeps no history growing for ever).
pub const MAX_UNRECORDED_KEPT: usize = 3;

/// The finished runs past the history limits, oldest first: passed runs beyond
/// `successful` and other finished runs beyond `failed`, counting from the newest; the newest
/// [`MAX_UNRECORDED_KEPT`] of them whose failure a node has not recorded yet
/// ([`Run::unrecorded`]) are kept until it has.
pub fn prune_history(runs: &[Run], successful: i32, failed: i32) -> Vec<String> {
    let mut finished: Vec<&Run> = runs.iter().filter(|r| r.finished()).collect();
    finished.sort_by_key(|r| std::cmp::Reverse(r.scheduled_at.unwrap_or(r.created)));
    let keep = |limit: i32| usize::try_from(limit).unwrap_or(0);
    let (passed, other): (Vec<&Run>, Vec<&Run>) = finished
        .into_iter()
        .partition(|r| r.phase == Some(Phase::Passed));
    let mut out: Vec<&Run> = passed.into_iter().skip(keep(successful)).collect();
    out.extend(other.into_iter().skip(keep(failed)));
    out.sort_by_key(|r| r.scheduled_at.unwrap_or(r.created));
    let kept: Vec<&str> = out
        .iter()
        .rev()
        .filter(|r| r.unrecorded)
        .take(MAX_UNRECORDED_KEPT)
        .map(|r| r.name.as_str())
        .collect();
    out.into_iter()
        .filter(|r| !kept.contains(&r.name.as_str()))
        .map(|r| r.name.clone())
        .collect()
}

/// The newest finished run (by scheduled or creation time).
fn last_finished(runs: &[Run]) -> Option<&Run> {
    runs.iter()
        .filter(|r| r.finished())
        .max_by_key(|r| r.scheduled_at.unwrap_or(r.created))
}

/// Plans schedule `s` at `now`, given the runs it owns; `load` is asked only when a run is due
/// and `spec.idleOnly` is set.
pub fn plan(
    s: &GpuValidationSchedule,
    runs: &[Run],
    now: Timestamp,
    load: impl FnOnce() -> NodeLoad,
) -> Plan {
    plan_with(s, runs, now, load, None)
}

/// [`plan`], with why the operator refuses the schedule's admission section, if it does (its
/// taint key is not one gpuval may remove): Ready is then False with reason
/// `AdmissionRefused` and that message; scheduled runs go on.
pub fn plan_with(
    s: &GpuValidationSchedule,
    runs: &[Run],
    now: Timestamp,
    load: impl FnOnce() -> NodeLoad,
    admission_refused: Option<String>,
) -> Plan {
    let mut status = s.status.clone().unwrap_or_default();
    status.observed_generation = s.metadata.generation;
    let now_t = Time(now);
    let mut plan = Plan::default();
    let cron = s.spec.schedule.as_deref().map(Cron::parse).transpose();
    let invalid = match (&cron, admission_refused) {
        (Err(e), _) => Some(("InvalidSchedule", format!("spec.schedule: {e}"))),
        (Ok(_), Some(why)) => Some(("AdmissionRefused", why)),
        (Ok(_), None) => None,
    };
    let (ready, reason, msg) = match &invalid {
        Some((reason, msg)) => (false, *reason, msg.as_str()),
        None => (true, "Valid", "the schedule is valid"),
    };
    let changed = conditions::set_condition(
        &mut status.conditions,
        READY,
        ready,
        reason,
        msg,
        s.metadata.generation,
        &now_t,
    );
    if let (Some((reason, note)), true) = (invalid, changed) {
        plan.events.push(PlannedEvent::new(true, reason, note));
    }
    let cron = cron.ok().flatten();
    let active: Vec<&Run> = runs.iter().filter(|r| !r.finished()).collect();
    if let (Some(cron), false) = (&cron, s.spec.suspend) {
        let created = s.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
        if let Some(slot) = due_slot(cron, &status, created, now) {
            start_or_skip(s, &active, slot, load, &mut status, &mut plan);
        }
        status.next_schedule_time = cron.next_after(now).map(Time);
    } else {
        status.next_schedule_time = None;
    }
    let deleted = prune_history(
        runs,
        s.spec.successful_history_limit,
        s.spec.failed_history_limit,
    );
    plan.delete.extend(deleted);
    finish_status(&mut status, runs, &plan);
    let held = runs.iter().any(|r| r.unrecorded);
    plan.requeue_after = Some(
        status
            .next_schedule_time
            .as_ref()
            .map(|t| until(now, t.0))
            .unwrap_or(IDLE_REQUEUE)
            .min(if held { RECORD_WAIT } else { IDLE_REQUEUE }),
    );
    plan.status = status;
    plan
}

/// A due `slot`: starts a run (replacing running ones if asked) or records why it did not.
fn start_or_skip(
    s: &GpuValidationSchedule,
    active: &[&Run],
    slot: Timestamp,
    load: impl FnOnce() -> NodeLoad,
    status: &mut GpuValidationScheduleStatus,
    plan: &mut Plan,
) {
    let skip = |status: &mut GpuValidationScheduleStatus, plan: &mut Plan, why: String| {
        status.last_skipped_time = Some(Time(slot));
        status.last_skipped_reason = Some(why.clone());
        let note = format!("run due at {slot} skipped: {why}");
        plan.events.push(PlannedEvent::new(false, "Skipped", note));
    };
    match admit_run(s.spec.concurrency_policy, active) {
        Admit::Skip(why) => return skip(status, plan, why),
        Admit::Replace(names) => plan.delete.extend(names),
        Admit::Start => {}
    }
    let mut node_names = None;
    status.skipped_nodes.clear();
    if s.spec.idle_only {
        let load = load();
        if let Some(why) = load.unknown {
            return skip(status, plan, why);
        }
        let (idle, skipped) = idle_nodes(&load);
        status.skipped_nodes = skipped.into_iter().take(MAX_SKIPPED_LISTED).collect();
        if idle.is_empty() {
            return skip(
                status,
                plan,
                "idleOnly: no selected node is idle (see skippedNodes)".into(),
            );
        }
        node_names = Some(idle);
    }
    let name = run_name(&s.name_any(), slot);
    status.last_schedule_time = Some(Time(slot));
    let note = format!("started {name} for {slot}");
    plan.events
        .push(PlannedEvent::new(false, "Scheduled", note).about(Related::Run(name.clone())));
    plan.create = Some(NewRun {
        name,
        scheduled_at: slot,
        node_names,
    });
}

/// `active`, `lastVerdict` and `lastValidation` from the runs, less those being deleted, plus
/// the one being created.
fn finish_status(status: &mut GpuValidationScheduleStatus, runs: &[Run], plan: &Plan) {
    let kept: Vec<Run> = runs
        .iter()
        .filter(|r| !plan.delete.contains(&r.name))
        .cloned()
        .collect();
    status.active = kept
        .iter()
        .filter(|r| !r.finished())
        .map(|r| r.name.clone())
        .chain(plan.create.iter().map(|c| c.name.clone()))
        .collect();
    status.active.sort();
    status.active.dedup();
    if let Some(last) = last_finished(runs) {
        status.last_verdict = last.phase;
        status.last_validation = Some(last.name.clone());
    }
}

fn until(now: Timestamp, then: Timestamp) -> Duration {
    then.duration_since(now)
        .try_into()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn schedule(spec: serde_json::Value) -> GpuValidationSchedule {
        serde_json::from_value(json!({
            "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidationSchedule",
            "metadata": {"name": "nightly", "generation": 1, "creationTimestamp": "2026-11-23T00:00:00Z"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn run(name: &str, at: &str, phase: Option<Phase>) -> Run {
        Run {
            name: name.into(),
            scheduled_at: Some(ts(at)),
            created: ts(at),
            phase,
            unrecorded: false,
        }
    }

    fn hourly() -> serde_json::Value {
        json!({"schedule": "0 * * * *", "template": {"checks": {"memory": {}}}})
    }

    #[test]
    fn nothing_is_due_before_the_first_slot_and_next_is_reported() {
        let s = schedule(hourly());
        let p = plan(&s, &[], ts("2026-11-23T00:59:00Z"), || unreachable!());
        assert_eq!(p.create, None);
        assert_eq!(
            p.status.next_schedule_time,
            Some(Time(ts("2026-11-23T01:00:00Z")))
        );
        assert_eq!(p.requeue_after, Some(Duration::from_secs(60)));
    }

    #[test]
    fn a_due_slot_starts_one_deterministically_named_run_once() {
        let mut s = schedule(hourly());
        let now = ts("2026-11-23T03:10:00Z");
        let p = plan(&s, &[], now, NodeLoad::default);
        let new = p.create.clone().expect("a run");
        // Three slots were missed; only the latest runs.
        assert_eq!(new.scheduled_at, ts("2026-11-23T03:00:00Z"));
        assert_eq!(
            new.name,
            format!("nightly-{}", new.scheduled_at.as_second() / 60)
        );
        assert_eq!(p.status.active, vec![new.name.clone()]);
        // Once recorded, the same slot is not due again.
        s.status = Some(p.status);
        let again = plan(
            &s,
            &[run(&new.name, "2026-11-23T03:00:00Z", None)],
            now,
            || unreachable!(),
        );
        assert_eq!(again.create, None);
    }

    #[test]
    fn concurrency_policies() {
        let running = run("nightly-1", "2026-11-23T02:00:00Z", Some(Phase::Running));
        let now = ts("2026-11-23T03:00:30Z");
        let mut s = schedule(hourly());
        s.status = Some(GpuValidationScheduleStatus {
            last_schedule_time: Some(Time(ts("2026-11-23T02:00:00Z"))),
            ..Default::default()
        });
        let forbid = plan(&s, std::slice::from_ref(&running), now, || unreachable!());
        assert_eq!(forbid.create, None);
        assert!(
            forbid
                .status
                .last_skipped_reason
                .unwrap()
                .contains("nightly-1 still running")
        );
        assert_eq!(forbid.status.active, vec!["nightly-1".to_string()]);

        s.spec.concurrency_policy = ConcurrencyPolicy::Replace;
        let replace = plan(&s, std::slice::from_ref(&running), now, NodeLoad::default);
        assert!(replace.create.is_some());
        assert_eq!(replace.delete, vec!["nightly-1".to_string()]);
        assert_eq!(replace.status.active.len(), 1);

        s.spec.concurrency_policy = ConcurrencyPolicy::Allow;
        let allow = plan(&s, std::slice::from_ref(&running), now, NodeLoad::default);
        assert!(allow.create.is_some() && allow.delete.is_empty());
        assert_eq!(allow.status.active.len(), 2);
    }

    #[test]
    fn history_keeps_the_newest_within_each_limit() {
        let runs = [
            run("r1", "2026-11-23T01:00:00Z", Some(Phase::Passed)),
            run("r2", "2026-11-23T02:00:00Z", Some(Phase::Failed)),
            run("r3", "2026-11-23T03:00:00Z", Some(Phase::Passed)),
            run("r4", "2026-11-23T04:00:00Z", Some(Phase::Failed)),
            run("r5", "2026-11-23T05:00:00Z", Some(Phase::Passed)),
            run("r6", "2026-11-23T06:00:00Z", Some(Phase::Running)),
        ];
        assert_eq!(prune_history(&runs, 2, 1), vec!["r1", "r2"]);
        // A failure no node has recorded yet stays until one has.
        let mut waiting = runs.clone();
        waiting[3].unrecorded = true;
        assert_eq!(prune_history(&waiting, 0, 0), vec!["r1", "r2", "r3", "r5"]);
        // At most a few such runs are kept: the oldest go.
        for r in &mut waiting {
            r.unrecorded = true;
        }
        assert_eq!(prune_history(&waiting, 0, 0), vec!["r1", "r2"]);
        assert_eq!(
            prune_history(&runs, 0, 0),
            vec!["r1", "r2", "r3", "r4", "r5"]
        );
        let mut spec = hourly();
        spec["successfulHistoryLimit"] = json!(2);
        let mut s = schedule(spec);
        s.status = Some(GpuValidationScheduleStatus {
            last_schedule_time: Some(Time(ts("2026-11-23T06:00:00Z"))),
            ..Default::default()
        });
        let p = plan(&s, &runs, ts("2026-11-23T06:30:00Z"), || unreachable!());
        assert_eq!(p.delete, vec!["r1", "r2"]);
        assert_eq!(p.status.last_verdict, Some(Phase::Passed));
        assert_eq!(p.status.last_validation.as_deref(), Some("r5"));
        assert_eq!(p.status.active, vec!["r6"]);
    }

    #[test]
    fn idle_only_runs_on_idle_nodes_and_lists_the_busy_ones() {
        let mut spec = hourly();
        spec["idleOnly"] = json!(true);
        let s = schedule(spec);
        let load = NodeLoad {
            selected: vec!["a".into(), "b".into()],
            busy: [(
                "b".to_string(),
                "pod ml/train holds 8 nvidia.com/gpu".to_string(),
            )]
            .into(),
            unknown: None,
        };
        let p = plan(&s, &[], ts("2026-11-23T01:00:00Z"), || load.clone());
        assert_eq!(p.create.unwrap().node_names, Some(vec!["a".to_string()]));
        assert_eq!(p.status.skipped_nodes.len(), 1);
        assert!(p.status.skipped_nodes[0].reason.contains("ml/train"));
        let all_busy = NodeLoad {
            selected: vec!["b".into()],
            busy: load.busy.clone(),
            unknown: None,
        };
        let p = plan(&s, &[], ts("2026-11-23T01:00:00Z"), || all_busy);
        assert_eq!(p.create, None);
        assert!(p.status.last_skipped_reason.unwrap().contains("idleOnly"));
        let unknown = NodeLoad {
            unknown: Some("idleOnly: cannot list pods".into()),
            ..load.clone()
        };
        let p = plan(&s, &[], ts("2026-11-23T01:00:00Z"), || unknown);
        assert_eq!(p.create, None);
        assert_eq!(
            p.status.last_skipped_reason.as_deref(),
            Some("idleOnly: cannot list pods")
        );
        assert_eq!(
            p.status.last_skipped_time,
            Some(Time(ts("2026-11-23T01:00:00Z")))
        );
    }

    #[test]
    fn suspended_or_invalid_schedules_start_nothing() {
        let mut spec = hourly();
        spec["suspend"] = json!(true);
        let p = plan(
            &schedule(spec),
            &[],
            ts("2026-11-23T05:00:00Z"),
            || unreachable!(),
        );
        assert_eq!((p.create, p.status.next_schedule_time), (None, None));
        let mut spec = hourly();
        spec["schedule"] = json!("0 0 31 2 *");
        let p = plan(
            &schedule(spec),
            &[],
            ts("2026-11-23T05:00:00Z"),
            || unreachable!(),
        );
        let ready = conditions::find(&p.status.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSchedule")
        );
        assert!(ready.message.contains("never fires"), "{}", ready.message);
        assert_eq!(p.events[0].reason, "InvalidSchedule");
    }

    #[test]
    fn a_refused_admission_is_not_ready_and_says_why_once() {
        let why = "spec.admission.taint.key nvidia.com/gpu is not gpuval's own".to_string();
        let s = schedule(hourly());
        let at = ts("2026-11-23T05:00:00Z");
        let p = plan_with(&s, &[], at, NodeLoad::default, Some(why.clone()));
        let ready = conditions::find(&p.status.conditions, READY).unwrap();
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_str(),
                ready.message.as_str()
            ),
            ("False", "AdmissionRefused", why.as_str())
        );
        let refusals = |p: &Plan| {
            p.events
                .iter()
                .filter(|e| e.reason == "AdmissionRefused")
                .count()
        };
        assert_eq!(refusals(&p), 1);
        assert!(
            p.status.next_schedule_time.is_some(),
            "scheduled runs go on"
        );
        let mut again = s.clone();
        again.status = Some(p.status.clone());
        let p2 = plan_with(&again, &[], at, NodeLoad::default, Some(why));
        assert_eq!(refusals(&p2), 0, "the event is not repeated");
        assert_eq!(p2.status.conditions, p.status.conditions, "no churn");
    }

    #[test]
    fn long_schedule_names_are_cut_to_a_valid_prefix() {
        let long = format!("{}-x", "a".repeat(MAX_NAME_PREFIX - 1));
        let name = run_name(&long, ts("2026-11-23T01:00:00Z"));
        assert!(name.starts_with(&"a".repeat(MAX_NAME_PREFIX - 1)));
        assert!(!name.contains("--"), "{name}");
    }
}
