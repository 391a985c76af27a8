//! The gpuval.io API on a real kube-apiserver: CRDs install, examples are accepted, bad specs
//! are rejected server-side with a message naming the field, and the status subresource works.

use gpuval_crds::{
    GpuValidation, GpuValidationStatus, NodeStatus, NodeVerdict, Phase, Summary, conditions,
};
use gpuval_tests::{ControlPlane, crds};
use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, ValidationDirective},
};
use serde_json::{Value, json};

async fn control_plane_with_crds() -> (ControlPlane, Client) {
    let cp = ControlPlane::start().await.expect("control plane");
    let client = cp.client().await.expect("client");
    crds::install_crds(&client).await.expect("install CRDs");
    (cp, client)
}

fn strict_apply() -> PatchParams {
    let mut pp = PatchParams::apply("gpuval-tests");
    pp.field_validation = Some(ValidationDirective::Strict);
    pp
}

async fn apply_validation(
    api: &Api<GpuValidation>,
    name: &str,
    spec: Value,
) -> Result<GpuValidation, kube::Error> {
    let obj = json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "metadata": {"name": name},
        "spec": spec,
    });
    api.patch(name, &strict_apply(), &Patch::Apply(&obj)).await
}

#[tokio::test]
async fn crds_install_and_become_established() {
    let (_cp, client) = control_plane_with_crds().await;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    for name in ["gpuvalidations.gpuval.io", "gpunoderesults.gpuval.io"] {
        let crd = api.get(name).await.expect(name);
        let conds = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            "{name} not Established: {conds:?}"
        );
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "NamesAccepted" && c.status == "True"),
            "{name} names not accepted"
        );
    }
    let gv = api.get("gpuvalidations.gpuval.io").await.unwrap();
    assert_eq!(
        gv.spec.scope, "Cluster",
        "GpuValidation must be cluster-scoped"
    );
    assert_eq!(gv.spec.names.short_names, Some(vec!["gpuval".to_string()]));
}

#[tokio::test]
async fn every_example_is_accepted_and_defaults_are_applied() {
    let (_cp, client) = control_plane_with_crds().await;
    let api: Api<GpuValidation> = Api::all(client);
    let dir = crds::repo_root().join("deploy/examples");
    let mut seen = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("deploy/examples")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        for doc in crds::read_yaml_documents(&path).unwrap() {
            if doc["kind"] != "GpuValidation" {
                continue;
            }
            let name = doc["metadata"]["name"]
                .as_str()
                .expect("example has a name")
                .to_string();
            let stored = api
                .patch(&name, &strict_apply(), &Patch::Apply(&doc))
                .await
                .unwrap_or_else(|e| panic!("{} ({name}) rejected: {e}", path.display()));
            // The server applied the schema defaults and our types read the stored object back.
            if let Some(compute) = &stored.spec.checks.compute {
                assert!(compute.matrix_size >= 256, "{name}: matrixSize defaulted");
                assert!(!compute.dtypes.is_empty());
            }
            if let Some(memory) = &stored.spec.checks.memory {
                assert!(memory.fraction > 0.0 && memory.fraction <= 1.0);
                assert!(
                    memory.passes >= 1,
                    "{name}: passes defaulted to {}",
                    memory.passes
                );
            }
            seen += 1;
        }
    }
    assert!(
        seen >= 3,
        "expected the quick, standard and burn-in examples, found {seen}"
    );
}

/// Each case: a name, a spec, and text the API server's message must contain (the field).
fn invalid_specs() -> Vec<(&'static str, Value, &'static str)> {
    let ok_checks = json!({"memory": {}});
    vec![
        (
            "negative-deadline",
            json!({"checks": ok_checks, "deadline": "-5m"}),
            "spec.deadline",
        ),
        (
            "prose-deadline",
            json!({"checks": ok_checks, "deadline": "5 minutes"}),
            "spec.deadline",
        ),
        (
            "deadline-unit-missing",
            json!({"checks": ok_checks, "deadline": "300"}),
            "spec.deadline",
        ),
        (
            "deadline-too-short",
            json!({"checks": ok_checks, "deadline": "10s"}),
            "spec.deadline",
        ),
        (
            "burn-duration-garbage",
            json!({"checks": {"compute": {"duration": "abc"}}}),
            "spec.checks.compute.duration",
        ),
        (
            "burn-duration-too-short",
            json!({"checks": {"compute": {"duration": "5s"}}}),
            "spec.checks.compute.duration",
        ),
        (
            "burn-duration-days",
            json!({"checks": {"compute": {"duration": "2d"}}}),
            "spec.checks.compute.duration",
        ),
        (
            "memory-fraction-zero",
            json!({"checks": {"memory": {"fraction": 0}}}),
            "spec.checks.memory.fraction",
        ),
        (
            "memory-fraction-above-one",
            json!({"checks": {"memory": {"fraction": 1.5}}}),
            "spec.checks.memory.fraction",
        ),
        (
            "memory-fraction-negative",
            json!({"checks": {"memory": {"fraction": -0.1}}}),
            "spec.checks.memory.fraction",
        ),
        (
            "memory-passes-zero",
            json!({"checks": {"memory": {"passes": 0}}}),
            "spec.checks.memory.passes",
        ),
        (
            "unknown-check",
            json!({"checks": {"memory": {}, "gpuBurn": {}}}),
            "spec.checks.gpuBurn",
        ),
        (
            "unknown-dtype",
            json!({"checks": {"compute": {"dtypes": ["fp8"]}}}),
            "spec.checks.compute.dtypes[0]",
        ),
        (
            "duplicate-dtype",
            json!({"checks": {"compute": {"dtypes": ["bf16", "bf16"]}}}),
            "spec.checks.compute.dtypes[1]",
        ),
        (
            "no-dtypes",
            json!({"checks": {"compute": {"dtypes": []}}}),
            "spec.checks.compute.dtypes",
        ),
        (
            "matrix-not-multiple",
            json!({"checks": {"compute": {"matrixSize": 1000}}}),
            "spec.checks.compute.matrixSize",
        ),
        (
            "matrix-too-small",
            json!({"checks": {"compute": {"matrixSize": 128}}}),
            "spec.checks.compute.matrixSize",
        ),
        (
            "tflops-negative",
            json!({"checks": {"compute": {"minTflops": {"bf16": -5}}}}),
            "spec.checks.compute.minTflops.bf16",
        ),
        (
            "empty-node-name",
            json!({"checks": ok_checks, "nodeNames": [""]}),
            "spec.nodeNames",
        ),
        (
            "bad-node-name",
            json!({"checks": ok_checks, "nodeNames": ["Bad_Name"]}),
            "spec.nodeNames[0]",
        ),
        ("no-checks-enabled", json!({"checks": {}}), "spec.checks"),
        ("checks-missing", json!({"deadline": "1h"}), "spec.checks"),
        (
            "p2p-bidirectional-below-unidirectional",
            json!({"checks": {"p2p": {"minUnidirectionalGbps": 300, "minBidirectionalGbps": 200}}}),
            "spec.checks.p2p.minBidirectionalGbps",
        ),
        (
            "host-transfer-nothing-to-measure",
            json!({"checks": {"hostTransfer": {"pinned": false, "pageable": false}}}),
            "spec.checks.hostTransfer",
        ),
        (
            "deadline-shorter-than-burn",
            json!({"checks": {"compute": {"duration": "10m"}}, "deadline": "5m"}),
            "spec.deadline",
        ),
        (
            "io-during-compute-without-compute",
            json!({"checks": {"io": {"duringCompute": true}}}),
            "spec.checks.io.duringCompute",
        ),
        (
            "io-concurrency-zero",
            json!({"checks": {"io": {"concurrency": 0}}}),
            "spec.checks.io.concurrency",
        ),
        (
            "relative-tolerance-zero",
            json!({"checks": ok_checks, "thresholds": {"relativeTolerancePercent": 0}}),
            "spec.thresholds.relativeTolerancePercent",
        ),
        (
            "unknown-profile",
            json!({"checks": ok_checks, "thresholds": {"profile": "B300"}}),
            "spec.thresholds.profile",
        ),
        (
            "unknown-node-action",
            json!({"checks": ok_checks, "onFailure": {"action": "Reboot"}}),
            "spec.onFailure.action",
        ),
        (
            "resample-zero",
            json!({"checks": {"topology": {"resampleInterval": "0s"}}}),
            "spec.checks.topology.resampleInterval",
        ),
    ]
}

/// Creates a validation the way `kubectl create`/`kubectl apply` do: POST with strict field
/// validation, so unknown fields are errors rather than silently pruned.
async fn create_strict(
    client: &Client,
    name: &str,
    spec: &Value,
) -> Result<GpuValidation, kube::Error> {
    let body = json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "metadata": {"name": name},
        "spec": spec,
    });
    let req = http::Request::post(
        "/apis/gpuval.io/v1alpha1/gpuvalidations?fieldValidation=Strict&fieldManager=gpuval-tests",
    )
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&body).expect("serialise"))
    .expect("build request");
    client.request::<GpuValidation>(req).await
}

#[tokio::test]
async fn invalid_specs_are_rejected_by_the_api_server_naming_the_field() {
    let (_cp, client) = control_plane_with_crds().await;
    let api: Api<GpuValidation> = Api::all(client.clone());
    let cases = invalid_specs();
    assert!(cases.len() >= 20);
    // The table must be able to fail: a valid spec goes through the same path.
    create_strict(&client, "control-case", &json!({"checks": {"memory": {}}}))
        .await
        .expect("valid spec accepted");
    api.delete("control-case", &Default::default())
        .await
        .unwrap();
    let mut failures = Vec::new();
    for (name, spec, field) in &cases {
        match create_strict(&client, name, spec).await {
            Ok(_) => failures.push(format!(
                "{name}: accepted, expected a rejection naming {field}"
            )),
            Err(kube::Error::Api(status)) => {
                if !status.message.contains(field) {
                    failures.push(format!(
                        "{name}: message does not name {field}: {}",
                        status.message
                    ));
                } else if status.code != 422 && status.code != 400 {
                    failures.push(format!(
                        "{name}: HTTP {} (expected 422/400): {}",
                        status.code, status.message
                    ));
                }
            }
            Err(other) => failures.push(format!("{name}: unexpected client error {other}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // And nothing was stored.
    assert!(
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn status_subresource_round_trips_and_does_not_touch_spec() {
    let (_cp, client) = control_plane_with_crds().await;
    let api: Api<GpuValidation> = Api::all(client);
    let created = apply_validation(
        &api,
        "roundtrip",
        json!({"checks": {"memory": {"fraction": 0.5}}}),
    )
    .await
    .unwrap();
    let generation = created.metadata.generation;

    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_790_000_000).unwrap());
    let mut status = GpuValidationStatus {
        observed_generation: generation,
        phase: Some(Phase::Running),
        start_time: Some(now.clone()),
        summary: Some(Summary {
            selected: 2,
            pending: 0,
            running: 1,
            passed: 1,
            failed: 0,
        }),
        nodes: vec![
            NodeStatus {
                name: "gpu-a".into(),
                verdict: NodeVerdict::Passed,
                gpus: 8,
                message: None,
                result: Some("roundtrip-gpu-a".into()),
            },
            NodeStatus {
                name: "gpu-b".into(),
                verdict: NodeVerdict::Running,
                gpus: 8,
                message: Some("memory check running".into()),
                result: None,
            },
        ],
        ..Default::default()
    };
    conditions::set_condition(
        &mut status.conditions,
        conditions::READY,
        false,
        "Running",
        "1/2 nodes done",
        generation,
        &now,
    );
    conditions::set_condition(
        &mut status.conditions,
        conditions::RECONCILING,
        true,
        "Running",
        "1/2 nodes done",
        generation,
        &now,
    );

    let body = json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "status": status,
        // A status write must not be able to change the spec.
        "spec": {"checks": {"memory": {"fraction": 0.9}}},
    });
    api.patch_status(
        "roundtrip",
        &PatchParams::apply("gpuval-tests-status").force(),
        &Patch::Apply(&body),
    )
    .await
    .expect("status apply");

    let back = api.get("roundtrip").await.unwrap();
    assert_eq!(
        back.status.as_ref(),
        Some(&status),
        "status read back differs"
    );
    assert_eq!(
        back.spec.checks.memory.as_ref().unwrap().fraction,
        0.5,
        "spec changed through /status"
    );
    assert_eq!(
        back.metadata.generation, generation,
        "status write bumped the generation"
    );

    // A spec change bumps the generation and leaves the status alone.
    let changed = apply_validation(
        &api,
        "roundtrip",
        json!({"checks": {"memory": {"fraction": 0.7}}}),
    )
    .await
    .unwrap();
    assert_eq!(changed.metadata.generation, generation.map(|g| g + 1));
    assert_eq!(changed.status.as_ref(), Some(&status));
}
