//! The time the schedule and admission controllers decide with.
//!
//! The binary always uses the system clock. Tests that run the operator in-process hand it a
//! [`Clock`] through `OperatorConfig::clock` and move it forward with [`Clock::advance`]: every
//! schedule is then looked at again at once (the controllers re-plan on every tick), so a
//! schedule due in an hour fires when the test says an hour has passed, without sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use futures::Stream;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;

/// The system clock plus an offset that only tests move.
#[derive(Clone)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
    ticks: watch::Sender<u64>,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            offset_ms: Arc::new(AtomicI64::new(0)),
            ticks: watch::Sender::new(0),
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Clock(offset {} ms)",
            self.offset_ms.load(Ordering::Relaxed)
        )
    }
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self::default()
    }

    /// Now, as the controllers see it.
    pub fn now(&self) -> Timestamp {
        let offset = SignedDuration::from_millis(self.offset_ms.load(Ordering::Relaxed));
        Timestamp::now()
            .checked_add(offset)
            .unwrap_or_else(|_| Timestamp::now())
    }

    /// Moves this clock (and every clone of it) forward by `by`, and wakes the controllers.
    pub fn advance(&self, by: std::time::Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
        self.ticks.send_modify(|t| *t += 1);
    }

    /// Yields once each time the clock is moved.
    pub fn ticks(&self) -> impl Stream<Item = ()> + Send + 'static {
        let rx = self.ticks.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn advancing_moves_every_clone_and_ticks() {
        let clock = Clock::system();
        let other = clock.clone();
        let mut ticks = Box::pin(other.ticks());
        let before = other.now();
        clock.advance(std::time::Duration::from_secs(3600));
        let moved = other.now().duration_since(before);
        assert!(moved >= SignedDuration::from_secs(3600), "{moved:?}");
        assert!(moved < SignedDuration::from_secs(3700), "{moved:?}");
        assert_eq!(ticks.next().await, Some(()));
    }
}
