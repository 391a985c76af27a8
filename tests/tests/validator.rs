//! The validator of bare-metal settings (`gpuval_crds::validate`, behind `gpuval-agent run
//! --config`) and the real API server decide alike: every bounded field of the generated schema
//! just outside and just inside its bounds, and the whole table of refused and accepted specs of
//! the API test.

use gpuval_crds::{
    Duration, GpuValidation,
    duration::DurationRange,
    validate::{self, SpecError},
};
use gpuval_tests::{ControlPlane, crds};
use kube::Client;
use serde_json::{Map, Value, json};

#[path = "api/cases.rs"]
mod cases;

/// A step into a schema: a named field, or the one element of a list.
#[derive(Clone, Debug)]
enum Step {
    Field(String),
    Item,
}

/// One value for one field, and whether it lies inside the field's bounds (`None`: inside the
/// bound probed, but the filler may break another rule of the field, so only agreement counts).
#[derive(Debug)]
struct Probe {
    path: Vec<Step>,
    value: Value,
    inside: Option<bool>,
}

fn path_text(path: &[Step]) -> String {
    let mut s = String::new();
    for step in path {
        match step {
            Step::Field(f) if s.is_empty() => s.push_str(f),
            Step::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            Step::Item => s.push_str("[0]"),
        }
    }
    s
}

fn num(schema: &Value, key: &str) -> Option<f64> {
    schema.get(key).and_then(Value::as_f64)
}

fn number_probes(schema: &Value, integer: bool, probe: &mut dyn FnMut(Value, Option<bool>)) {
    let step = if integer { 1.0 } else { 1e-6 };
    let as_json = |x: f64| if integer { json!(x as i64) } else { json!(x) };
    if let Some(min) = num(schema, "minimum") {
        if schema.get("exclusiveMinimum") == Some(&Value::Bool(true)) {
            probe(as_json(min), Some(false));
            probe(as_json(min + step), Some(true));
        } else {
            probe(as_json(min - step), Some(false));
            probe(as_json(min), Some(true));
        }
        if let Some(multiple) = num(schema, "multipleOf") {
            probe(as_json(min + multiple / 2.0), Some(false));
        }
    }
    if let Some(max) = num(schema, "maximum") {
        probe(as_json(max), Some(true));
        probe(as_json(max + step), Some(false));
    }
}

/// `len` characters of a value the field could hold.
fn filler(schema: &Value, len: usize) -> String {
    if duration_range(schema).is_some() {
        // "1m" groups, with one "10m" for an odd length.
        let head = if len % 2 == 1 { "10m" } else { "" };
        return format!("{head}{}", "1m".repeat((len - head.len()) / 2));
    }
    "a".repeat(len)
}

fn duration_range(schema: &Value) -> Option<DurationRange> {
    schema
        .get("x-kubernetes-validations")?
        .as_array()?
        .iter()
        .find_map(|r| DurationRange::from_rule(r.get("rule")?.as_str()?))
}

/// The `i`th distinct element a list of `items` could hold.
fn element(items: &Value, i: usize) -> Value {
    if let Some(choices) = items.get("enum").and_then(Value::as_array) {
        return choices[i % choices.len()].clone();
    }
    match items.get("type").and_then(Value::as_str) {
        Some("object") => json!({"key": format!("k{i}"), "operator": "Exists"}),
        _ => json!(format!("v{i}")),
    }
}

fn string_probes(schema: &Value, probe: &mut dyn FnMut(Value, Option<bool>)) {
    if let Some(max) = num(schema, "maxLength") {
        let max = max as usize;
        probe(json!(filler(schema, max)), None);
        probe(json!(filler(schema, max + 1)), Some(false));
    }
    if let Some(range) = duration_range(schema) {
        let ms = std::time::Duration::from_millis(1);
        let below = range.min.as_std().saturating_sub(ms);
        probe(json!(Duration::from_std(below).to_string()), Some(false));
        probe(json!(range.min.to_string()), Some(true));
        probe(json!(range.max.to_string()), Some(true));
        probe(
            json!(Duration::from_std(range.max.as_std() + ms).to_string()),
            Some(false),
        );
    }
}

fn count_probes(schema: &Value, probe: &mut dyn FnMut(Value, Option<bool>)) {
    let list = |n: usize| -> Value {
        let items = schema.get("items").unwrap_or(&Value::Null);
        Value::Array((0..n).map(|i| element(items, i)).collect())
    };
    let map = |n: usize| -> Value {
        Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect())
    };
    for (key, make, above) in [
        ("maxItems", &list as &dyn Fn(usize) -> Value, true),
        ("minItems", &list, false),
        ("maxProperties", &map, true),
    ] {
        if let Some(bound) = num(schema, key) {
            let bound = bound as usize;
            probe(make(bound), None);
            let outside = if above {
                bound + 1
            } else {
                bound.wrapping_sub(1)
            };
            if outside != usize::MAX {
                probe(make(outside), Some(false));
            }
        }
    }
}

/// Values just outside and just inside every bound of `schema` and everything under it.
fn probes(schema: &Value, path: Vec<Step>, out: &mut Vec<Probe>) {
    let mut probe = |value: Value, inside: Option<bool>| {
        out.push(Probe {
            path: path.clone(),
            value,
            inside,
        })
    };
    match schema.get("type").and_then(Value::as_str) {
        Some("integer") => number_probes(schema, true, &mut probe),
        Some("number") => number_probes(schema, false, &mut probe),
        Some("string") => string_probes(schema, &mut probe),
        Some("array") | Some("object") => count_probes(schema, &mut probe),
        _ => {}
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            let mut p = path.clone();
            p.push(Step::Field(name.clone()));
            probes(sub, p, out);
        }
    }
    if let Some(items) = schema.get("items") {
        let mut p = path.clone();
        p.push(Step::Item);
        probes(items, p, out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        let mut p = path.clone();
        p.push(Step::Field("k".into()));
        probes(values, p, out);
    }
}

/// The one element a list on the way to a probed field holds.
fn seed(list: &str) -> Value {
    match list {
        "matchExpressions" => json!({"key": "k", "operator": "In", "values": ["v"]}),
        "dtypes" => json!("bf16"),
        "env" => json!({"name": "NCCL_DEBUG", "value": "INFO"}),
        "severityOverrides" => json!({"code": "RowsRemapped", "severity": "Fail"}),
        "pciBusIds" => json!("0000:18:00.0"),
        _ => json!("v"),
    }
}

/// A valid spec (one memory check, a fabric test with both parts, the longest deadline so that
/// no burn outlasts it) with the probe's value at its path.
fn spec_with(probe: &Probe) -> Value {
    let mut spec = json!({
        "checks": {"memory": {}},
        "fabric": {"nccl": {"minBusBandwidthGbps": 350}, "tcp": {}},
        "deadline": "720h"
    });
    let mut at = &mut spec;
    let mut last_field = String::new();
    for (i, step) in probe.path.iter().enumerate() {
        let last = i + 1 == probe.path.len();
        let next: &mut Value = match step {
            Step::Field(f) => {
                last_field = f.clone();
                let map = at.as_object_mut().expect("an object on the way");
                map.entry(f.clone())
                    .or_insert_with(|| Value::Object(Map::new()))
            }
            Step::Item => {
                *at = Value::Array(vec![seed(&last_field)]);
                &mut at.as_array_mut().expect("just made")[0]
            }
        };
        if last {
            *next = probe.value.clone();
            break;
        }
        at = next;
    }
    // A field bounded by a sibling through a cross-field rule gets the sibling that lets its
    // own bounds decide.
    if let Some((_, sibling, value)) = COMPANIONS.iter().find(|(f, _, _)| *f == last_field) {
        let parent = probe.path[..probe.path.len() - 1]
            .iter()
            .try_fold(&mut spec, |v, step| match step {
                Step::Field(f) => v.get_mut(f.as_str()),
                Step::Item => v.get_mut(0),
            });
        if let Some(Value::Object(map)) = parent {
            map.entry(sibling.to_string()).or_insert(json!(value));
        }
    }
    spec
}

/// (field, sibling, value): `nccl.maxBytes` must not be below `minBytes` (default 8), so a probe
/// of maxBytes = 1 comes with minBytes = 1.
const COMPANIONS: [(&str, &str, i64); 1] = [("maxBytes", "minBytes", 1)];

async fn server_accepts(client: &Client, spec: &Value) -> Result<bool, String> {
    let body = json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "metadata": {"name": "probe"},
        "spec": spec,
    });
    let req = http::Request::post(
        "/apis/gpuval.io/v1alpha1/gpuvalidations?fieldValidation=Strict&dryRun=All",
    )
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).map_err(|e| e.to_string())?)
    .map_err(|e| e.to_string())?;
    match client.request::<GpuValidation>(req).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

fn validator_accepts(spec: &Value) -> Result<bool, String> {
    match validate::check_spec(spec.clone()) {
        Ok(_) => Ok(true),
        Err(SpecError::Invalid(_)) => Ok(false),
        Err(other) => Err(other.to_string()),
    }
}

#[tokio::test]
async fn the_validator_and_the_api_server_agree_at_every_bound() {
    let schema = validate::spec_schema().expect("schema");
    let mut all = Vec::new();
    probes(schema, Vec::new(), &mut all);
    let fields: std::collections::BTreeSet<String> =
        all.iter().map(|p| path_text(&p.path)).collect();
    assert!(fields.len() >= 35, "bounded fields found: {fields:?}");
    assert!(all.len() >= 120, "only {} probes", all.len());

    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::install_crds(&client).await.expect("CRDs");
    let (mut failures, mut accepted) = (Vec::new(), 0);
    for probe in &all {
        let spec = spec_with(probe);
        let server = server_accepts(&client, &spec).await.expect("API server");
        let ours = validator_accepts(&spec).expect("validator");
        let at = format!("{} = {}", path_text(&probe.path), short(&probe.value));
        if server != ours {
            failures.push(format!(
                "{at}: API server accepts: {server}, validator: {ours}"
            ));
        } else if probe.inside.is_some_and(|inside| inside != server) {
            failures.push(format!(
                "{at}: both {} it",
                if server { "accept" } else { "refuse" }
            ));
        }
        accepted += usize::from(server);
    }
    assert!(
        failures.is_empty(),
        "{} of {} probes:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    println!(
        "{} probes over {} bounded fields agree; {accepted} accepted: {fields:?}",
        all.len(),
        fields.len()
    );
    assert!(accepted >= all.len() / 3, "only {accepted} probes accepted");
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!("{}… ({} chars)", &s[..60], s.len())
    } else {
        s
    }
}

#[test]
fn the_validator_refuses_every_spec_the_api_server_refuses_naming_the_same_field() {
    let mut failures = Vec::new();
    let table = cases::invalid();
    for case in &table {
        match validate::check_spec(case.spec.clone()) {
            Ok(_) => failures.push(format!("{}: accepted", case.name)),
            Err(SpecError::Invalid(found)) => {
                if !found
                    .iter()
                    .any(|v| format!("spec.{}", v.path) == case.field)
                {
                    failures.push(format!(
                        "{}: no message at {}: {found:?}",
                        case.name, case.field
                    ));
                }
            }
            Err(other) => failures.push(format!("{}: {other}", case.name)),
        }
    }
    for (name, spec) in cases::valid() {
        if let Err(e) = validate::check_spec(spec) {
            failures.push(format!("{name}: refused: {e}"));
        }
    }
    println!(
        "{} refused and {} accepted specs agree",
        table.len(),
        cases::valid().len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        table.len(),
        failures.join("\n")
    );
}
