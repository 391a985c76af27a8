//! The nccl and training checks need a writable temporary directory: each runs in a child
//! process with a private run directory under `$TMPDIR` (else `/tmp`) for its NCCL library link
//! and NCCL's log. In a pod with a read-only root filesystem and no writable `TMPDIR` they
//! cannot run; the simulated node takes the same way, so the agent's binary shows it here: an
//! Error that names the temporary directory and what to do, never a silent pass. With a
//! writable one the checks pass and leave nothing behind.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_gpuval-agent");

/// `gpuval-agent run` of the simulated nccl and training checks (small settings) with `TMPDIR`
/// set to `tmp`; its JSON report.
fn run_with_tmpdir(tmp: &Path, extra: &[&str]) -> Value {
    let out = Command::new(AGENT)
        .args(["run", "--simulate", "gpus=2,model=H100", "--json"])
        .args(["--checks", "nccl,training", "--nccl-max-bytes", "1M"])
        .args(["--training-hidden", "256", "--training-layers", "2"])
        .args(["--training-steps", "4", "--training-timeout", "10s"])
        .args(extra)
        .env("TMPDIR", tmp)
        .output()
        .expect("start the agent");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a JSON report ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn verdict(report: &Value, check: &str) -> String {
    report[check]["verdict"].as_str().unwrap_or("").to_string()
}

fn messages(report: &Value, check: &str) -> Vec<String> {
    report[check]["reasons"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|x| x["message"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_unwritable_temporary_directory_is_an_error_that_names_it_and_the_fix() {
    let dir = tempfile::tempdir().expect("a temp dir");
    // A path under a regular file can never be created, whoever runs the test (root too).
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").expect("a regular file");
    let tmp = file.join("tmp");
    let report = run_with_tmpdir(&tmp, &[]);
    assert_eq!(report["verdict"], "Error", "{report:#}");
    for check in ["nccl", "training"] {
        assert_eq!(verdict(&report, check), "Error", "{check}: {report:#}");
        let why = messages(&report, check);
        let named = format!(
            "the agent's temporary directory {} is not usable",
            tmp.display()
        );
        assert!(
            why.iter()
                .any(|m| m.contains(&named) && m.contains("with TMPDIR pointing at it")),
            "{check}: {why:#?}"
        );
        let codes: Vec<&str> = report[check]["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["code"].as_str())
            .collect();
        assert_eq!(
            codes,
            ["TempDirUnusable"],
            "{check}: the installation's to fix (Configuration evidence), nothing to rerun"
        );
    }
}

#[test]
fn a_writable_temporary_directory_lets_the_children_run_and_is_left_clean() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let logs = tempfile::tempdir().expect("a log dir");
    let log_dir = logs.path().display().to_string();
    let report = run_with_tmpdir(tmp.path(), &["--nccl-log-dir", &log_dir]);
    for check in ["nccl", "training"] {
        assert_eq!(
            verdict(&report, check),
            "Pass",
            "{check}: {:#?}",
            messages(&report, check)
        );
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("read the temporary directory")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert!(left.is_empty(), "the run directories are removed: {left:?}");
    // NCCL's log, written by the sweep process in its run directory and kept on request,
    // says which transport it chose.
    let log = std::fs::read_to_string(logs.path().join("nccl-default.log")).expect("the log");
    assert!(
        log.contains("NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"),
        "{log}"
    );
    assert_eq!(
        report["nccl"]["sweep"]["transport"]["kinds"][0],
        "P2P/CUMEM"
    );
}
