//! Acceptance certificates on a real control plane: a small validation runs to its verdict
//! (operator in-process, the simulated agent under the fake kubelet); its signed certificates
//! outlive the validation; the plugin exports one, and the plugin and the agent binary verify it
//! offline with the published public key, and refuse each tampered copy (a figure, a swapped
//! serial, the settings, the signature, another key) naming what is wrong.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use gpuval_crds::{GpuValidation, Phase};
use gpuval_operator::services::certificate_retry::RetryPolicy;
use gpuval_tests::api_faults::{Faults, Seen};
use gpuval_tests::binaries::run_plugin as plugin;
use gpuval_tests::kubelet::agent_binary;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::scenario;
use gpuval_tests::waits;
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

const NS: &str = "gpuval-system";
const SIM: &str = "gpus=2,model=H100,timescale=0.002";

fn agent_verify(cert: &Path, key: &Path) -> Output {
    Command::new(agent_binary().expect("agent binary"))
        .arg("verify")
        .arg(cert)
        .arg("--key")
        .arg(key)
        .output()
        .expect("run gpuval-agent verify")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Writes `doc` to `path` and has both verifiers check it against `key`: they must agree, and
/// a refusal must name `names` on stderr. Gives back the plugin's stdout.
fn check(kubeconfig: &Path, path: &Path, doc: &Value, key: &Path, names: Option<&str>) -> String {
    std::fs::write(path, serde_json::to_string_pretty(doc).expect("json")).expect("write");
    let p = path.to_str().expect("utf8 path");
    let k = key.to_str().expect("utf8 path");
    let by_plugin = plugin(kubeconfig, &["verify", p, "--key", k]);
    let by_agent = agent_verify(path, key);
    match names {
        None => {
            assert!(
                by_plugin.status.success(),
                "plugin: {}",
                text(&by_plugin.stderr)
            );
            assert!(
                by_agent.status.success(),
                "agent: {}",
                text(&by_agent.stderr)
            );
        }
        Some(what) => {
            for (who, o) in [("plugin", &by_plugin), ("agent", &by_agent)] {
                assert_eq!(o.status.code(), Some(1), "{who} must refuse: {o:?}");
                let err = text(&o.stderr);
                assert!(err.contains(what), "{who} must name {what:?}: {err}");
            }
        }
    }
    text(&by_plugin.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_outlives_its_validation_verifies_and_each_tampering_is_named() {
    let e = scenario::Cluster::start(NS, &["gpu-a".to_string()], 2).await;
    let op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    e.apply(
        "accept",
        json!({"checks": {"memory": {"fraction": 0.1}, "compute": {"duration": "10s"}}}),
    )
    .await;
    let gv = e.wait_terminal("accept", 120).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed)
    );
    // The certificates follow the terminal status; the validation's is written last.
    let maps: Api<ConfigMap> = Api::namespaced(e.client.clone(), NS);
    let uid = gv.metadata.uid.clone().expect("uid");
    let summary = gpuval_operator::decide::certificates::name("accept", &uid, 1, None);
    waits::until(
        "the validation's certificate",
        Duration::from_secs(60),
        || async { maps.get_opt(&summary).await.ok().flatten() },
    )
    .await
    .expect("written after the terminal status");

    // Delete the validation: its results go with it, its certificates stay.
    let validations: Api<GpuValidation> = Api::all(e.client.clone());
    validations
        .delete("accept", &DeleteParams::foreground())
        .await
        .expect("delete");
    waits::until_gone(&validations, "accept", Duration::from_secs(60))
        .await
        .expect("deleted");
    op.stop().await;
    let certs = maps
        .list(&ListParams::default().labels("gpuval.io/certificate,gpuval.io/validation=accept"))
        .await
        .expect("list certificates");
    assert_eq!(
        certs.items.len(),
        2,
        "a node certificate and the validation's"
    );
    let public = maps
        .get("gpuval-certificate-public-key")
        .await
        .expect("public key published");
    let pem = public
        .data
        .and_then(|d| d.get("public.pem").cloned())
        .expect("public.pem");

    let dir = tempfile::tempdir().expect("temp dir");
    let key = dir.path().join("pub.pem");
    std::fs::write(&key, &pem).expect("write key");
    let kubeconfig = e.cp.kubeconfig();
    let cert = dir.path().join("cert.json");
    let exported = plugin(
        kubeconfig,
        &[
            "certificate",
            "accept",
            "--node",
            "gpu-a",
            "-f",
            cert.to_str().expect("utf8"),
        ],
    );
    assert!(exported.status.success(), "{}", text(&exported.stderr));
    let original: Value =
        serde_json::from_str(&std::fs::read_to_string(&cert).expect("read")).expect("json");
    let doc = &original["document"];
    assert_eq!(doc["subject"]["node"], "gpu-a");
    assert_eq!(doc["hardware"]["gpus"].as_array().map(Vec::len), Some(2));
    assert_eq!(doc["hardware"]["gpus"][0]["serial"], "sim-serial-0");
    assert_eq!(doc["software"]["image"], "gpuval-agent:test");
    assert!(doc["results"]["gpus"][0]["memory"]["gbps"].is_number());
    assert_eq!(doc["report"]["sha256"].as_str().map(str::len), Some(64));

    let line = check(kubeconfig, &cert, &original, &key, None);
    assert!(
        line.starts_with("valid: node gpu-a: Pass with 2 GPU(s)"),
        "{line}"
    );
    let summary = plugin(kubeconfig, &["certificate", "accept"]);
    assert!(summary.status.success(), "{}", text(&summary.stderr));
    let summary: Value = serde_json::from_slice(&summary.stdout).expect("summary json");
    assert_eq!(summary["document"]["phase"], "Passed");
    check(
        kubeconfig,
        &dir.path().join("summary.json"),
        &summary,
        &key,
        None,
    );

    let tampered = dir.path().join("tampered.json");
    let mut figure = original.clone();
    figure["document"]["results"]["gpus"][0]["memory"]["gbps"] = json!(99999.0);
    check(
        kubeconfig,
        &tampered,
        &figure,
        &key,
        Some("results.gpus[0].memory.gbps (changed)"),
    );
    let mut serial = original.clone();
    serial["document"]["hardware"]["gpus"][0]["serial"] = json!("sim-serial-1");
    serial["document"]["hardware"]["gpus"][1]["serial"] = json!("sim-serial-0");
    check(
        kubeconfig,
        &tampered,
        &serial,
        &key,
        Some("hardware.gpus[0].serial (changed), hardware.gpus[1].serial (changed)"),
    );
    let mut settings = original.clone();
    settings["document"]["settings"]["spec"]["checks"]["memory"]["fraction"] = json!(0.9);
    check(
        kubeconfig,
        &tampered,
        &settings,
        &key,
        Some("settings.spec.checks.memory.fraction (changed)"),
    );
    let mut signature = original.clone();
    let sig = signature["signature"]
        .as_str()
        .expect("signature")
        .to_string();
    let flipped = if sig.starts_with('0') { "1" } else { "0" };
    signature["signature"] = json!(format!("{flipped}{}", &sig[1..]));
    check(
        kubeconfig,
        &tampered,
        &signature,
        &key,
        Some("the signature does not match"),
    );
    let other = dir.path().join("other.pem");
    let other_key =
        gpuval_crds::pem::encode("PUBLIC KEY", &gpuval_crds::pem::ed25519_spki(&[7u8; 32]));
    std::fs::write(&other, other_key).expect("write other key");
    check(
        kubeconfig,
        &tampered,
        &original,
        &other,
        Some("not by the key given"),
    );
}

/// The node's result of validation `name`.
async fn result_of(client: &kube::Client, name: &str) -> gpuval_crds::NodeReport {
    let api: Api<gpuval_crds::GpuNodeResult> = Api::namespaced(client.clone(), NS);
    api.get(&gpuval_crds::result::result_name(name, "gpu-a"))
        .await
        .expect("result")
        .status
        .expect("report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_twelve_percent_below_its_own_past_warns_while_its_floor_still_passes() {
    let e = scenario::Cluster::start(NS, &["gpu-a".to_string()], 2).await;
    let spec = json!({"checks": {"memory": {"fraction": 0.1}}});
    let op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    e.apply("before", spec.clone()).await;
    let gv = e.wait_terminal("before", 120).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed)
    );
    let first = result_of(&e.client, "before").await;
    assert!(
        first.gpus.iter().all(|g| g.reasons.is_empty()),
        "no history yet: {:?}",
        first.gpus
    );
    op.stop().await;

    // The same GPUs, now 12% slower on memory: still above the H100 floor (2450 GB/s), and
    // alike, so no GPU is below its peers; only their own past tells.
    let slower = format!("{SIM},slow=memory@0:0.88+memory@1:0.88");
    let _op = OperatorHandle::start(e.client.clone(), test_config(NS, &slower));
    e.apply("after", spec).await;
    let gv = e.wait_terminal("after", 120).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed),
        "a Warn still passes"
    );
    let second = result_of(&e.client, "after").await;
    assert_eq!(second.verdict, gpuval_crds::Verdict::Warn);
    for (was, now) in first.gpus.iter().zip(&second.gpus) {
        let memory = now.memory.as_ref().expect("memory result");
        assert_eq!(
            memory.verdict,
            gpuval_crds::Verdict::Pass,
            "the floor passes"
        );
        assert_eq!(now.verdict, gpuval_crds::Verdict::Warn);
        let before = was.memory.as_ref().expect("memory").gbps;
        let r = now
            .reasons
            .iter()
            .find(|r| r.code == gpuval_crds::Code::BelowOwnBaseline)
            .unwrap_or_else(|| {
                panic!(
                    "GPU{} has no BelowOwnBaseline: {:?}",
                    now.index, now.reasons
                )
            });
        assert!(
            r.message
                .contains(&format!("memory.gbps: {:.1}", memory.gbps))
                && r.message.contains(&format!("baseline {before:.1}")),
            "names the figure and both values: {}",
            r.message
        );
    }
    assert!(
        second.codes().contains("BelowOwnBaseline"),
        "{}",
        second.codes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_cannot_sign_is_told_and_does_not_hold_back_the_verdict() {
    let e = scenario::Cluster::start(NS, &["gpu-a".to_string()], 2).await;
    // The administrator's Secret holds no usable key.
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "gpuval-certificate-key", "namespace": NS},
        "stringData": {"private.pem": "not a key"},
    }))
    .expect("secret");
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(e.client.clone(), NS)
        .create(&Default::default(), &secret)
        .await
        .expect("create secret");
    let _op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    e.apply("unsigned", json!({"checks": {"memory": {"fraction": 0.1}}}))
        .await;
    let gv = e.wait_terminal("unsigned", 120).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed),
        "{:#?}",
        gv.status
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(e.client.clone());
    let told = waits::until(
        "the CertificateNotWritten event",
        Duration::from_secs(30),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|ev| ev.reason.as_deref() == Some("CertificateNotWritten"))
        },
    )
    .await
    .expect("event");
    let note = told.note.unwrap_or_default();
    assert!(
        note.contains("gpuval-certificate-key") && note.contains("PEM"),
        "names the Secret and what is wrong: {note}"
    );
    let maps: Api<ConfigMap> = Api::namespaced(e.client.clone(), NS);
    let certs = maps
        .list(&ListParams::default().labels("gpuval.io/certificate"))
        .await
        .expect("list");
    assert!(certs.items.is_empty(), "nothing signed: {:?}", certs.items);
}

/// A certificate ConfigMap POST the operator made (a try of one certificate).
fn is_certificate_create(s: &Seen) -> bool {
    s.method == Method::POST
        && s.uri
            .starts_with(&format!("/api/v1/namespaces/{NS}/configmaps"))
}

/// A status write of validation `name` that carries a terminal phase.
fn is_terminal_status_write(s: &Seen, name: &str) -> bool {
    s.method == Method::PATCH
        && s.uri.contains(&format!("/gpuvalidations/{name}/status"))
        && ["Passed", "Failed", "Error"]
            .iter()
            .any(|p| s.body.contains(&format!("\"phase\":\"{p}\"")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_follow_the_stored_terminal_status_read_results_in_pages_and_outlast_refusals()
{
    let nodes: Vec<String> = ["gpu-a", "gpu-b", "gpu-c"].map(String::from).to_vec();
    let e = scenario::Cluster::start(NS, &nodes, 2).await;
    // The operator's API server refuses its first certificate write (500), the second page of
    // its second listing of the run's results (500), then two more certificate writes (429, and
    // a 409 that no object stands behind).
    let faults = Faults::default();
    let run_results = [
        "/gpunoderesults?",
        "labelSelector=gpuval.io%2Fvalidation%3Dpaged",
    ];
    let second_page = [run_results[0], run_results[1], "continue="];
    faults.refuse(Method::GET, &second_page, &[0, 500]);
    let configmaps = format!("/api/v1/namespaces/{NS}/configmaps");
    faults.refuse(Method::POST, &[&configmaps], &[500, 429, 409]);
    let mut cfg = test_config(NS, SIM);
    cfg.certificates.page = 2;
    let policy = RetryPolicy {
        first: Duration::from_millis(400),
        max: Duration::from_secs(4),
        tries: 10,
    };
    cfg.certificates.retry = policy;
    let op = OperatorHandle::start(faults.client(e.cp.kubeconfig()).await, cfg);
    let applied = e
        .apply("paged", json!({"checks": {"memory": {"fraction": 0.1}}}))
        .await;
    let gv = e.wait_terminal("paged", 120).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Passed),
        "refused certificates do not hold back the verdict"
    );
    let uid = applied.metadata.uid.clone().expect("uid");
    let summary = gpuval_operator::decide::certificates::name("paged", &uid, 1, None);
    let maps: Api<ConfigMap> = Api::namespaced(e.client.clone(), NS);
    waits::until(
        "the validation's certificate",
        Duration::from_secs(60),
        || async { maps.get_opt(&summary).await.ok().flatten() },
    )
    .await
    .expect("written once the refusals are over");
    op.stop().await;
    let seen = faults.seen();

    // Order: the terminal status was stored before the first certificate was sent.
    let stored = seen
        .iter()
        .find(|s| is_terminal_status_write(s, "paged") && s.code == Some(200))
        .expect("the terminal status write");
    let stored_at = stored.answered.expect("answered");
    let creates: Vec<&Seen> = seen.iter().filter(|s| is_certificate_create(s)).collect();
    assert!(
        creates.iter().all(|c| c.sent >= stored_at),
        "a certificate was sent before the terminal status was stored"
    );

    // Paging: every listing of the run's results asked for pages of 2; three results take a
    // second page, asked for with the first page's continue token.
    let lists: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.method == Method::GET && run_results.iter().all(|p| s.uri.contains(p)))
        .collect();
    assert!(!lists.is_empty(), "the run's results were never listed");
    assert!(
        lists.iter().all(|l| l.uri.contains("limit=2")),
        "unpaged: {:?}",
        lists.iter().map(|l| &l.uri).collect::<Vec<_>>()
    );
    assert!(
        lists.iter().any(|l| l.uri.contains("continue=")),
        "no second page"
    );

    // Retries: each try begins with a look for the validation's certificate. Four failed tries
    // (500, the list, 429, the empty 409), then the fifth wrote everything; each pause within
    // its backoff step (half of it at least, and not the old fixed 5 s).
    let tries: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.method == Method::GET && s.uri.ends_with(&format!("/configmaps/{summary}")))
        .collect();
    assert_eq!(
        tries.len(),
        5,
        "tries: {:?}",
        tries.iter().map(|t| t.code).collect::<Vec<_>>()
    );
    for (k, pair) in tries.windows(2).enumerate() {
        let gap = pair[1].sent - pair[0].sent;
        let step = policy.first * 2u32.pow(k as u32);
        assert!(
            gap >= step / 2 && gap < step + Duration::from_secs(3),
            "pause {k}: {gap:?}, its step {step:?}"
        );
    }
    let refused = creates.iter().filter(|c| c.refused).count();
    assert_eq!(refused, 3);

    // Nothing twice: one create of each certificate went through, three nodes' and the
    // validation's, and no try after the one that wrote them.
    let mut written: Vec<String> = creates
        .iter()
        .filter(|c| c.code == Some(201))
        .map(|c| {
            let cm: ConfigMap = serde_json::from_str(&c.body).expect("a ConfigMap");
            cm.metadata.name.expect("named")
        })
        .collect();
    written.sort();
    let mut expected: Vec<String> = nodes
        .iter()
        .map(|n| gpuval_operator::decide::certificates::name("paged", &uid, 1, Some(n)))
        .collect();
    expected.push(summary.clone());
    expected.sort();
    assert_eq!(written, expected);
    let certs = maps
        .list(&ListParams::default().labels("gpuval.io/certificate,gpuval.io/validation=paged"))
        .await
        .expect("list certificates");
    assert_eq!(certs.items.len(), 4);
}
