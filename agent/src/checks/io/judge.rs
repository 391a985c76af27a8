//! Verdict rules of the io check.
//!
//! - a word that read back wrong: Fail (data written to the disk did not come back);
//! - `minWriteMbps` / `minReadMbps` from the spec: Fail naming the figure and the floor;
//! - the check could not run or finish (missing or read-only directory, no space, disk full
//!   mid-run, an I/O error, a stop), or its files could not be removed: Error with the text.
//!
//! There are no built-in floors per GPU model for disks: node storage differs from cluster to
//! cluster far more than GPUs of one model do, so only the spec's figures judge throughput.

use std::path::Path;

use gpuval_crds::{IoCheck, IoMismatch, IoResult, Verdict};

use super::{IoError, IoOutcome, MIB};
use crate::judge::{Code, Says, verdict_of};

/// How the check ran, for the notes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context {
    /// It ran while the compute burn ran.
    pub during_compute: bool,
    /// `duringCompute` was asked for but there was no compute burn to run with.
    pub no_compute_to_join: bool,
    /// The GPU backend is the simulated one (the io figures are real all the same).
    pub simulated_backend: bool,
}

/// Judges a finished run.
pub fn io(spec: &IoCheck, out: &IoOutcome, ctx: Context) -> IoResult {
    let (write, read) = (out.write_mbps(), out.read_mbps());
    let mut reasons = Vec::new();
    if out.mismatches > 0 {
        let first = out
            .first_mismatches
            .first()
            .map(|m| {
                format!(
                    ": first in {} at offset {} (wrote {:#018x}, read {:#018x})",
                    m.file, m.offset, m.expected, m.actual
                )
            })
            .unwrap_or_default();
        reasons.push(Code::IoMismatch.says(format!(
            "io: {} word{} read back wrong in {}{first}",
            out.mismatches,
            if out.mismatches == 1 { "" } else { "s" },
            out.dir.display()
        )));
    }
    for (what, figure, floor, field) in [
        ("write", write, spec.min_write_mbps, "minWriteMbps"),
        ("read", read, spec.min_read_mbps, "minReadMbps"),
    ] {
        if let Some(floor) = floor
            && figure < f64::from(floor)
        {
            reasons.push(Code::IoSlow.says(format!(
                "io: {what} {figure:.0} MB/s < {floor} MB/s (spec {field})"
            )));
        }
    }
    if let Some(e) = &out.cleanup_error {
        reasons.push(Code::IoError.says(format!("io: {e}")));
    }
    IoResult {
        verdict: verdict_of(&reasons),
        reasons,
        dir: out.dir.display().to_string(),
        fs_type: out.fs_type.clone(),
        files: i32::try_from(out.files).unwrap_or(i32::MAX),
        file_size_mib: to_i64(out.file_size / MIB),
        concurrency: i32::try_from(out.concurrency).unwrap_or(i32::MAX),
        bytes: to_i64(out.bytes_written),
        write_mbps: round1(write),
        read_mbps: round1(read),
        write_seconds: round3(out.write_seconds),
        read_seconds: round3(out.read_seconds),
        direct_io: out.direct_io,
        direct_io_note: out.direct_io_note.clone(),
        during_compute: ctx.during_compute,
        free_bytes_before: out.free_bytes_before.map_or(0, to_i64),
        mismatches: to_i64(out.mismatches),
        first_mismatches: out
            .first_mismatches
            .iter()
            .map(|m| IoMismatch {
                file: m.file.clone(),
                offset: to_i64(m.offset),
                expected: format!("{:#018x}", m.expected),
                actual: format!("{:#018x}", m.actual),
            })
            .collect(),
        notes: notes(ctx).chain(out.notes.iter().cloned()).collect(),
    }
}

/// The result of a run that could not run or finish: a directory that cannot serve the check
/// is the installation's to fix ([`Code::IoDirUnusable`], nothing for the node to rerun); a
/// disk that failed an operation or read back short is the node's hardware
/// ([`Code::IoDeviceError`], a Fail).
pub fn io_error(spec: &IoCheck, dir: Option<&Path>, err: &IoError, ctx: Context) -> IoResult {
    let (code, verdict) = if err.is_device_fault() {
        (Code::IoDeviceError, Verdict::Fail)
    } else if err.is_unusable_dir() {
        (Code::IoDirUnusable, Verdict::Error)
    } else {
        (Code::IoError, Verdict::Error)
    };
    IoResult {
        verdict,
        reasons: vec![code.says(format!("io: {err}"))],
        dir: dir.map(|d| d.display().to_string()).unwrap_or_default(),
        files: spec.files,
        file_size_mib: i64::from(spec.file_size_mib),
        concurrency: spec.concurrency,
        during_compute: ctx.during_compute,
        notes: notes(ctx).collect(),
        ..Default::default()
    }
}

fn notes(ctx: Context) -> impl Iterator<Item = String> {
    [
        ctx.during_compute
            .then(|| "ran while the compute burn ran".to_string()),
        ctx.no_compute_to_join.then(|| {
            "duringCompute was asked for but no compute check ran: the io check ran alone"
                .to_string()
        }),
        ctx.simulated_backend.then(|| {
            "real file I/O on this host: only the GPU figures of this report are simulated"
                .to_string()
        }),
    ]
    .into_iter()
    .flatten()
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::super::MismatchAt;
    use super::*;
    use crate::judge::testing::assert_fails_with;

    fn outcome(write_s: f64, read_s: f64) -> IoOutcome {
        IoOutcome {
            dir: "/data".into(),
            files: 4,
            file_size: 1024 * MIB,
            concurrency: 4,
            bytes_written: 4000 * 1_000_000,
            bytes_read: 4000 * 1_000_000,
            write_seconds: write_s,
            read_seconds: read_s,
            direct_io: true,
            ..Default::default()
        }
    }

    /// Write and read floors of 1000 MB/s.
    fn floors_of_1000() -> IoCheck {
        IoCheck {
            min_write_mbps: Some(1000),
            min_read_mbps: Some(1000),
            ..Default::default()
        }
    }

    #[test]
    fn clean_fast_run_passes() {
        let spec = floors_of_1000();
        let r = io(&spec, &outcome(2.0, 1.0), Context::default());
        assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.reasons);
        assert_eq!(r.write_mbps, 2000.0);
        assert_eq!(r.read_mbps, 4000.0);
        assert_eq!(r.file_size_mib, 1024);
        assert!(r.notes.is_empty());
    }

    #[test]
    fn slow_figures_fail_naming_the_figure() {
        let spec = floors_of_1000();
        // 4000 MB in 4.926 s = 812 MB/s
        let r = io(&spec, &outcome(4.926, 1.0), Context::default());
        assert_fails_with(
            r.verdict,
            &r.reasons,
            &["io: write 812 MB/s < 1000 MB/s (spec minWriteMbps)"],
        );
        let r = io(&spec, &outcome(1.0, 8.0), Context::default());
        assert_eq!(
            r.reasons,
            vec!["io: read 500 MB/s < 1000 MB/s (spec minReadMbps)"]
        );
        // no floor in the spec: no throughput rule at all
        let r = io(
            &IoCheck::default(),
            &outcome(400.0, 400.0),
            Context::default(),
        );
        assert_eq!(r.verdict, Verdict::Pass);
    }

    #[test]
    fn mismatches_fail_with_the_first_place() {
        let mut o = outcome(1.0, 1.0);
        o.mismatches = 3;
        o.first_mismatches = vec![MismatchAt {
            file: "file-00002".into(),
            offset: 8 << 20,
            expected: 0xdead,
            actual: 0xbeef,
        }];
        let r = io(&IoCheck::default(), &o, Context::default());
        assert_fails_with(
            r.verdict,
            &r.reasons,
            &[
                "io: 3 words read back wrong in /data: first in file-00002 at offset 8388608 (wrote 0x000000000000dead, read 0x000000000000beef)",
            ],
        );
        assert_eq!(r.first_mismatches[0].offset, 8 << 20);
        assert_eq!(r.mismatches, 3);
    }

    #[test]
    fn leftover_files_and_engine_errors_are_errors() {
        let mut o = outcome(1.0, 1.0);
        o.cleanup_error = Some("could not remove the io check's files in /data: EBUSY".into());
        assert_eq!(
            io(&IoCheck::default(), &o, Context::default()).verdict,
            Verdict::Error
        );
        let e = IoError::MissingDir {
            dir: "/nope".into(),
        };
        let ctx = Context {
            simulated_backend: true,
            ..Default::default()
        };
        let r = io_error(&IoCheck::default(), Some(Path::new("/nope")), &e, ctx);
        assert_eq!(r.verdict, Verdict::Error);
        assert!(r.reasons[0].starts_with("io: io directory /nope does not exist"));
        assert_eq!(r.dir, "/nope");
        assert!(r.notes[0].contains("only the GPU figures"), "{:?}", r.notes);
    }

    #[test]
    fn a_directory_that_cannot_serve_the_check_is_the_installation_s_not_a_rerun() {
        let dir = Path::new("/data/gpuval");
        let unusable = [
            IoError::MissingDir { dir: dir.into() },
            IoError::NotADirectory { dir: dir.into() },
            IoError::ReadOnly { dir: dir.into() },
            IoError::NotWritable {
                dir: dir.into(),
                errno: "EACCES",
            },
        ];
        for e in &unusable {
            let r = io_error(&IoCheck::default(), Some(dir), e, Context::default());
            let reason = &r.reasons[0];
            assert_eq!(reason.code, Code::IoDirUnusable, "{e}");
            assert_eq!(reason.action, gpuval_crds::Action::None);
            assert_eq!(
                gpuval_crds::evidence::Evidence::of_codes(Code::IoDirUnusable.as_str()),
                gpuval_crds::evidence::Evidence::Configuration
            );
            assert!(reason.message.contains("/data/gpuval"), "{reason:?}");
        }
        let stopped = io_error(
            &IoCheck::default(),
            Some(dir),
            &IoError::Stopped,
            Context::default(),
        );
        assert_eq!(
            stopped.reasons[0].code,
            Code::IoError,
            "not the directory's fault"
        );
    }

    /// EIO from the device and a file that reads back short are the disk's fault: hardware
    /// evidence with a hardware action, never the installation's settings.
    #[test]
    fn eio_and_short_reads_are_the_disk_s_hardware_fault() {
        let dir = Path::new("/data/gpuval");
        let file = dir.join("w/file-0003");
        let faults = [
            IoError::classify(
                std::io::Error::from_raw_os_error(libc::EIO),
                "read",
                dir,
                &file,
                8 << 20,
            ),
            IoError::ShortRead {
                file: "file-0003".into(),
                got: 4096,
                want: 1 << 30,
            },
        ];
        for e in &faults {
            let r = io_error(&IoCheck::default(), Some(dir), e, Context::default());
            assert_eq!(r.verdict, Verdict::Fail, "{e}");
            let reason = &r.reasons[0];
            assert_eq!(reason.code, Code::IoDeviceError, "{e}");
            assert_eq!(reason.action, gpuval_crds::Action::ReplaceHardware);
            assert!(reason.message.contains("file-0003"), "{reason:?}");
            assert_eq!(
                gpuval_crds::evidence::Evidence::of_codes(reason.code.as_str()),
                gpuval_crds::evidence::Evidence::Hardware,
                "{e}"
            );
        }
        let eio = faults[0].to_string();
        assert!(eio.contains("EIO") && eio.contains("the disk"), "{eio}");
    }

    #[test]
    fn notes_say_how_it_ran() {
        let ctx = Context {
            during_compute: true,
            ..Default::default()
        };
        let mut o = outcome(1.0, 1.0);
        o.notes.push("tmpfs".into());
        let r = io(&IoCheck::default(), &o, ctx);
        assert!(r.during_compute);
        assert_eq!(r.notes, vec!["ran while the compute burn ran", "tmpfs"]);
    }
}
