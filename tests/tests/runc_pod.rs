//! The GPU gate's pod way without a GPU: `gpu-e2e --runc` runs the operator's own agent pod as an
//! OCI container under runc (`gpuval_tests::runc`), in an image assembled by
//! `bench/agent-rootfs.sh` (the agent, the libraries it needs, the Dockerfile's layout) with
//! stand-in GPUs from `bench/cdi-from-host.sh` (FAKE_GPUS), the agent on the simulated backend.
//! What it proves is what the gate relies on: the container gets the pod spec's read-only root,
//! and its nccl and training steps still run their child processes (their run directories in the
//! pod's `/tmp` volume, `TMPDIR`); a container killed mid-run ends its node in Error, not a
//! hardware verdict, and leaves no container behind.
//!
//! Needs root and runc (CI installs runc for the real-node test): skipped otherwise, except where
//! CI is set (`CI=true`) or `GPUVAL_REQUIRE_REAL_NODE=1`, where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpuval_tests::crds::repo_root;
use serde_json::Value;

const GPU_E2E: &str = env!("CARGO_BIN_EXE_gpu-e2e");

/// runc on the PATH, when this host can run containers (root); the reason otherwise.
fn runc() -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("runc needs root".into());
    }
    let out = Command::new("sh")
        .args(["-c", "command -v runc"])
        .output()
        .map_err(|e| format!("look for runc: {e}"))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if path.is_empty() {
        return Err("runc is not installed (apt-get install runc)".into());
    }
    Ok(PathBuf::from(path))
}

fn runc_or_skip() -> Option<PathBuf> {
    match runc() {
        Ok(p) => Some(p),
        Err(why) if gpuval_tests::real_node::required() => panic!("{why}"),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// The agent image and the stand-in GPUs' CDI spec, under `dir`.
fn image_and_cdi(dir: &Path) -> (PathBuf, PathBuf) {
    let agent = gpuval_tests::binaries::agent_binary().expect("the agent binary");
    let image = dir.join("image");
    let out = Command::new("bash")
        .arg(repo_root().join("bench/agent-rootfs.sh"))
        .arg(&image)
        .arg(&agent)
        .env("ROOTFS_ALLOW_MISSING", "1")
        .output()
        .expect("run bench/agent-rootfs.sh");
    assert!(
        out.status.success(),
        "agent-rootfs.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cdi = dir.join("cdi.json");
    let out = Command::new("bash")
        .arg(repo_root().join("bench/cdi-from-host.sh"))
        .arg(&cdi)
        .env("FAKE_GPUS", "2")
        .output()
        .expect("run bench/cdi-from-host.sh");
    assert!(
        out.status.success(),
        "cdi-from-host.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (image, cdi)
}

/// gpu-e2e with the agent pod under runc; its exit code, summary and stored report.
fn gpu_e2e(dir: &Path, name: &str, runc: &Path, extra: &[&str]) -> (Option<i32>, String, Value) {
    let (image, cdi) = (dir.join("image"), dir.join("cdi.json"));
    let out_dir = dir.join(name);
    let report = dir.join(format!("{name}.json"));
    let out = Command::new(GPU_E2E)
        .current_dir(repo_root())
        .args(["--backend", "sim", "--timeout", "120"])
        .arg("--out")
        .arg(&out_dir)
        .arg("--runc")
        .arg(runc)
        .arg("--image")
        .arg(&image)
        .arg("--cdi")
        .arg(&cdi)
        .arg("--report-json")
        .arg(&report)
        .arg("--agent-bin")
        .arg(gpuval_tests::binaries::agent_binary().expect("agent"))
        .arg("--operator-bin")
        .arg(gpuval_tests::binaries::operator_binary().expect("operator"))
        .args(extra)
        .output()
        .expect("run gpu-e2e");
    let summary = std::fs::read_to_string(out_dir.join("summary.txt")).unwrap_or_else(|_| {
        format!(
            "no summary.txt; stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let report = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let logs = std::fs::read_dir(out_dir.join("logs"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("agent-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    (
        out.status.code(),
        format!("{summary}\nagent logs:\n{logs}"),
        report,
    )
}

#[test]
fn the_agent_pod_runs_its_children_under_runc_and_a_kill_is_no_verdict() {
    let Some(runc) = runc_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    image_and_cdi(dir.path());

    let (code, summary, report) = gpu_e2e(
        dir.path(),
        "multi",
        &runc,
        &[
            "--validation",
            "bench/e2e/pod-multi.yaml",
            "--expect",
            "passed",
            "--simulate",
            "gpus=2,model=H200,timescale=0.01",
        ],
    );
    assert_eq!(code, Some(0), "{summary}");
    assert!(summary.contains("RESULT: PASS"), "{summary}");
    for check in ["nccl", "training"] {
        assert_eq!(report[check]["verdict"], "Pass", "{check}: {report:#}");
    }
    assert!(
        report["nccl"]["library"]
            .as_str()
            .is_some_and(|l| l.ends_with("linked as libnccl.so")),
        "the sweep process made its library link in its run directory: {:#}",
        report["nccl"]
    );

    let (code, summary, _) = gpu_e2e(
        dir.path(),
        "killed",
        &runc,
        &[
            "--validation",
            "bench/e2e/pod-killed.yaml",
            "--expect",
            "no-hardware-action",
            "--expect-reason",
            "exit code 137",
            "--kill-agent-after",
            "2",
            "--simulate",
            "gpus=2,model=H200,timescale=0.5",
        ],
    );
    assert_eq!(code, Some(0), "{summary}");
    // Every container removed: runc's state directories of both runs list none.
    for name in ["multi", "killed"] {
        let state = dir.path().join(name).join("runc-state");
        let out = Command::new(&runc)
            .arg("--root")
            .arg(&state)
            .args(["list", "-q"])
            .output()
            .expect("runc list");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "",
            "{name}: containers left"
        );
    }
}
