//! What a replica does with the Lease it just read (pure): the timing rules of leader election,
//! with every instant taken from this process's monotonic clock (never from another host's
//! wall clock, so clock skew between hosts plays no part).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;

/// The three durations of leader election, as client-go names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a follower waits, after it last saw the Lease change, before it takes it.
    pub lease_duration: Duration,
    /// How long the leader keeps writing after the start of its last successful renewal.
    /// Shorter than `lease_duration`: the difference is the margin for writes in flight.
    pub renew_deadline: Duration,
    /// How often every replica reads the Lease (and the leader renews it).
    pub retry_period: Duration,
}

impl Default for Timing {
    /// 15 s / 10 s / 2 s, the defaults of Kubernetes' own controllers.
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Lease settings that cannot keep two leaders apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "--lease-renew-deadline ({renew:?}) must be shorter than --lease-duration ({lease:?}): the leader must stop writing before a follower may take over"
    )]
    RenewNotShorter { renew: Duration, lease: Duration },
    #[error(
        "--lease-retry-period ({retry:?}) must be shorter than --lease-renew-deadline ({renew:?}) so that the leader renews at least once in time"
    )]
    RetryNotShorter { retry: Duration, renew: Duration },
    #[error("the lease durations must be at least one second each")]
    TooShort,
}

impl Timing {
    /// Checks retry period < renew deadline < lease duration, each at least a second.
    pub fn validate(&self) -> Result<(), TimingError> {
        let second = Duration::from_secs(1);
        if self.lease_duration < second
            || self.renew_deadline < second
            || self.retry_period < second
        {
            return Err(TimingError::TooShort);
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(TimingError::RenewNotShorter {
                renew: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(TimingError::RetryNotShorter {
                retry: self.retry_period,
                renew: self.renew_deadline,
            });
        }
        Ok(())
    }

    /// The margin between the leader's last write and a follower's earliest takeover.
    pub fn margin(&self) -> Duration {
        self.lease_duration.saturating_sub(self.renew_deadline)
    }
}

/// The part of a Lease that says who holds it and whether it still moves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub holder: Option<String>,
    /// `spec.renewTime` as written (compared for change only, never against a clock).
    pub renew_time: Option<String>,
    pub transitions: i32,
}

impl Record {
    /// The record of a Lease's spec (an empty holder counts as none).
    pub fn of(spec: Option<&LeaseSpec>) -> Self {
        let Some(s) = spec else {
            return Self::default();
        };
        Self {
            holder: s.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: s
                .renew_time
                .as_ref()
                .map(|t| t.0.to_string())
                .or_else(|| s.acquire_time.as_ref().map(|t| t.0.to_string())),
            transitions: s.lease_transitions.unwrap_or(0),
        }
    }
}

/// A record and when this replica first saw it as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub record: Record,
    pub since: Instant,
}

/// The observation after reading `record` at `now`: unchanged records keep the instant they
/// were first seen; a changed one (a renewal, a new holder) starts the wait again.
pub fn observe(previous: Option<Observed>, record: Record, now: Instant) -> Observed {
    match previous {
        Some(p) if p.record == record => p,
        _ => Observed { record, since: now },
    }
}

/// What to do with the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew it.
    Renew,
    /// Nobody holds it, or its holder let it lapse: take it.
    Acquire,
    /// Another replica holds it and renewed it within the lease duration.
    Wait { holder: String, lapses_in: Duration },
}

/// Decides for replica `me` from what it observed of the Lease, at `now`.
pub fn decide(me: &str, seen: &Observed, now: Instant, timing: &Timing) -> Decision {
    match seen.record.holder.as_deref() {
        Some(h) if h == me => Decision::Renew,
        None => Decision::Acquire,
        Some(other) => {
            let lapses = seen.since + timing.lease_duration;
            if now >= lapses {
                Decision::Acquire
            } else {
                Decision::Wait {
                    holder: other.to_string(),
                    lapses_in: lapses - now,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, renew: &str) -> Record {
        Record {
            holder: holder.map(str::to_string),
            renew_time: Some(renew.to_string()),
            transitions: 1,
        }
    }

    #[test]
    fn default_timing_is_consistent_and_bad_ones_are_named() {
        let t = Timing::default();
        t.validate().unwrap();
        assert_eq!(t.margin(), Duration::from_secs(5));
        let bad = Timing {
            renew_deadline: Duration::from_secs(15),
            ..t
        };
        assert!(matches!(
            bad.validate(),
            Err(TimingError::RenewNotShorter { .. })
        ));
        let bad = Timing {
            retry_period: Duration::from_secs(10),
            ..t
        };
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("--lease-retry-period"), "{msg}");
        let bad = Timing {
            retry_period: Duration::ZERO,
            ..t
        };
        assert_eq!(bad.validate(), Err(TimingError::TooShort));
    }

    #[test]
    fn the_holder_renews_and_a_free_lease_is_taken() {
        let now = Instant::now();
        let t = Timing::default();
        let mine = observe(None, record(Some("a"), "r1"), now);
        assert_eq!(decide("a", &mine, now, &t), Decision::Renew);
        let free = observe(None, record(None, "r1"), now);
        assert_eq!(decide("b", &free, now, &t), Decision::Acquire);
    }

    #[test]
    fn a_follower_waits_a_full_lease_after_the_last_change_it_saw() {
        let t0 = Instant::now();
        let t = Timing::default();
        let seen = observe(None, record(Some("a"), "r1"), t0);
        let later = t0 + Duration::from_secs(14);
        assert_eq!(
            decide("b", &seen, later, &t),
            Decision::Wait {
                holder: "a".into(),
                lapses_in: Duration::from_secs(1)
            }
        );
        // The same record read again keeps its first sighting: the lease lapses on time.
        let again = observe(Some(seen.clone()), record(Some("a"), "r1"), later);
        assert_eq!(again.since, t0);
        assert_eq!(
            decide("b", &again, t0 + t.lease_duration, &t),
            Decision::Acquire
        );
        // A renewal restarts the wait.
        let renewed = observe(Some(again), record(Some("a"), "r2"), later);
        assert_eq!(renewed.since, later);
        assert!(matches!(
            decide("b", &renewed, t0 + t.lease_duration, &t),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn a_follower_never_takes_over_before_the_leader_stopped_writing() {
        // The leader starts a renewal at r; the follower can only see it after r; the leader
        // writes until r + renew_deadline; the follower takes over at the earliest at
        // (its first sighting) + lease_duration.
        let t = Timing::default();
        let r = Instant::now();
        let leader_stops = r + t.renew_deadline;
        for delay_ms in [0u64, 10, 900, 4_000] {
            let sighting = r + Duration::from_millis(delay_ms);
            let seen = observe(None, record(Some("a"), "r"), sighting);
            let mut now = sighting;
            while decide("b", &seen, now, &t) != Decision::Acquire {
                now += Duration::from_millis(100);
            }
            assert!(now >= leader_stops + t.margin(), "{delay_ms} ms");
        }
    }

    #[test]
    fn records_read_from_lease_specs() {
        assert_eq!(Record::of(None), Record::default());
        let spec = LeaseSpec {
            holder_identity: Some(String::new()),
            lease_transitions: Some(3),
            ..Default::default()
        };
        let r = Record::of(Some(&spec));
        assert_eq!((r.holder, r.transitions), (None, 3));
    }
}
