//! Every committed copy of the CRD YAML (plain manifests, Helm chart) must be what the types
//! generate.

#[test]
fn committed_crd_yaml_is_up_to_date() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let generated = gpuval_crds::crds_yaml().expect("serialise CRDs");
    for rel in gpuval_crds::CRD_COPIES {
        let path = root.join(rel);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{} is stale: run `make crds` (crdgen --write) and commit the result",
            path.display()
        );
    }
}

#[test]
fn committed_attestation_schemas_are_up_to_date() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let generated = gpuval_crds::attestation::predicate_schemas().expect("serialise the schemas");
    for (rel, text) in gpuval_crds::attestation::SCHEMA_FILES.iter().zip(generated) {
        let path = root.join(rel);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == text,
            "{} is stale: run `make crds` (crdgen --write) and commit the result",
            path.display()
        );
        let schema: serde_json::Value = serde_json::from_str(&committed).expect("JSON");
        assert!(
            schema["$id"]
                .as_str()
                .is_some_and(|id| id.starts_with("https://gpuval.io/attestation/"))
        );
    }
}

#[test]
fn crds_carry_the_agreed_names_and_columns() {
    use kube::CustomResourceExt;
    let gv = gpuval_crds::GpuValidation::crd();
    assert_eq!(gv.spec.scope, "Cluster");
    assert_eq!(gv.spec.group, "gpuval.io");
    assert_eq!(
        gv.spec.names.short_names.as_deref(),
        Some(&["gpuval".to_string()][..])
    );
    let v = &gv.spec.versions[0];
    assert!(
        v.subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some(),
        "status subresource"
    );
    let cols: Vec<_> = v
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    for want in ["Phase", "Nodes", "Passed", "Failed", "Age"] {
        assert!(
            cols.contains(&want),
            "printer column {want} missing: {cols:?}"
        );
    }
    let result = gpuval_crds::GpuNodeResult::crd();
    assert_eq!(result.spec.scope, "Namespaced");
}
