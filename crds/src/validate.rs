//! Checks a spec against the generated CRD schema, the way the API server does, for settings
//! files used outside Kubernetes: the same source as the CRD, so the two cannot drift.
//!
//! Like the API server, it first drops null fields and fills in defaults, then checks types,
//! enums, bounds, patterns, lengths, counts, required and unknown fields and list sets, and only
//! when none of those failed, the `x-kubernetes-validations` rules: duration ranges
//! ([`DurationRange`]) and the rules of [`crate::rules::table`]. A rule it knows neither way is
//! an error, never silently passed.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use crate::{
    Checks, DEADLINE_RANGE, GpuValidationSpec, Thresholds, duration::DurationRange, rules,
};

/// One mistake: where (a path like `checks.memory.fraction`) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a spec was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Against the schema: every mistake found.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<Violation>),
    /// The schema holds something this validator cannot check (a bug of this crate).
    #[error("the schema cannot be checked here: {0}")]
    Schema(String),
    /// Valid by the schema, yet not the API types' shape (a bug of this crate).
    #[error("{path}: {source}")]
    Shape {
        path: String,
        source: serde_json::Error,
    },
}

/// The generated schema of `GpuValidation.spec`, as the CRD carries it.
pub fn spec_schema() -> Result<&'static Value, SpecError> {
    static SCHEMA: LazyLock<Result<Value, String>> = LazyLock::new(|| {
        let crd =
            serde_json::to_value(crate::schema::gpu_validation_crd()).map_err(|e| e.to_string())?;
        crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec")
            .cloned()
            .ok_or_else(|| "no spec in the GpuValidation CRD".to_string())
    });
    SCHEMA.as_ref().map_err(|e| SpecError::Schema(e.clone()))
}

/// Checks a spec (as JSON) and gives it back as the API types, defaults filled in.
pub fn parse_spec(spec: Value) -> Result<GpuValidationSpec, SpecError> {
    let normalized = check_spec(spec)?;
    serde_path_to_error::deserialize(normalized).map_err(|e| SpecError::Shape {
        path: e.path().to_string(),
        source: e.into_inner(),
    })
}

/// Checks bare-metal settings: a spec (as JSON) read from a file, where the parts only the
/// operator uses may be absent. No deadline applies outside Kubernetes, so an absent deadline is
/// read as the longest the API allows (the rule that a deadline outlasts the burn then never
/// refuses a long bare-metal burn).
pub fn parse_settings(mut spec: Value) -> Result<GpuValidationSpec, SpecError> {
    if let Some(map) = spec.as_object_mut()
        && map.get("deadline").is_none_or(Value::is_null)
    {
        map.insert("deadline".into(), DEADLINE_RANGE.max.to_string().into());
    }
    parse_spec(spec)
}

/// Checks the checks and thresholds of a bare-metal run (after command-line overrides) the way
/// [`parse_settings`] checks a file.
pub fn check_settings(checks: &Checks, thresholds: &Thresholds) -> Result<(), SpecError> {
    let spec = GpuValidationSpec {
        node_selector: None,
        node_names: Vec::new(),
        checks: checks.clone(),
        thresholds: Some(thresholds.clone()),
        deadline: Some(DEADLINE_RANGE.max),
        on_failure: None,
        fabric: None,
        expect: None,
        dra: None,
        severity_overrides: Vec::new(),
    };
    let value = serde_json::to_value(&spec).map_err(|e| SpecError::Schema(e.to_string()))?;
    check_spec(value).map(drop)
}

/// Checks a spec (as JSON); gives it back with nulls dropped and defaults filled in, as the API
/// server would store it.
pub fn check_spec(mut spec: Value) -> Result<Value, SpecError> {
    let schema = spec_schema()?;
    normalize(&mut spec, schema);
    let mut walk = Walk::default();
    walk.value(&spec, schema, "");
    if walk.blocked {
        return Err(SpecError::Invalid(walk.violations));
    }
    for pending in &walk.rules {
        walk.violations.extend(pending.evaluate()?);
    }
    if walk.violations.is_empty() {
        Ok(spec)
    } else {
        Err(SpecError::Invalid(walk.violations))
    }
}

/// What the API server does before it validates: fills in defaults (also over a null in a field
/// that is not nullable), then drops the nulls left (pruned, or for nullable fields read as
/// absent by the rules); and it reads whole-valued numbers of integer fields as integers.
fn normalize(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, prop) in props {
                    let Some(default) = prop.get("default") else {
                        continue;
                    };
                    let nullable = prop.get("nullable") == Some(&Value::Bool(true));
                    match map.get(name) {
                        None => {}
                        Some(Value::Null) if !nullable => {}
                        Some(_) => continue,
                    }
                    map.insert(name.clone(), default.clone());
                }
            }
            map.retain(|_, v| !v.is_null());
            for (name, v) in map.iter_mut() {
                if let Some(sub) = property_schema(schema, name) {
                    normalize(v, sub);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                items.iter_mut().for_each(|v| normalize(v, sub));
            }
        }
        Value::Number(n) if schema_type(schema) == Some("integer") => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15) {
                *value = Value::from(f as i64);
            }
        }
        _ => {}
    }
}

fn schema_type(schema: &Value) -> Option<&str> {
    schema.get("type").and_then(Value::as_str)
}

fn property_schema<'a>(schema: &'a Value, name: &str) -> Option<&'a Value> {
    schema
        .get("properties")
        .and_then(|p| p.get(name))
        .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// A CEL rule met on the way, evaluated once the walk found no blocking mistake.
struct PendingRule {
    path: String,
    rule: Value,
    value: Value,
}

impl PendingRule {
    fn evaluate(&self) -> Result<Option<Violation>, SpecError> {
        let text = self.rule.get("rule").and_then(Value::as_str).unwrap_or("");
        if let Some(range) = DurationRange::from_rule(text) {
            let Some(s) = self.value.as_str() else {
                return Err(SpecError::Schema(format!("{text} on a non-string value")));
            };
            return Ok(range.check(s).err().map(|message| Violation {
                path: self.path.clone(),
                message: format!("invalid value {}: {message}", crate::duration::cel_quote(s)),
            }));
        }
        let Some(known) = rules::find(text) else {
            return Err(SpecError::Schema(format!(
                "rule at {} not known: {text}",
                self.path
            )));
        };
        Ok((known.check)(&self.value).err().map(|message| {
            let field = known.field_path.map_or("", |f| f.trim_start_matches('.'));
            Violation {
                path: if field.is_empty() {
                    self.path.clone()
                } else {
                    join(&self.path, field)
                },
                message,
            }
        }))
    }
}

/// The walk: mistakes found so far, whether any of them stops the rules (as the API server's
/// type, enum, required, length and count errors do), and the rules to evaluate.
#[derive(Default)]
struct Walk {
    violations: Vec<Violation>,
    blocked: bool,
    rules: Vec<PendingRule>,
}

impl Walk {
    fn refuse(&mut self, path: &str, message: String) {
        self.violations.push(Violation {
            path: path.to_string(),
            message,
        });
    }

    fn block(&mut self, path: &str, message: String) {
        self.blocked = true;
        self.refuse(path, message);
    }

    fn value(&mut self, v: &Value, schema: &Value, path: &str) {
        let ty = schema_type(schema).unwrap_or("");
        if !has_type(v, ty) {
            return self.block(path, format!("must be of type {ty}, not {}", json_kind(v)));
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
            && !allowed.contains(v)
        {
            let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return self.block(
                path,
                format!(
                    "unsupported value {v}: supported values: {}",
                    list.join(", ")
                ),
            );
        }
        match v {
            Value::String(s) => self.string(s, schema, path),
            Value::Number(_) => self.number(v, schema, path),
            Value::Array(items) => self.array(items, schema, path),
            Value::Object(map) => self.object(map, schema, path),
            _ => {}
        }
        for rule in schema
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.rules.push(PendingRule {
                path: path.to_string(),
                rule: rule.clone(),
                value: v.clone(),
            });
        }
    }

    fn string(&mut self, s: &str, schema: &Value, path: &str) {
        let len = s.chars().count();
        if let Some(max) = bound(schema, "maxLength")
            && len as f64 > max
        {
            return self.block(path, format!("too long: at most {max} characters"));
        }
        if let Some(min) = bound(schema, "minLength")
            && (len as f64) < min
        {
            self.refuse(path, format!("too short: at least {min} characters"));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            match compiled(pattern) {
                Some(re) if re.is_match(s) => {}
                Some(_) => self.refuse(
                    path,
                    format!(
                        "invalid value {}: must match '{pattern}'",
                        crate::duration::cel_quote(s)
                    ),
                ),
                None => self.refuse(path, format!("pattern '{pattern}' does not compile")),
            }
        }
    }

    fn number(&mut self, v: &Value, schema: &Value, path: &str) {
        let Some(x) = v.as_f64() else { return };
        if let Some(min) = bound(schema, "minimum") {
            let exclusive = schema.get("exclusiveMinimum") == Some(&Value::Bool(true));
            if x < min || (exclusive && x == min) {
                let than = if exclusive {
                    "greater than"
                } else {
                    "at least"
                };
                self.refuse(path, format!("invalid value {v}: must be {than} {min}"));
            }
        }
        if let Some(max) = bound(schema, "maximum") {
            let exclusive = schema.get("exclusiveMaximum") == Some(&Value::Bool(true));
            if x > max || (exclusive && x == max) {
                let than = if exclusive { "less than" } else { "at most" };
                self.refuse(path, format!("invalid value {v}: must be {than} {max}"));
            }
        }
        if let Some(step) = bound(schema, "multipleOf")
            && (x / step).fract() != 0.0
        {
            self.refuse(
                path,
                format!("invalid value {v}: must be a multiple of {step}"),
            );
        }
    }

    fn array(&mut self, items: &[Value], schema: &Value, path: &str) {
        if let Some(max) = bound(schema, "maxItems")
            && items.len() as f64 > max
        {
            return self.block(
                path,
                format!("too many: {} items, at most {max}", items.len()),
            );
        }
        if let Some(min) = bound(schema, "minItems")
            && (items.len() as f64) < min
        {
            self.refuse(path, format!("at least {min} items, not {}", items.len()));
        }
        let item_schema = schema.get("items").unwrap_or(&Value::Null);
        for (i, item) in items.iter().enumerate() {
            self.value(item, item_schema, &format!("{path}[{i}]"));
        }
        match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => {
                for (i, item) in items.iter().enumerate() {
                    if items[..i].contains(item) {
                        self.refuse(&format!("{path}[{i}]"), format!("duplicate value {item}"));
                    }
                }
            }
            Some("map") => self.map_keys(items, schema, path),
            _ => {}
        }
    }

    /// A `map` list: no two items with the same keys (as the API server refuses them).
    fn map_keys(&mut self, items: &[Value], schema: &Value, path: &str) {
        let keys: Vec<&str> = schema
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let key_of = |item: &Value| -> Map<String, Value> {
            keys.iter()
                .filter_map(|k| item.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect()
        };
        for (i, item) in items.iter().enumerate() {
            let key = key_of(item);
            if items[..i].iter().any(|other| key_of(other) == key) {
                self.refuse(
                    &format!("{path}[{i}]"),
                    format!("duplicate entry {}", Value::Object(key)),
                );
            }
        }
    }

    fn object(&mut self, map: &Map<String, Value>, schema: &Value, path: &str) {
        if let Some(max) = bound(schema, "maxProperties")
            && map.len() as f64 > max
        {
            return self.block(
                path,
                format!("too many: {} entries, at most {max}", map.len()),
            );
        }
        for name in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !map.contains_key(name) {
                self.block(&join(path, name), "required value".into());
            }
        }
        for (name, v) in map {
            match property_schema(schema, name) {
                Some(sub) => self.value(v, sub, &join(path, name)),
                None => self.block(&join(path, name), "unknown field".into()),
            }
        }
    }
}

fn bound(schema: &Value, key: &str) -> Option<f64> {
    schema.get(key).and_then(Value::as_f64)
}

fn has_type(v: &Value, ty: &str) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64(),
        _ => true,
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The schema's patterns, compiled once each.
fn compiled(pattern: &str) -> Option<Regex> {
    use std::{collections::HashMap, sync::Mutex};
    static CACHE: LazyLock<Mutex<HashMap<String, Option<Regex>>>> = LazyLock::new(Default::default);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).ok())
        .clone()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{ComputeCheck, TopologyCheck};

    fn messages(spec: Value) -> Vec<String> {
        match check_spec(spec.clone()) {
            Ok(_) => panic!("{spec} accepted"),
            Err(SpecError::Invalid(v)) => v.iter().map(ToString::to_string).collect(),
            Err(other) => panic!("{spec}: {other}"),
        }
    }

    /// Every `x-kubernetes-validations` rule under `schema`, with its path.
    fn rules_in(schema: &Value, path: &str, out: &mut Vec<(String, String)>) {
        for rule in schema
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let text = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
            out.push((path.to_string(), text.to_string()));
        }
        for (name, sub) in schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            rules_in(sub, &join(path, name), out);
        }
        for key in ["items", "additionalProperties"] {
            if let Some(sub) = schema.get(key).filter(|s| s.is_object()) {
                rules_in(sub, &format!("{path}[{key}]"), out);
            }
        }
    }

    #[test]
    fn every_rule_of_the_schema_is_understood_and_every_listed_rule_is_used() {
        let mut found = Vec::new();
        rules_in(spec_schema().unwrap(), "", &mut found);
        assert!(found.len() >= 10, "{found:?}");
        for (path, rule) in &found {
            assert!(
                DurationRange::from_rule(rule).is_some() || rules::find(rule).is_some(),
                "the rule at {path} is neither a duration range nor in rules::table(): {rule}"
            );
        }
        for listed in rules::table() {
            assert!(
                found.iter().any(|(_, r)| *r == listed.rule),
                "rules::table() lists a rule the schema does not use: {}",
                listed.rule
            );
        }
    }

    #[test]
    fn every_duration_field_carries_a_range_rule() {
        // Set every Duration of a spec to a marker and find where the marker lands.
        let marker = "7h7m7s7ms";
        let d: crate::Duration = marker.parse().unwrap();
        let spec = GpuValidationSpec {
            node_selector: None,
            node_names: vec![],
            checks: Checks {
                topology: Some(TopologyCheck {
                    resample_interval: Some(d),
                    ..Default::default()
                }),
                compute: Some(ComputeCheck {
                    duration: d,
                    pulse: Some(crate::PulseSpec {
                        period: d,
                        duration: d,
                    }),
                    ..Default::default()
                }),
                nccl: Some(crate::NcclCheck {
                    timeout: d,
                    ..Default::default()
                }),
                training: Some(crate::TrainingCheck {
                    timeout: d,
                    ..Default::default()
                }),
                ..Default::default()
            },
            thresholds: None,
            deadline: Some(d),
            on_failure: None,
            fabric: Some(crate::fabric::FabricSpec {
                round_timeout: Some(d),
                tcp: Some(crate::fabric::FabricTcp {
                    streams: 1,
                    duration: d,
                    min_gbps: None,
                    max_latency_micros: None,
                }),
                ..Default::default()
            }),
            expect: None,
            dra: None,
            severity_overrides: Vec::new(),
        };
        let json = serde_json::to_value(&spec).unwrap();
        let mut marked = Vec::new();
        fn find(v: &Value, path: &str, marker: &str, out: &mut Vec<String>) {
            match v {
                Value::String(s) if s == marker => out.push(path.to_string()),
                Value::Object(m) => m
                    .iter()
                    .for_each(|(k, v)| find(v, &join(path, k), marker, out)),
                _ => {}
            }
        }
        find(&json, "", marker, &mut marked);
        let mut ranged: Vec<String> = Vec::new();
        let mut found = Vec::new();
        rules_in(spec_schema().unwrap(), "", &mut found);
        for (path, rule) in found {
            if DurationRange::from_rule(&rule).is_some() {
                ranged.push(path);
            }
        }
        marked.sort();
        ranged.sort();
        assert_eq!(marked, ranged);
        assert_eq!(ranged.len(), 9);
    }

    #[test]
    fn the_check_sections_are_the_fields_of_checks() {
        let schema = spec_schema().unwrap();
        let props: Vec<&String> = schema["properties"]["checks"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        let mut listed: Vec<&str> = rules::CHECK_SECTIONS.to_vec();
        listed.sort();
        let mut props: Vec<&str> = props.iter().map(|s| s.as_str()).collect();
        props.sort();
        assert_eq!(props, listed);
    }

    #[test]
    fn the_examples_are_valid() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
        for f in ["quick.yaml", "standard.yaml", "burn-in-24h.yaml"] {
            let text = std::fs::read_to_string(dir.join(f)).unwrap();
            let doc: Value = serde_saphyr::from_str(&text).unwrap();
            parse_spec(doc["spec"].clone()).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
    }

    #[test]
    fn defaults_are_filled_in_and_nulls_dropped() {
        let spec = check_spec(json!({
            "checks": {"memory": {"fraction": null, "passes": 2.0}, "compute": null},
            "deadline": null,
        }))
        .unwrap();
        assert_eq!(
            spec,
            json!({"checks": {"memory": {
                "fraction": 0.95,
                "passes": 2,
                "patterns": ["address", "movingInversions", "random"]
            }}})
        );
        let typed = parse_spec(json!({"checks": {"hostTransfer": {}}})).unwrap();
        let host = typed.checks.host_transfer.unwrap();
        assert!(host.pinned && host.pageable);
    }

    #[test]
    fn mistakes_name_the_field() {
        let cases = [
            (
                json!({"checks": {"memory": {"fraction": "abc"}}}),
                "checks.memory.fraction: must be of type number, not string",
            ),
            (
                json!({"checks": {"memory": {"passes": 1.5}}}),
                "checks.memory.passes: must be of type integer",
            ),
            (
                json!({"checks": {"memory": {"passes": 0}}}),
                "checks.memory.passes: invalid value 0: must be at least 1",
            ),
            (
                json!({"checks": {"memory": {"fraction": 0}}}),
                "checks.memory.fraction: invalid value 0: must be greater than 0",
            ),
            (
                json!({"checks": {"compute": {"matrixSize": 1000}}}),
                "checks.compute.matrixSize: invalid value 1000: must be a multiple of 256",
            ),
            (
                json!({"checks": {"compute": {"dtypes": ["fp8"]}}}),
                "checks.compute.dtypes[0]: unsupported value \"fp8\"",
            ),
            (
                json!({"checks": {"compute": {"dtypes": ["bf16", "bf16"]}}}),
                "checks.compute.dtypes[1]: duplicate value \"bf16\"",
            ),
            (
                json!({"checks": {"compute": {"duration": "1s"}}}),
                "checks.compute.duration: invalid value \"1s\": must be a duration from 10s to 168h",
            ),
            (
                json!({"checks": {"memory": {}, "gpuBurn": {}}}),
                "checks.gpuBurn: unknown field",
            ),
            (json!({"deadline": "1h"}), "checks: required value"),
            (
                json!({"checks": {}}),
                "checks: spec.checks must enable at least one of",
            ),
            (
                json!({"checks": {"compute": {"duration": "2h"}}}),
                "deadline: spec.deadline (default 1h) must be longer",
            ),
            (
                json!({"checks": {"memory": {}}, "nodeNames": ["a", "a"]}),
                "nodeNames[1]: duplicate value \"a\"",
            ),
            (
                json!({"checks": {"memory": {}}, "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}),
                "nodeSelector.matchExpressions[0].values: values must not be given",
            ),
            (
                json!({"checks": {"memory": {}}, "nodeSelector": {"matchLabels": {"a b": "x"}}}),
                "nodeSelector.matchLabels: invalid label key \"a b\"",
            ),
            (
                json!({"checks": {"memory": {}}, "severityOverrides": [{"code": "RowsRemaped", "severity": "Fail"}]}),
                "severityOverrides[0].code: unsupported value \"RowsRemaped\": supported values: \"GpuCountMismatch\"",
            ),
            (
                json!({"checks": {"memory": {}}, "severityOverrides": [{"code": "MeasurementMissing", "severity": "Info"}]}),
                "severityOverrides[0].code: unsupported value \"MeasurementMissing\"",
            ),
            (
                json!({"checks": {"memory": {}}, "severityOverrides": [{"code": "RowsRemapped", "severity": "Error"}]}),
                "severityOverrides[0].severity: unsupported value \"Error\"",
            ),
            (
                json!({"checks": {"memory": {}}, "severityOverrides": [{"code": "RowsRemapped", "severity": "Fail"}, {"code": "RowsRemapped", "severity": "Info"}]}),
                "severityOverrides[1]: duplicate entry {\"code\":\"RowsRemapped\"}",
            ),
            (
                json!({"checks": {"memory": {}}, "expect": {"pciBusIds": ["18:00"]}}),
                "expect.pciBusIds[0]: invalid value \"18:00\"",
            ),
            (
                json!({"checks": {"memory": {}}, "expect": {"eccMode": "Yes"}}),
                "expect.eccMode: unsupported value \"Yes\"",
            ),
            (
                json!({"checks": {"memory": {}}, "dra": {"selector": ""}}),
                "dra.selector: ",
            ),
        ];
        for (spec, want) in cases {
            let got = messages(spec.clone());
            assert!(
                got.iter().any(|m| m.starts_with(want)),
                "{spec}: {got:?} has no message starting {want:?}"
            );
        }
    }

    #[test]
    fn bare_metal_settings_have_no_deadline_to_outlast() {
        let long_burn = json!({"checks": {"compute": {"duration": "24h"}}});
        assert!(
            check_spec(long_burn.clone()).is_err(),
            "the API refuses it: default deadline 1h"
        );
        let spec = parse_settings(long_burn).unwrap();
        assert_eq!(spec.checks.compute.unwrap().duration.to_string(), "24h");
        let short = json!({"checks": {"compute": {"duration": "2h"}}, "deadline": "1h"});
        assert!(
            parse_settings(short).is_err(),
            "a deadline that is given still counts"
        );
        let checks = Checks {
            compute: Some(ComputeCheck {
                duration: "100h".parse().unwrap(),
                ..Default::default()
            }),
            ..Default::default()
        };
        check_settings(&checks, &Thresholds::default()).unwrap();
        let too_long = Checks {
            compute: Some(ComputeCheck {
                duration: "169h".parse().unwrap(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = check_settings(&too_long, &Thresholds::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("checks.compute.duration: invalid value \"169h\""),
            "{err}"
        );
    }

    #[test]
    fn rules_wait_until_the_types_are_right() {
        // A type mistake stops the rules, as on the API server: one message, not a cascade.
        let got =
            messages(json!({"checks": {"hostTransfer": {"pinned": "no", "pageable": false}}}));
        assert_eq!(
            got,
            vec!["checks.hostTransfer.pinned: must be of type boolean, not string"]
        );
    }
}
