//! Waiting on conditions that no watch reports (a process's log, a file, a counter): the
//! condition is checked every [`POLL`] until it holds, and the wait fails after a generous
//! limit with what was awaited. A test never sleeps in place of a condition.

use std::future::Future;
use std::time::Duration;

/// How often a condition is checked again.
pub const POLL: Duration = Duration::from_millis(200);

/// Checks `check` until it gives a value; Err naming `what` after `limit`.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{what}: not within {}s", limit.as_secs()));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the object `name` of `api` is gone (a failed read counts as not yet).
pub async fn until_gone<K>(api: &kube::Api<K>, name: &str, limit: Duration) -> Result<(), String>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    until(&format!("{name} gone"), limit, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_condition_that_comes_true_ends_the_wait_and_one_that_never_does_fails() {
        let n = AtomicU32::new(0);
        let got = until("three checks", Duration::from_secs(10), || async {
            (n.fetch_add(1, Ordering::SeqCst) >= 2).then_some("done")
        })
        .await;
        assert_eq!(got, Ok("done"));
        let never = until("never", Duration::from_millis(300), || async { None::<()> }).await;
        assert!(never.unwrap_err().contains("never: not within"));
    }
}
