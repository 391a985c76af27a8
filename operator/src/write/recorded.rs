//! A recorded API for the writers' unit tests: a kube [`Client`] whose every request is kept
//! (method, path with its query, content type, body) and answered from a script, in order. A
//! request the script did not expect is answered 500, so a test sees it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;

use crate::context::{Ctx, FIELD_MANAGER};
use crate::services::throttle::Throttle;
use crate::settings::config::OperatorConfig;

/// One request the writers made.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    /// The path and query (`/api/v1/namespaces/ns/pods?fieldManager=gpuval-operator`).
    pub path: String,
    pub content_type: String,
    /// The body as JSON (Null when empty or not JSON).
    pub body: serde_json::Value,
}

/// What the API answers one request: a status code and a JSON body.
pub type Reply = (u16, serde_json::Value);

/// The answer of a refusal with `code` and `reason`, as the API server words a Status.
pub fn status(code: u16, reason: &str, message: &str) -> Reply {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    (code, body)
}

/// The requests made so far.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Call>>>);

impl Log {
    pub fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Clone)]
struct Scripted {
    log: Log,
    replies: Arc<Mutex<VecDeque<Reply>>>,
}

impl tower::Service<Request<Body>> for Scripted {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let content_type = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            this.log
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Call {
                    method: parts.method.to_string(),
                    path: parts.uri.to_string(),
                    content_type,
                    body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
                });
            let next = this
                .replies
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            let (code, body) =
                next.unwrap_or_else(|| status(500, "InternalError", "not in the test's script"));
            let mut resp = Response::new(Body::from(body.to_string().into_bytes()));
            *resp.status_mut() =
                http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Ok(resp)
        })
    }
}

/// A client answering from `replies` in order, and the log of what it was asked.
pub fn client(replies: Vec<Reply>) -> (Client, Log) {
    let log = Log::default();
    let service = Scripted {
        log: log.clone(),
        replies: Arc::new(Mutex::new(replies.into())),
    };
    (Client::new(service, "gpuval-system"), log)
}

/// A context over `client` with empty stores, in namespace `gpuval-system`, no rate limit.
pub fn ctx(client: Client) -> Ctx {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: None,
    };
    Ctx {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        cfg: OperatorConfig {
            namespace: "gpuval-system".into(),
            ..Default::default()
        },
        pods: Default::default(),
        results: reflector::store().0,
        nodes: reflector::store().0,
        slices: reflector::store().0,
        slices_settled: Arc::new(AtomicBool::new(true)),
        stores_filled: Arc::new(AtomicBool::new(true)),
        rounds: reflector::store().0,
        validations: reflector::store().0,
        metrics: Default::default(),
        runs: Default::default(),
        throttle: Throttle::new(1e6, 1_000_000),
        certificates: Default::default(),
    }
}
