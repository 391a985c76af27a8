//! The exit codes docs/checks-and-reasons.md states for `gpuval-agent run`, from the agent binary
//! with the simulated backend: 0 a pass, 1 a failed check or a check that ended in Error (as a
//! missing NVRTC, cuBLAS or NCCL does), 2 a run that could not start.

use std::process::{Command, Output};

use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_gpuval-agent");

/// `gpuval-agent run` of a quick memory check on two simulated GPUs with `simulate` planted,
/// and the report it wrote (None where it wrote none).
fn run(simulate: &str, extra: &[&str]) -> (Output, Option<Value>) {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("report.json");
    let output = Command::new(AGENT)
        .args([
            "run",
            "--simulate",
            simulate,
            "--checks",
            "memory",
            "--output",
        ])
        .arg(&out)
        .args(extra)
        .output()
        .expect("run the agent");
    let report = std::fs::read_to_string(&out)
        .ok()
        .map(|text| serde_json::from_str(&text).expect("the report is JSON"));
    (output, report)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_passing_node_exits_0() {
    let (o, report) = run("gpus=2", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(report.expect("a report")["verdict"], "Pass");
}

#[test]
fn a_failed_check_exits_1() {
    let (o, report) = run("gpus=2,fail=memory@1", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(report.expect("a report")["verdict"], "Fail");
}

#[test]
fn a_check_that_ended_in_error_exits_1_not_2() {
    let (o, report) = run("gpus=2,error=memory@0", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let report = report.expect("a report: the run went on");
    assert_eq!(report["verdict"], "Error");
}

#[test]
fn bad_input_exits_2_with_a_one_line_error_and_no_report() {
    let (o, report) = run("gpus=2,nosuchkey=1", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("error: --simulate"), "{}", stderr(&o));
    assert!(report.is_none(), "no run, no report");
}

#[test]
fn an_unreadable_settings_file_exits_2() {
    let (o, report) = run("gpus=2", &["-c", "/nonexistent/gpuval-settings.yaml"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("/nonexistent/gpuval-settings.yaml"),
        "{}",
        stderr(&o)
    );
    assert!(report.is_none());
}

/// `--gpus` naming a GPU the host does not have is bad input, not a node without GPUs (which
/// would recommend RebootNode): exit 2 before any check, naming the GPUs the host has.
#[test]
fn a_gpu_the_host_does_not_have_is_bad_input_naming_the_ones_it_has() {
    let (o, report) = run("gpus=2", &["--gpus", "1,7"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(report.is_none(), "no run, no report");
    let err = stderr(&o);
    assert!(
        err.contains("--gpus 1,7: this host has no GPU 7; its GPUs are 0, 1"),
        "{err}"
    );
    let (o, report) = run("gpus=2", &["--gpus", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        report.expect("a report")["gpus"].as_array().map(Vec::len),
        Some(1)
    );
}

/// A neighbour on GPU 1 that the agent's PID namespace hides (as in a pod): the GPU is busy, the
/// run asks for a rerun (exit 1, action Rerun), and nothing recommends a hardware action.
#[test]
fn a_hidden_neighbour_is_busy_with_a_rerun_never_a_hardware_action() {
    let (o, report) = run("gpus=2,pidns=1,proc=1:4242:python3:20480:0.5", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let report = report.expect("a report");
    assert_eq!(report["verdict"], "Error");
    assert_eq!(report["action"], "Rerun");
    let codes: Vec<&str> = report["gpus"][1]["reasons"]
        .as_array()
        .expect("GPU1's reasons")
        .iter()
        .filter_map(|r| r["code"].as_str())
        .collect();
    assert!(codes.contains(&"GpuBusy"), "{codes:?}");
    assert!(!codes.contains(&"MemoryBandwidthLow"), "{codes:?}");
}

/// `gpuval-agent run` on two simulated GPUs with `args`: its output and whether it wrote a report.
fn run_args(args: &[&str]) -> (Output, bool) {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("report.json");
    let output = Command::new(AGENT)
        .args(["run", "--simulate", "gpus=2", "--output"])
        .arg(&out)
        .args(args)
        .output()
        .expect("run the agent");
    (output, out.exists())
}

#[test]
fn a_gpu_listed_twice_is_refused_naming_it() {
    let (o, reported) = run_args(&["--checks", "memory", "--gpus", "1,0,1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("GPU 1 is listed more than once") && err.contains("--gpus 0,1"),
        "{err}"
    );
    assert!(!reported, "no run, no report");
}

#[test]
fn an_io_directory_that_cannot_serve_the_check_exits_2_naming_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").expect("write a file");
    let missing = tmp.path().join("no-such-dir");
    for (dir, words) in [(&missing, "does not exist"), (&file, "is not a directory")] {
        let dir = dir.to_str().expect("a UTF-8 path");
        let (o, reported) = run_args(&["--checks", "io", "--io-dir", dir]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(dir) && err.contains(words), "{err}");
        assert!(!reported, "no run, no report");
    }
    let (o, reported) = run_args(&[
        "--checks",
        "io",
        "--io-dir",
        tmp.path().to_str().expect("a UTF-8 path"),
        "--io-file-size-mib",
        "1",
    ]);
    assert_ne!(
        o.status.code(),
        Some(2),
        "a usable directory runs: {}",
        stderr(&o)
    );
    assert!(reported);
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("read").count(),
        1,
        "the probe and the check left nothing beside the file: {}",
        stderr(&o)
    );
}
