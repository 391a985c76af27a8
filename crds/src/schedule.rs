//! `GpuValidationSchedule`: validations on a cron schedule (shaped like a CronJob) and the
//! admission of new nodes: nodes that carry the admission taint are validated as they appear
//! and untainted once they pass.
//!
//! The schema checks the shape of `spec.schedule`; the operator parses it ([`crate::cron`])
//! and reports an expression it cannot use in the schedule's `Ready` condition.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::core::{Message, Rule};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::duration::DurationRange;
use crate::rules::CelRule;
use crate::{Duration, GpuValidationSpec, Phase};

/// Re-validates GPU nodes on a cron schedule and/or gates new nodes until they pass. Each run
/// is a GpuValidation owned by this schedule, made from `spec.template`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpuval.io",
    version = "v1alpha1",
    kind = "GpuValidationSchedule",
    plural = "gpuvalidationschedules",
    shortname = "gpuvalsched",
    category = "gpuval-all",
    status = "GpuValidationScheduleStatus",
    derive = "PartialEq",
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(
        name = "Last Verdict",
        type_ = "string",
        json_path = ".status.lastVerdict"
    ),
    printcolumn(
        name = "Last Schedule",
        type_ = "date",
        json_path = ".status.lastScheduleTime"
    ),
    printcolumn(
        name = "Next",
        type_ = "string",
        priority = 1,
        json_path = ".status.nextScheduleTime"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = schedule_or_admission())]
#[serde(rename_all = "camelCase")]
pub struct GpuValidationScheduleSpec {
    /// When to run, in cron syntax evaluated in UTC (`0 */4 * * *`, `@daily`). Optional when
    /// `admission` is set (then only new nodes are validated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 100), regex(pattern = CRON_SHAPE))]
    pub schedule: Option<String>,

    /// The GpuValidation spec of every run (the same schema and rules as a GpuValidation's).
    pub template: GpuValidationSpec,

    /// What to do when a run is due while an earlier one still runs: Forbid (default: skip the
    /// new one), Allow (run both), Replace (delete the running one and start the new one).
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,

    /// Finished runs that passed to keep (default 3; older ones are deleted with their results).
    #[serde(default = "default_successful_history")]
    #[schemars(range(min = 0, max = 100))]
    pub successful_history_limit: i32,

    /// Finished runs that did not pass to keep (default 1).
    #[serde(default = "default_failed_history")]
    #[schemars(range(min = 0, max = 100))]
    pub failed_history_limit: i32,

    /// True stops new scheduled runs (and admission runs); running ones go on.
    #[serde(default)]
    pub suspend: bool,

    /// Run only on nodes where no pod holds `nvidia.com/gpu` when the run starts; busy nodes
    /// are listed in `status.skippedNodes` with the pod that holds them, and tried again at
    /// the next scheduled time.
    #[serde(default)]
    pub idle_only: bool,

    /// Gate new nodes: nodes (among those the template selects) that carry `admission.taint`
    /// are validated as they appear; a pass removes the taint, a failure keeps it and adds
    /// `gpuval.io/failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
}

/// The rough shape of a cron expression (five fields or a shorthand); the operator parses it.
pub const CRON_SHAPE: &str = r"^\s*(@[a-z]+|[0-9A-Za-z*/,-]+(\s+[0-9A-Za-z*/,-]+){4})\s*$";

fn default_successful_history() -> i32 {
    3
}
fn default_failed_history() -> i32 {
    1
}

/// `spec.concurrencyPolicy`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConcurrencyPolicy {
    /// Start the new run beside the running one.
    Allow,
    /// Skip the new run while one is running.
    #[default]
    Forbid,
    /// Delete the running run, then start the new one.
    Replace,
}

/// `spec.admission`: which nodes wait for a pass.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    /// The taint that holds a node back until it passes (default
    /// `gpuval.io/unvalidated:NoSchedule`). The node's provisioning (kubelet
    /// `--register-with-taints`, a node pool setting) puts it on; agent pods tolerate it.
    #[serde(default)]
    pub taint: AdmissionTaint,
    /// Also validate nodes that have no `gpuval.io/admission` label yet (no run whose author may
    /// admit nodes has judged them), tainted or not (default false).
    #[serde(default)]
    pub untested_nodes: bool,
    /// How long to wait after the newest waiting node appeared before starting a run, so that
    /// nodes joining together are validated together (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = DEBOUNCE_RANGE.rule())]
    pub debounce: Option<Duration>,
    /// The most nodes one admission run takes (default 100).
    #[serde(default = "default_max_batch")]
    #[schemars(range(min = 1, max = 5000))]
    pub max_batch: i32,
}

impl Admission {
    /// The debounce in force (30s by default).
    pub fn debounce_or_default(&self) -> Duration {
        self.debounce.unwrap_or(DEFAULT_DEBOUNCE)
    }
}

/// Default of `spec.admission.debounce`.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_secs(30);
/// The range of `spec.admission.debounce`.
pub const DEBOUNCE_RANGE: DurationRange =
    DurationRange::new(Duration::from_secs(1), Duration::from_secs(3600));

fn default_max_batch() -> i32 {
    100
}

/// The admission taint (`key[=value]:effect`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionTaint {
    /// The taint key (default `gpuval.io/unvalidated`).
    #[schemars(length(min = 1, max = 317), regex(pattern = crate::names::LABEL_KEY_PATTERN))]
    pub key: String,
    /// The taint effect (default NoSchedule).
    #[serde(default)]
    pub effect: TaintEffect,
}

impl Default for AdmissionTaint {
    fn default() -> Self {
        Self {
            key: crate::labels::UNVALIDATED.into(),
            effect: TaintEffect::NoSchedule,
        }
    }
}

/// A taint effect.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaintEffect {
    #[default]
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

// The effect as the Node API writes it.
crate::spelling::api_spelling!(TaintEffect {
    NoSchedule => "NoSchedule",
    PreferNoSchedule => "PreferNoSchedule",
    NoExecute => "NoExecute",
});

/// A node a run left out, and why.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SkippedNode {
    pub name: String,
    pub reason: String,
}

/// The most nodes `status.skippedNodes` lists.
pub const MAX_SKIPPED_LISTED: usize = 50;

/// What the schedule did last and will do next.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuValidationScheduleStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The scheduled time of the last run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// The next scheduled time (none while suspended or without a schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// The phase of the most recent finished run (Passed or Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_verdict: Option<Phase>,
    /// The most recent finished run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_validation: Option<String>,
    /// Runs not finished yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<String>,
    /// A scheduled time that started no run, and why (Forbid with a run going, every node busy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_reason: Option<String>,
    /// Nodes the last scheduled run left out under `idleOnly` (at most 50), with the pod that
    /// held their GPUs; they are tried again at the next scheduled time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_nodes: Vec<SkippedNode>,
    /// `Ready`: the schedule is valid (False with reason InvalidSchedule and what to fix).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// `spec`: a schedule, an admission section, or both.
pub fn schedule_or_admission() -> Rule {
    schedule_or_admission_rule().into()
}

const SCHEDULE_OR_ADMISSION: &str =
    "spec needs schedule (a cron expression), admission (gate new nodes), or both";

/// [`schedule_or_admission`] with its twin in Rust.
pub fn schedule_or_admission_rule() -> CelRule {
    CelRule {
        rule: "has(self.schedule) || has(self.admission)".into(),
        message: Message::Message(SCHEDULE_OR_ADMISSION.into()),
        field_path: None,
        reason: None,
        check: |spec: &Value| {
            if spec.get("schedule").is_some() || spec.get("admission").is_some() {
                Ok(())
            } else {
                Err(SCHEDULE_OR_ADMISSION.into())
            }
        },
    }
}

/// The longest a schedule name may be inside a run's name (`NAME-MINUTES` stays a valid name,
/// and the agent pods' names built from it stay short).
pub const MAX_NAME_PREFIX: usize = 40;
/// `name` cut to [`MAX_NAME_PREFIX`] characters at a name-safe point.
pub fn name_prefix(name: &str) -> &str {
    let cut = name.get(..MAX_NAME_PREFIX.min(name.len())).unwrap_or(name);
    cut.trim_end_matches(['-', '.'])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_the_either_rule() {
        let spec: GpuValidationScheduleSpec = serde_json::from_value(
            json!({"schedule": "@daily", "template": {"checks": {"memory": {}}}}),
        )
        .unwrap();
        assert_eq!(spec.concurrency_policy, ConcurrencyPolicy::Forbid);
        assert_eq!(
            (spec.successful_history_limit, spec.failed_history_limit),
            (3, 1)
        );
        let rule = schedule_or_admission_rule();
        assert!((rule.check)(&json!({"schedule": "@daily"})).is_ok());
        assert!((rule.check)(&json!({"admission": {}})).is_ok());
        assert_eq!(
            (rule.check)(&json!({"template": {}})).unwrap_err(),
            SCHEDULE_OR_ADMISSION
        );
        let a: Admission = serde_json::from_value(json!({})).unwrap();
        assert_eq!(a.taint.key, "gpuval.io/unvalidated");
        assert_eq!(a.taint.effect.as_str(), "NoSchedule");
        assert_eq!(a.debounce_or_default(), DEFAULT_DEBOUNCE);
    }

    #[test]
    fn the_cron_shape_admits_what_the_parser_reads() {
        let shape = regex::Regex::new(CRON_SHAPE).unwrap();
        for ok in ["@hourly", "0 */4 * * *", " 5,35 9-17 * JAN-MAR MON-FRI "] {
            assert!(shape.is_match(ok), "{ok}");
            crate::cron::Cron::parse(ok).unwrap();
        }
        for bad in ["* * * *", "every hour", "0 0 * * * *"] {
            assert!(!shape.is_match(bad), "{bad}");
        }
    }
}
