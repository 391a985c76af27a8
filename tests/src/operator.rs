//! The operator run in-process for end-to-end tests (the same `wiring::run` the binary
//! runs), so a test can stop it mid-run and start a fresh one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gpuval_operator::services::metrics::Metrics;
use gpuval_operator::settings::config::OperatorConfig;
use gpuval_operator::wiring;
use kube::Client;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running operator. Dropping it aborts the task.
pub struct OperatorHandle {
    task: Option<JoinHandle<()>>,
    stop: Option<oneshot::Sender<()>>,
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
}

impl OperatorHandle {
    pub fn start(client: Client, cfg: OperatorConfig) -> Self {
        test_log();
        let metrics = Arc::new(Metrics::default());
        let ready = Arc::new(AtomicBool::new(false));
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = rx.await;
        };
        let task = tokio::spawn(wiring::run(
            client,
            cfg,
            metrics.clone(),
            ready.clone(),
            shutdown,
        ));
        Self {
            task: Some(task),
            stop: Some(tx),
            metrics,
            ready,
        }
    }

    /// Asks for a graceful stop and waits for it (in-flight reconciles finish).
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

impl Drop for OperatorHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Operator settings for tests: agents run the simulated backend with `simulate`, and tolerate
/// kwok's fake-node taint.
pub fn test_config(namespace: &str, simulate: &str) -> OperatorConfig {
    OperatorConfig {
        namespace: namespace.into(),
        agent_image: "gpuval-agent:test".into(),
        tolerations: vec![k8s_openapi::api::core::v1::Toleration {
            key: Some("kwok.x-k8s.io/node".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }],
        agent_env: vec![("GPUVAL_SIMULATE".into(), simulate.into())],
        concurrency: 4,
        ..Default::default()
    }
}

/// With `GPUVAL_TEST_LOG` set (an `EnvFilter`, e.g. `info,kube=warn`), the in-process
/// operator's tracing goes to the test's captured output, shown when the test fails. Set once
/// a test process; off by default.
fn test_log() {
    let Ok(filter) = std::env::var("GPUVAL_TEST_LOG") else {
        return;
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second call in the same process finds the subscriber set: nothing to do.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}
