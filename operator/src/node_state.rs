//! Node state where schedulers and people look: the Node condition `GpuValidated` (its message
//! with the first failures, their codes and the recommended action) and the labels
//! `gpuval.io/verdict` (`Pass`, `Fail`), `gpuval.io/validated-at` (seconds since 1970, so that
//! node affinity can ask for a recent pass with `Gt`) and, when there is something to do,
//! `gpuval.io/action` (`Rerun`, `ResetGpu`, `RebootNode`, `ReplaceHardware`).
//!
//! Pure: [`latest`] picks a node's newest verdict from the node results and the finished
//! validations' node lines; [`desired`] turns it into labels and the condition. Shell: a
//! controller over Nodes, woken by results and validations, writes both with server-side
//! apply under the operator's field manager (the condition through the status subresource).
//! When no result or validation speaks of a node any more, the labels and the condition are
//! removed.
//!
//! Only real evidence counts ([`Policy`]): a result of the simulated backend (its
//! `gpuval.io/simulated` label, or every result when the operator itself gives agents a
//! simulated backend) and a finding whose codes are all configuration codes
//! ([`gpuval_crds::Code::only_configuration`]: the installation's error, not the node's) are
//! not verdicts about a node.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpuval_crds::Action as Remedy;
use gpuval_crds::result::result_name;
use gpuval_crds::{GpuNodeResult, GpuValidation, NodeVerdict, Verdict, labels};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams, ResourceExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::controller::{Ctx, Error, FIELD_MANAGER};
use crate::wakes::NodeWake;
use tokio::sync::mpsc;

/// The Node condition type.
pub const CONDITION: &str = "GpuValidated";
/// How long a node's condition message may be.
const MAX_MESSAGE: usize = 300;

/// One verdict about a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence {
    pub validation: String,
    pub at: Timestamp,
    pub passed: bool,
    /// The verdict in the API's words (`Passed`, `Failed`, `Error`, `DeadlineExceeded`).
    pub reason: String,
    /// The first failures, or empty.
    pub message: String,
    /// What to do about the node (None: nothing).
    pub action: Remedy,
    /// The codes of its first failures (or warnings), comma-separated.
    pub codes: String,
}

/// A node result's metadata, as [`latest`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultMeta {
    pub node: String,
    pub validation: String,
    pub verdict: String,
    pub summary: String,
    pub created: Timestamp,
    /// Its `gpuval.io/action` label (None when absent or unknown).
    pub action: Remedy,
    /// Its `gpuval.io/codes` annotation.
    pub codes: String,
    /// It carries `gpuval.io/simulated=true`: written by the simulated backend.
    pub simulated: bool,
}

impl ResultMeta {
    /// Whether its verdict label passes, as [`Verdict::passes`] says; an unreadable label is no
    /// pass.
    pub fn passed(&self) -> bool {
        self.verdict.parse::<Verdict>().is_ok_and(Verdict::passes)
    }
}

/// What counts as evidence about a real node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Policy {
    /// The operator gives every agent a simulated backend (`GPUVAL_SIMULATE` or
    /// `GPUVAL_BACKEND=simulated` in its agent environment): nothing is evidence.
    pub agents_simulated: bool,
    /// Test-only: simulated results count as evidence
    /// ([`crate::config::OperatorConfig::simulated_acts_on_nodes`]).
    pub trust_simulated: bool,
}

impl Policy {
    /// The policy of an operator configured with `cfg`.
    pub fn of(cfg: &crate::config::OperatorConfig) -> Self {
        Self {
            agents_simulated: cfg.agents_simulated(),
            trust_simulated: cfg.simulated_acts_on_nodes,
        }
    }

    /// True when a result (simulated or not) may act on its node.
    pub fn counts(&self, simulated: bool) -> bool {
        self.trust_simulated || !(simulated || self.agents_simulated)
    }
}

/// The metadata of a node result, when it has the labels the agent sets.
pub fn result_meta(r: &PartialObjectMeta<GpuNodeResult>) -> Option<ResultMeta> {
    let l = r.metadata.labels.as_ref()?;
    let ann = r.metadata.annotations.as_ref();
    Some(ResultMeta {
        node: ann
            .and_then(|a| a.get(labels::NODE))
            .or_else(|| l.get(labels::NODE))?
            .clone(),
        validation: l.get(labels::VALIDATION)?.clone(),
        verdict: l.get(labels::VERDICT)?.clone(),
        summary: ann
            .and_then(|a| a.get(labels::SUMMARY))
            .cloned()
            .unwrap_or_default(),
        created: r.metadata.creation_timestamp.as_ref()?.0,
        action: l
            .get(labels::ACTION)
            .and_then(|a| Remedy::ALL.into_iter().find(|x| x.as_str() == a))
            .unwrap_or_default(),
        codes: ann
            .and_then(|a| a.get(labels::CODES))
            .cloned()
            .unwrap_or_default(),
        simulated: is_simulated(l),
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
            about == node && *pod == crate::pod::pod_name(validation, node, g)
        }
        _ => false,
    }
}

/// True when a result's labels say the simulated backend wrote it.
pub fn is_simulated(result_labels: &BTreeMap<String, String>) -> bool {
    result_labels
        .get(labels::SIMULATED)
        .is_some_and(|v| v == "true")
}

/// The newest verdict about `node`: from its node results (passing as [`Verdict::passes`] says) and from the
/// node lines of finished validations (Error and DeadlineExceeded have no result). On a tie a
/// failure wins. What `policy` does not count (simulated results) and findings of only
/// configuration codes are left out: they say nothing about the node.
pub fn latest(
    node: &str,
    results: &[ResultMeta],
    validations: &[&GpuValidation],
    policy: Policy,
) -> Option<Evidence> {
    if !policy.counts(false) {
        return None;
    }
    let from_results = results.iter().filter(|r| r.node == node);
    let from_results = from_results.filter(|r| policy.counts(r.simulated));
    let from_results = from_results.map(|r| {
        let passed = r.passed();
        Evidence {
            validation: r.validation.clone(),
            at: r.created,
            passed,
            reason: if passed { "Passed" } else { "Failed" }.into(),
            message: r.summary.clone(),
            action: r.action,
            codes: r.codes.clone(),
        }
    });
    let from_lines = validations.iter().filter_map(|v| {
        let s = v.status.as_ref()?;
        let at = s.completion_time.as_ref()?.0;
        let line = s.nodes.iter().find(|n| n.name == node)?;
        let no_result = matches!(
            line.verdict,
            NodeVerdict::Error | NodeVerdict::DeadlineExceeded
        );
        no_result.then(|| Evidence {
            validation: v.name_any(),
            at,
            passed: false,
            reason: line.verdict.as_str().into(),
            message: line.message.clone().unwrap_or_default(),
            // No verdict came back: run it again.
            action: line.action.unwrap_or(Remedy::Rerun),
            codes: line.codes.clone().unwrap_or_default(),
        })
    });
    from_results
        .chain(from_lines)
        .filter(|e| e.passed || !gpuval_crds::Code::only_configuration(&e.codes))
        .max_by_key(|e| (e.at, !e.passed))
}

/// True when a validation's failed node line (with its result's metadata, if it has one) may
/// act on the node (`spec.onFailure`, admission's failure taint): never for a finding of only
/// configuration codes, nor for a result `policy` does not count (simulated).
pub fn may_act_on(line_codes: Option<&str>, result: Option<&ResultMeta>, policy: Policy) -> bool {
    let codes = result
        .map(|r| r.codes.as_str())
        .or(line_codes)
        .unwrap_or_default();
    policy.counts(result.is_some_and(|r| r.simulated))
        && !gpuval_crds::Code::only_configuration(codes)
}

/// The labels and condition a node should carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    pub labels: BTreeMap<String, String>,
    pub condition: Option<NodeCondition>,
}

/// The [`Mark`] for `evidence` (empty: none), keeping the current condition's transition time
/// while its status does not change.
pub fn desired(evidence: Option<&Evidence>, current: Option<&NodeCondition>) -> Mark {
    let Some(e) = evidence else {
        return Mark {
            labels: BTreeMap::new(),
            condition: None,
        };
    };
    let status = if e.passed { "True" } else { "False" };
    let transition = current
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(e.at));
    let mut message = if e.passed {
        format!("passed GpuValidation {}", e.validation)
    } else {
        format!("GpuValidation {}: {}", e.validation, e.message)
    };
    // Codes and action first: the message is cut at 300 characters.
    let tags: Vec<String> = [
        (!e.codes.is_empty()).then(|| e.codes.clone()),
        (e.action != Remedy::None).then(|| format!("action {}", e.action)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !tags.is_empty() {
        message = format!("[{}] {message}", tags.join("; "));
    }
    let message = gpuval_crds::text::shorten(&message, MAX_MESSAGE);
    let mut node_labels = BTreeMap::from([
        (
            labels::NODE_VERDICT.to_string(),
            if e.passed { "Pass" } else { "Fail" }.to_string(),
        ),
        (
            labels::VALIDATED_AT.to_string(),
            e.at.as_second().to_string(),
        ),
    ]);
    if e.action != Remedy::None {
        node_labels.insert(labels::ACTION.to_string(), e.action.as_str().to_string());
    }
    Mark {
        labels: node_labels,
        condition: Some(NodeCondition {
            type_: CONDITION.into(),
            status: status.into(),
            reason: Some(e.reason.clone()),
            message: Some(message),
            last_transition_time: Some(transition),
            last_heartbeat_time: Some(Time(e.at)),
        }),
    }
}

/// What `node` carries now of what [`desired`] sets.
fn current(node: &Node) -> Mark {
    let ours = OUR_LABELS;
    Mark {
        labels: node
            .labels()
            .iter()
            .filter(|(k, _)| ours.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        condition: condition_of(node).cloned(),
    }
}

/// A hash of what the node carries of this controller's marks (its predicate: other changes
/// to a node do not wake it).
fn marked(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{:?}", current(node)).hash(&mut h);
    h.finish()
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

/// Writes `mark` on node `name`: labels, then the condition, each by server-side apply (what
/// `mark` leaves out and the operator set before is removed).
async fn write(ctx: &Ctx, name: &str, mark: &Mark) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let meta = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": mark.labels},
    });
    ctx.throttle.acquire().await;
    api.patch(name, &pp, &Patch::Apply(&meta)).await?;
    let status = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {"conditions": mark.condition.iter().collect::<Vec<_>>()},
    });
    ctx.throttle.acquire().await;
    api.patch_status(name, &pp, &Patch::Apply(&status)).await?;
    Ok(())
}

/// The node labels this controller writes (and reads back to compare).
const OUR_LABELS: [&str; 3] = [labels::NODE_VERDICT, labels::VALIDATED_AT, labels::ACTION];

/// What a node-state reconcile reads: the operator's context (its Node and result stores, see
/// [`crate::wakes`]) and this controller's own store of validations (each store filled before
/// the trigger it causes is delivered).
pub struct NodeStateCtx {
    ctx: Arc<Ctx>,
    validations: Store<GpuValidation>,
    /// The served `DeviceTaintRule` resource, when the operator uses DRA and the API server
    /// serves it ([`crate::device_taints`]).
    device_taints: Option<kube::discovery::ApiResource>,
}

async fn reconcile(node: Arc<Node>, nc: Arc<NodeStateCtx>) -> Result<Action, Error> {
    let ctx = &nc.ctx;
    let name = node.name_any();
    // A validation has at most one result a node, named for both: look each up (the cost is
    // the number of validations, not of results).
    let results: Vec<ResultMeta> = nc
        .validations
        .state()
        .iter()
        .filter_map(|v| {
            let key = ObjectRef::new(&result_name(&v.name_any(), &name)).within(&ctx.cfg.namespace);
            let r = ctx.results.get(&key)?;
            written_by_its_agent(&r, &v.name_any(), &name).then_some(r)
        })
        .filter_map(|r| result_meta(&r))
        .filter(|r| r.node == name)
        .collect();
    let validations = nc.validations.state();
    let finished: Vec<&GpuValidation> = validations.iter().map(|v| &**v).collect();
    let evidence = latest(&name, &results, &finished, Policy::of(&ctx.cfg));
    let want = desired(evidence.as_ref(), condition_of(&node));
    if want != current(&node) {
        tracing::info!(node = %name, verdict = ?want.labels.get(labels::NODE_VERDICT), "node state");
        match write(ctx, &name, &want).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            other => other?,
        }
    }
    if let Some(rule) = &nc.device_taints {
        crate::device_taints::sync_node(ctx, rule, &name, evidence.as_ref()).await?;
    }
    Ok(Action::await_change())
}

fn error_policy(node: Arc<Node>, err: &Error, _ctx: Arc<NodeStateCtx>) -> Action {
    tracing::warn!(node = %node.name_any(), error = %err, "could not write node state; retrying");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the node-state controller until the task is dropped, woken by `wakes` (from the
/// validation controller's Node and result watches) and by its own watch of validations. It
/// starts once the operator's stores are filled (`filled`; see
/// `controller::mark_ready_when_filled`): the wakes sent before wait in their channel, and each
/// node is then looked at once.
pub async fn run(
    ctx: Arc<Ctx>,
    wakes: mpsc::UnboundedReceiver<NodeWake>,
    filled: tokio::sync::oneshot::Receiver<()>,
) {
    if filled.await.is_err() {
        return;
    }
    let (validations, validation_writer) = reflector::store();
    let validation_events = watcher(
        Api::<GpuValidation>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .backoff(crate::watch_backoff::watch_backoff())
    .reflect(validation_writer)
    .touched_objects();
    let nodes = ctx.nodes.clone();
    let mut marks = Marks::default();
    let woken = crate::wakes::node_wakes(wakes).filter_map(move |w| {
        let node = match w {
            NodeWake::Result(node) => Some(node),
            NodeWake::Node(node) => marks.changed(&nodes, &node).then_some(node),
        };
        futures::future::ready(node.map(|n| ObjectRef::new(&n)))
    });
    let device_taints = match ctx.cfg.allocation.reads_slices() {
        true => crate::device_taints::discover(&ctx.client).await,
        false => None,
    };
    let nc = Arc::new(NodeStateCtx {
        ctx,
        validations,
        device_taints,
    });
    Controller::for_stream(futures::stream::pending(), nc.ctx.nodes.clone())
        .reconcile_on(woken)
        .watches_stream(validation_events, |v: GpuValidation| {
            v.status
                .iter()
                .flat_map(|s| s.nodes.iter().map(|n| ObjectRef::new(&n.name)))
                .collect::<Vec<_>>()
        })
        .run(reconcile, error_policy, nc)
        .for_each(|_| async {})
        .await;
}

/// The hash of each node's marks as last seen: a node's other changes (kubelet heartbeats,
/// other labels) do not wake this controller.
#[derive(Debug, Default)]
struct Marks(HashMap<String, u64>);

impl Marks {
    /// True when node `name`'s marks in `nodes` differ from the last seen (or were never seen);
    /// a node gone from the store is forgotten.
    fn changed(&mut self, nodes: &Store<Node>, name: &str) -> bool {
        match nodes.get(&ObjectRef::new(name)) {
            Some(node) => {
                let mark = marked(&node);
                self.0.insert(name.to_string(), mark) != Some(mark)
            }
            None => {
                self.0.remove(name);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuval_crds::{NodeStatus, Phase};

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn result(node: &str, validation: &str, verdict: &str, at: &str) -> ResultMeta {
        let failed = verdict == "Fail";
        ResultMeta {
            node: node.into(),
            validation: validation.into(),
            verdict: verdict.into(),
            summary: if failed {
                "GPU5 memory: 3 mismatches".into()
            } else {
                String::new()
            },
            created: ts(at),
            action: if failed {
                Remedy::ReplaceHardware
            } else {
                Remedy::None
            },
            codes: if failed {
                "MemoryMismatch".into()
            } else {
                String::new()
            },
            simulated: false,
        }
    }

    #[test]
    fn a_result_passes_as_its_verdict_passes() {
        let passed = |verdict: &str| {
            let results = [result("a", "v", verdict, "2026-11-23T01:00:00Z")];
            latest("a", &results, &[], Policy::default())
                .expect("a verdict")
                .passed
        };
        for verdict in gpuval_crds::Verdict::ALL {
            assert_eq!(passed(verdict.as_str()), verdict.passes(), "{verdict}");
        }
        assert!(!passed("pass"), "a label not in the API's words is no pass");
    }

    #[test]
    fn a_simulated_result_is_no_evidence_about_a_real_node() {
        let mut sim = result("a", "demo", "Pass", "2026-11-23T02:00:00Z");
        sim.simulated = true;
        let real = result("a", "old", "Fail", "2026-11-23T01:00:00Z");
        let results = [real, sim];
        let e = latest("a", &results, &[], Policy::default()).unwrap();
        assert_eq!(
            (e.validation.as_str(), e.passed),
            ("old", false),
            "the newer simulated pass does not hide the real failure"
        );
        assert_eq!(latest("a", &results[1..], &[], Policy::default()), None);
        // An operator whose agents all simulate has no evidence at all.
        let simulating = Policy {
            agents_simulated: true,
            ..Policy::default()
        };
        assert_eq!(latest("a", &results[..1], &[], simulating), None);
        assert_eq!(desired(None, None).labels, BTreeMap::new());
        // The test-only opt-in counts them.
        let trusted = Policy {
            agents_simulated: true,
            trust_simulated: true,
        };
        assert!(latest("a", &results, &[], trusted).unwrap().passed);
    }

    #[test]
    fn only_the_result_of_the_validation_s_own_agent_pod_counts() {
        let meta = |pod: &str, node: &str, generation: &str| -> PartialObjectMeta<GpuNodeResult> {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuNodeResult",
                "metadata": {"name": "a-b-c", "namespace": "gpuval-system",
                    "labels": {labels::GENERATION: generation},
                    "annotations": {labels::POD: pod, labels::NODE: node}},
            }))
            .unwrap()
        };
        let own = meta("gpuval-a-b-c-3-g2", "c", "2");
        assert!(written_by_its_agent(&own, "a-b", "c"));
        // Read as validation a's result on node b-c (whose pod was once named alike): not its agent's.
        assert!(!written_by_its_agent(&own, "a", "b-c"));
        let older = meta("gpuval-a-b-c-3-g1", "c", "2");
        assert!(
            !written_by_its_agent(&older, "a-b", "c"),
            "another generation's pod"
        );
        let intruder = meta("intruder", "c", "2");
        assert!(!written_by_its_agent(&intruder, "a-b", "c"));
        let long_node = "n".repeat(80);
        let long = meta(&crate::pod::pod_name("v", &long_node, 1), &long_node, "1");
        assert!(written_by_its_agent(&long, "v", &long_node));
    }

    #[test]
    fn only_real_hardware_findings_act_on_a_node() {
        let fail = result("a", "v", "Fail", "2026-11-23T02:00:00Z");
        let p = Policy::default();
        assert!(may_act_on(None, Some(&fail), p));
        assert!(
            may_act_on(Some("XidFatal"), None, p),
            "an Error line without result"
        );
        assert!(!may_act_on(Some("IoError"), None, p), "configuration");
        let mut io = fail.clone();
        io.codes = "IoError,LibraryMissing".into();
        assert!(!may_act_on(Some("MemoryMismatch"), Some(&io), p));
        let mut sim = fail.clone();
        sim.simulated = true;
        assert!(!may_act_on(None, Some(&sim), p), "simulated");
        let simulating = Policy {
            agents_simulated: true,
            ..p
        };
        assert!(!may_act_on(Some("XidFatal"), None, simulating));
        let trusted = Policy {
            trust_simulated: true,
            ..p
        };
        assert!(may_act_on(None, Some(&sim), trusted));
    }

    #[test]
    fn a_configuration_error_never_labels_a_node_fail() {
        let mut io = result("a", "new", "Error", "2026-11-23T02:00:00Z");
        io.codes = "IoError".into();
        io.action = Remedy::Rerun;
        let pass = result("a", "old", "Pass", "2026-11-23T01:00:00Z");
        let e = latest("a", &[pass, io.clone()], &[], Policy::default()).unwrap();
        assert!(e.passed && e.validation == "old", "the earlier pass stands");
        assert_eq!(
            latest("a", std::slice::from_ref(&io), &[], Policy::default()),
            None
        );
        // A hardware code beside it is a real failure.
        io.codes = "MemoryMismatch,IoError".into();
        let e = latest("a", std::slice::from_ref(&io), &[], Policy::default()).unwrap();
        assert!(!e.passed);
        assert_eq!(desired(Some(&e), None).labels[labels::NODE_VERDICT], "Fail");
        // A validation's Error line of only configuration codes is no verdict either.
        let mut gv = failed_validation("a", "io: no io host path configured");
        if let Some(line) = gv.status.as_mut().and_then(|s| s.nodes.first_mut()) {
            line.codes = Some("IoError".into());
        }
        assert_eq!(latest("a", &[], &[&gv], Policy::default()), None);
    }

    fn failed_validation(node: &str, message: &str) -> GpuValidation {
        let mut gv: GpuValidation = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
            "metadata": {"name": "v"}, "spec": {"checks": {"memory": {}}},
        }))
        .unwrap();
        let mut status = gpuval_crds::GpuValidationStatus {
            phase: Some(Phase::Failed),
            completion_time: Some(Time(ts("2026-11-23T03:00:00Z"))),
            ..Default::default()
        };
        status.nodes.push(NodeStatus {
            name: node.into(),
            verdict: NodeVerdict::Error,
            message: Some(message.into()),
            ..Default::default()
        });
        gv.status = Some(status);
        gv
    }

    #[test]
    fn the_newest_verdict_wins_and_sets_labels_and_condition() {
        let results = [
            result("a", "old", "Fail", "2026-11-23T01:00:00Z"),
            result("a", "new", "Warn", "2026-11-23T02:00:00Z"),
            result("b", "new", "Fail", "2026-11-23T02:00:00Z"),
        ];
        let a = latest("a", &results, &[], Policy::default()).unwrap();
        assert!(a.passed && a.validation == "new");
        let failed = desired(latest("b", &results, &[], Policy::default()).as_ref(), None);
        assert_eq!(failed.labels[labels::NODE_VERDICT], "Fail");
        assert_eq!(
            failed.labels[labels::VALIDATED_AT],
            ts("2026-11-23T02:00:00Z").as_second().to_string()
        );
        let c = failed.condition.unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("Failed"))
        );
        assert_eq!(
            c.message.as_deref(),
            Some(
                "[MemoryMismatch; action ReplaceHardware] GpuValidation new: GPU5 memory: 3 mismatches"
            )
        );
        assert_eq!(failed.labels[labels::ACTION], "ReplaceHardware");
        // A later pass flips the condition and moves its transition time; a repeat keeps it.
        let passed = desired(Some(&a), Some(&c_at("False", "2026-11-23T01:00:00Z")));
        assert!(
            !passed.labels.contains_key(labels::ACTION),
            "nothing to do after a pass"
        );
        let pc = passed.condition.unwrap();
        assert_eq!(pc.status, "True");
        assert_eq!(
            pc.last_transition_time,
            Some(Time(ts("2026-11-23T02:00:00Z")))
        );
        let again = desired(Some(&a), Some(&c_at("True", "2026-11-23T00:30:00Z")));
        assert_eq!(
            again.condition.unwrap().last_transition_time,
            Some(Time(ts("2026-11-23T00:30:00Z")))
        );
        assert_eq!(
            desired(None, Some(&pc)),
            Mark {
                labels: BTreeMap::new(),
                condition: None
            }
        );
    }

    fn c_at(status: &str, at: &str) -> NodeCondition {
        NodeCondition {
            type_: CONDITION.into(),
            status: status.into(),
            last_transition_time: Some(Time(ts(at))),
            ..Default::default()
        }
    }

    #[test]
    fn errors_without_a_result_come_from_the_validation_lines() {
        let mut gv: GpuValidation = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
            "metadata": {"name": "v"}, "spec": {"checks": {"memory": {}}},
        }))
        .unwrap();
        let mut status = gpuval_crds::GpuValidationStatus {
            phase: Some(Phase::Failed),
            completion_time: Some(Time(ts("2026-11-23T03:00:00Z"))),
            ..Default::default()
        };
        status.nodes.push(NodeStatus {
            name: "a".into(),
            verdict: NodeVerdict::Error,
            message: Some("agent pod failed".into()),
            ..Default::default()
        });
        gv.status = Some(status);
        let results = [result("a", "v0", "Pass", "2026-11-23T01:00:00Z")];
        let e = latest("a", &results, &[&gv], Policy::default()).unwrap();
        assert_eq!((e.passed, e.reason.as_str()), (false, "Error"));
        assert_eq!(e.message, "agent pod failed");
        assert_eq!(
            e.action,
            Remedy::Rerun,
            "no verdict came back: run it again"
        );
        assert_eq!(desired(Some(&e), None).labels[labels::ACTION], "Rerun");
    }

    #[test]
    fn the_shared_node_cache_keeps_what_this_controller_reads() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-1",
                         "labels": {"kubernetes.io/hostname": "gpu-1", labels::NODE_VERDICT: "Pass"},
                         "annotations": {"a": "b"}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": CONDITION, "status": "True", "reason": "Passed", "message": "ok"}],
                "capacity": {"nvidia.com/gpu": "8"}},
        }))
        .unwrap();
        let before = (current(&node), marked(&node));
        crate::controller::trim_node(&mut node);
        assert_eq!((current(&node), marked(&node)), before);
        let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
        assert_eq!(
            conditions
                .iter()
                .map(|c| c.type_.as_str())
                .collect::<Vec<_>>(),
            [CONDITION],
            "only this controller's condition stays"
        );
        assert!(node.metadata.annotations.is_none());
    }

    #[test]
    fn only_a_change_of_marks_wakes_the_controller() {
        let (store, mut writer) = reflector::store::<Node>();
        let node = |verdict: &str, hostname: &str| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "gpu-1",
                "labels": {"kubernetes.io/hostname": hostname, labels::NODE_VERDICT: verdict}}}))
            .unwrap()
        };
        let mut marks = Marks::default();
        writer.apply_watcher_event(&watcher::Event::Apply(node("Pass", "a")));
        assert!(marks.changed(&store, "gpu-1"), "first seen");
        assert!(!marks.changed(&store, "gpu-1"), "nothing changed");
        writer.apply_watcher_event(&watcher::Event::Apply(node("Pass", "b")));
        assert!(!marks.changed(&store, "gpu-1"), "another label changed");
        writer.apply_watcher_event(&watcher::Event::Apply(node("Fail", "b")));
        assert!(marks.changed(&store, "gpu-1"), "its verdict label changed");
        writer.apply_watcher_event(&watcher::Event::Delete(node("Fail", "b")));
        assert!(!marks.changed(&store, "gpu-1"), "gone");
        assert!(marks.0.is_empty(), "a node gone is forgotten");
    }
}
