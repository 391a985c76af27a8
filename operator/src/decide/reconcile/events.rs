//! What to tell people and when to look again: the validation's Kubernetes events and the
//! requeue interval.

use std::time::Duration;

use gpuval_crds::{NodeStatus, Phase, Summary};

use super::clock::RunClock;
use super::summarize;

/// Requeue while a run is in progress (watches can miss events).
pub const RUNNING_REQUEUE: Duration = Duration::from_secs(30);
/// Requeue while a finished agent's result is awaited (the result watch trails the pod watch).
pub const RESULT_POLL: Duration = Duration::from_secs(5);

/// The most an event's note holds (the API server refuses a longer one).
pub const MAX_NOTE: usize = 1024;

/// `s` as an event's note: whole up to [`MAX_NOTE`] bytes (a note is read in full, so it is
/// never cut to a status line's length), else shortened in the middle at a clause.
pub fn note(s: &str) -> String {
    gpuval_crds::text::shorten(s, MAX_NOTE)
}

/// A Kubernetes event to publish about the validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
    /// The node or run the event is about, besides the object it regards (its `related`).
    pub related: Option<Related>,
}

/// What else an event is about. The event recorder counts an event that repeats one with the
/// same reason about the same objects in that event's series, keeping the first note: naming
/// the node or run keeps each its own event (issue 55: "fab-0 passed" counted three times,
/// two of them fab-1's), and the same node's repeats are counted per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Related {
    Node(String),
    /// A run: a GpuValidation by name.
    Run(String),
}

impl PlannedEvent {
    /// An event about no other object.
    pub fn new(warning: bool, reason: &'static str, note: String) -> Self {
        PlannedEvent {
            warning,
            reason,
            note,
            related: None,
        }
    }

    /// This event, about `related` too.
    pub fn about(self, related: Related) -> Self {
        PlannedEvent {
            related: Some(related),
            ..self
        }
    }
}

/// The note of a run whose certificates could not be signed: why, and what to do.
pub fn certificate_not_written(why: &str) -> String {
    note(&format!(
        "no certificate was written for this run: {why}; fix the key Secret (--certificate-key-secret) and rerun to get one"
    ))
}

/// The note of a run whose certificates the API server kept failing: how many tries, the last
/// error, and what to do.
pub fn certificate_gave_up(tries: u32, why: &str) -> String {
    gpuval_crds::text::shorten(
        &format!(
            "no certificate was written for this run: {tries} tries failed, the last with: {why}; the verdict stands; once the API server accepts ConfigMaps in the operator's namespace again, rerun the validation to get one"
        ),
        1000,
    )
}

/// The note of a run whose certificates the API server refused outright (another try cannot
/// change that): why, and what to do.
pub fn certificate_refused(why: &str) -> String {
    gpuval_crds::text::shorten(
        &format!(
            "no certificate was written for this run: the API server refused it: {why}; the verdict stands; check that the operator may create, get and list ConfigMaps and read its results in its namespace, then rerun the validation to get one"
        ),
        1000,
    )
}

/// A run started on `nodes` nodes for spec generation `generation`.
pub fn started(nodes: usize, generation: i64) -> PlannedEvent {
    PlannedEvent::new(
        false,
        "Started",
        format!("validating {nodes} node(s), generation {generation}"),
    )
}

/// The run cannot start (`reason` is the Stalled condition's reason).
pub fn blocked(reason: &'static str, message: &str) -> PlannedEvent {
    PlannedEvent::new(true, reason, note(message))
}

/// A node reached a final verdict other than Passed.
pub fn node_failed(line: &NodeStatus) -> PlannedEvent {
    let text = format!(
        "{}: {}: {}",
        line.name,
        line.verdict,
        line.message.as_deref().unwrap_or("")
    );
    PlannedEvent::new(true, "NodeFailed", note(&text)).about(Related::Node(line.name.clone()))
}

/// The run reached `phase`, a terminal one (Passed or Failed).
pub fn finished(phase: Phase, summary: &Summary) -> PlannedEvent {
    PlannedEvent::new(
        phase == Phase::Failed,
        phase.as_str(),
        note(&summarize::progress(summary)),
    )
}

/// When to reconcile again: never for a finished run (the periodic resync still runs);
/// otherwise every [`RUNNING_REQUEUE`], just after the deadline when that comes first, and
/// every [`RESULT_POLL`] while a finished agent's result is awaited.
pub fn requeue_after(phase: Phase, clock: &RunClock, waiting_for_result: bool) -> Option<Duration> {
    if phase.is_terminal() {
        return None;
    }
    let mut after = RUNNING_REQUEUE.min(clock.to_deadline() + Duration::from_secs(1));
    if waiting_for_result {
        after = after.min(RESULT_POLL);
    }
    Some(after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::NodeVerdict;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn clock(elapsed: i64, deadline: u64) -> RunClock {
        let start = Timestamp::from_second(1_790_000_000).unwrap();
        let now = Timestamp::from_second(1_790_000_000 + elapsed).unwrap();
        RunClock::new(
            now,
            Some(&Time(start)),
            gpuval_crds::Duration::from_secs(deadline),
        )
    }

    #[test]
    fn an_event_tells_the_whole_message_and_only_a_longer_one_than_a_note_holds_is_cut() {
        let why = "spec.fabric needs the operator's fabric settings: the chart's agent.fabric values are not set (hostNetwork, resources, capabilities), so agents of this validation cannot reach each other over the data network; set agent.fabric in the Helm values (docs/fabric.md says which for InfiniBand and RoCE) and apply the validation again, or remove spec.fabric to validate the nodes one by one";
        assert!(
            why.len() > super::super::MAX_MESSAGE,
            "longer than a status line"
        );
        assert_eq!(blocked("NotConfigured", why).note, why);
        let long = why.repeat(4);
        let cut = blocked("NotConfigured", &long).note;
        assert!(cut.len() <= MAX_NOTE, "{}", cut.len());
        assert!(cut.ends_with("to validate the nodes one by one"), "{cut}");
    }

    #[test]
    fn a_failed_node_is_a_warning_naming_node_verdict_and_message() {
        let e = node_failed(&NodeStatus {
            name: "gpu-7".into(),
            verdict: NodeVerdict::DeadlineExceeded,
            message: Some("no verdict within the deadline (1h)".into()),
            ..Default::default()
        });
        assert!(e.warning);
        assert_eq!(e.reason, "NodeFailed");
        assert_eq!(
            e.note,
            "gpu-7: DeadlineExceeded: no verdict within the deadline (1h)"
        );
    }

    #[test]
    fn finishing_is_named_for_the_phase_and_only_failure_warns() {
        let sum = Summary {
            selected: 3,
            passed: 2,
            failed: 1,
            ..Default::default()
        };
        let failed = finished(Phase::Failed, &sum);
        assert!(failed.warning);
        assert_eq!(failed.reason, "Failed");
        assert_eq!(failed.note, "3/3 node(s) done, 2 passed, 1 failed");
        let passed = finished(Phase::Passed, &sum);
        assert!(!passed.warning);
        assert_eq!(passed.reason, "Passed");
    }

    #[test]
    fn long_notes_are_cut_in_the_middle_keeping_what_to_do() {
        let message = format!("{}; set the Helm value agent.io.hostPath", "x".repeat(2000));
        let e = blocked("InvalidSpec", &message);
        assert!(e.note.len() <= MAX_NOTE);
        assert!(e.note.starts_with("xxx"), "{}", e.note);
        assert!(
            e.note.ends_with("set the Helm value agent.io.hostPath"),
            "{}",
            e.note
        );
    }

    #[test]
    fn requeue_follows_phase_deadline_and_awaited_results() {
        assert_eq!(requeue_after(Phase::Passed, &clock(10, 3600), true), None);
        assert_eq!(
            requeue_after(Phase::Running, &clock(10, 3600), false),
            Some(RUNNING_REQUEUE)
        );
        assert_eq!(
            requeue_after(Phase::Pending, &clock(3590, 3600), false),
            Some(Duration::from_secs(11)),
            "just after the deadline"
        );
        assert_eq!(
            requeue_after(Phase::Running, &clock(10, 3600), true),
            Some(RESULT_POLL)
        );
    }
}
