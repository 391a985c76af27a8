//! Engine tests: round trip, planted corruption, errors, stops, cleanup on every path. Tests
//! that need their own small filesystem (tmpfs, ramfs) run in a private mount namespace: the
//! test re-runs itself under `unshare -rm` (works as root and, where user namespaces are
//! allowed, unprivileged), so nothing is mounted on the host.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::*;
use crate::judge::testing::assert_any_contains;

const KIB: u64 = 1024;

fn quiet() -> impl Fn(f64, &str) + Sync {
    |_, _| {}
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn small(dir: &Path, file_size: u64, files: u32, concurrency: u32) -> IoRequest {
    let mut r = IoRequest::new(dir, file_size, files, concurrency);
    r.block_size = 256 * KIB as usize;
    r
}

#[test]
fn round_trip_writes_reads_verifies_and_cleans_up() {
    let d = tempfile::tempdir().unwrap();
    // 5 files, 2 workers, a file size that is not a whole number of blocks
    let req = small(d.path(), 640 * KIB, 5, 2);
    let stop = AtomicBool::new(false);
    let calls = AtomicUsize::new(0);
    let progress = |done: f64, _: &str| {
        assert!((0.0..=1.0).contains(&done));
        calls.fetch_add(1, Ordering::Relaxed);
    };
    let out = run(&req, &RunControl::new(&stop, &progress)).unwrap();
    assert_eq!(out.mismatches, 0, "{:?}", out.first_mismatches);
    assert_eq!(out.bytes_written, 5 * 640 * KIB);
    assert_eq!(out.bytes_read, 5 * 640 * KIB);
    assert_eq!(out.concurrency, 2);
    assert!(out.write_seconds > 0.0 && out.read_seconds > 0.0);
    assert!(out.write_mbps() > 0.0 && out.read_mbps() > 0.0);
    assert!(out.free_bytes_before.is_some_and(|f| f > 0));
    assert!(out.cleanup_error.is_none());
    // 3 blocks per file, each phase
    assert_eq!(calls.load(Ordering::Relaxed), 2 * 5 * 3);
    assert_eq!(entries(d.path()), Vec::<String>::new());
}

#[test]
fn planted_corruption_and_a_misplaced_block_are_found() {
    let d = tempfile::tempdir().unwrap();
    let mut req = small(d.path(), 1024 * KIB, 3, 3);
    req.block_size = 64 * KIB as usize;
    let hooks = Hooks {
        after_write: Some(Arc::new(|work: &Path| {
            // a flipped byte in file 1 at 300 KiB + 21 (word at +16)
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(work.join(file_name(1)))
                .unwrap();
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, 300 * KIB + 21).unwrap();
            f.write_all_at(&[b[0] ^ 0x40], 300 * KIB + 21).unwrap();
            // file 2's block 0 copied over its block 5 (a write that landed at the wrong place)
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(work.join(file_name(2)))
                .unwrap();
            let mut block = vec![0u8; 64 * KIB as usize];
            f.read_exact_at(&mut block, 0).unwrap();
            f.write_all_at(&block, 5 * 64 * KIB).unwrap();
            f.sync_all().unwrap();
        })),
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let out = run_hooked(&req, &RunControl::new(&stop, &quiet()), &hooks).unwrap();
    assert_eq!(out.mismatches, 1 + 64 * KIB / 8);
    let first = &out.first_mismatches[0];
    assert_eq!(first.file, "file-00001");
    assert_eq!(first.offset, 300 * KIB + 16);
    assert_eq!(first.expected ^ first.actual, 0x40 << 40);
    let second = &out.first_mismatches[1];
    assert_eq!(
        (second.file.as_str(), second.offset),
        ("file-00002", 5 * 64 * KIB)
    );
    assert_eq!(out.first_mismatches.len(), MAX_LOGGED);
    assert_eq!(entries(d.path()), Vec::<String>::new());
}

#[test]
fn an_error_mid_run_names_the_file_and_leaves_nothing() {
    let d = tempfile::tempdir().unwrap();
    let req = small(d.path(), 256 * KIB, 4, 2);
    let hooks = Hooks {
        after_write: Some(Arc::new(|work: &Path| {
            std::fs::remove_file(work.join(file_name(2))).unwrap();
        })),
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let err = run_hooked(&req, &RunControl::new(&stop, &quiet()), &hooks).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("open ") && text.contains("file-00002"),
        "{text}"
    );
    assert_eq!(entries(d.path()), Vec::<String>::new());
}

#[test]
fn a_stop_mid_write_ends_the_run_and_leaves_nothing() {
    let d = tempfile::tempdir().unwrap();
    let req = small(d.path(), 4096 * KIB, 4, 2);
    let stop = AtomicBool::new(false);
    let blocks = AtomicUsize::new(0);
    // stop after the third block written (of 64)
    let progress = |_: f64, _: &str| {
        if blocks.fetch_add(1, Ordering::Relaxed) == 2 {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let err = run(&req, &RunControl::new(&stop, &progress)).unwrap_err();
    assert!(matches!(err, IoError::Stopped), "{err}");
    // each worker finishes at most the block it was on
    assert!(blocks.load(Ordering::Relaxed) <= 4, "{blocks:?}");
    assert_eq!(entries(d.path()), Vec::<String>::new());
}

#[test]
fn many_workers_get_smaller_blocks() {
    // 1 GiB over 3 buffers per worker, rounded down to 64 KiB
    assert_eq!(max_block_size(4), 89_456_640);
    assert_eq!(max_block_size(256), 1_376_256);
    assert_eq!(max_block_size(100_000), pattern::CHUNK);
    let d = tempfile::tempdir().unwrap();
    let mut req = small(d.path(), 256 * KIB, 2, 2);
    req.block_size = 2 << 30;
    let stop = AtomicBool::new(false);
    let out = run(&req, &RunControl::new(&stop, &quiet())).unwrap();
    assert_eq!(out.block_size, max_block_size(2));
}

#[test]
fn bad_directories_and_requests_are_named() {
    let d = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let p = quiet();
    let ctl = RunControl::new(&stop, &p);
    let missing = d.path().join("missing");
    let t = run(&small(&missing, 4096, 1, 1), &ctl)
        .unwrap_err()
        .to_string();
    assert!(t.contains("does not exist") && t.contains("missing"), "{t}");
    let file = d.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let t = run(&small(&file, 4096, 1, 1), &ctl)
        .unwrap_err()
        .to_string();
    assert!(t.contains("is not a directory"), "{t}");
    let t = run(&small(d.path(), 1000, 1, 1), &ctl)
        .unwrap_err()
        .to_string();
    assert!(t.contains("multiple of 4096"), "{t}");
    assert_eq!(entries(d.path()), vec!["a-file"]);
}

#[test]
fn files_larger_than_free_space_fail_before_writing() {
    let d = tempfile::tempdir().unwrap();
    let req = small(d.path(), 1 << 50, 4, 4);
    let wrote = Arc::new(AtomicBool::new(false));
    let w = wrote.clone();
    let hooks = Hooks {
        after_preflight: Some(Arc::new(move |_: &Path| w.store(true, Ordering::Relaxed))),
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let err = run_hooked(&req, &RunControl::new(&stop, &quiet()), &hooks).unwrap_err();
    let t = err.to_string();
    assert!(matches!(err, IoError::NoSpace { .. }), "{t}");
    assert!(t.starts_with("not enough free space in "), "{t}");
    assert!(t.contains("(4 files of 1024 TiB, plus a margin)"), "{t}");
    assert!(!wrote.load(Ordering::Relaxed));
    assert_eq!(entries(d.path()), Vec::<String>::new());
}

#[test]
fn buffered_io_when_direct_io_is_not_asked_for() {
    let d = tempfile::tempdir().unwrap();
    let mut req = small(d.path(), 512 * KIB, 2, 2);
    req.direct_io = false;
    let stop = AtomicBool::new(false);
    let out = run(&req, &RunControl::new(&stop, &quiet())).unwrap();
    assert!(!out.direct_io);
    let note = out.direct_io_note.unwrap_or_default();
    assert!(
        note.contains("not asked for") && note.contains("DONTNEED"),
        "{note}"
    );
    assert_eq!(out.mismatches, 0);
}

// ---- in a private mount namespace ----

const IN_NS: &str = "GPUVAL_IO_TEST_IN_NAMESPACE";

/// Runs test `name` again in a new user + mount namespace (where it may mount), and fails
/// with what is needed when no namespace can be had. Returns true in the child, where the
/// test body should run.
fn in_mount_namespace(name: &str) -> bool {
    if std::env::var_os(IN_NS).is_some() {
        return true;
    }
    let exe = std::env::current_exe().unwrap();
    let mut tried = Vec::new();
    for flags in ["-rm", "-m"] {
        let out = Command::new("unshare")
            .arg(flags)
            .arg(&exe)
            .args([
                "--exact",
                &format!("checks::io::tests::{name}"),
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env(IN_NS, "1")
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                assert!(text.contains("1 passed"), "the test did not run: {text}");
                return false;
            }
            Ok(o) if String::from_utf8_lossy(&o.stdout).contains("running 1 test") => {
                panic!(
                    "{name} failed in its namespace:\n{}\n{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            Ok(o) => tried.push(format!(
                "unshare {flags}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => tried.push(format!("unshare {flags}: {e}")),
        }
    }
    panic!(
        "{name} needs a private mount namespace (root, or unprivileged user namespaces for `unshare -rm`): {}",
        tried.join("; ")
    );
}

/// A mount, unmounted when dropped (before the temporary directory under it goes).
struct Mounted(std::path::PathBuf);

fn mount(fs: &str, options: &str, at: &Path) -> Mounted {
    let st = Command::new("mount")
        .args(["-t", fs, "-o", options, fs])
        .arg(at)
        .status()
        .unwrap();
    assert!(st.success(), "mount -t {fs} -o {options} {}", at.display());
    Mounted(at.into())
}

/// A fresh `fs` mounted with `options` on a new temporary directory, inside the private mount
/// namespace test `test` runs in; None in the outer process (which ran the test in there).
fn fresh_mount(test: &str, fs: &str, options: &str) -> Option<(tempfile::TempDir, Mounted)> {
    if !in_mount_namespace(test) {
        return None;
    }
    let d = tempfile::tempdir().unwrap();
    let m = mount(fs, options, d.path());
    Some((d, m))
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn o_direct_refused_falls_back_and_says_so() {
    // tmpfs takes O_DIRECT since Linux 6.6; ramfs never has.
    let Some((d, _m)) = fresh_mount(
        "o_direct_refused_falls_back_and_says_so",
        "ramfs",
        "mode=0700",
    ) else {
        return;
    };
    let req = small(d.path(), 512 * KIB, 2, 2);
    let stop = AtomicBool::new(false);
    let out = run(&req, &RunControl::new(&stop, &quiet())).unwrap();
    assert!(!out.direct_io);
    let note = out.direct_io_note.clone().unwrap_or_default();
    assert!(
        note.starts_with("ramfs refused O_DIRECT (EINVAL at open): buffered I/O"),
        "{note}"
    );
    assert_eq!(out.mismatches, 0);
    assert!(out.free_bytes_before.is_none());
    assert_any_contains(&out.notes, "does not report its size");
    assert_any_contains(&out.notes, "memory speed");
    assert_eq!(entries(d.path()), Vec::<String>::new());
}

#[test]
fn disk_full_after_the_preflight_is_named_and_cleaned_up() {
    let Some((d, _m)) = fresh_mount(
        "disk_full_after_the_preflight_is_named_and_cleaned_up",
        "tmpfs",
        "size=16m",
    ) else {
        return;
    };
    let req = small(d.path(), 4096 * KIB, 3, 3);
    // The pre-flight sees 16 MiB free for 12 MiB of files; then another writer takes all but
    // 5 MiB, as a neighbour filling the disk during the check would.
    let hooks = Hooks {
        after_preflight: Some(Arc::new(|dir: &Path| {
            let free = sys::fs_info(dir).unwrap().free_bytes;
            let f = std::fs::File::create(dir.join("neighbour")).unwrap();
            f.write_all_at(&vec![1u8; (free - 5 * MIB) as usize], 0)
                .unwrap();
        })),
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let err = run_hooked(&req, &RunControl::new(&stop, &quiet()), &hooks).unwrap_err();
    let t = err.to_string();
    match &err {
        IoError::DiskFull {
            errno,
            file,
            offset,
            ..
        } => {
            assert_eq!(*errno, "ENOSPC");
            assert!(file.starts_with("file-0000"), "{t}");
            assert!(*offset < 4096 * KIB, "{t}");
        }
        other => panic!("expected disk full, got {other}"),
    }
    assert!(t.contains("disk full (ENOSPC)"), "{t}");
    assert_eq!(entries(d.path()), vec!["neighbour"]);
}

#[test]
fn read_only_filesystem_is_named() {
    let Some((d, _m)) = fresh_mount("read_only_filesystem_is_named", "tmpfs", "size=8m,ro") else {
        return;
    };
    let stop = AtomicBool::new(false);
    let err = run(
        &small(d.path(), 4096, 1, 1),
        &RunControl::new(&stop, &quiet()),
    )
    .unwrap_err();
    assert!(matches!(err, IoError::ReadOnly { .. }), "{err}");
    assert!(err.to_string().contains("read-only filesystem (EROFS)"));
}

#[test]
fn a_planted_failing_disk_meets_the_check_where_the_kernel_would() {
    use crate::backend::sim::disk::DiskFault;
    let d = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let p = quiet();
    let ran = |fault: &str| {
        let mut req = small(d.path(), 512 * KIB, 3, 2);
        req.planted = Some(fault.parse::<DiskFault>().expect("a disk fault"));
        let e = run(&req, &RunControl::new(&stop, &p)).expect_err(fault);
        assert_eq!(
            entries(d.path()),
            Vec::<String>::new(),
            "{fault}: cleaned up"
        );
        e
    };
    for (fault, op) in [
        ("eio@read", "read"),
        ("eio@write", "write"),
        ("eio@fsync", "fsync"),
    ] {
        let e = ran(fault);
        assert!(e.is_device_fault(), "{fault}: {e}");
        let t = e.to_string();
        assert!(
            t.starts_with(op) && t.contains("file-00000: EIO"),
            "{fault}: {t}"
        );
    }
    let short = ran("short@read");
    assert!(
        matches!(short, IoError::ShortRead { ref file, got, want } if file == "file-00000" && got == 128 * KIB && want == 512 * KIB),
        "{short:?}"
    );
    // A full filesystem is no fault of the disk.
    let full = ran("full@write");
    assert!(
        matches!(
            full,
            IoError::DiskFull {
                errno: "ENOSPC",
                ..
            }
        ),
        "{full:?}"
    );
    assert!(!full.is_device_fault());
}
