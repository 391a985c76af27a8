//! An API server that refuses for a while, as seen by one in-process client (the operator's in a
//! test): a tower layer in front of the client's stack that records every request it is given
//! (method, path with query, the body of a write, when it was sent and when its answer came)
//! and answers the requests a rule matches with an error status (500, 429, 409, ...) instead of
//! sending them, one status per matching request until the rule's list is spent.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use kube::Client;
use kube::client::Body;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{BoxError, Layer, Service};

/// One request the client made.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    /// Path and query, as sent (`/api/v1/namespaces/ns/configmaps?...`).
    pub uri: String,
    /// The body of a write (empty for reads, and where it could not be copied).
    pub body: String,
    pub sent: Instant,
    /// When its answer came (None while it is in flight, or when the connection failed).
    pub answered: Option<Instant>,
    /// Its answer's status code; `refused` when this layer answered it.
    pub code: Option<u16>,
    pub refused: bool,
}

/// Requests a rule answers: `method`, a path with query containing every one of `contains`.
#[derive(Debug, Clone)]
struct Rule {
    method: Method,
    contains: Vec<String>,
    /// The statuses still to answer, first first.
    codes: Vec<u16>,
}

#[derive(Debug, Default)]
struct Inner {
    rules: Mutex<Vec<Rule>>,
    seen: Mutex<Vec<Seen>>,
}

/// The faults and the record; clone it into the layer and keep one to read and set.
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Inner>);

impl Faults {
    /// The next requests of `method` whose path with query contains each of `contains` are
    /// answered with `codes`, one each, in order (a 0 lets its request pass); later ones pass.
    pub fn refuse(&self, method: Method, contains: &[&str], codes: &[u16]) {
        lock(&self.0.rules).push(Rule {
            method,
            contains: contains.iter().map(|s| s.to_string()).collect(),
            codes: codes.to_vec(),
        });
    }

    /// Every request so far, in the order they were made.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.0.seen).clone()
    }

    /// A client of the API server in `kubeconfig` whose requests go through these faults.
    pub async fn client(&self, kubeconfig: &Path) -> Client {
        let kc = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("a client config");
        kube::client::ClientBuilder::try_from(config)
            .expect("a client stack")
            .with_layer(self)
            .build()
    }

    /// The status this request is to be answered with, if a rule takes it.
    fn answer_for(&self, method: &Method, uri: &str) -> Option<u16> {
        let mut rules = lock(&self.0.rules);
        let rule = rules.iter_mut().find(|r| {
            r.method == *method && !r.codes.is_empty() && r.contains.iter().all(|c| uri.contains(c))
        })?;
        Some(rule.codes.remove(0)).filter(|code| *code != 0)
    }

    fn record(&self, seen: Seen) -> usize {
        let mut all = lock(&self.0.seen);
        all.push(seen);
        all.len() - 1
    }

    fn answered(&self, at: usize, code: Option<u16>) {
        if let Some(s) = lock(&self.0.seen).get_mut(at) {
            s.answered = Some(Instant::now());
            s.code = code;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S> Layer<S> for Faults {
    type Service = Faulty<S>;

    fn layer(&self, inner: S) -> Faulty<S> {
        Faulty {
            inner,
            faults: self.clone(),
        }
    }
}

/// The client stack with [`Faults`] in front.
#[derive(Debug, Clone)]
pub struct Faulty<S> {
    inner: S,
    faults: Faults,
}

/// A passed request's own body, or the status this layer answered with.
pub enum FaultBody<B> {
    Passed(B),
    Refused(Option<Bytes>),
}

impl<B> http_body::Body for FaultBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            FaultBody::Passed(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            FaultBody::Refused(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }
}

/// A Kubernetes `Status` of `code`, as the API server writes one.
fn status_body(code: u16, method: &Method, uri: &str) -> Bytes {
    let reason = match code {
        409 => "Conflict",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        _ => "Unknown",
    };
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("the test's fault layer refused {method} {uri} with {code}"),
        "reason": reason,
        "code": code,
    });
    Bytes::from(status.to_string())
}

type Boxed<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, B> Service<Request<Body>> for Faulty<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<FaultBody<B>>;
    type Error = BoxError;
    type Future = Boxed<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let method = req.method().clone();
        let uri = req
            .uri()
            .path_and_query()
            .map_or_else(String::new, |p| p.to_string());
        let body = req.body().try_clone();
        let faults = self.faults.clone();
        let refuse = faults.answer_for(&method, &uri);
        let call = refuse.is_none().then(|| self.inner.call(req));
        Box::pin(async move {
            let body = match body {
                Some(b) if method != Method::GET => b
                    .collect_bytes()
                    .await
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default(),
                _ => String::new(),
            };
            let at = faults.record(Seen {
                method: method.clone(),
                uri: uri.clone(),
                body,
                sent: Instant::now(),
                answered: None,
                code: None,
                refused: refuse.is_some(),
            });
            match (call, refuse) {
                (Some(call), _) => {
                    let r = call.await.map_err(Into::into);
                    faults.answered(at, r.as_ref().ok().map(|r| r.status().as_u16()));
                    Ok(r?.map(FaultBody::Passed))
                }
                (None, Some(code)) => {
                    faults.answered(at, Some(code));
                    let mut r =
                        Response::new(FaultBody::Refused(Some(status_body(code, &method, &uri))));
                    *r.status_mut() =
                        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    r.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok(r)
                }
                (None, None) => Err("the fault layer neither passed nor refused".into()),
            }
        })
    }
}
