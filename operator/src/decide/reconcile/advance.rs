//! One node's line of a run: from its agent pod and its result (and whether the node still
//! exists and the run is past its deadline), the node's next verdict and what to do to its pod.

use std::time::Duration;

use gpuval_crds::{Evidence, NodeStatus, NodeVerdict, Verdict};

use super::clock::RunClock;
use super::truncate;
use super::view::{PodPhase, PodView, ResultView};

/// How long a pod may sit Succeeded before a missing result counts as an error (the result
/// watch can trail the pod watch).
pub const RESULT_GRACE: Duration = Duration::from_secs(30);

/// What the cluster shows of one node for this generation.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// The node's agent pod, if it exists.
    pub pod: Option<&'a PodView>,
    /// The node's result, if the agent stored one.
    pub result: Option<&'a ResultView>,
    /// The Node object still exists.
    pub node_exists: bool,
}

/// How much of a failed pod's reason a node line keeps (the rest of its message says what to
/// fix).
const MAX_POD_REASON: usize = 60;
/// Longest scheduling reason a pod stuck Pending keeps in its line (it is what to fix).
const MAX_PENDING_REASON: usize = 100;

/// What to do to a node's agent pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodChange {
    /// The node has no pod for this generation yet: create one.
    Create,
    /// The node ran out of time: delete its pod (by name).
    Delete(String),
}

/// A node's next line and what follows from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Advanced {
    pub line: NodeStatus,
    pub pod: Option<PodChange>,
    /// The agent finished and its result is awaited (look again soon).
    pub waiting_for_result: bool,
}

/// The verdict a node gets from its result's verdict (warnings and skips pass).
pub fn node_verdict_of(v: Verdict) -> NodeVerdict {
    match v {
        Verdict::Pass | Verdict::Warn | Verdict::Skipped => NodeVerdict::Passed,
        Verdict::Fail => NodeVerdict::Failed,
        Verdict::Error => NodeVerdict::Error,
    }
}

/// Advances a node whose verdict is not final yet. In order: a result decides; past the
/// deadline the node is out of time (and its pod goes); a deleted node is an error; otherwise
/// the pod's state decides (see [`from_pod`]).
pub fn advance_node(line: &NodeStatus, seen: Seen<'_>, clock: &RunClock) -> Advanced {
    let mut next = Advanced {
        line: line.clone(),
        pod: None,
        waiting_for_result: false,
    };
    let l = &mut next.line;
    if let Some(r) = seen.result {
        l.verdict = node_verdict_of(r.verdict);
        l.message = (!r.summary.is_empty()).then(|| truncate(&r.summary));
        l.result = Some(r.name.clone());
        (l.codes, l.action) = super::fleet::line_facts(&r.facts);
        l.evidence = Some(match r.verdict.passes() {
            true => Evidence::Hardware,
            false => Evidence::of_codes(&r.facts.codes),
        });
    } else if clock.past_deadline() {
        let (evidence, message) = out_of_time(seen.pod, clock);
        l.verdict = NodeVerdict::DeadlineExceeded;
        l.message = Some(truncate(&message));
        l.evidence = Some(evidence);
        next.pod = seen
            .pod
            .filter(|p| !p.deleting)
            .map(|p| PodChange::Delete(p.name.clone()));
    } else if !seen.node_exists {
        l.verdict = NodeVerdict::Error;
        l.message = Some(
            "the node was deleted before it reported: nothing to fix on the node; rerun the validation if it comes back".into(),
        );
        l.evidence = Some(Evidence::Infrastructure);
    } else {
        return from_pod(line, seen.pod, clock);
    }
    next
}

/// Advances a node (that exists, has no result and is within the deadline) from its pod: no pod
/// yet means create one, unless the agent was already running (then it vanished); a running
/// agent is Running; an agent that exited 0 gets [`RESULT_GRACE`] to show its result; a failed
/// or deleted pod is an error; a pending pod keeps the node Pending with the pod's reason.
pub fn from_pod(line: &NodeStatus, pod: Option<&PodView>, clock: &RunClock) -> Advanced {
    let mut next = Advanced {
        line: line.clone(),
        pod: None,
        waiting_for_result: false,
    };
    let l = &mut next.line;
    let error = |l: &mut NodeStatus, evidence: Evidence, why: String| {
        l.verdict = NodeVerdict::Error;
        l.message = Some(truncate(&why));
        l.evidence = Some(evidence);
    };
    let Some(p) = pod else {
        if line.verdict == NodeVerdict::Running {
            let why = "the agent pod disappeared before it reported (deleted, evicted or preempted): rerun the validation";
            error(l, Evidence::Infrastructure, why.into());
        } else {
            l.verdict = NodeVerdict::Pending;
            next.pod = Some(PodChange::Create);
        }
        return next;
    };
    if p.deleting {
        let why = "the agent pod was deleted before it reported (an eviction, a preemption, a drain or a person): rerun the validation";
        error(l, Evidence::Infrastructure, why.into());
        return next;
    }
    match p.phase {
        PodPhase::Running => {
            l.verdict = NodeVerdict::Running;
            l.message = None;
        }
        PodPhase::Succeeded => {
            let waited = p.finished_at.map_or(Duration::ZERO, |f| clock.since(f));
            if waited >= RESULT_GRACE {
                let why = "the agent exited without storing its result (API errors? see the agent pod's log): rerun the validation";
                error(l, Evidence::Infrastructure, why.into());
            } else {
                l.verdict = NodeVerdict::Running;
                next.waiting_for_result = true;
            }
        }
        PodPhase::Failed => {
            let why = p.reason.as_deref().unwrap_or("no reason given");
            let (evidence, fix) = pod_trouble(why);
            // The pod's own words shortened first, so that what to fix stays whole.
            let why = gpuval_crds::text::shorten(why, MAX_POD_REASON);
            error(l, evidence, format!("agent pod failed: {why}; {fix}"));
        }
        PodPhase::Pending | PodPhase::Unknown if clock.pending_too_long(p.created) => {
            let limit = clock
                .pending_limit
                .map(gpuval_crds::Duration::from_std)
                .map(|d| d.to_string())
                .unwrap_or_default();
            let head = format!("agent pod Pending past the limit ({limit}, --agent-pending-limit)");
            tracing::debug!(pod = %p.name, node = %p.node, limit = %limit, "agent pod Pending past the limit");
            let (evidence, why) = stuck_pending(p, &head);
            error(l, evidence, why);
        }
        PodPhase::Pending | PodPhase::Unknown => {
            l.verdict = NodeVerdict::Pending;
            l.message = p.reason.as_deref().map(truncate);
        }
    }
    next
}

/// A pod that stayed Pending (or Unknown) for as long as `head` says (`... the agent pod
/// stayed Pending`): a busy node where it waits for the node's GPUs, else infrastructure (or
/// the known trouble its reason names: an image that cannot be pulled, a container that cannot
/// be created), with the pod's scheduling reason (shortened first, so that what to fix stays
/// whole) and what to fix.
fn stuck_pending(p: &PodView, head: &str) -> (Evidence, String) {
    let Some(why) = p.reason.as_deref() else {
        return (
            Evidence::Infrastructure,
            format!("{head}: it never started (is the node Ready?); rerun"),
        );
    };
    let (evidence, fix) = if why.contains(gpuval_crds::GPU_RESOURCE) {
        (Evidence::Busy, "free the node's GPUs and rerun")
    } else {
        // A known trouble (an image that cannot be pulled, a container that cannot be
        // created) is its kind and says what to fix.
        match pod_trouble(why) {
            (Evidence::NoEvidence, _) => (
                Evidence::Infrastructure,
                "fix what the scheduler names and rerun",
            ),
            known => known,
        }
    };
    let why = gpuval_crds::text::shorten(&telling(why), MAX_PENDING_REASON);
    (evidence, format!("{head} ({why}); {fix}"))
}

/// The scheduler's reason without what says nothing about this node: the other nodes that do
/// not match the pod's node affinity (an agent pod is pinned to its node) and the preemption
/// clause (`0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1
/// node(s) had untolerated taint {dedicated: infer}. preemption: ...` → `0/3 nodes are
/// available: 1 node(s) had untolerated taint {dedicated: infer}.`).
fn telling(why: &str) -> String {
    let why = why.split(" preemption:").next().unwrap_or(why);
    let Some((head, list)) = why.split_once("are available: ") else {
        return why.to_string();
    };
    let kept: Vec<&str> = list
        .split(", ")
        .filter(|part| !part.contains("didn't match Pod's node affinity/selector"))
        .collect();
    if kept.is_empty() {
        return why.to_string();
    }
    format!("{head}are available: {}", kept.join(", "))
}

/// What kind of trouble a failed agent pod's reason (`Evicted: ...`, `ErrImagePull: ...`,
/// `OOMKilled (exit code 137)`) is, and what to fix. None of it is hardware evidence: the
/// agent wrote no report.
pub fn pod_trouble(reason: &str) -> (Evidence, &'static str) {
    let head = reason
        .split(|c: char| c == ':' || c.is_whitespace())
        .next()
        .unwrap_or_default();
    match head {
        "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull" => (
            Evidence::Infrastructure,
            "the agent image cannot be pulled: fix the registry or the agent image (--agent-image, Helm agent.image), then rerun",
        ),
        "CreateContainerConfigError" | "CreateContainerError" => (
            Evidence::Configuration,
            "the agent container cannot be created: fix what kubectl describe pod names and rerun",
        ),
        "OOMKilled" => (
            Evidence::Configuration,
            "the agent ran out of memory: raise its memory limit (Helm agent.resources) and rerun",
        ),
        "Evicted"
        | "Preempting"
        | "Preempted"
        | "Shutdown"
        | "NodeShutdown"
        | "Terminated"
        | "NodeLost"
        | "DeadlineExceeded"
        | "UnexpectedAdmissionError" => (
            Evidence::Infrastructure,
            "the agent pod was evicted, preempted or stopped with its node: rerun the validation when the node has room",
        ),
        _ => (
            Evidence::NoEvidence,
            "the agent ended without a report: read the agent pod's log and rerun",
        ),
    }
}

/// A node with no result at the deadline: infrastructure, or a busy node when its agent pod
/// could not get the node's GPUs; the message says what held it up and what to do.
fn out_of_time(pod: Option<&PodView>, clock: &RunClock) -> (Evidence, String) {
    let head = format!("no verdict within the deadline ({})", clock.deadline);
    let Some(p) = pod else {
        let fix = "the agent pod was never created: see the operator's log and rerun";
        return (Evidence::Infrastructure, format!("{head}: {fix}"));
    };
    match p.phase {
        PodPhase::Pending | PodPhase::Unknown => {
            stuck_pending(p, &format!("{head}: the agent pod stayed Pending"))
        }
        _ => (
            Evidence::Infrastructure,
            format!(
                "{head}: the agent did not report in time (API errors, or checks longer than spec.deadline); see its log and rerun"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn a_pod_pending_at_the_deadline_names_its_trouble_and_what_to_fix() {
        let pending = |why: &str| PodView {
            name: "p".into(),
            node: "n".into(),
            generation: 1,
            phase: PodPhase::Pending,
            reason: Some(why.into()),
            deleting: false,
            finished_at: None,
            ip: None,
            created: None,
            image_id: None,
        };
        let c = clock(3600);
        let (e, m) = out_of_time(Some(&pending("ImagePullBackOff: registry down")), &c);
        assert_eq!(e, Evidence::Infrastructure);
        assert!(m.contains("fix the registry or the agent image"), "{m}");
        let (e, m) = out_of_time(Some(&pending("CreateContainerConfigError: no secret")), &c);
        assert_eq!(e, Evidence::Configuration);
        assert!(m.contains("kubectl describe pod"), "{m}");
        let (e, m) = out_of_time(
            Some(&pending("0/3 nodes are available: 3 Insufficient cpu")),
            &c,
        );
        assert_eq!(e, Evidence::Infrastructure);
        assert!(m.ends_with("fix what the scheduler names and rerun"), "{m}");
    }

    #[test]
    fn the_schedulers_reason_keeps_what_concerns_the_node() {
        let why = "Unschedulable: 0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: infer}. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.";
        assert_eq!(
            telling(why),
            "Unschedulable: 0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: infer}."
        );
        assert_eq!(
            telling("ImagePullBackOff: registry down"),
            "ImagePullBackOff: registry down"
        );
    }

    /// A pod Pending past the operator's limit ends its line well before the deadline, as
    /// infrastructure naming the scheduler's reason and what to fix; before the limit, or
    /// without one, it waits.
    #[test]
    fn a_pod_pending_past_the_limit_ends_its_line_before_the_deadline() {
        let unschedulable = "Unschedulable: 0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: infer}";
        let stuck = PodView {
            reason: Some(unschedulable.into()),
            created: Some(at(10)),
            ..pod(PodPhase::Pending)
        };
        let limit = Some(Duration::from_secs(600));
        let waiting = from_pod(
            &line(NodeVerdict::Pending),
            Some(&stuck),
            &clock(609).with_pending_limit(limit),
        );
        assert_eq!(waiting.line.verdict, NodeVerdict::Pending);
        let no_limit = from_pod(&line(NodeVerdict::Pending), Some(&stuck), &clock(3000));
        assert_eq!(no_limit.line.verdict, NodeVerdict::Pending);
        let ended = from_pod(
            &line(NodeVerdict::Pending),
            Some(&stuck),
            &clock(610).with_pending_limit(limit),
        );
        let l = &ended.line;
        assert_eq!(l.verdict, NodeVerdict::Error);
        assert_eq!(l.evidence, Some(Evidence::Infrastructure));
        let m = l.message.as_deref().unwrap_or_default();
        assert!(m.contains("Pending past the limit (10m"), "{m}");
        assert!(m.contains("untolerated taint {dedicated: infer}"), "{m}");
        assert!(m.contains("fix what the scheduler names"), "{m}");
        let image = PodView {
            reason: Some("ImagePullBackOff: registry down".into()),
            ..stuck.clone()
        };
        let ended = from_pod(
            &line(NodeVerdict::Pending),
            Some(&image),
            &clock(610).with_pending_limit(limit),
        );
        assert_eq!(ended.line.evidence, Some(Evidence::Infrastructure));
        assert!(
            ended
                .line
                .message
                .unwrap_or_default()
                .contains("fix the registry")
        );
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + secs).unwrap()
    }

    /// A clock `secs` into a run with a one-hour deadline.
    fn clock(secs: i64) -> RunClock {
        RunClock::new(
            at(secs),
            Some(&Time(at(0))),
            gpuval_crds::Duration::from_secs(3600),
        )
    }

    fn line(verdict: NodeVerdict) -> NodeStatus {
        NodeStatus {
            name: "gpu-0".into(),
            verdict,
            gpus: 8,
            message: Some("earlier message".into()),
            result: None,
            codes: None,
            action: None,
            evidence: None,
        }
    }

    fn pod(phase: PodPhase) -> PodView {
        PodView {
            name: "pod-gpu-0".into(),
            node: "gpu-0".into(),
            generation: 1,
            phase,
            ..Default::default()
        }
    }

    /// One step of a node in `verdict` whose agent pod is `p`, 10 s into the run.
    fn with_pod(verdict: NodeVerdict, p: &PodView) -> Advanced {
        advance_node(&line(verdict), seen(Some(p)), &clock(10))
    }

    fn seen(pod: Option<&PodView>) -> Seen<'_> {
        Seen {
            pod,
            result: None,
            node_exists: true,
        }
    }

    #[test]
    fn verdicts_map_to_node_verdicts() {
        assert_eq!(node_verdict_of(Verdict::Pass), NodeVerdict::Passed);
        assert_eq!(node_verdict_of(Verdict::Warn), NodeVerdict::Passed);
        assert_eq!(node_verdict_of(Verdict::Skipped), NodeVerdict::Passed);
        assert_eq!(node_verdict_of(Verdict::Fail), NodeVerdict::Failed);
        assert_eq!(node_verdict_of(Verdict::Error), NodeVerdict::Error);
    }

    #[test]
    fn a_result_decides_even_past_the_deadline() {
        let r = ResultView {
            name: "v-gpu-0".into(),
            node: "gpu-0".into(),
            generation: 1,
            verdict: Verdict::Fail,
            summary: "GPU3 memory: 2 mismatched words".into(),
            fabric: Vec::new(),
            ports: None,
            facts: Default::default(),
        };
        let p = pod(PodPhase::Running);
        let s = Seen {
            result: Some(&r),
            ..seen(Some(&p))
        };
        let a = advance_node(&line(NodeVerdict::Running), s, &clock(4000));
        assert_eq!(a.line.verdict, NodeVerdict::Failed);
        assert_eq!(
            a.line.message.as_deref(),
            Some("GPU3 memory: 2 mismatched words")
        );
        assert_eq!(a.line.result.as_deref(), Some("v-gpu-0"));
        assert_eq!(a.line.evidence, Some(Evidence::Hardware));
        assert_eq!(a.pod, None);
    }

    #[test]
    fn past_the_deadline_the_node_is_out_of_time_and_its_pod_goes() {
        let p = pod(PodPhase::Running);
        let a = advance_node(&line(NodeVerdict::Running), seen(Some(&p)), &clock(3600));
        assert_eq!(a.line.verdict, NodeVerdict::DeadlineExceeded);
        assert_eq!(a.line.evidence, Some(Evidence::Infrastructure));
        let message = a.line.message.unwrap_or_default();
        assert!(
            message.starts_with("no verdict within the deadline (1h): the agent did not report"),
            "{message}"
        );
        assert_eq!(a.pod, Some(PodChange::Delete("pod-gpu-0".into())));

        let mut deleting = pod(PodPhase::Running);
        deleting.deleting = true;
        let a = advance_node(
            &line(NodeVerdict::Running),
            seen(Some(&deleting)),
            &clock(3600),
        );
        assert_eq!(a.pod, None, "a pod already being deleted is left alone");
    }

    #[test]
    fn a_deleted_node_is_an_error() {
        let s = Seen {
            node_exists: false,
            ..seen(None)
        };
        let a = advance_node(&line(NodeVerdict::Pending), s, &clock(10));
        assert_eq!(a.line.verdict, NodeVerdict::Error);
        assert_eq!(a.pod, None, "no pod for a node that is gone");
    }

    #[test]
    fn no_pod_means_create_one_unless_the_agent_was_running() {
        let a = advance_node(&line(NodeVerdict::Pending), seen(None), &clock(10));
        assert_eq!(a.line.verdict, NodeVerdict::Pending);
        assert_eq!(a.pod, Some(PodChange::Create));
        assert_eq!(a.line.message.as_deref(), Some("earlier message"));

        let a = advance_node(&line(NodeVerdict::Running), seen(None), &clock(10));
        assert_eq!(a.line.verdict, NodeVerdict::Error);
        assert_eq!(a.pod, None);
        assert!(a.line.message.unwrap().contains("disappeared"));
    }

    #[test]
    fn pod_phases_move_the_node() {
        use NodeVerdict::{Error, Pending, Running};
        let unschedulable = "Unschedulable: 0/3 nodes are available";
        let oom = "OOMKilled (exit code 137)";
        let with_reason = |phase, reason: &str| PodView {
            reason: Some(reason.into()),
            ..pod(phase)
        };
        for (i, (from, p, verdict, message)) in [
            (Pending, pod(PodPhase::Running), Running, None),
            (
                Pending,
                with_reason(PodPhase::Pending, unschedulable),
                Pending,
                Some(unschedulable),
            ),
            (Running, pod(PodPhase::Unknown), Pending, None),
            (
                Running,
                with_reason(PodPhase::Failed, oom),
                Error,
                Some(
                    "agent pod failed: OOMKilled (exit code 137); the agent ran out of memory: raise its memory limit (Helm agent.resources) and rerun",
                ),
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let a = with_pod(from, &p);
            assert_eq!(
                (a.line.verdict, a.line.message.as_deref()),
                (verdict, message),
                "case {i}"
            );
        }

        let mut p = pod(PodPhase::Running);
        p.deleting = true;
        let a = with_pod(NodeVerdict::Running, &p);
        assert_eq!(a.line.verdict, NodeVerdict::Error);
        assert_eq!(a.line.evidence, Some(Evidence::Infrastructure));
        assert!(a.line.message.unwrap().contains("was deleted"));
    }

    #[test]
    fn a_failed_agent_pod_is_never_hardware_evidence_and_says_what_to_fix() {
        for (reason, evidence, fix) in [
            (
                "ErrImagePull: registry down",
                Evidence::Infrastructure,
                "cannot be pulled",
            ),
            (
                "ImagePullBackOff: Back-off pulling image",
                Evidence::Infrastructure,
                "--agent-image",
            ),
            (
                "Evicted: The node was low on resource: memory",
                Evidence::Infrastructure,
                "evicted",
            ),
            (
                "Preempted: by a higher priority pod",
                Evidence::Infrastructure,
                "preempted",
            ),
            (
                "CreateContainerConfigError: secret missing",
                Evidence::Configuration,
                "cannot be created",
            ),
            (
                "OOMKilled (exit code 137)",
                Evidence::Configuration,
                "memory limit",
            ),
            ("Error (exit code 3)", Evidence::NoEvidence, "log"),
        ] {
            let p = PodView {
                reason: Some(reason.into()),
                ..pod(PodPhase::Failed)
            };
            let a = with_pod(NodeVerdict::Running, &p);
            assert_eq!(a.line.verdict, NodeVerdict::Error, "{reason}");
            assert_eq!(a.line.evidence, Some(evidence), "{reason}");
            let message = a.line.message.unwrap_or_default();
            assert!(message.contains(fix), "{reason}: {message}");
            // A long reason is shortened, never what to fix.
            let p = PodView {
                reason: Some(format!("{reason} {}", "x".repeat(300))),
                ..pod(PodPhase::Failed)
            };
            let long = with_pod(NodeVerdict::Running, &p)
                .line
                .message
                .unwrap_or_default();
            assert!(
                long.contains(fix) && long.len() <= crate::decide::reconcile::MAX_MESSAGE,
                "{long}"
            );
        }
    }

    #[test]
    fn out_of_time_names_what_held_the_agent_up() {
        let busy = PodView {
            reason: Some("Unschedulable: 0/3 nodes: 3 Insufficient nvidia.com/gpu".into()),
            ..pod(PodPhase::Pending)
        };
        let a = advance_node(&line(NodeVerdict::Pending), seen(Some(&busy)), &clock(3600));
        assert_eq!(a.line.verdict, NodeVerdict::DeadlineExceeded);
        assert_eq!(a.line.evidence, Some(Evidence::Busy));
        assert!(
            a.line
                .message
                .unwrap_or_default()
                .contains("free the node's GPUs")
        );
        let stuck = PodView {
            reason: Some("Unschedulable: 0/3 nodes: node(s) had untolerated taint".into()),
            ..pod(PodPhase::Pending)
        };
        let a = advance_node(
            &line(NodeVerdict::Pending),
            seen(Some(&stuck)),
            &clock(3600),
        );
        assert_eq!(a.line.evidence, Some(Evidence::Infrastructure));
        assert!(
            a.line
                .message
                .unwrap_or_default()
                .contains("untolerated taint")
        );
        let gone = Seen {
            node_exists: false,
            ..seen(None)
        };
        let a = advance_node(&line(NodeVerdict::Pending), gone, &clock(10));
        assert_eq!(a.line.evidence, Some(Evidence::Infrastructure));
    }

    #[test]
    fn a_finished_agent_gets_a_grace_period_for_its_result() {
        let mut p = pod(PodPhase::Succeeded);
        p.finished_at = Some(at(100));
        let a = advance_node(&line(NodeVerdict::Running), seen(Some(&p)), &clock(129));
        assert_eq!(a.line.verdict, NodeVerdict::Running);
        assert!(a.waiting_for_result);
        let a = advance_node(&line(NodeVerdict::Running), seen(Some(&p)), &clock(130));
        assert_eq!(a.line.verdict, NodeVerdict::Error);
        assert!(!a.waiting_for_result);
        assert!(
            a.line
                .message
                .unwrap_or_default()
                .starts_with("the agent exited without storing its result")
        );
        assert_eq!(a.line.evidence, Some(Evidence::Infrastructure));
    }
}
