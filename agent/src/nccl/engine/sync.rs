//! What the rank threads share: a barrier that spins (so every rank starts its timed batch
//! within microseconds of the others) and that an abort or a stop breaks, the first abort's
//! reason, and the polling wait for GPU work with a deadline.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::super::outcome::{Abort, Phase};
use gpuval_crds::Collective;

/// Spins before yielding the CPU while waiting.
const SPINS_BEFORE_YIELD: u32 = 1 << 12;
/// Polls of GPU work before sleeping between polls, and the longest sleep.
const POLLS_BEFORE_SLEEP: u32 = 1 << 14;
const LONGEST_SLEEP: Duration = Duration::from_micros(500);

/// Why a rank stopped waiting.
#[derive(Debug, Clone, PartialEq)]
pub enum Interrupted {
    /// Another rank aborted the sweep.
    Aborted,
    /// The run was asked to stop.
    Stopped,
}

/// A host call into NCCL that a rank is inside (a collective's enqueue, or communicator
/// setup when `step` is None).
#[derive(Debug, Clone, PartialEq)]
pub struct InCall {
    /// The NCCL call (`ncclCommInitRank`, `ncclCommAbort`, or the collective's).
    pub what: &'static str,
    pub since: Instant,
    pub step: Option<(Collective, u64, bool, Phase)>,
}

/// State shared by every rank of one sweep.
pub struct Shared<'a> {
    ranks: usize,
    calls: Vec<Mutex<Option<InCall>>>,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    aborted: AtomicBool,
    reason: Mutex<Option<Abort>>,
    stop: &'a AtomicBool,
}

impl<'a> Shared<'a> {
    pub fn new(ranks: usize, stop: &'a AtomicBool) -> Self {
        Self {
            ranks: ranks.max(1),
            calls: (0..ranks.max(1)).map(|_| Mutex::new(None)).collect(),
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            aborted: AtomicBool::new(false),
            reason: Mutex::new(None),
            stop,
        }
    }

    /// Why the sweep must end now, if it must.
    pub fn interrupted(&self) -> Option<Interrupted> {
        if self.aborted.load(Ordering::Acquire) {
            Some(Interrupted::Aborted)
        } else if self.stop.load(Ordering::Relaxed) {
            Some(Interrupted::Stopped)
        } else {
            None
        }
    }

    /// Aborts the sweep for every rank; the first reason is kept.
    pub fn abort(&self, why: Abort) {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            *r = Some(why);
        }
        self.aborted.store(true, Ordering::Release);
    }

    /// Marks `rank` as inside a host NCCL call (None: out of it).
    pub fn in_call(&self, rank: u32, call: Option<InCall>) {
        if let Some(slot) = self.calls.get(rank as usize) {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = call;
        }
    }

    /// What each rank is inside now, in rank order.
    pub fn calls(&self) -> Vec<Option<InCall>> {
        self.calls
            .iter()
            .map(|slot| slot.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect()
    }

    /// A rank that has been inside one host NCCL call for longer than `limit`: NCCL blocks the
    /// host while it connects to a peer, so a peer that never comes holds the call forever.
    pub fn stuck(&self, limit: Duration) -> Option<(u32, InCall)> {
        self.calls.iter().enumerate().find_map(|(rank, slot)| {
            let call = slot.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
            (call.since.elapsed() >= limit).then_some((rank as u32, call))
        })
    }

    /// Aborts the sweep before it started (a rank could not set up); no collective reason.
    pub fn abort_setup(&self) {
        self.aborted.store(true, Ordering::Release);
    }

    /// The first abort's reason.
    pub fn reason(&self) -> Option<Abort> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until every rank has arrived, or the sweep is interrupted.
    pub fn barrier(&self) -> Result<(), Interrupted> {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.ranks {
            self.arrived.store(0, Ordering::Release);
            self.generation.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if let Some(i) = self.interrupted() {
                return Err(i);
            }
            spins = spins.saturating_add(1);
            if spins < SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// How a wait for GPU work ended badly.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitError {
    Interrupted(Interrupted),
    /// Not done by the deadline.
    Timeout,
    /// `failed` reported an error (NCCL's asynchronous error, a CUDA error).
    Failed(String),
}

/// Polls `done` until it says the work finished, checking `failed`, the shared state and the
/// deadline in between; spins first (short collectives), then sleeps a little between polls.
pub fn wait_for(
    shared: &Shared<'_>,
    deadline: Instant,
    mut done: impl FnMut() -> Result<bool, String>,
    mut failed: impl FnMut() -> Option<String>,
) -> Result<(), WaitError> {
    let mut polls = 0u32;
    loop {
        match done() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(WaitError::Failed(e)),
        }
        polls = polls.saturating_add(1);
        if polls.is_multiple_of(64) {
            if let Some(e) = failed() {
                return Err(WaitError::Failed(e));
            }
            if let Some(i) = shared.interrupted() {
                return Err(WaitError::Interrupted(i));
            }
            if Instant::now() >= deadline {
                return Err(WaitError::Timeout);
            }
        }
        if polls < POLLS_BEFORE_SLEEP {
            std::hint::spin_loop();
        } else {
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(left.min(LONGEST_SLEEP));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::outcome::{AbortCause, Phase};
    use gpuval_crds::Collective;

    fn abort(rank: u32) -> Abort {
        Abort {
            collective: Collective::AllReduce,
            bytes: 8,
            in_place: false,
            phase: Phase::Timed,
            rank,
            cause: AbortCause::Stopped,
        }
    }

    #[test]
    fn the_barrier_releases_every_rank_each_time() {
        let stop = AtomicBool::new(false);
        let shared = Shared::new(4, &stop);
        let passed = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        shared.barrier().expect("no abort");
                        passed.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(passed.load(Ordering::Relaxed), 400);
    }

    #[test]
    fn an_abort_breaks_the_barrier_and_keeps_the_first_reason() {
        let stop = AtomicBool::new(false);
        let shared = Shared::new(2, &stop);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| shared.barrier());
            shared.abort(abort(1));
            shared.abort(abort(0));
            assert_eq!(waiter.join().ok(), Some(Err(Interrupted::Aborted)));
        });
        assert_eq!(shared.reason().map(|a| a.rank), Some(1));
    }

    #[test]
    fn waits_end_on_done_error_stop_or_deadline() {
        let stop = AtomicBool::new(false);
        let shared = Shared::new(1, &stop);
        let far = Instant::now() + Duration::from_secs(60);
        let mut n = 0;
        assert_eq!(
            wait_for(
                &shared,
                far,
                || {
                    n += 1;
                    Ok(n > 3)
                },
                || None
            ),
            Ok(())
        );
        assert_eq!(
            wait_for(&shared, far, || Ok(false), || Some("peer gone".into())),
            Err(WaitError::Failed("peer gone".into()))
        );
        let started = Instant::now();
        let soon = started + Duration::from_millis(30);
        assert_eq!(
            wait_for(&shared, soon, || Ok(false), || None),
            Err(WaitError::Timeout)
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        stop.store(true, Ordering::Relaxed);
        assert_eq!(
            wait_for(&shared, far, || Ok(false), || None),
            Err(WaitError::Interrupted(Interrupted::Stopped))
        );
    }
}
