//! `make demo` end to end (`demo --exit`): the quick run's verdicts, the bad node's
//! `GpuValidated` flipping back to True once `quick` proves the repaired node again (a failure
//! stands until a pass of the same validation covers it), a fabric run that passes and one that
//! names the node with a planted slow NIC and says what fell short (in `get -o wide`, `kubectl
//! gpuval status` and both HTML reports, read in a browser), every shipped example's fit, the
//! next steps and where the logs are, and nothing left behind once it stops.

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
    let reports = tempfile::tempdir().expect("a directory for the reports");
    let out = Command::new(DEMO)
        .arg("--exit")
        .env("GPUVAL_DEMO_REPORTS", reports.path())
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
        // The fabric: a pass, then the planted slow NIC named, with what fell short.
        "fabric-pass    Passed   3       3        0",
        "fabric-fault   Failed   3       2        1",
        "[\"gpu-node-d\"]",
        "├─ gpu-node-d  Fail",
        "(NCCL bus bandwidth ",
        " GB/s below 350); partners gpu-node-a, gpu-node-b passed elsewhere",
        // Every shipped example says whether it fits the demo.
        "fabric.yaml        refused there",
        "quick.yaml         runs",
    ] {
        assert!(stdout.contains(want), "{want:?} missing:\n{stdout}");
    }
    fabric_pages_in_a_browser(reports.path());
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

/// The demo's two fabric reports, as a browser shows them: the pass says so with its fabric
/// line; the fault names gpu-node-d, what fell short and its floor, and its headline is no pass.
fn fabric_pages_in_a_browser(dir: &std::path::Path) {
    let Some(chrome) = gpuval_tests::browser::chromium() else {
        return;
    };
    let fabric_line = |dom: &str| -> String {
        dom.split("<p id=\"fabric\">")
            .nth(1)
            .and_then(|s| s.split("</p>").next())
            .unwrap_or_else(|| panic!("no fabric line on the page:\n{dom}"))
            .to_string()
    };
    let page = |name: &str| {
        let html = std::fs::read_to_string(dir.join(format!("{name}.html")))
            .unwrap_or_else(|e| panic!("the demo wrote {name}.html: {e}"));
        gpuval_tests::browser::open(&chrome, &html, &format!("demo-{name}"), 1400)
    };
    let pass = page("fabric-pass");
    assert!(pass.contains("b-Pass"), "the pass's badge");
    assert!(
        fabric_line(&pass).contains("Passed"),
        "{}",
        fabric_line(&pass)
    );
    let fault = page("fabric-fault");
    let line = fabric_line(&fault);
    assert!(
        line.contains("Failed") && line.contains("gpu-node-d") && line.contains("below 350"),
        "the fault's fabric line names the node and what fell short: {line}"
    );
    let headline = fault
        .split("<h1")
        .nth(1)
        .and_then(|s| s.split("</h1>").next())
        .expect("a headline");
    assert!(
        !headline.contains("b-Pass"),
        "the fault's headline is no pass: {headline}"
    );
}
