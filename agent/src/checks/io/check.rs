//! The io check as the runner sees it: real file I/O on the host (not the GPUs), alone after the
//! GPU checks or on its own thread beside the compute burn (`duringCompute`). Its errors never
//! stop the other checks.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use gpuval_crds::{IoCheck, IoResult, Verdict};

use super::judge::{self, Context};
use super::{IoError, IoOutcome, IoRequest, Tuning, human};
use crate::backend::sim::disk::DiskFault;
use crate::check::given;
use crate::run_control::{ProgressSink, RunControl, ThrottledProgress};

/// The io check as its spec and the node's settings ask for it.
pub struct Io {
    pub spec: IoCheck,
    /// Where it writes (the admin-allowed node volume on Kubernetes, any path on bare metal);
    /// None: an Error saying how to set it.
    pub dir: Option<PathBuf>,
    pub tuning: Tuning,
    pub context: Context,
}

/// What the engine did: its figures, or the error that stopped it.
pub type IoMeasured = Result<IoOutcome, IoError>;

impl Io {
    pub const NAME: &'static str = "io";

    /// `beside_compute`: whether it runs on a thread beside the compute burn (asked for and a
    /// compute check to join); `simulated`: whether the GPU figures beside it are simulated.
    pub fn new(
        spec: &IoCheck,
        dir: Option<PathBuf>,
        tuning: Tuning,
        beside_compute: bool,
        simulated: bool,
    ) -> Self {
        Self {
            spec: spec.clone(),
            dir,
            tuning,
            context: Context {
                during_compute: beside_compute,
                no_compute_to_join: spec.during_compute && !beside_compute,
                simulated_backend: simulated,
            },
        }
    }

    /// Runs the engine with progress lines (`[io] starting: 4 files of 1.0 GiB in /data with 4
    /// workers`, `[io]  40% ...`, `[io] done: ...`); `planted`: the failing disk a simulated
    /// node plants in the real file I/O.
    pub fn measure(
        &self,
        stop: &AtomicBool,
        sink: ProgressSink<'_>,
        planted: Option<DiskFault>,
    ) -> IoMeasured {
        let Some(dir) = self.dir.as_deref() else {
            let e = IoError::NoDirectory;
            sink(&format!("[io] error: {e}"));
            return Err(e);
        };
        let mut req = self.tuning.apply(IoRequest::from_spec(&self.spec, dir));
        req.planted = planted;
        sink(&format!(
            "[io] starting: {} files of {} in {} with {} workers{}{}",
            req.files,
            human(req.file_size),
            dir.display(),
            req.concurrency,
            if self.context.during_compute {
                ", beside the compute burn"
            } else {
                ""
            },
            planted.map_or(String::new(), |p| format!(
                " [SIMULATED failing disk: disk={p}]"
            ))
        ));
        let throttled = ThrottledProgress::new(sink, "[io]");
        let progress = |done: f64, note: &str| throttled.report(done, note);
        let r = super::run(&req, &RunControl::new(stop, &progress));
        match &r {
            Ok(out) => sink(&format!(
                "[io] done: write {:.0} MB/s, read {:.0} MB/s, {} bad words",
                out.write_mbps(),
                out.read_mbps(),
                out.mismatches
            )),
            Err(e) => sink(&format!("[io] error: {e}")),
        }
        r
    }

    /// Judges what the engine did; an engine error is the result's Error. A failing disk the
    /// simulated backend planted says so in the result's notes.
    pub fn judge(&self, measured: IoMeasured, planted: Option<DiskFault>) -> IoResult {
        let mut r = match measured {
            Ok(out) => judge::io(&self.spec, &out, self.context),
            Err(e) => judge::io_error(&self.spec, self.dir.as_deref(), &e, self.context),
        };
        if let Some(p) = planted {
            r.notes.push(format!(
                "SIMULATED failing disk (disk={p}): the simulated backend planted this error in the real file I/O"
            ));
        }
        r
    }

    /// The result of an io thread that panicked.
    pub fn panicked() -> IoResult {
        IoResult {
            verdict: Verdict::Error,
            reasons: vec![gpuval_crds::Reason::new(
                gpuval_crds::Code::IoError,
                "io: the io check panicked",
            )],
            ..Default::default()
        }
    }
}

/// Command-line flags of the io check.
#[derive(clap::Args, Debug, Clone, Default)]
#[group(skip)]
pub struct Flags {
    /// io: size of each file, MiB.
    #[arg(long)]
    pub io_file_size_mib: Option<i32>,
    /// io: number of files written and read back.
    #[arg(long)]
    pub io_files: Option<i32>,
    /// io: concurrent writers and readers.
    #[arg(long)]
    pub io_concurrency: Option<i32>,
    /// io: buffered I/O instead of O_DIRECT.
    #[arg(long)]
    pub io_buffered: bool,
    /// io: run beside the compute burn instead of after the GPU checks.
    #[arg(long)]
    pub io_during_compute: bool,
    /// io: fail below this write throughput, MB/s.
    #[arg(long)]
    pub io_min_write_mbps: Option<i32>,
    /// io: fail below this read throughput, MB/s.
    #[arg(long)]
    pub io_min_read_mbps: Option<i32>,
}

impl Flags {
    /// Applies the flags that were given to the check's settings.
    pub fn apply(&self, spec: &mut IoCheck) {
        let Self {
            io_file_size_mib,
            io_files,
            io_concurrency,
            io_buffered,
            io_during_compute,
            io_min_write_mbps,
            io_min_read_mbps,
        } = self;
        given(&mut spec.file_size_mib, io_file_size_mib);
        given(&mut spec.files, io_files);
        given(&mut spec.concurrency, io_concurrency);
        spec.direct_io &= !*io_buffered;
        spec.during_compute |= *io_during_compute;
        spec.min_write_mbps = io_min_write_mbps.or(spec.min_write_mbps);
        spec.min_read_mbps = io_min_read_mbps.or(spec.min_read_mbps);
    }
}
