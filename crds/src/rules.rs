//! The schema's CEL rules (`x-kubernetes-validations`) other than duration ranges (those are
//! [`crate::duration::DurationRange`]), each written once: the expression and message the API
//! server evaluates, and the same decision in Rust for [`crate::validate`], which checks
//! settings files outside Kubernetes. [`table`] lists them all; a test fails when the generated
//! schema holds a rule that is neither a duration range nor in the table.

use kube::core::{Message, Reason, Rule};
use serde_json::Value;

use crate::{
    Duration,
    duration::{DEFAULT_DEADLINE, DURATION_PATTERN, cel_quote},
    names,
};

/// The most values all `matchExpressions` of a selector may hold together.
pub const MAX_SELECTOR_VALUES: usize = 1024;

/// The sections of `spec.checks`, each one check (a test keeps this in step with [`crate::Checks`]).
pub const CHECK_SECTIONS: [&str; 8] = [
    "topology",
    "memory",
    "compute",
    "p2p",
    "hostTransfer",
    "io",
    "nccl",
    "training",
];

/// The most characters all of `spec.nodeNames` may hold together: 256 KiB, so that a spec at
/// every bound still fits in one stored object (etcd takes at most 1.5 MiB a request) beside its
/// managed-fields record and annotations.
pub const MAX_NODE_NAMES_CHARS: usize = 256 * 1024;

/// One CEL rule of the schema and its twin in Rust.
#[derive(Clone)]
pub struct CelRule {
    /// The CEL expression.
    pub rule: String,
    /// The message, or the CEL expression that builds it.
    pub message: Message,
    /// Where the API server reports a failure, relative to the value the rule is on.
    pub field_path: Option<&'static str>,
    pub reason: Option<Reason>,
    /// The rule in Rust, on the value the rule is on (defaults applied, null fields dropped):
    /// `Err` with the message the API server gives.
    pub check: fn(&Value) -> Result<(), String>,
}

impl From<CelRule> for Rule {
    fn from(r: CelRule) -> Self {
        let mut rule = Rule::new(r.rule).message(r.message);
        rule.field_path = r.field_path.map(str::to_string);
        rule.reason = r.reason;
        rule
    }
}

impl std::fmt::Debug for CelRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CelRule")
            .field("rule", &self.rule)
            .field("field_path", &self.field_path)
            .finish_non_exhaustive()
    }
}

fn fixed(rule: String, message: &str, check: fn(&Value) -> Result<(), String>) -> CelRule {
    CelRule {
        rule,
        message: Message::Message(message.to_string()),
        field_path: None,
        reason: None,
        check,
    }
}

/// Every rule of this module: what [`crate::validate`] looks rules up in.
pub fn table() -> Vec<CelRule> {
    vec![
        at_least_one_check(),
        deadline_covers_burn(),
        io_during_compute_needs_compute(),
        p2p_bidirectional_not_below_unidirectional(),
        host_transfer_measures_something(),
        pulse_period_within_duration(),
        nccl_max_not_below_min(),
        fabric_measures_something(),
        node_names_total(),
        match_labels_keys(),
        requirement_key(),
        requirement_needs_values(),
        requirement_takes_no_values(),
        selector_values_total(),
    ]
}

/// The rule of [`table`] whose expression is `rule`.
pub fn find(rule: &str) -> Option<CelRule> {
    table().into_iter().find(|r| r.rule == rule)
}

fn at_least_one_message() -> String {
    format!(
        "spec.checks must enable at least one of {}",
        CHECK_SECTIONS.join(", ")
    )
}

/// `spec.checks`: at least one section.
pub fn at_least_one_check() -> CelRule {
    let rule = CHECK_SECTIONS
        .iter()
        .map(|c| format!("has(self.{c})"))
        .collect::<Vec<_>>()
        .join(" || ");
    fixed(rule, &at_least_one_message(), |checks| {
        if CHECK_SECTIONS.iter().any(|c| checks.get(c).is_some()) {
            Ok(())
        } else {
            Err(at_least_one_message())
        }
    })
}

fn deadline_message() -> String {
    format!(
        "spec.deadline (default {DEFAULT_DEADLINE}) must be longer than spec.checks.compute.duration (plus pulse.duration when there is a pulse)"
    )
}

/// A duration field's value when it is well formed (its own rule reports it otherwise).
fn well_formed_duration(v: Option<&Value>) -> Option<Duration> {
    let s = v?.as_str()?;
    crate::duration::matches_pattern(s).then(|| s.parse().ok())?
}

/// `spec`: the deadline (or its default) is longer than the burn and the pulse after it.
/// Malformed durations are left to their own fields' rules, so that one mistake gives one
/// message.
pub fn deadline_covers_burn() -> CelRule {
    let rule = format!(
        "!has(self.checks.compute) || !self.checks.compute.duration.matches(r'{p}') || (has(self.deadline) && !self.deadline.matches(r'{p}')) || (has(self.checks.compute.pulse) && !self.checks.compute.pulse.duration.matches(r'{p}')) || duration(has(self.deadline) ? self.deadline : '{DEFAULT_DEADLINE}') > duration(self.checks.compute.duration) + (has(self.checks.compute.pulse) ? duration(self.checks.compute.pulse.duration) : duration('0s'))",
        p = DURATION_PATTERN
    );
    CelRule {
        field_path: Some(".deadline"),
        ..fixed(rule, &deadline_message(), |spec| {
            let Some(compute) = spec.pointer("/checks/compute") else {
                return Ok(());
            };
            let Some(burn) = well_formed_duration(compute.get("duration")) else {
                return Ok(());
            };
            let pulse = match compute.pointer("/pulse/duration") {
                None => Duration::from_secs(0),
                Some(d) => match well_formed_duration(Some(d)) {
                    Some(d) => d,
                    None => return Ok(()),
                },
            };
            let deadline = match spec.get("deadline") {
                None => DEFAULT_DEADLINE,
                Some(d) => match well_formed_duration(Some(d)) {
                    Some(d) => d,
                    None => return Ok(()),
                },
            };
            let needed = burn.as_std().saturating_add(pulse.as_std());
            if deadline.as_std() > needed {
                Ok(())
            } else {
                Err(deadline_message())
            }
        })
    }
}

const IO_NEEDS_COMPUTE: &str = "spec.checks.io.duringCompute needs spec.checks.compute to be set";

/// `spec`: the I/O check runs during the burn only when there is a burn.
pub fn io_during_compute_needs_compute() -> CelRule {
    CelRule {
        field_path: Some(".checks.io.duringCompute"),
        ..fixed(
            "!has(self.checks.io) || !self.checks.io.duringCompute || has(self.checks.compute)"
                .into(),
            IO_NEEDS_COMPUTE,
            |spec| {
                let during = spec.pointer("/checks/io/duringCompute") == Some(&Value::Bool(true));
                if during && spec.pointer("/checks/compute").is_none() {
                    Err(IO_NEEDS_COMPUTE.into())
                } else {
                    Ok(())
                }
            },
        )
    }
}

const P2P_BIDIRECTIONAL: &str =
    "spec.checks.p2p.minBidirectionalGbps must not be below minUnidirectionalGbps";

/// `spec.checks.p2p`: both directions at once carry at least what one does.
pub fn p2p_bidirectional_not_below_unidirectional() -> CelRule {
    CelRule {
        field_path: Some(".minBidirectionalGbps"),
        ..fixed(
            "!has(self.minUnidirectionalGbps) || !has(self.minBidirectionalGbps) || self.minBidirectionalGbps >= self.minUnidirectionalGbps".into(),
            P2P_BIDIRECTIONAL,
            |p2p| {
                not_below(
                    p2p,
                    "minUnidirectionalGbps",
                    "minBidirectionalGbps",
                    P2P_BIDIRECTIONAL,
                )
            },
        )
    }
}

const NCCL_SIZES: &str = "spec.checks.nccl.maxBytes must not be below minBytes";

/// `spec.checks.nccl`: the size sweep goes up.
pub fn nccl_max_not_below_min() -> CelRule {
    CelRule {
        field_path: Some(".maxBytes"),
        ..fixed(
            "!has(self.maxBytes) || self.maxBytes >= self.minBytes".into(),
            NCCL_SIZES,
            |nccl| not_below(nccl, "minBytes", "maxBytes", NCCL_SIZES),
        )
    }
}

/// `message` where both integer fields `low` and `high` of `obj` are set and `high` is below
/// `low`.
fn not_below(obj: &Value, low: &str, high: &str, message: &str) -> Result<(), String> {
    let field = |k: &str| obj.get(k).and_then(Value::as_i64);
    match (field(low), field(high)) {
        (Some(low), Some(high)) if high < low => Err(message.into()),
        _ => Ok(()),
    }
}

const HOST_TRANSFER: &str =
    "spec.checks.hostTransfer needs pinned or pageable (or both) to be true";

/// `spec.checks.hostTransfer`: something to measure.
pub fn host_transfer_measures_something() -> CelRule {
    fixed("self.pinned || self.pageable".into(), HOST_TRANSFER, |h| {
        let on = |k: &str| h.get(k) == Some(&Value::Bool(true));
        if on("pinned") || on("pageable") {
            Ok(())
        } else {
            Err(HOST_TRANSFER.into())
        }
    })
}

const PULSE_PERIOD: &str =
    "spec.checks.compute.pulse.period must not be longer than pulse.duration";

/// `spec.checks.compute.pulse`: at least one load-and-idle cycle. Malformed durations are left to
/// their own fields' rules.
pub fn pulse_period_within_duration() -> CelRule {
    let rule = format!(
        "!self.period.matches(r'{p}') || !self.duration.matches(r'{p}') || duration(self.period) <= duration(self.duration)",
        p = DURATION_PATTERN
    );
    CelRule {
        field_path: Some(".period"),
        ..fixed(rule, PULSE_PERIOD, |pulse| {
            let period = well_formed_duration(pulse.get("period"));
            let duration = well_formed_duration(pulse.get("duration"));
            match (period, duration) {
                (Some(p), Some(d)) if p > d => Err(PULSE_PERIOD.into()),
                _ => Ok(()),
            }
        })
    }
}

const FABRIC: &str = "spec.fabric needs nccl or tcp (or both): what to measure between nodes";

/// `spec.fabric`: something to measure.
pub fn fabric_measures_something() -> CelRule {
    fixed("has(self.nccl) || has(self.tcp)".into(), FABRIC, |f| {
        if f.get("nccl").is_some() || f.get("tcp").is_some() {
            Ok(())
        } else {
            Err(FABRIC.into())
        }
    })
}

fn node_names_message() -> String {
    format!(
        "the node names total more than {MAX_NODE_NAMES_CHARS} characters, more than one object can hold; select that many nodes by label instead"
    )
}

/// `spec.nodeNames`: a bounded total size.
pub fn node_names_total() -> CelRule {
    fixed(
        format!("self.map(n, n.size()).sum() <= {MAX_NODE_NAMES_CHARS}"),
        &node_names_message(),
        |names| {
            let total: usize = names
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|n| n.chars().count())
                .sum();
            if total <= MAX_NODE_NAMES_CHARS {
                Ok(())
            } else {
                Err(node_names_message())
            }
        },
    )
}

/// `matchLabels`: every key a label key; the message names the first bad key in sort order.
pub fn match_labels_keys() -> CelRule {
    let valid = names::label_key_cel("k");
    CelRule {
        rule: format!("self.all(k, {valid})"),
        message: Message::Expression(format!(
            "'invalid label key ' + strings.quote(self.filter(k, !({valid})).sort()[0]) + \": must be {}\"",
            names::LABEL_KEY_FORM
        )),
        field_path: None,
        reason: None,
        check: |labels| {
            let first_bad = labels
                .as_object()
                .into_iter()
                .flat_map(|m| m.keys())
                .filter(|k| !names::is_label_key(k))
                .min();
            match first_bad {
                None => Ok(()),
                Some(k) => Err(format!(
                    "invalid label key {}: must be {}",
                    cel_quote(k),
                    names::LABEL_KEY_FORM
                )),
            }
        },
    }
}

fn requirement_key_message() -> String {
    format!("must be {}", names::LABEL_KEY_FORM)
}

/// A selector requirement's `key`: a label key.
pub fn requirement_key() -> CelRule {
    fixed(
        names::label_key_cel("self"),
        &requirement_key_message(),
        |key| {
            if key.as_str().is_some_and(names::is_label_key) {
                Ok(())
            } else {
                Err(requirement_key_message())
            }
        },
    )
}

const NEEDS_VALUES: &str = "values must be given when operator is In or NotIn";

fn value_count(requirement: &Value) -> usize {
    requirement
        .get("values")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

fn operator_is(requirement: &Value, ops: [&str; 2]) -> bool {
    requirement
        .get("operator")
        .and_then(Value::as_str)
        .is_some_and(|op| ops.contains(&op))
}

/// A selector requirement: `In` and `NotIn` compare with at least one value.
pub fn requirement_needs_values() -> CelRule {
    CelRule {
        field_path: Some(".values"),
        reason: Some(Reason::FieldValueRequired),
        ..fixed(
            "!(self.operator in ['In', 'NotIn']) || (has(self.values) && self.values.size() > 0)"
                .into(),
            NEEDS_VALUES,
            |r| {
                if operator_is(r, ["In", "NotIn"]) && value_count(r) == 0 {
                    Err(NEEDS_VALUES.into())
                } else {
                    Ok(())
                }
            },
        )
    }
}

const TAKES_NO_VALUES: &str = "values must not be given when operator is Exists or DoesNotExist";

/// A selector requirement: `Exists` and `DoesNotExist` take no values (a value there would be
/// ignored, and the selection wider than written).
pub fn requirement_takes_no_values() -> CelRule {
    CelRule {
        field_path: Some(".values"),
        reason: Some(Reason::FieldValueForbidden),
        ..fixed(
            "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || self.values.size() == 0".into(),
            TAKES_NO_VALUES,
            |r| {
                if operator_is(r, ["Exists", "DoesNotExist"]) && value_count(r) > 0 {
                    Err(TAKES_NO_VALUES.into())
                } else {
                    Ok(())
                }
            },
        )
    }
}

fn selector_values_message() -> String {
    format!("the match expressions hold more than {MAX_SELECTOR_VALUES} values in all")
}

/// A selector: a bounded number of values over all its requirements.
pub fn selector_values_total() -> CelRule {
    fixed(
        format!(
            "!has(self.matchExpressions) || self.matchExpressions.map(e, has(e.values) ? e.values.size() : 0).sum() <= {MAX_SELECTOR_VALUES}"
        ),
        &selector_values_message(),
        |selector| {
            let total: usize = selector
                .get("matchExpressions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(value_count)
                .sum();
            if total <= MAX_SELECTOR_VALUES {
                Ok(())
            } else {
                Err(selector_values_message())
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refuses(rule: &CelRule, v: Value) -> String {
        (rule.check)(&v).expect_err(&format!("{} should refuse {v}", rule.rule))
    }

    fn accepts(rule: &CelRule, v: Value) {
        if let Err(e) = (rule.check)(&v) {
            panic!("{} should accept {v}: {e}", rule.rule)
        }
    }

    #[test]
    fn rule_expressions_are_distinct_and_single_line() {
        let table = table();
        for (i, r) in table.iter().enumerate() {
            assert!(!r.rule.contains('\n'), "{}", r.rule);
            assert!(
                table[i + 1..].iter().all(|o| o.rule != r.rule),
                "rule listed twice: {}",
                r.rule
            );
            assert_eq!(find(&r.rule).map(|f| f.rule), Some(r.rule.clone()));
        }
        assert!(find("self.size() > 0").is_none());
    }

    #[test]
    fn the_deadline_covers_the_pulse_too() {
        let r = deadline_covers_burn();
        accepts(
            &r,
            json!({"checks": {"compute": {"duration": "30m", "pulse": {"period": "1s", "duration": "29m"}}}}),
        );
        let msg = refuses(
            &r,
            json!({"checks": {"compute": {"duration": "30m", "pulse": {"period": "1s", "duration": "30m"}}}}),
        );
        assert!(msg.contains("plus pulse.duration"), "{msg}");
        // a malformed pulse duration is its own field's rule's to report
        accepts(
            &r,
            json!({"checks": {"compute": {"duration": "59m", "pulse": {"period": "1s", "duration": "ages"}}}}),
        );
    }

    #[test]
    fn a_pulse_holds_at_least_one_period() {
        let r = pulse_period_within_duration();
        accepts(&r, json!({"period": "1s", "duration": "60s"}));
        accepts(&r, json!({"period": "60s", "duration": "60s"}));
        // a malformed duration is its own field's rule's to report
        accepts(&r, json!({"period": "soon", "duration": "10s"}));
        let msg = refuses(&r, json!({"period": "20s", "duration": "10s"}));
        assert_eq!(msg, PULSE_PERIOD);
    }

    #[test]
    fn the_deadline_covers_the_burn_or_its_default_does() {
        let r = deadline_covers_burn();
        accepts(&r, json!({"checks": {"memory": {}}}));
        accepts(&r, json!({"checks": {"compute": {"duration": "59m"}}}));
        accepts(
            &r,
            json!({"checks": {"compute": {"duration": "2h"}}, "deadline": "3h"}),
        );
        let msg = refuses(&r, json!({"checks": {"compute": {"duration": "1h"}}}));
        assert!(msg.contains("default 1h"), "{msg}");
        refuses(
            &r,
            json!({"checks": {"compute": {"duration": "10m"}}, "deadline": "5m"}),
        );
        // Malformed values are their own fields' mistakes.
        accepts(
            &r,
            json!({"checks": {"compute": {"duration": "2h"}}, "deadline": "5 min"}),
        );
        accepts(
            &r,
            json!({"checks": {"compute": {"duration": "2d"}}, "deadline": "5m"}),
        );
    }

    #[test]
    fn cross_field_rules() {
        let io = io_during_compute_needs_compute();
        refuses(&io, json!({"checks": {"io": {"duringCompute": true}}}));
        accepts(
            &io,
            json!({"checks": {"io": {"duringCompute": true}, "compute": {}}}),
        );
        accepts(&io, json!({"checks": {"io": {"duringCompute": false}}}));
        let p2p = p2p_bidirectional_not_below_unidirectional();
        refuses(
            &p2p,
            json!({"minUnidirectionalGbps": 300, "minBidirectionalGbps": 200}),
        );
        accepts(
            &p2p,
            json!({"minUnidirectionalGbps": 300, "minBidirectionalGbps": 300}),
        );
        accepts(&p2p, json!({"minBidirectionalGbps": 1}));
        let host = host_transfer_measures_something();
        refuses(&host, json!({"pinned": false, "pageable": false}));
        accepts(&host, json!({"pinned": false, "pageable": true}));
        let checks = at_least_one_check();
        refuses(&checks, json!({}));
        accepts(&checks, json!({"io": {}}));
    }

    #[test]
    fn selector_rules() {
        let keys = match_labels_keys();
        accepts(
            &keys,
            json!({"zone": "a", "nvidia.com/gpu.present": "true"}),
        );
        let msg = refuses(&keys, json!({"ok": "1", "z!": "1", "a b": "2"}));
        assert!(
            msg.starts_with("invalid label key \"a b\": must be a label key"),
            "{msg}"
        );
        let key = requirement_key();
        accepts(&key, json!("example.com/x"));
        refuses(&key, json!("example.com/"));
        let needs = requirement_needs_values();
        refuses(&needs, json!({"key": "a", "operator": "In"}));
        refuses(
            &needs,
            json!({"key": "a", "operator": "NotIn", "values": []}),
        );
        accepts(
            &needs,
            json!({"key": "a", "operator": "In", "values": ["x"]}),
        );
        accepts(&needs, json!({"key": "a", "operator": "Exists"}));
        let none = requirement_takes_no_values();
        refuses(
            &none,
            json!({"key": "a", "operator": "Exists", "values": ["x"]}),
        );
        accepts(
            &none,
            json!({"key": "a", "operator": "DoesNotExist", "values": []}),
        );
        let total = selector_values_total();
        let values: Vec<String> = (0..MAX_SELECTOR_VALUES).map(|i| i.to_string()).collect();
        accepts(
            &total,
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": values}]}),
        );
        refuses(
            &total,
            json!({"matchExpressions": [
                {"key": "a", "operator": "In", "values": values},
                {"key": "b", "operator": "In", "values": ["x"]},
            ]}),
        );
    }

    #[test]
    fn node_names_have_a_total_size() {
        let r = node_names_total();
        let name = "n".repeat(253);
        let fits = vec![name.as_str(); MAX_NODE_NAMES_CHARS / 253];
        accepts(&r, json!(fits));
        let too_many = vec![name.as_str(); MAX_NODE_NAMES_CHARS / 253 + 1];
        let msg = refuses(&r, json!(too_many));
        assert!(msg.contains("262144 characters"), "{msg}");
    }
}
