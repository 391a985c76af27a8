//! The operator's client-side rate limit on its writes (pods, results, status): a token bucket
//! of `qps` tokens a second holding at most `burst`. The bucket is pure (time is a parameter);
//! the shell waits the delay it gives.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket. `qps` 0 means no limit.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens (at least one) refilled at `qps` a second.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: qps.max(0.0),
            burst,
            tokens: burst,
            last: None,
        }
    }

    /// Takes one token at `now`; returns how long the caller must wait before its request
    /// (zero while tokens are left). Waiting callers are queued: each one owes the next token.
    pub fn take(&mut self, now: Instant) -> Duration {
        if self.qps == 0.0 {
            return Duration::ZERO;
        }
        if let Some(last) = self.last {
            let refill = now.saturating_duration_since(last).as_secs_f64() * self.qps;
            self.tokens = (self.tokens + refill).min(self.burst);
        }
        self.last = Some(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// A [`TokenBucket`] shared by every reconcile.
#[derive(Debug)]
pub struct Throttle(Mutex<TokenBucket>);

impl Throttle {
    pub fn new(qps: f64, burst: u32) -> Self {
        Self(Mutex::new(TokenBucket::new(qps, burst)))
    }

    /// Waits for a token (the rate limit of one API write).
    pub async fn acquire(&self) {
        let wait = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take(Instant::now());
        if !wait.is_zero() {
            tracing::trace!(wait_ms = wait.as_millis(), "rate limited");
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_requests_are_spaced_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        let waits: Vec<u128> = (0..3).map(|_| b.take(t0).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 300], "queued callers wait in turn");
    }

    #[test]
    fn tokens_come_back_with_time_up_to_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 2);
        b.take(t0);
        b.take(t0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(later), Duration::ZERO);
        assert_eq!(b.take(later), Duration::ZERO);
        assert_eq!(
            b.take(later),
            Duration::from_millis(100),
            "no more than the burst"
        );
    }

    #[test]
    fn zero_qps_is_no_limit() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0.0, 1);
        assert!((0..1000).all(|_| b.take(t0).is_zero()));
    }
}
