//! The gpuval.io API on a real kube-apiserver: CRDs install, examples are accepted, bad specs
//! are rejected server-side with a message naming the field, and the status subresource works.

use gpuval_crds::{
    GpuValidation, GpuValidationStatus, NodeStatus, NodeVerdict, Phase, ReasonCount, Summary,
    conditions,
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

#[path = "api/cases.rs"]
mod cases;

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
    for path in crds::sorted_entries(&dir) {
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        // Each example says whether `make demo`'s cluster runs it, and a file of one
        // validation is named for it (`kubectl get gpuval standard` after applying standard.yaml).
        let text = std::fs::read_to_string(&path).expect("read example");
        assert!(
            text.lines().any(|l| l.starts_with("# make demo: ")),
            "{} does not say whether make demo runs it",
            path.display()
        );
        let docs = crds::read_yaml_documents(&path).unwrap();
        if let [only] = docs.as_slice()
            && only["kind"] == "GpuValidation"
        {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            assert_eq!(only["metadata"]["name"], stem, "{}", path.display());
        }
        for doc in docs {
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

/// The API server's own path-less (`<nil>`) lines, which come only beside a mistake's own
/// message: the note that it skipped the schema's rules because of a type, enum, required,
/// length or count mistake, and the echo of its integer format check when an integer field gets
/// a fraction. Any other `<nil>` is a message that fails to name its field.
const PATHLESS_NOTES: [&str; 2] = [
    "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid",
    "<nil>: Invalid value: \"\": Checked value must be of type integer",
];

fn has_unexplained_nil(msg: &str) -> bool {
    msg.match_indices("<nil>")
        .any(|(i, _)| !PATHLESS_NOTES.iter().any(|note| msg[i..].starts_with(note)))
}

/// What is wrong with the API server's answer to a spec that must be refused.
fn judge_refusal(case: &cases::Bad, outcome: Result<GpuValidation, kube::Error>) -> Option<String> {
    let name = &case.name;
    let status = match outcome {
        Ok(_) => {
            return Some(format!(
                "{name}: accepted, expected a refusal naming {}",
                case.field
            ));
        }
        Err(kube::Error::Api(status)) => status,
        Err(other) => return Some(format!("{name}: unexpected client error {other}")),
    };
    let msg = &status.message;
    if !msg.contains(&case.field) {
        return Some(format!(
            "{name}: message does not name {}: {msg}",
            case.field
        ));
    }
    if status.code != 422 && status.code != 400 {
        return Some(format!(
            "{name}: HTTP {} (expected 422/400): {msg}",
            status.code
        ));
    }
    if has_unexplained_nil(msg) {
        return Some(format!("{name}: a message without a field path: {msg}"));
    }
    let several = msg.contains("is invalid: [");
    if case.single && several {
        return Some(format!("{name}: one mistake, several messages: {msg}"));
    }
    None
}

#[tokio::test]
async fn invalid_specs_are_rejected_by_the_api_server_naming_the_field() {
    let (_cp, client) = control_plane_with_crds().await;
    let api: Api<GpuValidation> = Api::all(client.clone());
    let cases = cases::invalid();
    assert!(cases.len() >= 80, "only {} invalid specs", cases.len());
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "case names repeat");
    // The table must be able to fail: a valid spec goes through the same path.
    create_strict(&client, "control-case", &json!({"checks": {"memory": {}}}))
        .await
        .expect("valid spec accepted");
    api.delete("control-case", &Default::default())
        .await
        .unwrap();
    let mut failures = Vec::new();
    for case in &cases {
        let outcome = create_strict(&client, &case.name.to_lowercase(), &case.spec).await;
        failures.extend(judge_refusal(case, outcome));
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
async fn edge_cases_inside_every_bound_are_accepted() {
    let (_cp, client) = control_plane_with_crds().await;
    let cases = cases::valid();
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for (name, spec) in &cases {
        match create_strict(&client, &name.to_lowercase(), spec).await {
            Ok(stored) => {
                // What the server stored reads back as the API types.
                let stored = serde_json::to_value(&stored.spec).expect("serialise");
                if stored.get("checks").is_none() {
                    failures.push(format!("{name}: stored without checks: {stored}"));
                }
            }
            Err(e) => failures.push(format!("{name}: refused: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Node names summing to `total` characters, each a valid name of at most 253.
fn node_names_totalling(total: usize) -> Vec<String> {
    let mut names = Vec::new();
    let mut left = total;
    while left > 0 {
        let len = left.min(253);
        let head = format!("n{}", names.len());
        names.push(format!(
            "{head}{}",
            "x".repeat(len.saturating_sub(head.len()))
        ));
        left -= len;
    }
    names
}

/// A label key of the longest form: a 253-character prefix, `/`, a 63-character name.
fn longest_key(i: usize) -> String {
    let prefix = format!("p{i:03}{}.{}", "a".repeat(122), "b".repeat(126));
    format!("{prefix}/{}", "n".repeat(63))
}

#[tokio::test]
async fn a_spec_at_every_size_bound_is_stored_and_a_larger_one_is_refused_naming_the_size() {
    let (_cp, client) = control_plane_with_crds().await;
    let api: Api<GpuValidation> = Api::all(client.clone());
    use gpuval_crds::{rules::MAX_NODE_NAMES_CHARS, selector};
    let labels: serde_json::Map<String, Value> = (0..selector::MAX_MATCH_LABELS)
        .map(|i| (longest_key(i), json!("v".repeat(63))))
        .collect();
    let per_expression = selector::MAX_SELECTOR_VALUES / selector::MAX_MATCH_EXPRESSIONS;
    let expressions: Vec<Value> = (0..selector::MAX_MATCH_EXPRESSIONS)
        .map(|i| {
            let values: Vec<String> = (0..per_expression)
                .map(|j| format!("{i:02}{j:02}{}", "v".repeat(59)))
                .collect();
            json!({"key": longest_key(100 + i), "operator": "NotIn", "values": values})
        })
        .collect();
    let largest = json!({
        "checks": {"memory": {}},
        "nodeNames": node_names_totalling(MAX_NODE_NAMES_CHARS),
        "nodeSelector": {"matchLabels": labels, "matchExpressions": expressions},
    });
    // Stored for real (etcd's request limit applies to writes), applied server-side so that the
    // managed-fields record lists every node name again, with the most annotations allowed.
    let obj = json!({
        "apiVersion": "gpuval.io/v1alpha1",
        "kind": "GpuValidation",
        "metadata": {"name": "largest", "annotations": {"note": "z".repeat(256 * 1024 - 16)}},
        "spec": largest,
    });
    let stored = api
        .patch("largest", &strict_apply(), &Patch::Apply(&obj))
        .await
        .expect("the largest valid spec is stored");
    let size = serde_json::to_vec(&stored).expect("serialise").len();
    assert!(
        size > 700 * 1024,
        "the largest spec should be large: {size} bytes"
    );
    api.delete("largest", &Default::default()).await.unwrap();

    // Over a bound: refused by the schema, naming the bound. 2 MiB of names are too many names;
    // 1.2 MiB in as many names as allowed are too many characters.
    for (total, bound) in [
        (2 * 1024 * 1024, "must have at most 5000 items"),
        (5000 * 253, "262144 characters"),
    ] {
        let over = json!({"checks": {"memory": {}}, "nodeNames": node_names_totalling(total)});
        let err = create_strict(&client, "over", &over)
            .await
            .expect_err("refused");
        let msg = err.to_string();
        assert!(
            msg.contains("spec.nodeNames") && msg.contains(bound),
            "{total}: {msg}"
        );
    }
    // Over the API server's request limit: refused before decoding, naming the limit.
    let huge = json!({
        "checks": {"memory": {}},
        "nodeNames": node_names_totalling(4 * 1024 * 1024),
    });
    let err = create_strict(&client, "four-mib", &huge)
        .await
        .expect_err("4 MiB refused");
    let msg = err.to_string();
    assert!(msg.contains("3145728"), "{msg}");
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
            selected: 60,
            pending: 0,
            running: 1,
            passed: 1,
            failed: 58,
            reasons: vec![ReasonCount {
                reason: "Error: agent pod failed".into(),
                count: 58,
            }],
        }),
        nodes_not_listed: 9,
        nodes: vec![
            NodeStatus {
                name: "gpu-a".into(),
                verdict: NodeVerdict::Passed,
                gpus: 8,
                message: None,
                result: Some("roundtrip-gpu-a".into()),
                codes: None,
                action: None,
                evidence: Some(gpuval_crds::Evidence::Hardware),
            },
            NodeStatus {
                name: "gpu-b".into(),
                verdict: NodeVerdict::Running,
                gpus: 8,
                message: Some("memory check running".into()),
                result: None,
                codes: Some("MemoryMismatch".into()),
                action: Some(gpuval_crds::Action::ReplaceHardware),
                evidence: None,
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
