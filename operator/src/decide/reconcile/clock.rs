//! Where a run stands against its deadline, computed once per reconcile from the time the
//! shell passes in.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The reconcile's `now`, and how far the run is into its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunClock {
    pub now: Timestamp,
    /// Time since the run started (zero when it has not or the clock went back).
    pub elapsed: Duration,
    /// The validation's `spec.deadline` (or its default).
    pub deadline: gpuval_crds::Duration,
    /// How long an agent pod may stay Pending before its line ends (None: until the deadline).
    pub pending_limit: Option<Duration>,
}

impl RunClock {
    /// The clock of a run that started at `start` (`now` when the run has no start time).
    pub fn new(now: Timestamp, start: Option<&Time>, deadline: gpuval_crds::Duration) -> Self {
        let started = start.map(|t| t.0).unwrap_or(now);
        Self {
            now,
            elapsed: since(now, started),
            deadline,
            pending_limit: None,
        }
    }

    /// The same clock with `limit` on an agent pod's time Pending.
    pub fn with_pending_limit(self, limit: Option<Duration>) -> Self {
        Self {
            pending_limit: limit,
            ..self
        }
    }

    /// True when a pod created at `created` has been Pending past the limit, and the limit
    /// comes before the deadline (past the deadline the line runs out of time instead).
    pub fn pending_too_long(&self, created: Option<Timestamp>) -> bool {
        match (self.pending_limit, created) {
            (Some(limit), Some(at)) => {
                limit < self.deadline.as_std() && self.since(at) >= limit && !self.past_deadline()
            }
            _ => false,
        }
    }

    /// True once the run has gone on for the pending limit: a pod may have waited that long.
    pub fn pending_limit_reached(&self) -> bool {
        self.pending_limit.is_some_and(|l| self.elapsed >= l)
    }

    /// True once the whole run has had its deadline.
    pub fn past_deadline(&self) -> bool {
        self.elapsed >= self.deadline.as_std()
    }

    /// Time left until the deadline (zero once past it).
    pub fn to_deadline(&self) -> Duration {
        self.deadline.as_std().saturating_sub(self.elapsed)
    }

    /// Time from `then` to now (zero when `then` is in the future).
    pub fn since(&self, then: Timestamp) -> Duration {
        since(self.now, then)
    }
}

fn since(now: Timestamp, then: Timestamp) -> Duration {
    now.duration_since(then)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + secs).unwrap()
    }

    #[test]
    fn elapsed_counts_from_the_start_and_the_deadline_is_inclusive() {
        let deadline = gpuval_crds::Duration::from_secs(60);
        let c = RunClock::new(at(59), Some(&Time(at(0))), deadline);
        assert_eq!(c.elapsed, Duration::from_secs(59));
        assert!(!c.past_deadline());
        assert_eq!(c.to_deadline(), Duration::from_secs(1));
        let c = RunClock::new(at(60), Some(&Time(at(0))), deadline);
        assert!(c.past_deadline());
        assert_eq!(c.to_deadline(), Duration::ZERO);
    }

    #[test]
    fn no_start_time_or_a_clock_that_went_back_is_no_time_spent() {
        let deadline = gpuval_crds::Duration::from_secs(60);
        assert_eq!(RunClock::new(at(5), None, deadline).elapsed, Duration::ZERO);
        let c = RunClock::new(at(5), Some(&Time(at(10))), deadline);
        assert_eq!(c.elapsed, Duration::ZERO);
        assert_eq!(c.since(at(2)), Duration::from_secs(3));
        assert_eq!(c.since(at(9)), Duration::ZERO);
    }
}
