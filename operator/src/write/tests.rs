//! The writers against a recorded API: what each asks the API server, and what it does with
//! each answer.

use gpuval_crds::{FabricRoundSpec, GpuValidation, GpuValidationStatus, Phase};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::recorded::{self, Call, status};
use super::{claims, events, fabric, pods};
use crate::context::Error;
use crate::decide::reconcile::{PlannedEvent, Related};

fn gv() -> GpuValidation {
    let mut g = GpuValidation::new("acceptance", crate::decide::selection::tests::spec());
    g.metadata.generation = Some(3);
    g.metadata.uid = Some("uid-1".into());
    g
}

fn created() -> recorded::Reply {
    (201, json!({}))
}

fn method_and_path(c: &Call) -> (String, String) {
    let path = c.path.split('?').next().unwrap_or_default().to_string();
    (c.method.clone(), path)
}

#[tokio::test]
async fn the_status_is_a_forced_server_side_apply_of_the_status_alone() {
    let written = serde_json::to_value(gv()).expect("json");
    let (client, log) = recorded::client(vec![(200, written)]);
    let ctx = recorded::ctx(client);
    let status_ = GpuValidationStatus {
        phase: Some(Phase::Running),
        ..Default::default()
    };
    super::status::write::<GpuValidation>("acceptance", &ctx, &status_)
        .await
        .expect("written");
    let calls = log.calls();
    assert_eq!(calls.len(), 1);
    let c = &calls[0];
    assert_eq!(
        method_and_path(c),
        (
            "PATCH".into(),
            "/apis/gpuval.io/v1alpha1/gpuvalidations/acceptance/status".into()
        )
    );
    assert!(
        c.path.contains("fieldManager=gpuval-operator"),
        "{}",
        c.path
    );
    assert!(c.path.contains("force=true"), "{}", c.path);
    assert_eq!(c.content_type, "application/apply-patch+yaml");
    assert_eq!(c.body["kind"], "GpuValidation");
    assert_eq!(c.body["status"]["phase"], "Running");
    assert!(c.body.get("spec").is_none(), "{}", c.body);
}

#[tokio::test]
async fn an_event_the_api_refuses_is_logged_and_the_next_is_still_published() {
    let (client, log) = recorded::client(vec![
        status(500, "InternalError", "etcd is down"),
        created(),
    ]);
    let ctx = recorded::ctx(client);
    let planned = |reason| PlannedEvent::new(reason == "Failed", reason, format!("{reason} note"));
    events::publish(&gv(), &ctx, &[planned("Failed"), planned("Passed")]).await;
    let calls = log.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    for (c, (kind, reason)) in calls
        .iter()
        .zip([("Warning", "Failed"), ("Normal", "Passed")])
    {
        assert_eq!(c.method, "POST");
        assert!(
            c.path.starts_with("/apis/events.k8s.io/v1/namespaces/"),
            "{}",
            c.path
        );
        assert_eq!(c.body["type"], kind);
        assert_eq!(c.body["reason"], reason);
        assert_eq!(c.body["regarding"]["name"], "acceptance");
    }
}

#[tokio::test]
async fn each_node_gets_its_own_event_and_only_its_own_repeats_are_counted() {
    let (client, log) = recorded::client(vec![created(), created(), created(), created()]);
    let ctx = recorded::ctx(client);
    let admitted = |node: &str, run: &str| {
        PlannedEvent::new(false, "NodeAdmitted", format!("{node} passed {run}"))
            .about(Related::Node(node.into()))
    };
    let started = |run: &str| {
        PlannedEvent::new(false, "AdmissionStarted", format!("started {run}"))
            .about(Related::Run(run.into()))
    };
    let events = [
        admitted("fab-0", "gate-admit-1"),
        admitted("fab-1", "gate-admit-1"),
        started("gate-admit-2"),
        started("gate-admit-3"),
        admitted("fab-1", "gate-admit-1"),
    ];
    events::publish(&gv(), &ctx, &events).await;
    let calls = log.calls();
    let methods: Vec<&str> = calls.iter().map(|c| c.method.as_str()).collect();
    assert_eq!(
        methods,
        ["POST", "POST", "POST", "POST", "PATCH"],
        "a new event per node and per run; a node's repeat is counted in its own"
    );
    let notes: Vec<&str> = calls[..4]
        .iter()
        .filter_map(|c| c.body["note"].as_str())
        .collect();
    assert_eq!(
        notes,
        [
            "fab-0 passed gate-admit-1",
            "fab-1 passed gate-admit-1",
            "started gate-admit-2",
            "started gate-admit-3"
        ]
    );
    assert_eq!(calls[0].body["related"]["kind"], "Node");
    assert_eq!(calls[0].body["related"]["name"], "fab-0");
    assert_eq!(calls[2].body["related"]["kind"], "GpuValidation");
    assert_eq!(calls[4].body["related"]["name"], "fab-1");
    assert_eq!(calls[4].body["series"]["count"], 2);
}

#[tokio::test]
async fn a_round_that_exists_already_is_no_error_and_another_refusal_is() {
    let spec = FabricRoundSpec {
        validation: "acceptance".into(),
        generation: 3,
        round: 1,
        purpose: "all-node".into(),
        started: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
        timeout_seconds: 60,
        end: false,
        groups: Vec::new(),
        shard: 0,
        shards: 1,
    };
    let (client, log) = recorded::client(vec![
        status(409, "AlreadyExists", "exists"),
        status(403, "Forbidden", "no"),
    ]);
    let ctx = recorded::ctx(client);
    fabric::create_round(&gv(), &ctx, &spec)
        .await
        .expect("a retried step plans the same round");
    let refused = fabric::create_round(&gv(), &ctx, &spec).await;
    assert!(matches!(refused, Err(Error::Kube(_))), "{refused:?}");
    let calls = log.calls();
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|c| {
        c.method == "POST"
            && c.path
                .starts_with("/apis/gpuval.io/v1alpha1/namespaces/gpuval-system/gpufabricrounds")
    }));
    assert_eq!(
        calls[0].body["metadata"]["ownerReferences"][0]["uid"],
        "uid-1"
    );
}

#[tokio::test]
async fn an_earlier_validations_key_is_deleted_and_the_step_tried_again() {
    let name = crate::decide::fabric_key::secret_name("acceptance");
    let earlier = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "gpuval-system",
            "ownerReferences": [{"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
                "name": "acceptance", "uid": "uid-0", "controller": true}]}});
    let (client, log) = recorded::client(vec![
        status(409, "AlreadyExists", "exists"),
        (200, earlier),
        (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
        ),
    ]);
    let ctx = recorded::ctx(client);
    let out = fabric::ensure_key(&gv(), &ctx).await;
    assert!(
        matches!(&out, Err(Error::FabricKey(m)) if m.contains("earlier validation")),
        "{out:?}"
    );
    let calls: Vec<_> = log.calls().iter().map(method_and_path).collect();
    let secret = format!("/api/v1/namespaces/gpuval-system/secrets/{name}");
    assert_eq!(
        calls,
        vec![
            (
                "POST".into(),
                "/api/v1/namespaces/gpuval-system/secrets".into()
            ),
            ("GET".into(), secret.clone()),
            ("DELETE".into(), secret),
        ]
    );
}

#[tokio::test]
async fn this_validations_key_is_kept() {
    let name = crate::decide::fabric_key::secret_name("acceptance");
    let own = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "gpuval-system",
            "ownerReferences": [{"apiVersion": "gpuval.io/v1alpha1", "kind": "GpuValidation",
                "name": "acceptance", "uid": "uid-1", "controller": true}]}});
    let (client, log) = recorded::client(vec![status(409, "AlreadyExists", "exists"), (200, own)]);
    let ctx = recorded::ctx(client);
    fabric::ensure_key(&gv(), &ctx).await.expect("kept");
    assert_eq!(log.calls().len(), 2);
}

#[tokio::test]
async fn a_refused_claim_template_is_told_on_the_validation_and_fails_the_step() {
    let (client, log) = recorded::client(vec![
        status(422, "Invalid", "spec.dra.selector: compilation failed"),
        created(),
    ]);
    let ctx = recorded::ctx(client);
    let out = claims::ensure_template(&gv(), &ctx).await;
    assert!(
        matches!(&out, Err(Error::ClaimTemplate { note, .. }) if note.contains("compilation failed")),
        "{out:?}"
    );
    let calls = log.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls[0].path.contains("/resourceclaimtemplates"),
        "{}",
        calls[0].path
    );
    assert_eq!(calls[1].body["reason"], "ClaimTemplateRefused");
    assert_eq!(calls[1].body["type"], "Warning");
}

#[tokio::test]
async fn results_are_deleted_only_as_the_store_shows_them_and_gone_is_fine() {
    let (client, log) = recorded::client(vec![
        status(404, "NotFound", "gone"),
        status(409, "Conflict", "uid precondition"),
    ]);
    let ctx = recorded::ctx(client);
    let names = vec!["a-gpu-0".to_string(), "a-gpu-1".to_string()];
    pods::delete_results(&ctx, &names)
        .await
        .expect("neither is an error");
    let calls = log.calls();
    assert_eq!(calls.len(), 2);
    for (c, name) in calls.iter().zip(&names) {
        assert_eq!(
            method_and_path(c),
            (
                "DELETE".into(),
                format!("/apis/gpuval.io/v1alpha1/namespaces/gpuval-system/gpunoderesults/{name}")
            )
        );
        assert_eq!(c.body["propagationPolicy"], "Background");
    }
}

#[tokio::test]
async fn pods_gone_already_are_deleted_and_a_refusal_is_an_error() {
    let (client, log) = recorded::client(vec![
        status(404, "NotFound", "gone"),
        status(403, "Forbidden", "no"),
    ]);
    let ctx = recorded::ctx(client);
    let out = pods::delete_all::<Pod>(
        &ctx,
        &["p-0".to_string(), "p-1".to_string(), "p-2".to_string()],
    )
    .await;
    assert!(out.is_err(), "a 403 is an error");
    // The third is not tried after the refusal.
    assert_eq!(log.calls().len(), 2);
}
