//! The contract every check implements, and the shared fan-out that measures it.
//!
//! A check is measured in one of two scopes: [`GpuCheck`] on every GPU at once (one thread
//! each), or [`NodeCheck`] once for the whole node (all pairs, all GPUs together, the node's
//! disk). Measuring and judging are separate passes: [`Stage`] measures, with progress lines and
//! stop handling; the check's `judge` then turns what was measured into report results.
//!
//! Both passes take the same shape: `measure(&self, on)` with what it measures with
//! ([`OnGpu`] / [`OnNode`]: the backend, the GPU(s), the run control), and
//! `judge(&self, on, measured, into)` with what it judges by ([`JudgeGpu`] / [`JudgeNode`]: the
//! run's [`Judge`] and the GPU(s)), the [`Measurement`] the first pass produced (an error
//! included: the check judges it too, as an Error result) and the report it writes into.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use gpuval_crds::{GpuReport, NodeReport};

use crate::backend::{Backend, BackendError, GpuInfo};
use crate::judge::Judge;
use crate::run_control::{ProgressSink, RunControl, ThrottledProgress};

/// What a check's measuring produced: its outcome, or the backend error that stopped it.
pub type Measurement<T> = Result<T, BackendError>;

/// Sets `setting` to a flag's value where the flag was given: how each check's settings take a
/// command-line override (the checks' flags are resolved here, below the checks, so that no check
/// imports the entry points' `config`).
pub fn given<T: Clone>(setting: &mut T, flag: &Option<T>) {
    if let Some(v) = flag {
        *setting = v.clone();
    }
}

/// A check measured on every GPU at once; its result sits in each GPU's report.
pub trait GpuCheck: Sync {
    /// The check's name in the spec, `--checks` and progress lines.
    const NAME: &'static str;
    /// What one GPU's measurement produced.
    type Outcome: Send;
    /// Measures one GPU (called on every GPU at once, one thread each).
    fn measure(&self, on: &OnGpu<'_>) -> Measurement<Self::Outcome>;
    /// Judges one GPU's measurement (or the error that stopped it) into its report.
    fn judge(&self, on: &JudgeGpu<'_>, measured: Measurement<Self::Outcome>, into: &mut GpuReport);
    /// Rules across the node's GPUs once every GPU is judged (the relative rule).
    fn compare(&self, _judge: &Judge<'_>, _gpus: &mut [GpuReport]) {}
}

/// A check measured once for the whole node; its judge writes wherever its results belong.
pub trait NodeCheck: Sync {
    /// The check's name in the spec, `--checks` and progress lines.
    const NAME: &'static str;
    /// What the node-wide measurement produced.
    type Outcome: Send;
    /// Why the check has nothing to measure on these GPUs (and the outcome that stands for
    /// it), if so: `fewer than two GPUs` for the pairs of one GPU.
    fn skipped(&self, _gpus: &[GpuInfo]) -> Option<(&'static str, Self::Outcome)> {
        None
    }
    /// Measures the node.
    fn measure(&self, on: &OnNode<'_>) -> Measurement<Self::Outcome>;
    /// Judges the measurement (or the error that stopped it) into the node report, whose
    /// `gpus` are already in place.
    fn judge(
        &self,
        on: &JudgeNode<'_>,
        measured: Measurement<Self::Outcome>,
        into: &mut NodeReport,
    );
}

/// What a [`GpuCheck`] measures one GPU with: the backend, the GPU, its stop flag and progress.
pub struct OnGpu<'a> {
    pub backend: &'a Backend,
    pub gpu: &'a GpuInfo,
    pub ctl: &'a RunControl<'a>,
}

/// What a [`NodeCheck`] measures the node with: the backend, every GPU, the stop flag and
/// progress.
pub struct OnNode<'a> {
    pub backend: &'a Backend,
    pub gpus: &'a [GpuInfo],
    pub ctl: &'a RunControl<'a>,
}

/// What a [`GpuCheck`] judges one GPU by: the run's judge (thresholds, profiles, overrides) and
/// the GPU.
#[derive(Clone, Copy)]
pub struct JudgeGpu<'a> {
    pub judge: &'a Judge<'a>,
    pub gpu: &'a GpuInfo,
}

/// What a [`NodeCheck`] (and the judging pass as a whole) judges the node by: the run's judge
/// and every GPU, in the order of the report's `gpus`.
#[derive(Clone, Copy)]
pub struct JudgeNode<'a> {
    pub judge: &'a Judge<'a>,
    pub gpus: &'a [GpuInfo],
}

impl<'a> JudgeNode<'a> {
    /// The same judge, for one of the node's GPUs.
    pub fn gpu(&self, gpu: &'a GpuInfo) -> JudgeGpu<'a> {
        JudgeGpu {
            judge: self.judge,
            gpu,
        }
    }
}

/// What one measuring pass runs against: the backend, the GPUs, the stop flag, the progress sink.
#[derive(Clone, Copy)]
pub struct Stage<'a> {
    pub backend: &'a Backend,
    pub gpus: &'a [GpuInfo],
    pub stop: &'a AtomicBool,
    pub sink: ProgressSink<'a>,
}

impl Stage<'_> {
    /// True once a stop was requested.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Measures `check` on every GPU at once (one thread each), with throttled progress lines
    /// per GPU (`[memory] GPU3  40% ...`).
    pub fn on_every_gpu<C: GpuCheck>(&self, check: &C) -> HashMap<u32, Measurement<C::Outcome>> {
        let name = C::NAME;
        (self.sink)(&format!("[{name}] starting on {} GPU(s)", self.gpus.len()));
        let started = Instant::now();
        let results = Mutex::new(HashMap::new());
        std::thread::scope(|s| {
            for g in self.gpus {
                let results = &results;
                s.spawn(move || {
                    let throttled =
                        ThrottledProgress::new(self.sink, format!("[{name}] GPU{}", g.index));
                    let progress = |done: f64, note: &str| throttled.report(done, note);
                    let r = check.measure(&OnGpu {
                        backend: self.backend,
                        gpu: g,
                        ctl: &RunControl::new(self.stop, &progress),
                    });
                    match &r {
                        Ok(_) => (self.sink)(&format!("[{name}] GPU{} done", g.index)),
                        Err(e) => (self.sink)(&format!("[{name}] GPU{} error: {e}", g.index)),
                    }
                    results
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(g.index, r);
                });
            }
        });
        (self.sink)(&format!(
            "[{name}] finished in {:.1}s",
            started.elapsed().as_secs_f64()
        ));
        results.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// Measures `check` once for the node, with throttled progress lines (`[p2p]  40% ...`).
    pub fn on_node<C: NodeCheck>(&self, check: &C) -> Measurement<C::Outcome> {
        if let Some((why, outcome)) = check.skipped(self.gpus) {
            (self.sink)(&format!("[{}] skipped: {why}", C::NAME));
            return Ok(outcome);
        }
        self.timed(C::NAME, |ctl| check.measure(&self.node_under(ctl)))
    }

    /// The node as a [`NodeCheck`] measures it, under `ctl`.
    pub fn node_under<'a>(&'a self, ctl: &'a RunControl<'a>) -> OnNode<'a> {
        OnNode {
            backend: self.backend,
            gpus: self.gpus,
            ctl,
        }
    }

    /// Runs one node-wide operation named `name` with start, progress and end lines.
    pub fn timed<T>(
        &self,
        name: &str,
        f: impl FnOnce(&RunControl<'_>) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        (self.sink)(&format!("[{name}] starting"));
        let started = Instant::now();
        let throttled = ThrottledProgress::new(self.sink, format!("[{name}]"));
        let progress = |done: f64, note: &str| throttled.report(done, note);
        let r = f(&RunControl::new(self.stop, &progress));
        match &r {
            Ok(_) => (self.sink)(&format!(
                "[{name}] finished in {:.1}s",
                started.elapsed().as_secs_f64()
            )),
            Err(e) => (self.sink)(&format!("[{name}] error: {e}")),
        }
        r
    }
}
