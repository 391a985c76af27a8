//! When a run's certificates are tried, decided without I/O (time is a parameter): once the
//! run's terminal status is stored, then after each failed try again after a pause that doubles
//! from [`RetryPolicy::first`] up to [`RetryPolicy::max`] (each drawn from the upper half of its
//! step, seeded per run, so runs that ended together do not retry in step), at most
//! [`RetryPolicy::tries`] times per run. The [`Ledger`] holds where each run stands; the shell
//! ([`crate::write::certificates`]) tries and reports back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a run's certificates are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The pause after the first failed try; it doubles after each.
    pub first: Duration,
    /// The longest pause.
    pub max: Duration,
    /// Tries per run, the first included; after the last failed one the run is given up.
    pub tries: u32,
}

impl Default for RetryPolicy {
    /// 2 s doubling to 2 min, 10 tries: a run's certificates are tried for about 6 minutes.
    fn default() -> Self {
        Self {
            first: Duration::from_secs(2),
            max: Duration::from_secs(120),
            tries: 10,
        }
    }
}

impl RetryPolicy {
    /// The pause after failed try number `failed` (1 for the first) of the run seeded `seed`:
    /// drawn from `[c/2, c]` where `c` is `first` doubled `failed - 1` times, at most `max`.
    pub fn pause(&self, failed: u32, seed: u64) -> Duration {
        let doublings = failed.saturating_sub(1).min(31);
        let ceiling = self
            .first
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max);
        let half = ceiling / 2;
        let Ok(span) = u64::try_from(half.as_millis()) else {
            return ceiling;
        };
        let draw = splitmix(seed ^ u64::from(failed));
        half + Duration::from_millis(draw % (span + 1))
    }
}

/// One run: a validation (by uid) at one generation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunId {
    pub uid: String,
    pub generation: i64,
}

impl RunId {
    /// The seed of this run's jitter (FNV-1a of its uid and generation).
    pub fn seed(&self) -> u64 {
        let text = format!("{}/{}", self.uid, self.generation);
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }
}

/// Where a run's certificates stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Written (or found written): nothing more to do.
    Written,
    /// Given up (a refusal that another try cannot change, or every try spent): told once.
    GivenUp,
    /// `failed` tries failed; the next is due at `next`.
    Waiting { failed: u32, next: Instant },
}

/// What the shell does now for a run whose terminal status is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Nothing: written or given up.
    Nothing,
    /// Not yet: try again in this long (the reconcile asks to be woken then).
    Later(Duration),
    /// Try now; `failed` tries failed before.
    Try { failed: u32 },
}

/// What became of a failed try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try again in this long.
    RetryIn(Duration),
    /// Every try is spent: give up (and tell).
    GiveUp { tries: u32 },
}

/// Where each run's certificates stand, for the runs of live validations. Kept in memory: after
/// an operator restart a run's certificates are looked for again (one read), not rewritten.
#[derive(Debug, Default)]
pub struct Ledger {
    runs: Mutex<HashMap<String, (i64, Standing)>>,
}

impl Ledger {
    fn runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, Standing)>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where `run` stands (None: never tried by this process, or its validation's generation
    /// moved on since).
    pub fn standing(&self, run: &RunId) -> Option<Standing> {
        self.runs()
            .get(&run.uid)
            .filter(|(generation, _)| *generation == run.generation)
            .map(|(_, s)| *s)
    }

    /// What to do now, at `now`, for `run`.
    pub fn turn(&self, run: &RunId, now: Instant) -> Turn {
        match self.standing(run) {
            None => Turn::Try { failed: 0 },
            Some(Standing::Written | Standing::GivenUp) => Turn::Nothing,
            Some(Standing::Waiting { next, .. }) if now < next => Turn::Later(next - now),
            Some(Standing::Waiting { failed, .. }) => Turn::Try { failed },
        }
    }

    /// `run`'s certificates are written.
    pub fn written(&self, run: &RunId) {
        self.set(run, Standing::Written);
    }

    /// `run`'s certificates are given up.
    pub fn give_up(&self, run: &RunId) {
        self.set(run, Standing::GivenUp);
    }

    /// A try of `run` failed at `now` with an error worth another try.
    pub fn failed(&self, run: &RunId, now: Instant, policy: &RetryPolicy) -> AfterFailure {
        let failed = match self.standing(run) {
            Some(Standing::Waiting { failed, .. }) => failed + 1,
            _ => 1,
        };
        if failed >= policy.tries {
            self.give_up(run);
            return AfterFailure::GiveUp { tries: failed };
        }
        let pause = policy.pause(failed, run.seed());
        self.set(
            run,
            Standing::Waiting {
                failed,
                next: now + pause,
            },
        );
        AfterFailure::RetryIn(pause)
    }

    /// Forgets the runs of validations that are gone (`live` says which uids are not).
    pub fn keep_live(&self, live: impl Fn(&str) -> bool) {
        self.runs().retain(|uid, _| live(uid));
    }

    /// How many runs are held.
    pub fn len(&self) -> usize {
        self.runs().len()
    }

    /// True when no run is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set(&self, run: &RunId, standing: Standing) {
        self.runs()
            .insert(run.uid.clone(), (run.generation, standing));
    }
}

/// splitmix64: the next state of a well-spread sequence.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(uid: &str, generation: i64) -> RunId {
        RunId {
            uid: uid.into(),
            generation,
        }
    }

    #[test]
    fn pauses_double_to_the_cap_each_in_the_upper_half_of_its_step() {
        let p = RetryPolicy {
            first: Duration::from_secs(2),
            max: Duration::from_secs(30),
            tries: 10,
        };
        let ceilings = [2u64, 4, 8, 16, 30, 30, 30];
        for (i, c) in ceilings.into_iter().enumerate() {
            let failed = i as u32 + 1;
            let c = Duration::from_secs(c);
            for seed in 0..20 {
                let pause = p.pause(failed, seed);
                assert!(
                    pause >= c / 2 && pause <= c,
                    "try {failed}: {pause:?} not in [{:?}, {c:?}]",
                    c / 2
                );
            }
        }
        assert!(p.pause(u32::MAX, 1) <= p.max, "no overflow on a huge count");
    }

    #[test]
    fn runs_that_ended_together_retry_apart() {
        let p = RetryPolicy::default();
        let pauses: std::collections::BTreeSet<Duration> = (0..50)
            .map(|i| p.pause(5, run(&format!("uid-{i}"), 1).seed()))
            .collect();
        assert!(pauses.len() > 40, "jitter spreads them: {}", pauses.len());
    }

    #[test]
    fn a_run_is_tried_at_once_then_after_each_pause_until_written() {
        let ledger = Ledger::default();
        let policy = RetryPolicy::default();
        let r = run("u1", 1);
        let t0 = Instant::now();
        assert_eq!(ledger.turn(&r, t0), Turn::Try { failed: 0 });
        let AfterFailure::RetryIn(pause) = ledger.failed(&r, t0, &policy) else {
            panic!("one failure is retried");
        };
        assert!(pause >= policy.first / 2 && pause <= policy.first);
        // A reconcile woken early (the status write's own watch event) does not try sooner.
        assert_eq!(ledger.turn(&r, t0), Turn::Later(pause));
        assert_eq!(
            ledger.turn(&r, t0 + pause / 2),
            Turn::Later(pause - pause / 2)
        );
        assert_eq!(ledger.turn(&r, t0 + pause), Turn::Try { failed: 1 });
        ledger.written(&r);
        assert_eq!(ledger.turn(&r, t0 + pause * 100), Turn::Nothing);
        // The next generation is a new run.
        assert_eq!(ledger.turn(&run("u1", 2), t0), Turn::Try { failed: 0 });
    }

    #[test]
    fn a_run_is_given_up_after_its_last_try() {
        let ledger = Ledger::default();
        let policy = RetryPolicy {
            tries: 3,
            ..Default::default()
        };
        let r = run("u1", 1);
        let mut now = Instant::now();
        let mut pauses = Vec::new();
        loop {
            match ledger.failed(&r, now, &policy) {
                AfterFailure::RetryIn(p) => {
                    pauses.push(p);
                    now += p;
                }
                AfterFailure::GiveUp { tries } => {
                    assert_eq!(tries, 3);
                    break;
                }
            }
        }
        assert_eq!(pauses.len(), 2, "two pauses between three tries");
        assert_eq!(
            ledger.turn(&r, now + Duration::from_secs(3600)),
            Turn::Nothing
        );
        assert_eq!(ledger.standing(&r), Some(Standing::GivenUp));
    }

    #[test]
    fn runs_of_deleted_validations_are_forgotten() {
        let ledger = Ledger::default();
        ledger.written(&run("live", 1));
        ledger.written(&run("gone", 1));
        ledger.keep_live(|uid| uid == "live");
        assert_eq!(ledger.len(), 1);
        assert_eq!(ledger.standing(&run("live", 1)), Some(Standing::Written));
        assert_eq!(ledger.standing(&run("gone", 1)), None);
    }
}
