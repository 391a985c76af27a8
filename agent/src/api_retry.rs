//! Retrying Kubernetes API calls: exponential backoff with jitter, until a number of attempts
//! or an instant (the run's deadline) is reached. Only transient errors are retried
//! (throttling, server trouble, lost connections): a refusal (403, 422, ...) is final.

use std::future::Future;
use std::time::{Duration, Instant};

/// The first pause between tries, doubling from there.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// How long the agent tries to store its fabric outcomes (the operator concludes a round on
/// them; without them it times the node out): a few minutes, or until the run's deadline if
/// that comes first.
pub const OUTCOMES_FOR: Duration = Duration::from_secs(300);
/// The longest pause between two tries of the fabric outcomes.
pub const OUTCOMES_MAX_BACKOFF: Duration = Duration::from_secs(15);

/// A well-spread 64-bit hash of `s` (FNV-1a): a seed for a backoff's or a delay's jitter.
pub fn seed_of(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Calls `f` until it succeeds, fails for good, or [`OUTCOMES_FOR`] has passed or `deadline`
/// (the run's) has come, whichever is first; the pauses double from [`FIRST_BACKOFF`] to
/// [`OUTCOMES_MAX_BACKOFF`], with jitter seeded by `what` and `seed` (the pod).
pub async fn retry_for_minutes<T, F, Fut>(
    what: &'static str,
    deadline: Instant,
    seed: u64,
    f: F,
) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let clock = SystemClock;
    let until = deadline.min(clock.now() + OUTCOMES_FOR);
    let backoff = Backoff::new(FIRST_BACKOFF, OUTCOMES_MAX_BACKOFF, seed_of(what) ^ seed);
    retry_on(&clock, what, Budget::Until(until), backoff, is_transient, f).await
}

/// The time a retry loop reads and waits on: the system's, or a test's.
pub trait Clock {
    /// Now.
    fn now(&self) -> Instant;
    /// Waits `pause`.
    fn pause(&self, pause: Duration) -> impl Future<Output = ()> + Send;
}

/// The system's monotonic clock and the runtime's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn pause(&self, pause: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(pause)
    }
}

/// How long to keep trying.
#[derive(Debug, Clone, Copy)]
pub enum Budget {
    /// At most this many calls.
    Attempts(u32),
    /// Calls until this instant (the last pause is cut short to end there).
    Until(Instant),
}

/// Pauses between tries: doubling from `first` up to `max`, each drawn uniformly from its
/// upper half, so that agents cut off together do not come back in step.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
    state: u64,
}

impl Backoff {
    /// A backoff whose jitter is drawn from `seed` (the shell seeds it per pod).
    pub fn new(first: Duration, max: Duration, seed: u64) -> Self {
        Self {
            next: first.min(max),
            max,
            state: seed,
        }
    }

    /// The next pause.
    pub fn pause(&mut self) -> Duration {
        self.state = splitmix(self.state);
        let ceiling = self.next;
        self.next = (self.next * 2).min(self.max);
        let half = ceiling / 2;
        let Ok(span) = u64::try_from(half.as_nanos()) else {
            return ceiling;
        };
        half + Duration::from_nanos(self.state % (span + 1))
    }
}

/// splitmix64: the next state of a well-spread sequence.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// True for errors worth another try: throttling, server-side trouble, lost connections.
pub fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => matches!(status.code, 408 | 429 | 500..=599),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// The pause before the next try, or None when the budget is spent (`attempt` tries made).
pub fn next_pause(
    budget: Budget,
    attempt: u32,
    backoff: &mut Backoff,
    now: Instant,
) -> Option<Duration> {
    match budget {
        Budget::Attempts(n) => (attempt < n).then(|| backoff.pause()),
        Budget::Until(end) if now >= end => None,
        Budget::Until(end) => Some(backoff.pause().min(end - now)),
    }
}

/// Calls `f` until it succeeds, fails for good, or the budget is spent, pausing as `backoff`
/// says between tries; returns the last error then.
pub async fn retry<T, E, F, Fut>(
    what: &str,
    budget: Budget,
    backoff: Backoff,
    is_transient: impl Fn(&E) -> bool,
    f: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    retry_on(&SystemClock, what, budget, backoff, is_transient, f).await
}

/// [`retry`] on `clock`: each failed try is logged with what, the try's number, the error and
/// the pause before the next (or that it gives up).
pub async fn retry_on<T, E, F, Fut>(
    clock: &impl Clock,
    what: &str,
    budget: Budget,
    mut backoff: Backoff,
    is_transient: impl Fn(&E) -> bool,
    mut f: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        let e = match f().await {
            Ok(v) => return Ok(v),
            Err(e) if is_transient(&e) => e,
            Err(e) => return Err(e),
        };
        let Some(pause) = next_pause(budget, attempt, &mut backoff, clock.now()) else {
            tracing::warn!(what, attempt, error = %e, "giving up after transient API errors");
            return Err(e);
        };
        let retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        tracing::warn!(what, attempt, error = %e, retry_in_ms, "transient API error; retrying");
        clock.pause(pause).await;
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A test's clock: time moves only when a retry pauses, by the pause, at once.
    struct FakeClock {
        now: Mutex<Instant>,
        pauses: Mutex<Vec<Duration>>,
    }

    impl FakeClock {
        fn new() -> Self {
            Self {
                now: Mutex::new(Instant::now()),
                pauses: Mutex::new(Vec::new()),
            }
        }

        fn pauses(&self) -> Vec<Duration> {
            self.pauses.lock().expect("lock").clone()
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            *self.now.lock().expect("lock")
        }

        fn pause(&self, pause: Duration) -> impl Future<Output = ()> + Send {
            *self.now.lock().expect("lock") += pause;
            self.pauses.lock().expect("lock").push(pause);
            std::future::ready(())
        }
    }

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: format!("refused with {code}"),
            ..Default::default()
        }))
    }

    /// The outcomes' budget and backoff, on `clock`, for a run whose deadline is `deadline`
    /// after the clock's now.
    async fn outcomes_on(
        clock: &FakeClock,
        deadline: Duration,
        fails: u32,
        code: u16,
    ) -> (Result<u32, kube::Error>, u32) {
        let until = (clock.now() + deadline).min(clock.now() + OUTCOMES_FOR);
        let backoff = Backoff::new(FIRST_BACKOFF, OUTCOMES_MAX_BACKOFF, 11);
        let calls = AtomicU32::new(0);
        let got = retry_on(
            clock,
            "apply the fabric outcomes",
            Budget::Until(until),
            backoff,
            is_transient,
            || {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move { if n <= fails { Err(status(code)) } else { Ok(n) } }
            },
        )
        .await;
        (got, calls.into_inner())
    }

    #[tokio::test]
    async fn fabric_outcomes_outlast_minutes_of_refusals_then_stop_at_the_budget() {
        // 20 refusals (503, 429, 500 alike): two to four minutes of pauses, well past the old
        // ~8 s, yet inside both budgets: they are tried until stored.
        for code in [503, 429, 500] {
            let clock = FakeClock::new();
            let (got, calls) = outcomes_on(&clock, Duration::from_secs(3600), 20, code).await;
            assert_eq!(got.expect("stored"), 21, "{code}");
            assert_eq!(calls, 21);
            let waited: Duration = clock.pauses().iter().sum();
            assert!(
                waited > Duration::from_secs(60) && waited < OUTCOMES_FOR,
                "{code}: {waited:?}"
            );
            assert!(
                clock.pauses().iter().all(|p| *p <= OUTCOMES_MAX_BACKOFF),
                "capped: {:?}",
                clock.pauses()
            );
        }
        // An API server down for good: tried for OUTCOMES_FOR, not a moment longer.
        let clock = FakeClock::new();
        let start = clock.now();
        let (got, calls) = outcomes_on(&clock, Duration::from_secs(3600), u32::MAX, 503).await;
        let e = got.expect_err("never stored").to_string();
        assert!(e.contains("503"), "{e}");
        assert_eq!(
            clock.now() - start,
            OUTCOMES_FOR,
            "the last pause ends at the budget"
        );
        assert!(calls > 20, "{calls} tries in {OUTCOMES_FOR:?}");
        // The run's deadline first: it bounds the tries.
        let clock = FakeClock::new();
        let start = clock.now();
        let (_, _) = outcomes_on(&clock, Duration::from_secs(40), u32::MAX, 500).await;
        assert_eq!(clock.now() - start, Duration::from_secs(40));
    }

    #[tokio::test]
    async fn a_refusal_of_the_outcomes_is_not_tried_again() {
        for code in [403, 404, 422] {
            let clock = FakeClock::new();
            let (got, calls) = outcomes_on(&clock, Duration::from_secs(3600), 5, code).await;
            assert!(got.is_err(), "{code}");
            assert_eq!(calls, 1, "{code} is final");
            assert!(clock.pauses().is_empty());
        }
    }

    #[test]
    fn pauses_double_up_to_the_cap_each_within_its_upper_half() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(5), 7);
        let ceilings = [200u64, 400, 800, 1600, 3200, 5000, 5000];
        for c in ceilings {
            let p = b.pause();
            let c = Duration::from_millis(c);
            assert!(p >= c / 2 && p <= c, "{p:?} not in [{:?}, {c:?}]", c / 2);
        }
    }

    #[test]
    fn agents_with_other_seeds_pause_differently() {
        let pauses: std::collections::BTreeSet<Duration> = (0..50)
            .map(|seed| Backoff::new(Duration::from_secs(4), Duration::from_secs(4), seed).pause())
            .collect();
        assert!(
            pauses.len() > 40,
            "jitter spreads the retries: {}",
            pauses.len()
        );
    }

    #[test]
    fn budgets_end_by_count_or_by_instant() {
        let now = Instant::now();
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(8), 1);
        assert!(next_pause(Budget::Attempts(3), 2, &mut b, now).is_some());
        assert!(next_pause(Budget::Attempts(3), 3, &mut b, now).is_none());
        let end = now + Duration::from_millis(300);
        let p = next_pause(Budget::Until(end), 99, &mut b, now).unwrap();
        assert!(
            p <= Duration::from_millis(300),
            "cut short at the end: {p:?}"
        );
        assert!(next_pause(Budget::Until(end), 1, &mut b, end).is_none());
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_the_deadline_and_others_are_not() {
        let calls = AtomicU32::new(0);
        let end = Instant::now() + Duration::from_secs(60);
        let b = Backoff::new(Duration::from_millis(1), Duration::from_millis(4), 3);
        let got: Result<u32, String> = retry(
            "x",
            Budget::Until(end),
            b.clone(),
            |_| true,
            || {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if n < 6 {
                        Err("down".to_string())
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(got, Ok(6), "kept trying while the server was away");

        let calls = AtomicU32::new(0);
        let got: Result<u32, String> = retry(
            "x",
            Budget::Until(end),
            b,
            |e: &String| e != "forbidden",
            || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err("forbidden".to_string()) }
            },
        )
        .await;
        assert_eq!(got, Err("forbidden".into()));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
