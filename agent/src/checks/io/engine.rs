//! The two timed phases: C workers write the files block by block (O_DIRECT or buffered) and
//! fsync each; then C workers read them back and check every word against the pattern.
//! Workers take the next file from a shared counter; the first error stops the others.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use super::buffer::AlignedBuf;
use super::pattern::Pattern;
use super::{IoError, IoRequest, MismatchAt, pipeline, sys};
use crate::backend::sim::disk::DiskOp;
use crate::run_control::RunControl;

/// O_DIRECT needs buffers, offsets and lengths aligned to the device's logical block; 4 KiB
/// covers 512-byte and 4K-native devices.
pub use super::buffer::ALIGN;

/// What the phases share.
pub struct Phases<'a> {
    pub req: &'a IoRequest,
    pub work: &'a Path,
    pub direct: bool,
    pub pattern: &'a Pattern,
    pub ctl: &'a RunControl<'a>,
    done: AtomicU64,
    abort: AtomicBool,
    started: Instant,
}

/// What the read phase found.
#[derive(Debug, Default)]
pub struct ReadBack {
    pub seconds: f64,
    pub bytes: u64,
    pub mismatches: u64,
    pub first: Vec<MismatchAt>,
}

impl<'a> Phases<'a> {
    pub fn new(
        req: &'a IoRequest,
        work: &'a Path,
        direct: bool,
        pattern: &'a Pattern,
        ctl: &'a RunControl<'a>,
    ) -> Self {
        Self {
            req,
            work,
            direct,
            pattern,
            ctl,
            done: AtomicU64::new(0),
            abort: AtomicBool::new(false),
            started: Instant::now(),
        }
    }

    /// Writes every file and fsyncs it, then fsyncs the directory; returns the seconds taken.
    pub fn write(&self) -> Result<f64, IoError> {
        let t = Instant::now();
        self.pool(|file, buf| self.write_file(file, buf))?;
        sys::sync_dir(self.work).map_err(|e| self.os("fsync", self.work, 0, e))?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Reads every file back and checks it.
    pub fn read(&self) -> Result<ReadBack, IoError> {
        let t = Instant::now();
        let per_file = self.pool(|file, buf| self.read_file(file, buf))?;
        let mut out = ReadBack {
            seconds: t.elapsed().as_secs_f64(),
            ..Default::default()
        };
        for r in per_file {
            out.bytes += r.bytes;
            out.mismatches += r.mismatches;
            out.first.extend(r.first);
        }
        out.first
            .sort_by(|a, b| (&a.file, a.offset).cmp(&(&b.file, b.offset)));
        out.first.truncate(self.req.max_logged);
        Ok(out)
    }

    fn path(&self, file: u32) -> PathBuf {
        self.work.join(file_name(file))
    }

    fn os(&self, op: &'static str, path: &Path, offset: u64, e: io::Error) -> IoError {
        IoError::classify(e, op, &self.req.dir, path, offset)
    }

    /// The error a simulated failing disk gives call `op` of `file` at `offset` instead of
    /// the real outcome (`disk=`; never on the real backend).
    fn planted(&self, op: DiskOp, file: u32, offset: u64) -> io::Result<()> {
        match self.req.planted.and_then(|f| f.error_at(op, file, offset)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Runs `f` on every file with `concurrency` threads, each with its own aligned buffers.
    /// The first error (or a stop) ends the other workers at their next block.
    fn pool<T: Send>(
        &self,
        f: impl Fn(u32, &mut [AlignedBuf]) -> Result<T, IoError> + Sync,
    ) -> Result<Vec<T>, IoError> {
        let next = AtomicU32::new(0);
        let first_error: Mutex<Option<IoError>> = Mutex::new(None);
        let results = Mutex::new(Vec::new());
        let workers = self.req.concurrency.clamp(1, self.req.files.max(1));
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    let mut bufs: Vec<AlignedBuf> = (0..pipeline::DEPTH)
                        .map(|_| AlignedBuf::new(self.req.block_size))
                        .collect();
                    loop {
                        let file = next.fetch_add(1, Ordering::Relaxed);
                        if file >= self.req.files || self.abort.load(Ordering::Relaxed) {
                            break;
                        }
                        match f(file, &mut bufs) {
                            Ok(r) => lock(&results).push(r),
                            Err(e) => {
                                lock(&first_error).get_or_insert(e);
                                self.abort.store(true, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                });
            }
        });
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(results.into_inner().unwrap_or_else(|p| p.into_inner())),
        }
    }

    /// Between blocks: stop when asked to, or when another worker failed.
    fn keep_going(&self) -> Result<(), IoError> {
        if self.ctl.stopped() || self.abort.load(Ordering::Relaxed) {
            Err(IoError::Stopped)
        } else {
            Ok(())
        }
    }

    fn advance(&self, bytes: u64, phase: &str) {
        let done = self.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let total = 2 * self.req.total_bytes();
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        self.ctl.progress(
            done as f64 / total.max(1) as f64,
            &format!("{phase}, {:.0} MB/s so far", done as f64 / secs / 1e6),
        );
    }

    /// Writes one file: the pattern is made on a helper thread while the previous block is
    /// being written.
    fn write_file(&self, file: u32, bufs: &mut [AlignedBuf]) -> Result<(), IoError> {
        let path = self.path(file);
        let f = sys::open(&path, true, self.direct).map_err(|e| self.os("create", &path, 0, e))?;
        let size = self.req.file_size;
        pipeline::run(
            bufs,
            pipeline::blocks(size, self.req.block_size),
            |offset, buf| {
                self.pattern.fill(file, offset, buf);
                Ok(())
            },
            |offset, buf| {
                self.keep_going()?;
                self.planted(DiskOp::Write, file, offset)
                    .map_err(|e| self.os("write", &path, offset, e))?;
                write_full_at(&f, buf, offset).map_err(|(e, at)| self.os("write", &path, at, e))?;
                self.advance(buf.len() as u64, "writing");
                Ok(())
            },
        )?;
        self.planted(DiskOp::Fsync, file, 0)
            .and_then(|()| f.sync_all())
            .map_err(|e| self.os("fsync", &path, size, e))?;
        if !self.direct
            && let Err(e) = sys::drop_cache(&f)
        {
            tracing::warn!(file = %path.display(), error = %e, "could not drop the page cache; the read-back may read memory");
        }
        Ok(())
    }

    /// Reads one file back: blocks are read on a helper thread while the previous one is being
    /// checked.
    fn read_file(&self, file: u32, bufs: &mut [AlignedBuf]) -> Result<ReadBack, IoError> {
        let path = self.path(file);
        let f = sys::open(&path, false, self.direct).map_err(|e| self.os("open", &path, 0, e))?;
        let size = self.req.file_size;
        let name = file_name(file);
        let max = self.req.max_logged;
        let mut out = ReadBack::default();
        pipeline::run(
            bufs,
            pipeline::blocks(size, self.req.block_size),
            |offset, buf| {
                self.keep_going()?;
                let got = self
                    .planted(DiskOp::Read, file, offset)
                    .and_then(|()| read_full_at(&f, buf, offset))
                    .map_err(|e| self.os("read", &path, offset, e))?;
                let got = self
                    .req
                    .planted
                    .map_or(got, |p| p.bytes_read(file, offset, got));
                if got < buf.len() {
                    return Err(IoError::ShortRead {
                        file: name.clone(),
                        got: offset + got as u64,
                        want: size,
                    });
                }
                Ok(())
            },
            |offset, buf| {
                out.mismatches += self
                    .pattern
                    .check(file, offset, buf, |at, expected, actual| {
                        if out.first.len() < max {
                            out.first.push(MismatchAt {
                                file: name.clone(),
                                offset: offset + at as u64,
                                expected,
                                actual,
                            });
                        }
                    });
                out.bytes += buf.len() as u64;
                self.advance(buf.len() as u64, "reading back");
                Ok(())
            },
        )?;
        Ok(out)
    }
}

/// The name of file `i` inside the working directory.
pub fn file_name(i: u32) -> String {
    format!("file-{i:05}")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// pwrite until all of `buf` is written; on failure, the error and the file offset it hit.
fn write_full_at(f: &File, buf: &[u8], offset: u64) -> Result<(), (io::Error, u64)> {
    let mut done = 0usize;
    while done < buf.len() {
        let at = offset + done as u64;
        match f.write_at(&buf[done..], at) {
            Ok(0) => return Err((io::ErrorKind::WriteZero.into(), at)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((e, at)),
        }
    }
    Ok(())
}

/// pread until `buf` is full or the file ends; returns the bytes read.
fn read_full_at(f: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0usize;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
