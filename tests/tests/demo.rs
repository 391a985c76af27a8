//! `make demo` end to end (`demo --exit`): the quick run's verdicts, the bad node's
//! `GpuValidated` flipping back to True once `quick` proves the repaired node again (a failure
//! stands until a pass of the same validation covers it), the next steps and where the logs are,
//! and nothing left behind once it stops.

use std::path::PathBuf;
use std::process::Command;

const DEMO: &str = env!("CARGO_BIN_EXE_demo");

/// The path printed after `label` (`  operator: /tmp/…`).
fn path_after(out: &str, label: &str) -> PathBuf {
    let line = out
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{out}"));
    PathBuf::from(line.split_whitespace().next().expect("a path"))
}

#[test]
fn the_demo_shows_a_failure_its_proof_after_repair_and_leaves_nothing_behind() {
    let out = Command::new(DEMO)
        .arg("--exit")
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    for want in [
        "quick   Failed   4       3        1",
        "gpu-node-c is repaired",
        "GpuValidated flipped to True",
        "kubectl gpuval status quick",
        "Logs (removed when the demo stops)",
    ] {
        assert!(stdout.contains(want), "{want:?} missing:\n{stdout}");
    }
    let flipped = stdout
        .split("GpuValidated flipped")
        .next()
        .and_then(|before| before.rsplit("gpu-node-c").next())
        .expect("the node's last line before the flip");
    assert!(
        flipped.trim_start().starts_with("True"),
        "gpu-node-c after its proof: {flipped}"
    );
    let kubeconfig = path_after(&stdout, "export KUBECONFIG=");
    let operator_log = path_after(&stdout, "operator:");
    let dir = operator_log.parent().expect("the demo's directory");
    assert_eq!(
        kubeconfig.parent(),
        Some(dir),
        "one directory for all it writes"
    );
    assert!(
        !dir.exists(),
        "{} is left behind after the demo stopped",
        dir.display()
    );
}
