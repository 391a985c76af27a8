//! The file I/O check ("io"): heavy file I/O in one directory of the node. C workers write N
//! files of S bytes with an address-dependent pattern, fsync each file and the directory, then
//! C workers read everything back and check every 8-byte word. O_DIRECT where the filesystem
//! allows it; otherwise buffered I/O with the page cache dropped before the read-back, and the
//! result says so. Real file I/O on the host whatever the GPU backend.
//!
//! Everything is written in a fresh subdirectory of the given directory, removed with all its
//! files on success, on error and on stop. Use: [`run`] with an [`IoRequest`], then
//! [`judge::io`] (or [`judge::io_error`]) for the report's [`gpuval_crds::IoResult`].

mod buffer;
mod check;
mod engine;
mod error;
pub mod judge;
mod pattern;
mod pipeline;
mod sys;
mod workdir;

crate::check_result!(gpuval_crds::IoResult);

pub mod row;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpuval_crds::IoCheck;

use crate::backend::sim::disk::DiskFault;
use crate::run_control::RunControl;
pub use check::{Flags, Io, IoMeasured};
pub use engine::file_name;
pub use error::{IoError, human};

const MIB: u64 = 1 << 20;
/// Default I/O size per read and write call, the same as the `dd bs=8M` reference.
pub const DEFAULT_BLOCK_SIZE: usize = 8 << 20;
/// The most memory the I/O buffers may take (a few blocks per worker); with many workers the
/// block size shrinks to fit.
pub const BUFFER_BUDGET: usize = 1 << 30;
/// How many mismatched words are recorded with their place.
pub const MAX_LOGGED: usize = 16;

/// What to run.
#[derive(Clone)]
pub struct IoRequest {
    /// The directory to work in (a fresh subdirectory is made inside it).
    pub dir: PathBuf,
    /// Bytes per file, a positive multiple of 4096.
    pub file_size: u64,
    pub files: u32,
    /// Concurrent writers, and then readers (capped at `files`).
    pub concurrency: u32,
    /// Use O_DIRECT where the filesystem allows it.
    pub direct_io: bool,
    /// Bytes per write and read call, a positive multiple of 4096.
    pub block_size: usize,
    /// Seeds the pattern; a new one per run.
    pub seed: u64,
    /// Check free space before writing (on, except in tests of the mid-run disk-full path).
    pub preflight: bool,
    pub max_logged: usize,
    /// A failing disk the simulated backend plants in the real file I/O (`disk=`); None on
    /// the real backend.
    pub planted: Option<DiskFault>,
}

/// A test callback that gets a directory.
pub(crate) type Hook = Arc<dyn Fn(&Path) + Send + Sync>;

/// Callbacks tests use to interfere with a run at a known point (see [`run_hooked`]); never
/// part of a request.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    /// After the free-space pre-flight passed, before anything is written; gets `dir`.
    pub after_preflight: Option<Hook>,
    /// After every file was written and fsynced, before the read-back; gets the working
    /// subdirectory.
    pub after_write: Option<Hook>,
}

impl std::fmt::Debug for IoRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoRequest")
            .field("dir", &self.dir)
            .field("file_size", &self.file_size)
            .field("files", &self.files)
            .field("concurrency", &self.concurrency)
            .field("direct_io", &self.direct_io)
            .field("block_size", &self.block_size)
            .field("seed", &self.seed)
            .field("preflight", &self.preflight)
            .field("planted", &self.planted)
            .finish_non_exhaustive()
    }
}

impl IoRequest {
    /// `files` files of `file_size` bytes with `concurrency` workers, O_DIRECT, 8 MiB blocks,
    /// a fresh seed.
    pub fn new(dir: impl Into<PathBuf>, file_size: u64, files: u32, concurrency: u32) -> Self {
        Self {
            dir: dir.into(),
            file_size,
            files,
            concurrency,
            direct_io: true,
            block_size: DEFAULT_BLOCK_SIZE,
            seed: fresh_seed(),
            preflight: true,
            max_logged: MAX_LOGGED,
            planted: None,
        }
    }

    /// The request for the spec's io settings in `dir`.
    pub fn from_spec(spec: &IoCheck, dir: impl Into<PathBuf>) -> Self {
        let mut r = Self::new(
            dir,
            u64::try_from(spec.file_size_mib.max(1)).unwrap_or(1) * MIB,
            u32::try_from(spec.files.max(1)).unwrap_or(1),
            u32::try_from(spec.concurrency.max(1)).unwrap_or(1),
        );
        r.direct_io = spec.direct_io;
        r
    }

    /// Bytes written (and read) over all files.
    pub fn total_bytes(&self) -> u64 {
        self.file_size.saturating_mul(u64::from(self.files))
    }

    /// Free space the pre-flight asks for: the files plus 1% and 1 MiB for metadata.
    pub fn space_needed(&self) -> u64 {
        let total = self.total_bytes();
        total.saturating_add(total / 100).saturating_add(MIB)
    }

    fn validate(&self) -> Result<(), IoError> {
        let align = engine::ALIGN as u64;
        let bad = |why: String| Err(IoError::BadRequest(why));
        if self.files == 0 || self.concurrency == 0 {
            return bad("files and concurrency must be at least 1".into());
        }
        if self.file_size == 0 || !self.file_size.is_multiple_of(align) {
            return bad(format!(
                "the file size must be a positive multiple of {align} bytes (got {})",
                self.file_size
            ));
        }
        let chunk = pattern::CHUNK;
        if self.block_size == 0 || !self.block_size.is_multiple_of(chunk) {
            return bad(format!(
                "the block size must be a positive multiple of {chunk} bytes (got {})",
                self.block_size
            ));
        }
        Ok(())
    }
}

/// Engine settings that are not part of the spec (command-line flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Bytes per read and write call (default [`DEFAULT_BLOCK_SIZE`]).
    pub block_size: Option<usize>,
    /// Skip the free-space pre-flight: only for tests that need the write phase itself to
    /// meet a full filesystem.
    pub skip_preflight: bool,
}

impl Tuning {
    pub fn apply(&self, mut req: IoRequest) -> IoRequest {
        if let Some(b) = self.block_size {
            req.block_size = b;
        }
        if self.skip_preflight {
            req.preflight = false;
        }
        req
    }
}

/// A word that read back wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MismatchAt {
    /// File name inside the working directory (see [`file_name`]).
    pub file: String,
    /// Byte offset of the 8-byte word in the file.
    pub offset: u64,
    pub expected: u64,
    pub actual: u64,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IoOutcome {
    pub dir: PathBuf,
    pub fs_type: Option<String>,
    pub files: u32,
    pub file_size: u64,
    /// Workers actually used (at most `files`).
    pub concurrency: u32,
    pub block_size: usize,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// From the first write to the directory's fsync, every file's fsync included.
    pub write_seconds: f64,
    /// From the first read to the last verified word.
    pub read_seconds: f64,
    /// True when O_DIRECT was used for both phases.
    pub direct_io: bool,
    /// Why O_DIRECT was not used and what was done instead (None when it was).
    pub direct_io_note: Option<String>,
    /// Free space before the run; None where the filesystem keeps no size.
    pub free_bytes_before: Option<u64>,
    /// 8-byte words that read back wrong.
    pub mismatches: u64,
    pub first_mismatches: Vec<MismatchAt>,
    /// How the figures were taken, in plain words (not verdict reasons).
    pub notes: Vec<String>,
    /// Set when the working directory could not be removed at the end.
    pub cleanup_error: Option<String>,
    pub seed: u64,
}

impl IoOutcome {
    /// Write throughput in MB/s (1e6 bytes per second).
    pub fn write_mbps(&self) -> f64 {
        mbps(self.bytes_written, self.write_seconds)
    }
    pub fn read_mbps(&self) -> f64 {
        mbps(self.bytes_read, self.read_seconds)
    }
}

fn mbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e6
    } else {
        0.0
    }
}

/// The largest block size (a multiple of the pattern chunk) that keeps every worker's buffers
/// within [`BUFFER_BUDGET`].
fn max_block_size(workers: u32) -> usize {
    let per_buffer = BUFFER_BUDGET / (pipeline::DEPTH * workers.max(1) as usize);
    (per_buffer / pattern::CHUNK).max(1) * pattern::CHUNK
}

fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    pattern::mix(nanos ^ (u64::from(std::process::id()) << 32))
}

/// Runs the check. Errors name what is wrong and what to do; whatever happens, nothing the
/// check wrote is left behind (see [`IoOutcome::cleanup_error`] for the one exception).
pub fn run(req: &IoRequest, ctl: &RunControl<'_>) -> Result<IoOutcome, IoError> {
    run_hooked(req, ctl, &Hooks::default())
}

/// [`run`], with test callbacks at known points.
pub(crate) fn run_hooked(
    req: &IoRequest,
    ctl: &RunControl<'_>,
    hooks: &Hooks,
) -> Result<IoOutcome, IoError> {
    req.validate()?;
    let mut req = req.clone();
    req.block_size = req
        .block_size
        .min(max_block_size(req.concurrency.min(req.files)));
    let req = &req;
    if ctl.stopped() {
        return Err(IoError::Stopped);
    }
    let (mut out, fs_type) = preflight(req)?;
    if let Some(h) = &hooks.after_preflight {
        h(req.dir.as_path());
    }
    write_and_read(req, ctl, hooks, fs_type, &mut out)?;
    Ok(out)
}

/// `dir` exists and is a directory.
fn existing_dir(dir: &Path) -> Result<(), IoError> {
    let meta = std::fs::metadata(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => IoError::MissingDir { dir: dir.into() },
        _ => IoError::classify(e, "stat", dir, dir, 0),
    })?;
    if meta.is_dir() {
        Ok(())
    } else {
        Err(IoError::NotADirectory { dir: dir.into() })
    }
}

/// Whether `dir` can serve the check before anything is measured: it exists, is a directory
/// on a read-write filesystem, and this process can make (and remove) its working directory
/// there. The command line refuses to start on an error (exit 2); it names the path.
pub fn usable_dir(dir: &Path) -> Result<(), IoError> {
    existing_dir(dir)?;
    let probe =
        workdir::WorkDir::create(dir).map_err(|e| IoError::classify(e, "create", dir, dir, 0))?;
    probe
        .remove()
        .map_err(|e| IoError::classify(e, "remove", dir, dir, 0))
}

/// The pre-flight: `req.dir` is a directory, not read-only, with room for the files; returns
/// the outcome's header (with its notes) and the filesystem type.
fn preflight(req: &IoRequest) -> Result<(IoOutcome, Option<&'static str>), IoError> {
    let dir = req.dir.as_path();
    existing_dir(dir)?;
    let fs = sys::fs_info(dir).map_err(|e| IoError::classify(e, "statvfs", dir, dir, 0))?;
    if fs.read_only {
        return Err(IoError::ReadOnly { dir: dir.into() });
    }
    let mut out = IoOutcome {
        dir: dir.into(),
        fs_type: fs.fs_type.map(String::from),
        files: req.files,
        file_size: req.file_size,
        concurrency: req.concurrency.min(req.files),
        block_size: req.block_size,
        free_bytes_before: fs.sized.then_some(fs.free_bytes),
        seed: req.seed,
        ..Default::default()
    };
    if !fs.sized {
        out.notes.push(format!(
            "{} does not report its size ({}): free space was not checked before writing",
            dir.display(),
            fs.fs_type.unwrap_or("unknown filesystem")
        ));
    } else if !req.preflight {
        out.notes
            .push("the free-space pre-flight was skipped (a test setting)".to_string());
    } else if fs.free_bytes < req.space_needed() {
        return Err(IoError::NoSpace {
            dir: dir.into(),
            need: req.space_needed(),
            have: fs.free_bytes,
            files: req.files,
            file_size: req.file_size,
        });
    }
    if fs.fs_type == Some("tmpfs") || fs.fs_type == Some("ramfs") {
        out.notes.push(format!(
            "{} is {}: the files live in memory, so the figures are memory speed, not a disk's",
            dir.display(),
            fs.fs_type.unwrap_or_default()
        ));
    }
    Ok((out, fs.fs_type))
}

/// The write and read-back phases in a fresh working directory, removed at the end; fills in
/// `out`'s figures.
fn write_and_read(
    req: &IoRequest,
    ctl: &RunControl<'_>,
    hooks: &Hooks,
    fs_type: Option<&'static str>,
    out: &mut IoOutcome,
) -> Result<(), IoError> {
    let dir = req.dir.as_path();
    let work = workdir::WorkDir::create(dir)
        .map_err(|e| IoError::classify(e, "create the working directory in", dir, dir, 0))?;
    let (direct, note) = choose_direct(req, work.path(), fs_type)?;
    out.direct_io = direct;
    out.direct_io_note = note;

    let pattern = pattern::Pattern::new(req.seed);
    let phases = engine::Phases::new(req, work.path(), direct, &pattern, ctl);
    tracing::info!(dir = %dir.display(), files = req.files, file_size = req.file_size, concurrency = out.concurrency, direct, "io check: writing");
    out.write_seconds = phases.write()?;
    out.bytes_written = req.total_bytes();
    if let Some(h) = &hooks.after_write {
        h(work.path());
    }
    tracing::info!(
        seconds = out.write_seconds,
        mbps = out.write_mbps(),
        "io check: reading back"
    );
    let back = phases.read()?;
    out.read_seconds = back.seconds;
    out.bytes_read = back.bytes;
    out.mismatches = back.mismatches;
    out.first_mismatches = back.first;
    if let Err(e) = work.remove() {
        out.cleanup_error = Some(format!(
            "could not remove the io check's files in {}: {e}",
            dir.display()
        ));
    }
    Ok(())
}

/// Decides between O_DIRECT and buffered I/O by writing one aligned block with O_DIRECT to a
/// probe file: a filesystem that refuses O_DIRECT says EINVAL at open or at the write.
fn choose_direct(
    req: &IoRequest,
    work: &Path,
    fs_type: Option<&str>,
) -> Result<(bool, Option<String>), IoError> {
    let fallback = "buffered I/O instead, each file fsynced and its page cache dropped (posix_fadvise DONTNEED) before the read-back";
    if !req.direct_io {
        return Ok((
            false,
            Some(format!("direct I/O was not asked for: {fallback}")),
        ));
    }
    let probe = work.join("probe");
    let os = |op, e| IoError::classify(e, op, &req.dir, &probe, 0);
    let refused = |when: &str| {
        Ok((
            false,
            Some(format!(
                "{} refused O_DIRECT (EINVAL at {when}): {fallback}",
                fs_type.unwrap_or("the filesystem")
            )),
        ))
    };
    let f = match sys::open(&probe, true, true) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return refused("open"),
        Err(e) => return Err(os("create", e)),
    };
    let mut buf = buffer::AlignedBuf::new(buffer::ALIGN);
    let written = std::os::unix::fs::FileExt::write_at(&f, buf.as_mut(), 0);
    drop(f);
    std::fs::remove_file(&probe).map_err(|e| os("remove", e))?;
    match written {
        Ok(_) => Ok((true, None)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => refused("write"),
        Err(e) => Err(os("write", e)),
    }
}

/// The table line, when the check ran.
pub fn section(report: &gpuval_crds::NodeReport) -> String {
    report.io.as_ref().map(io_line).unwrap_or_default()
}

/// The headline's part: `io write 1520 MB/s, read 2110 MB/s`.
pub fn headline(report: &gpuval_crds::NodeReport) -> Vec<String> {
    report
        .io
        .as_ref()
        .filter(|io| io.bytes > 0)
        .map(|io| {
            format!(
                "io write {:.0} MB/s, read {:.0} MB/s",
                io.write_mbps, io.read_mbps
            )
        })
        .into_iter()
        .collect()
}

/// `io: Pass (4 × 1024 MiB in /data, ext4, O_DIRECT, 4 workers): write 1520 MB/s, read 2110 MB/s, 0 bad words`
fn io_line(io: &gpuval_crds::IoResult) -> String {
    if io.bytes <= 0 {
        return format!("io: {}\n", io.verdict);
    }
    let mut how = vec![format!(
        "{} × {} MiB in {}",
        io.files, io.file_size_mib, io.dir
    )];
    how.extend(io.fs_type.clone());
    how.push(if io.direct_io { "O_DIRECT" } else { "buffered" }.to_string());
    how.push(format!("{} workers", io.concurrency));
    if io.during_compute {
        how.push("during the burn".into());
    }
    format!(
        "io: {} ({}): write {:.0} MB/s, read {:.0} MB/s, {} bad words\n",
        io.verdict,
        how.join(", "),
        io.write_mbps,
        io.read_mbps,
        io.mismatches
    )
}
