//! Bare metal: `gpuval-agent run --certificate-key` signs the run's certificate beside its
//! report, and `gpuval-agent verify` checks it with the key's public half, naming a tampered
//! figure.

use std::process::Command;

const AGENT: &str = env!("CARGO_BIN_EXE_gpuval-agent");

#[test]
fn a_bare_metal_run_signs_its_certificate_and_verify_checks_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut der = vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    der.extend([9u8; 32]);
    let key = dir.path().join("key.pem");
    std::fs::write(&key, gpuval_crds::pem::encode("PRIVATE KEY", &der)).expect("key");
    let public = gpuval_crds::seal::public_key_of(&der).expect("public");
    let pub_pem = dir.path().join("pub.pem");
    std::fs::write(
        &pub_pem,
        gpuval_crds::pem::encode("PUBLIC KEY", &gpuval_crds::pem::ed25519_spki(&public)),
    )
    .expect("pub");
    let report = dir.path().join("report.json");
    let run = Command::new(AGENT)
        .args([
            "run",
            "--simulate",
            "gpus=2,timescale=0.002",
            "--checks",
            "memory",
        ])
        .arg("--output")
        .arg(&report)
        .arg("--certificate-key")
        .arg(&key)
        .output()
        .expect("run the agent");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cert = dir.path().join("report.cert.json");
    let verify = |path: &std::path::Path| {
        Command::new(AGENT)
            .arg("verify")
            .arg(path)
            .arg("--key")
            .arg(&pub_pem)
            .output()
            .expect("verify")
    };
    let ok = verify(&cert);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("validation bare-metal"),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cert).expect("read")).expect("json");
    doc["document"]["results"]["gpus"][1]["memory"]["gbps"] = serde_json::json!(1.0);
    let tampered = dir.path().join("tampered.json");
    std::fs::write(&tampered, doc.to_string()).expect("write");
    let bad = verify(&tampered);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("results.gpus[1].memory.gbps (changed)"),
        "{err}"
    );
}
