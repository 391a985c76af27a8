//! A node's state, decided (pure): which final lines are about the Node object as it is now
//! ([`lines_of`], [`Incarnation`]), the newest verdict among them ([`newest`]), and the labels
//! and `GpuValidated` condition it asks for ([`desired`]), with what its record adds: repeat
//! offences, no evidence for too long, a GPU held by no pod, a run under way, the admission
//! gate. [`crate::controllers::node_state`] is the controller that reads, asks this and writes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuval_crds::Action as Remedy;
use gpuval_crds::result_meta::ReportMeta;
use gpuval_crds::{FinalLine, GpuNodeResult, GpuValidation, ResultSeen, Trust, Verdict, labels};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{PartialObjectMeta, ResourceExt};

use crate::decide::failure_record::Record;
use crate::decide::node_evidence::Evidence;
use crate::decide::node_marks::Offences;

/// The Node condition type.
pub const CONDITION: &str = labels::NODE_CONDITION;
/// How long a node's condition message may be.
const MAX_MESSAGE: usize = 300;

/// A node result's metadata, as [`lines_of`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultMeta {
    /// The result object's name.
    pub name: String,
    pub node: String,
    pub validation: String,
    /// The validation generation it was written for.
    pub generation: i64,
    /// Its verdict label (an unknown spelling reads as Error).
    pub verdict: Verdict,
    pub summary: String,
    /// When the operator checked its report (else when it was created).
    pub created: Timestamp,
    /// Its `gpuval.io/action` label (None when absent or unknown).
    pub action: Remedy,
    /// Its `gpuval.io/codes` annotation.
    pub codes: String,
    /// It carries `gpuval.io/simulated=true`: written by the simulated backend.
    pub simulated: bool,
    /// It carries a report the operator checked ([`gpuval_crds::binding::report_checked`]).
    pub reported: bool,
    /// The UID of the Node its agent ran on (`gpuval.io/node-uid`), when the result says.
    pub node_uid: Option<String>,
}

impl ResultMeta {
    /// Whether its verdict label passes, as [`Verdict::passes`] says; an unreadable label is no
    /// pass.
    pub fn passed(&self) -> bool {
        self.verdict.passes()
    }

    /// The result as the final-line reader takes it.
    pub fn seen(&self) -> ResultSeen {
        ResultSeen {
            name: self.name.clone(),
            generation: self.generation,
            verdict: Some(self.verdict),
            reported: self.reported,
            simulated: self.simulated,
            summary: self.summary.clone(),
            codes: self.codes.clone(),
            action: self.action,
            created: Some(self.created),
        }
    }
}

/// What counts as evidence about a real node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Policy {
    /// The operator gives every agent a simulated backend (`GPUVAL_SIMULATE` or
    /// `GPUVAL_BACKEND=simulated` in its agent environment): nothing is evidence.
    pub agents_simulated: bool,
    /// Test-only: simulated results count as evidence
    /// ([`crate::settings::config::OperatorConfig::simulated_acts_on_nodes`]).
    pub trust_simulated: bool,
}

impl Policy {
    /// The policy of an operator configured with `cfg`.
    pub fn of(cfg: &crate::settings::config::OperatorConfig) -> Self {
        Self {
            agents_simulated: cfg.agents_simulated(),
            trust_simulated: cfg.simulated_acts_on_nodes,
        }
    }

    /// True when a result (simulated or not) may act on its node.
    pub fn counts(&self, simulated: bool) -> bool {
        self.trust_simulated || !(simulated || self.agents_simulated)
    }

    /// The reader's trust under this policy.
    pub fn trust(&self) -> Trust {
        Trust {
            trust_simulated: self.trust_simulated,
        }
    }

    /// Node `node`'s final line in validation `run`, whose node result (if any) is `result`;
    /// None where this policy counts nothing (every agent simulated) or the run has no final
    /// line for the node yet.
    pub fn final_line(
        &self,
        run: &GpuValidation,
        node: &str,
        result: Option<&ResultMeta>,
    ) -> Option<FinalLine> {
        if !self.counts(false) {
            return None;
        }
        let seen = result.map(ResultMeta::seen);
        gpuval_crds::final_line(run, node, seen.as_ref(), self.trust())
    }
}

/// The metadata of a node result, when it has the labels the agent sets (its report read through
/// [`ReportMeta`], the one reader of what the agent writes there).
pub fn result_meta(r: &PartialObjectMeta<GpuNodeResult>) -> Option<ResultMeta> {
    let l = r.metadata.labels.as_ref()?;
    let ann = r.metadata.annotations.as_ref();
    let ReportMeta {
        verdict,
        action,
        simulated,
        summary,
        codes,
        // The fleet's versions are the validation's concern, not a node's state.
        versions: _,
    } = ReportMeta::read(Some(l), ann)?;
    Some(ResultMeta {
        name: r.metadata.name.clone().unwrap_or_default(),
        node: ann
            .and_then(|a| a.get(labels::NODE))
            .or_else(|| l.get(labels::NODE))?
            .clone(),
        validation: l.get(labels::VALIDATION)?.clone(),
        generation: l.get(labels::GENERATION)?.parse().ok()?,
        verdict,
        summary,
        // When its report was checked: the operator creates a result with the agent pod, and
        // nothing its writer sets about itself dates it.
        created: gpuval_crds::binding::report_checked(&r.metadata)
            .or_else(|| r.metadata.creation_timestamp.as_ref().map(|t| t.0))?,
        action,
        codes,
        simulated,
        reported: gpuval_crds::binding::report_checked(&r.metadata).is_some(),
        node_uid: ann.and_then(|a| a.get(labels::NODE_UID)).cloned(),
    })
}

/// True when result `r` was written by the agent pod the operator makes for `validation` on
/// `node` (its `gpuval.io/pod` annotation is that pod's name for the result's generation): only
/// a validation that selected the node has such a pod, and the admission policy binds the
/// annotation to the writer's token, so another run's agent cannot speak for this one.
pub fn written_by_its_agent(
    r: &PartialObjectMeta<GpuNodeResult>,
    validation: &str,
    node: &str,
) -> bool {
    let generation = r
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::GENERATION))
        .and_then(|g| g.parse::<i64>().ok());
    let ann = r.metadata.annotations.as_ref();
    let pod = ann.and_then(|a| a.get(labels::POD));
    // The node is the writer's own (the admission policy checks it against the token), and
    // with the node fixed the pod name determines the validation.
    let about = ann.and_then(|a| a.get(labels::NODE));
    match (generation, pod, about) {
        (Some(g), Some(pod), Some(about)) => {
            about == node && *pod == crate::decide::pod::pod_name(validation, node, g)
        }
        _ => false,
    }
}

/// The newest verdict about `node` from the final lines of `runs` (each validation with the
/// node's result of it, if any; see [`Policy::final_line`]): the newest hardware verdict (a
/// pass, or a failure on hardware evidence; on a tie a failure wins), else the newest line of
/// any other kind (busy, infrastructure, configuration, no evidence), which says what to fix
/// but never stands over a hardware verdict. (The controller judges with [`lines_of`] and
/// [`newest`] against the node's record; this is their composition, for tests.)
#[cfg(test)]
pub(crate) fn latest(
    node: &str,
    runs: &[(&GpuValidation, Option<&ResultMeta>)],
    policy: Policy,
) -> Option<Evidence> {
    newest(&lines_of(node, runs, policy, &Incarnation::default()))
}

/// The Node object a verdict must be about: a node deleted and created again under its name is
/// another node, which inherits no verdict of the one before.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Incarnation {
    /// The Node's UID.
    pub uid: Option<String>,
    /// When the Node object was created.
    pub created: Option<Timestamp>,
}

impl Incarnation {
    /// The incarnation of `node` as the API server has it now.
    pub fn of(node: &Node) -> Self {
        Self {
            uid: node.metadata.uid.clone(),
            created: node.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// True when a line reached at `at` from a result on the node of UID `result_node` (None:
    /// the result does not say, or there is no result) is about this node: the UIDs agree
    /// where both are known, otherwise the line is no older than the Node object.
    pub fn owns(&self, at: Timestamp, result_node: Option<&str>) -> bool {
        match (self.uid.as_deref(), result_node) {
            (Some(ours), Some(theirs)) => ours == theirs,
            _ => self.created.is_none_or(|born| at >= born),
        }
    }
}

/// The final line of each of `runs` for `node` that is about its present incarnation (see
/// [`Incarnation`]), as evidence, with the run's `spec.onFailure` action.
pub fn lines_of(
    node: &str,
    runs: &[(&GpuValidation, Option<&ResultMeta>)],
    policy: Policy,
    incarnation: &Incarnation,
) -> Vec<Evidence> {
    runs.iter()
        .filter_map(|(run, result)| {
            let line = policy.final_line(run, node, *result)?;
            let mut e = Evidence::of_line(&line)?;
            let result_node = result
                .filter(|r| line.result.as_deref() == Some(r.name.as_str()))
                .and_then(|r| r.node_uid.as_deref());
            if !incarnation.owns(e.at, result_node) {
                return None;
            }
            e.run_created = run.metadata.creation_timestamp.as_ref().map(|t| t.0);
            e.uid = run.metadata.uid.clone();
            // The generation the line is of: its result's where it rests on one (a new
            // generation's status may still show the last one's result), else the one the
            // status describes (the spec may have been edited since).
            let rests_on = result.filter(|r| line.result.as_deref() == Some(r.name.as_str()));
            e.generation = rests_on.map(|r| r.generation).unwrap_or_else(|| {
                run.status
                    .as_ref()
                    .and_then(|st| st.observed_generation)
                    .or(run.metadata.generation)
                    .unwrap_or(0)
            });
            e.on_failure = run
                .spec
                .on_failure
                .as_ref()
                .map(|o| o.action)
                .unwrap_or_default();
            Some(e)
        })
        .collect()
}

/// The newest of `lines`: the newest hardware verdict (a pass, or a failure on hardware
/// evidence; within the same second the later run's, and on a full tie a failure), else the
/// newest line of any other kind.
pub fn newest(lines: &[Evidence]) -> Option<Evidence> {
    let newest = |hardware: bool| {
        lines
            .iter()
            .filter(|e| e.is_hardware() == hardware)
            .max_by_key(|e| (e.at, e.run_created, !e.passed))
            .cloned()
    };
    newest(true).or_else(|| newest(false))
}

/// True when node `node`'s failure in `run` (whose status says it just failed) may act on it
/// (`spec.onFailure`, admission's failure taint): only a failure on hardware evidence, as the
/// node's final line says ([`gpuval_crds::final_line`]). For tests: the reconciles act on
/// the node's record.
#[cfg(test)]
pub(crate) fn may_act_on(
    run: &GpuValidation,
    node: &str,
    result: Option<&ResultMeta>,
    policy: Policy,
) -> bool {
    policy
        .final_line(run, node, result)
        .is_some_and(|l| l.failed_on_hardware())
}

/// The labels and condition a node should carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub labels: BTreeMap<String, String>,
    pub condition: Option<NodeCondition>,
    /// The `GpuAdmitted` condition ([`with_admission`]).
    pub admitted: Option<NodeCondition>,
}

/// The [`Mark`] for `evidence`, keeping the current condition's transition time while its
/// status does not change; None where the node is to be left as it is (no evidence: a node
/// keeps what it carries between runs, through a run's deletion, pruning or re-run). Only
/// hardware evidence sets labels and `GpuValidated` True or False; any other kind leaves a
/// node that has a `GpuValidated` condition as it is, and gives one that has none
/// `GpuValidated=Unknown` with the reason and what to fix (no labels).
pub fn desired(evidence: Option<&Evidence>, current: Option<&NodeCondition>) -> Option<Mark> {
    let e = evidence?;
    if !e.is_hardware() {
        return current.is_none().then(|| unknown(e));
    }
    let status = if e.passed { "True" } else { "False" };
    let transition = current
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(e.at));
    let message = if e.passed {
        format!("passed GpuValidation {}", e.validation)
    } else {
        format!("GpuValidation {}: {}", e.validation, e.message)
    };
    let message = condition_message(e, message);
    let mut node_labels = BTreeMap::from([
        (
            labels::NODE_VERDICT.to_string(),
            if e.passed { "Pass" } else { "Fail" }.to_string(),
        ),
        (
            labels::VALIDATED_AT.to_string(),
            e.at.as_second().to_string(),
        ),
        (
            labels::VERDICT_RUN.to_string(),
            labels::node_value(&e.validation),
        ),
    ]);
    if e.action != Remedy::None {
        node_labels.insert(labels::ACTION.to_string(), e.action.as_str().to_string());
    }
    Some(Mark {
        labels: node_labels,
        admitted: None,
        condition: Some(NodeCondition {
            type_: CONDITION.into(),
            status: status.into(),
            reason: Some(e.reason.clone()),
            message: Some(message),
            last_transition_time: Some(transition),
            last_heartbeat_time: Some(Time(e.at)),
        }),
    })
}

/// `mark` for a node whose repeated failures are `offences` (None: none): the label
/// `gpuval.io/repeat-offender=true`, and the condition's message led by the runs and GPUs
/// (hardware verdicts only: a node left as it is stays so).
pub fn with_offences(mut mark: Mark, offences: Option<&Offences>) -> Mark {
    let Some(o) = offences.filter(|o| o.repeated()) else {
        return mark;
    };
    let Some(c) = mark.condition.as_mut().filter(|c| c.status != "Unknown") else {
        return mark;
    };
    mark.labels
        .insert(labels::REPEAT_OFFENDER.to_string(), "true".to_string());
    let message = c.message.take().unwrap_or_default();
    // The codes and action stay first (see condition_message).
    let (tags, rest) = match message.strip_prefix('[').and_then(|m| m.split_once("] ")) {
        Some((tags, rest)) => (format!("[{tags}] "), rest.to_string()),
        None => (String::new(), message),
    };
    c.message = Some(gpuval_crds::text::shorten(
        &format!("{tags}{}; {rest}", o.words()),
        MAX_MESSAGE,
    ));
    mark
}

/// The reason of a `GpuValidated=Unknown` set by [`with_quiet`].
pub const NO_RECENT_EVIDENCE: &str = "NoRecentEvidence";

/// `mark` for a node whose record counts `record.quiet` lines in a row without hardware
/// evidence: from `after` such lines on (0: never), a `True` condition turns `Unknown` (reason
/// [`NO_RECENT_EVIDENCE`]) naming the last line's kind and what it said, and when and by which
/// run the last hardware evidence was reached. A standing failure stays `False`; the labels
/// stay. `current` is the node's condition (an `Unknown` keeps its transition time).
pub fn with_quiet(
    mark: Mark,
    record: &Record,
    after: u32,
    current: Option<&NodeCondition>,
) -> Mark {
    let mut mark = with_stuck(mark, record);
    let Some(q) = record
        .quiet
        .as_ref()
        .filter(|q| after > 0 && q.lines >= after)
    else {
        return mark;
    };
    let Some(c) = mark.condition.as_mut().filter(|c| {
        c.status == "True"
            || (c.status == "Unknown" && c.reason.as_deref() == Some(NO_RECENT_EVIDENCE))
    }) else {
        return mark;
    };
    let at = q.at.parse::<Timestamp>().ok().map(Time);
    let last = match &record.judged {
        Some(j) => format!("last hardware evidence {} (GpuValidation {})", j.at, j.run),
        None => "no hardware evidence recorded".to_string(),
    };
    let message = format!(
        "[{}] {} runs in a row without hardware evidence; {last}; the last, GpuValidation {}: {}",
        q.category, q.lines, q.run, q.message
    );
    c.status = "Unknown".into();
    c.reason = Some(NO_RECENT_EVIDENCE.into());
    c.message = Some(gpuval_crds::text::shorten(&message, MAX_MESSAGE));
    c.last_transition_time = current
        .filter(|c| c.status == "Unknown")
        .and_then(|c| c.last_transition_time.clone())
        .or_else(|| at.clone());
    c.last_heartbeat_time = at;
    mark
}

/// What a stuck GPU's finding leads the condition's message with, and where its words end.
const STUCK_TAG: &str = "[GpuHeldByNoPod; action ResetGpu]";
const STUCK_END: &str = ": reset it; ";

/// Runs in a row that find a GPU busy with memory or load no pod holds from which that is a
/// finding of its own.
pub const STUCK_AFTER: u32 = 2;

/// `mark` for a node whose newest [`STUCK_AFTER`] lines or more in a row found a GPU busy
/// with memory or load that no pod holds (`GpuHeldByNoPod`, where the PodResources API is
/// mounted): a GPU stuck after a fault looks so. Its own finding: the node's action is
/// `ResetGpu` and the condition's message leads with it; the condition's status stays (it is
/// no hardware verdict). A node without a condition is left as it is.
pub fn with_stuck(mut mark: Mark, record: &Record) -> Mark {
    let Some(q) = record.quiet.as_ref().filter(|q| q.unheld >= STUCK_AFTER) else {
        return mark;
    };
    let Some(c) = mark.condition.as_mut() else {
        return mark;
    };
    mark.labels.insert(
        labels::ACTION.to_string(),
        Remedy::ResetGpu.as_str().to_string(),
    );
    // Told once: a message that already leads with it (a node kept as it is) keeps its rest.
    let had = c.message.as_deref().unwrap_or_default();
    let rest = had
        .strip_prefix(STUCK_TAG)
        .and_then(|m| m.split_once(STUCK_END))
        .map_or(had, |(_, rest)| rest);
    let message = format!(
        "{STUCK_TAG} a GPU busy with memory or load that no pod holds in {} runs in a row (the last GpuValidation {}){STUCK_END}{rest}",
        q.unheld, q.run,
    );
    c.message = Some(gpuval_crds::text::shorten(&message, MAX_MESSAGE));
    mark
}

/// `GpuValidated=Unknown` for a node without a verdict whose latest line is no hardware
/// evidence: its reason is the kind of evidence (`Infrastructure`, ...), its message the
/// line's, which says what to fix. No labels.
fn unknown(e: &Evidence) -> Mark {
    let message = format!(
        "no verdict about the node from GpuValidation {} ({}): {}",
        e.validation, e.category, e.message
    );
    Mark {
        labels: BTreeMap::new(),
        admitted: None,
        condition: Some(NodeCondition {
            type_: CONDITION.into(),
            status: "Unknown".into(),
            reason: Some(e.category.as_str().into()),
            message: Some(condition_message(e, message)),
            last_transition_time: Some(Time(e.at)),
            last_heartbeat_time: Some(Time(e.at)),
        }),
    }
}

/// `message` with the evidence's codes and action in front (the message is cut at 300
/// characters, so they go first).
fn condition_message(e: &Evidence, message: String) -> String {
    let tags: Vec<String> = [
        (!e.codes.is_empty()).then(|| e.codes.clone()),
        (e.action != Remedy::None).then(|| format!("action {}", e.action)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let message = match tags.is_empty() {
        true => message,
        false => format!("[{}] {message}", tags.join("; ")),
    };
    gpuval_crds::text::shorten(&message, MAX_MESSAGE)
}

/// What `node` carries now of what [`desired`] sets.
pub fn current(node: &Node) -> Mark {
    let ours = OUR_LABELS;
    Mark {
        labels: node
            .labels()
            .iter()
            .filter(|(k, _)| ours.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        condition: condition_of(node).cloned(),
        admitted: admitted_of(node).cloned(),
    }
}

/// A hash of what the node carries of this controller's marks (its predicate: other changes
/// to a node do not wake it).
pub fn marked(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{:?}", current(node)).hash(&mut h);
    h.finish()
}

/// The node's `GpuAdmitted` condition.
pub fn admitted_of(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == labels::ADMITTED_CONDITION)
}

/// The reason of a `GpuAdmitted=Unknown` on a node that only runs whose authors may not admit
/// nodes passed.
pub const NOT_ADMITTED: &str = "NotAdmitted";

/// `mark` with what admits a node, from `record.admission` (the last hardware verdict of a run
/// whose author may admit nodes): the label `gpuval.io/admission` (`Pass`, `Fail`; none before
/// such a verdict) and the `GpuAdmitted` condition, which follows `GpuValidated` except that
/// it is `True` only where such a run passed the node (else `Unknown`, reason
/// [`NOT_ADMITTED`]): another author's pass never admits a node. A node without `GpuValidated`
/// gets none. `current` is the node's `GpuAdmitted` (its transition time stays while its
/// status does).
pub fn with_admission(mut mark: Mark, record: &Record, current: Option<&NodeCondition>) -> Mark {
    mark.labels.remove(labels::ADMISSION);
    if let Some(a) = &record.admission {
        let verdict = if a.passed { "Pass" } else { "Fail" };
        mark.labels
            .insert(labels::ADMISSION.to_string(), verdict.to_string());
    }
    let admitted = record.admission.as_ref().filter(|a| a.passed);
    mark.admitted = mark.condition.as_ref().map(|c| {
        let mut a = c.clone();
        a.type_ = labels::ADMITTED_CONDITION.into();
        match (c.status.as_str(), admitted) {
            ("True", Some(by)) => {
                a.reason = Some("Admitted".into());
                a.message = Some(format!(
                    "admitted: passed GpuValidation {} (a schedule's run, whose author may admit nodes) at {}",
                    by.run, by.at
                ));
            }
            ("True", None) => {
                a.status = "Unknown".into();
                a.reason = Some(NOT_ADMITTED.into());
                a.message = Some(gpuval_crds::text::shorten(
                    &format!(
                        "{}; not admitted: no run whose author may admit nodes (a schedule's, such as an admission run) has passed it",
                        c.message.as_deref().unwrap_or_default()
                    ),
                    MAX_MESSAGE,
                ));
            }
            _ => {}
        }
        a.last_transition_time = current
            .filter(|x| x.status == a.status)
            .and_then(|x| x.last_transition_time.clone())
            .or_else(|| c.last_heartbeat_time.clone())
            .or_else(|| c.last_transition_time.clone());
        a
    });
    mark
}

/// The node's `GpuValidated` condition.
pub fn condition_of(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)
}

/// Whether the API server refused [`write`] because the node it read is gone (404; 409 for an
/// apply that would have created it, its UID matching nothing) or was replaced by a node of
/// another UID (422 on `metadata.uid`).
pub fn gone_or_replaced(s: &kube::core::Status) -> bool {
    let on_uid = s
        .details
        .as_ref()
        .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"));
    s.code == 404 || s.code == 409 || (s.code == 422 && on_uid)
}

/// The two apply bodies [`write`] sends for `mark` on `node` (labels; the condition), each
/// bound to the node's UID.
pub fn apply_bodies(node: &Node, mark: &Mark) -> (serde_json::Value, serde_json::Value) {
    let identity = serde_json::json!({"name": node.name_any(), "uid": node.metadata.uid});
    let mut meta = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": identity.clone(),
    });
    meta["metadata"]["labels"] = serde_json::json!(mark.labels);
    let status = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": identity,
        "status": {"conditions": mark.condition.iter().chain(&mark.admitted).collect::<Vec<_>>()},
    });
    (meta, status)
}

/// The node conditions this controller writes (and reads back to compare): the Node cache
/// keeps them ([`crate::caches::stores::trim_node`]).
pub const OUR_CONDITIONS: [&str; 2] = [CONDITION, labels::ADMITTED_CONDITION];

/// The node labels this controller writes (and reads back to compare).
pub(crate) const OUR_LABELS: [&str; 6] = [
    labels::NODE_VERDICT,
    labels::ADMISSION,
    labels::VALIDATED_AT,
    labels::ACTION,
    labels::VERDICT_RUN,
    labels::REPEAT_OFFENDER,
];

/// The line of `lines` that `record` stands on: its newest standing failure, else the verdict
/// it was judged on; None when that line is gone (its run deleted or pruned, or running again).
/// A line is the one recorded when its run, outcome and time agree, or its run's UID and
/// generation (a reading may date the same verdict otherwise).
pub fn basis(record: &Record, lines: &[Evidence]) -> Option<Evidence> {
    let find = |run: &str, at: &str, passed: bool, id: (Option<&str>, Option<i64>)| {
        let same = |e: &Evidence| e.at.to_string() == at || e.is_of(id.0, id.1);
        lines
            .iter()
            .filter(|e| e.is_hardware() && e.passed == passed)
            .find(|e| e.validation == run && same(e))
            .cloned()
    };
    match record.failures.last() {
        Some(f) => find(
            &f.run,
            &f.at,
            false,
            (Some(f.validation_uid.as_str()), f.generation),
        ),
        None => record
            .judged
            .as_ref()
            .and_then(|j| find(&j.run, &j.at, j.passed, (j.uid.as_deref(), j.generation))),
    }
}

/// The nodes a finished run may have failed: its listed lines that ended and did not pass, and,
/// where the list is full (it holds at most [`gpuval_crds::MAX_LISTED_NODES`] lines, so more
/// failures may stand unlisted), every node with a result of the run (`with_results`, asked
/// only then), whose line then rests on that result.
pub fn maybe_failed(
    status: &gpuval_crds::GpuValidationStatus,
    with_results: impl FnOnce() -> Vec<String>,
) -> BTreeSet<String> {
    let listed = status
        .nodes
        .iter()
        .filter(|l| l.verdict.is_final() && l.verdict != gpuval_crds::NodeVerdict::Passed)
        .map(|l| l.name.clone());
    let mut names: BTreeSet<String> = listed.collect();
    if status.nodes.len() >= gpuval_crds::MAX_LISTED_NODES {
        names.extend(with_results());
    }
    names
}

/// The verdict record node `node` carries (an unreadable one counts as empty, logged).
pub fn record_of(node: &Node) -> Record {
    let annotation = node
        .annotations()
        .get(crate::decide::failure_record::ANNOTATION)
        .map(String::as_str);
    Record::parse(annotation).unwrap_or_else(|e| {
        tracing::warn!(node = %node.name_any(), error = %e, "ignoring an unreadable verdict record");
        Record::default()
    })
}

/// When the hardware verdict a node carries was reached: its `GpuValidated` condition's
/// heartbeat, when True or False.
pub fn carried(condition: Option<&NodeCondition>) -> Option<Timestamp> {
    condition
        .filter(|c| c.status == "True" || c.status == "False")
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| t.0)
}

/// True when run `gv` is owned by a schedule (its controller): the chart's `…-admit` policy
/// lets only whom the administrator grants `admit` write such a run.
pub fn by_schedule(gv: &GpuValidation) -> bool {
    gv.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "GpuValidationSchedule" && o.controller == Some(true))
}

/// The runs of `runs` under way on `node`: their status lists it without a final verdict.
pub fn runs_under_way(runs: &[(&GpuValidation, Option<&ResultMeta>)], node: &str) -> Vec<String> {
    runs.iter()
        .filter(|(r, _)| {
            r.status
                .iter()
                .flat_map(|s| s.nodes.iter())
                .any(|l| l.name == node && !l.verdict.is_final())
        })
        .map(|(r, _)| r.name_any())
        .collect()
}

/// What a condition's message says of the runs under way.
const UNDER_WAY: &str = " (a run is under way: GpuValidation ";

/// `mark` whose True or False condition says which of `runs` are under way (none: it says
/// nothing of them). Its status and transition time stay as they are.
pub fn with_runs_under_way(mut mark: Mark, runs: &[String]) -> Mark {
    let Some(c) = mark.condition.as_mut().filter(|c| c.status != "Unknown") else {
        return mark;
    };
    let message = c.message.take().unwrap_or_default();
    let base = message
        .split_once(UNDER_WAY)
        .map_or(message.as_str(), |(b, _)| b)
        .to_string();
    c.message = Some(match runs.is_empty() {
        true => base,
        false => gpuval_crds::text::shorten(
            &format!("{base}{UNDER_WAY}{})", runs.join(", ")),
            MAX_MESSAGE,
        ),
    });
    mark
}

/// The longest wait between two tries of one node's writes.
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// The wait before the `attempt`-th try again of node `name` (see [`Retries`]).
pub fn retry_delay(name: &str, attempt: u32) -> Duration {
    let base =
        Duration::from_millis(500).saturating_mul(1u32 << attempt.clamp(1, 20).saturating_sub(1));
    let base = base.min(MAX_RETRY);
    let seed = gpuval_crds::result::fnv1a(format!("{name}/{attempt}").as_bytes());
    let jitter = base.mul_f64((seed % 1000) as f64 / 5000.0);
    (base + jitter).min(MAX_RETRY + MAX_RETRY / 5)
}

/// What a node's reconcile has seen and judged, from which its labels and condition follow.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// The hardware news the node now shows (judged against its record), if any.
    pub shown: Option<&'a Evidence>,
    /// The node's verdict record, as this reconcile left it.
    pub record: &'a Record,
    /// The node's final lines, one a validation ([`lines_of`]).
    pub lines: &'a [Evidence],
    /// Its failures counted within the repeat-offender window.
    pub offences: Option<&'a Offences>,
    /// How many final lines without hardware evidence in a row make its condition Unknown.
    pub quiet_after: u32,
    /// The runs under way on it ([`runs_under_way`]).
    pub under_way: &'a [String],
}

/// The labels and condition `node` should carry after what its reconcile `seen`, or None when
/// it carries them already. Without news the node shows what its record stands on while that
/// line is still there (a label someone changed is put back), else it keeps what it carries;
/// a node with no condition carries no verdict, and labels of ours there are strays (a node
/// created again under its name).
pub fn mark_for(node: &Node, seen: &Seen<'_>) -> Option<Mark> {
    let current_condition = condition_of(node);
    let other = newest(
        &seen
            .lines
            .iter()
            .filter(|e| !e.is_hardware())
            .cloned()
            .collect::<Vec<_>>(),
    );
    let shown_or_basis = seen
        .shown
        .cloned()
        .or_else(|| basis(seen.record, seen.lines));
    let want = match &shown_or_basis {
        Some(e) => desired(Some(e), current_condition),
        None => other
            .as_ref()
            .and_then(|o| desired(Some(o), current_condition)),
    };
    let want = want.unwrap_or_else(|| match current_condition {
        Some(_) => current(node),
        None => Mark {
            labels: BTreeMap::new(),
            condition: None,
            admitted: None,
        },
    });
    let want = with_offences(want, seen.offences);
    let want = with_quiet(want, seen.record, seen.quiet_after, current_condition);
    let want = with_runs_under_way(want, seen.under_way);
    let want = with_admission(want, seen.record, admitted_of(node));
    (want != current(node)).then_some(want)
}
