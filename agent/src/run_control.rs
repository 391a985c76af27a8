//! Cancellation and progress for long operations, shared by every check and the runner.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where progress lines go (stderr in the CLI, the pod log in Kubernetes; tests collect them).
pub type ProgressSink<'a> = &'a (dyn Fn(&str) + Sync);

/// How often a long operation may print a progress line.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Cancellation and progress for one long operation.
pub struct RunControl<'a> {
    stop: &'a AtomicBool,
    progress: &'a (dyn Fn(f64, &str) + Sync),
}

impl<'a> RunControl<'a> {
    pub fn new(stop: &'a AtomicBool, progress: &'a (dyn Fn(f64, &str) + Sync)) -> Self {
        Self { stop, progress }
    }
    /// True once a stop was requested (SIGTERM, deadline).
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    /// Reports progress: `done` in 0..=1 and a short note (`bf16 781 TFLOP/s`).
    pub fn progress(&self, done: f64, note: &str) {
        (self.progress)(done.clamp(0.0, 1.0), note)
    }
}

/// Progress lines with a fixed prefix (`[memory] GPU3`), at most one per [`PROGRESS_EVERY`].
pub struct ThrottledProgress<'a> {
    sink: ProgressSink<'a>,
    prefix: String,
    last: Mutex<Option<Instant>>,
}

impl<'a> ThrottledProgress<'a> {
    pub fn new(sink: ProgressSink<'a>, prefix: impl Into<String>) -> Self {
        Self {
            sink,
            prefix: prefix.into(),
            last: Mutex::new(None),
        }
    }

    /// Prints `PREFIX  42% note` unless a line went out less than [`PROGRESS_EVERY`] ago.
    pub fn report(&self, done: f64, note: &str) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            *last = Some(Instant::now());
            (self.sink)(&format!("{} {:>3.0}% {note}", self.prefix, done * 100.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_throttled_and_clamped() {
        let lines = Mutex::new(Vec::new());
        let sink = |l: &str| lines.lock().expect("lines").push(l.to_string());
        let throttled = ThrottledProgress::new(&sink, "[memory] GPU1");
        let progress = |done: f64, note: &str| throttled.report(done, note);
        let stop = AtomicBool::new(false);
        let ctl = RunControl::new(&stop, &progress);
        ctl.progress(1.7, "first");
        ctl.progress(0.5, "second, within the interval");
        assert!(!ctl.stopped());
        stop.store(true, Ordering::Relaxed);
        assert!(ctl.stopped());
        let lines = lines.into_inner().expect("lines");
        assert_eq!(lines, vec!["[memory] GPU1 100% first".to_string()]);
    }
}
