//! Evidence the ecosystem reads (issue 54), on a real control plane with the operator in-process
//! and the simulated agent (the figures are simulated and every document says so): a run with a
//! planted memory fault on GPU 1 ends, and
//! - the node's in-toto attestation, exported by the plugin, verifies with securesystemslib (a
//!   maintained DSSE implementation, not gpuval's code) against the published key and names the
//!   GPUs (UUID and serial) and the report as subjects; a changed serial, a changed figure and
//!   another key each fail it, and the plugin agrees;
//! - the run's JUnit report (`kubectl gpuval report -o junit`, and `gpuval-agent run --junit`)
//!   parses with junitparser: a suite per node, the fault a failure with its code and action.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use gpuval_crds::Phase;
use gpuval_tests::binaries::run_plugin as plugin;
use gpuval_tests::chart::ChartTools;
use gpuval_tests::kubelet::agent_binary;
use gpuval_tests::operator::{OperatorHandle, test_config};
use gpuval_tests::{crds, scenario, waits};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::Value;

const NS: &str = "gpuval-system";
const SIM: &str = "gpus=2,model=H100,timescale=0.002,fail=memory@1";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A script of `tests/scripts` run with the evidence readers on its path.
fn python(tools: &ChartTools, script: &str, args: &[&Path], extra: &[&str]) -> Output {
    Command::new("python3")
        .arg(crds::repo_root().join("tests/scripts").join(script))
        .args(args)
        .args(extra)
        .env("PYTHONPATH", &tools.evidence_pythonpath)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"))
}

/// The envelope with its Statement edited by `edit` and the signature kept.
fn forged(envelope: &Value, edit: impl Fn(&mut Value)) -> Value {
    let payload = envelope["payload"].as_str().expect("payload");
    let mut statement: Value =
        serde_json::from_slice(&STANDARD.decode(payload).expect("base64")).expect("statement");
    edit(&mut statement);
    let mut out = envelope.clone();
    out["payload"] = STANDARD
        .encode(serde_json::to_vec(&statement).expect("json"))
        .into();
    out
}

/// Another installation's public key (PEM).
fn other_key() -> String {
    use ring::signature::{Ed25519KeyPair, KeyPair};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).expect("a key");
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("a key pair");
    let spki = gpuval_crds::pem::ed25519_spki(pair.public_key().as_ref());
    gpuval_crds::pem::encode("PUBLIC KEY", &spki)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attestation_verifies_with_a_standard_tool_and_the_junit_report_parses() {
    let tools = ChartTools::install().expect("the evidence readers (PyPI)");
    let e = scenario::Cluster::start(NS, &["gpu-a".to_string()], 2).await;
    let _op = OperatorHandle::start(e.client.clone(), test_config(NS, SIM));
    e.apply(
        "formats",
        serde_json::json!({"checks": {"memory": {"fraction": 0.1}, "compute": {"duration": "10s"}}}),
    )
    .await;
    let gv = e.wait_terminal("formats", 120).await;
    assert_eq!(
        gv.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Failed)
    );
    let maps: Api<ConfigMap> = Api::namespaced(e.client.clone(), NS);
    let uid = gv.metadata.uid.clone().expect("uid");
    let summary = gpuval_operator::decide::certificates::name("formats", &uid, 1, None);
    waits::until("the certificates", Duration::from_secs(60), || async {
        maps.get_opt(&summary).await.ok().flatten()
    })
    .await
    .expect("written after the terminal status");
    let published = maps
        .get("gpuval-certificate-public-key")
        .await
        .expect("the public key")
        .data
        .unwrap_or_default();
    let (pem, keyid) = (&published["public.pem"], &published["keyId"]);

    let dir = tempfile::tempdir().expect("temp dir");
    let key = dir.path().join("public.pem");
    std::fs::write(&key, pem).expect("write the key");
    let kc = e.cp.kubeconfig();
    let att = dir.path().join("gpu-a.intoto.json");
    let args = [
        "certificate",
        "formats",
        "--node",
        "gpu-a",
        "--attestation",
        "-f",
        att.to_str().expect("utf8"),
    ];
    let exported = plugin(kc, &args);
    assert!(exported.status.success(), "{}", text(&exported.stderr));

    // The standard verifier.
    let ok = python(&tools, "dsse-verify.py", &[&att, &key], &[keyid]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    let said: Value = serde_json::from_slice(&ok.stdout).expect("the verifier's JSON");
    assert_eq!(said["type"], "https://in-toto.io/Statement/v1");
    assert_eq!(
        said["predicateType"],
        "https://gpuval.io/attestation/node/v1"
    );
    let names: Vec<&str> = said["subjects"]
        .as_array()
        .expect("subjects")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["gpu/GPU-sim-0", "gpu/GPU-sim-1", "report/formats/gpu-a"]
    );
    assert_eq!(said["subjects"][1]["annotations"]["serial"], "sim-serial-1");
    // The plugin agrees.
    let att_s = att.to_str().expect("utf8");
    let key_s = key.to_str().expect("utf8");
    let by_plugin = plugin(kc, &["verify", att_s, "--key", key_s]);
    assert!(by_plugin.status.success(), "{}", text(&by_plugin.stderr));
    let line = text(&by_plugin.stdout);
    assert!(line.starts_with("valid in-toto attestation"), "{line}");
    assert!(line.contains("node gpu-a: Fail with 2 GPU(s)"), "{line}");

    // Each tampering fails both.
    let original: Value =
        serde_json::from_str(&std::fs::read_to_string(&att).expect("read")).expect("json");
    let serial = forged(&original, |s| {
        s["predicate"]["hardware"]["gpus"][0]["serial"] = "1650924060077".into();
        s["subject"][0]["annotations"]["serial"] = "1650924060077".into();
    });
    let figure = forged(&original, |s| {
        let g = &mut s["predicate"]["results"]["gpus"][1]["memory"];
        g["verdict"] = "Pass".into();
        g["gbps"] = 4000.0.into();
    });
    for (what, doc) in [("a serial", serial), ("a figure", figure)] {
        let bad = dir.path().join("tampered.json");
        std::fs::write(&bad, serde_json::to_string(&doc).expect("json")).expect("write");
        let out = python(&tools, "dsse-verify.py", &[&bad, &key], &[keyid]);
        assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out.stdout));
        assert!(text(&out.stderr).contains("does not verify"), "{what}");
        let bad_s = bad.to_str().expect("utf8");
        let by_plugin = plugin(kc, &["verify", bad_s, "--key", key_s]);
        assert_eq!(by_plugin.status.code(), Some(1), "{what}");
    }
    let other = dir.path().join("other.pem");
    std::fs::write(&other, other_key()).expect("write");
    let out = python(&tools, "dsse-verify.py", &[&att, &other], &[keyid]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "another key: {}",
        text(&out.stdout)
    );
    let other_s = other.to_str().expect("utf8");
    let by_plugin = plugin(kc, &["verify", att_s, "--key", other_s]);
    assert_eq!(by_plugin.status.code(), Some(1), "another key");

    // The same run as JUnit, read by junitparser.
    let xml = dir.path().join("formats.xml");
    let report = plugin(
        kc,
        &["report", "formats", "-f", xml.to_str().expect("utf8")],
    );
    assert_eq!(report.status.code(), Some(0), "{}", text(&report.stderr));
    let read = python(&tools, "junit-read.py", &[&xml], &[]);
    assert!(read.status.success(), "{}", text(&read.stderr));
    let suites: Value = serde_json::from_slice(&read.stdout).expect("junitparser's JSON");
    assert_junit_names_the_fault(&suites, "gpu-a");

    // And the agent's own, from a bare run.
    let bare = dir.path().join("bare.xml");
    let run = Command::new(agent_binary().expect("agent binary"))
        .args([
            "run",
            "--simulate",
            "gpus=2,model=H100,fail=memory@1",
            "--checks",
            "memory",
        ])
        .arg("--junit")
        .arg(&bare)
        .output()
        .expect("run the agent");
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stderr));
    let read = python(&tools, "junit-read.py", &[&bare], &[]);
    assert!(read.status.success(), "{}", text(&read.stderr));
    let suites: Value = serde_json::from_slice(&read.stdout).expect("junitparser's JSON");
    let node = suites[0]["name"].as_str().unwrap_or_default().to_string();
    assert_junit_names_the_fault(&suites, &node);
}

/// One suite, named `node`, whose GPU1 memory case is a failure typed with the code, its
/// message naming the action, and whose GPU0 memory case passed.
fn assert_junit_names_the_fault(suites: &Value, node: &str) {
    let suites = suites.as_array().expect("suites");
    assert_eq!(suites.len(), 1, "{suites:?}");
    let s = &suites[0];
    assert_eq!(s["name"], node, "{s}");
    assert!(s["failures"].as_u64() >= Some(1), "{s}");
    let case = |class: &str, name: &str| {
        s["cases"]
            .as_array()
            .and_then(|c| {
                c.iter()
                    .find(|c| c["classname"] == class && c["name"] == name)
            })
            .cloned()
            .unwrap_or_else(|| panic!("no case {class} {name}: {s}"))
    };
    let bad = case(&format!("{node}.GPU1"), "memory");
    let result = &bad["results"][0];
    assert_eq!(result["kind"], "failure", "{bad}");
    assert!(
        result["type"]
            .as_str()
            .unwrap_or_default()
            .contains("MemoryMismatch"),
        "{bad}"
    );
    assert!(
        result["message"]
            .as_str()
            .unwrap_or_default()
            .contains("(action: "),
        "{bad}"
    );
    let good = case(&format!("{node}.GPU0"), "memory");
    assert_eq!(good["results"], Value::Array(Vec::new()), "{good}");
}
