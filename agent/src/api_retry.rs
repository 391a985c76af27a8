//! Retrying Kubernetes API calls: exponential backoff with jitter, until a number of attempts
//! or an instant (the run's deadline) is reached. Only transient errors are retried
//! (throttling, server trouble, lost connections): a refusal (403, 422, ...) is final.

use std::future::Future;
use std::time::{Duration, Instant};

/// How many times a short API call (fabric outcomes) is tried before the agent gives up on it.
pub const API_ATTEMPTS: u32 = 5;
/// The first pause between tries, doubling from there.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest pause between two tries of a short API call.
pub const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// A well-spread 64-bit hash of `s` (FNV-1a): a seed for a backoff's or a delay's jitter.
pub fn seed_of(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Calls `f` until it succeeds, fails for good, or [`API_ATTEMPTS`] tries are spent, doubling
/// the pause between tries (with jitter seeded by `what` and this process).
pub async fn retry_short<T, F, Fut>(what: &'static str, f: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let seed = seed_of(what) ^ u64::from(std::process::id());
    let backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF, seed);
    retry(
        what,
        Budget::Attempts(API_ATTEMPTS),
        backoff,
        is_transient,
        f,
    )
    .await
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
        let Some(pause) = next_pause(budget, attempt, &mut backoff, Instant::now()) else {
            tracing::warn!(what, attempt, error = %e, "giving up after transient API errors");
            return Err(e);
        };
        tracing::warn!(what, attempt, error = %e, retry_in_ms = pause.as_millis() as u64, "transient API error; retrying");
        tokio::time::sleep(pause).await;
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

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
