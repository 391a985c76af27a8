//! The CRDs as committed: what `kube` generates from the types, finished in one place.
//!
//! The one finishing step: integer fields lose their `format` (`int32`, `int64`). Every integer
//! field has its own `minimum`/`maximum` inside the range of its Rust type, and the API server's
//! format check adds a second, path-less line (`<nil>: ... must be of type integer with format
//! int32`) to the bound's own message when a value overflows.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::CustomResourceExt;

use crate::{GpuNodeResult, GpuValidation};

/// The `GpuValidation` CRD.
pub fn gpu_validation_crd() -> CustomResourceDefinition {
    finish(GpuValidation::crd())
}

/// The `GpuNodeResult` CRD.
pub fn gpu_node_result_crd() -> CustomResourceDefinition {
    finish(GpuNodeResult::crd())
}

fn finish(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            drop_integer_formats(schema);
        }
    }
    crd
}

fn drop_integer_formats(schema: &mut JSONSchemaProps) {
    if schema.type_.as_deref() == Some("integer") {
        schema.format = None;
    }
    for sub in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        drop_integer_formats(sub);
    }
    if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(items)) =
        schema.items.as_mut()
    {
        drop_integer_formats(items);
    }
    if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(extra)) =
        schema.additional_properties.as_mut()
    {
        drop_integer_formats(extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formats(schema: &serde_json::Value, out: &mut Vec<String>) {
        match schema {
            serde_json::Value::Object(m) => {
                if m.get("type").and_then(|t| t.as_str()) == Some("integer")
                    && m.contains_key("format")
                {
                    out.push(format!("{schema}"));
                }
                m.values().for_each(|v| formats(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| formats(v, out)),
            _ => {}
        }
    }

    #[test]
    fn no_integer_keeps_a_format_and_every_spec_integer_is_bounded() {
        for crd in [gpu_validation_crd(), gpu_node_result_crd()] {
            let json = serde_json::to_value(&crd).unwrap();
            let mut found = Vec::new();
            formats(&json, &mut found);
            assert!(found.is_empty(), "{found:?}");
        }
        // The raw generation does carry them (so the finishing step is doing the work).
        let raw = serde_json::to_value(GpuValidation::crd()).unwrap();
        let mut found = Vec::new();
        formats(&raw, &mut found);
        assert!(!found.is_empty());
    }
}
