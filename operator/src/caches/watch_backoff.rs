//! The pause before a failed watch is tried again. kube-runtime's default (client-go's
//! reflector: 0.8 s doubling to 30 s, forgotten only after 120 s without errors) is kind to an
//! API server that thousands of clients watch, but after an API server restart the several
//! errors each watch meets on its way back (connection refused, then `410 Gone` and a relist,
//! then watches closed again as the CRD handlers restart) each cost up to 30 s: measured, the
//! operator saw stored results only 2-3 minutes after the server was back. One operator holds
//! a handful of watches, so it retries sooner: 250 ms doubling to 5 s, with jitter, back to
//! 250 ms after any event.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use kube::runtime::utils::Backoff;

/// The first pause after an error.
pub const FIRST: Duration = Duration::from_millis(250);
/// The longest pause between tries.
pub const MAX: Duration = Duration::from_secs(5);

/// Doubling pauses from [`FIRST`] to [`MAX`], each drawn from the upper half of its step.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    state: u64,
}

/// A backoff for one watch (its jitter seeded apart from the others').
pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff {
        next: FIRST,
        state: RandomState::new().hash_one(0u8),
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.state = self
            .state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let ceiling = self.next;
        self.next = (self.next * 2).min(MAX);
        let half = ceiling / 2;
        let span = u64::try_from(half.as_millis()).unwrap_or(0);
        Some(half + Duration::from_millis((self.state >> 33) % (span + 1)))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_to_the_cap_and_start_over_after_a_reset() {
        let mut b = watch_backoff();
        let ceilings = [250u64, 500, 1000, 2000, 4000, 5000, 5000];
        for c in ceilings {
            let p = b.next().unwrap();
            let c = Duration::from_millis(c);
            assert!(
                p >= c / 2 && p <= c,
                "{p:?} not within [{:?}, {c:?}]",
                c / 2
            );
        }
        b.reset();
        assert!(b.next().unwrap() <= FIRST);
    }
}
