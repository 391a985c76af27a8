//! The schema of `spec.nodeSelector`: a standard `metav1.LabelSelector` on the wire, checked the
//! way the API server checks the selectors of built-in kinds (`ValidateLabelSelector`): label
//! keys and values by Kubernetes' syntax, the operator one of four, `In`/`NotIn` with values,
//! `Exists`/`DoesNotExist` without; and bounded in size so that every valid spec fits in one
//! stored object.

use schemars::{Schema, SchemaGenerator, json_schema};

use crate::{names, rules};

/// The most `matchLabels` entries a selector may have.
pub const MAX_MATCH_LABELS: usize = 64;
/// The most `matchExpressions` a selector may have.
pub const MAX_MATCH_EXPRESSIONS: usize = 64;
pub use crate::rules::MAX_SELECTOR_VALUES;

/// The operators of a label selector requirement.
pub const OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

fn rule_json(rule: rules::CelRule) -> serde_json::Value {
    serde_json::to_value(kube::core::Rule::from(rule)).expect("a rule serialises to JSON")
}

/// The schema of one label value (in `matchLabels` and in a requirement's `values`).
fn label_value() -> serde_json::Value {
    serde_json::json!({
        "type": "string",
        "maxLength": names::LABEL_VALUE_MAX,
        "pattern": names::LABEL_VALUE_PATTERN,
    })
}

fn requirement() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "description": "One requirement: a label key, an operator, and the values it compares with.",
        "required": ["key", "operator"],
        "properties": {
            "key": {
                "type": "string",
                "description": "The label key the requirement is about.",
                "maxLength": names::LABEL_KEY_MAX,
                "x-kubernetes-validations": [rule_json(rules::requirement_key())],
            },
            "operator": {
                "type": "string",
                "description": "In, NotIn (both need values), Exists or DoesNotExist (both take none).",
                "enum": OPERATORS,
            },
            "values": {
                "type": "array",
                "description": "The label values; non-empty for In and NotIn, absent for Exists and DoesNotExist.",
                "maxItems": MAX_SELECTOR_VALUES,
                "items": label_value(),
            },
        },
        "x-kubernetes-validations": [
            rule_json(rules::requirement_needs_values()),
            rule_json(rules::requirement_takes_no_values()),
        ],
    })
}

/// The schema of an optional label selector field (`schema_with` on `Option<LabelSelector>`).
pub fn schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "description": "Nodes to validate, by label. With neither nodeSelector nor nodeNames, every node that advertises allocatable `nvidia.com/gpu` is selected.",
        "x-kubernetes-map-type": "atomic",
        "properties": {
            "matchLabels": {
                "type": "object",
                "description": "Labels a node must carry, each with exactly this value.",
                "maxProperties": MAX_MATCH_LABELS,
                "additionalProperties": label_value(),
                "x-kubernetes-validations": [rule_json(rules::match_labels_keys())],
            },
            "matchExpressions": {
                "type": "array",
                "description": "Requirements a node's labels must all meet.",
                "maxItems": MAX_MATCH_EXPRESSIONS,
                "items": requirement(),
            },
        },
        "x-kubernetes-validations": [rule_json(rules::selector_values_total())],
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    #[test]
    fn the_wire_form_stays_a_standard_label_selector() {
        let selector = LabelSelector {
            match_labels: Some([("nvidia.com/gpu.present".into(), "true".into())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "zone".into(),
                operator: "In".into(),
                values: Some(vec!["a".into()]),
            }]),
        };
        let json = serde_json::to_value(&selector).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "matchLabels": {"nvidia.com/gpu.present": "true"},
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
            })
        );
    }

    #[test]
    fn every_selector_part_is_bounded() {
        let schema = super::schema(&mut schemars::SchemaGenerator::default());
        let s = schema.as_value();
        assert_eq!(s["properties"]["matchLabels"]["maxProperties"], 64);
        assert_eq!(s["properties"]["matchExpressions"]["maxItems"], 64);
        let req = &s["properties"]["matchExpressions"]["items"];
        assert_eq!(req["properties"]["key"]["maxLength"], 317);
        assert_eq!(req["properties"]["values"]["items"]["maxLength"], 63);
        assert_eq!(
            req["x-kubernetes-validations"].as_array().map(Vec::len),
            Some(2)
        );
    }
}
