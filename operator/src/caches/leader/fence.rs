//! The write fence: the leader's API client refuses every write (POST, PUT, PATCH, DELETE)
//! unless the fence is open, and the fence is open only until the renew deadline after the
//! start of the leader's last successful renewal. A leader that cannot renew (partitioned,
//! paused, starved) therefore stops writing on its own clock, before any follower may take
//! over, whatever its controller is doing at that moment.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, Request};
use tower::{BoxError, Layer, Service};

/// Shared between the elector (which opens it) and the client layer (which consults it).
#[derive(Debug, Clone, Default)]
pub struct Fence(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    open_until: Mutex<Option<Instant>>,
    refused: AtomicU64,
}

impl Fence {
    fn open_until(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.0
            .open_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keeps the fence open until `until` (never shortens it: renewals only extend).
    pub fn open_until_instant(&self, until: Instant) {
        let mut open = self.open_until();
        if open.is_none_or(|o| o < until) {
            *open = Some(until);
        }
    }

    /// Closes the fence now (the lease is lost or given up).
    pub fn close(&self) {
        *self.open_until() = None;
    }

    /// True while writes may go out.
    pub fn is_open(&self, now: Instant) -> bool {
        self.open_until().is_some_and(|until| now < until)
    }

    /// Writes refused so far.
    pub fn refused(&self) -> u64 {
        self.0.refused.load(Ordering::Relaxed)
    }
}

/// A write refused because this replica may no longer be the leader.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{method} {path} refused: this replica did not renew its leader lease within the renew deadline, so another replica may lead now"
)]
pub struct NotLeader {
    pub method: Method,
    pub path: String,
}

/// True for the HTTP methods that change something.
pub fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The tower layer that puts a [`Fence`] in front of a kube client's stack.
#[derive(Debug, Clone)]
pub struct FenceLayer(pub Fence);

impl<S> Layer<S> for FenceLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Fenced {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// A service that refuses writes while its fence is closed.
#[derive(Debug, Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: Fence,
}

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, B> Service<Request<B>> for Fenced<S>
where
    S: Service<Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Boxed<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if is_write(req.method()) && !self.fence.is_open(Instant::now()) {
            self.fence.0.refused.fetch_add(1, Ordering::Relaxed);
            let refused = NotLeader {
                method: req.method().clone(),
                path: req.uri().path().to_string(),
            };
            tracing::warn!(error = %refused, "write fenced");
            return Box::pin(std::future::ready(Err(refused.into())));
        }
        let call = self.inner.call(req);
        Box::pin(async move { call.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    /// A service that counts the requests it was given.
    #[derive(Clone, Default)]
    struct Counting(Arc<AtomicUsize>);

    impl Service<Request<()>> for Counting {
        type Response = ();
        type Error = Infallible;
        type Future = std::future::Ready<Result<(), Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    fn request(method: Method) -> Request<()> {
        Request::builder()
            .method(method)
            .uri("/api/v1/namespaces/x/pods")
            .body(())
            .unwrap()
    }

    #[tokio::test]
    async fn writes_pass_only_while_the_fence_is_open_and_reads_always() {
        let fence = Fence::default();
        let inner = Counting::default();
        let mut svc = FenceLayer(fence.clone()).layer(inner.clone());

        let refused = svc.call(request(Method::POST)).await.unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("POST /api/v1/namespaces/x/pods refused")
        );
        svc.call(request(Method::GET)).await.unwrap();
        assert_eq!(inner.0.load(Ordering::SeqCst), 1, "the read went through");

        fence.open_until_instant(Instant::now() + Duration::from_secs(60));
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            svc.call(request(m)).await.unwrap();
        }
        assert_eq!(inner.0.load(Ordering::SeqCst), 5);

        fence.close();
        svc.call(request(Method::PATCH)).await.unwrap_err();
        assert_eq!(inner.0.load(Ordering::SeqCst), 5);
        assert_eq!(fence.refused(), 2);
    }

    #[test]
    fn the_fence_closes_by_itself_and_renewals_only_extend_it() {
        let fence = Fence::default();
        let now = Instant::now();
        assert!(!fence.is_open(now));
        fence.open_until_instant(now + Duration::from_secs(10));
        assert!(fence.is_open(now + Duration::from_secs(9)));
        assert!(!fence.is_open(now + Duration::from_secs(10)));
        fence.open_until_instant(now + Duration::from_secs(5));
        assert!(
            fence.is_open(now + Duration::from_secs(9)),
            "an older renewal's deadline does not shorten a newer one"
        );
    }
}
