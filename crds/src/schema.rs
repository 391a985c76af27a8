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

use crate::{GpuNodeResult, GpuValidation, GpuValidationSchedule};

/// The `GpuValidation` CRD.
pub fn gpu_validation_crd() -> CustomResourceDefinition {
    finish(GpuValidation::crd())
}

/// The `GpuNodeResult` CRD.
pub fn gpu_node_result_crd() -> CustomResourceDefinition {
    finish(GpuNodeResult::crd())
}

/// The `GpuValidationSchedule` CRD.
pub fn gpu_validation_schedule_crd() -> CustomResourceDefinition {
    finish(GpuValidationSchedule::crd())
}

/// The `GpuFabricRound` CRD.
pub fn gpu_fabric_round_crd() -> CustomResourceDefinition {
    finish(crate::fabric::GpuFabricRound::crd())
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

    /// Integer schemas under `schema` that keep a format, and those without both bounds.
    fn integers(
        schema: &serde_json::Value,
        formats: &mut Vec<String>,
        unbounded: &mut Vec<String>,
    ) {
        match schema {
            serde_json::Value::Object(m) => {
                if m.get("type").and_then(|t| t.as_str()) == Some("integer") {
                    if m.contains_key("format") {
                        formats.push(format!("{schema}"));
                    }
                    if !(m.contains_key("minimum") && m.contains_key("maximum")) {
                        unbounded.push(format!("{schema}"));
                    }
                }
                m.values().for_each(|v| integers(v, formats, unbounded));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| integers(v, formats, unbounded)),
            _ => {}
        }
    }

    #[test]
    fn no_category_shadows_a_resource_name() {
        // kubectl resolves a category before a short name: `gpuval` as both made
        // `kubectl get gpuval quick` ask for two kinds at once.
        let crds = [
            gpu_validation_crd(),
            gpu_node_result_crd(),
            gpu_validation_schedule_crd(),
        ];
        let mut names = Vec::new();
        for crd in &crds {
            let n = &crd.spec.names;
            names.push(n.plural.clone());
            names.extend(n.singular.clone());
            names.extend(n.short_names.clone().unwrap_or_default());
        }
        for crd in &crds {
            for category in crd.spec.names.categories.iter().flatten() {
                assert!(
                    !names.contains(category),
                    "category {category} is also a resource name"
                );
            }
        }
    }

    #[test]
    fn no_integer_keeps_a_format_and_every_spec_integer_is_bounded() {
        for crd in [
            gpu_validation_crd(),
            gpu_node_result_crd(),
            gpu_validation_schedule_crd(),
        ] {
            let json = serde_json::to_value(&crd).unwrap();
            let (mut formats, mut unbounded) = (Vec::new(), Vec::new());
            integers(&json, &mut formats, &mut unbounded);
            assert!(formats.is_empty(), "{formats:?}");
        }
        let crd = serde_json::to_value(gpu_validation_crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let (mut formats, mut unbounded) = (Vec::new(), Vec::new());
        integers(spec, &mut formats, &mut unbounded);
        assert!(
            unbounded.is_empty(),
            "spec integers without both bounds: {unbounded:?}"
        );
        // The raw generation does carry formats (so the finishing step is doing the work).
        let raw = serde_json::to_value(GpuValidation::crd()).unwrap();
        integers(&raw, &mut formats, &mut unbounded);
        assert!(!formats.is_empty());
    }
}
