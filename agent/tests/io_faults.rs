//! The io check's fault cases through the real `gpuval-agent` binary, simulated GPU backend
//! (the file I/O is real): a missing directory and a read-only filesystem (refused before the
//! run, exit 2, naming the path), files larger than free space, disk full mid-run, O_DIRECT
//! refused. Each asserts on what the agent said and that the directory is left empty; where the
//! run went on, the other checks (a simulated memory check) still pass.
//!
//! Small filesystems are tmpfs/ramfs mounts made inside a private mount namespace
//! (`unshare -rm`, or `unshare -m` as root), so nothing is mounted on the host. Where neither
//! works the tests fail saying what they need; they never skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_gpuval-agent");

/// Simulated GPUs, a quick memory check beside io.
const SIM_RUN: [&str; 7] = [
    "run",
    "--backend",
    "sim",
    "--simulate",
    "gpus=2",
    "--checks",
    "memory,io",
];

/// The common arguments: [`SIM_RUN`], two io workers, the directory and the report file.
fn agent_args(dir: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = SIM_RUN
        .iter()
        .chain(&["--io-concurrency", "2"])
        .map(|s| s.to_string())
        .collect();
    a.push("--io-dir".into());
    a.push(dir.display().to_string());
    a.push("--output".into());
    a.push(out.display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report at {}: {e}", path.display()));
    serde_json::from_str(&text).expect("the report is JSON")
}

fn io_reason(r: &Value) -> String {
    r["io"]["reasons"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn assert_memory_passed(r: &Value) {
    let gpus = r["gpus"].as_array().expect("a gpus list");
    assert_eq!(gpus.len(), 2);
    for g in gpus {
        assert_eq!(g["memory"]["verdict"], "Pass", "{g}");
        assert_eq!(g["verdict"], "Pass", "{g}");
    }
}

/// `unshare` flags that give this process a private mount namespace, or a panic saying what
/// is needed.
fn unshare_flags() -> &'static str {
    static FLAGS: OnceLock<Result<&'static str, String>> = OnceLock::new();
    let found = FLAGS.get_or_init(|| {
        let mut tried = Vec::new();
        for flags in ["-rm", "-m"] {
            match Command::new("unshare").args([flags, "true"]).output() {
                Ok(o) if o.status.success() => return Ok(flags),
                Ok(o) => tried.push(format!(
                    "unshare {flags}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => tried.push(format!("unshare {flags}: {e}")),
            }
        }
        Err(tried.join("; "))
    });
    match found {
        Ok(f) => f,
        Err(why) => panic!(
            "the io fault tests mount small filesystems in a private mount namespace: run them as root, or allow unprivileged user namespaces (`unshare -rm`): {why}"
        ),
    }
}

/// What a run in a fresh filesystem left behind.
struct NsRun {
    report: Value,
    /// The report as read, None when the run wrote none.
    written: Option<Value>,
    /// The agent's standard error.
    stderr: String,
    exit: i32,
    /// Entries of the directory after the agent exited.
    left: Vec<String>,
}

/// Mounts `fs` with `options` on a fresh directory in a private mount namespace, runs the
/// agent there with `extra` arguments, and lists the directory afterwards.
fn run_in_fresh_fs(fs: &str, options: &str, extra: &[&str]) -> NsRun {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let dir = tmp.path().join("volume");
    std::fs::create_dir(&dir).expect("create the mount point");
    let out = tmp.path().join("report.json");
    let left = tmp.path().join("left.txt");
    let exit = tmp.path().join("exit.txt");
    let script = r#"set -e
fs=$1; options=$2; dir=$3; left=$4; exit_file=$5; shift 5
mount -t "$fs" -o "$options" "$fs" "$dir"
rc=0; "$@" || rc=$?
echo "$rc" > "$exit_file"
ls -A "$dir" > "$left"
"#;
    let mut cmd = Command::new("unshare");
    cmd.arg(unshare_flags())
        .args(["sh", "-c", script, "sh", fs, options])
        .args([&dir, &left, &exit])
        .arg(AGENT)
        .args(agent_args(&dir, &out, extra))
        .env_remove("GPUVAL_IO_DIR");
    let o: Output = cmd.output().expect("run unshare");
    assert!(
        o.status.success(),
        "the namespace script failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let read =
        |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let written = out.exists().then(|| report(&out));
    NsRun {
        report: written.clone().unwrap_or(Value::Null),
        written,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        exit: read(&exit).trim().parse().expect("an exit code"),
        left: read(&left).lines().map(String::from).collect(),
    }
}

/// The run exited 1 with the io check in Error: the report and the io reason.
fn io_error(o: &std::process::Output, out: &Path) -> (Value, String) {
    assert_eq!(o.status.code(), Some(1));
    let r = report(out);
    assert_eq!(r["io"]["verdict"], "Error");
    let reason = io_reason(&r);
    (r, reason)
}

#[test]
fn a_missing_directory_stops_the_run_before_the_gpus_are_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("not-there");
    let out = tmp.path().join("report.json");
    let o = Command::new(AGENT)
        .args(agent_args(&dir, &out, &[]))
        .env_remove("GPUVAL_IO_DIR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains(&format!("{} does not exist", dir.display())),
        "{stderr}"
    );
    assert!(!out.exists(), "no run, no report");
    assert!(!dir.exists());
}

#[test]
fn no_directory_configured_says_how_to_set_one() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("report.json");
    let o = Command::new(AGENT)
        .args(SIM_RUN)
        .arg("-o")
        .arg(&out)
        .env_remove("GPUVAL_IO_DIR")
        .output()
        .unwrap();
    let (r, reason) = io_error(&o, &out);
    assert!(
        reason.contains("--io-dir DIR") && reason.contains("--io-host-path"),
        "{reason}"
    );
    assert_memory_passed(&r);
}

#[test]
fn a_clean_run_passes_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("volume");
    std::fs::create_dir(&dir).unwrap();
    let out = tmp.path().join("report.json");
    let o = Command::new(AGENT)
        .args(agent_args(
            &dir,
            &out,
            &["--io-file-size-mib", "8", "--io-files", "3"],
        ))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = report(&out);
    let io = &r["io"];
    assert_eq!(io["verdict"], "Pass", "{io}");
    assert_eq!(io["bytes"], 3 * 8 * 1024 * 1024);
    assert_eq!(io["mismatches"], 0);
    assert!(io["writeMbps"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(io["readMbps"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(
        io["notes"]
            .to_string()
            .contains("only the GPU figures of this report are simulated"),
        "{io}"
    );
    assert_memory_passed(&r);
    assert_eq!(r["verdict"], "Pass");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// The io check ended in Error with a reason holding every part, the memory check beside it
/// still passed, and the filesystem is empty afterwards.
fn assert_io_error_and_nothing_left(run: &NsRun, parts: &[&str]) {
    assert_eq!(run.exit, 1);
    assert_eq!(run.report["io"]["verdict"], "Error");
    let reason = io_reason(&run.report);
    for part in parts {
        assert!(reason.contains(part), "{part:?} not in {reason}");
    }
    assert_memory_passed(&run.report);
    assert!(run.left.is_empty(), "{:?}", run.left);
}

#[test]
fn a_read_only_filesystem_stops_the_run_naming_it() {
    let run = run_in_fresh_fs("tmpfs", "size=8m,ro", &[]);
    assert_eq!(run.exit, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("is on a read-only filesystem (EROFS)"),
        "{}",
        run.stderr
    );
    assert!(run.written.is_none(), "no run, no report");
    assert!(run.left.is_empty(), "{:?}", run.left);
}

#[test]
fn files_larger_than_free_space_fail_before_writing() {
    // 4 files of 8 MiB into 16 MiB
    let run = run_in_fresh_fs(
        "tmpfs",
        "size=16m",
        &["--io-file-size-mib", "8", "--io-files", "4"],
    );
    assert_io_error_and_nothing_left(
        &run,
        &[
            "not enough free space in ",
            "(4 files of 8 MiB, plus a margin)",
            "the filesystem has 16 MiB free",
        ],
    );
}

#[test]
fn disk_full_mid_run_names_enospc_and_leaves_nothing() {
    // 3 files of 8 MiB into 16 MiB with the pre-flight off (a hidden test flag), so the write
    // phase itself meets the full filesystem: the path a disk filled by someone else during
    // the check takes.
    let run = run_in_fresh_fs(
        "tmpfs",
        "size=16m",
        &[
            "--io-file-size-mib",
            "8",
            "--io-files",
            "3",
            "--io-skip-preflight",
        ],
    );
    assert_io_error_and_nothing_left(
        &run,
        &[
            "disk full (ENOSPC) in ",
            "while writing file-0000",
            " at offset ",
        ],
    );
}

#[test]
fn o_direct_refused_falls_back_to_buffered_and_says_so() {
    // ramfs never takes O_DIRECT (tmpfs does since Linux 6.6)
    let run = run_in_fresh_fs(
        "ramfs",
        "mode=0755",
        &["--io-file-size-mib", "4", "--io-files", "2"],
    );
    let io = &run.report["io"];
    assert_eq!(run.exit, 0, "{io}");
    assert_eq!(io["verdict"], "Pass", "{io}");
    assert_eq!(io["directIo"], false);
    let note = io["directIoNote"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("ramfs refused O_DIRECT (EINVAL at open): buffered I/O"),
        "{note}"
    );
    assert!(run.left.is_empty(), "{:?}", run.left);
}
