//! The hidden subcommands the agent re-executes itself with (`nccl-sweep`, `training-run`):
//! each reads its request as JSON on stdin and answers with one JSON line on stdout, an error
//! included, so the agent always learns why a child ended. No GPU here: a valid request ends in
//! the error of a missing driver or library, which must cross the boundary whole.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_gpuval-agent");

/// Runs `gpuval-agent SUB` with `input` on stdin; its exit code and its last stdout line.
fn ask(sub: &str, input: &str) -> (Option<i32>, Value) {
    let mut child = Command::new(AGENT)
        .arg(sub)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write the request");
    let out = child.wait_with_output().expect("wait for the agent");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let reply = serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "{sub}: the last line is not a reply ({e}): {text:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), reply)
}

fn error_text(reply: &Value) -> String {
    reply["outcome"]["Err"].to_string()
}

#[test]
fn a_bad_request_is_answered_with_what_was_wrong() {
    for (sub, what) in [("training-run", "training"), ("nccl-sweep", "NCCL sweep")] {
        let (code, reply) = ask(sub, "{\"not\": \"a request\"}");
        assert_eq!(code, Some(0), "{sub}");
        let err = error_text(&reply);
        assert!(err.contains(&format!("bad {what} request")), "{sub}: {err}");
    }
}

#[test]
fn a_training_job_without_a_gpu_ends_in_an_error_not_silence() {
    let job = serde_json::json!({
        "req": {
            "hidden": 256, "ffnMultiplier": 4, "layers": 1, "batch": 1, "sequence": 64,
            "bucketBytes": 1048576, "steps": 2, "warmup": 1, "checksumEvery": 1,
            "timeout": {"secs": 5, "nanos": 0}, "corrupt": null
        },
        "gpus": []
    });
    let (code, reply) = ask("training-run", &job.to_string());
    assert_eq!(code, Some(0));
    let err = error_text(&reply);
    assert!(
        reply["outcome"].get("Err").is_some() && !err.contains("bad training request"),
        "the job is read, and with no driver or library here it ends in an error: {reply}"
    );
}
